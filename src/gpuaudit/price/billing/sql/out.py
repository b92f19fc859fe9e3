"""What ``gpuaudit bill --sql-out DIR --dialect D`` writes for a data team: the query in D
(``join.sql``), the DDL of the five input relations it reads (``inputs.sql``) and a README of
their contract (``README.md``)."""

from __future__ import annotations

from pathlib import Path

from gpuaudit.price.billing.sql.dialects import DIALECTS
from gpuaudit.price.billing.sql.join import inputs_ddl, script

__all__ = ["readme", "write_sql_dir"]

_RUN = {
    "duckdb": "duckdb  then, for each input, CREATE VIEW bill_lines AS SELECT * FROM "
              "'bill_lines.parquet'; ... and .read join.sql",
    "spark": "spark-sql -f join.sql  (after creating the five inputs as tables or views, "
             "e.g. CREATE TEMPORARY VIEW bill_lines USING parquet OPTIONS (path '...'));  "
             "or gpuaudit bill --engine spark, which does both on the active session",
    "trino": "trino --catalog <catalog> --schema <schema> -f join.sql  (Athena: run each "
             "statement in the console or with aws athena start-query-execution)",
    "bigquery": "bq query --use_legacy_sql=false --dataset_id=<project>:<dataset> < join.sql"
                "  (tables are created in that default dataset)",
}


def readme(n_keys: int, method: str, cost: str, window: tuple[str, str] | None,
           dialect: str) -> str:
    keys = ", ".join(f"g_{i}" for i in range(n_keys)) or "(none)"
    win = f"{window[0]} .. {window[1]}" if window else "(none: every period is outside it)"
    return f"""# gpuaudit bill: the join, for {dialect}

Written by `gpuaudit bill --sql-out DIR --dialect {dialect}` (method `{method}`, cost basis
`{cost}`, telemetry window {win}; group keys {keys}).

Files:
- `inputs.sql`: the five input relations the query reads, as `CREATE TABLE` statements (create
  them, or views with these names and columns over your own tables);
- `join.sql`: the query, one `CREATE TABLE name AS SELECT` per derived relation, in order;
  the results are `gpu_lines`, `alloc` and `period_totals`;
- `bill_lines.parquet`, `gpu_skus.parquet`, `host_map.parquet`, `usage_hours.parquet`,
  `split_groups.parquet`: the inputs this run computed, to load as the tables of `inputs.sql`.

## Input contract

- `bill_lines`: one row per bill line. `charge_start`/`charge_end`: the charge period, UTC
  instants, `charge_start < charge_end`; `billed_cost`, `effective_cost`, `list_cost`: exact
  decimals (scale 12; never float), `effective_cost`/`list_cost` defaulting to `billed_cost`;
  `charge_category`: `Usage`, `Credit`, `Purchase`, `Tax`, ... (only `Usage` lines with a
  non-negative cost cover GPU time; every line's cost is split); `quantity` with `unit` (`h`,
  `hrs`, `hours`, `s`, `seconds`; anything else: the charge period's length counts);
  `sku_text`: the text matched against `gpu_skus.sku_text`; `resource_id`: matched against
  `host_map.resource_id`. A FOCUS table maps as `ChargePeriodStart AS charge_start`,
  `BilledCost AS billed_cost`, ... (gpuaudit's readers.py lists every column it reads).
- `gpu_skus`: the GPU SKUs gpuaudit found in its catalog for your bill's SKU texts: the instance,
  GPU model, GPUs per instance and whether the SKU prices one GPU (`per_gpu`).
- `host_map`: which telemetry host each GPU resource is.
- `usage_hours`: measured GPU time per host and hour (`period_start`, a UTC instant on the
  hour), whether a pod held it (`held`) and by which group (`g_0` ..), in whole
  milliseconds per phase (`idle_ms`, `underutilized_ms`, `productive_ms`, `compute_bound_ms`)
  and `unobserved_ms` (no readings).
- `split_groups`: the targets of the lines the provider split itself (FOCUS 1.3
  `AllocatedTags`, `AllocatedResourceName`/`Id`; `bill_lines.line_role = 'provider split'`),
  keyed by `split_key` = `COALESCE(allocated_tags, '') || '|' || COALESCE(
  allocated_resource_name, allocated_resource_id, '')`: the group each goes to (`kind`
  `team`, or `unallocated` for the origin charge's unallocated portion); a credit, refund or
  adjustment on the same resource and charge period follows that split. Lines whose
  `line_role` is `commitment purchase` or `unused commitment` are not GPU time: the query
  leaves them out (gpuaudit puts them in the `commitment` bucket).

## Results

- `alloc(currency, charge_start, charge_end, kind, reason, g_.., phase, units, gpu_ms)`:
  each charge period's cost split to teams (`kind = 'team'`), `idle` and `unallocated`, in
  integer units of 1e-12 of the currency (exact; truncated toward zero, so each period's
  units sum to at most its total, short by less than one unit per weight);
- `period_totals(currency, charge_start, charge_end, units, billed_gpu_ms)`: each period's
  exact total;
- `gpu_lines`: the GPU lines summed per resource and period, with why a line had nothing to
  split it by (`no_data_reason`).

gpuaudit rounds to cents (largest remainder per period, then per line) on these small results;
`gpuaudit bill --engine spark` runs this query on Spark and does that rounding itself.

## Run

    {_RUN[dialect]}
"""


def write_sql_dir(out: Path, n_keys: int, method: str, cost: str,
                  window: tuple[str, str] | None, dialect: str) -> None:
    if dialect not in DIALECTS:
        raise ValueError(dialect)
    (out / "join.sql").write_text(script(n_keys, method, cost, window, dialect),
                                  encoding="utf-8")
    (out / "inputs.sql").write_text(inputs_ddl(n_keys, dialect), encoding="utf-8")
    (out / "README.md").write_text(readme(n_keys, method, cost, window, dialect),
                                   encoding="utf-8")
