"""FOCUS 1.3 on the bill: the provider's own split (``Allocated*``) and commitments as FOCUS
amortises them (``CommitmentDiscountId``, ``ContractApplied``), with the spec's own examples:

- the ``AllocatedMethodDetails`` objects of the spec's appendix "Examples: Allocated Method
  Details" (scenarios 1 to 4, verbatim) on allocated charges of a GPU node's usage;
- the rows of the spec's appendix "Examples: Contract Applied" (scenario 1, the purchase of a
  contract commitment; scenario 2, usage applied to it), verbatim but for the resource being
  a GPU node;
- the spec's commitment-discount usage example with an unused part
  (``commitment_discount_usage_scenario_3.csv``, tests/data/billing/focus_spec_examples).

FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec (CC BY 4.0), release 1.3 text:
specification/appendix/json_object_examples/{allocated_method_details,contract_applied}_examples.md.
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import billgen
import pyarrow as pa
import pytest

from gpuaudit.api import bill
from gpuaudit.errors import InputError
from gpuaudit.price.billing import open_bill
from gpuaudit.schema import build_table

SPEC = Path(__file__).parent.parent / "data" / "billing" / "focus_spec_examples"

# the spec's AllocatedMethodDetails examples, scenarios 1-4, as the appendix writes them
DETAILS = {
    1: {"Elements": [{"AllocatedRatio": 0.1, "UsageUnit": "Hours", "UsageQuantity": 300}]},
    2: {"Elements": [{"AllocatedRatio": 0.05, "UsageUnit": "CPU", "UsageQuantity": 0.5},
                     {"AllocatedRatio": 0.1, "UsageUnit": "Memory", "UsageQuantity": 4}]},
    3: {"Elements": [{"AllocatedRatio": 0.45}]},
    4: {"Elements": [{"AllocatedRatio": 0.6, "UsageUnit": "vCPU", "UsageQuantity": 1,
                      "x_ReservedVCPU": 1, "x_UsedVCPU": 0.5, "x_AllocatedVCPU": 1}]},
}
ALLOC_COLUMNS = (*billgen.FOCUS_COLUMNS, "AllocatedMethodId", "AllocatedMethodDetails",
                 "AllocatedResourceId", "AllocatedResourceName", "AllocatedTags")


def _ratio(d: dict[str, Any]) -> Decimal:
    return sum((Decimal(str(e["AllocatedRatio"])) for e in d["Elements"]), Decimal(0))


def _split_bill(sc: billgen.Scenario, path: Path) -> tuple[Path, Decimal]:
    """The scenario with the p5.48xlarge node's usage split by the provider, each hour into
    scenario 1 (0.1, tagged team vision), scenario 2 (0.15, a pod named by AllocatedResourceName
    only), scenario 3 (0.45, tagged team nlp under a prefixed key) and the unallocated
    0.30 (AllocatedMethodId set, nothing allocated to); returns the node's total."""
    rows: list[dict[str, str]] = []
    node = Decimal(0)
    for r in billgen.focus_rows(sc):
        r = {**r, **{c: "" for c in ALLOC_COLUMNS[len(billgen.FOCUS_COLUMNS):]}}
        if "p5.48xlarge" not in r["x_UsageType"] or r["ChargeCategory"] != "Usage":
            rows.append(r)
            continue
        cost = Decimal(r["BilledCost"])
        node += cost
        parts = [(DETAILS[1], "pod-det-train-0", None, {"team": "vision", "env": "prod"}),
                 (DETAILS[2], "pod-serve-7d9", "ml/serve-7d9", None),
                 (DETAILS[3], "pod-llm-ft-0", None, {"user:team": "nlp"})]
        left = cost
        for det, rid, name, tags in parts:
            amount = (cost * _ratio(det)).quantize(Decimal("0.0000000001"))
            left -= amount
            rows.append({**r, "BilledCost": str(amount), "EffectiveCost": str(amount),
                         "ListCost": str(amount),
                         "ConsumedQuantity": str(Decimal(r["ConsumedQuantity"]) * _ratio(det)),
                         "AllocatedMethodId": "aws-eks-split-cost-allocation",
                         "AllocatedMethodDetails": json.dumps(det), "AllocatedResourceId": rid,
                         "AllocatedResourceName": name or "",
                         "AllocatedTags": "" if tags is None else json.dumps(tags)})
        rest = Decimal(1) - sum((_ratio(p[0]) for p in parts), Decimal(0))
        rows.append({**r, "BilledCost": str(left), "EffectiveCost": str(left),
                     "ListCost": str(left),
                     "ConsumedQuantity": str(Decimal(r["ConsumedQuantity"]) * rest),
                     "AllocatedMethodId": "aws-eks-split-cost-allocation",
                     "AllocatedMethodDetails": json.dumps({"Elements": [
                         {"AllocatedRatio": float(rest)}]})})
    return billgen.write_csv(rows, path, ALLOC_COLUMNS), node


