"""The Python API: ``gpuaudit.audit(samples, ...)`` runs every stage and returns the result.

Each stage is also callable alone: :func:`gpuaudit.classify.classify`,
:func:`gpuaudit.price.price_usage`, :func:`gpuaudit.recommend.recommend`,
:func:`gpuaudit.report.render`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gpuaudit.classify import Usage, check_health, classify, diagnose
from gpuaudit.classify.diagnose import job_diagnoses
from gpuaudit.price import price_usage, resolve_rates
from gpuaudit.price.catalog import Rate
from gpuaudit.recommend import Finding, recommend
from gpuaudit.result import AuditResult
from gpuaudit.schema import Recording, SampleSource

if TYPE_CHECKING:
    from gpuaudit.capacity.queue import QueueReport

__all__ = ["QueueAudit", "Report", "assemble", "audit", "audit_fleet", "audit_queue", "bill",
           "fleet_usage", "local_kpis", "open_source", "rates_for"]


class Report(AuditResult):
    """What :func:`audit` returns: the :class:`~gpuaudit.result.AuditResult` plus rendering."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON report as a dict (schema: docs/json-schema.md)."""
        from gpuaudit.report.json import to_dict

        return to_dict(self)

    def render(self, fmt: str = "terminal", *, width: int = 100, color: bool = False) -> str:
        """The report as text in ``fmt``: terminal, json, markdown or html."""
        from gpuaudit.report import render

        return render(self, fmt, width=width, color=color)

    def __str__(self) -> str:
        return self.render("terminal")


def open_source(
    samples: SampleSource | Recording | pa.Table | str | Path,
    *,
    mapping: Mapping[str, str] | None = None,
    fields: Sequence[str] | None = None,
    host: str | None = None,
    gpu_model: str | None = None,
    tz: str = "UTC",
) -> SampleSource | Recording:
    """Turn a path (Parquet, CSV, JSONL, nvidia-smi log) or a table into a sample source."""
    if isinstance(samples, (str, Path)):
        from gpuaudit.measure.files import open_samples

        return open_samples(samples, mapping=mapping, fields=fields, host=host,
                            gpu_model=gpu_model, tz=tz)
    if isinstance(samples, pa.Table):
        return Recording(table=samples, source="table", origin="an in-memory sample table")
    return samples


def audit(
    samples: SampleSource | Recording | pa.Table | str | Path,
    *,
    by: Sequence[str] = (),
    gpu_model: str | None = None,
    price: Decimal | str | float | None = None,
    provider: str | None = None,
    purchase: str = "on-demand",
    catalog: str | Path | None = None,
    counts: Mapping[str, int | float | Decimal] | None = None,
    energy_usd_per_kwh: Decimal | str | float | None = None,
    findings: Iterable[Finding] = (),
    interval_s: float | None = None,
    cap_intervals: float | None = None,
    mapping: Mapping[str, str] | None = None,
    fields: Sequence[str] | None = None,
    host: str | None = None,
    tz: str = "UTC",
    extra: Mapping[str, Any] | None = None,
    workers: int | None = None,
) -> Report:
    """Classify, price and recommend in one call.

    ``samples``: a path, a :class:`~gpuaudit.schema.Recording`, a sample source or a sample
    table. Pricing: ``price`` (USD per GPU-hour) > ``catalog`` (TOML) > the embedded catalog
    for ``gpu_model`` (or the model the samples name) at ``provider`` (default aws) and
    ``purchase`` (on-demand, spot, committed). ``by``: group keys (pod, namespace, team, ...).
    ``counts``: units of work for unit costs (``{"tokens": 2e9}``). ``workers``: processes
    for a large gpuaudit recording (None: one per core; see :func:`gpuaudit.classify.classify`).
    """
    source = open_source(samples, mapping=mapping, fields=fields, host=host,
                         gpu_model=gpu_model, tz=tz)
    finding_list = tuple(findings)
    kwargs: dict[str, Any] = {}
    if cap_intervals is not None:
        kwargs["cap_intervals"] = cap_intervals
    extras = dict(extra or {})
    want_timeline = "timeline" not in extras  # the exporter passes {"timeline": None}: none
    usage = classify(source, by=by, interval_s=interval_s, findings=finding_list,
                     workers=workers, timeline=want_timeline, **kwargs)
    rates = rates_for(usage, gpu_model=gpu_model, price=price, provider=provider,
                      purchase=purchase, catalog=catalog)
    if want_timeline and usage.timeline is not None:
        extras["timeline"] = usage.timeline.to_dict()
    return assemble(usage, rates, counts=counts, energy_usd_per_kwh=energy_usd_per_kwh,
                    findings=finding_list, extra=extras)


