"""Split an opened bill over measured GPU time and reconcile it to the cent.

:func:`usage_hours` turns classify's hourly cells (group key ``period:3600``) into the
``usage_hours`` relation of ``join.py``; :func:`allocate` runs the join and the
reconciliation and returns a :class:`BillAllocation`: the showback rows (one per charge period,
currency, line and phase, in whole cents) and the summary dict the report shows
(``extra["bill"]``, docs/json-schema.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuaudit.classify.coding import first_seen_groups
from gpuaudit.errors import InputError
from gpuaudit.price.billing.currency import digits, units_per_minor
from gpuaudit.price.billing.gpu_lines import match_skus
from gpuaudit.price.billing.join import COST_COLUMNS, METHODS, PHASE_COLS, UNITS_PER_USD
from gpuaudit.price.billing.readers import CANONICAL, Bill
from gpuaudit.price.billing.reconcile import (
    UNITS_PER_CENT,
    cents_of_units,
    reconcile_cents,
    split_cents,
)
from gpuaudit.price.billing.sql.engines import run_join
from gpuaudit.price.billing.sql.join import COMMITMENT_ROLES, INPUTS, PROVIDER_PHASE, split_key
from gpuaudit.price.billing.sql.out import write_sql_dir
from gpuaudit.price.catalog import CatalogEntry
from gpuaudit.validate import check_output_dir

__all__ = ["HOUR_KEY", "BillAllocation", "BillSide", "allocate", "bill_side", "usage_hours"]

HOUR_KEY = "period:3600"
UNATTRIBUTED = "unattributed"
_VALUE = {"idle_ms": "idle_s", "underutilized_ms": "underutilized_s",
          "productive_ms": "productive_s", "compute_bound_ms": "compute_bound_s"}


def usage_hours(cells: pa.Table, keys: Sequence[str]) -> pa.Table:
    """classify's cells grouped by ``period:3600`` (and ``keys``, optionally ``pod``) as the
    ``usage_hours`` relation: per host, hour, held flag and group, integer milliseconds.

    A GPU is *held* where a pod holds it; telemetry without pods (one box, one job) is held
    by whoever its labels name, ``unattributed`` where they name nobody.
    """
    n = cells.num_rows
    has_pods = "pod" in cells.column_names and cells.column("pod").null_count < n
    held = pc.is_valid(cells.column("pod")) if has_pods else pa.array([True] * n)
    cols: dict[str, Any] = {
        "host": cells.column("host").cast(pa.string()),
        "period_start": pc.cast(pc.cast(cells.column(HOUR_KEY), pa.int64()),
                                pa.timestamp("s", tz="UTC")),
        "held": held,
    }
    for i, k in enumerate(keys):
        v = cells.column(k).cast(pa.string())
        v = pc.if_else(held, pc.fill_null(v, UNATTRIBUTED), pa.scalar(None, pa.string()))
        cols[f"g_{i}"] = v
    for out, src in _VALUE.items():
        cols[out] = _ms(cells.column(src))
    cols["unobserved_ms"] = _ms(pc.add(cells.column("gap_s"), cells.column("no_reading_s")))
    t = pa.table(cols)
    group = ["host", "period_start", "held", *(f"g_{i}" for i in range(len(keys)))]
    agg = group_sums(t, group, [*_VALUE, "unobserved_ms"])
    return agg.rename_columns([c[:-4] if c.endswith("_sum") else c for c in agg.column_names])


def _ms(seconds: Any) -> pa.Array:
    """Seconds (float64, no nulls) as whole milliseconds, rounded half to even: numpy's
    ``rint``, the rounding of ``pc.round`` (Arrow's kernel took ~60 ns a value)."""
    arr = seconds.combine_chunks() if isinstance(seconds, pa.ChunkedArray) else seconds
    if arr.null_count:
        return pc.cast(pc.round(pc.multiply(arr, 1000.0)), pa.int64())
    x = arr.to_numpy(zero_copy_only=False) * 1000.0
    return pa.array(np.rint(x, out=x).astype(np.int64))


def group_sums(t: pa.Table, group: Sequence[str], sums: Sequence[str]) -> pa.Table:
    """``t.group_by(group, use_threads=False).aggregate([(c, "sum") for c in sums])``, the
    same table (the groups in order of first appearance, a null key a group of its own; the
    keys, then ``<c>_sum``), from integer codes: each key dictionary-encoded, the codes
    combined into one integer, its first-seen encoding the group, and the sums
    ``numpy.bincount``. Acero's hash grouping of the ~720,000 hourly cells of a month of
    1,000 GPUs grew its tables row by row (~1 s on one core, after classify); this is ~0.1 s.
    Integer sums are exact (float64 bincount, checked below 2**53); elsewhere, or with nulls
    to sum, Acero does it."""
    def acero() -> pa.Table:
        return t.group_by(list(group), use_threads=False).aggregate([(c, "sum") for c in sums])

    n = t.num_rows
    ints = all(pa.types.is_integer(t.schema.field(c).type) for c in sums)
    if n == 0 or not ints or any(t.column(c).null_count for c in sums):
        return acero()
    combined = np.zeros(n, dtype=np.int64)
    for k in group:
        enc = pc.dictionary_encode(t.column(k).combine_chunks())
        size = len(enc.dictionary) + 1  # (the last: null)
        if size and int(combined.max()) >= (1 << 62) // size:
            return acero()
        ind = enc.indices.fill_null(size - 1).to_numpy(zero_copy_only=False)
        combined = combined * size + ind.astype(np.int64)
    gid, first = first_seen_groups(combined)
    groups = first.shape[0]
    out = {k: t.column(k).take(pa.array(first)) for k in group}
    for c in sums:
        v = t.column(c).to_numpy()
        if int(np.abs(v).sum()) >= 1 << 53:  # a float sum could round: Acero's exact one
            return acero()
        out[f"{c}_sum"] = pa.array(np.bincount(gid, weights=v, minlength=groups)
                                   .astype(np.int64))
    return pa.table(out)


@dataclass(frozen=True)
class BillAllocation:
    """The bill split and reconciled: ``showback`` (Arrow table, whole cents as int64) and
    ``summary`` (plain JSON-able dict, money as strings with two decimals)."""

    showback: pa.Table
    summary: dict[str, Any]


def _usd(cents: int, ccy: str = "USD") -> str:
    """Whole minor units of ``ccy`` as text: 12345 -> '123.45' (USD), '12345' (JPY)."""
    d = digits(ccy)
    return str(Decimal(int(cents)).scaleb(-d).quantize(Decimal(1).scaleb(-d)))


def _dec_usd(x: Decimal | None, ccy: str = "USD") -> str | None:
    return None if x is None else str(x.quantize(Decimal(1).scaleb(-digits(ccy))))


def _iso(t: Any) -> str:
    if isinstance(t, datetime):
        return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    return str(t)


def _host_candidates(resource_id: str | None, name: str | None) -> list[str]:
    out = []
    for v in (resource_id, name):
        if v:
            out.append(v.lower())
            tail = v.replace(":", "/").rstrip("/").rsplit("/", 1)[-1]
            out.append(tail.lower())
    return out


@dataclass(frozen=True)
class BillSide:
    """What the report takes from the bill alone, whatever the telemetry: the GPU SKUs (the
    ``gpu_skus`` temp table is left on the bill's connection) and, per currency, the totals,
    the non-GPU lines, the lines a rate is read from, the buckets' sums, the commitments; the
    overlapping charge periods and the duplicates.
    Computed by :func:`bill_side`, which :func:`allocate` calls when it is not given one."""

    cost: str
    currencies: tuple[str, ...]
    totals: Mapping[str, tuple[Any, int]]
    non_gpu: Mapping[str, list[tuple[Any, ...]]]
    model_rates: Mapping[str, list[dict[str, Any]]]
    bucket_kinds: Mapping[str, list[tuple[Any, ...]]]
    bucket_gpu: Mapping[str, tuple[int, int]]
    commitments: Mapping[str, dict[str, Any]]
    overlaps: dict[str, Any]
    duplicates: dict[str, Any]
    #: the distinct (resource id, resource name) of the GPU lines (matched to telemetry hosts)
    gpu_resources: tuple[tuple[str | None, str | None], ...]


def bill_side(bill: Bill, *, cost: str = "billed",
              catalog: Sequence[CatalogEntry] | None = None) -> BillSide:
    """The GPU SKUs of ``bill`` (matched in ``catalog``, else the embedded one) as the
    ``gpu_skus`` temp table on its connection, and every figure of the report that depends on
    the bill alone (:class:`BillSide`). Nothing here needs the telemetry, so it can run while
    the telemetry is classified (DuckDB works outside the interpreter lock)."""
    if cost not in COST_COLUMNS:
        raise InputError(f"unknown cost {cost!r}", fix="use billed, effective or list")
    con = bill.con
    # GPU SKUs from the catalog, over the bill's distinct SKU texts
    texts = [r[0] for r in con.execute(
        "SELECT DISTINCT sku_text FROM bill_lines WHERE sku_text IS NOT NULL").fetchall()]
    skus = match_skus(texts, catalog)
    con.register("gpu_skus_arrow", pa.table({
        "sku_text": pa.array(list(skus), pa.string()),
        "instance": pa.array([s.instance for s in skus.values()], pa.string()),
        "gpu_model": pa.array([s.gpu_model for s in skus.values()], pa.string()),
        "gpus_per_instance": pa.array([s.gpus_per_instance for s in skus.values()], pa.int64()),
        "per_gpu": pa.array([s.per_gpu for s in skus.values()], pa.bool_()),
    }))
    con.execute("CREATE OR REPLACE TEMP TABLE gpu_skus AS SELECT * FROM gpu_skus_arrow")
    con.unregister("gpu_skus_arrow")
    col = COST_COLUMNS[cost]
    # FOCUS amortises a commitment's purchase into the usage it covers: the purchase's
    # EffectiveCost is 0. A purchase that keeps its cost there while the usage of the same
    # commitment carries the amortised cost would count the commitment twice: rejected.
    twice = "false"
    if cost == "effective":
        twice = ("(b.line_role = 'commitment purchase' AND b.effective_cost <> 0 AND EXISTS ("
                 "SELECT 1 FROM bill_lines u WHERE u.charge_category = 'Usage' AND "
                 "u.effective_cost <> 0 AND u.currency = b.currency AND "
                 "((u.commitment_id = b.commitment_id) OR COALESCE(list_contains("
                 "json_extract_string(u.contract_applied, '$.Elements[*].ContractCommitmentId'), "
                 "b.resource_id), false))))")
    # one scan of the bill into ``bill_cube``: its lines counted and summed per currency,
    # GPU or not, bucket (``kind``), service and category, and for the lines a GPU rate is
    # read from, per SKU and pricing category. The totals, the non-GPU lines, the buckets and
    # the model rates below are sums over that small table (sums of exact decimals: equal to
    # the sums over the lines), not one scan of the bill each.
    rate = f"s.sku_text IS NOT NULL AND {RATE_LINES}"
    con.execute(
        "CREATE OR REPLACE TEMP TABLE bill_cube AS "
        f"SELECT b.currency, s.sku_text IS NOT NULL AND NOT {ROLE_COMMIT} AS gpu, "
        f"{ROLE_COMMIT} AS commit_role, "
        f"CASE WHEN b.{col} IS NULL THEN 'rejected' WHEN {twice} THEN 'rejected_twice' "
        f"WHEN {ROLE_COMMIT} THEN 'commitment' "
        "WHEN b.charge_category = 'Tax' THEN 'tax' "
        "WHEN b.charge_category = 'Credit' THEN 'credit' ELSE 'non_gpu' END AS kind, "
        "COALESCE(b.service, '(no service)') AS service, "
        "COALESCE(b.charge_category, '') AS category, "
        f"CASE WHEN {rate} THEN s.sku_text END AS rate_sku, "
        f"CASE WHEN {rate} THEN COALESCE(b.pricing_category, 'Standard') END AS rate_pricing, "
        "count(*) AS n, sum(b.billed_cost) AS billed_cost, "
        "sum(b.effective_cost) AS effective_cost, sum(b.list_cost) AS list_cost, "
        f"sum(CASE WHEN {rate} THEN ({_HOURS}) * (CASE WHEN s.per_gpu THEN 1 "
        "ELSE s.gpus_per_instance END) END) AS rate_gpu_hours, "
        "count(*) FILTER (WHERE b.charge_class = 'Correction') AS corrections "
        "FROM bill_lines b LEFT JOIN gpu_skus s ON b.sku_text = s.sku_text GROUP BY ALL")
    totals = {str(r[0]): (r[1], int(r[2])) for r in con.execute(
        "SELECT currency, sum(billed_cost), sum(n) FROM bill_cube GROUP BY currency"
    ).fetchall()}
    currencies = tuple(totals)
    non_gpu: dict[str, list[tuple[Any, ...]]] = {c: [] for c in currencies}
    for r in con.execute(
            "SELECT currency, service, category, sum(billed_cost), sum(effective_cost), "
            "sum(list_cost), CAST(sum(n) AS BIGINT) FROM bill_cube "
            "WHERE NOT gpu AND NOT commit_role GROUP BY ALL ORDER BY 1, 4 DESC").fetchall():
        non_gpu[str(r[0])].append(tuple(r[1:]))
    kinds: dict[str, list[tuple[Any, ...]]] = {c: [] for c in currencies}
    for r in con.execute(
            f"SELECT currency, kind, CAST(sum(n) AS BIGINT), CAST(COALESCE(sum({col}), 0) * "
            f"{UNITS_PER_USD} AS HUGEINT) FROM bill_cube WHERE NOT gpu GROUP BY 1, 2"
            ).fetchall():
        kinds[str(r[0])].append(tuple(r[1:]))
    gpu = {str(r[0]): (int(r[1]), int(r[2])) for r in con.execute(
        f"SELECT currency, sum(n), CAST(COALESCE(sum({col}), 0) * {UNITS_PER_USD} "
        "AS HUGEINT) FROM bill_cube WHERE gpu GROUP BY currency").fetchall()}
    resources = con.execute(
        "SELECT DISTINCT b.resource_id, b.resource_name FROM bill_lines b "
        "JOIN gpu_skus s ON b.sku_text = s.sku_text").fetchall()
    return BillSide(cost=cost, currencies=currencies, totals=totals, non_gpu=non_gpu,
                    model_rates={c: _model_rates(con, c, cube=True) for c in currencies},
                    bucket_kinds=kinds, bucket_gpu=gpu,
                    commitments={c: _commitments(con, c) for c in currencies},
                    overlaps=_overlaps(con), duplicates=_duplicates(con),
                    gpu_resources=tuple((r[0], r[1]) for r in resources))


def allocate(
    bill: Bill,
    hours: pa.Table,
    keys: Sequence[str],
    *,
    method: str = "allocation",
    cost: str = "billed",
    window: tuple[datetime, datetime] | None = None,
    catalog: Sequence[CatalogEntry] | None = None,
    host_aliases: Mapping[str, str] | None = None,
    sql_dir: str | Path | None = None,
    sql_dialect: str = "duckdb",
    engine: str = "duckdb",
    spark: Any = None,
    side: BillSide | None = None,
) -> BillAllocation:
    """Join ``bill`` to measured ``hours`` (:func:`usage_hours`) and reconcile.

    ``keys``: the group keys' display names (``team``, ``project``), in ``g_i`` order.
    ``window``: the telemetry's [start, end); charge periods outside it are not covered.
    ``host_aliases``: telemetry host -> bill resource id, where the names differ.
    ``sql_dir``: also write the join's inputs (``bill_lines``, ``gpu_skus``, ``host_map``,
    ``usage_hours`` as Parquet) and its SQL (``join.sql``) there, to run the same query in a
    warehouse (docs/billing.md); ``sql_dialect``: that SQL's dialect (duckdb, spark, trino,
    bigquery), with the inputs' DDL and a README of their contract.
    ``engine``: where the join runs (``duckdb``, or ``spark`` on ``spark`` or a local
    session); the report is the same. ``side``: :func:`bill_side` of this bill, computed
    beforehand (``gpuaudit.bill`` computes it while classify reads the telemetry).
    """
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}", fix="use allocation or usage")
    if side is None or side.cost != cost:
        side = bill_side(bill, cost=cost, catalog=catalog)
    con = bill.con
    # which telemetry host each GPU resource is
    hosts = sorted(set(hours.column("host").to_pylist())) if hours.num_rows else []
    by_name = {h.lower(): h for h in hosts}
    for alias, target in (host_aliases or {}).items():
        by_name[target.lower()] = alias
    pairs: dict[str, str] = {}
    for rid, name in side.gpu_resources:
        for cand in _host_candidates(rid, name):
            if cand in by_name and rid is not None:
                pairs[rid] = by_name[cand]
                break
    con.register("host_map_arrow", pa.table({
        "resource_id": pa.array(list(pairs), pa.string()),
        "host": pa.array(list(pairs.values()), pa.string())}))
    con.execute("CREATE OR REPLACE TEMP TABLE host_map AS SELECT * FROM host_map_arrow")
    _split_groups(con, keys)
    con.register("usage_hours_arrow", hours)
    con.execute("CREATE OR REPLACE TEMP TABLE usage_hours AS SELECT * FROM usage_hours_arrow")
    win = None if window is None else (_iso(window[0]), _iso(window[1]))
    if sql_dir is not None:
        out = check_output_dir(sql_dir, "sql_dir")
        out.mkdir(exist_ok=True)  # the one folder asked for; its parent must exist
        for rel in INPUTS:
            dest = str(out / f"{rel}.parquet").replace("'", "''")
            con.execute(f"COPY (SELECT * FROM {rel}) TO '{dest}' (FORMAT parquet)")
        write_sql_dir(out, len(keys), method, cost, win, sql_dialect)
    run_join(con, engine, len(keys), method, cost, win, spark=spark)
    return _summarise(bill, keys, method, cost, window, pairs, hosts, side)


