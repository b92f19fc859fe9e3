"""Issue 27: the join's GPU lines summed per charge period from the bill alone
(``gpu_periods``, made beside classify), and ``gpu_lines`` grouping only the lines that meet
the telemetry's window and taking the periods outside it from those sums. Held to the
single grouping of every GPU line it replaces, over random bills, windows and host maps."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bill_one_scan import _write, bills

from gpuaudit.price.billing import open_bill
from gpuaudit.price.billing.allocate import bill_side
from gpuaudit.price.billing.join import COST_COLUMNS, UNITS_PER_USD
from gpuaudit.price.billing.sql.engines import run_duckdb
from gpuaudit.price.billing.sql.join import inputs_ddl

#: gpu_lines before issue 27's split: one grouping of every GPU line, the window's test per
#: line (DuckDB dialect, no provider split: the random bills have none)
OLD_GPU_LINES = """
SELECT currency, resource_id, host, charge_start, charge_end, pricing_category, instance,
       gpu_model, no_data_reason, split_key, sum(billed_cost) AS billed_cost,
       sum(effective_cost) AS effective_cost, sum(list_cost) AS list_cost,
       sum(billed_gpu_ms) AS billed_gpu_ms,
       CAST(sum({col}) * {units} AS HUGEINT) AS cost_units, count(*) AS lines
FROM (
  SELECT b.currency,
         CASE WHEN b.charge_end <= TIMESTAMPTZ '{ws}' OR b.charge_start >= TIMESTAMPTZ '{we}'
              THEN NULL ELSE b.resource_id END AS resource_id,
         b.charge_start, b.charge_end, b.pricing_category,
         b.billed_cost, b.effective_cost, b.list_cost, s.instance, s.gpu_model,
         CASE WHEN b.charge_end <= TIMESTAMPTZ '{ws}' OR b.charge_start >= TIMESTAMPTZ '{we}'
              THEN NULL ELSE h.host END AS host,
         CASE WHEN b.charge_category <> 'Usage' OR b.billed_cost < 0 THEN 0
              WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('hrs', 'hr', 'hours', 'hour', 'h')
              THEN CAST(round(CAST(b.quantity AS DECIMAL(26,12)) * CAST((CASE WHEN s.per_gpu
                   THEN 1 ELSE s.gpus_per_instance END) * 3600000 AS DECIMAL(12,0))) AS BIGINT)
              WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('seconds', 'second', 's')
              THEN CAST(round(CAST(b.quantity AS DECIMAL(26,12)) * CAST((CASE WHEN s.per_gpu
                   THEN 1 ELSE s.gpus_per_instance END) * 1000 AS DECIMAL(12,0))) AS BIGINT)
              ELSE (epoch_ms(b.charge_end) - epoch_ms(b.charge_start))
                   * (CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END) END
           AS billed_gpu_ms,
         CASE WHEN b.charge_end <= TIMESTAMPTZ '{ws}' OR b.charge_start >= TIMESTAMPTZ '{we}'
              THEN 'outside telemetry'
              WHEN h.host IS NULL THEN 'no telemetry for this node' END AS no_data_reason,
         CAST(NULL AS VARCHAR) AS split_key
  FROM bill_lines b JOIN gpu_skus s ON b.sku_text = s.sku_text
  LEFT JOIN host_map h ON b.resource_id = h.resource_id
  WHERE b.line_role IS NULL OR b.line_role NOT IN ('commitment purchase', 'unused commitment')
) x
GROUP BY ALL"""

WINDOWS = [("2026-10-01T00:00:00Z", "2026-10-01T02:00:00Z"),
           ("2026-10-01T00:30:00Z", "2026-10-01T01:30:00Z"),
           ("2026-10-01T01:00:00Z", "2026-10-02T00:00:00Z"),
           ("2026-09-01T00:00:00Z", "2026-09-02T00:00:00Z")]


def _empty_telemetry_inputs(con: Any) -> None:
    """The join's inputs besides the bill's (``host_map``, ``usage_hours``, ``split_groups``),
    empty, one group key."""
    for ddl in inputs_ddl(1, "duckdb").split(";"):
        if "host_map" in ddl or "usage_hours" in ddl or "split_groups" in ddl:
            con.execute(ddl.replace("CREATE TABLE", "CREATE OR REPLACE TEMP TABLE"))


def _rows(con: Any, sql: str) -> list[tuple[Any, ...]]:
    return sorted(con.execute(sql).fetchall(), key=repr)


@settings(max_examples=80, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=bills(), cost=st.sampled_from(["billed", "effective", "list"]),
       window=st.sampled_from(WINDOWS),
       mapped=st.sets(st.sampled_from(["i-0", "i-1", "i-2"])))
def test_gpu_lines_equal_the_grouping_of_every_line(
        rows: list[dict[str, str]], cost: str, window: tuple[str, str],
        mapped: set[str], tmp_path_factory: Any) -> None:
    b = open_bill(_write(tmp_path_factory.mktemp("periods") / "b.csv", rows))
    bill_side(b, cost=cost)
    con = b.con
    _empty_telemetry_inputs(con)
    con.register("hm", pa.table({"resource_id": sorted(mapped),
                                 "host": [f"node-{r}" for r in sorted(mapped)]}))
    con.execute("INSERT INTO host_map SELECT * FROM hm")
    run_duckdb(con, 1, "allocation", cost, window)
    old = OLD_GPU_LINES.format(col=COST_COLUMNS[cost], units=UNITS_PER_USD,
                               ws=window[0].replace("T", " ").replace("Z", "+00"),
                               we=window[1].replace("T", " ").replace("Z", "+00"))
    assert _rows(con, "SELECT * FROM gpu_lines") == _rows(con, old)
    assert [str(t) for t in con.execute("DESCRIBE gpu_lines").fetchall()] == [
        str(t) for t in con.execute(f"DESCRIBE {old}").fetchall()]



def test_gpu_lines_keep_lines_whose_period_is_null_or_on_the_window_edges() -> None:
    """The window's test in ``gpu_lines`` is two conjuncts of plain comparisons (so a
    Parquet scan skips row groups outside the window); a line whose start or end is null, or
    that ends exactly at the window's start or starts at its end, lands where the single
    grouping (``NOT COALESCE(outside, FALSE)``) puts it: a ``>=`` for ``>`` or a dropped
    ``IS NULL`` fails this."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    for ddl in inputs_ddl(1, "duckdb").split(";"):
        if ddl.strip():
            con.execute(ddl.replace("CREATE TABLE", "CREATE OR REPLACE TEMP TABLE"))
    con.execute("INSERT INTO gpu_skus VALUES ('p4d', 'p4d.24xlarge', 'A100', 8, false)")
    con.execute("INSERT INTO host_map VALUES ('i-0', 'node-0')")
    ws, we = "2026-10-01 00:00:00+00", "2026-10-01 02:00:00+00"
    periods = [("2026-09-30 23:00:00+00", "2026-10-01 00:00:00+00"),  # ends at the start
               ("2026-10-01 02:00:00+00", "2026-10-01 03:00:00+00"),  # starts at the end
               ("2026-10-01 01:00:00+00", "2026-10-01 02:00:00+00"),  # inside
               ("2026-09-30 23:30:00+00", "2026-10-01 00:30:00+00"),  # across the start
               (None, "2026-10-01 01:00:00+00"), (None, "2026-09-30 01:00:00+00"),
               ("2026-10-01 01:00:00+00", None), ("2026-10-01 05:00:00+00", None),
               (None, None)]
    for i, (start, end) in enumerate(periods):
        con.execute(
            "INSERT INTO bill_lines (currency, resource_id, sku_text, charge_category, "
            "charge_start, charge_end, quantity, unit, billed_cost, effective_cost, list_cost) "
            "VALUES ('USD', 'i-0', 'p4d', 'Usage', CAST(? AS TIMESTAMPTZ), "
            "CAST(? AS TIMESTAMPTZ), 1, 'Hrs', ?, ?, ?)",
            [start, end, f"{i + 1}.25", f"{i + 1}.5", f"{i + 2}"])
    run_duckdb(con, 1, "allocation", "billed", ("2026-10-01T00:00:00Z", "2026-10-01T02:00:00Z"))
    old = OLD_GPU_LINES.format(col=COST_COLUMNS["billed"], units=UNITS_PER_USD, ws=ws, we=we)
    got = _rows(con, "SELECT * FROM gpu_lines")
    assert got == _rows(con, old)
    # each line its own group: 4 outside the window, 5 kept with their node (nulls included)
    assert sum(r[1] == "i-0" for r in got) == 5