def test_provider_split_goes_to_what_it_names(tmp_path: Path) -> None:
    """A GPU line the provider split (FOCUS 1.3 Allocated*) goes whole to the team its
    AllocatedTags name (or the resource it names), the unallocated portion to unallocated;
    never again over the parent node's measured time; the buckets still sum to the invoice
    and the report lists the provider-allocated lines."""
    sc = billgen.scenario()
    p, node = _split_bill(sc, tmp_path / "split.csv")
    r = bill(p, telemetry=billgen.write_telemetry(sc, tmp_path / "t.parquet"))
    b = r.extra["bill"]
    usd = b["currencies"]["USD"]
    lines = {ln["line"]: ln for ln in usd["lines"]}
    # the node's 7 hours (6 measured + 1 past the telemetry): 0.1 to vision, 0.15 to the pod,
    # 0.45 to nlp, 0.30 unallocated, each to the cent of the exact share
    cent = Decimal("0.01")

    # the node's $20.00 refund (hour 2) follows the provider's split of that hour, like the
    # lines it corrects
    def share(x: str) -> Decimal:
        return ((node - Decimal("20.00")) * Decimal(x)).quantize(cent)

    got_split = {k: Decimal(v["phases"]["provider_split"]) for k, v in lines.items()
                 if "provider_split" in v["phases"]}
    assert got_split == {"vision": share("0.1"), "ml/serve-7d9": share("0.15"),
                         "nlp": share("0.45"),
                         "unallocated (provider split: unallocated portion)": share("0.30")}
    # the numbers docs/billing.md re-adds ("Lines the provider split")
    assert node == Decimal("385.28")
    assert {k: str(v) for k, v in got_split.items()} == {
        "vision": "36.53", "ml/serve-7d9": "54.79", "nlp": "164.38",
        "unallocated (provider split: unallocated portion)": "109.58"}
    # nothing of the node went over the telemetry: no idle line (the node's 2 GPUs held by
    # nobody were the scenario's only idle time), no measured phase of the node
    assert "idle (held by nobody)" not in lines
    assert lines["unallocated (provider split: unallocated portion)"]["kind"] == "unallocated"
    bk = usd["buckets"]
    exact = sum((Decimal(row["BilledCost"]) for row in csv.DictReader(p.open())
                 if row["BillingCurrency"] == "USD"), Decimal(0))
    assert Decimal(bk["invoice_total"]) == exact.quantize(cent)
    assert sum(Decimal(v["amount"]) for v in bk["buckets"].values()) == exact.quantize(cent)
    assert usd["reconciliation"]["difference"] == "0.00"
    # the report says which lines the provider allocated, and to what
    ps = b["provider_split"]
    assert ps["lines"] == 7 * 4
    to = {(x["allocated_resource_id"], x["to"]) for x in ps["targets"]}
    assert to == {("pod-det-train-0", "vision"), ("pod-serve-7d9", "ml/serve-7d9"),
                  ("pod-llm-ft-0", "nlp"),
                  (None, "unallocated (provider split: unallocated portion)")}
    assert all(x["gpu"] and x["lines"] == 7 for x in ps["targets"])
    assert any("split by the provider" in n for n in b["notes"])
    from gpuaudit.report.bill import render_bill
    text = render_bill(b)
    assert "Lines the provider split" in text and "pod-serve-7d9" in text
    assert "provider split" in text.split("Lines the provider split")[0]  # the phase column
    from gpuaudit.report.bill import bill_html
    page = bill_html(b)
    assert 'class="bill-provider-split"' in page and "ml/serve-7d9" in page
    # the rate of the H100 is unchanged: the allocated charges' costs and hours sum to the
    # origin's
    assert r.cost.rates["NVIDIA H100 80GB HBM3"].usd_per_gpu_hour == Decimal("6.88")


