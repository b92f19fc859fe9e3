"""Issue 27, the bill's own figures from fewer scans: ``bill_side`` sums one grouping of the
lines (``bill_cube``) instead of a query over every line per figure, and sorts the charge
periods only of resources whose periods can overlap. Both are held here to the per-line
queries they replace, over random bills (GPU and other SKUs, usage, tax, credits, purchases,
corrections, refunds, missing costs, hourly / half-hour / daily / unaligned periods)."""

from __future__ import annotations

import csv
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.price.billing import open_bill
from gpuaudit.price.billing.allocate import (
    _HOURS,
    RATE_LINES,
    ROLE_COMMIT,
    UNITS_PER_USD,
    _iso,
    bill_side,
)
from gpuaudit.price.billing.join import COST_COLUMNS

T0 = datetime(2026, 10, 1, tzinfo=timezone.utc)
FIELDS = ["ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "ChargeClass",
          "ResourceId", "ServiceName", "x_UsageType", "PricingCategory", "ConsumedQuantity",
          "ConsumedUnit", "BilledCost", "EffectiveCost", "ListCost", "BillingCurrency"]
SKUS = ["BoxUsage:p5.48xlarge", "SpotUsage:p4d.24xlarge", "BoxUsage:m5.large", ""]
#: the GPU test before issue 27 (a correlated EXISTS)
OLD_IS_GPU = ("(EXISTS (SELECT 1 FROM gpu_skus s WHERE s.sku_text = b.sku_text) AND NOT "
              f"{ROLE_COMMIT})")


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    return path