def rates_for(
    usage: Usage,
    *,
    gpu_model: str | None = None,
    price: Decimal | str | float | None = None,
    provider: str | None = None,
    purchase: str = "on-demand",
    catalog: str | Path | None = None,
) -> Mapping[str | None, Rate]:
    """The rate of every GPU model in ``usage`` (see :func:`gpuaudit.price.resolve_rates`)."""
    models = {s.gpu_model for s in usage.series} or {None}
    return resolve_rates(models, gpu_model=gpu_model, price=price, provider=provider,
                         purchase=purchase, catalog=catalog)


def assemble(
    usage: Usage,
    rates: Mapping[str | None, Rate],
    *,
    counts: Mapping[str, int | float | Decimal] | None = None,
    energy_usd_per_kwh: Decimal | str | float | None = None,
    findings: Iterable[Finding] = (),
    extra: Mapping[str, Any] | None = None,
) -> Report:
    """The pipeline after classification, composed once: price -> diagnose -> recommend.

    Every entry point ends here, whatever measured the usage: a file or live recording
    (:func:`audit`), a Prometheus pushdown or raw pull (the fleet audit and its per-group
    advice), a profiler trace (``gpuaudit trace``), the live exporter. A new capability that
    needs "the report for this usage" calls this rather than writing the stages out again.
    """
    finding_list = tuple(findings)
    cost = price_usage(usage, rates, counts=counts, energy_usd_per_kwh=energy_usd_per_kwh)
    diagnoses = diagnose(usage.series, usage.patterns)
    plan = recommend(usage, cost, diagnoses, finding_list)
    return Report(usage=usage, cost=cost, plan=plan, diagnoses=diagnoses,
                  health=check_health(usage.series), extra=dict(extra or {}),
                  job_diagnoses=job_diagnoses(usage.series, diagnoses))


def _fleet_advice(usage: Usage, rates: Mapping[str | None, Rate], keys: Sequence[str], top: int,
            pricing: Mapping[str, Any]) -> dict[tuple[str | None, ...], list[dict[str, Any]]]:
    """The recommender run on each of the ``top`` costliest groups alone."""

    from gpuaudit.price.attribution import cells_of_group
    from gpuaudit.price.cost import cost_lines

    out: dict[tuple[str | None, ...], list[dict[str, Any]]] = {}
    cells = usage.cells
    for line in cost_lines(cells, rates, keys)[:top]:
        key = line.key
        sub_cells = cells_of_group(cells, keys, key)
        gpus = set(sub_cells.column("gpu_uuid").to_pylist())
        series = tuple(s for s in usage.series if s.gpu_uuid in gpus)
        patterns = tuple(p for p in usage.patterns if p.gpu_uuid in gpus)
        sub = dc_replace(usage, cells=sub_cells, series=series, patterns=patterns)
        plan = assemble(sub, rates, energy_usd_per_kwh=pricing.get("energy_usd_per_kwh")).plan
        recs = sorted(plan.recommendations, key=lambda r: -r.monthly_usd)[:3]
        out[tuple(key)] = [{"id": r.id, "title": r.remediation.title,
                            "monthly_usd": str(r.monthly_usd.quantize(Decimal("0.01"))),
                            "evidence": r.evidence, "counted": r.counted} for r in recs]
    return out


