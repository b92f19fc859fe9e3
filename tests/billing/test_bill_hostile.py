"""Hostile bills: the FOCUS spec's own examples, MIG and vGPU shares, realised savings, and
a property test over random invoices (refunds, credits, taxes, corrections, duplicates,
several currencies, partial hours, lines without telemetry, telemetry without lines)."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from datetime import timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import billgen
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.api import bill
from gpuaudit.cli import main
from gpuaudit.errors import InputError
from gpuaudit.price.billing import open_bill
from gpuaudit.price.billing.allocate import allocate
from gpuaudit.price.billing.currency import minor_units, quantum
from gpuaudit.price.billing.rates import gpu_share

SPEC = Path(__file__).parent.parent / "data" / "billing" / "focus_spec_examples"
#: the spec's examples that break the spec: SaaS US dates and "$10,000.00 " amounts, and an
#: hour 30 in commitment purchase scenarios 2 and 3 (``2023-02-01T30:00:00Z``)
OFF_SPEC = {"simple_saas_agreements_a1.csv": "ChargePeriodStart",
            "commitment_discount_purchase_scenario_3.csv": "ChargePeriodEnd",
            "virtual_currency_pricing_model_a1.csv": "ChargePeriodStart",
            "commitment_discount_purchase_scenario_2.csv": "ChargePeriodEnd"}
ISO = sorted(p for p in SPEC.glob("*.csv") if p.name not in OFF_SPEC)


def _no_hours() -> pa.Table:
    return pa.table({"host": pa.array([], pa.string()),
                     "period_start": pa.array([], pa.timestamp("s", tz="UTC")),
                     "held": pa.array([], pa.bool_()), "g_0": pa.array([], pa.string()),
                     **{c: pa.array([], pa.int64()) for c in (
                         "idle_ms", "underutilized_ms", "productive_ms", "compute_bound_ms",
                         "unobserved_ms")}})


@pytest.mark.parametrize("path", ISO, ids=lambda p: p.stem)
def test_spec_examples_every_line_in_one_bucket(path: Path) -> None:
    """Each example of the spec reads; its lines land in buckets that sum to its invoice,
    purchases of a commitment apart from the usage it amortises over."""
    b = open_bill(path)
    alloc = allocate(b, _no_hours(), ["team"])
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    exact = sum((Decimal(r["BilledCost"]) for r in rows), Decimal(0))
    bk = alloc.summary["currencies"]["USD"]["buckets"]
    assert bk["lines"] == len(rows)
    assert Decimal(bk["invoice_total"]) == exact.quantize(Decimal("0.01"), ROUND_HALF_EVEN)
    assert sum(Decimal(v["amount"]) for v in bk["buckets"].values()) == Decimal(
        bk["invoice_total"])
    ids = {r[0] for r in b.con.execute(
        "SELECT DISTINCT commitment_id FROM bill_lines WHERE commitment_id IS NOT NULL"
    ).fetchall()}
    assert ids == {r["CommitmentDiscountId"] for r in rows
                   if r.get("CommitmentDiscountId") not in (None, "", "null", "NULL")}


@pytest.mark.parametrize("name,column", sorted(OFF_SPEC.items()))
def test_spec_saas_examples_off_spec_values_named(name: str, column: str) -> None:
    with pytest.raises(InputError) as ei:
        open_bill(SPEC / name)
    assert column in str(ei.value.where) and "row" in str(ei.value.where)


def test_focus_13_columns_read(tmp_path: Path) -> None:
    """FOCUS 1.3: Allocated* columns and ContractApplied detected; PricingCurrency beside
    BillingCurrency; x_ extension columns kept in the raw relation."""
    p = tmp_path / "f13.csv"
    cols = ["ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "ChargeClass",
            "BilledCost", "EffectiveCost", "BillingCurrency", "PricingCurrency",
            "AllocatedMethodId", "AllocatedResourceId", "ContractApplied", "x_Team",
            "ServiceProviderName"]
    with p.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerow(["2026-10-01T00:00:00Z", "2026-10-01T01:00:00Z", "Usage", "", "10.00",
                     "10.00", "EUR", "USD", "m1", "r1", "", "vision", "Acme"])
        w.writerow(["2026-10-01T00:00:00Z", "2026-10-01T01:00:00Z", "Tax", "", "1.90",
                     "1.90", "EUR", "USD", "", "", "", "", "Acme"])
    b = open_bill(p)
    assert b.dialect == "FOCUS 1.3"
    assert b.con.execute("SELECT DISTINCT pricing_currency FROM bill_lines").fetchall() == [
        ("USD",)]
    assert "x_Team" in b.columns
    assert any("priced in USD and billed in EUR" in n for n in b.notes)
    assert any("1 line(s) carry the provider's own split" in n for n in b.notes)
    bad = tmp_path / "bad.csv"
    bad.write_text(p.read_text(encoding="utf-8").replace(",USD,", ",USX,", 1),
                   encoding="utf-8")
    with pytest.raises(InputError, match="ISO 4217"):
        open_bill(bad)


def test_gpu_shares() -> None:
    assert gpu_share("GRID A100-10C")[:2] == ("NVIDIA A100 40GB", Fraction(1, 4))
    assert gpu_share("GRID A100D-20C")[:2] == ("NVIDIA A100 80GB", Fraction(1, 4))
    assert gpu_share("GRID A100-40C")[1] == 1
    board, share, label = gpu_share("NVIDIA A100-SXM4-40GB MIG 1g.5gb")
    assert board == "NVIDIA A100-SXM4-40GB" and share == Fraction(1, 7) and label
    assert gpu_share("NVIDIA A100-SXM4-40GB MIG 3g.20gb")[1] == Fraction(1, 2)  # 4/8 memory
    assert gpu_share("NVIDIA H100 80GB HBM3") == ("NVIDIA H100 80GB HBM3", Fraction(1), None)


def test_vgpu_priced_as_its_share(tmp_path: Path) -> None:
    """A GRID A100-10C vGPU is 10/40 of the A100 40GB: a quarter of that model's rate (here
    the bill's own A100 40GB spot rate), not the whole GPU's."""
    sc = billgen.scenario()
    t = sc.telemetry
    assert t is not None
    models = ["GRID A100-10C" if h == "ip-10-0-1-15" else m for h, m in zip(
        t.column("host").to_pylist(), t.column("gpu_model").to_pylist())]
    sc.telemetry = t.set_column(t.column_names.index("gpu_model"), "gpu_model",
                                pa.array(models, t.schema.field("gpu_model").type))
    b = billgen.write_csv(billgen.focus_rows(sc), tmp_path / "f.csv", billgen.FOCUS_COLUMNS)
    r = bill(b, telemetry=billgen.write_telemetry(sc, tmp_path / "t.parquet"))
    whole = r.cost.rates["NVIDIA A100-SXM4-40GB"].usd_per_gpu_hour
    v = r.cost.rates["GRID A100-10C"]
    assert v.usd_per_gpu_hour == (whole / 4).quantize(Decimal("0.0001"))
    assert "10/40 GB" in v.source


def test_bill_compare_realised_savings(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """This month the idle GPUs of the p5 host are gone (a quarter of its cost): the idle
    line falls to zero, the realised saving is last month's idle line, per month."""
    sc = billgen.scenario()
    last_b, tel = (billgen.write_csv(billgen.focus_rows(sc), tmp_path / "last.csv",
                                     billgen.FOCUS_COLUMNS),
                   billgen.write_telemetry(sc, tmp_path / "t.parquet"))
    sc2 = billgen.scenario()
    sc2.lines = [replace(ln, billed=ln.billed * Decimal("0.75"),
                         effective=ln.effective * Decimal("0.75"),
                         listed=ln.listed * Decimal("0.75"))
                 if "p5.48xlarge" in ln.usage_type and ln.charge_category == "Usage" else ln
                 for ln in sc2.lines]
    t = sc2.telemetry
    assert t is not None
    keep = [u not in ("GPU-11-06", "GPU-11-07") for u in t.column("gpu_uuid").to_pylist()]
    sc2.telemetry = t.filter(pa.array(keep))
    this_b = billgen.write_csv(billgen.focus_rows(sc2), tmp_path / "this.csv",
                               billgen.FOCUS_COLUMNS)
    tel2 = billgen.write_telemetry(sc2, tmp_path / "t2.parquet")
    for b, tt, out in ((last_b, tel, "last.json"), (this_b, tel2, "this.json")):
        assert main(["bill", str(b), "--telemetry", str(tt), "--format", "json",
                     "-o", str(tmp_path / out)]) == 0
    capsys.readouterr()
    assert main(["bill", "compare", str(tmp_path / "last.json"), str(tmp_path / "this.json"),
                 "--format", "json"]) == 0
    cmp = json.loads(capsys.readouterr().out)
    idle = next(x for x in cmp["teams"] if x["line"] == "idle (held by nobody)")
    # last: 2/8 of 6 h x 55.04 less the refund's share = 77.56 in 6 h; this: nothing
    assert idle["last"] == "77.56" and idle["this"] == "0.00"
    assert Decimal(idle["realised_monthly"]) == (Decimal("77.56") / 6 * 720).quantize(
        Decimal("0.01"))
    rem = {x["id"]: x for x in cmp["remediations"]}
    assert Decimal(rem["idle_shutdown"]["taken_monthly"]) > 0
    # the two bills themselves, each with its telemetry: the same comparison
    capsys.readouterr()
    assert main(["bill", "compare", str(last_b), str(this_b), "--telemetry", str(tel),
                 "--telemetry", str(tel2), "--format", "json"]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert direct["teams"] == cmp["teams"] and direct["remediations"] == cmp["remediations"]
    # a bill without the measured time, and a file that is neither, are errors with a fix
    assert main(["bill", "compare", str(tmp_path / "last.json"), str(last_b)]) == 2
    err = capsys.readouterr().err
    assert "needs the measured GPU time" in err and "--telemetry" in err
    (tmp_path / "notes.txt").write_text("not json", encoding="utf-8")
    assert main(["bill", "compare", str(tmp_path / "last.json"),
                 str(tmp_path / "notes.txt")]) == 2
    assert "cannot read the JSON report" in capsys.readouterr().err
    # the plain command still takes a bill
    assert main(["bill", str(last_b), "--telemetry", str(tel), "--format", "csv"]) == 0


# -- property: hostile bills ---------------------------------------------------------------
_KINDS = ["p5", "g6", "m5", "tax", "credit", "purchase", "adjustment", "correction", "refund",
          # FOCUS 1.3: a line the provider split, a commitment's purchase and unused part,
          # usage applied to a contract commitment
          "split", "commit_purchase", "commit_unused", "contract_usage"]
_CA = json.dumps({"Elements": [{"ContractId": "c-1", "ContractCommitmentId": "c-1",
                                "ContractCommitmentAppliedCost": 1.0}]})


@st.composite
def hostile(draw: Any) -> list[billgen.Line]:
    base = billgen.scenario()
    p5 = next(ln for ln in base.lines if "p5.48xlarge" in ln.usage_type)
    g6 = next(ln for ln in base.lines if "g6.xlarge" in ln.usage_type)
    m5 = next(ln for ln in base.lines if "m5.large" in ln.usage_type)
    out = []
    n = draw(st.integers(1, 14))
    for _ in range(n):
        kind = draw(st.sampled_from(_KINDS))
        ccy = draw(st.sampled_from(["USD", "USD", "EUR", "JPY"]))
        hour = draw(st.integers(-1, 7))
        cents = draw(st.integers(-50_000, 500_000))
        amount = Decimal(cents).scaleb(-draw(st.sampled_from([2, 4, 10])))
        q = Decimal(draw(st.sampled_from(["1", "0.5", "0.25", "2"])))
        src = {"p5": p5, "g6": g6, "m5": m5}.get(kind, p5)
        s = billgen.T0 + timedelta(hours=hour)
        ln = replace(src, start=s, end=s + timedelta(hours=1), currency=ccy,
                     billed=abs(amount), effective=abs(amount), listed=abs(amount),
                     quantity=q)
        if kind == "tax":
            ln = replace(ln, charge_category="Tax", usage_type="Tax", description="VAT",
                         resource_id=None, quantity=None, unit=None)
        elif kind in ("credit", "refund"):
            ln = replace(ln, charge_category="Credit" if kind == "credit" else "Usage",
                         billed=-abs(amount), effective=-abs(amount), listed=-abs(amount),
                         quantity=None, unit=None)
        elif kind == "purchase":
            ln = replace(ln, charge_category="Purchase", usage_type="USE1-HeavyUsage",
                         description="commitment fee", quantity=None, unit=None)
        elif kind == "adjustment":
            ln = replace(ln, charge_category="Adjustment", billed=amount, effective=amount,
                         listed=amount)
        elif kind == "correction":
            ln = replace(ln, charge_class="Correction", quantity=-q, billed=-abs(amount),
                         effective=-abs(amount), listed=-abs(amount))
        elif kind == "split":
            target = draw(st.sampled_from([(None, None), ("pod-a", None),
                                           ("pod-b", '{"team": "vision"}'),
                                           (None, '{"x_other": "y"}')]))
            ln = replace(ln, allocated_method_id="split-1", allocated_resource_id=target[0],
                         allocated_tags=target[1])
        elif kind == "commit_purchase":
            ln = replace(ln, charge_category="Purchase", resource_id="cd-1", quantity=None,
                         unit=None, commitment_id="cd-1",
                         effective=draw(st.sampled_from([Decimal(0), abs(amount)])))
        elif kind == "commit_unused":
            ln = replace(ln, resource_id="cd-1", quantity=None, unit=None, billed=Decimal(0),
                         commitment_id="cd-1", commitment_status="Unused")
        elif kind == "contract_usage":
            ln = replace(ln, billed=Decimal(0), contract_applied=_CA)
        out.append(ln)
        if draw(st.booleans()) and draw(st.booleans()):
            out.append(ln)  # a duplicate
    return out


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(lines=hostile())
def test_hostile_bills_every_line_accounted_for(lines: list[billgen.Line],
                                                tmp_path_factory: pytest.TempPathFactory
                                                ) -> None:
    d = tmp_path_factory.mktemp("hostile")
    sc = billgen.scenario()
    sc.lines = lines
    b = billgen.write_csv(billgen.focus_rows(sc), d / "f.csv", billgen.FOCUS13_COLUMNS)
    cost = "effective" if len(lines) % 2 else "billed"
    r = bill(b, telemetry=billgen.write_telemetry(sc, d / "t.parquet"), cost=cost)
    cur = r.extra["bill"]["currencies"]
    for ccy in {ln.currency for ln in lines}:
        mine = [ln for ln in lines if ln.currency == ccy]
        exact = sum((ln.billed if cost == "billed" else ln.effective for ln in mine),
                    Decimal(0))
        bk = cur[ccy]["buckets"]
        # no line vanishes, the buckets sum to the invoice to the cent
        assert bk["lines"] == len(mine)
        total = Decimal(bk["invoice_total"])
        # to the minor unit of the currency: JPY 0 digits, USD and EUR 2
        assert total == exact.quantize(quantum(ccy), ROUND_HALF_EVEN)
        assert total.as_tuple().exponent == -minor_units(ccy)
        assert sum(Decimal(v["amount"]) for v in bk["buckets"].values()) == total
        assert Decimal(bk["sum_of_buckets"]) == total
        split = sum(Decimal(v["amount"]) for k, v in bk["buckets"].items()
                    if k in ("team", "idle", "unallocated"))
        assert split == Decimal(cur[ccy]["reconciliation"]["billed"])
        # a commitment's purchase and unused part are its bucket's, never GPU time
        commit = [ln for ln in mine if ln.commitment_id and (
            ln.charge_category == "Purchase" or ln.commitment_status == "Unused")]
        twice = [ln for ln in commit if cost == "effective" and ln.charge_category ==
                 "Purchase" and ln.effective != 0 and any(
                     u.commitment_id == ln.commitment_id and u.charge_category == "Usage"
                     and u.effective != 0 for u in mine)]
        assert bk["buckets"]["commitment"]["lines"] == len(commit) - len(twice)
        # a line the provider split goes to what it names, whole
        split_lines = [ln for ln in mine if ln.allocated_method_id]
        targets = [x for x in r.extra["bill"]["provider_split"]["targets"]
                   if x["currency"] == ccy]
        named = sum((Decimal(x["amount"]) for x in targets), Decimal(0))
        want = sum((ln.billed if cost == "billed" else ln.effective for ln in split_lines),
                   Decimal(0))
        assert sum(x["lines"] for x in targets) == len(split_lines)
        # each target rounds once to the minor unit
        assert abs(named - want) <= quantum(ccy) * max(len(targets), 1) / 2
    if "JPY" in cur:
        for ln in cur["JPY"]["lines"]:
            assert "." not in ln["amount"]  # whole yen
    # no rate is negative, and zero only where the source says free
    for rt in r.cost.rates.values():
        assert rt.usd_per_gpu_hour >= 0
        if rt.usd_per_gpu_hour == 0:
            assert "FREE" in rt.source
    dup = r.extra["bill"]["duplicates"]["lines"]
    assert dup >= 0


def test_mig_slice_from_dcgm_priced_as_its_share(tmp_path: Path) -> None:
    """dcgm-exporter carries a MIG instance's profile in ``mig_profile`` and the board in
    ``gpu_model``: the A100 40GB host's GPUs as 3g.20gb slices are priced at half the board's
    rate (the larger of 3/7 compute and 4/8 memory), not as whole GPUs."""
    sc = billgen.scenario()
    t = sc.telemetry
    assert t is not None
    prof = pa.array(["3g.20gb" if h == "ip-10-0-1-12" else None
                     for h in t.column("host").to_pylist()], pa.string())
    if "mig_profile" in t.column_names:
        t = t.set_column(t.column_names.index("mig_profile"), "mig_profile", prof)
    else:
        t = t.append_column("mig_profile", prof)
    sc.telemetry = t
    b = billgen.write_csv(billgen.focus_rows(sc), tmp_path / "f.csv", billgen.FOCUS_COLUMNS)
    r = bill(b, telemetry=billgen.write_telemetry(sc, tmp_path / "t.parquet"))
    whole = r.cost.rates["NVIDIA H100 80GB HBM3"]  # another model: unchanged
    assert whole.usd_per_gpu_hour == Decimal("6.88")
    mig = r.cost.rates["NVIDIA A100-SXM4-40GB MIG 3g.20gb"]
    assert "NVIDIA A100-SXM4-40GB" not in r.cost.rates
    assert mig.usd_per_gpu_hour == (Decimal("0.8489") / 2).quantize(Decimal("0.0001"))
    assert "MIG 3g.20gb: 1/2" in mig.source