def test_provider_split_ratios_not_summing_to_one_noted(tmp_path: Path) -> None:
    """The spec: the AllocatedRatio of an origin charge's allocated charges sum to 1; a bill
    whose do not is noted (its amounts are still split as billed)."""
    sc = billgen.scenario()
    p, _node = _split_bill(sc, tmp_path / "split.csv")
    # the nlp charge's details become the spec's scenario 4 (ratio 0.6, with x_ properties)
    # while its amount stays 0.45 of the origin: the ratios sum to 0.1 + 0.15 + 0.6 + 0.3
    def esc(d: dict[str, Any]) -> str:
        return json.dumps(d).replace('"', '""')

    text = p.read_text(encoding="utf-8")
    assert esc(DETAILS[3]) in text
    p.write_text(text.replace(esc(DETAILS[3]), esc(DETAILS[4])), encoding="utf-8")
    r = bill(p, telemetry=billgen.write_telemetry(sc, tmp_path / "t.parquet"))
    notes = [n for n in r.extra["bill"]["notes"] if "AllocatedRatio" in n]
    assert len(notes) == 1 and "7 origin charge(s)" in notes[0] and "sum to 1.15" in notes[0]
    # the amounts are split as billed: the buckets still sum to the invoice
    bk = r.extra["bill"]["currencies"]["USD"]["buckets"]
    assert sum(Decimal(v["amount"]) for v in bk["buckets"].values()) == Decimal(
        bk["invoice_total"])


def test_allocated_json_not_an_object_is_named(tmp_path: Path) -> None:
    sc = billgen.scenario()
    p, _node = _split_bill(sc, tmp_path / "split.csv")
    p.write_text(p.read_text(encoding="utf-8").replace('{""team"": ""vision""', "team=vision",
                                                       1), encoding="utf-8")
    with pytest.raises(InputError, match="AllocatedTags") as ei:
        open_bill(p)
    assert "row" in str(ei.value.where) and "AllocatedTags" in str(ei.value.where)


# -- ContractApplied: the spec's appendix "Examples: Contract Applied" ---------------------
CA_PURCHASE = {"Elements": [
    {"ContractId": "12345", "ContractCommitmentId": "12345",
     "ContractCommitmentAppliedCost": 500000.00},
    {"ContractId": "12345", "ContractCommitmentId": "23456",
     "ContractCommitmentAppliedCost": 25000.00},
    {"ContractId": "12345", "ContractCommitmentId": "34567",
     "ContractCommitmentAppliedQuantity": 100000.00,
     "ContractCommitmentAppliedUnit": "compute_hours"}]}
CA_USAGE = {"Elements": [
    {"ContractId": "12345", "ContractCommitmentId": "12345",
     "ContractCommitmentAppliedCost": 15.00},
    {"ContractId": "12345", "ContractCommitmentId": "23456",
     "ContractCommitmentAppliedCost": 15.00},
    {"ContractId": "12345", "ContractCommitmentId": "34567",
     "ContractCommitmentAppliedQuantity": 0.50,
     "ContractCommitmentAppliedUnit": "compute_hours"}]}
T0 = datetime(2026, 10, 5, tzinfo=timezone.utc)
CA_COLUMNS = ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd",
              "ChargeCategory", "PricingCategory", "ResourceId", "SkuId", "BilledCost",
              "EffectiveCost", "ConsumedQuantity", "ConsumedUnit", "BillingCurrency",
              "ContractApplied")


def _ts(d: datetime) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%SZ")


def _contract_bill(path: Path, *, purchase_effective: str = "0.00") -> Path:
    """Scenario 1's purchase and scenario 2's usage of ``myResource1`` (here a g6.xlarge, one
    L4), hour by hour over 6 hours."""
    base = {"BillingPeriodStart": "2026-10-01T00:00:00Z",
            "BillingPeriodEnd": "2026-11-01T00:00:00Z", "BillingCurrency": "USD"}
    rows = [{**base, "ChargePeriodStart": _ts(T0), "ChargePeriodEnd": _ts(T0 + timedelta(
        hours=6)), "ChargeCategory": "Purchase", "PricingCategory": "", "ResourceId": "12345",
        "SkuId": "", "BilledCost": "500000.00", "EffectiveCost": purchase_effective,
        "ConsumedQuantity": "", "ConsumedUnit": "", "ContractApplied": json.dumps(CA_PURCHASE)}]
    for h in range(6):
        rows.append({**base, "ChargePeriodStart": _ts(T0 + timedelta(hours=h)),
                     "ChargePeriodEnd": _ts(T0 + timedelta(hours=h + 1)),
                     "ChargeCategory": "Usage", "PricingCategory": "",
                     "ResourceId": "myResource1", "SkuId": "g6.xlarge", "BilledCost": "0.00",
                     "EffectiveCost": "30.00", "ConsumedQuantity": "1",
                     "ConsumedUnit": "Hours", "ContractApplied": json.dumps(CA_USAGE)})
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(CA_COLUMNS))
        w.writeheader()
        w.writerows(rows)
    return path