#: a commitment's purchase or unused part (readers.py ``line_role``): never GPU time
ROLE_COMMIT = ("COALESCE(b.line_role IN (" + ", ".join(f"'{r}'" for r in COMMITMENT_ROLES)
               + "), false)")
#: a GPU line: its SKU is a GPU instance of the catalog, and it is no commitment's line
#: (an uncorrelated IN: DuckDB plans the correlated EXISTS it replaces as a join that first
#: materialises every line, ~1 s per query over 10M lines)
IS_GPU = ("(COALESCE(b.sku_text IN (SELECT sku_text FROM gpu_skus), false) AND NOT "
          f"{ROLE_COMMIT})")
PROVIDER_SPLIT = "provider split"
PROVIDER_UNALLOCATED = "provider split: unallocated portion"


def _tag_value(tags: Mapping[str, Any], key: str) -> str | None:
    """``key``'s value in a provider's AllocatedTags: the exact key, else one equal to it
    ignoring case or a prefix (``user:team``, ``k8s.io/team``)."""
    if key in tags and tags[key] not in (None, ""):
        return str(tags[key])
    low = key.lower()
    for k, v in tags.items():
        tail = str(k).replace(":", "/").rsplit("/", 1)[-1].lower()
        if (str(k).lower() == low or tail == low) and v not in (None, ""):
            return str(v)
    return None


