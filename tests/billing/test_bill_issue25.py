"""Issue 25: the bill on real-world invoices. One test per symptom the issue lists (each
fails on the code before it), on the generated scenario with one thing changed."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import billgen
import pytest

from gpuaudit.api import bill
from gpuaudit.errors import InputError
from gpuaudit.price.catalog import resolve_rate


def _write(sc: billgen.Scenario, d: Path) -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    b = billgen.write_csv(billgen.focus_rows(sc), d / "focus.csv", billgen.FOCUS_COLUMNS)
    return b, billgen.write_telemetry(sc, d / "run.parquet")


def _run(sc: billgen.Scenario, d: Path, **kw: Any) -> Any:
    b, t = _write(sc, d)
    return bill(b, telemetry=t, **kw)


def _rate(r: Any, needle: str) -> Any:
    return next(rt for m, rt in r.cost.rates.items() if m and needle in m)


def _p5_line(sc: billgen.Scenario) -> billgen.Line:
    return next(ln for ln in sc.lines if "p5.48xlarge" in ln.usage_type
                and ln.charge_category == "Usage")


def test_usage_correction_nets_hours_and_cost(tmp_path: Path) -> None:
    """A negative ConsumedQuantity (ChargeClass Correction) takes its hours and its cost
    off the H100's own lines: the rate stays the price per hour, never 0 or lower."""
    sc = billgen.scenario()
    base = _p5_line(sc)
    s, e = base.start + timedelta(hours=3), base.end + timedelta(hours=3)
    sc.lines.append(replace(base, start=s, end=e, quantity=Decimal(-1), billed=Decimal("-55.04"),
                            effective=Decimal("-55.04"), listed=Decimal("-55.04"),
                            charge_class="Correction", description="usage correction"))
    r = _run(sc, tmp_path)
    h100 = _rate(r, "H100")
    assert h100.usd_per_gpu_hour == Decimal("6.88")  # 55.04 / 8 GPUs: (7 - 1) h of 8 GPUs
    assert all(rt.usd_per_gpu_hour > 0 for rt in r.cost.rates.values())
    assert r.cost.total.observed_cost > 0


def test_quantity_only_correction_is_no_zero_rate(tmp_path: Path) -> None:
    """A correction taking all hours away (cost 0) leaves no hours to price by: the
    catalog prices the model, labelled, instead of a rate of 0."""
    sc = billgen.scenario()
    for ln in list(sc.lines):
        if "p4d" in ln.usage_type:
            sc.lines.append(replace(ln, quantity=-ln.quantity, billed=Decimal(0),
                                    effective=Decimal(0), listed=Decimal(0),
                                    charge_class="Correction"))
    r = _run(sc, tmp_path)
    a100 = _rate(r, "A100-SXM4-40GB")
    assert a100.usd_per_gpu_hour > 0
    assert "catalog" in a100.source


def test_refund_is_never_a_rate(tmp_path: Path) -> None:
    """A refund on the committed A10G node (booked as a negative usage line, no hours) is
    split like its node's lines, not a negative rate."""
    sc = billgen.scenario()
    g5 = next(ln for ln in sc.lines if "g5.12xlarge" in ln.usage_type)
    sc.lines.append(replace(g5, quantity=None, unit=None, billed=Decimal("-30.00"),
                            effective=Decimal("-30.00"), listed=Decimal("-30.00"),
                            description="Refund"))
    r = _run(sc, tmp_path)
    a10 = _rate(r, "A10G")
    assert a10.usd_per_gpu_hour == Decimal("0.9217")
    usd = r.extra["bill"]["currencies"]["USD"]
    # the refund went to the team on the node, like the node's own lines
    lines = {ln["line"]: ln for ln in usd["lines"]}
    assert Decimal(lines["vision"]["amount"]) < Decimal("155.12")


def test_host_without_bill_line_priced_by_its_own_model(files: dict[str, Path]) -> None:
    r = bill(files["focus_csv"], telemetry=files["telemetry"])
    a100_80 = _rate(r, "A100-SXM4-80GB")
    cat = resolve_rate("NVIDIA A100-SXM4-80GB")
    assert a100_80.usd_per_gpu_hour == cat.usd_per_gpu_hour
    assert "catalog" in a100_80.source and "no bill line" in a100_80.source
    text = r.render("terminal", width=200)
    assert text.count("A100 40GB SXM:") == 1


