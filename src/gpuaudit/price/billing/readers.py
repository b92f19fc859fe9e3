"""Read a cloud bill into one canonical DuckDB relation, ``bill_lines``.

Formats (detected by their columns, or forced with ``fmt``):

- ``focus``: FinOps FOCUS 1.0, 1.1 and 1.2 (``BilledCost``, ``ChargePeriodStart``, ...);
- ``cur``: AWS Cost and Usage Report, legacy (``lineItem/UsageType``) or CUR 2.0
  (``line_item_usage_type``); ``cur`` accepts both and tells them apart by column names;
- ``gcp``: the Google Cloud billing export (``usage_start_time``, ``cost``, ``sku.description``,
  flattened in CSV or as structs in Parquet).

Files are CSV, CSV.gz or Parquet, one file or a folder of them (searched recursively, so a
Hive-partitioned export such as ``year=2026/month=10/part-0.parquet`` reads as one bill).
Real exports break the spec (the FOCUS sample data: dates without ``T``/``Z``, literal
``NULL``); those are tolerated. A required column that is missing, or a value that is not a
number or a timestamp, raises :class:`~gpuaudit.errors.InputError` naming the file, the
column and the row. Money is ``DECIMAL(38,12)`` in DuckDB and ``Decimal`` in Python.

The canonical columns (``CANONICAL``) are what the join (``billing/join.py``) reads; the same
view can be written as SQL against Athena, Trino or BigQuery (docs/billing.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuaudit.errors import InputError

__all__ = ["BILL_FORMATS", "CANONICAL", "Bill", "connect_duckdb", "detect_format",
           "duckdb_memory_limit", "open_bill"]

#: Input formats of ``gpuaudit bill --format``: disjoint from the output formats.
BILL_FORMATS: tuple[str, ...] = ("focus", "cur", "gcp")

MONEY = "DECIMAL(38,12)"

#: The canonical view's columns, in order, with their DuckDB types.
CANONICAL: tuple[tuple[str, str], ...] = (
    ("src_file", "VARCHAR"),
    ("src_row", "BIGINT"),
    ("provider", "VARCHAR"),
    ("charge_start", "TIMESTAMPTZ"),
    ("charge_end", "TIMESTAMPTZ"),
    ("charge_category", "VARCHAR"),
    ("pricing_category", "VARCHAR"),
    ("service", "VARCHAR"),
    ("resource_id", "VARCHAR"),
    ("resource_name", "VARCHAR"),
    ("sku_text", "VARCHAR"),
    ("quantity", "DOUBLE"),
    ("unit", "VARCHAR"),
    ("billed_cost", MONEY),
    ("effective_cost", MONEY),
    ("list_cost", MONEY),
    ("currency", "VARCHAR"),
    ("charge_class", "VARCHAR"),
    ("commitment_id", "VARCHAR"),
    ("pricing_currency", "VARCHAR"),
    # FOCUS 1.2+: Used / Unused (an unused commitment's line carries the commitment's id)
    ("commitment_status", "VARCHAR"),
    # FOCUS 1.3: the provider's own split (data generator-calculated split cost allocation)
    ("allocated_method_id", "VARCHAR"),
    ("allocated_resource_id", "VARCHAR"),
    ("allocated_resource_name", "VARCHAR"),
    ("allocated_tags", "VARCHAR"),
    ("allocated_details", "VARCHAR"),
    # FOCUS 1.3: the contract commitments a charge is applied to (JSON, ``Elements``)
    ("contract_applied", "VARCHAR"),
    # what the line is for the split (derived): NULL (a line like any), ``commitment
    # purchase``, ``unused commitment``, ``provider split``
    ("line_role", "VARCHAR"),
)

_NULLS = ("NULL", "null", "Null", "")


@dataclass(frozen=True)
class _Field:
    """One canonical column: where each format finds it and how it is typed.

    ``sources``: candidate source columns, first present wins (``coalesce`` over those
    present when ``coalesce``); ``kind``: text, money, number or time.
    """

    name: str
    kind: str
    sources: tuple[str, ...]
    required: bool = False
    coalesce: bool = False
    concat: bool = False


def _f(name: str, kind: str, *sources: str, required: bool = False, coalesce: bool = False,
       concat: bool = False) -> _Field:
    return _Field(name, kind, tuple(sources), required, coalesce, concat)


# FOCUS names (1.0 -> 1.2: ProviderName became ServiceProviderName; both read).
_FOCUS = (
    _f("provider", "text", "ServiceProviderName", "ProviderName", "InvoiceIssuerName"),
    _f("charge_start", "time", "ChargePeriodStart", required=True),
    _f("charge_end", "time", "ChargePeriodEnd", required=True),
    _f("charge_category", "text", "ChargeCategory"),
    _f("pricing_category", "text", "PricingCategory"),
    _f("service", "text", "ServiceName"),
    _f("resource_id", "text", "ResourceId"),
    _f("resource_name", "text", "ResourceName"),
    _f("sku_text", "text", "x_InstanceType", "x_UsageType", "SkuId", "SkuPriceId",
       "ResourceType", "SkuMeter", "x_SkuMeterName", "ChargeDescription", concat=True),
    _f("quantity", "number", "ConsumedQuantity", "PricingQuantity"),
    _f("unit", "text", "ConsumedUnit", "PricingUnit"),
    _f("billed_cost", "money", "BilledCost", required=True),
    _f("effective_cost", "money", "EffectiveCost"),
    _f("list_cost", "money", "ListCost"),
    _f("currency", "text", "BillingCurrency"),
    _f("charge_class", "text", "ChargeClass"),
    _f("commitment_id", "text", "CommitmentDiscountId"),
    _f("pricing_currency", "text", "PricingCurrency"),
    _f("commitment_status", "text", "CommitmentDiscountStatus"),
    _f("allocated_method_id", "text", "AllocatedMethodId"),
    _f("allocated_resource_id", "text", "AllocatedResourceId"),
    _f("allocated_resource_name", "text", "AllocatedResourceName"),
    _f("allocated_tags", "text", "AllocatedTags"),
    _f("allocated_details", "text", "AllocatedMethodDetails"),
    _f("contract_applied", "text", "ContractApplied"),
)

#: FOCUS 1.3 columns holding a JSON object (checked before the view is used)
_JSON_COLUMNS = (("allocated_tags", "AllocatedTags"),
                 ("allocated_details", "AllocatedMethodDetails"),
                 ("contract_applied", "ContractApplied"))

_CUR_LEGACY = (
    _f("provider", "text", "bill/BillingEntity"),
    _f("charge_start", "time", "lineItem/UsageStartDate", required=True),
    _f("charge_end", "time", "lineItem/UsageEndDate", required=True),
    _f("charge_category", "text", "lineItem/LineItemType"),
    _f("pricing_category", "text", "pricing/term"),
    _f("service", "text", "product/ProductName", "lineItem/ProductCode"),
    _f("resource_id", "text", "lineItem/ResourceId"),
    _f("resource_name", "text", "resourceTags/user:Name", "resourceTags/user:node",
       "resourceTags/user:kubernetes.io/hostname"),
    _f("sku_text", "text", "product/instanceType", "lineItem/UsageType",
       "lineItem/LineItemDescription", concat=True),
    _f("quantity", "number", "lineItem/UsageAmount"),
    _f("unit", "text", "pricing/unit"),
    _f("billed_cost", "money", "lineItem/NetUnblendedCost", "lineItem/UnblendedCost",
       required=True, coalesce=True),
    _f("_sp", "money", "savingsPlan/SavingsPlanEffectiveCost"),
    _f("_ri", "money", "reservation/EffectiveCost"),
    _f("list_cost", "money", "pricing/publicOnDemandCost"),
    _f("currency", "text", "lineItem/CurrencyCode"),
    _f("commitment_id", "text", "reservation/ReservationARN", "savingsPlan/SavingsPlanARN",
       coalesce=True),
    _f("_ri_unused_upfront", "money", "reservation/UnusedAmortizedUpfrontFeeForBillingPeriod"),
    _f("_ri_unused_recurring", "money", "reservation/UnusedRecurringFee"),
    _f("_sp_total", "money", "savingsPlan/TotalCommitmentToDate"),
    _f("_sp_used", "money", "savingsPlan/UsedCommitment"),
)

_CUR2 = (
    _f("provider", "text", "bill_billing_entity"),
    _f("charge_start", "time", "line_item_usage_start_date", required=True),
    _f("charge_end", "time", "line_item_usage_end_date", required=True),
    _f("charge_category", "text", "line_item_line_item_type"),
    _f("pricing_category", "text", "pricing_term"),
    _f("service", "text", "product_product_name", "line_item_product_code"),
    _f("resource_id", "text", "line_item_resource_id"),
    _f("resource_name", "text", "resource_tags_user_name", "resource_tags_user_node"),
    _f("sku_text", "text", "product_instance_type", "line_item_usage_type",
       "line_item_line_item_description", concat=True),
    _f("quantity", "number", "line_item_usage_amount"),
    _f("unit", "text", "pricing_unit"),
    _f("billed_cost", "money", "line_item_net_unblended_cost", "line_item_unblended_cost",
       required=True, coalesce=True),
    _f("_sp", "money", "savings_plan_savings_plan_effective_cost"),
    _f("_ri", "money", "reservation_effective_cost"),
    _f("list_cost", "money", "pricing_public_on_demand_cost"),
    _f("currency", "text", "line_item_currency_code"),
    _f("commitment_id", "text", "reservation_reservation_a_r_n",
       "savings_plan_savings_plan_a_r_n", coalesce=True),
    _f("_ri_unused_upfront", "money",
       "reservation_unused_amortized_upfront_fee_for_billing_period"),
    _f("_ri_unused_recurring", "money", "reservation_unused_recurring_fee"),
    _f("_sp_total", "money", "savings_plan_total_commitment_to_date"),
    _f("_sp_used", "money", "savings_plan_used_commitment"),
)

_GCP = (
    _f("charge_start", "time", "usage_start_time", required=True),
    _f("charge_end", "time", "usage_end_time", required=True),
    _f("charge_category", "text", "cost_type"),
    _f("service", "text", "service.description"),
    _f("resource_id", "text", "resource.global_name", "resource.name"),
    _f("resource_name", "text", "resource.name"),
    _f("sku_text", "text", "system_labels.compute.googleapis.com/machine_spec",
       "sku.description", concat=True),
    _f("quantity", "number", "usage.amount_in_pricing_units", "usage.amount"),
    _f("unit", "text", "usage.pricing_unit", "usage.unit"),
    _f("billed_cost", "money", "cost", required=True),
    _f("list_cost", "money", "cost_at_list"),
    _f("currency", "text", "currency", required=True),
)

_MARKERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("focus", "FOCUS", ("BilledCost", "ChargePeriodStart")),
    ("cur", "AWS CUR (legacy)", ("lineItem/UsageStartDate", "lineItem/UnblendedCost")),
    ("cur", "AWS CUR 2.0", ("line_item_usage_start_date", "line_item_unblended_cost")),
    ("gcp", "GCP billing export", ("usage_start_time", "cost")),
)

_FIELDS = {"FOCUS": _FOCUS, "AWS CUR (legacy)": _CUR_LEGACY, "AWS CUR 2.0": _CUR2,
           "GCP billing export": _GCP}


@dataclass
class Bill:
    """An opened bill: a DuckDB connection holding the view ``bill_lines``.

    ``dialect`` is the exact format found (e.g. ``AWS CUR 2.0``, ``FOCUS 1.2``);
    ``notes`` say what was assumed (a missing optional column, a currency assumed USD).
    """

    con: Any
    files: tuple[str, ...]
    fmt: str
    dialect: str
    notes: list[str] = field(default_factory=list)
    columns: tuple[str, ...] = ()

    @property
    def origin(self) -> str:
        return self.files[0] if len(self.files) == 1 else \
            f"{len(self.files)} files under {Path(self.files[0]).parent}"


def _files(path: str | Path | Sequence[str | Path]) -> list[Path]:
    paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [Path(path)]  # type: ignore[arg-type]
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and _kind(q) is not None)
            if not found:
                raise InputError("no bill files (.csv, .csv.gz, .parquet) in this folder",
                                 where=str(p), fix="point at a FOCUS/CUR/GCP export folder")
            out.extend(found)
        elif p.is_file():
            if _kind(p) is None:
                raise InputError("not a bill file: expected .csv, .csv.gz or .parquet",
                                 where=str(p), fix="export the bill as CSV or Parquet")
            out.append(p)
        else:
            raise InputError("bill file not found", where=str(p),
                             fix="give an existing file or folder")
    return out


def _kind(p: Path) -> str | None:
    name = p.name.lower()
    if name.endswith((".csv", ".csv.gz", ".csv.zst")):
        return "csv"
    if name.endswith((".parquet", ".parq", ".snappy.parquet")):
        return "parquet"
    return None


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _raw_scan(files: Sequence[Path], kind: str) -> str:
    lst = "[" + ", ".join(_sql_str(str(f)) for f in files) + "]"
    if kind == "csv":
        nulls = "[" + ", ".join(_sql_str(n) for n in _NULLS) + "]"
        return (f"read_csv({lst}, header=true, all_varchar=true, union_by_name=true, "
                f"filename=true, nullstr={nulls}, quote='\"', escape='\"')")
    return f"read_parquet({lst}, union_by_name=true, filename=true, file_row_number=true, " \
           "hive_partitioning=false)"


def detect_format(columns: Sequence[str]) -> tuple[str, str] | None:
    """``(fmt, dialect)`` from a bill's column names, or None when nothing matches."""
    cols = set(columns)
    flat = cols | {c.split(".")[0] for c in cols}
    for fmt, dialect, needed in _MARKERS:
        if all(n in flat or n in cols for n in needed):
            if dialect == "FOCUS":
                return fmt, f"FOCUS {_focus_version(cols)}"
            return fmt, dialect
    return None