def audit_fleet(
    *,
    prometheus: str | None = None,
    recording: str | Path | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    since_s: float = 7 * 86400.0,
    step_s: float | None = None,
    by: Sequence[str] = ("team",),
    map_file: str | Path | None = None,
    matchers: Mapping[str, str] | None = None,
    raw: bool = False,
    client_kwargs: Mapping[str, Any] | None = None,
    chunk_s: float = 86400.0,
    pricing: Mapping[str, Any] | None = None,
    advice_groups: int = 10,
    findings: Iterable[Finding] = (),
) -> Report:
    """Audit a fleet and return a :class:`Report` whose ``extra["fleet"]`` holds the
    showback, KPIs and histograms (see report/fleet.py): the fleet's usage from Prometheus
    (:func:`fleet_usage`, pushdown or raw) or a ``gpuaudit scrape`` recording, attributed to
    teams, rolled up by ``by``, then :func:`assemble`, plus the recommender run on each of the
    ``advice_groups`` costliest groups alone."""
    from gpuaudit.classify.phases import group_key_names, unmatched_group_notes
    from gpuaudit.errors import InputError
    from gpuaudit.price.attribution import (
        Attributor,
        attribute_table,
        coarse_usage,
        fleet_summary,
        load_mapping,
    )
    from gpuaudit.validate import (
        EPOCH_S,
        FLEET_CHUNK_S,
        FLEET_SINCE_S,
        FLEET_STEP_S,
        PRICE_USD_PER_GPU_HOUR,
    )

    pricing = dict(pricing or {})
    if pricing.get("price") is not None:
        pricing["price"] = PRICE_USD_PER_GPU_HOUR.check_decimal(pricing["price"], "price")
    since_s = FLEET_SINCE_S.check(since_s, "since_s")
    chunk_s = FLEET_CHUNK_S.check(chunk_s, "chunk_s")
    if step_s is not None:
        step_s = FLEET_STEP_S.check(step_s, "step_s")
    start_s = None if start_s is None else EPOCH_S.check(start_s, "start_s")
    end_s = None if end_s is None else EPOCH_S.check(end_s, "end_s")
    mapping = load_mapping(map_file) if map_file else None
    user_keys = group_key_names(list(by) or ["team"])
    fine_keys = tuple(dict.fromkeys([*user_keys, "namespace", "pod"]))
    transfer: dict[str, Any] = {}
    util_window: dict[str, float | None] = {}
    daily: pa.Table | None = None
    if (prometheus is None) == (recording is None):
        raise InputError("give either --prometheus URL or --recording PATH",
                         fix="gpuaudit fleet --prometheus http://prom:9090 --since 7d")
    if recording is not None:
        from gpuaudit.measure.files import read_samples

        rec = read_samples(recording)
        table = attribute_table(rec.table, Attributor(mapping, {}))
        usage_fine = classify(dc_replace(rec, table=table), by=fine_keys)
        daily, util_window = local_kpis(table, fine_keys, usage_fine.interval_s)
        transfer = {"mode": "recording", "path": str(recording)}
    else:
        assert prometheus is not None
        usage_fine, daily, util_window, transfer = fleet_usage(
            prometheus, start_s=start_s, end_s=end_s, since_s=since_s, step_s=step_s,
            by=fine_keys, mapping=mapping, matchers=matchers, raw=raw,
            client_kwargs=client_kwargs, chunk_s=chunk_s)
    usage = coarse_usage(usage_fine, user_keys)
    # the fine keys (namespace, pod) are this composition's, not the user's: only --by keys
    # no series has are noted
    usage = dc_replace(usage, notes=(*(n for n in usage.notes if n.where != "--by"),
                                  *unmatched_group_notes(usage.cells, user_keys, None)))
    rates = rates_for(usage, gpu_model=pricing.get("gpu_model"), price=pricing.get("price"),
                      provider=pricing.get("provider"),
                      purchase=pricing.get("purchase", "on-demand"),
                      catalog=pricing.get("catalog"))
    advice = _fleet_advice(usage_fine, rates, list(user_keys), advice_groups, pricing)
    fleet = fleet_summary(usage_fine, rates, group_keys=user_keys, daily=daily,
                          util_window_pct=util_window, advice=advice, transfer=transfer)
    return assemble(usage, rates, counts=pricing.get("counts"),
                    energy_usd_per_kwh=pricing.get("energy_usd_per_kwh"),
                    findings=findings, extra={"fleet": fleet})


@dataclass(frozen=True)
class QueueAudit:
    """What :func:`audit_queue` returns: the waits, the fleet audit of the same range with the
    scheduling finding in (None without ``plan``), and the findings given to it."""

    queue: QueueReport
    report: Report | None
    findings: tuple[Finding, ...]