def test_spot_saving_only_on_the_share_it_reaches(files: dict[str, Path]) -> None:
    """Spot reaches the H100 (on demand, bill) and the A100 80GB (on demand, catalog), not
    the A100 40GB already on spot nor the committed A10G: its cap is their share of the
    cost, its saving the cost-weighted discount over them."""
    r = bill(files["focus_csv"], telemetry=files["telemetry"])
    spot = next(x for x in r.plan.recommendations if x.remediation.id == "spot")
    on_demand = ("GPU-11", "GPU-15")  # the p5 host and the A100 80GB host
    reach = sum((ln.observed_cost for ln in r.cost.per_gpu
                 if str(ln.key[0]).startswith(on_demand)), Decimal(0))
    total = r.cost.total.observed_cost
    assert abs(spot.cap - reach / total) < Decimal("0.000001")
    assert spot.cap < 1
    assert all(str(u).startswith(on_demand) for u in spot.scope)
    saved = Decimal(0)
    for m, rt in r.cost.rates.items():
        if m and ("H100" in m or "80GB" in m) and rt.spot_usd_per_gpu_hour is not None:
            d = 1 - rt.spot_usd_per_gpu_hour / rt.on_demand_usd_per_gpu_hour * Decimal("1.1")
            saved += d * sum((ln.observed_cost for ln in r.cost.per_gpu if str(
                ln.key[0]).startswith("GPU-11" if "H100" in m else "GPU-15")), Decimal(0))
    assert abs(spot.fraction - saved / total) < Decimal("0.000001")
    assert "A10G" not in spot.evidence and "A100 40GB" not in spot.evidence
    for c in (x for x in r.plan.recommendations if x.remediation.id == "commitment"):
        assert all(str(u).startswith(on_demand) for u in c.scope)


def test_doubled_bill_is_flagged(tmp_path: Path) -> None:
    sc = billgen.scenario()
    sc.lines = [ln for ln in sc.lines for _ in range(2)]
    r = _run(sc, tmp_path)
    b = r.extra["bill"]
    assert b["duplicates"]["lines"] == len(sc.lines) // 2
    assert any("duplicate" in n for n in b["notes"])


def test_period_ending_before_it_starts_is_an_error(tmp_path: Path) -> None:
    sc = billgen.scenario()
    ln = sc.lines[0]
    sc.lines[0] = replace(ln, start=ln.end, end=ln.start)
    with pytest.raises(InputError, match="ends before it starts") as ei:
        _run(sc, tmp_path)
    assert "row 1" in str(ei.value.where)


def test_header_only_bill_is_an_error(tmp_path: Path) -> None:
    sc = billgen.scenario()
    sc.lines = []
    with pytest.raises(InputError, match="no lines"):
        _run(sc, tmp_path)


def test_unknown_currency_is_an_error(tmp_path: Path) -> None:
    sc = billgen.scenario()
    sc.lines[0] = replace(sc.lines[0], currency="XYZ")
    with pytest.raises(InputError, match="ISO 4217") as ei:
        _run(sc, tmp_path)
    assert "XYZ" in str(ei.value)


def test_eur_budget_judged_for_the_bills_month(tmp_path: Path) -> None:
    sc = billgen.scenario()
    b, t = _write(sc, tmp_path)
    bud = tmp_path / "b.toml"
    bud.write_text('currency = "EUR"\n[budgets]\nvision = "100"\n', encoding="utf-8")
    r = bill(b, telemetry=t, budgets=bud, today=None)
    assert r.extra["bill"]["budgets"]["month"] == "2026-10"


def test_split_and_audit_totals_are_explained(files: dict[str, Path]) -> None:
    r = bill(files["focus_csv"], telemetry=files["telemetry"])
    ex = r.extra["bill"]["audit_reconciliation"]
    rows = ex["rows"]
    assert Decimal(ex["bill_total"]) == Decimal("407.46")
    assert sum(Decimal(x["bill_cost"]) for x in rows) == Decimal(ex["bill_total"])
    assert sum(Decimal(x["audit_cost"]) for x in rows) == Decimal(ex["audit_total"])
    assert Decimal(ex["audit_total"]) == r.cost.total.observed_cost.quantize(Decimal("0.01"))
    a80 = next(x for x in rows if "80GB" in x["gpu_model"])
    assert a80["rate_source"] == "catalog" and a80["bill_gpu_hours"] == 0
    text = json.dumps(ex)
    assert "no bill line" in text
    from gpuaudit.report.bill import bill_html, render_bill
    assert "Bill split vs audit" in render_bill(r.extra["bill"])
    page = bill_html(r.extra["bill"])
    assert 'class="bill-vs-audit"' in page and 'class="bill-buckets"' in page


