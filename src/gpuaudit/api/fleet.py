"""``gpuaudit.audit_fleet(...)``: the fleet in Prometheus (or a recording of it), per group."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace as dc_replace
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from gpuaudit.api.compose import Report, assemble, group_keys, rates_for
from gpuaudit.classify import Usage, classify
from gpuaudit.errors import InputError, SourceUnavailableError
from gpuaudit.price.catalog import Rate
from gpuaudit.recommend import Finding
from gpuaudit.units import utc_iso

if TYPE_CHECKING:
    pass

__all__ = ["audit_fleet", "fleet_usage", "local_kpis"]


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
    prometheus: str | Sequence[str] | None = None,
    recording: str | Path | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    since_s: float = 7 * 86400.0,
    step_s: float | None = None,
    by: str | Sequence[str] | None = ("team",),
    map_file: str | Path | None = None,
    matchers: Mapping[str, str] | None = None,
    raw: bool = False,
    client_kwargs: Mapping[str, Any] | None = None,
    chunk_s: float = 86400.0,
    pricing: Mapping[str, Any] | None = None,
    advice_groups: int = 10,
    findings: Iterable[Finding] = (),
    shard_s: float | None = None,
    concurrency: int = 4,
    allow_partial: bool = False,
    dedupe: bool = False,
    fetch: str | None = None,
) -> Report:
    """Audit a fleet and return a :class:`Report` whose ``extra["fleet"]`` holds the
    showback, KPIs and histograms (see report/fleet.py): the fleet's usage from Prometheus
    (:func:`fleet_usage`, pushdown or raw) or a ``gpuaudit scrape`` recording, attributed to
    teams, rolled up by ``by``, then :func:`assemble`, plus the recommender run on each of the
    ``advice_groups`` costliest groups alone. ``prometheus`` may list several stores
    (``URL`` or ``NAME=URL``); ``shard_s``, ``concurrency``, ``allow_partial`` and ``dedupe``
    and ``fetch`` are :func:`fleet_usage`'s."""
    from gpuaudit.classify.phases import group_key_names, unmatched_group_notes
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
    # by=None: no grouping (one fleet-wide line); an empty sequence keeps the default, team
    user_keys = group_key_names(() if by is None else group_keys(by) or ("team",))
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
        if start_s is not None or end_s is not None:
            rec = dc_replace(rec, table=_time_window(rec.table, start_s, end_s, recording))
        table = attribute_table(rec.table, Attributor(mapping, {}))
        usage_fine = classify(dc_replace(rec, table=table), by=fine_keys)
        daily, util_window = local_kpis(table, fine_keys, usage_fine.interval_s)
        transfer = {"mode": "recording", "path": str(recording)}
    else:
        assert prometheus is not None
        usage_fine, daily, util_window, transfer = fleet_usage(
            prometheus, start_s=start_s, end_s=end_s, since_s=since_s, step_s=step_s,
            by=fine_keys, mapping=mapping, matchers=matchers, raw=raw,
            client_kwargs=client_kwargs, chunk_s=chunk_s, shard_s=shard_s,
            concurrency=concurrency, allow_partial=allow_partial, dedupe=dedupe,
            fetch=fetch)
        if daily is not None and _divides_a_day(chunk_s):
            # the per-day figures by day, whatever the chunk (--chunk 6h: four per day)
            from datetime import datetime

            daily = regroup_cells(daily, datetime.fromisoformat(transfer["start"]).timestamp(),
                                  DAY_S)
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