def _split_groups(con: Any, keys: Sequence[str]) -> None:
    """``split_groups``: for each target a provider split a line to (FOCUS 1.3
    ``AllocatedTags``, ``AllocatedResourceName``/``Id``), the group it is: each key's value
    from the allocated tags, else (first key) the allocated resource's name or id; a split
    line naming nothing is the origin charge's unallocated portion."""
    import json

    rows = con.execute(
        f"SELECT DISTINCT {split_key('b')}, b.allocated_tags, b.allocated_resource_name, "
        "b.allocated_resource_id FROM bill_lines b "
        "WHERE b.line_role = 'provider split' ORDER BY 1").fetchall()
    cols: dict[str, list[Any]] = {"split_key": [], "kind": [], "reason": [],
                                  **{f"g_{i}": [] for i in range(len(keys))}}
    for sk, tags_text, name, rid in rows:
        tags = json.loads(tags_text) if tags_text else {}
        vals = [_tag_value(tags, k) for k in keys]
        if keys and not any(vals) and (name or rid):
            vals[0] = name or rid
        named = any(vals) or (not keys and (name or rid or tags))
        cols["split_key"].append(sk)
        cols["kind"].append("team" if named else "unallocated")
        cols["reason"].append(PROVIDER_SPLIT if named else PROVIDER_UNALLOCATED)
        for i, v in enumerate(vals):
            cols[f"g_{i}"].append(v)
    con.register("split_groups_arrow", pa.table(
        {k: pa.array(v, pa.string()) for k, v in cols.items()}))
    con.execute("CREATE OR REPLACE TEMP TABLE split_groups AS SELECT * FROM split_groups_arrow")