def audit_queue(
    prometheus: str,
    *,
    start_s: float,
    end_s: float,
    step_s: float = 60.0,
    namespaces: Sequence[str] = (),
    client_kwargs: Mapping[str, Any] | None = None,
    pricing: Mapping[str, Any] | None = None,
    plan: bool = True,
) -> QueueAudit:
    """Queue waits of pods requesting GPUs (kube-state-metrics) beside the idle GPUs, and with
    ``plan`` the fleet audit of the same range (:func:`audit_fleet`) with the scheduling
    finding in: the GPU-hours idle and held by no pod while GPU pods waited, priced at each
    model's rate as a share of the audit's observed cost. The recommender counts it in the
    idle group, capped by the idle cost the audit measured."""
    from gpuaudit.capacity.queue import idle_while_waiting_usd, queue_waits
    from gpuaudit.measure.fleet.prometheus import PromClient
    from gpuaudit.recommend.rules import QUEUE_SIGNAL
    from gpuaudit.units import duration

    with PromClient(prometheus, **dict(client_kwargs or {})) as client:
        q = queue_waits(client, start_s=start_s, end_s=end_s, step_s=step_s,
                        namespaces=namespaces)
    if not plan:
        return QueueAudit(q, None, ())
    if not q.saw_dcgm:
        return QueueAudit(dc_replace(q, notes=(
            *q.notes, "no recommendations: no GPU was idle in the range (or no dcgm-exporter "
            "series), so there is no scheduling finding; gpuaudit fleet audits the rest")),
            None, ())
    base = audit_fleet(prometheus=prometheus, start_s=start_s, end_s=end_s, by=("namespace",),
                       client_kwargs=client_kwargs, pricing=pricing, advice_groups=0)
    usd = idle_while_waiting_usd(q, base.cost.rates)
    observed = base.cost.total.observed_cost
    if usd <= 0 or observed <= 0:
        return QueueAudit(q, base, ())
    p95 = max((n.p95_s for n in q.namespaces if n.waits), default=0.0)
    finding = Finding(
        QUEUE_SIGNAL, float(usd / observed),
        f"queue: {q.idle_unheld_while_waiting_gpu_hours:.1f} GPU-hours idle and held by no pod "
        f"while GPU pods waited ({q.total_waits} waits, longest p95 {duration(p95)}): "
        f"${usd:.2f} of ${observed:.2f} observed",
        source="capacity")
    pricing = dict(pricing or {})
    return QueueAudit(q, assemble(base.usage, base.cost.rates, counts=pricing.get("counts"),
                                  energy_usd_per_kwh=pricing.get("energy_usd_per_kwh"),
                                  findings=(finding,), extra=base.extra), (finding,))


