"""Every dollar figure a report repeats reads the same everywhere it appears: within one format
(cost table, KPI card, savings section, waterfall, facts line) and across the four formats
(terminal, Markdown, HTML, JSON). Each figure is computed once, in Decimal, by the price or
recommend stage; renderers only print it (issue 14, item 2)."""

from __future__ import annotations

import html as html_lib
import json
import re
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gpuaudit.api import Report, audit
from gpuaudit.cli.audit import demo_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from coretables import recording, series_table

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
MONEY = r"\$([0-9][0-9,]*\.[0-9]{2})(?![0-9])"


def _nanogpt() -> Report:
    return audit(demo_path())


def _trace() -> Report:
    from gpuaudit.api.trace import trace_extra

    rec, extra, evidence = trace_extra([TRACES / "a100_1rank_ddp_nccl.json.gz"],
                                       hta_compat=False, include_last_step=False,
                                       window_ms=100.0)
    return audit(rec, findings=evidence, extra={"trace": extra}, gpu_model="A100")


def _grouped() -> Report:
    """Four GPUs held by two pods and one held by none (the unallocated line), by pod."""
    util = {"g0": [5.0, 50.0, 95.0, 0.0] * 30, "g1": [60.0, 65.0, 3.0, 80.0] * 30,
            "g2": [0.0] * 120, "g3": [40.0, 45.0, 42.0, 41.0] * 30, "g4": [99.0, 1.0] * 60}
    pods = {"g0": "train-a", "g1": "train-a", "g2": None, "g3": "serve-b", "g4": "serve-b"}
    extra = {"pod": {g: [pods[g]] * 120 for g in util}}
    return audit(recording(series_table(util, interval_s=10.0, extra=extra), interval_s=10.0),
                 by=["pod"], gpu_model="A100 80GB SXM", provider="gcp")


def _unobserved() -> Report:
    """Readings missing for stretches (null utilization): billed as unobserved, never waste."""
    util: dict[str, list[float | None]] = {
        "a": [3.0, 4.0, None, None, None, 55.0, 60.0, 97.0] * 20,
        "b": [None] * 10 + [20.0, 30.0, 0.0, 100.0] * 35,
    }
    return audit(recording(series_table(util, interval_s=2.0), interval_s=2.0),
                 gpu_model="H100", provider="lambda")


def _fleet() -> Report:
    """``gpuaudit fleet --recording`` by namespace: the showback section and the report's own
    group table price the same GPUs; a GPU no pod holds is the unallocated line."""
    import tempfile

    from gpuaudit.api import audit_fleet
    from gpuaudit.measure.parquet_io import write_recording

    util = {"g0": [5.0, 50.0, 95.0, 0.0] * 30, "g1": [60.0, 65.0, 3.0, 80.0] * 30,
            "g2": [0.0] * 120, "g3": [40.0, 45.0, 42.0, 41.0] * 30}
    pods = {"g0": "train-a", "g1": "train-b", "g2": None, "g3": "serve-b"}
    ns = {"g0": "team-nlp", "g1": "team-nlp", "g2": None, "g3": "team-vision"}
    extra = {"pod": {g: [pods[g]] * 120 for g in util},
             "namespace": {g: [ns[g]] * 120 for g in util}}
    path = Path(tempfile.mkdtemp()) / "fleet.parquet"
    write_recording(recording(series_table(util, interval_s=60.0, extra=extra),
                              interval_s=60.0), path)
    rep: Report = audit_fleet(recording=path, by=("namespace",),
                              pricing={"gpu_model": "H100", "provider": "aws"})
    return rep


REPORTS = {"nanogpt": _nanogpt, "trace": _trace, "grouped": _grouped,
           "unobserved": _unobserved, "fleet": _fleet}


@pytest.fixture(scope="module", params=sorted(REPORTS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], dict[str, str]]:
    rep = REPORTS[request.param]()
    texts = {fmt: rep.render(fmt, width=200) for fmt in ("terminal", "markdown", "html")}
    page = re.sub(r"</(tr|p|li|div|text|title|h[1-6]|figcaption)>", "\n", texts["html"])
    texts["html"] = html_lib.unescape(re.sub(r"<[^>]+>", " ", page))
    return request.param, json.loads(rep.render("json")), texts


def _usd(s: str) -> str:
    """A JSON dollar string as every human format prints an amount."""
    return f"${Decimal(s):,.2f}"


def _monthly_waste(d: dict[str, Any]) -> str:
    """The measured waste per month (savings section), or the cost table's where a report
    has no field of its own for it."""
    return str(d["savings"].get("monthly_waste_usd", d["cost"]["waste_monthly_usd"]))


def _after(text: str, label: str) -> list[str]:
    """The dollar amounts on each line (or table row) that holds ``label``."""
    out = []
    for line in text.splitlines():
        if label in line:
            out.append(" ".join(f"${m}" for m in re.findall(MONEY, line)))
    return out