def _provider_split(con: Any, cost: str, keys: Sequence[str]) -> dict[str, Any]:
    """Which lines the provider split itself (FOCUS 1.3 Allocated*), per target: the report's
    list of provider-allocated lines and the line of the split each went to."""
    col = COST_COLUMNS[cost]
    gsel = "".join(f"sg.g_{i}, " for i in range(len(keys)))
    rows = con.execute(
        f"SELECT b.currency, b.resource_id, b.allocated_method_id, b.allocated_resource_id, "
        f"b.allocated_resource_name, b.allocated_tags, sg.kind, sg.reason, {gsel}"
        f"count(*), sum(b.{col}), "
        "bool_or(EXISTS (SELECT 1 FROM gpu_skus s WHERE s.sku_text = b.sku_text)), "
        "string_agg(CAST(b.src_row AS VARCHAR), ',' ORDER BY b.src_row) "
        f"FROM bill_lines b LEFT JOIN split_groups sg ON {split_key('b')} = sg.split_key "
        "WHERE b.line_role = 'provider split' GROUP BY ALL "
        "ORDER BY 1, 2, 4 NULLS LAST, 5").fetchall()
    n = len(keys)
    out = []
    for r in rows:
        gpu = bool(r[10 + n])
        out.append({
            "currency": r[0], "resource_id": r[1], "allocated_method_id": r[2],
            "allocated_resource_id": r[3], "allocated_resource_name": r[4],
            "allocated_tags": r[5], "lines": int(r[8 + n]),
            "amount": _dec_usd(r[9 + n], r[0]), "gpu": gpu,
            "rows": [int(x) for x in str(r[11 + n]).split(",")][:20],
            "to": _line_label(r[6], r[7], list(r[8:8 + n]), keys) if gpu else
            "non-GPU (not split)"})
    bad = con.execute(
        "SELECT count(*), any_value(resource_id), any_value(charge_start), any_value(s) FROM ("
        "SELECT resource_id, charge_start, round(sum(list_sum(TRY_CAST(json_extract("
        "allocated_details, '$.Elements[*].AllocatedRatio') AS DOUBLE[]))), 6) AS s "
        "FROM bill_lines WHERE line_role = 'provider split' GROUP BY currency, resource_id, "
        "charge_start, charge_end, sku_text, allocated_method_id "
        "HAVING count(allocated_details) = count(*) AND abs(s - 1) > 0.000001)").fetchone()
    ratio_note = None
    if bad[0]:
        ratio_note = (
            f"{bad[0]} origin charge(s) split by the provider have allocated charges whose "
            f"AllocatedRatio sum to {bad[3]:g}, not 1 (FOCUS 1.3 AllocatedMethodDetails; e.g. "
            f"{bad[1]} at {_iso(bad[2])}): their amounts are split as billed")
    return {"lines": sum(x["lines"] for x in out), "targets": out, "ratio_note": ratio_note}


def _summarise(bill: Bill, keys: Sequence[str], method: str, cost: str,
               window: tuple[datetime, datetime] | None, pairs: Mapping[str, str],
               hosts: Sequence[str], side: BillSide) -> BillAllocation:
    con = bill.con
    gk = [f"g_{i}" for i in range(len(keys))]
    # periods and their exact billed totals
    periods = con.execute(
        "SELECT currency, charge_start, charge_end, CAST(units AS VARCHAR), billed_gpu_ms "
        "FROM period_totals ORDER BY currency, charge_start, charge_end").fetchall()
    # each currency's total rounds once; its periods get whole cents summing to it
    targets = [0] * len(periods)
    for ccy in {p[0] for p in periods}:
        idx = [i for i, p in enumerate(periods) if p[0] == ccy]
        units = [int(periods[i][3]) for i in idx]
        per = units_per_minor(ccy)
        for i, c in zip(idx, split_cents(units, cents_of_units(sum(units), per), per)):
            targets[i] = c
    g_sel = "".join(f"{g}, " for g in gk)
    # one minor unit of each currency in 1e-12 units (a cent, a yen, a fils)
    whens = "".join(f"WHEN '{c}' THEN CAST({units_per_minor(c)} AS HUGEINT) "
                    for c in sorted({p[0] for p in periods})
                    if units_per_minor(c) != UNITS_PER_CENT and "'" not in c)
    per_sql = (f"CASE currency {whens}ELSE CAST({UNITS_PER_CENT} AS HUGEINT) END" if whens
               else f"CAST({UNITS_PER_CENT} AS HUGEINT)")
    floor = (f"(CASE WHEN units >= 0 THEN units // ({per_sql}) "
             f"ELSE -((-units + ({per_sql}) - 1) // ({per_sql})) END)")
    # each row's charge period (its index in ``periods``) and its line's combination of
    # kind, reason and group (``combo``), numbered by the SQL: no per-row Python
    g_on = "".join(f" AND a.{g} IS NOT DISTINCT FROM c.{g}" for g in gk)
    rows = con.sql(
        "WITH p AS (SELECT currency, charge_start, charge_end, CAST(row_number() OVER ("
        "ORDER BY currency, charge_start, charge_end) - 1 AS BIGINT) AS pid "
        "FROM period_totals), "
        f"c AS (SELECT kind, reason, {g_sel}CAST(row_number() OVER (ORDER BY kind, reason"
        + "".join(f", {g}" for g in gk) + ") - 1 AS BIGINT) AS combo FROM (SELECT DISTINCT "
        f"kind, reason{''.join(f', {g}' for g in gk)} FROM alloc) d) "
        f"SELECT a.currency, a.charge_start, a.charge_end, a.kind, a.reason, "
        + "".join(f"a.{g}, " for g in gk) + "a.phase, "
        f"CAST({floor.replace('units', 'a.units').replace('currency', 'a.currency')} "
        "AS BIGINT) AS fl, "
        f"CAST(a.units - {floor.replace('units', 'a.units').replace('currency', 'a.currency')}"
        f" * ({per_sql.replace('currency', 'a.currency')}) AS BIGINT) AS rem, "
        "a.gpu_ms, p.pid, c.combo FROM alloc a "
        "JOIN p ON a.currency = p.currency AND a.charge_start = p.charge_start "
        "AND a.charge_end = p.charge_end "
        f"JOIN c ON a.kind = c.kind AND a.reason IS NOT DISTINCT FROM c.reason{g_on} "
        "ORDER BY a.currency, a.charge_start, a.charge_end, a.kind, a.reason, "
        + "".join(f"a.{g}, " for g in gk) + "a.phase").to_arrow_table()
    rem_units = rows.column("rem").to_numpy(zero_copy_only=False).astype(np.int64)
    pidx = rows.column("pid").to_numpy(zero_copy_only=False).astype(np.int64)
    combo = rows.column("combo").to_numpy(zero_copy_only=False).astype(np.int64)
    fl = rows.column("fl").to_numpy(zero_copy_only=False).astype(np.int64)
    cents = reconcile_cents(pidx, fl, rem_units, targets)
    gpu_h = pc.divide(pc.cast(rows.column("gpu_ms"), pa.float64()), 3_600_000.0)
    # the line label of each combination, from its first row
    n_combo = int(combo.max()) + 1 if combo.size else 0
    first = np.full(n_combo, -1, dtype=np.int64)
    first[combo[::-1]] = np.arange(combo.size - 1, -1, -1)
    kinds = rows.column("kind").take(pa.array(first)).to_pylist()
    reasons = rows.column("reason").take(pa.array(first)).to_pylist()
    gvals = [rows.column(g).take(pa.array(first)).to_pylist() for g in gk]
    labels = pa.array([_line_label(k, r, [v[j] for v in gvals], keys)
                       for j, (k, r) in enumerate(zip(kinds, reasons))], pa.string())
    cur = rows.column("currency")
    cur_codes = pc.dictionary_encode(cur).combine_chunks() if rows.num_rows else None
    minor = (pa.array([digits(c) for c in cur_codes.dictionary.to_pylist()], pa.int8())
             .take(cur_codes.indices) if cur_codes is not None else pa.array([], pa.int8()))
    showback = pa.table({
        "period_start": rows.column("charge_start"),
        "period_end": rows.column("charge_end"),
        "currency": cur,
        "line": labels.take(pa.array(combo)),
        "kind": rows.column("kind"),
        "reason": rows.column("reason"),
        **{k: rows.column(g) for k, g in zip(keys, gk)},
        "phase": rows.column("phase"),
        "method": pa.array([method] * rows.num_rows, pa.string()),
        "amount": pa.array(cents, pa.int64()),
        "gpu_hours": gpu_h,
        # digits of ``amount``'s minor unit (ISO 4217: USD 2, JPY 0, BHD 3)
        "minor_units": minor,
    })
    summary = _summary_dict(bill, keys, method, cost, window, periods, targets, showback,
                            pairs, hosts, fl, rem_units, side, pidx)
    return BillAllocation(showback=showback, summary=summary)