def _l4_telemetry(hosts: dict[str, str] | None = None) -> pa.Table:
    hosts = hosts or {"myResource1": "vision"}
    n = 6 * 60
    cols: dict[str, list[Any]] = {"ts": [], "host": [], "gpu_uuid": [], "gpu_model": [],
                                  "util_gpu_pct": [], "labels": []}
    for host, team in hosts.items():
        for m in range(n):
            cols["ts"].append(int((T0 + timedelta(minutes=m)).timestamp() * 1e9))
            cols["host"].append(host)
            cols["gpu_uuid"].append(f"GPU-{host}")
            cols["gpu_model"].append("NVIDIA L4")
            cols["util_gpu_pct"].append(85.0)
            cols["labels"].append([("team", team)])
    return build_table({**cols, "ts": pa.array(cols["ts"]).cast(pa.timestamp("ns", "UTC")),
                        "labels": pa.array(cols["labels"], pa.map_(pa.string(),
                                                                   pa.string()))})


def test_contract_commitment_counted_once_in_each_basis(tmp_path: Path) -> None:
    """The spec's contract purchase (BilledCost 500,000, EffectiveCost 0) and the usage
    applied to it (BilledCost 0, EffectiveCost 30 an hour): billed, the purchase is the
    commitment's bucket and the GPU costs 0; effective, the GPU carries the amortised 30 an
    hour and the purchase 0. Never both."""
    p = _contract_bill(tmp_path / "ca.csv")
    tel = _l4_telemetry()
    billed = bill(p, telemetry=tel)
    usd = billed.extra["bill"]["currencies"]["USD"]
    bk = {k: v["amount"] for k, v in usd["buckets"]["buckets"].items()}
    assert bk["commitment"] == "500000.00" and bk["team"] == "0.00"
    assert bk["non_gpu"] == "0.00" and usd["buckets"]["invoice_total"] == "500000.00"
    roles = {x["role"] for x in usd["commitments"]["lines"]}
    assert roles == {"commitment purchase"}
    assert usd["commitments"]["covered_usage"] == {"lines": 6, "billed": "0.00",
                                                   "effective": "180.00"}
    eff = bill(p, telemetry=tel, cost="effective")
    usd = eff.extra["bill"]["currencies"]["USD"]
    bk = {k: v["amount"] for k, v in usd["buckets"]["buckets"].items()}
    assert bk["team"] == "180.00" and bk["commitment"] == "0.00"
    assert usd["buckets"]["invoice_total"] == "180.00"
    # the L4 is priced at its amortised rate and is committed: no commitment lever for it
    rate = eff.cost.rates["NVIDIA L4"]
    assert rate.usd_per_gpu_hour == Decimal("30") and rate.purchase == "committed"
    assert not [x for x in eff.plan.recommendations if x.remediation.id == "commitment"]


def test_purchase_not_amortised_is_not_counted_twice(tmp_path: Path) -> None:
    """An export that keeps the purchase's 500,000 in EffectiveCost while its usage carries
    the amortised 30 an hour: under --cost effective the purchase is rejected with its
    reason (the commitment is already in the usage), and the buckets still sum to the
    column's total."""
    p = _contract_bill(tmp_path / "ca.csv", purchase_effective="500000.00")
    r = bill(p, telemetry=_l4_telemetry(), cost="effective")
    bk = r.extra["bill"]["currencies"]["USD"]["buckets"]
    got = {k: v["amount"] for k, v in bk["buckets"].items()}
    assert got["team"] == "180.00" and got["commitment"] == "0.00"
    assert got["rejected"] == "500000.00"
    assert "already amortised" in bk["buckets"]["rejected"]["reason"]
    assert bk["invoice_total"] == "500180.00"
    assert sum(Decimal(v) for v in got.values()) == Decimal("500180.00")