def _focus_version(cols: set[str]) -> str:
    if {"AllocatedMethodId", "AllocatedResourceId", "ContractApplied"} & cols:
        return "1.3"
    if {"ServiceProviderName", "InvoiceId", "PricingCurrency"} & cols:
        return "1.2"
    if {"CapacityReservationId", "ServiceSubcategory", "SkuMeter"} & cols:
        return "1.1"
    return "1.0"


def duckdb_memory_limit(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """The bytes DuckDB may hold for a bill: 80 % of what the machine has available now
    (``MemAvailable``), at least 1 GiB; None where the system does not say (DuckDB's own
    default then: 80 % of the RAM installed, whatever other processes hold; beside other
    work a 100M-line bill's join was killed by the OOM killer that way, docs/benchmarks.md).
    Past the limit DuckDB spills to its temporary directory instead of failing."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return max(1 << 30, int(line.split()[1]) * 1024 * 8 // 10)
    except (OSError, ValueError, IndexError):
        return None
    return None


def connect_duckdb(memory_limit: int | str | None = None) -> Any:
    """A DuckDB connection for the bill holding at most ``memory_limit`` (bytes, or a size
    such as ``"4GB"``), else :func:`duckdb_memory_limit`."""
    import duckdb

    from gpuaudit.limits import parse_memory_limit

    limit = duckdb_memory_limit() if memory_limit is None \
        else parse_memory_limit(memory_limit, "memory limit")
    if limit is None:
        return duckdb.connect()
    return duckdb.connect(config={"memory_limit": f"{limit // 1024}KiB"})


def open_bill(path: str | Path | Sequence[str | Path], *, fmt: str | None = None,
              con: Any = None, memory_limit: int | str | None = None) -> Bill:
    """Open a bill (a file or a folder) and create the ``bill_lines`` view on ``con``.

    ``fmt`` forces ``focus``, ``cur`` or ``gcp``; otherwise the columns decide. Every money,
    number and time value is checked before the view is used: the first bad one raises
    :class:`InputError` naming file, column and row. Without ``con``, a new DuckDB
    connection holds at most ``memory_limit`` (default: :func:`duckdb_memory_limit`).
    """
    import duckdb

    if fmt is not None and fmt not in BILL_FORMATS:
        raise InputError(f"unknown bill format {fmt!r}",
                         fix=f"use one of {', '.join(BILL_FORMATS)} (or leave it out to detect)")
    files = _files(path)
    kinds = {_kind(f) for f in files}
    if len(kinds) > 1:
        raise InputError("the folder mixes CSV and Parquet bill files",
                         where=str(files[0].parent), fix="give one format per run")
    kind = kinds.pop() or "csv"
    con = con if con is not None else connect_duckdb(memory_limit)
    con.execute("SET TimeZone='UTC'")
    con.execute("SET enable_progress_bar = false")  # DuckDB would draw it on stdout
    scan = _raw_scan(files, kind)
    try:
        con.execute(f"CREATE OR REPLACE TEMP VIEW bill_raw AS SELECT * FROM {scan}")
        desc = con.execute("DESCRIBE bill_raw").fetchall()
    except duckdb.Error as exc:
        raise InputError(f"cannot read the bill: {str(exc).splitlines()[0]}",
                         where=str(files[0]),
                         fix="give a CSV (optionally .gz) or Parquet bill export") from None
    types = {str(r[0]): str(r[1]) for r in desc}
    columns = _flat_columns(types)
    found = detect_format(list(columns))
    if found is None:
        raise InputError(
            "cannot tell the bill's format from its columns (" + ", ".join(list(columns)[:8])
            + (", ..." if len(columns) > 8 else "") + ")", where=str(files[0]),
            fix="give a FOCUS (BilledCost, ChargePeriodStart), AWS CUR (lineItem/UsageType or "
            "line_item_usage_type) or GCP billing export (usage_start_time, cost)")
    got_fmt, dialect = found
    if fmt is not None and fmt != got_fmt:
        # forced: read with the forced format's columns when they are there
        alt = [d for f_, d, need in _MARKERS if f_ == fmt
               and all(n in columns for n in need)]
        if not alt:
            raise InputError(
                f"--format {fmt} was given but the columns are those of {dialect}",
                where=str(files[0]), fix=f"drop --format {fmt} (the format is detected) or "
                "give the right file")
        dialect = alt[0]
        got_fmt = fmt
    bill = Bill(con=con, files=tuple(str(f) for f in files), fmt=got_fmt, dialect=dialect,
                columns=tuple(columns))
    spec = _FIELDS[dialect.split(" 1.")[0] if dialect.startswith("FOCUS") else dialect]
    _check_types(bill, spec, types)
    _build_view(bill, spec, columns, kind, types)
    _check_lines(bill)
    return bill


def _check_lines(bill: Bill) -> None:
    """What no bill may hold, found before the join: no lines at all, a charge period
    that ends before it starts, a currency that is not an ISO 4217 code in use."""
    from gpuaudit.price.billing.currency import known_currency

    con = bill.con
    n = con.execute("SELECT count(*) FROM bill_lines").fetchone()[0]
    if not n:
        raise InputError("the bill has no lines (a header only)", where=bill.origin,
                         fix="give a bill export with its lines; an empty month has nothing "
                         "to split")
    bad = con.execute(
        "SELECT src_file, src_row, charge_start, charge_end FROM bill_lines "
        "WHERE charge_end < charge_start ORDER BY src_file, src_row LIMIT 1").fetchone()
    if bad is not None:
        raise InputError(
            f"charge period ends before it starts ({bad[3]} < {bad[2]})",
            where=f"{bad[0]}, row {bad[1]}, column ChargePeriodEnd",
            fix="swap ChargePeriodStart and ChargePeriodEnd, or export the bill again")
    for col in ("currency", "pricing_currency"):
        for code, f, r in con.execute(
                f"SELECT {col}, any_value(src_file), min(src_row) FROM bill_lines "
                f"WHERE {col} IS NOT NULL GROUP BY 1 ORDER BY 1").fetchall():
            if not known_currency(code):
                name = "BillingCurrency" if col == "currency" else "PricingCurrency"
                raise InputError(
                    f"currency {code!r} is not an ISO 4217 code in use",
                    where=f"{f}, row {r}, column {name}",
                    fix="bills carry three-letter ISO 4217 codes (USD, EUR, JPY)")
    k = con.execute("SELECT count(*) FROM bill_lines WHERE line_role = 'provider split'"
                    ).fetchone()[0]
    if k:
        bill.notes.append(
            f"{k} line(s) carry the provider's own split (FOCUS 1.3 Allocated* columns): "
            "each goes to what it names (AllocatedTags, else AllocatedResourceName or "
            "AllocatedResourceId), not split again over the parent resource's measured time; "
            "a split line naming nothing is the origin charge's unallocated portion")
    for billed, priced, k in con.execute(
            "SELECT currency, pricing_currency, count(*) FROM bill_lines WHERE "
            "pricing_currency IS NOT NULL AND pricing_currency <> currency GROUP BY ALL "
            "ORDER BY 1, 2").fetchall():
        bill.notes.append(f"{k} line(s) priced in {priced} and billed in {billed}: amounts are "
                          f"read in the billing currency {billed} (BilledCost, EffectiveCost, "
                          "ListCost); the PricingCurrency* columns are not summed")


def _flat_columns(types: dict[str, str]) -> dict[str, str]:
    """Column name -> SQL expression; struct fields of Parquet exports (GCP's
    ``sku STRUCT(description ...)``) appear as ``sku.description``."""
    out: dict[str, str] = {}
    for name, typ in types.items():
        if name in ("filename", "file_row_number"):
            continue
        out[name] = _q(name)
        if typ.startswith("STRUCT("):
            for sub in _struct_fields(typ):
                out.setdefault(f"{name}.{sub}", f"{_q(name)}.{_q(sub)}")
    return out


def _struct_fields(typ: str) -> list[str]:
    inner = typ[len("STRUCT("):-1]
    names, depth, cur = [], 0, ""
    for ch in inner:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            names.append(cur.strip().split(" ")[0].strip('"'))
            cur = ""
        else:
            cur += ch
    if cur.strip():
        names.append(cur.strip().split(" ")[0].strip('"'))
    return names


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _typed(expr: str, kind: str) -> str:
    if kind == "money":
        return f"TRY_CAST({expr} AS {MONEY})"
    if kind == "number":
        return f"TRY_CAST({expr} AS DOUBLE)"
    if kind == "time":
        return f"TRY_CAST({expr} AS TIMESTAMPTZ)"
    return f"NULLIF(TRIM(CAST({expr} AS VARCHAR)), '')"


def _build_view(bill: Bill, spec: Sequence[_Field], columns: dict[str, str], kind: str,
                types: Mapping[str, str] | None = None) -> None:
    con = bill.con
    exprs: dict[str, str] = {}
    checks: list[tuple[str, str, str]] = []  # (column name, raw expr, kind)
    for fld in spec:
        present = [s for s in fld.sources if s in columns]
        if not present:
            if fld.required:
                raise InputError(
                    f"required column {fld.sources[0]!r} is missing ({bill.dialect})",
                    where=f"{bill.files[0]}, column {fld.sources[0]}",
                    fix="export the bill with all of its standard columns")
            exprs[fld.name] = "NULL"
            if fld.name == "list_cost" or (fld.name == "effective_cost"
                                           and bill.fmt == "focus"):
                bill.notes.append(f"no {fld.sources[0]} column: {fld.name.replace('_', ' ')} "
                                  "taken as billed cost")
            continue
        if fld.concat:
            parts = [_typed(columns[s], "text") for s in present]
            exprs[fld.name] = "NULLIF(CONCAT_WS(' | ', " + ", ".join(parts) + "), '')"
            continue
        use = present if fld.coalesce else present[:1]
        for s in use:
            if fld.kind != "text" and not _always_parses((types or {}).get(s), fld.kind):
                checks.append((s, columns[s], fld.kind))
        typed = [_typed(columns[s], fld.kind) for s in use]
        exprs[fld.name] = typed[0] if len(typed) == 1 else "COALESCE(" + ", ".join(typed) + ")"
    if exprs["currency"] == "NULL":
        exprs["currency"] = "'USD'"
        bill.notes.append("no currency column: amounts assumed USD")
    exprs["effective_cost"] = f"COALESCE({exprs.get('effective_cost', 'NULL')}, " \
        f"{exprs['billed_cost']})"
    exprs["list_cost"] = f"COALESCE({exprs['list_cost']}, {exprs['billed_cost']})"
    if bill.dialect.startswith("AWS CUR"):
        exprs["charge_category"] = _cur_charge_category(exprs["charge_category"])
        lit = next((columns[c] for c in ("lineItem/LineItemType", "line_item_line_item_type")
                    if c in columns), "NULL")
        exprs["pricing_category"] = _cur_pricing_category(exprs["pricing_category"], lit,
                                                          exprs["sku_text"])
        sp, ri = (exprs.pop("_sp", "NULL"), exprs.pop("_ri", "NULL"))
        # AWS's amortised cost of a commitment's fee is its unused part: the used part is
        # in the covered usage's effective cost (reservation/EffectiveCost,
        # savingsPlan/SavingsPlanEffectiveCost), so the fee never counts twice
        ri_unused = " + ".join(f"COALESCE({exprs.pop(k)}, 0)" for k in (
            "_ri_unused_upfront", "_ri_unused_recurring") if exprs.get(k, "NULL") != "NULL")
        sp_t, sp_u = exprs.pop("_sp_total", "NULL"), exprs.pop("_sp_used", "NULL")
        sp_unused = (f"greatest(COALESCE({sp_t}, 0) - COALESCE({sp_u}, 0), 0)"
                     if sp_t != "NULL" and sp_u != "NULL" else "")
        for k in ("_ri_unused_upfront", "_ri_unused_recurring"):
            exprs.pop(k, None)
        exprs["effective_cost"] = (
            f"CASE {lit} WHEN 'SavingsPlanCoveredUsage' THEN COALESCE({sp}, 0) "
            f"WHEN 'DiscountedUsage' THEN COALESCE({ri}, 0) "
            f"WHEN 'SavingsPlanNegation' THEN 0 "
            f"WHEN 'RIFee' THEN {ri_unused or 0} "
            "WHEN 'SavingsPlanUpfrontFee' THEN 0 "
            f"WHEN 'SavingsPlanRecurringFee' THEN {sp_unused or 0} "
            f"ELSE {exprs['billed_cost']} END")
        exprs["_cur_fee"] = (f"{lit} IN ('RIFee', 'SavingsPlanUpfrontFee', "
                             "'SavingsPlanRecurringFee')")
        if not ri_unused or not sp_unused:
            bill.notes.append(
                "AWS CUR commitment fees (RIFee, Savings Plans fees) are the commitment "
                "bucket's: billed, their cash; effective, their unused part ("
                + ", ".join(x for x, ok in (
                    ("reservation unused fee columns", bool(ri_unused)),
                    ("savingsPlan TotalCommitmentToDate - UsedCommitment", bool(sp_unused)))
                    if ok) + ("; " if ri_unused or sp_unused else "")
                + "taken as 0 where the export has no unused-fee columns: the used part is "
                "in the covered usage's effective cost)")
        exprs["provider"] = f"COALESCE({exprs['provider']}, 'AWS')"
    elif bill.dialect == "GCP billing export":
        exprs["provider"] = "'Google Cloud'"
        exprs["pricing_category"] = "NULL"
        exprs["charge_category"] = (
            f"CASE lower({exprs['charge_category']}) WHEN 'tax' THEN 'Tax' "
            f"WHEN 'adjustment' THEN 'Adjustment' WHEN 'rounding_error' THEN 'Adjustment' "
            f"ELSE 'Usage' END")
    for name in ("charge_class", "commitment_id", "pricing_currency", "commitment_status",
                 "allocated_method_id", "allocated_resource_id", "allocated_resource_name",
                 "allocated_tags", "allocated_details", "contract_applied"):
        exprs.setdefault(name, "NULL")
    if bill.fmt == "focus":
        _focus_commitments(exprs)
    exprs["line_role"] = _line_role(exprs)
    fee = exprs.pop("_cur_fee", None)
    if fee is not None:
        exprs["line_role"] = f"CASE WHEN {fee} THEN 'commitment purchase' ELSE NULL END"
    row = "file_row_number + 1" if kind == "parquet" else \
        "row_number() OVER (PARTITION BY filename)"
    select = ",\n  ".join(
        ["filename AS src_file", f"CAST({row} AS BIGINT) AS src_row"]
        + [f"CAST({exprs[n]} AS {t}) AS {n}" for n, t in CANONICAL[2:]])
    _check_values(bill, checks, row)
    _check_json(bill, columns, row)
    con.execute(f"CREATE OR REPLACE TEMP VIEW bill_lines AS SELECT\n  {select}\nFROM bill_raw")


def _contract_ids(expr: str) -> str:
    """The ContractCommitmentIds of a ContractApplied object, as a list (DuckDB)."""
    return f"json_extract_string({expr}, '$.Elements[*].ContractCommitmentId')"


def _focus_commitments(exprs: dict[str, str]) -> None:
    """FOCUS commitments as the spec writes them: usage covered by a commitment discount
    (``CommitmentDiscountId``, status not Unused) or applied to a contract commitment
    (``ContractApplied``, FOCUS 1.3) is committed usage, whatever PricingCategory says (a
    1.0 export may leave it null): such a GPU gets no commitment lever."""
    cid, status, ca = exprs["commitment_id"], exprs["commitment_status"], \
        exprs["contract_applied"]
    rid, cat = exprs["resource_id"], exprs["charge_category"]
    if cid == "NULL" and ca == "NULL":
        return
    covered = []
    if cid != "NULL":
        covered.append(f"({cid} IS NOT NULL AND lower(COALESCE({status}, 'used')) <> 'unused')")
    if ca != "NULL":
        covered.append(f"({ca} IS NOT NULL AND NOT COALESCE(list_contains("
                       f"{_contract_ids(ca)}, {rid}), false))")
    exprs["pricing_category"] = (f"CASE WHEN {cat} = 'Usage' AND ({' OR '.join(covered)}) "
                                 f"THEN 'Committed' ELSE {exprs['pricing_category']} END")


def _line_role(exprs: dict[str, str]) -> str:
    """``line_role``: how the split treats a line that is not a plain charge.

    - ``provider split``: FOCUS 1.3 ``AllocatedMethodId``: the provider split the origin
      charge itself; each allocated charge goes to what it names (``AllocatedTags``,
      ``AllocatedResourceName``/``Id``), its unallocated portion to unallocated;
    - ``commitment purchase``: a Purchase of a commitment discount (``CommitmentDiscountId``)
      or of a contract commitment (``ContractApplied``'s ContractCommitmentId = ResourceId):
      the cash of the purchase (BilledCost), amortised by FOCUS into the usage it covers
      (EffectiveCost of the covered usage lines);
    - ``unused commitment``: the unused part of a commitment (status Unused, or a Usage
      line whose ResourceId is the contract commitment it is applied to).
    """
    cat, cid, status = exprs["charge_category"], exprs["commitment_id"], \
        exprs["commitment_status"]
    ca, rid, meth = exprs["contract_applied"], exprs["resource_id"], \
        exprs["allocated_method_id"]
    whens = []
    split = [f"{x} IS NOT NULL" for x in (meth, exprs["allocated_resource_id"]) if x != "NULL"]
    if split:
        whens.append(f"WHEN {' OR '.join(split)} THEN 'provider split'")
    own = (f"COALESCE(list_contains({_contract_ids(ca)}, {rid}), false)" if ca != "NULL"
           else "false")
    if cid != "NULL" or ca != "NULL":
        whens.append(f"WHEN {cat} = 'Purchase' AND ({cid} IS NOT NULL OR {own}) "
                     "THEN 'commitment purchase'")
        whens.append(f"WHEN {cat} = 'Usage' AND (({cid} IS NOT NULL AND "
                     f"lower({status}) = 'unused') OR {own}) THEN 'unused commitment'")
    return "CASE " + " ".join(whens) + " ELSE NULL END" if whens else "NULL"


def _check_json(bill: Bill, columns: Mapping[str, str], row: str) -> None:
    """FOCUS 1.3's JSON columns hold a JSON object (ContractApplied and
    AllocatedMethodDetails with an ``Elements`` array): the first that does not is named
    with file, column and row."""
    con = bill.con
    for _name, src in _JSON_COLUMNS:
        if src not in columns:
            continue
        raw = f"NULLIF(TRIM(CAST({columns[src]} AS VARCHAR)), '')"
        need = "" if src == "AllocatedTags" else \
            f" OR json_type({raw}, '$.Elements') IS DISTINCT FROM 'ARRAY'"
        bad = (f"{raw} IS NOT NULL AND (NOT json_valid({raw}) OR "
               f"json_type({raw}) <> 'OBJECT'{need})")
        hit = con.execute(
            f"SELECT filename, rn, v FROM (SELECT filename, {row} AS rn, {raw} AS v, "
            f"CASE WHEN json_valid({raw}) THEN ({bad}) ELSE {raw} IS NOT NULL END AS bad "
            "FROM bill_raw) WHERE bad ORDER BY filename, rn LIMIT 1").fetchone()
        if hit is not None:
            shape = "a JSON object" if src == "AllocatedTags" else \
                'a JSON object with an "Elements" array'
            raise InputError(
                f"value {str(hit[2])[:60]!r} is not {shape} (FOCUS 1.3 {src})",
                where=f"{hit[0]}, column {src}, row {hit[1]}",
                fix=f"export {src} as JSON, e.g. " + (
                    '{"team": "vision"}' if src == "AllocatedTags" else
                    '{"Elements": [{"AllocatedRatio": 0.5}]}' if src ==
                    "AllocatedMethodDetails" else
                    '{"Elements": [{"ContractId": "c1", "ContractCommitmentId": "c1", '
                    '"ContractCommitmentAppliedCost": 10.0}]}'))


_TYPES_OK = {
    "money": ("DECIMAL", "DOUBLE", "FLOAT", "REAL", "INTEGER", "BIGINT", "HUGEINT", "SMALLINT",
              "TINYINT", "UINTEGER", "UBIGINT", "USMALLINT", "UTINYINT", "VARCHAR"),
    "time": ("TIMESTAMP", "DATE", "VARCHAR"),
}
_TYPES_OK["number"] = _TYPES_OK["money"]


def _check_types(bill: Bill, spec: Sequence[_Field], types: dict[str, str]) -> None:
    """A typed export (Parquet) whose money or time column has the wrong type: say so before
    reading a value (a boolean is not an amount even where it would cast to one)."""
    for fld in spec:
        if fld.kind == "text":
            continue
        for src in fld.sources:
            typ = types.get(src)
            if typ is not None and not typ.startswith(_TYPES_OK[fld.kind]):
                what = {"money": "an amount", "number": "a number", "time": "a timestamp"}
                raise InputError(
                    f"column {src} has type {typ}, not {what[fld.kind]}",
                    where=f"{bill.files[0]}, column {src}, row 1",
                    fix="export the bill with its standard column types (FOCUS: decimal "
                    "amounts, timestamp periods)")


def _cur_charge_category(raw: str) -> str:
    return (f"CASE {raw} WHEN 'Tax' THEN 'Tax' "
            "WHEN 'Fee' THEN 'Purchase' WHEN 'RIFee' THEN 'Purchase' "
            "WHEN 'SavingsPlanUpfrontFee' THEN 'Purchase' "
            "WHEN 'SavingsPlanRecurringFee' THEN 'Purchase' "
            "WHEN 'Credit' THEN 'Credit' WHEN 'Refund' THEN 'Credit' "
            "ELSE 'Usage' END")


def _cur_pricing_category(term: str, lit: str, sku: str) -> str:
    return (f"CASE WHEN {lit} IN ('SavingsPlanCoveredUsage', 'DiscountedUsage') "
            "THEN 'Committed' "
            f"WHEN lower({term}) = 'spot' OR {sku} LIKE '%SpotUsage%' THEN 'Dynamic' "
            f"WHEN lower({term}) = 'reserved' THEN 'Committed' "
            f"WHEN lower({term}) = 'ondemand' OR {term} = 'On Demand' THEN 'Standard' "
            "ELSE NULL END")


_INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
             "UBIGINT")


def _always_parses(typ: str | None, kind: str) -> bool:
    """Whether every value of a column typed ``typ`` (a typed export: Parquet) reads as
    ``kind``, so :func:`_check_values` need not look at its values: a timestamp or date as
    a time, any number as a number, an integer or a decimal of at most 26 integer digits
    as money (``DECIMAL(38,12)``). Text, and a float or 128-bit amount, are checked."""
    if typ is None:
        return False
    if kind == "time":
        return typ.startswith(("TIMESTAMP", "DATE"))
    if kind == "number":
        return typ.startswith(("DECIMAL", "DOUBLE", "FLOAT", "REAL", *_INTEGERS))
    if kind == "money":
        m = re.fullmatch(r"DECIMAL\((\d+),\s*(\d+)\)", typ)
        return typ in _INTEGERS or (m is not None and int(m[1]) - int(m[2]) <= 26)
    return False


def _check_values(bill: Bill, checks: Sequence[tuple[str, str, str]], row: str) -> None:
    """One scan counting the values that do not parse, then the first bad row of the first
    bad column, so the error names file, column and row."""
    if not checks:
        return
    con = bill.con
    conds = []
    for _name, expr, kind in checks:
        typed = _typed(expr, kind)
        if kind == "time":  # DuckDB reads a US date 4/1/25 as the year 4: ISO dates only
            conds.append(f"({expr} IS NOT NULL AND ({typed} IS NULL OR NOT regexp_matches("
                         f"CAST({expr} AS VARCHAR), '^\\s*\\d{{4}}-\\d{{2}}-\\d{{2}}')))")
        else:
            conds.append(f"({expr} IS NOT NULL AND {typed} IS NULL)")
    counts = con.execute("SELECT " + ", ".join(f"count(*) FILTER (WHERE {c})" for c in conds)
                         + " FROM bill_raw").fetchone()
    for (name, expr, kind), cond, n in zip(checks, conds, counts):
        if not n:
            continue
        where = con.execute(
            f"SELECT filename, rn, CAST(v AS VARCHAR) FROM (SELECT filename, {row} AS rn, "
            f"{expr} AS v, {cond} AS bad FROM bill_raw) WHERE bad ORDER BY filename, rn "
            "LIMIT 1").fetchone()
        what = {"money": "an amount", "number": "a number", "time": "a timestamp"}[kind]
        fix = {"money": "amounts are plain decimals, e.g. 32.7726 (no currency sign)",
               "number": "quantities are plain numbers",
               "time": "timestamps are ISO 8601, e.g. 2026-10-01T00:00:00Z"}[kind]
        raise InputError(
            f"value {where[2]!r} is not {what} ({n} such value{'s' if n > 1 else ''} in "
            "this column)", where=f"{where[0]}, column {name}, row {where[1]}", fix=fix)