def fleet_usage(
    prometheus: str | Sequence[str],
    *,
    start_s: float | None = None,
    end_s: float | None = None,
    since_s: float = 7 * 86400.0,
    step_s: float | None = None,
    by: str | Sequence[str] | None = (),
    mapping: Any = None,
    matchers: Mapping[str, str] | None = None,
    raw: bool = False,
    client_kwargs: Mapping[str, Any] | None = None,
    chunk_s: float = 86400.0,
    shard_s: float | None = None,
    concurrency: int = 4,
    allow_partial: bool = False,
    dedupe: bool = False,
    fetch: str | None = None,
) -> tuple[Usage, pa.Table | None, dict[str, float | None], dict[str, Any]]:
    """Measured GPU time of a fleet in a Prometheus-compatible store: the classification
    pushed down as PromQL (``raw``: samples pulled and classified here), attributed by pod
    labels and ``mapping`` (a :class:`~gpuaudit.price.attribution.MappingFile`).

    Returns the :class:`Usage` over ``by`` (group keys, e.g. team, namespace, pod), the cells
    per chunk of ``chunk_s`` (column ``day_start``: the chunk's start), the fleet's mean
    utilization over the last 1 h and 24 h, and what crossed the wire. ``gpuaudit fleet`` and
    ``gpuaudit bill --prometheus`` (hourly chunks) both read the fleet so.

    ``prometheus``: one URL, or several stores (``URL`` or ``NAME=URL``: shards by cluster
    or region; :func:`gpuaudit.measure.fleet.shards.parse_stores`). The pushdown cuts the
    range into time shards of ``shard_s`` (whole chunks; default one chunk), fetches every
    store x shard concurrently with at most ``concurrency`` requests in flight per store,
    and merges the answers exactly (:func:`gpuaudit.classify.pushdown.merge_pushdown`: the
    same figures as one store holding everything). A shard that fails after its retries is
    an error naming it; with ``allow_partial`` it is left out and listed in
    ``transfer["missing_shards"]`` and the notes. ``dedupe``: a GPU two stores both hold
    is counted once (the store with the most points per chunk), not refused.

    ``fetch``: how the samples are read. ``pushdown`` (the default) as above; ``raw``
    (= ``raw=True``): ``query_range`` of every series at ``step``, classified here (one
    store); ``native``: every store's raw samples in its cheapest native form (Prometheus'
    remote read of the stored XOR chunks, VictoriaMetrics' export), put on the raw pull's
    step grid and classified here (:class:`~gpuaudit.measure.fleet.native.NativeSource`:
    the raw pull's figures, with no PromQL for the stores to evaluate); ``auto``:
    ``native`` when every store answers one of those forms, else ``pushdown``.
    """
    if not isinstance(prometheus, str) and len(prometheus) == 1:
        prometheus = prometheus[0]
    # every store's client keeps or refuses a partial answer as the audit does a lost shard
    client_kwargs = {**dict(client_kwargs or {}), "allow_partial": allow_partial}
    fetch = _fetch_mode(fetch, raw)
    raw = fetch == "raw"
    if fetch in ("native", "auto"):
        urls = [prometheus] if isinstance(prometheus, str) else list(prometheus)
        got = _native_usage(
            urls, auto=fetch == "auto", start_s=start_s, end_s=end_s, since_s=since_s,
            step_s=step_s, by=group_keys(by), mapping=mapping, matchers=matchers,
            client_kwargs=client_kwargs, chunk_s=chunk_s, allow_partial=allow_partial,
            dedupe=dedupe)
        if got is not None:
            return got
        fetch = "pushdown"  # auto: a store answers neither native form
    if raw and not isinstance(prometheus, str):
        raise InputError("--raw reads one store",
                         fix="leave out --raw to audit several stores (PromQL pushdown)")
    if not raw:
        return _sharded_usage(
            [prometheus] if isinstance(prometheus, str) else list(prometheus),
            start_s=start_s, end_s=end_s, since_s=since_s, step_s=step_s, by=group_keys(by),
            mapping=mapping, matchers=matchers, client_kwargs=client_kwargs, chunk_s=chunk_s,
            shard_s=shard_s, concurrency=concurrency, allow_partial=allow_partial,
            dedupe=dedupe)
    assert isinstance(prometheus, str)  # the raw pull: one store, one range
    import time

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
    fine_keys = group_keys(by)
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
                f"DCGM_FI_PROF_GR_ENGINE_ACTIVE) has samples between {utc_iso(start)} and "
                f"{utc_iso(end)}", where=prometheus, fix="check --start/--end/--since and --match")
        step = float(step)
        start = (start // step + 1) * step
        end = (end // step) * step
        kube = pod_labels(client, start_s=start, end_s=end)
        attributor = Attributor(mapping, kube)
        src = PrometheusSource(client, start_s=start, end_s=end, step_s=step,
                               matchers=matchers)
        batches = list(src.batches())
        from gpuaudit.schema import SAMPLE_SCHEMA, Recording

        table = pa.Table.from_batches(batches, schema=SAMPLE_SCHEMA)
        table = attribute_table(table, attributor)
        rec = Recording(table=table, source="prometheus", origin=src.origin,
                        interval_s=step,
                        notes=(*src.notes, *_partial_notes({client.url: client})))
        usage_fine = classify(rec, by=fine_keys, interval_s=step, cap_intervals=1.0)
        daily, util_window = local_kpis(table, fine_keys, step, start_s=start,
                                         chunk_s=chunk_s)
        transfer = {"mode": "raw query_range",
                    "url": client.url, "requests": client.requests,
                    "wire_bytes": client.wire_bytes, "body_bytes": client.body_bytes,
                    "step_s": step, "start": utc_iso(start), "end": utc_iso(end),
                    "kube_pod_labels": len(kube)}
    finally:
        client.close()
    return usage_fine, daily, util_window, transfer


#: ``fetch`` values (see :func:`fleet_usage`)
FETCH_MODES = ("pushdown", "raw", "native", "auto")


def _fetch_mode(fetch: str | None, raw: bool) -> str:
    if fetch is None:
        return "raw" if raw else "pushdown"
    if fetch not in FETCH_MODES:
        raise InputError(f"unknown fetch mode {fetch!r}",
                         fix=f"give --fetch one of {', '.join(FETCH_MODES)}")
    if raw and fetch != "raw":
        raise InputError(f"--raw and --fetch {fetch} disagree",
                         fix="give one of them (--raw is --fetch raw)")
    return fetch


def _native_usage(
    urls: Sequence[str], *, auto: bool, start_s: float | None, end_s: float | None,
    since_s: float, step_s: float | None, by: Sequence[str], mapping: Any,
    matchers: Mapping[str, str] | None, client_kwargs: Mapping[str, Any] | None,
    chunk_s: float, allow_partial: bool, dedupe: bool,
) -> tuple[Usage, pa.Table | None, dict[str, float | None], dict[str, Any]] | None:
    """Every store's raw samples in its native form, classified here as the raw pull
    classifies them (see :func:`fleet_usage`); None when ``auto`` and a store answers no
    native form (the caller runs the pushdown)."""
    import concurrent.futures as cf
    import time

    from gpuaudit.classify import fused
    from gpuaudit.classify.phases import group_key_names
    from gpuaudit.measure.fleet.native import LeanSamples, NativeSource, probe_form
    from gpuaudit.measure.fleet.prometheus import PromClient
    from gpuaudit.measure.fleet.shards import Store, fan_out, parse_stores
    from gpuaudit.price.attribution import Attributor
    from gpuaudit.validate import EPOCH_S, FLEET_CHUNK_S, FLEET_SINCE_S, FLEET_STEP_S

    if dedupe:
        raise InputError("--dedupe needs the PromQL pushdown (it keeps a store per GPU and "
                         "chunk from the pushdown's per-chunk sums)",
                         fix="leave out --fetch, or --dedupe")
    start_s = None if start_s is None else EPOCH_S.check(start_s, "start_s")
    end_s = None if end_s is None else EPOCH_S.check(end_s, "end_s")
    since_s = FLEET_SINCE_S.check(since_s, "since_s")
    chunk_s = FLEET_CHUNK_S.check(chunk_s, "chunk_s")
    step_s = None if step_s is None else FLEET_STEP_S.check(step_s, "step_s")
    from gpuaudit._heap import one_heap

    one_heap()  # (where gpuaudit owns the process) before the fetch threads start
    stores = parse_stores(urls)
    clients = {st.name: PromClient(st.url, **dict(client_kwargs or {})) for st in stores}
    missing: list[dict[str, str]] = []
    try:
        forms: dict[str, str] = {}
        for st in stores:
            form = probe_form(clients[st.name])
            if form is None:
                if auto:
                    return None
                raise InputError(
                    "the store answers neither remote read (Prometheus) nor /api/v1/export "
                    "(VictoriaMetrics)", where=st.url,
                    fix="use --fetch pushdown (or --fetch auto)")
            forms[st.name] = form
        end = end_s if end_s is not None else time.time()
        start = start_s if start_s is not None else end - since_s
        if end <= start:
            raise InputError("the range is empty (--end is not after --start)",
                             fix="give --since, or --start before --end")

        got, step, start, end, kube = _survey(stores, clients, start, end, step_s=step_s,
                                              matchers=matchers, allow_partial=allow_partial,
                                              missing=missing)
        attributor = Attributor(mapping, kube)
        live = [st for st, (found, _k) in got if found is not None]
        sources = {st.name: NativeSource(clients[st.name], forms[st.name], start_s=start,
                                         end_s=end, step_s=step, matchers=matchers)
                   for st in live}
        # identities per series, attributed once per series; the rows carry codes only
        label_keys = [k[6:] for k in group_key_names(by) if k.startswith("label:")]

        def resolve(sid: Any) -> dict[str, str]:
            return attributor.resolve(sid.namespace, sid.pod, dict(sid.labels))

        def pull(st: Store) -> list[pa.RecordBatch]:
            return list(sources[st.name].lean_batches(resolve, label_keys))

        parts, lost = fan_out(live, pull, describe=lambda st: st,
                              label=lambda st: f"{st.name} (raw samples)",
                              workers=len(live), allow_partial=allow_partial)
        for st, text in lost:
            missing.append({"store": st.name, "url": st.url, "start": utc_iso(start),
                            "end": utc_iso(end + step), "error": text})
        _one_store_per_gpu([(st.name, _gpus_of(bs)) for st, bs in parts])
        notes = [n for st, _b in parts for n in sources[st.name].notes]
        notes += _missing_notes(missing)
        notes += _partial_notes(clients)
        origin = "; ".join(sources[st.name].origin for st, _b in parts)
        samples = LeanSamples([b for _st, bs in parts for b in bs], origin=origin,
                              interval_s=step, notes=notes)
        # the per-day cells and windows read the same held rows beside the main classify
        # (two engines, no shared state; the NumPy passes of each let the other run). The
        # compiled loop is loaded first where classify will take it, so neither thread
        # finds it half-loaded (and takes the NumPy path for a batch: not the same bits)
        if samples.num_rows >= fused.MIN_SOURCE_ROWS:
            fused.warm()
        held = _Held.of(samples, step)
        with cf.ThreadPoolExecutor(1) as pool:
            kpis = pool.submit(held.kpis, tuple(by), start_s=start, chunk_s=chunk_s) \
                if held is not None else None
            usage_fine = classify(samples, by=tuple(by), interval_s=step, cap_intervals=1.0)
            daily, util_window = kpis.result() if kpis is not None else (None, {})
        transfer = _transfer("native raw samples", stores, clients, forms=forms, step=step,
                             start=start, end=end, kube=kube, time_shards=1, missing=missing)
    finally:
        for c in clients.values():
            c.close()
    return usage_fine, daily, util_window, transfer


def _gpus_of(batches: Sequence[pa.RecordBatch]) -> list[str]:
    """The GPUs some row of ``batches`` holds (their uuid column a dictionary)."""
    out: dict[str, None] = {}
    for b in batches:
        col = b.column("gpu_uuid")
        used = np.flatnonzero(np.bincount(col.indices.to_numpy(zero_copy_only=False),
                                          minlength=len(col.dictionary)))
        out.update(dict.fromkeys(col.dictionary.take(pa.array(used)).to_pylist()))
    return list(out)


def _one_store_per_gpu(gpus: Sequence[tuple[str, Sequence[str]]]) -> None:
    """A GPU in two stores' answers would be counted twice: an error naming both."""
    seen: dict[str, str] = {}
    for name, held in gpus:
        for gpu in held:
            other = seen.setdefault(gpu, name)
            if other != name:
                raise InputError(
                    f"GPU {gpu} is in 2 stores ({other}, {name}): counting both would bill "
                    "it twice", where=f"{other}, {name}",
                    fix="if the stores are HA replicas give one of them, or use --fetch "
                    "pushdown --dedupe")


#: the default time shard: a week of chunks (a 30-day audit is 5 shards per store)
DEFAULT_SHARD_S = 7 * 86400.0


def _sharded_usage(
    urls: Sequence[str], *, start_s: float | None, end_s: float | None, since_s: float,
    step_s: float | None, by: Sequence[str], mapping: Any,
    matchers: Mapping[str, str] | None, client_kwargs: Mapping[str, Any] | None,
    chunk_s: float, shard_s: float | None, concurrency: int, allow_partial: bool,
    dedupe: bool,
) -> tuple[Usage, pa.Table | None, dict[str, float | None], dict[str, Any]]:
    """The pushdown over stores x time shards, merged exactly (see :func:`fleet_usage`)."""
    import time

    from gpuaudit.classify.pushdown import (
        PushdownData,
        chunk_grid,
        merge_pushdown,
        pull_aggregates,
        usage_from_pushdown,
    )
    from gpuaudit.errors import QueryTooLarge
    from gpuaudit.measure.fleet.dcgm import series_id
    from gpuaudit.measure.fleet.prometheus import PromClient
    from gpuaudit.measure.fleet.shards import Shard, fan_out, parse_stores, plan_shards
    from gpuaudit.price.attribution import Attributor
    from gpuaudit.schema import ImportNote
    from gpuaudit.units import duration
    from gpuaudit.validate import (
        CONCURRENCY,
        EPOCH_S,
        FLEET_CHUNK_S,
        FLEET_SHARD_S,
        FLEET_SINCE_S,
        FLEET_STEP_S,
    )

    start_s = None if start_s is None else EPOCH_S.check(start_s, "start_s")
    end_s = None if end_s is None else EPOCH_S.check(end_s, "end_s")
    since_s = FLEET_SINCE_S.check(since_s, "since_s")
    chunk_s = FLEET_CHUNK_S.check(chunk_s, "chunk_s")
    step_s = None if step_s is None else FLEET_STEP_S.check(step_s, "step_s")
    shard_s = DEFAULT_SHARD_S if shard_s is None else FLEET_SHARD_S.check(shard_s, "shard_s")
    concurrency = int(CONCURRENCY.check(concurrency, "concurrency"))
    stores = parse_stores(urls)
    from gpuaudit._heap import cap_arenas

    cap_arenas()  # answers are decoded in many threads: see gpuaudit._heap
    kw = dict(client_kwargs or {})
    kw["max_in_flight"] = concurrency
    clients = {st.name: PromClient(st.url, **kw) for st in stores}
    missing: list[dict[str, str]] = []
    try:
        end = end_s if end_s is not None else time.time()
        start = start_s if start_s is not None else end - since_s
        if end <= start:
            raise InputError("the range is empty (--end is not after --start)",
                             fix="give --since, or --start before --end")
        got, step, start, end, kube = _survey(stores, clients, start, end, step_s=step_s,
                                              matchers=matchers, allow_partial=allow_partial,
                                              missing=missing)
        live = [st for st, _ in got]
        attributor = Attributor(mapping, kube)
        raw_util = _raw_util_readers(live, clients, step=step, matchers=matchers)
        asked_s = chunk_s  # the chunk the caller asked for (the daily cells' period)
        refused: list[tuple[float, QueryTooLarge]] = []
        while True:
            chunks = chunk_grid(start, end, step, chunk_s)
            shards = plan_shards(live, chunks, max(1, round(shard_s / chunk_s)))
            last = chunks[-1]

            def fetch(sh: Shard, chunk_s: float = chunk_s, last: tuple[float, float] = last,
                      ) -> PushdownData:
                return pull_aggregates(
                    clients[sh.store.name], identify=series_id, start_s=sh.start_s,
                    end_s=sh.end_s, step_s=step, matchers=matchers, chunk_s=chunk_s,
                    chunks=sh.chunks, fleet=sh.chunks[-1] == last, fleet_start_s=start,
                    workers=concurrency, raw_util=raw_util.get(sh.store.name))

            try:
                answers, lost = fan_out(shards, fetch, describe=lambda sh: sh.store,
                                        label=lambda sh: sh.label,
                                        workers=max(1, min(len(shards), 2 * len(live))),
                                        allow_partial=allow_partial)
                break
            except QueryTooLarge as exc:
                # a store's limit on the samples one query may hold (Prometheus'
                # --query.max-samples: a chunk's subqueries hold series x steps): the
                # chunks cut smaller, the same figures (summed back below)
                if not exc.by_chunk:
                    raise
                smaller = _smaller_chunk(chunk_s, step)
                if smaller is None:
                    raise QueryTooLarge(
                        exc.what, where=exc.where,
                        fix=f"the store refused even {duration(chunk_s)} chunks: raise its "
                        "limit (Prometheus --query.max-samples, VictoriaMetrics "
                        "-search.maxSamplesPerQuery) or audit fewer series at a time "
                        "(--match)") from exc
                refused.append((chunk_s, exc))
                chunk_s = smaller
        for sh, text in lost:
            missing.append({"store": sh.store.name, "url": sh.store.url,
                            "start": utc_iso(sh.start_s), "end": utc_iso(sh.end_s + step),
                            "error": text})
        data = merge_pushdown([(sh.store.name, d) for sh, d in answers], dedupe=dedupe)
        data.notes.extend(_missing_notes(missing))
        data.notes.extend(_partial_notes(clients))
        if refused:
            first_s, too_large = refused[0]
            data.notes.append(ImportNote(
                f"a store refused the queries of {duration(first_s)} chunks as too large "
                f"({too_large.what}): they were asked in {duration(chunk_s)} chunks instead "
                "(the same figures, more requests)", len(refused), where=too_large.where))
        usage_fine, daily = usage_from_pushdown(
            data, by=tuple(by),
            labels_for=lambda sid: attributor.resolve(sid.namespace, sid.pod,
                                                      dict(sid.labels)))
        daily = regroup_cells(daily, start, asked_s)  # (the smaller chunks summed back)
        util_window = dict(data.fleet_util_pct)
        transfer = _transfer("PromQL pushdown", stores, clients, forms=None, step=step,
                             start=start, end=end, kube=kube,
                             time_shards=len({sh.index for sh in shards}), missing=missing)
    finally:
        for c in clients.values():
            c.close()
    return usage_fine, daily, util_window, transfer


#: set to 0 to have the stores evaluate every pushdown subquery (benchmarks, a store whose
#: native form misreads); by default a store that streams its raw samples has the
#: utilization view's subqueries answered here (gpuaudit.classify.pushdown_raw)
RAW_VIEW_ENV = "GPUAUDIT_PUSHDOWN_RAW"


def _raw_util_readers(stores: Sequence[Any], clients: Mapping[str, Any], *, step: float,
                      matchers: Mapping[str, str] | None) -> dict[str, Any]:
    """Per store that streams its raw samples (Prometheus' remote read, VictoriaMetrics'
    export) and whose windows' edge is known: a reader of its raw utilization samples, for
    the pushdown to answer the utilization view's subqueries from (the same numbers, tested
    against both stores; the store's CPU spared). A Prometheus has all of
    :data:`~gpuaudit.classify.pushdown_raw.RAW_VIEW` answered here, a VictoriaMetrics the
    subqueries over every step (:data:`~gpuaudit.classify.pushdown_raw.SUBQUERIES`) and its
    first / last point as its subqueries see them (a step before the chunk too); its raw
    range functions stay with it (see there). None for a store that answers neither form,
    and for all with ``GPUAUDIT_PUSHDOWN_RAW=0``."""
    import os

    from gpuaudit.classify.pushdown_raw import RAW_VIEW, SUBQUERIES
    from gpuaudit.measure.fleet.native import RawUtilReader, probe_form, window_left_open
    from gpuaudit.measure.fleet.shards import fan_out

    if os.environ.get(RAW_VIEW_ENV, "1") == "0":
        return {}

    def probe(st: Any) -> Any:
        c = clients[st.name]
        try:
            form = probe_form(c)
            left_open = window_left_open(c, form)
        except (InputError, SourceUnavailableError):  # the store's PromQL answers all
            return None
        if form is None or left_open is None:
            return None
        names, early = (RAW_VIEW, 0) if form == "remote-read" else \
            ((*SUBQUERIES, "first", "last"), 1)
        return RawUtilReader(c, form, step_s=step, matchers=matchers, left_open=left_open,
                             names=names, edges_before=early)

    got, _failed = fan_out(list(stores), probe, describe=lambda st: st,
                           label=lambda st: f"{st.name} (native form)",
                           workers=max(1, len(stores)), allow_partial=True)
    return {st.name: r for st, r in got if r is not None}


def _survey(stores: Sequence[Any], clients: Mapping[str, Any], start: float, end: float, *,
            step_s: float | None, matchers: Mapping[str, str] | None, allow_partial: bool,
            missing: list[dict[str, str]],
            ) -> tuple[list[tuple[Any, tuple[float | None, dict[tuple[str, str], dict[str, str]]]]],
                       float, float, float, dict[tuple[str, str], dict[str, str]]]:
    """Each store's scrape interval and kube-state-metrics pod labels, fetched concurrently
    (a store down: an error naming it, or with ``allow_partial`` the store left out and listed
    in ``missing``); the one step every store is read on, the range snapped to it, and the pod
    labels of all stores merged. Returns (store, (interval, labels)) per store that answered,
    the step, start, end and the labels."""
    from gpuaudit.measure.fleet.prometheus import detect_interval_s, pod_labels
    from gpuaudit.measure.fleet.shards import fan_out

    def preamble(st: Any) -> tuple[float | None, dict[tuple[str, str], dict[str, str]]]:
        c = clients[st.name]
        found = step_s or detect_interval_s(c, end_s=end, start_s=start, matchers=matchers)
        return found, pod_labels(c, start_s=start, end_s=end)

    got, failed = fan_out(stores, preamble, describe=lambda st: st,
                          label=lambda st: f"{st.name} (scrape interval, kube_pod_labels)",
                          workers=len(stores), allow_partial=allow_partial)
    for st, text in failed:
        missing.append({"store": st.name, "url": st.url, "start": utc_iso(start),
                        "end": utc_iso(end), "error": text})
    steps = {st.name: found for st, (found, _k) in got if found is not None}
    if not steps:
        raise InputError(
            "no dcgm-exporter series (DCGM_FI_DEV_GPU_UTIL or "
            f"DCGM_FI_PROF_GR_ENGINE_ACTIVE) has samples between {utc_iso(start)} and "
            f"{utc_iso(end)}", where=", ".join(st.url for st, _ in got),
            fix="check --start/--end/--since and --match")
    if len(set(steps.values())) > 1:
        raise InputError(
            "the stores scrape at different intervals: " + ", ".join(
                f"{n} {x:g} s" for n, x in steps.items()),
            fix=f"give --step {max(steps.values()):g}s (the longest) so every store is "
            "read on one grid")
    step = float(next(iter(steps.values())))
    kube: dict[tuple[str, str], dict[str, str]] = {}
    for _st, (_found, k) in got:
        for key, labels in k.items():
            kube.setdefault(key, {}).update(labels)
    return got, step, (start // step + 1) * step, (end // step) * step, kube


def _missing_notes(missing: Sequence[Mapping[str, str]]) -> list[Any]:
    """An import note per shard left out under ``allow_partial``."""
    from gpuaudit.schema import ImportNote

    return [ImportNote(
        reason=f"shard missing (--allow-partial): store {m['store']} from {m['start']} "
        f"to {m['end']} is not in this audit: {m['error']}", count=1, where=m["url"])
        for m in missing]


#: partial-answer notes per store at most; the rest of its warnings are counted in one more
_PARTIAL_NOTES = 5


def _partial_notes(clients: Mapping[str, Any]) -> list[Any]:
    """An import note per store (name -> its client) and warning of the partial answers
    kept under ``allow_partial``: how many, the store's own words, the first query. A store
    whose warnings differ query by query (block ids, addresses) gets its most frequent
    :data:`_PARTIAL_NOTES` and one note counting the rest."""
    from gpuaudit.schema import ImportNote

    notes = []
    for name, c in clients.items():
        seen = sorted(c.partial_answers.items(), key=lambda kv: (-kv[1][0], kv[0]))
        for warning, (n, query) in seen[:_PARTIAL_NOTES]:
            notes.append(ImportNote(
                reason=f"partial answers (--allow-partial): store {name} said {n} answer(s) "
                f"leave out what it could not reach, so its figures may be short: {warning} "
                f"(first in {query!r})", count=n, where=c.url))
        if len(seen) > _PARTIAL_NOTES:
            rest = sum(n for _w, (n, _q) in seen[_PARTIAL_NOTES:])
            notes.append(ImportNote(
                reason=f"partial answers (--allow-partial): store {name} gave {rest} more "
                f"with {len(seen) - _PARTIAL_NOTES} other warning(s)", count=rest,
                where=c.url))
    return notes


def _transfer(mode: str, stores: Sequence[Any], clients: Mapping[str, Any], *,
              forms: Mapping[str, str] | None, step: float, start: float, end: float,
              kube: Mapping[Any, Any], time_shards: int,
              missing: list[dict[str, str]]) -> dict[str, Any]:
    """What the fleet audit read and how (the report's ``transfer``): per store and in all,
    requests and bytes on the wire and decoded; ``forms``: each store's native form."""
    per_store: list[dict[str, Any]] = [{
        "name": st.name, "url": clients[st.name].url,
        **({"form": forms[st.name]} if forms is not None else {}),
        "requests": clients[st.name].requests,
        "wire_bytes": clients[st.name].wire_bytes,
        "body_bytes": clients[st.name].body_bytes} for st in stores]
    return {
        "mode": mode,
        "url": ", ".join(x["url"] for x in per_store),
        "requests": sum(int(x["requests"]) for x in per_store),
        "wire_bytes": sum(int(x["wire_bytes"]) for x in per_store),
        "body_bytes": sum(int(x["body_bytes"]) for x in per_store),
        "step_s": step, "start": utc_iso(start), "end": utc_iso(end),
        "kube_pod_labels": len(kube), "stores": per_store, "time_shards": time_shards,
        "missing_shards": missing}


def local_kpis(table: Any, keys: Sequence[str], interval_s: float | None, *,
                start_s: float | None = None, chunk_s: float = 86400.0,
                ) -> tuple[Any, dict[str, float | None]]:
    """Per-day cells (classify over each day's rows) and mean utilization over the last 1 h
    and 24 h, from a sample table already attributed (or the native fetch's lean batches,
    :class:`~gpuaudit.measure.fleet.native.LeanSamples`: the same rows, the same figures).
    Only the cells are read (:func:`~gpuaudit.classify.passes.classify_cells`)."""
    held = _Held.of(table, interval_s)
    if held is None:
        return None, {}
    return held.kpis(keys, start_s=start_s, chunk_s=chunk_s)


class _Held:
    """Rows held in memory (a sample table, or lean batches), read back in parts by time:
    the timestamps in parts (the table whole, or batch by batch), and the rows a mask per
    part keeps as a source classify reads, in the same order. A part's mask may be True or
    False (all its rows, none): a batch is one time chunk, which a day or a window mostly
    keeps whole or leaves out, found from its first and last time (no pass over its rows,
    no copy)."""

    def __init__(self, ts: list[np.ndarray], rows: Callable[[list[Any]], Any],
                 interval_s: float | None) -> None:
        self.ts, self.rows, self.interval_s = ts, rows, interval_s
        self.bounds = [(int(t.min()), int(t.max())) for t in ts]

    @classmethod
    def of(cls, table: Any, interval_s: float | None) -> _Held | None:
        """``table``'s rows; None when it has none."""
        if isinstance(table, pa.Table):
            if table.num_rows == 0:
                return None
            def whole(keep: list[Any]) -> Any:
                got = _part(table, keep[0])
                return table.slice(0, 0) if got is None else got

            return cls([table.column("ts").cast(pa.int64()).to_numpy()], whole, interval_s)
        from gpuaudit.measure.fleet.native import LeanSamples

        batches = list(table.batches())
        if not batches:
            return None

        def rows(keep: list[Any]) -> Any:
            return LeanSamples([got for b, k in zip(batches, keep)
                                if (got := _part(b, k)) is not None],
                               origin=table.origin, interval_s=interval_s)

        return cls([b.column("ts").cast(pa.int64()).to_numpy() for b in batches], rows,
                   interval_s)

    def kpis(self, keys: Sequence[str], *, start_s: float | None, chunk_s: float,
             ) -> tuple[Any, dict[str, float | None]]:
        """:func:`local_kpis`: the cells of each day, then the windows."""
        return self.daily(keys, start_s=start_s, chunk_s=chunk_s), self.windows()

    def daily(self, keys: Sequence[str], *, start_s: float | None, chunk_s: float) -> Any:
        """The cells of each day (``chunk_s`` from ``start_s``, or from the first row)."""
        from gpuaudit.classify.passes import classify_cells

        t0 = float(start_s) if start_s is not None else min(a for a, _b in self.bounds) / 1e9

        def day(t: np.ndarray) -> np.ndarray:
            return ((t / 1e9 - t0) // chunk_s).astype(np.int64)

        # each part's day, or its rows' days where it spans two (the day of a time rises
        # with the time: its first and last rows' days bound its other rows')
        days: list[int | np.ndarray] = []
        for t, (a, b) in zip(self.ts, self.bounds):
            first, last = day(np.array([a, b], dtype=np.int64)).tolist()
            days.append(first if first == last else day(t))
        every = sorted({d for x in days for d in ([x] if isinstance(x, int)
                                                   else np.unique(x).tolist())})
        parts = []
        for d in every:
            cells = classify_cells(self.rows([x == d for x in days]), by=keys,
                                   interval_s=self.interval_s, cap_intervals=1.0)
            parts.append(_day_cells(cells, t0, int(d), chunk_s))
        return pa.concat_tables(parts, promote_options="permissive")

    def windows(self) -> dict[str, float | None]:
        """The mean utilization of the last 1 h and 24 h of rows."""
        from gpuaudit.classify.passes import classify_cells
        from gpuaudit.classify.usage import cells_total

        end_ns = max(b for _a, b in self.bounds)
        out: dict[str, float | None] = {}
        for label, secs in (("1h", 3600), ("24h", 86400)):
            cut = end_ns - secs * 1_000_000_000
            sub = self.rows([True if a > cut else False if b <= cut else t > cut
                             for t, (a, b) in zip(self.ts, self.bounds)])
            out[label] = cells_total(classify_cells(
                sub, interval_s=self.interval_s, cap_intervals=1.0)).mean_util_pct \
                if sub.num_rows else None
        return out


def _part(rows: Any, keep: Any) -> Any:
    """The rows (a table or a batch) ``keep`` keeps: True all of them (no copy), False
    or a mask of no row none (None), else those a boolean mask marks."""
    if keep is True:
        return rows
    if keep is False or not keep.any():
        return None
    return rows.filter(pa.array(keep))


#: the period of the fleet report's per-day figures
DAY_S = 86400.0


def _divides_a_day(chunk_s: float) -> bool:
    """Whether whole chunks of ``chunk_s`` make up a day (1d, 6h, 1h, 15m ...)."""
    n = DAY_S / chunk_s
    return n >= 1 and abs(n - round(n)) < 1e-9


def _smaller_chunk(chunk_s: float, step_s: float) -> float | None:
    """The chunk to try after ``chunk_s`` was refused as too large: a quarter, else a half,
    of whole steps (so it still divides the chunk, and a day where the chunk did); None
    below two steps."""
    for k in (4, 2):
        smaller = chunk_s / k
        steps = smaller / step_s
        if steps >= 2 and abs(steps - round(steps)) < 1e-9:
            return smaller
    return None


def regroup_cells(cells: pa.Table | None, start_s: float, period_s: float) -> pa.Table | None:
    """Per-chunk cells (column ``day_start``: each chunk's start) summed over the periods of
    ``period_s`` from ``start_s`` their chunks start in: the cells of each period, as one
    chunk of that length would give them where the chunks divide it (the pushdown's answers
    add up exactly across its chunk edges). Unchanged where every chunk already starts a
    period."""
    from gpuaudit.classify.usage import CELL_VALUE_COLUMNS

    if cells is None or cells.num_rows == 0:
        return cells
    t = cells.column("day_start").cast(pa.int64()).to_numpy()
    origin, width = round(start_s * 1e9), round(period_s * 1e9)
    period = origin + (t - origin) // width * width
    if np.array_equal(period, t):
        return cells
    field = cells.schema.field("day_start")
    moved = cells.set_column(cells.schema.get_field_index("day_start"), field,
                             pa.array(period, pa.int64()).cast(field.type))
    keys = [c for c in moved.column_names if c not in CELL_VALUE_COLUMNS]
    values = [c for c in moved.column_names if c in CELL_VALUE_COLUMNS]
    summed = moved.group_by(keys, use_threads=False).aggregate([(c, "sum") for c in values])
    summed = summed.rename_columns([c.removesuffix("_sum") if c[:-4] in values else c
                                    for c in summed.column_names])
    return summed.select(cells.column_names).cast(cells.schema)


def _day_cells(cells: pa.Table, t0: float, d: int, chunk_s: float) -> pa.Table:
    start_ns = int((t0 + d * chunk_s) * 1e9)
    return cells.add_column(0, "day_start", pa.array(
        [start_ns] * cells.num_rows, pa.int64()).cast(pa.timestamp("ns", tz="UTC")))


def _time_window(table: pa.Table, start_s: float | None, end_s: float | None,
                 where: str | Path) -> pa.Table:
    """The rows of a recording in [start, end) (``--start``/``--end`` of ``fleet --recording``;
    ``--since`` counts back from now and is for Prometheus). An empty window is an error that
    says what the recording spans."""
    import pyarrow.compute as pc

    ts = table.column("ts").cast(pa.int64())
    t = ts.to_numpy()
    keep = np.ones(t.shape[0], dtype=bool)
    if start_s is not None:
        keep &= t >= int(start_s * 1e9)
    if end_s is not None:
        keep &= t < int(end_s * 1e9)
    out = table.filter(pa.array(keep))
    if out.num_rows == 0:
        lo, hi = pc.min(ts).as_py(), pc.max(ts).as_py()
        span = ("no samples at all" if lo is None else
                f"it spans {utc_iso(lo / 1e9)} to {utc_iso(hi / 1e9)}")
        raise InputError(f"no samples in the range given by --start/--end: {span}",
                         where=str(where), fix="choose a range inside the recording, or "
                         "leave --start/--end out to audit all of it")
    return out