def fleet_usage(
    prometheus: str,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
    since_s: float = 7 * 86400.0,
    step_s: float | None = None,
    by: Sequence[str] = (),
    mapping: Any = None,
    matchers: Mapping[str, str] | None = None,
    raw: bool = False,
    client_kwargs: Mapping[str, Any] | None = None,
    chunk_s: float = 86400.0,
) -> tuple[Usage, pa.Table | None, dict[str, float | None], dict[str, Any]]:
    """Measured GPU time of a fleet in a Prometheus-compatible store: the classification
    pushed down as PromQL (``raw``: samples pulled and classified here), attributed by pod
    labels and ``mapping`` (a :class:`~gpuaudit.price.attribution.MappingFile`).

    Returns the :class:`Usage` over ``by`` (group keys, e.g. team, namespace, pod), the cells
    per chunk of ``chunk_s`` (column ``day_start``: the chunk's start), the fleet's mean
    utilization over the last 1 h and 24 h, and what crossed the wire. ``gpuaudit fleet`` and
    ``gpuaudit bill --prometheus`` (hourly chunks) both read the fleet so.
    """
    import time

    from gpuaudit.classify.pushdown import pull_aggregates, usage_from_pushdown
    from gpuaudit.errors import InputError
    from gpuaudit.measure.fleet.dcgm import series_id
    from gpuaudit.measure.fleet.prometheus import (
        PromClient,
        PrometheusSource,
        detect_interval_s,
        pod_labels,
    )
    from gpuaudit.price.attribution import Attributor, attribute_table
    from gpuaudit.validate import EPOCH_S, FLEET_CHUNK_S, FLEET_SINCE_S, FLEET_STEP_S

    since_s = FLEET_SINCE_S.check(since_s, "since_s")
    chunk_s = FLEET_CHUNK_S.check(chunk_s, "chunk_s")
    step_s = None if step_s is None else FLEET_STEP_S.check(step_s, "step_s")
    start_s = None if start_s is None else EPOCH_S.check(start_s, "start_s")
    end_s = None if end_s is None else EPOCH_S.check(end_s, "end_s")
    fine_keys = tuple(by)
    daily: pa.Table | None = None
    client = PromClient(prometheus, **dict(client_kwargs or {}))
    try:
        end = end_s if end_s is not None else time.time()
        start = start_s if start_s is not None else end - since_s
        if end <= start:
            raise InputError("the range is empty (--end is not after --start)",
                             fix="give --since, or --start before --end")
        step = step_s or detect_interval_s(client, end_s=end, start_s=start,
                                           matchers=matchers)
        if step is None:
            raise InputError(
                "no dcgm-exporter series (DCGM_FI_DEV_GPU_UTIL or "
                f"DCGM_FI_PROF_GR_ENGINE_ACTIVE) has samples between {_iso(start)} and "
                f"{_iso(end)}", where=prometheus, fix="check --start/--end/--since and --match")
        step = float(step)
        start = (start // step + 1) * step
        end = (end // step) * step
        kube = pod_labels(client, start_s=start, end_s=end)
        attributor = Attributor(mapping, kube)
        if raw:
            src = PrometheusSource(client, start_s=start, end_s=end, step_s=step,
                                   matchers=matchers)
            batches = list(src.batches())
            from gpuaudit.schema import SAMPLE_SCHEMA, Recording

            table = pa.Table.from_batches(batches, schema=SAMPLE_SCHEMA)
            table = attribute_table(table, attributor)
            rec = Recording(table=table, source="prometheus", origin=src.origin,
                            interval_s=step, notes=src.notes)
            usage_fine = classify(rec, by=fine_keys, interval_s=step, cap_intervals=1.0)
            daily, util_window = local_kpis(table, fine_keys, step, start_s=start,
                                             chunk_s=chunk_s)
        else:
            data = pull_aggregates(client, identify=series_id, start_s=start, end_s=end,
                                   step_s=step, matchers=matchers, chunk_s=chunk_s)
            usage_fine, daily = usage_from_pushdown(
                data, by=fine_keys,
                labels_for=lambda sid: attributor.resolve(sid.namespace, sid.pod,
                                                          dict(sid.labels)))
            util_window = dict(data.fleet_util_pct)
        transfer = {"mode": "raw query_range" if raw else "PromQL pushdown",
                    "url": client.url, "requests": client.requests,
                    "wire_bytes": client.wire_bytes, "body_bytes": client.body_bytes,
                    "step_s": step, "start": _iso(start), "end": _iso(end),
                    "kube_pod_labels": len(kube)}
    finally:
        client.close()
    return usage_fine, daily, util_window, transfer


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat()


def local_kpis(table: Any, keys: Sequence[str], interval_s: float | None, *,
                start_s: float | None = None, chunk_s: float = 86400.0,
                ) -> tuple[Any, dict[str, float | None]]:
    """Per-day cells (classify over each day's rows) and mean utilization over the last 1 h
    and 24 h, from a sample table already attributed."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpuaudit.classify import classify

    if table.num_rows == 0:
        return None, {}
    ts = table.column("ts").cast(pa.int64()).to_numpy()
    t0 = float(start_s) if start_s is not None else float(ts.min()) / 1e9
    day = ((ts / 1e9 - t0) // chunk_s).astype(np.int64)
    parts = []
    for d in np.unique(day):
        sub = table.filter(pa.array(day == d))
        u = classify(sub, by=keys, interval_s=interval_s, cap_intervals=1.0)
        cells = u.cells
        start_ns = int((t0 + d * chunk_s) * 1e9)
        parts.append(cells.add_column(0, "day_start", pa.array(
            [start_ns] * cells.num_rows, pa.int64()).cast(pa.timestamp("ns", tz="UTC"))))
    daily = pa.concat_tables(parts, promote_options="permissive")
    end_ns = int(ts.max())
    out: dict[str, float | None] = {}
    for label, secs in (("1h", 3600), ("24h", 86400)):
        sub = table.filter(pc.greater(table.column("ts").cast(pa.int64()),
                                      end_ns - secs * 1_000_000_000))
        out[label] = classify(sub, interval_s=interval_s, cap_intervals=1.0).overall() \
            .mean_util_pct if sub.num_rows else None
    return daily, out




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
    by: Sequence[str] = ("team",),
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
) -> BillReport:
    """Read a cloud bill and split it over the GPU time measured in ``telemetry`` (a file,
    table or sample source) or in the fleet at ``prometheus``, by the ``by`` keys.

    ``method``: ``allocation`` (who held the GPU pays for all of it) or ``usage`` (who kept
    it busy pays for the non-idle phases; a team's idle time goes to ``idle``). ``fmt``:
    ``focus``, ``cur`` or ``gcp`` (detected by columns when None). ``cost``: which of the
    bill's costs is split: ``billed`` (the invoice), ``effective`` or ``list``. ``budgets``: a
    TOML of monthly budgets (docs/billing.md). ``sql_dir``: write the join's inputs and SQL
    there (to run it in Athena, Trino or BigQuery). ``timeline``: also fold the per-GPU
    utilization timeline of the core report (telemetry files only). Every charge period's
    lines sum to its billed cost to the cent; see
    ``extra["bill"]["currencies"][ccy]["reconciliation"]``.
    """
    from datetime import datetime, timezone

    from gpuaudit.classify.phases import group_key_names
    from gpuaudit.errors import InputError
    from gpuaudit.price.attribution import coarse_usage, load_mapping
    from gpuaudit.price.billing import open_bill
    from gpuaudit.price.billing.allocate import HOUR_KEY, allocate, usage_hours
    from gpuaudit.price.billing.rates import bill_rates

    if (telemetry is None) == (prometheus is None):
        raise InputError("give the measured GPU time: either --telemetry FILE or "
                         "--prometheus URL", fix="gpuaudit bill BILL --telemetry run.parquet")
    if method not in ("allocation", "usage"):
        raise InputError(f"unknown method {method!r}", fix="use --method allocation or usage")
    if cost not in ("billed", "effective", "list"):
        raise InputError(f"unknown cost {cost!r}", fix="use billed, effective or list")
    names = [k.strip() for k in by if k.strip()] or ["team"]
    keys = group_key_names(names)
    names = [k[6:] if k.startswith("label:") else k for k in keys]
    opened = open_bill(bill_path, fmt=fmt)
    fine = tuple(dict.fromkeys([*keys, "pod"]))
    if telemetry is not None:
        source = open_source(telemetry)
        if map_file is not None:
            # the fleet's attribution rules (pod labels, the mapping file), as
            # `gpuaudit fleet --recording` applies them; needs the table in memory
            from gpuaudit.measure.files import read_samples
            from gpuaudit.price.attribution import Attributor, attribute_table

            rec = source if isinstance(source, Recording) else read_samples(telemetry) \
                if isinstance(telemetry, (str, Path)) else None
            if rec is None:
                raise InputError("--map-file with a streamed sample source",
                                 fix="give a recording file or a Recording")
            source = dc_replace(rec, table=attribute_table(
                rec.table, Attributor(load_mapping(map_file), {})))
        usage_h = classify(source, by=(*fine, HOUR_KEY), workers=workers, timeline=timeline)
        window = (usage_h.window_start, usage_h.window_end)
    else:
        assert prometheus is not None
        span = opened.con.execute(
            "SELECT min(charge_start), max(charge_end) FROM bill_lines").fetchone()
        if span[0] is None:
            raise InputError("the bill has no lines", where=opened.origin,
                             fix="give a bill export with usage lines")
        start_s, end_s = span[0].timestamp(), span[1].timestamp()
        step = step_s or 60.0
        mapping = load_mapping(map_file) if map_file else None
        fleet_fine = tuple(dict.fromkeys([*keys, "namespace", "pod"]))
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
                     sql_dir=sql_dir)
    summary = alloc.summary
    usage = coarse_usage(usage_h, keys)
    rates = bill_rates(usage, summary, catalog=catalog)
    if budgets is not None:
        from gpuaudit.price.billing.budgets import budget_status, load_budgets

        summary["budgets"] = budget_status(load_budgets(budgets), alloc.showback, names,
                                           today=today)
    rep = assemble(usage, rates, extra={"bill": summary})
    from dataclasses import fields

    return BillReport(**{f.name: getattr(rep, f.name) for f in fields(rep)},
                      showback=alloc.showback)


def _epoch_text(ts: Any) -> pa.Array:
    """Hourly chunk starts as the hour they cover, epoch seconds in text (classify's
    ``period:3600`` values). The pushdown's chunks start one scrape step after the range's
    start, so a chunk starting at 09:59:15 is the 10:00 hour: rounded to the nearest hour."""
    import pyarrow.compute as pc

    secs = pc.divide(pc.cast(pc.cast(ts, pa.timestamp("ns", tz="UTC")), pa.int64()),
                     1_000_000_000)
    hour = pc.multiply(pc.divide(pc.add(secs, 1800), 3600), 3600)
    return pc.cast(hour, pa.string())