def _line_label(kind: str, reason: str, vals: Sequence[str | None], keys: Sequence[str]) -> str:
    named = "/".join(v for v in vals if v is not None)
    if kind == "team":
        return named or UNATTRIBUTED
    if kind == "idle":
        return f"idle (held by {named})" if reason == "held" and named else "idle (held by nobody)"
    return f"unallocated ({reason})"


def _summary_dict(bill: Bill, keys: Sequence[str], method: str, cost: str,
                  window: tuple[datetime, datetime] | None,
                  periods: Sequence[tuple[Any, ...]], targets: Sequence[int],
                  showback: pa.Table, pairs: Mapping[str, str], hosts: Sequence[str],
                  floor_cents: np.ndarray, rem_units: np.ndarray,
                  side: BillSide, pidx: np.ndarray) -> dict[str, Any]:
    con = bill.con
    out: dict[str, Any] = {
        "version": "1.0",
        "files": list(bill.files),
        "format": bill.fmt,
        "dialect": bill.dialect,
        "method": method,
        "cost_basis": cost,
        "group_keys": list(keys),
        "notes": list(bill.notes),
        "telemetry_window": None if window is None else
        {"start": _iso(window[0]), "end": _iso(window[1])},
        "currencies": {},
    }
    # per row: its line (kind and label), phase, period and currency, as codes; the sums per
    # line, line and phase, and period and kind are numpy scatter-adds, in row order (the
    # floats add up in the same order as one running sum per key)
    n = showback.num_rows
    kind_code = {"team": 0, "idle": 1, "unallocated": 2}
    sb_kind = showback.column("kind").to_pylist()
    kcode = np.fromiter((kind_code[k] for k in sb_kind), dtype=np.int64, count=n)
    line_keys = pc.binary_join_element_wise(
        showback.column("currency"), showback.column("kind"), showback.column("line"), "\x00")
    enc = pc.dictionary_encode(line_keys).combine_chunks() if n else None
    lcode = (enc.indices.to_numpy(zero_copy_only=False).astype(np.int64) if enc is not None
             else np.zeros(0, np.int64))
    n_lines = len(enc.dictionary) if enc is not None else 0
    ph_enc = pc.dictionary_encode(showback.column("phase")).combine_chunks() if n else None
    phases = ph_enc.dictionary.to_pylist() if ph_enc is not None else []
    phcode = (ph_enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
              if ph_enc is not None else np.zeros(0, np.int64))
    amt = showback.column("amount").to_numpy(zero_copy_only=False).astype(np.int64)
    hours_f = showback.column("gpu_hours").to_numpy(zero_copy_only=False).astype(np.float64)
    fl_sum = np.zeros(n_lines, np.int64)
    rem_sum = np.zeros(n_lines, np.int64)
    h_sum = np.zeros(n_lines, np.float64)
    np.add.at(fl_sum, lcode, floor_cents)
    np.add.at(rem_sum, lcode, rem_units)
    np.add.at(h_sum, lcode, hours_f)
    lp = lcode * max(len(phases), 1) + phcode
    lp_fl = np.zeros(n_lines * max(len(phases), 1), np.int64)
    lp_rem = np.zeros_like(lp_fl)
    np.add.at(lp_fl, lp, floor_cents)
    np.add.at(lp_rem, lp, rem_units)
    lp_first = np.full(lp_fl.shape[0], n, dtype=np.int64)
    np.minimum.at(lp_first, lp, np.arange(n))
    line_first = np.full(n_lines, n, dtype=np.int64)
    np.minimum.at(line_first, lcode, np.arange(n))
    pp_sum = np.zeros((len(periods), 3), np.int64)
    np.add.at(pp_sum, (pidx, kcode), amt)
    sb_cur = showback.column("currency")
    currencies = sorted({p[0] for p in periods} | set(side.currencies),
                        key=lambda c: (c != "USD", c))
    for ccy in currencies:
        per = units_per_minor(ccy)
        lines: dict[tuple[Any, ...], dict[str, Any]] = {}
        # the lines of this currency in the order of their first row
        mine = [int(i) for i in np.argsort(line_first, kind="stable")
                if line_first[i] < n and sb_cur[int(line_first[i])].as_py() == ccy]
        for li in mine:
            i = int(line_first[li])
            kind = sb_kind[i]
            phase_units = {}
            order = [(int(lp_first[li * len(phases) + j]), j) for j in range(len(phases))
                     if lp_first[li * len(phases) + j] < n]
            for _first, j in sorted(order):
                k = li * len(phases) + j
                phase_units[phases[j]] = int(lp_fl[k]) * per + int(lp_rem[k])
            lines[(kind, showback.column("line")[i].as_py())] = {
                "line": showback.column("line")[i].as_py(), "kind": kind,
                "reason": showback.column("reason")[i].as_py(),
                "group": {k: showback.column(k)[i].as_py() for k in keys}
                if kind != "unallocated" else {},
                "units": int(fl_sum[li]) * per + int(rem_sum[li]),
                "gpu_hours": float(h_sum[li]), "phase_units": phase_units}
        per_period = {(p[1], p[2]): {"team": int(pp_sum[i, 0]), "idle": int(pp_sum[i, 1]),
                                     "unallocated": int(pp_sum[i, 2])}
                      for i, p in enumerate(periods) if p[0] == ccy}
        kind_order = {"team": 0, "idle": 1, "unallocated": 2}
        c_periods = [(p, t) for p, t in zip(periods, targets) if p[0] == ccy]
        billed_cents = sum(t for _p, t in c_periods)
        # each line rounds once from its exact amount; the lines sum to the billed total
        vals = list(lines.values())
        per = units_per_minor(ccy)
        for ln, c in zip(vals, split_cents([ln["units"] for ln in vals], billed_cents, per)):
            ln["cents"] = c
            ph = list(ln["phase_units"])
            ln["phase_cents"] = dict(zip(ph, split_cents([ln["phase_units"][p] for p in ph], c,
                                                         per)))
        line_list = sorted(vals, key=lambda d: (kind_order[d["kind"]], -d["cents"], d["line"]))
        period_rows: list[dict[str, Any]] = []
        all_exact = True
        for p, t in c_periods:
            pp = per_period.get((p[1], p[2]), {"team": 0, "idle": 0, "unallocated": 0})
            s = pp["team"] + pp["idle"] + pp["unallocated"]
            all_exact = all_exact and s == t
            period_rows.append({"start": _iso(p[1]), "end": _iso(p[2]),
                                "billed": _usd(t, ccy),
                                "teams": _usd(pp["team"], ccy), "idle": _usd(pp["idle"], ccy),
                                "unallocated": _usd(pp["unallocated"], ccy),
                                "billed_gpu_hours": round(int(p[4] or 0) / 3_600_000, 4)})
        exact_units = sum(int(p[3]) for p, _t in c_periods)
        sum_lines = sum(ln["cents"] for ln in line_list)
        gpu = con.execute(
            "SELECT sum(billed_cost), sum(effective_cost), sum(list_cost), "
            "sum(billed_gpu_ms) FROM gpu_lines WHERE currency = ?", [ccy]).fetchone()
        non_gpu = side.non_gpu.get(ccy, [])
        commitments = side.commitments.get(ccy) or _commitments(con, ccy)
        all_total = side.totals.get(ccy, (None, 0))
        rates = con.execute(
            "SELECT instance, gpu_model, COALESCE(pricing_category, 'Standard'), "
            "sum(billed_gpu_ms), sum(billed_cost), sum(effective_cost), sum(list_cost), "
            "sum(lines) FROM gpu_lines WHERE currency = ? GROUP BY ALL ORDER BY 5 DESC, 1, 2, 3",
            [ccy]).fetchall()
        outside = [r for r in period_rows if r["billed"] == r["unallocated"]
                   and r["billed"] != "0.00"]
        if window is not None and outside:
            amount = sum((Decimal(str(r["unallocated"])) for r in outside), Decimal(0))
            out["notes"].append(
                f"{len(outside)} of {len(period_rows)} {ccy} charge periods have no measured GPU "
                f"time (telemetry covers {_iso(window[0])} .. {_iso(window[1])}): "
                f"{amount:,.2f} {ccy} of GPU cost in them is unallocated, not guessed")
        buckets = _buckets(side, ccy, cost, line_list, billed_cents)
        model_rates = side.model_rates.get(ccy, [])
        out["currencies"][ccy] = {
            "bill_total": _dec_usd(all_total[0] or Decimal(0), ccy),
            "bill_lines": int(all_total[1]),
            "gpu": {"billed": _dec_usd(gpu[0] or Decimal(0), ccy),
                    "effective": _dec_usd(gpu[1] or Decimal(0), ccy),
                    "list": _dec_usd(gpu[2] or Decimal(0), ccy),
                    "gpu_hours": round(int(gpu[3] or 0) / 3_600_000, 4)},
            "non_gpu": {
                "billed": _dec_usd(sum((r[2] for r in non_gpu), Decimal(0))),
                "lines": sum(int(r[5]) for r in non_gpu),
                "by_service": [{"service": r[0], "charge_category": r[1],
                                "billed": _dec_usd(r[2], ccy),
                                "effective": _dec_usd(r[3], ccy),
                                "list": _dec_usd(r[4], ccy), "lines": int(r[5])}
                               for r in non_gpu]},
            "commitments": commitments,
            "lines": [{"line": ln["line"], "kind": ln["kind"], "reason": ln["reason"],
                       "group": ln["group"], "amount": _usd(ln["cents"], ccy),
                       "gpu_hours": round(ln["gpu_hours"], 4),
                       "phases": {p: _usd(ln["phase_cents"].get(p, 0), ccy)
                                  for p in (*PHASE_COLS, "unobserved", PROVIDER_PHASE)
                                  if p in ln["phase_cents"]}}
                      for ln in line_list],
            "reconciliation": {
                "periods": len(c_periods),
                "every_period_exact": all_exact,
                "billed": _usd(billed_cents, ccy),
                "sum_of_lines": _usd(sum_lines, ccy),
                "difference": _usd(sum_lines - billed_cents, ccy),
                "exact_billed": str(Decimal(exact_units).scaleb(-12)),
            },
            "periods": period_rows,
            "rates": [_rate_row(r) for r in rates],
            "buckets": buckets,
            "model_rates": model_rates,
        }
    unmatched = con.execute(
        "SELECT resource_id, any_value(instance), currency, sum(billed_cost), "
        "sum(billed_gpu_ms) FROM gpu_lines WHERE no_data_reason = 'no telemetry for this node' "
        "GROUP BY resource_id, currency ORDER BY 4 DESC, 1, 3").fetchall()
    out["bill_without_telemetry"] = [
        {"resource_id": r[0], "instance": r[1], "currency": r[2],
         "billed": _dec_usd(r[3], r[2]),
         "billed_gpu_hours": round(int(r[4] or 0) / 3_600_000, 4)} for r in unmatched]
    out["provider_split"] = _provider_split(con, cost, keys)
    ps = out["provider_split"]
    if ps["lines"]:
        gpu_n = sum(x["lines"] for x in ps["targets"] if x["gpu"])
        out["notes"].append(
            f"{ps['lines']} line(s) split by the provider (FOCUS 1.3 Allocated*), {gpu_n} of "
            "them GPU lines: each went whole to what it names (AllocatedTags, else the "
            "allocated resource), not over the parent resource's measured time; see "
            "provider_split")
    if ps["ratio_note"]:
        out["notes"].append(ps["ratio_note"])
    out["overlaps"] = side.overlaps
    ov = out["overlaps"]
    if ov["resources"]:
        ex = ov["examples"][0]
        out["notes"].append(
            f"{ov['resources']} GPU resource(s) have usage lines of the same SKU whose charge "
            f"periods overlap without being equal (e.g. {ex['resource_id']}: "
            f"{ex['first']} and {ex['second']}): each line is split over its own period's "
            "measured time, so the same GPU-hour may be billed twice; check the export's "
            "granularity (hourly and daily lines of one resource)")
    out["duplicates"] = side.duplicates
    if out["duplicates"]["lines"]:
        d = out["duplicates"]
        out["notes"].append(
            f"{d['lines']} duplicate line(s) repeat another line exactly (same resource, SKU, period, "
            "category and cost): " + ", ".join(f"{v} {k}" for k, v in d["amount"].items())
            + "; kept and split as billed (a bill may repeat a line), check the export "
            "for a file read twice")
    billed_hosts = set(pairs.values())
    out["telemetry_without_bill"] = [h for h in hosts if h not in billed_hosts]
    return out


