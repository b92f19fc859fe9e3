"""The per-engine rules of the bill's SQL: types, exact integer division, milliseconds between
two timestamps, timestamp literals. Everything else in the query is the subset that DuckDB,
Spark SQL, Trino/Athena and BigQuery read alike (``join.py`` beside this file).

Money is integer units of 1e-12 USD held in a 38-digit decimal (BigQuery: ``BIGNUMERIC``);
no float and no BIGINT anywhere on the money path. ``idiv`` is truncating integer division
(toward zero, as DuckDB's ``//`` on HUGEINT) of a 38-digit ``a`` by a positive ``b``: engines
whose decimal division rounds (Spark to 6 places, Trino to 0) give a quotient within one of
the exact one, which an exact multiply-back then corrects.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DIALECTS", "Dialect"]


@dataclass(frozen=True)
class Dialect:
    name: str
    units: str  # exact integer units (38 digits)
    money: str  # DECIMAL(38,12)
    qty: str  # quantities (hours, seconds): exact decimal, narrow enough that a product
    # with a 12-digit integer keeps all 12 places (Spark cuts a product past 38 digits to 6)
    factor: str  # a whole-number factor (GPUs x ms per unit): DECIMAL(12,0)
    string: str
    bigint: str
    boolean: str
    timestamp: str

    def idiv(self, a: str, b: str) -> str:
        """``trunc(a / b)`` exactly, for ``b > 0``."""
        if self.name == "duckdb":
            return f"(CAST({a} AS HUGEINT) // {b})"
        q0 = (f"CAST(round({a} / {b}) AS {self.units})" if self.name == "bigquery"
              else f"CAST({a} / {b} AS {self.units})")
        r = f"({a} - {q0} * {b})"
        return (f"({q0} + CASE WHEN {a} >= 0 AND {r} < 0 THEN -1 "
                f"WHEN {a} >= 0 AND {r} >= {b} THEN 1 "
                f"WHEN {a} < 0 AND {r} > 0 THEN 1 "
                f"WHEN {a} < 0 AND {r} <= -{b} THEN -1 ELSE 0 END)")

    def ms_between(self, start: str, end: str) -> str:
        """Whole milliseconds from ``start`` to ``end`` (timestamps with a time zone)."""
        if self.name == "duckdb":
            return f"(epoch_ms({end}) - epoch_ms({start}))"
        if self.name == "spark":
            return f"(unix_millis({end}) - unix_millis({start}))"
        if self.name == "trino":
            return f"date_diff('millisecond', {start}, {end})"
        return f"TIMESTAMP_DIFF({end}, {start}, MILLISECOND)"

    def ts(self, iso: str) -> str:
        """A UTC instant literal from ``YYYY-MM-DDTHH:MM:SS[.f]Z``."""
        plain = iso.replace("T", " ").rstrip("Z")
        if self.name == "duckdb":
            return f"TIMESTAMPTZ '{plain}+00'"
        if self.name == "spark":
            return f"TIMESTAMP '{plain}+00:00'"
        if self.name == "trino":
            return f"TIMESTAMP '{plain} UTC'"
        return f"TIMESTAMP '{plain}+00'"


DIALECTS: dict[str, Dialect] = {
    "duckdb": Dialect("duckdb", units="HUGEINT", money="DECIMAL(38,12)",
                      qty="DECIMAL(26,12)", factor="DECIMAL(12,0)", string="VARCHAR", bigint="BIGINT",
                      boolean="BOOLEAN", timestamp="TIMESTAMPTZ"),
    "spark": Dialect("spark", units="DECIMAL(38,0)", money="DECIMAL(38,12)",
                     qty="DECIMAL(26,12)", factor="DECIMAL(12,0)", string="STRING", bigint="BIGINT",
                     boolean="BOOLEAN", timestamp="TIMESTAMP"),
    "trino": Dialect("trino", units="DECIMAL(38,0)", money="DECIMAL(38,12)",
                     qty="DECIMAL(26,12)", factor="DECIMAL(12,0)", string="VARCHAR", bigint="BIGINT",
                     boolean="BOOLEAN", timestamp="TIMESTAMP(6) WITH TIME ZONE"),
    "bigquery": Dialect("bigquery", units="BIGNUMERIC", money="BIGNUMERIC",
                        qty="BIGNUMERIC", factor="BIGNUMERIC", string="STRING", bigint="INT64",
                        boolean="BOOL", timestamp="TIMESTAMP"),
}
