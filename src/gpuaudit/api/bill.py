"""``gpuaudit.bill(...)``: a cloud bill split over the GPU time measured, reconciled."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpuaudit.api.compose import Report, assemble, group_keys, open_source
from gpuaudit.classify import classify
from gpuaudit.price.billing.budgets import load_budgets

if TYPE_CHECKING:  # loaded where used: `import gpuaudit.api` stays light (issue 27)
    import pyarrow as pa

    from gpuaudit.price.billing.allocate import BillSide
    from gpuaudit.price.billing.readers import Bill
    from gpuaudit.schema import Recording, SampleSource

__all__ = ["BillReport", "bill", "compare_bills", "load_budgets"]


@dataclass(frozen=True)
class BillReport(Report):
    """What :func:`bill` returns: the :class:`Report` (priced at the bill's real rates) with
    ``extra["bill"]`` (the reconciled split, docs/json-schema.md) and ``showback``: one row
    per charge period, currency, line and phase, ``amount`` in whole cents (Arrow table)."""

    showback: pa.Table | None = None


def bill(
    bill_path: str | Path | Sequence[str | Path],
    *,
    telemetry: SampleSource | Recording | pa.Table | str | Path | None = None,
    prometheus: str | None = None,
    by: str | Sequence[str] | None = ("team",),
    method: str = "allocation",
    fmt: str | None = None,
    cost: str = "billed",
    budgets: str | Path | None = None,
    map_file: str | Path | None = None,
    matchers: Mapping[str, str] | None = None,
    step_s: float | None = None,
    client_kwargs: Mapping[str, Any] | None = None,
    host_aliases: Mapping[str, str] | None = None,
    catalog: str | Path | None = None,
    workers: int | None = None,
    today: Any = None,
    sql_dir: str | Path | None = None,
    timeline: bool = True,
    sql_dialect: str = "duckdb",
    engine: str = "duckdb",
    spark: Any = None,
    spark_master: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    memory_limit: int | str | None = None,
) -> BillReport:
    """Read a cloud bill and split it over the GPU time measured in ``telemetry`` (a file,
    table or sample source) or in the fleet at ``prometheus``, by the ``by`` keys.

    ``method``: ``allocation`` (who held the GPU pays for all of it) or ``usage`` (who kept
    it busy pays for the non-idle phases; a team's idle time goes to ``idle``). ``fmt``:
    ``focus``, ``cur`` or ``gcp`` (detected by columns when None). ``cost``: which of the
    bill's costs is split: ``billed`` (the invoice), ``effective`` or ``list``. ``budgets``: a
    TOML of monthly budgets (docs/billing.md). ``sql_dir``: write the join's inputs and SQL
    there (to run it in Athena, Trino or BigQuery). ``timeline``: also fold the per-GPU
    utilization timeline of the core report (telemetry files only). ``sql_dialect``: the
    dialect of that SQL (duckdb, spark, trino, bigquery). ``engine``: where the join runs,
    ``duckdb`` or ``spark`` (on the session ``spark``, else the active or a local one; the
    report is the same). ``spark_master`` and ``spark_conf``: with no ``spark``, the master
    URL (``yarn``, ``spark://host:7077``, ``local[4]``, ..) and settings of the session made
    for the join (when no session is active). ``memory_limit``: the most memory DuckDB
    holds (bytes or ``"4GB"``; default 80 % of the memory available when the bill is
    opened); past it, it spills to disk. Every charge period's lines sum to its billed cost
    to the cent; see
    ``extra["bill"]["currencies"][ccy]["reconciliation"]``.
    """
    from datetime import datetime, timezone

    from gpuaudit.classify.phases import group_key_names
    from gpuaudit.errors import InputError
    from gpuaudit.price.attribution import coarse_usage, load_mapping
    from gpuaudit.price.billing import open_bill
    from gpuaudit.price.billing.allocate import HOUR_KEY, allocate, usage_hours
    from gpuaudit.price.billing.rates import bill_rates, with_mig_models

    if (telemetry is None) == (prometheus is None):
        raise InputError("give the measured GPU time: either --telemetry FILE or "
                         "--prometheus URL", fix="gpuaudit bill BILL --telemetry run.parquet")
    if (spark_master is not None or spark_conf) and engine != "spark":
        raise InputError("spark_master and spark_conf set up the session of engine='spark'",
                         fix="add --engine spark")
    if method not in ("allocation", "usage"):
        raise InputError(f"unknown method {method!r}", fix="use --method allocation or usage")
    if cost not in ("billed", "effective", "list"):
        raise InputError(f"unknown cost {cost!r}", fix="use billed, effective or list")
    if engine == "spark" and spark is None and (spark_master is not None or spark_conf):
        from gpuaudit.price.billing.sql.engines import spark_session

        spark = spark_session(spark_master or "local[2]", conf=spark_conf)
    # by=None: no grouping (one line per charge); an empty sequence keeps the default, team
    keys = group_key_names(() if by is None else group_keys(by) or ("team",))
    names = [k[6:] if k.startswith("label:") else k for k in keys]
    fine = tuple(dict.fromkeys([*keys, "pod"]))
    # the bill is read, checked and summed (what needs no telemetry) in a second thread
    # while the telemetry is classified: DuckDB works outside the interpreter lock (the
    # join's sums per charge period, which need the bill alone, are not made there: on 2
    # cores that took CPU from classify and lengthened the command; docs/benchmarks.md)
    bill_f = _in_thread(lambda: _open(
        open_bill(bill_path, fmt=fmt, memory_limit=memory_limit), cost))
    if telemetry is not None:
        try:
            source = open_source(telemetry)
            if map_file is not None:
                # the fleet's attribution rules (pod labels, the mapping file), as
                # `gpuaudit fleet --recording` applies them; needs the table in memory
                from gpuaudit.measure.files import read_samples
                from gpuaudit.price.attribution import Attributor, attribute_table
                from gpuaudit.schema import Recording

                rec = source if isinstance(source, Recording) else read_samples(telemetry) \
                    if isinstance(telemetry, (str, Path)) else None
                if rec is None:
                    raise InputError("--map-file with a streamed sample source",
                                     fix="give a recording file or a Recording")
                source = dc_replace(rec, table=attribute_table(
                    rec.table, Attributor(load_mapping(map_file), {})))
            usage_h = classify(source, by=(*fine, HOUR_KEY), workers=workers,
                               timeline=timeline)
        except BaseException:
            bill_f.result()  # a bad bill is the error to report first, as it always was
            raise
        opened, side = bill_f.result()
        window = (usage_h.window_start, usage_h.window_end)
    else:
        assert prometheus is not None
        opened, side = bill_f.result()
        # (fetchall: fetchone would leave the result open, and DuckDB refuses the next
        # register on the connection until it is finished)
        span = opened.con.execute(
            "SELECT min(charge_start), max(charge_end) FROM bill_lines").fetchall()[0]
        if span[0] is None:
            raise InputError("the bill has no lines", where=opened.origin,
                             fix="give a bill export with usage lines")
        start_s, end_s = span[0].timestamp(), span[1].timestamp()
        step = step_s or 60.0
        mapping = load_mapping(map_file) if map_file else None
        fleet_fine = tuple(dict.fromkeys([*keys, "namespace", "pod"]))
        from gpuaudit.api.fleet import fleet_usage

        usage_f, hourly, _util, _transfer = fleet_usage(
            prometheus, start_s=start_s - step, end_s=end_s, step_s=step_s, by=fleet_fine,
            mapping=mapping, matchers=matchers, client_kwargs=client_kwargs, chunk_s=3600.0)
        if hourly is None:
            raise InputError("no dcgm-exporter series in the bill's period", where=prometheus,
                             fix="check the bill's dates and --match")
        usage_h = dc_replace(usage_f, cells=hourly.append_column(
            HOUR_KEY, _epoch_text(hourly.column("day_start"))))
        window = (datetime.fromtimestamp(start_s, tz=timezone.utc),
                  datetime.fromtimestamp(end_s, tz=timezone.utc))
    if window[0] is None or window[1] is None:
        raise InputError("the telemetry has no samples", fix="give a recording with samples")
    hours = usage_hours(usage_h.cells, list(keys))
    alloc = allocate(opened, hours, names, method=method, cost=cost,
                     window=(window[0], window[1]), host_aliases=host_aliases,
                     sql_dir=sql_dir, sql_dialect=sql_dialect, engine=engine, spark=spark,
                     side=side)
    summary = alloc.summary
    usage = coarse_usage(with_mig_models(usage_h), keys)
    rates = bill_rates(usage, summary, catalog=catalog)
    if budgets is not None:
        from gpuaudit.price.billing.budgets import budget_status, load_budgets

        summary["budgets"] = budget_status(load_budgets(budgets), alloc.showback, names,
                                           today=today)
    rep = assemble(usage, rates, extra={"bill": summary})
    from gpuaudit.price.billing.explain import explain_audit

    summary["audit_reconciliation"] = explain_audit(summary, rep.cost, usage)
    from dataclasses import fields

    return BillReport(**{f.name: getattr(rep, f.name) for f in fields(rep)},
                      showback=alloc.showback)


T = TypeVar("T")


def _in_thread(work: Callable[[], T]) -> Future[T]:
    """``work()`` in a thread of its own; its result (or its error) in the future."""
    fut: Future[T] = Future()

    def run() -> None:
        try:
            fut.set_result(work())
        except BaseException as exc:  # handed to the caller through the future
            fut.set_exception(exc)

    threading.Thread(target=run, name="gpuaudit-bill-read", daemon=True).start()
    return fut


def _open(opened: Bill, cost: str) -> tuple[Bill, BillSide]:
    from gpuaudit.price.billing.allocate import bill_side

    return opened, bill_side(opened, cost=cost)


def _epoch_text(ts: Any) -> pa.Array:
    """Hourly chunk starts as the hour they cover, epoch seconds in text (classify's
    ``period:3600`` values). The pushdown's chunks start one scrape step after the range's
    start, so a chunk starting at 09:59:15 is the 10:00 hour: rounded to the nearest hour."""
    import pyarrow as pa
    import pyarrow.compute as pc

    secs = pc.divide(pc.cast(pc.cast(ts, pa.timestamp("ns", tz="UTC")), pa.int64()),
                     1_000_000_000)
    hour = pc.multiply(pc.divide(pc.add(secs, 1800), 3600), 3600)
    return pc.cast(hour, pa.string())


_BILL_SUFFIXES = (".csv", ".csv.gz", ".csv.zst", ".parquet", ".parq")


def _is_bill(p: Path) -> bool:
    return p.is_dir() or p.name.lower().endswith(_BILL_SUFFIXES)


def compare_bills(last: str | Path, this: str | Path, *,
                  telemetry: str | Path | Sequence[str | Path] | None = None,
                  by: str | Sequence[str] | None = ("team",)) -> dict[str, Any]:
    """Realised savings: per team and per remediation, what last month's bill report
    projected and what this month's bill shows (:mod:`gpuaudit.price.billing.compare`).

    ``last`` and ``this``: JSON reports of :func:`bill` (as ``gpuaudit bill --format json``
    writes them) or the bills themselves (a FOCUS/CUR/GCP file or folder), split here over
    ``telemetry`` (one recording for both, or one per bill, in order) by ``by``."""
    import json

    from gpuaudit.errors import InputError
    from gpuaudit.price.billing.compare import compare_reports

    paths = [Path(last), Path(this)]
    tels: list[str | Path] = [] if telemetry is None else (
        [telemetry] if isinstance(telemetry, (str, Path)) else list(telemetry))
    if len(tels) > 2:
        raise InputError(f"{len(tels)} telemetry files for two bills",
                         fix="give one recording for both bills, or one per bill in order")
    docs = []
    for i, p in enumerate(paths):
        if _is_bill(p):
            if not tels:
                raise InputError("comparing bills needs the measured GPU time", where=str(p),
                                 fix="add --telemetry RECORDING (one for both bills, or one "
                                 "per bill), or compare two reports of gpuaudit bill "
                                 "--format json")
            tel = tels[min(i, len(tels) - 1)]
            docs.append(json.loads(json.dumps(bill(p, telemetry=tel, by=by).to_dict())))
            continue
        try:
            docs.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"cannot read the JSON report: {exc}", where=str(p),
                             fix="give reports written by gpuaudit bill --format json, or "
                             "the bills themselves (.csv, .csv.gz, .parquet) with "
                             "--telemetry") from None
    return compare_reports(docs[0], docs[1], last_name=paths[0].name,
                           this_name=paths[1].name)