@st.composite
def bills(draw: Any) -> list[dict[str, str]]:
    rows = []
    for _ in range(draw(st.integers(1, 16))):
        start = T0 + timedelta(minutes=draw(st.sampled_from([0, 0, 30, 60, 60, 90, 120, 1440])))
        minutes = draw(st.sampled_from([60, 60, 30, 120, 1440, 0]))
        cost = draw(st.sampled_from(["55.04", "1.25", "-3.10", "0", "", "12.5"]))
        eff = draw(st.sampled_from([cost, "0", "40.01"]))
        rows.append({
            "ChargePeriodStart": start.isoformat(),
            "ChargePeriodEnd": (start + timedelta(minutes=minutes)).isoformat(),
            "ChargeCategory": draw(st.sampled_from(["Usage", "Usage", "Tax", "Credit",
                                                     "Purchase", "Adjustment"])),
            "ChargeClass": draw(st.sampled_from(["", "", "Correction"])),
            "ResourceId": draw(st.sampled_from(["i-0", "i-1", "i-2", ""])),
            "ServiceName": draw(st.sampled_from(["EC2", "S3", ""])),
            "x_UsageType": draw(st.sampled_from(SKUS)),
            "PricingCategory": draw(st.sampled_from(["Standard", "Dynamic", "Committed", ""])),
            "ConsumedQuantity": draw(st.sampled_from(["1", "0.5", "3600", ""])),
            "ConsumedUnit": draw(st.sampled_from(["Hours", "Seconds", "GB-Mo", ""])),
            "BilledCost": cost, "EffectiveCost": eff,
            "ListCost": draw(st.sampled_from([cost, "60"])),
            "BillingCurrency": draw(st.sampled_from(["USD", "USD", "EUR"])),
        })
    return rows


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=bills(), cost=st.sampled_from(["billed", "effective", "list"]))
def test_bill_side_equals_the_per_line_queries(rows: list[dict[str, str]], cost: str,
                                               tmp_path_factory: Any) -> None:
    b = open_bill(_write(tmp_path_factory.mktemp("cube") / "b.csv", rows))
    side = bill_side(b, cost=cost)
    con, col = b.con, COST_COLUMNS[cost]
    totals = {str(r[0]): (r[1], int(r[2])) for r in con.execute(
        "SELECT currency, sum(billed_cost), count(*) FROM bill_lines GROUP BY currency"
    ).fetchall()}
    assert side.totals == totals
    non_gpu: dict[str, set[tuple[Any, ...]]] = {}
    for r in con.execute(
            "SELECT currency, COALESCE(service, '(no service)'), COALESCE(charge_category, ''), "
            "sum(billed_cost), sum(effective_cost), sum(list_cost), count(*) "
            f"FROM bill_lines b WHERE NOT {OLD_IS_GPU} AND NOT {ROLE_COMMIT} "
            "GROUP BY ALL").fetchall():
        non_gpu.setdefault(str(r[0]), set()).add(tuple(r[1:]))
    assert {c: set(v) for c, v in side.non_gpu.items() if v} == non_gpu
    for got in side.non_gpu.values():  # largest billed first
        amounts = [r[2] for r in got if r[2] is not None]
        assert amounts == sorted(amounts, reverse=True)
    kinds: dict[str, set[tuple[Any, ...]]] = {}
    twice = "false" if cost != "effective" else (
        "(b.line_role = 'commitment purchase' AND b.effective_cost <> 0 AND EXISTS ("
        "SELECT 1 FROM bill_lines u WHERE u.charge_category = 'Usage' AND "
        "u.effective_cost <> 0 AND u.currency = b.currency AND "
        "((u.commitment_id = b.commitment_id) OR COALESCE(list_contains("
        "json_extract_string(u.contract_applied, '$.Elements[*].ContractCommitmentId'), "
        "b.resource_id), false))))")
    for r in con.execute(
            f"SELECT currency, CASE WHEN b.{col} IS NULL THEN 'rejected' "
            f"WHEN {twice} THEN 'rejected_twice' WHEN {ROLE_COMMIT} THEN 'commitment' "
            "WHEN b.charge_category = 'Tax' THEN 'tax' "
            "WHEN b.charge_category = 'Credit' THEN 'credit' ELSE 'non_gpu' END, "
            f"count(*), CAST(COALESCE(sum(b.{col}), 0) * {UNITS_PER_USD} AS HUGEINT) "
            f"FROM bill_lines b WHERE NOT {OLD_IS_GPU} GROUP BY 1, 2").fetchall():
        kinds.setdefault(str(r[0]), set()).add(tuple(r[1:]))
    assert {c: set(v) for c, v in side.bucket_kinds.items() if v} == kinds
    gpu = {str(r[0]): (int(r[1]), int(r[2])) for r in con.execute(
        f"SELECT b.currency, count(*), CAST(COALESCE(sum(b.{col}), 0) * {UNITS_PER_USD} "
        f"AS HUGEINT) FROM bill_lines b WHERE {OLD_IS_GPU} GROUP BY b.currency").fetchall()}
    assert side.bucket_gpu == gpu
    for ccy in side.currencies:
        want = [{"gpu_model": r[0], "instance": r[1], "pricing_category": r[2],
                 "gpu_hours": round(float(r[3] or 0), 6), "billed": str(r[4]),
                 "effective": str(r[5]), "list": str(r[6]), "lines": int(r[7]),
                 "corrections": int(r[8])} for r in con.execute(
            f"SELECT s.gpu_model, s.instance, COALESCE(b.pricing_category, 'Standard'), "
            f"sum(({_HOURS}) * (CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END)), "
            "sum(b.billed_cost), sum(b.effective_cost), sum(b.list_cost), count(*), "
            "count(*) FILTER (WHERE b.charge_class = 'Correction') "
            f"FROM bill_lines b JOIN gpu_skus s ON b.sku_text = s.sku_text "
            f"WHERE b.currency = ? AND {RATE_LINES} GROUP BY ALL ORDER BY 1, 2, 3",
            [ccy]).fetchall()]
        assert side.model_rates[ccy] == want


