"""The join of GPU bill lines to measured GPU time: defined once in ``sql/join.py`` (with
its per-engine rules in ``sql/dialects.py``); this module keeps the names older callers use."""

from __future__ import annotations

from collections.abc import Sequence

from gpuaudit.price.billing.sql.join import (
    COST_COLUMNS,
    METHODS,
    PHASE_COLS,
    UNITS_PER_USD,
    script,
)

__all__ = ["COST_COLUMNS", "METHODS", "PHASE_COLS", "UNITS_PER_USD", "allocation_sql",
           "group_cols"]


def allocation_sql(n_keys: int, method: str, cost: str = "billed",
                   window: tuple[str, str] | None = None, dialect: str = "duckdb") -> str:
    """The query as one script (DuckDB: temp tables ``gpu_lines``, ``alloc``,
    ``period_totals`` and the intermediates)."""
    return script(n_keys, method, cost, window, dialect)


def group_cols(keys: Sequence[str]) -> list[str]:
    return [f"g_{i}" for i in range(len(keys))]