def test_commitment_discount_id_makes_usage_committed(tmp_path: Path) -> None:
    """A FOCUS 1.0 export may leave PricingCategory empty: usage carrying a
    CommitmentDiscountId (status Used) is committed usage all the same, so the GPU gets no
    commitment lever; on the code before, it was on demand and got one."""
    p = _contract_bill(tmp_path / "ca.csv")
    rows = list(csv.DictReader(p.open(encoding="utf-8")))
    out = tmp_path / "cd.csv"
    cols = [c for c in CA_COLUMNS if c != "ContractApplied"] + [
        "CommitmentDiscountId", "CommitmentDiscountStatus"]
    with out.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for row in rows:
            row.pop("ContractApplied")
            row["CommitmentDiscountId"] = "arn:aws:savingsplans::1:savingsplan/sp-1"
            row["CommitmentDiscountStatus"] = "Used" if row["ChargeCategory"] == "Usage" else ""
            w.writerow(row)
    r = bill(out, telemetry=_l4_telemetry(), cost="effective")
    assert r.cost.rates["NVIDIA L4"].purchase == "committed"
    assert not [x for x in r.plan.recommendations if x.remediation.id == "commitment"]
    assert r.extra["bill"]["currencies"]["USD"]["buckets"]["buckets"]["commitment"][
        "lines"] == 1


def test_spec_unused_commitment_is_not_gpu_time(tmp_path: Path) -> None:
    """The spec's commitment-discount usage scenario 3: 0.75 used by a resource, 0.25 unused
    (its ResourceId the commitment). With the resource a g6.xlarge: the used 0.75 goes to its
    team, the unused 0.25 to the commitment bucket, not to a GPU node never measured."""
    rows = list(csv.DictReader((SPEC / "commitment_discount_usage_scenario_3.csv").open(
        encoding="utf-8")))
    for r in rows:
        r["SkuId"] = "g6.xlarge"
        r["ResourceId"] = r["ResourceId"].replace("<my-resource-id>", "myResource1")
    p = tmp_path / "s3.csv"
    with p.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    t0 = datetime(2023, 1, 1, tzinfo=timezone.utc)
    tel = _l4_telemetry()
    tel = tel.set_column(0, "ts", pa.array([
        v.as_py().replace(year=2023, month=1, day=1) - (T0 - T0.replace(hour=0))
        for v in tel.column("ts")], tel.schema.field("ts").type))
    tel = tel.filter(pa.array([v.as_py() < t0 + timedelta(hours=1)
                               for v in tel.column("ts")]))
    r = bill(p, telemetry=tel, cost="effective")
    usd = r.extra["bill"]["currencies"]["USD"]
    bk = {k: v["amount"] for k, v in usd["buckets"]["buckets"].items()}
    assert bk["team"] == "0.75" and bk["commitment"] == "0.25"
    assert bk["unallocated"] == "0.00"
    assert r.extra["bill"]["bill_without_telemetry"] == []
    assert usd["gpu"]["gpu_hours"] == 1.0
    assert {x["role"] for x in usd["commitments"]["lines"]} == {"unused commitment"}


def test_focus_sample_data_every_line_accounted_for() -> None:
    """The FinOps Foundation's FOCUS sample data (1,000 anonymized real rows; CC BY 4.0):
    every line in one bucket, the buckets sum to the invoice to the cent in each basis, its
    credit in the credit bucket, its adjustments and committed usage kept."""
    from test_bill_hostile import _no_hours

    from gpuaudit.price.billing.allocate import allocate

    path = Path(__file__).parent.parent / "data" / "billing" / "focus_1.0_sample.csv"
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    for cost, col in (("billed", "BilledCost"), ("effective", "EffectiveCost")):
        alloc = allocate(open_bill(path), _no_hours(), ["team"], cost=cost)
        bk = alloc.summary["currencies"]["USD"]["buckets"]
        exact = sum((Decimal(r[col]) for r in rows if r[col] != "NULL"), Decimal(0))
        assert bk["lines"] == len(rows) == 1000
        assert Decimal(bk["invoice_total"]) == exact.quantize(Decimal("0.01"))
        assert sum(Decimal(v["amount"]) for v in bk["buckets"].values()) == Decimal(
            bk["invoice_total"])
        credits = [r for r in rows if r["ChargeCategory"] == "Credit"]
        assert bk["buckets"]["credit"]["lines"] == len(credits) == 1
        assert Decimal(bk["buckets"]["credit"]["amount"]) == sum(
            (Decimal(r[col]) for r in credits), Decimal(0)).quantize(Decimal("0.01"))