@st.composite
def periods(draw: Any) -> list[tuple[int, int, int, int, str]]:
    """Lines of two nodes: each node's periods mostly of one length (on the hour or off it,
    where equal lengths still overlap), some of another."""
    length = [draw(st.sampled_from([60, 60, 30, 120, 1440, 0])) for _ in range(2)]
    out = []
    for _ in range(draw(st.integers(1, 14))):
        node = draw(st.integers(0, 1))
        minutes = length[node] if draw(st.integers(0, 3)) else draw(
            st.sampled_from([60, 30, 120, 1440, 0]))
        out.append((node, draw(st.integers(0, 8)), minutes,
                    draw(st.sampled_from([0, 0, 30, 15])),
                    draw(st.sampled_from(["Usage", "Usage", "Credit"]))))
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(lines=periods())
def test_overlaps_equal_the_sort_of_every_period(lines: list[tuple[int, int, int, int, str]],
                                                 tmp_path_factory: Any) -> None:
    rows = []
    for node, h, minutes, off, cat in lines:
        start = T0 + timedelta(hours=h, minutes=off)
        rows.append({"ChargePeriodStart": start.isoformat(),
                     "ChargePeriodEnd": (start + timedelta(minutes=minutes)).isoformat(),
                     "ChargeCategory": cat, "ChargeClass": "", "ResourceId": f"i-{node}",
                     "ServiceName": "EC2", "x_UsageType": "BoxUsage:p5.48xlarge",
                     "PricingCategory": "Standard", "ConsumedQuantity": "1",
                     "ConsumedUnit": "Hours", "BilledCost": "55.04", "EffectiveCost": "55.04",
                     "ListCost": "55.04", "BillingCurrency": "USD"})
    b = open_bill(_write(tmp_path_factory.mktemp("ovl") / "b.csv", rows))
    got = bill_side(b).overlaps
    full = b.con.execute(
        "WITH p AS (SELECT DISTINCT b.currency, b.resource_id, b.sku_text, b.charge_start, "
        f"b.charge_end FROM bill_lines b WHERE {OLD_IS_GPU} AND b.charge_category = 'Usage' "
        "AND b.resource_id IS NOT NULL AND COALESCE(b.charge_class, '') <> 'Correction' AND "
        "b.line_role IS NULL), w AS (SELECT *, max(charge_end) OVER (PARTITION BY currency, "
        "resource_id, sku_text ORDER BY charge_start, charge_end ROWS BETWEEN UNBOUNDED "
        "PRECEDING AND 1 PRECEDING) AS prev_end, lag(charge_start) OVER (PARTITION BY "
        "currency, resource_id, sku_text ORDER BY charge_start, charge_end) AS prev_start "
        "FROM p) SELECT resource_id, prev_start, prev_end, charge_start, charge_end FROM w "
        "WHERE prev_end > charge_start ORDER BY resource_id, charge_start").fetchall()
    res = sorted({r[0] for r in full})
    ex = []
    for rid in res[:5]:
        r = next(x for x in full if x[0] == rid)
        ex.append({"resource_id": rid, "first": f"[{_iso(r[1])} .. {_iso(r[2])})",
                   "second": f"[{_iso(r[3])} .. {_iso(r[4])})"})
    assert got == {"resources": len(res), "periods": len(full), "examples": ex}


def test_decimal_sums_stay_exact_past_float(tmp_path: Path) -> None:
    """Sums of sums in the cube are decimal: a 100M-dollar line beside cents stays exact."""
    base = {"ChargeCategory": "Usage", "ChargeClass": "", "ServiceName": "S3",
            "x_UsageType": "TimedStorage", "PricingCategory": "", "ConsumedQuantity": "1",
            "ConsumedUnit": "GB-Mo", "BillingCurrency": "USD"}
    rows = [{**base, "ChargePeriodStart": (T0 + timedelta(hours=h)).isoformat(),
             "ChargePeriodEnd": (T0 + timedelta(hours=h + 1)).isoformat(),
             "ResourceId": f"b-{h % 3}", "BilledCost": c, "EffectiveCost": c, "ListCost": c}
            for h, c in enumerate(["100000000.01", "0.000000000001", "0.02", "-0.01"] * 3)]
    side = bill_side(open_bill(_write(tmp_path / "b.csv", rows)))
    assert side.totals["USD"] == (Decimal("300000000.060000000003"), 12)
    assert side.non_gpu["USD"] == [("S3", "Usage", Decimal("300000000.060000000003"),
                                    Decimal("300000000.060000000003"),
                                    Decimal("300000000.060000000003"), 12)]