@settings(max_examples=25, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=bills(), method=st.sampled_from(["allocation", "usage"]),
       window=st.sampled_from(WINDOWS))
def test_weights_streamed_into_alloc_give_the_materialized_results(
        rows: list[dict[str, str]], method: str, window: tuple[str, str],
        tmp_path_factory: Any) -> None:
    """``weights`` is a view DuckDB streams into ``alloc`` (not written out as a table);
    ``alloc`` is row for row what it is over ``weights`` materialized."""
    from gpuaudit.price.billing.sql.engines import STREAMED
    from gpuaudit.price.billing.sql.join import relations

    b = open_bill(_write(tmp_path_factory.mktemp("streamed") / "b.csv", rows))
    bill_side(b, cost="billed")
    con = b.con
    _empty_telemetry_inputs(con)
    con.execute("INSERT INTO host_map VALUES ('i-0', 'node-i-0'), ('i-1', 'node-i-1')")
    con.execute("INSERT INTO usage_hours SELECT 'node-i-0', TIMESTAMPTZ '2026-10-01 00:00:00+00'"
                " + INTERVAL (h) HOUR, h % 2 = 0, 'team-' || (h % 3), 600000 * (h % 4), "
                "300000, 1200000, 60000 * h, 0 FROM range(30) t(h)")
    run_duckdb(con, 1, method, "billed", window)
    assert STREAMED == {"weights"}
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'weights'"
                       ).fetchone() == (1,)
    sql = dict(relations(1, method, "billed", window, "duckdb"))
    con.execute(f"CREATE TEMP TABLE weights_t AS {sql['weights']}")
    alloc_t = sql["alloc"].replace("FROM weights w", "FROM weights_t w")
    assert alloc_t != sql["alloc"]
    assert _rows(con, "SELECT * FROM alloc") == _rows(con, alloc_t)
    assert [str(t) for t in con.execute("DESCRIBE alloc").fetchall()] == [
        str(t) for t in con.execute(f"DESCRIBE {alloc_t}").fetchall()]