def test_sample_data_provenance_and_licence() -> None:
    readme = (Path(__file__).parent.parent / "data" / "billing" / "README.md").read_text(
        encoding="utf-8")
    assert "CC BY 4.0" in readme and "FOCUS-Sample-Data" in readme


def test_provider_split_with_no_group_keys(tmp_path: Path) -> None:
    """``by=None``: a provider-split line naming a resource still goes to it (a team line of
    no group), the unallocated portion to unallocated."""
    sc = billgen.scenario()
    sc.lines = [replace(ln) for ln in sc.lines]
    p, node = _split_bill(sc, tmp_path / "split.csv")
    r = bill(p, telemetry=billgen.write_telemetry(sc, tmp_path / "t.parquet"), by=None)
    usd = r.extra["bill"]["currencies"]["USD"]
    un = [ln for ln in usd["lines"] if ln["reason"] == "provider split: unallocated portion"]
    assert len(un) == 1 and Decimal(un[0]["amount"]) == ((node - 20) * Decimal("0.30")).quantize(
        Decimal("0.01"))


def test_overlapping_periods_are_noted(tmp_path: Path) -> None:
    """A daily line for the p5.48xlarge node beside its hourly lines: the periods overlap
    without being equal, so the same GPU-hour may be billed twice: a note naming the
    resource and both periods (the buckets still sum to the invoice)."""
    sc = billgen.scenario()
    p5 = next(ln for ln in sc.lines if "p5.48xlarge" in ln.usage_type
              and ln.charge_category == "Usage")
    sc.lines.append(replace(p5, start=billgen.T0, end=billgen.T0 + timedelta(days=1),
                            quantity=Decimal(24)))
    p = billgen.write_csv(billgen.focus_rows(sc), tmp_path / "f.csv", billgen.FOCUS_COLUMNS)
    r = bill(p, telemetry=billgen.write_telemetry(sc, tmp_path / "t.parquet"))
    b = r.extra["bill"]
    assert b["overlaps"]["resources"] == 1
    assert b["overlaps"]["examples"][0]["resource_id"] == "i-0a11aaaaaaaaaaaa1"
    assert any("overlap without being equal" in n and "i-0a11aaaaaaaaaaaa1" in n
               for n in b["notes"])
    bk = b["currencies"]["USD"]["buckets"]
    assert sum(Decimal(v["amount"]) for v in bk["buckets"].values()) == Decimal(
        bk["invoice_total"])
    # the plain bill (hourly lines, a refund, a partial hour) has no overlap
    sc2 = billgen.scenario()
    p2 = billgen.write_csv(billgen.focus_rows(sc2), tmp_path / "g.csv", billgen.FOCUS_COLUMNS)
    r2 = bill(p2, telemetry=billgen.write_telemetry(sc2, tmp_path / "t2.parquet"))
    assert r2.extra["bill"]["overlaps"]["resources"] == 0


@pytest.mark.parametrize("extra,version", [
    ((), "FOCUS 1.0"), (("SkuMeter",), "FOCUS 1.1"), (("CapacityReservationId",), "FOCUS 1.1"),
    (("ServiceProviderName",), "FOCUS 1.2"), (("PricingCurrency",), "FOCUS 1.2"),
    (("AllocatedMethodId",), "FOCUS 1.3"), (("ContractApplied",), "FOCUS 1.3")])
def test_focus_versions_detected(extra: tuple[str, ...], version: str) -> None:
    from gpuaudit.price.billing import detect_format

    assert detect_format(["BilledCost", "ChargePeriodStart", "ChargePeriodEnd",
                          *extra]) == ("focus", version)


