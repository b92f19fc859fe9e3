"""Issue 27, the bill at scale: the hourly equality join equals the range join it replaces,
the hashed duplicate search finds exactly the duplicates the full grouping finds, and the bill
read beside classify still reports a bad bill first."""

from __future__ import annotations

import csv
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.api import bill
from gpuaudit.errors import InputError
from gpuaudit.price.billing import open_bill
from gpuaudit.price.billing.allocate import _duplicates, allocate, bill_side
from gpuaudit.price.billing.readers import CANONICAL

T0 = datetime(2026, 10, 1, tzinfo=timezone.utc)
FIELDS = ["ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "ResourceId",
          "x_UsageType", "ConsumedQuantity", "ConsumedUnit", "BilledCost", "BillingCurrency"]


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    return path


def _line(start: datetime, minutes: int, node: int, cost: str, qty: str = "1") -> dict[str, str]:
    return {"ChargePeriodStart": start.isoformat(),
            "ChargePeriodEnd": (start + timedelta(minutes=minutes)).isoformat(),
            "ChargeCategory": "Usage", "ResourceId": f"i-{node}",
            "x_UsageType": "BoxUsage:p5.48xlarge", "ConsumedQuantity": qty,
            "ConsumedUnit": "Hours", "BilledCost": cost, "BillingCurrency": "USD"}


@st.composite
def mixed_periods(draw: Any) -> tuple[list[dict[str, str]], pa.Table]:
    """Lines of one hour on the hour, half an hour, an hour off the hour, a day; usage hours
    (on the hour, as the input contract says) on two nodes."""
    rows = []
    for _ in range(draw(st.integers(1, 12))):
        node = draw(st.integers(0, 1))
        start = T0 + timedelta(minutes=draw(st.sampled_from([0, 30, 60, 90, 120, 150])))
        minutes = draw(st.sampled_from([60, 60, 30, 120, 1440]))
        cost = str(Decimal(draw(st.integers(1, 10**8))) / 1000)
        rows.append(_line(start, minutes, node, cost))
    tel = [(n, h, team) for n in range(2) for h in range(draw(st.integers(0, 30)))
           for team in ("a", None) if draw(st.booleans())]
    hours = pa.table({
        "host": pa.array([f"i-{n}" for n, _h, _t in tel], pa.string()),
        "period_start": pa.array([T0 + timedelta(hours=h) for _n, h, _t in tel],
                                 pa.timestamp("s", "UTC")),
        "held": pa.array([t is not None for _n, _h, t in tel]),
        "g_0": pa.array([t for _n, _h, t in tel], pa.string()),
        **{c: pa.array([draw(st.integers(0, 3_600_000)) for _ in tel], pa.int64())
           for c in ("idle_ms", "underutilized_ms", "productive_ms", "compute_bound_ms",
                     "unobserved_ms")}})
    return rows, hours


RANGE_MEAS = """
SELECT l.line_id, u.held, u.g_0,
       sum(u.idle_ms) AS idle_ms, sum(u.underutilized_ms) AS underutilized_ms,
       sum(u.productive_ms) AS productive_ms, sum(u.compute_bound_ms) AS compute_bound_ms,
       sum(u.unobserved_ms) AS unobserved_ms
FROM line_groups l JOIN usage_hours u
  ON u.host = l.host AND u.period_start >= l.charge_start AND u.period_start < l.charge_end
GROUP BY l.line_id, u.held, u.g_0"""


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=mixed_periods())
def test_hourly_equality_join_equals_the_range_join(case: Any, tmp_path: Path) -> None:
    rows, hours = case
    b = open_bill(_write(tmp_path / f"b{abs(hash(str(rows))) % 10**9}.csv", rows))
    allocate(b, hours, ["team"], window=(T0, T0 + timedelta(days=2)))
    got = b.con.execute("SELECT * FROM meas ORDER BY ALL").fetchall()
    want = b.con.execute(f"SELECT * FROM ({RANGE_MEAS}) ORDER BY ALL").fetchall()
    assert got == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.sampled_from(
    ["1.00", "1.0", "2.50", "-1.00"]), st.sampled_from(["Usage", "Tax", "Credit"])),
    min_size=1, max_size=14))
def test_hashed_duplicates_equal_the_full_grouping(tmp_path_factory: Any,
                                                    lines: list[tuple[Any, ...]]) -> None:
    rows = []
    for node, h, cost, cat in lines:
        r = _line(T0 + timedelta(hours=h), 60, node, cost)
        r["ChargeCategory"] = cat
        rows.append(r)
    p = _write(tmp_path_factory.mktemp("dup") / "b.csv", rows)
    con = open_bill(p).con
    cols = [c for c, _t in CANONICAL if c not in ("src_file", "src_row")]
    full = con.execute(
        f"SELECT currency, sum(n - 1), sum((n - 1) * billed_cost), count(*) FROM ("
        f"SELECT {', '.join(cols)}, count(*) AS n FROM bill_lines GROUP BY ALL "
        "HAVING count(*) > 1) GROUP BY currency ORDER BY currency").fetchall()
    want = {"lines": int(sum(int(r[1]) for r in full)),
            "groups": int(sum(r[3] for r in full)),
            "amount": {str(r[0]): str(r[2].quantize(Decimal("0.01"))) for r in full}}
    assert _duplicates(con) == want


def test_bill_side_given_or_not_the_same_allocation(tmp_path: Path) -> None:
    rows = [_line(T0 + timedelta(hours=h), 60, h % 2, "55.04") for h in range(6)]
    hours = pa.table({"host": ["i-0", "i-1"], "period_start": pa.array(
        [T0, T0 + timedelta(hours=1)], pa.timestamp("s", "UTC")), "held": [True, False],
        "g_0": ["a", None], "idle_ms": [1000, 2000], "underutilized_ms": [0, 0],
        "productive_ms": [3_000_000, 0], "compute_bound_ms": [0, 0], "unobserved_ms": [0, 0]})
    p = _write(tmp_path / "b.csv", rows)
    a = allocate(open_bill(p), hours, ["team"], window=(T0, T0 + timedelta(hours=3)))
    b0 = open_bill(p)
    b = allocate(b0, hours, ["team"], window=(T0, T0 + timedelta(hours=3)),
                 side=bill_side(b0, cost="billed"))
    assert a.summary == b.summary and a.showback.equals(b.showback)


def test_a_bad_bill_is_still_the_first_error(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.csv", [_line(T0, 60, 0, "twelve dollars")])
    with pytest.raises(InputError) as err:
        bill(bad, telemetry=tmp_path / "missing.parquet")
    assert "bad.csv" in str(err.value.where) and "BilledCost" in str(err.value.where)