def test_json_figures_agree_with_themselves(rendered):
    name, d, _ = rendered
    c, s = d["cost"], d["savings"]
    assert _monthly_waste(d) == c["waste_monthly_usd"], name
    assert s["monthly_cost_usd"] == c["monthly_usd"], name
    for line in [c] + [g["cost"] for g in d["gpus"]] + [g["cost"] for g in d["groups"]["rows"]]:
        assert Decimal(line["waste_usd"]) == (Decimal(line["idle_usd"])
                                              + Decimal(line["underutilized_waste_usd"]))
        assert line["idle_usd"] == line["by_phase_usd"]["idle"]
        parts = sum((Decimal(v) for v in line["by_phase_usd"].values()), Decimal(0))
        assert parts + Decimal(line["unobserved_usd"]) == Decimal(line["observed_usd"])
    eff, waste = Decimal(s["efficiency_monthly_usd"]), Decimal(_monthly_waste(d))
    assert eff <= waste
    if s["efficiency_fraction"] == s["waste_fraction"] and s["waste_fraction"] > 0:
        assert s["efficiency_monthly_usd"] == _monthly_waste(d), name  # the cap, same $
    assert (Decimal(s["monthly_savings_usd"]) + Decimal(s["monthly_after_usd"])
            == Decimal(s["monthly_cost_usd"]))


def test_terminal_repeats_each_figure_identically(rendered):
    name, d, t = rendered
    text = t["terminal"]
    c, s = d["cost"], d["savings"]
    waste_row = next(r for r in _after(text, "  waste ") if r.count("$") == 4)
    assert waste_row.split() == [_usd(c["waste_usd"]), _usd(c["waste_daily_usd"]),
                                 _usd(c["waste_monthly_usd"]), _usd(c["waste_yearly_usd"])]
    assert _after(text, "measured waste") == [_usd(_monthly_waste(d))], name
    assert _after(text, "waste = idle") == [
        f"{_usd(c['idle_usd'])} {_usd(c['underutilized_waste_usd'])} {_usd(c['headroom_usd'])}"]
    assert _after(text, "idle (<10%)")[0] == _usd(c["by_phase_usd"]["idle"])
    assert _after(text, "total billed") == [_usd(c["observed_usd"])]
    assert _usd(s["monthly_cost_usd"]) in _after(text, "monthly cost")[0]
    assert _after(text, "total: 1 - (1 - F)(1 - D)") == [_usd(s["monthly_savings_usd"])]
    for r in d["recommendations"]:
        assert f"= {_usd(r['monthly_usd'])}/month" in text


def test_markdown_and_html_repeat_each_figure_identically(rendered):
    name, d, t = rendered
    c, s = d["cost"], d["savings"]
    md, page = t["markdown"], t["html"]
    assert _after(md, "| measured waste (cap)") == [_usd(_monthly_waste(d))], name
    assert _after(md, "| waste | $") == [" ".join(_usd(c[k]) for k in (
        "waste_usd", "waste_daily_usd", "waste_monthly_usd", "waste_yearly_usd"))]
    assert _after(md, "| **total** |") == [_usd(c["observed_usd"])]
    # HTML: the KPI cards, the savings table and the waterfall
    cards = re.findall(MONEY + r"\s+waste per month", page)
    assert [f"${x}" for x in cards] == [_usd(c["waste_monthly_usd"])], name
    assert _after(page, "measured waste (cap on efficiency savings)") == [
        _usd(_monthly_waste(d))]
    if Decimal(s["monthly_cost_usd"]) > 0:
        assert f"-{_usd(_monthly_waste(d))}" in page  # the waterfall's waste bar
        assert f"-{_usd(s['efficiency_monthly_usd'])}" in page
    tile = re.findall(MONEY + r"\s+observed cost \(the window\)", page)
    assert tile == [_usd(c["observed_usd"])[1:]]


def test_row_tables_agree_across_formats(rendered):
    """Per-GPU or per-group cost and waste: the same cents in every format."""
    name, d, t = rendered
    rows = d["groups"]["rows"] or d["gpus"]
    for r in rows[:20]:
        pair = f"{_usd(r['cost']['observed_usd'])} {_usd(r['cost']['waste_usd'])}"
        key = (", ".join("(none)" if v is None else str(v) for v in r["key"].values())
               if "key" in r else r["gpu_uuid"])
        for fmt in ("terminal", "markdown"):
            lines = [ln for ln in t[fmt].splitlines() if key[-12:] in ln and pair in
                     " ".join(f"${m}" for m in re.findall(MONEY, ln))]
            assert lines, (name, fmt, key, pair)


def test_fleet_showback_is_the_group_table():
    rep = _fleet()
    d = json.loads(rep.render("json"))
    t = {fmt: rep.render(fmt, width=200) for fmt in ("terminal", "markdown")}
    fleet = d["extra"]["fleet"]
    rows = {str(r["key"]["namespace"] or "unallocated"): r["cost"] for r in d["groups"]["rows"]}
    assert fleet["showback"]
    for e in fleet["showback"]:
        line = rows[str(e["group"]["namespace"])]
        assert (e["cost_usd"], e["waste_usd"]) == (line["observed_usd"], line["waste_usd"])
        for fmt in ("terminal", "markdown"):
            assert f"{_usd(e['cost_usd'])} " in t[fmt] or f"{_usd(e['cost_usd'])}\n" in t[fmt]
    assert fleet["total"]["cost_usd"] == d["cost"]["observed_usd"]
    assert fleet["total"]["waste_usd"] == d["cost"]["waste_usd"]