def test_adjustments_follow_their_line(tmp_path: Path) -> None:
    """ChargeCategory Adjustment: on a GPU node it is split like that node's lines (never a
    rate, never GPU-hours); on another service it is non-GPU; the buckets sum."""
    sc = billgen.scenario()
    p5 = next(ln for ln in sc.lines if "p5.48xlarge" in ln.usage_type
              and ln.charge_category == "Usage")
    m5 = next(ln for ln in sc.lines if "m5.large" in ln.usage_type)
    sc.lines.append(replace(p5, charge_category="Adjustment", quantity=None, unit=None,
                            billed=Decimal("-8.00"), effective=Decimal("-8.00"),
                            listed=Decimal("-8.00"), description="SLA adjustment"))
    sc.lines.append(replace(m5, charge_category="Adjustment", quantity=None, unit=None,
                            billed=Decimal("1.50"), effective=Decimal("1.50"),
                            listed=Decimal("1.50")))
    base = bill(billgen.write_csv(billgen.focus_rows(billgen.scenario()), tmp_path / "a.csv",
                                  billgen.FOCUS_COLUMNS),
                telemetry=billgen.write_telemetry(sc, tmp_path / "t.parquet"))
    r = bill(billgen.write_csv(billgen.focus_rows(sc), tmp_path / "b.csv",
                               billgen.FOCUS_COLUMNS),
             telemetry=billgen.write_telemetry(sc, tmp_path / "t.parquet"))
    a, b = (x.extra["bill"]["currencies"]["USD"] for x in (base, r))
    assert r.cost.rates["NVIDIA H100 80GB HBM3"].usd_per_gpu_hour == Decimal("6.88")
    assert b["gpu"]["gpu_hours"] == a["gpu"]["gpu_hours"]
    split = sum(Decimal(b["buckets"]["buckets"][k]["amount"]) - Decimal(
        a["buckets"]["buckets"][k]["amount"]) for k in ("team", "idle", "unallocated"))
    assert split == Decimal("-8.00")
    assert Decimal(b["buckets"]["buckets"]["non_gpu"]["amount"]) - Decimal(
        a["buckets"]["buckets"]["non_gpu"]["amount"]) == Decimal("1.50")
    assert sum(Decimal(v["amount"]) for v in b["buckets"]["buckets"].values()) == Decimal(
        b["buckets"]["invoice_total"])


def test_cur_commitment_fee_not_counted_twice(files: dict[str, Path], tmp_path: Path) -> None:
    """AWS CUR: the g5.12xlarge's reserved-instance fee (RIFee, $22.12) and its
    DiscountedUsage (reservation/EffectiveCost, 6 x $3.6868 = $22.12): billed, the fee is the
    commitment bucket's cash and the usage bills 0; effective, the usage carries the
    amortised $22.12 to vision and the fee only its unused part (0 here, or
    reservation/UnusedRecurringFee where the export has it). On the code before, the
    effective view counted the $22.12 twice."""
    tel = files["telemetry"]
    billed = bill(files["cur_csv"], telemetry=tel).extra["bill"]["currencies"]["USD"]
    eff = bill(files["cur_csv"], telemetry=tel, cost="effective").extra["bill"]
    usd = eff["currencies"]["USD"]
    assert billed["buckets"]["buckets"]["commitment"] == {"amount": "22.12", "lines": 1}
    assert usd["buckets"]["buckets"]["commitment"] == {"amount": "0.00", "lines": 1}
    assert usd["commitments"]["lines"][0]["billed"] == "22.12"
    assert any("RIFee" in n for n in eff["notes"])
    focus = bill(files["focus_csv"], telemetry=tel, cost="effective").extra["bill"]
    # the same bill as FOCUS and as CUR: the same effective invoice for the AWS lines
    f_usd = focus["currencies"]["USD"]["buckets"]
    assert Decimal(usd["buckets"]["invoice_total"]) == Decimal(f_usd["invoice_total"])
    # an export with the unused-fee column: the fee's effective cost is that part
    rows = list(csv.DictReader(gzip.open(files["cur_csv"], "rt", encoding="utf-8")))
    for r in rows:
        r["reservation/UnusedRecurringFee"] = "1.25" if r["lineItem/LineItemType"] == \
            "RIFee" else ""
    p = billgen.write_csv(rows, tmp_path / "cur.csv",
                          (*billgen.CUR_COLUMNS, "reservation/UnusedRecurringFee"))
    u2 = bill(p, telemetry=tel, cost="effective").extra["bill"]["currencies"]["USD"]
    assert u2["buckets"]["buckets"]["commitment"]["amount"] == "1.25"
