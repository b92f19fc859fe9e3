from __future__ import annotations

import json
from decimal import Decimal

import pytest
from coretables import recording, series_table
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.api import audit
from gpuaudit.classify.usage import PHASES
from gpuaudit.report.json import SCHEMA_VERSION
from gpuaudit.schema import Recording


def _check_json_invariants(d: dict) -> None:
    assert d["schema"] == "gpuaudit.report" and d["schema_version"] == SCHEMA_VERSION
    c = d["cost"]
    parts = [Decimal(c["by_phase_usd"][p]) for p in PHASES] + [Decimal(c["unobserved_usd"])]
    assert sum(parts) == Decimal(c["observed_usd"])
    h = Decimal(c["hourly_usd"])
    assert Decimal(c["monthly_usd"]) == (h * 720).quantize(Decimal("0.01"))
    assert Decimal(c["yearly_usd"]) == (h * 8760).quantize(Decimal("0.01"))
    assert Decimal(c["daily_usd"]) == (h * 24).quantize(Decimal("0.01"))
    wh = Decimal(c["waste_hourly_usd"])
    assert Decimal(c["waste_monthly_usd"]) == (wh * 720).quantize(Decimal("0.01"))
    shares = d["phases"]["overall"]["shares_pct"]
    assert sum(shares.values()) in (0, 100)
    for g in d["gpus"]:
        gc = g["cost"]
        gp = [Decimal(gc["by_phase_usd"][p]) for p in PHASES] + [Decimal(gc["unobserved_usd"])]
        assert sum(gp) == Decimal(gc["observed_usd"])
        assert sum(g["phases"]["shares_pct"].values()) in (0, 100)
    s = d["savings"]
    assert 0 <= s["efficiency_fraction"] <= s["waste_fraction"] + 1e-9
    assert 0 <= s["total_fraction"] <= 1
    assert Decimal(s["monthly_savings_usd"]) <= Decimal(s["monthly_cost_usd"])
    assert 0 <= Decimal(c["waste_usd"]) <= Decimal(c["observed_usd"])


def test_json_report_of_real_recording(nanogpt: Recording):
    r = audit(nanogpt)
    d = json.loads(r.render("json"))
    _check_json_invariants(d)
    assert d["source"]["origin"].startswith("real recording: karpathy/nanoGPT")
    assert d["rates"][0]["usd_per_gpu_hour"] == "6.88" and d["rates"][0]["as_of"]
    assert d["cost"]["hourly_usd"] == "55.0400"  # 8 GPUs x $6.88
    assert len(d["gpus"]) == 8
    assert any("WRONG" in d["savings"]["naive_sum_label"] for _ in [0])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0, 100)), min_size=3, max_size=50),
       st.decimals(min_value="0.10", max_value="20", places=2))
def test_property_json_invariants(util, price):
    r = audit(recording(series_table({"a": util, "b": util[::-1]})), price=price)
    _check_json_invariants(r.to_dict())


def test_terminal_and_markdown_render_every_section(nanogpt: Recording):
    r = audit(nanogpt, counts={"tokens": 1e9}, energy_usd_per_kwh="0.12")
    text = r.render("terminal", width=120)
    for needle in ("Where the GPU time went", "per month (720 h)", "Recommendations",
                   "naive sum (WRONG", "cost per token", "kWh"):
        assert needle in text
    md = r.render("markdown")
    assert md.startswith("# gpuaudit report") and "| compute-bound (>=90%) |" in md


def test_markdown_escapes_hostile_labels():
    t = series_table({"<script>alert(1)</script>|x": [50.0, 50.0]})
    md = audit(recording(t), price="1").render("markdown")
    assert "<script>" not in md and "\\<script\\>" in md


def test_unknown_format_is_a_clear_error(nanogpt: Recording):
    from gpuaudit.errors import InputError

    with pytest.raises(InputError, match="unknown report format"):
        audit(nanogpt).render("pdf")