def _rate_row(r: tuple[Any, ...]) -> dict[str, Any]:
    hours = Decimal(int(r[3] or 0)) / Decimal(3_600_000)

    def per_h(x: Decimal | None) -> str | None:
        if x is None or hours == 0:
            return None
        return str((x / hours).quantize(Decimal("0.0001")))

    return {"instance": r[0], "gpu_model": r[1], "pricing_category": r[2],
            "gpu_hours": float(round(hours, 4)), "billed": _dec_usd(r[4]),
            "effective": _dec_usd(r[5]), "list": _dec_usd(r[6]), "lines": int(r[7]),
            "billed_per_gpu_hour": per_h(r[4]),
            "effective_per_gpu_hour": per_h(r[5]),
            "list_per_gpu_hour": per_h(r[6])}


_HOURS = (
    "CASE WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('hrs', 'hr', 'hours', 'hour', 'h') "
    "THEN b.quantity WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('seconds', 'second', "
    "'s') THEN b.quantity / 3600.0 WHEN b.charge_class = 'Correction' THEN 0 "
    "ELSE epoch(b.charge_end) / 3600.0 - epoch(b.charge_start) / 3600.0 END")

#: The lines a rate is read from: usage, with its corrections (ChargeClass Correction, a
#: negative ConsumedQuantity with its negative cost); never a credit, a refund (a negative
#: usage line that is no correction), a tax or a purchase.
RATE_LINES = ("b.charge_category = 'Usage' AND (b.charge_class = 'Correction' OR "
              "(b.billed_cost >= 0 AND b.effective_cost >= 0)) AND NOT " + ROLE_COMMIT)


