"""Smaller things a careful reader notices (issue 14, item 8): the price source line, the one
rule for showing money, and floats in the JSON."""

from __future__ import annotations

import json
import re
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from gpuaudit.api import audit
from gpuaudit.cli.audit import demo_path
from gpuaudit.price.catalog import embedded_catalog, resolve_rate, shorten_source


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0:
            return False
    return depth == 0


def test_every_catalog_price_line_is_cut_at_a_boundary_with_brackets_balanced():
    for e in embedded_catalog():
        r = resolve_rate(e.gpu_model, provider=e.provider)
        line = r.describe()
        assert _balanced(line), line
        src = line.split(f"as of {r.as_of}; ", 1)[1].removesuffix(")")
        if src.endswith(" ..."):
            kept = src.removesuffix(" ...")
            assert r.source.startswith(kept)
            nxt = r.source[len(kept):]
            assert nxt[:2] in ("; ", ", ") or nxt[:3] == " + ", (kept, nxt)  # whole segments
        else:
            assert src == r.source


@given(st.lists(st.sampled_from(["abc", "de (f; g)", "x [y, z]", "h", "word"]), min_size=1,
                max_size=12), st.integers(5, 80))
def test_shorten_source_property(words, limit):
    text = "; ".join(words)
    out = shorten_source(text, limit)
    assert _balanced(out)
    kept = out.removesuffix(" ...")
    assert text.startswith(kept)
    assert out == text or text[len(kept):][:2] == "; "


def _report_texts():
    rep = audit(demo_path())
    return rep, {f: rep.render(f, width=200) for f in ("terminal", "markdown", "html")}


def test_money_has_one_presentation_rule():
    """Amounts to the cent; anything with more digits is a rate and carries its unit."""
    rep, texts = _report_texts()
    for fmt, text in texts.items():
        for m in re.finditer(r"\$[0-9][0-9,]*\.([0-9]+)(\S*)", text):
            digits, after = m.group(1), m.group(2)
            if len(digits) != 2:
                assert after.startswith("/"), (fmt, m.group(0))  # $9.2713/h, $2.7447/GPU-h
    hourly = rep.cost.waste_projection["hourly"]
    assert f"${hourly}/h" in texts["terminal"] and f"${hourly}/h" in texts["markdown"]
    # the rate shown multiplies to the monthly figure shown, to the cent
    assert (hourly * 720).quantize(Decimal("0.01")) == Decimal(
        rep.to_dict()["cost"]["waste_monthly_usd"])


def test_json_floats_carry_no_binary_noise():
    text = audit(demo_path()).render("json")
    d = json.loads(text)
    assert d["source"]["cap_s"] == 0.993 and d["source"]["interval_s"] == 0.331
    assert not re.search(r"\d\.\d*0000000000\d", text)
    assert not re.search(r"\d\.\d*9999999999\d", text)