def test_docs_worked_example_buckets(tmp_path: Path) -> None:
    """docs/billing.md, "Every line in one bucket": the test bill plus a $5.00 promotional
    credit on the account (no resource): each bucket as the doc re-adds it."""
    sc = billgen.scenario()
    tax = next(ln for ln in sc.lines if ln.charge_category == "Tax")
    sc.lines.append(replace(tax, charge_category="Credit", usage_type="Credit",
                            service="Promotional credit", description="Promotional credit",
                            billed=Decimal("-5.00"), effective=Decimal("-5.00"),
                            listed=Decimal("-5.00")))
    r = _run(sc, tmp_path)
    bk = r.extra["bill"]["currencies"]["USD"]["buckets"]
    got = {k: v["amount"] for k, v in bk["buckets"].items()}
    assert got == {"team": "270.03", "idle": "77.56", "unallocated": "59.87",
                   "non_gpu": "25.46", "commitment": "0.00", "tax": "12.34", "credit": "-5.00",
                   "rejected": "0.00"}
    assert bk["invoice_total"] == "440.26" and bk["lines"] == 36 and bk["gpu_lines"] == 26
    lines = {ln["line"]: ln["amount"] for ln in r.extra["bill"]["currencies"]["USD"]["lines"]}
    assert lines["vision"] == "155.12" and lines["nlp"] == "114.91"


def test_each_currency_in_its_own_minor_units(tmp_path: Path) -> None:
    """JPY has no minor unit, BHD three: the Azure lines billed in JPY (333.33 an hour) and
    a BHD tax line reconcile in whole yen and in fils, never in cents."""
    sc = billgen.scenario()
    sc.lines = [replace(ln, currency="JPY", billed=Decimal("333.33"),
                        effective=Decimal("333.33"), listed=Decimal("333.33"))
                if ln.currency == "EUR" else ln for ln in sc.lines]
    tax = next(ln for ln in sc.lines if ln.charge_category == "Tax")
    sc.lines.append(replace(tax, currency="BHD", billed=Decimal("1.2345"),
                            effective=Decimal("1.2345"), listed=Decimal("1.2345")))
    r = _run(sc, tmp_path)
    cur = r.extra["bill"]["currencies"]
    jpy = cur["JPY"]
    assert jpy["buckets"]["invoice_total"] == "667"  # 666.66 rounded to the yen
    assert jpy["lines"][0]["amount"] == "667" and jpy["reconciliation"]["billed"] == "667"
    assert cur["BHD"]["buckets"]["buckets"]["tax"]["amount"] == "1.234"  # half-even fils
    rows = r.showback.to_pydict()
    yen = [i for i, c in enumerate(rows["currency"]) if c == "JPY"]
    assert sum(rows["amount"][i] for i in yen) == 667  # two hours: 333 + 334 whole yen
    assert {rows["minor_units"][i] for i in yen} == {0}
    from gpuaudit.report.bill import render_bill, showback_csv
    assert "JPY 667 " in render_bill(r.extra["bill"]) or "JPY 667\n" in render_bill(
        r.extra["bill"])
    assert ",334," in showback_csv(r.showback) and ",333," in showback_csv(r.showback)


def test_free_hours_are_zero_and_say_so(tmp_path: Path) -> None:
    """The A100 40GB's hours billed at 0 (a free trial): its rate is 0 and the price line
    says FREE; the rate of no other model changes."""
    sc = billgen.scenario()
    sc.lines = [replace(ln, billed=Decimal(0), effective=Decimal(0), listed=Decimal(0))
                if "p4d" in ln.usage_type else ln for ln in sc.lines]
    r = _run(sc, tmp_path)
    a100 = r.cost.rates["NVIDIA A100-SXM4-40GB"]
    assert a100.usd_per_gpu_hour == 0 and "FREE" in a100.source
    assert "FREE" in r.render("terminal", width=400)
    assert r.cost.rates["NVIDIA H100 80GB HBM3"].usd_per_gpu_hour == Decimal("6.88")


@pytest.mark.parametrize("case", ["header_only", "xyz", "end_before_start"])
def test_cli_refuses_what_exited_0(case: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's symptoms as a user met them, from the command line: a header-only bill, a
    currency XYZ and a period that ends before it starts each exited 0; now exit 2 with
    error and fix."""
    from gpuaudit.cli import main

    sc = billgen.scenario()
    if case == "header_only":
        sc.lines = []
    elif case == "xyz":
        sc.lines[0] = replace(sc.lines[0], currency="XYZ")
    else:
        sc.lines[0] = replace(sc.lines[0], start=sc.lines[0].end, end=sc.lines[0].start)
    b, t = _write(sc, tmp_path)
    assert main(["bill", str(b), "--telemetry", str(t)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "fix:" in err and "Traceback" not in err