def _model_rates(con: Any, ccy: str, *, cube: bool = False) -> list[dict[str, Any]]:
    """Per catalog GPU model, instance and pricing category: the usage lines' GPU-hours and
    costs net of their corrections (the one input of the rate rule, ``rates.py``). ``cube``:
    from ``bill_cube`` (:func:`bill_side`, the same sums per SKU) instead of the lines."""
    if cube:
        rows = con.execute(
            "SELECT s.gpu_model, s.instance, c.rate_pricing, sum(c.rate_gpu_hours), "
            "sum(c.billed_cost), sum(c.effective_cost), sum(c.list_cost), sum(c.n), "
            "sum(c.corrections) FROM bill_cube c JOIN gpu_skus s ON c.rate_sku = s.sku_text "
            "WHERE c.currency = ? GROUP BY ALL ORDER BY 1, 2, 3", [ccy]).fetchall()
    else:
        rows = con.execute(
            f"SELECT s.gpu_model, s.instance, COALESCE(b.pricing_category, 'Standard'), "
            f"sum(({_HOURS}) * (CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END)), "
            "sum(b.billed_cost), sum(b.effective_cost), sum(b.list_cost), count(*), "
            "count(*) FILTER (WHERE b.charge_class = 'Correction') "
            f"FROM bill_lines b JOIN gpu_skus s ON b.sku_text = s.sku_text "
            f"WHERE b.currency = ? AND {RATE_LINES} GROUP BY ALL ORDER BY 1, 2, 3",
            [ccy]).fetchall()
    return [{"gpu_model": r[0], "instance": r[1], "pricing_category": r[2],
             "gpu_hours": round(float(r[3] or 0), 6), "billed": str(r[4]),
             "effective": str(r[5]), "list": str(r[6]), "lines": int(r[7]),
             "corrections": int(r[8])} for r in rows]


def _commitments(con: Any, ccy: str) -> dict[str, Any]:
    """A commitment's purchases and unused part (FOCUS ``CommitmentDiscountId``, 1.3
    ``ContractApplied``) beside the usage it covers: FOCUS amortises the purchase
    (BilledCost, EffectiveCost 0) into the covered usage (BilledCost 0, EffectiveCost the
    amortised share), so each cost basis counts the commitment once."""
    rows = con.execute(
        "SELECT b.line_role, COALESCE(b.commitment_id, b.resource_id), count(*), "
        "sum(b.billed_cost), sum(b.effective_cost), sum(b.list_cost) FROM bill_lines b "
        f"WHERE b.currency = ? AND {ROLE_COMMIT} GROUP BY ALL ORDER BY 1, 2", [ccy]).fetchall()
    covered = con.execute(
        "SELECT count(*), sum(b.billed_cost), sum(b.effective_cost) FROM bill_lines b "
        "WHERE b.currency = ? AND b.charge_category = 'Usage' AND NOT " + ROLE_COMMIT +
        " AND (b.commitment_id IS NOT NULL OR b.contract_applied IS NOT NULL)",
        [ccy]).fetchone()
    return {
        "lines": [{"role": r[0], "commitment_id": r[1], "lines": int(r[2]),
                   "billed": _dec_usd(r[3], ccy), "effective": _dec_usd(r[4], ccy),
                   "list": _dec_usd(r[5], ccy)} for r in rows],
        "covered_usage": {"lines": int(covered[0]),
                          "billed": _dec_usd(covered[1] or Decimal(0), ccy),
                          "effective": _dec_usd(covered[2] or Decimal(0), ccy)},
    }


def _overlaps(con: Any) -> dict[str, Any]:
    """GPU usage lines of one resource and SKU whose charge periods overlap without being
    equal (an hourly and a daily line for the same hours): over the distinct periods of each
    resource, one starting before an earlier one ends.

    Sorting every resource's periods costs seconds on a 10M-line bill, so a grouping first
    finds the resources whose periods cannot overlap: all of one length ``d`` > 0 with starts
    equal modulo ``d`` (hourly lines on the hour), where two distinct periods start at least
    ``d`` apart. Only the other resources' periods are sorted."""
    usage = (f"{IS_GPU} AND b.charge_category = 'Usage' AND b.resource_id IS NOT NULL AND "
             "COALESCE(b.charge_class, '') <> 'Correction' AND b.line_role IS NULL")
    d = "(epoch_us(b.charge_end) - epoch_us(b.charge_start))"
    con.execute(
        "CREATE OR REPLACE TEMP TABLE overlap_candidates AS SELECT b.currency, "
        f"b.resource_id, b.sku_text FROM bill_lines b WHERE {usage} GROUP BY ALL HAVING NOT ("
        f"min({d}) > 0 AND min({d}) = max({d}) AND "
        f"min(epoch_us(b.charge_start) % NULLIF({d}, 0)) = "
        f"max(epoch_us(b.charge_start) % NULLIF({d}, 0)))")
    rows = []
    if con.execute("SELECT count(*) FROM overlap_candidates").fetchone()[0]:
        rows = con.execute(
            "WITH p AS (SELECT DISTINCT b.currency, b.resource_id, b.sku_text, b.charge_start, "
            f"b.charge_end FROM bill_lines b JOIN overlap_candidates c ON c.currency IS NOT "
            "DISTINCT FROM b.currency AND c.resource_id = b.resource_id AND c.sku_text = "
            f"b.sku_text WHERE {usage}), w AS (SELECT *, max(charge_end) OVER (PARTITION BY "
            "currency, resource_id, sku_text ORDER BY charge_start, charge_end ROWS BETWEEN "
            "UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end, lag(charge_start) OVER "
            "(PARTITION BY currency, resource_id, sku_text ORDER BY charge_start, charge_end) "
            "AS prev_start FROM p) SELECT resource_id, prev_start, prev_end, charge_start, "
            "charge_end FROM w WHERE prev_end > charge_start ORDER BY resource_id, charge_start"
        ).fetchall()
    res = sorted({r[0] for r in rows})
    ex = []
    for rid in res[:5]:
        r = next(x for x in rows if x[0] == rid)
        ex.append({"resource_id": rid, "first": f"[{_iso(r[1])} .. {_iso(r[2])})",
                   "second": f"[{_iso(r[3])} .. {_iso(r[4])})"})
    return {"resources": len(res), "periods": len(rows), "examples": ex}


def _duplicates(con: Any) -> dict[str, Any]:
    """Lines repeating another exactly (every canonical column but the file and row)."""
    cols = [c for c, _t in CANONICAL if c not in ("src_file", "src_row")]
    # grouping 10M lines by every column costs seconds; a 64-bit hash of the columns that
    # tell lines apart (equal lines hash equal; NULL hashes alike) finds the candidates (a
    # sort of the hashes: ~0.1 s per 10M, where DuckDB's grouping of 10M distinct hashes
    # takes seconds), and the exact grouping then runs on those lines only (none, in a bill
    # without duplicates)
    h = "hash(resource_id, sku_text, charge_start, charge_end, charge_category, billed_cost)"
    hashes = np.sort(con.execute(f"SELECT {h} AS h FROM bill_lines").fetchnumpy()["h"])
    repeated = np.unique(hashes[1:][hashes[1:] == hashes[:-1]])
    del hashes
    rows = []
    if repeated.size:
        con.register("duplicate_hashes_arrow", pa.table({"h": pa.array(repeated, pa.uint64())}))
        try:
            rows = con.execute(
                f"SELECT currency, sum(n - 1), sum((n - 1) * billed_cost), count(*) FROM ("
                f"SELECT {', '.join(cols)}, count(*) AS n FROM bill_lines "
                f"WHERE {h} IN (SELECT h FROM duplicate_hashes_arrow) GROUP BY ALL "
                "HAVING count(*) > 1) GROUP BY currency ORDER BY currency").fetchall()
        finally:
            con.unregister("duplicate_hashes_arrow")
    return {"lines": int(sum(int(r[1]) for r in rows)), "groups": int(sum(r[3] for r in rows)),
            "amount": {str(r[0]): _dec_usd(r[2], str(r[0])) for r in rows}}


def _buckets(side: BillSide, ccy: str, cost: str, lines: Sequence[Mapping[str, Any]],
             gpu_cents: int) -> dict[str, Any]:
    """Every line of one currency in exactly one bucket; the buckets sum to the invoice
    (the sum of the cost basis over all lines, rounded once) to the cent.

    GPU lines are split (team, idle, unallocated; a credit or refund on a GPU line is split
    like that line; a line the provider split goes to what it names); the other lines go
    whole to ``commitment`` (a commitment's purchase or unused part, FOCUS
    ``CommitmentDiscountId`` / ``ContractApplied``), ``tax``, ``credit`` (credits and
    negative non-GPU amounts), ``non_gpu`` (usage, purchases, adjustments of other services)
    or ``rejected`` (a line with no cost, or a commitment purchase whose EffectiveCost is
    already amortised into its usage, with the reason)."""
    # the sums over the bill's lines: bill_side (the queries, and why a commitment's
    # purchase may be rejected, are there)
    kinds = side.bucket_kinds.get(ccy, [])
    gpu = side.bucket_gpu.get(ccy, (0, 0))
    other = {k: (int(n), int(u)) for k, n, u in kinds}
    reasons = []
    if "rejected" in other:
        reasons.append(f"{other['rejected'][0]} line(s) with no amount in the cost column")
    if "rejected_twice" in other:
        reasons.append(f"{other['rejected_twice'][0]} commitment purchase(s) whose "
                       "EffectiveCost is already amortised into the usage of the same "
                       "commitment (FOCUS: a purchase's EffectiveCost is 0); not counted twice")
        n0, u0 = other.pop("rejected_twice")
        n1, u1 = other.get("rejected", (0, 0))
        other["rejected"] = (n0 + n1, u0 + u1)
    names = ["non_gpu", "commitment", "tax", "credit", "rejected"]
    total_units = int(gpu[1]) + sum(u for _n, u in other.values())
    per = units_per_minor(ccy)
    total = cents_of_units(total_units, per)
    rest = split_cents([other.get(k, (0, 0))[1] for k in names], total - gpu_cents, per)
    split = {"team": 0, "idle": 0, "unallocated": 0}
    for ln in lines:
        split[ln["kind"]] += int(ln["cents"])
    out: dict[str, Any] = {k: {"amount": _usd(v, ccy), "lines": None}
                           for k, v in split.items()}
    for k, c in zip(names, rest):
        out[k] = {"amount": _usd(c, ccy), "lines": other.get(k, (0, 0))[0]}
    out["rejected"]["reason"] = "; ".join(reasons) or None
    n_lines = int(gpu[0]) + sum(n for n, _u in other.values())
    return {"buckets": out, "gpu_lines": int(gpu[0]), "lines": n_lines,
            "invoice_total": _usd(total, ccy),
            "sum_of_buckets": _usd(sum(split.values()) + sum(rest), ccy),
            "cost_basis": cost}


def units_to_decimal(units: int) -> Decimal:
    return Decimal(units) / UNITS_PER_USD
