"""Pushdown: the phase classification runs inside the Prometheus-compatible store as PromQL,
and its per-series, per-chunk answers become a :class:`~gpuaudit.classify.usage.Usage`.

:func:`pull_aggregates` asks the queries of :mod:`gpuaudit.classify.pushdown_queries` chunk
by chunk through any client with instant queries (``QueryClient``; the caller passes
:class:`gpuaudit.measure.fleet.prometheus.PromClient` and the dcgm label decoder, so measure only
fetches and classify decides what a phase is), in two passes: the cheap queries for every
series, then the costly ones only for the series that need them.
:func:`usage_from_pushdown` turns the answers into the same ``Usage`` that local
:func:`gpuaudit.classify.classify` builds, so pricing, recommendations and reports apply
unchanged. Limits of the pushdown view are in docs/fleet.md.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from gpuaudit.classify.patterns import detect_patterns, job_patterns
from gpuaudit.classify.phases import group_key_names
from gpuaudit.classify.pushdown_queries import (
    MAX_FIELDS,
    MULTI_SAMPLE,
    SECOND_PASS,
    build_queries,
    decode,
    needs,
    share_query,
)
from gpuaudit.classify.usage import CELL_VALUE_COLUMNS, SeriesSignals, Usage
from gpuaudit.errors import InputError
from gpuaudit.promql import NODE_CPU, duration, regex_of, selector, time_chunks, with_matcher
from gpuaudit.schema import ImportNote, SeriesId

__all__ = ["PushdownData", "QueryClient", "pull_aggregates", "usage_from_pushdown"]


_T = TypeVar("_T")
_SUBQUERY = re.compile(r"\[\d+ms:\d+(?:ms|h)\]")
_UTIL = "DCGM_FI_DEV_GPU_UTIL"
_GR = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
_SM = "DCGM_FI_PROF_SM_ACTIVE"
_WINDOW_FORMS = ("first", "last", "edges", "idle_pairs")  # what MULTI_SAMPLE replaces


@dataclass
class PushdownData:
    """Per-series, per-chunk sums from the store. ``values[(code, chunk)]`` maps a query name
    to its number; ``ids[code]`` decodes the series; ``chunks`` are (start_s, end_s)."""

    ids: list[SeriesId]
    chunks: list[tuple[float, float]]
    step_s: float
    values: dict[tuple[int, int], dict[str, float]]
    origin: str
    notes: list[ImportNote] = field(default_factory=list)
    fleet_util_pct: dict[str, float | None] = field(default_factory=dict)
    queries: int = 0
    has_sm: bool = False
    shared: bool = False


class QueryClient(Protocol):
    """What the pushdown needs of a Prometheus client: instant queries and label-name probes
    (:class:`gpuaudit.measure.fleet.prometheus.PromClient` is one; classify does not import it)."""

    url: str
    progress: Callable[[str, int], Callable[[int], None]] | None

    def query(self, expr: str, time_s: float) -> list[tuple[dict[str, str], float]]: ...

    def label_names(self, match: str, start_s: float, end_s: float) -> list[str]: ...


#: Decodes a series' labels into its identity: :func:`gpuaudit.measure.fleet.dcgm.series_id`.
Identify = Callable[..., SeriesId]


def pull_aggregates(
    client: QueryClient,
    *,
    identify: Identify,
    start_s: float,
    end_s: float,
    step_s: float,
    matchers: Mapping[str, str] | None = None,
    chunk_s: float = 86_400.0,
    workers: int = 4,
    narrow: bool = True,
) -> PushdownData:
    """Run the pushdown queries chunk by chunk (step-aligned, ``chunk_s`` long, ``workers``
    queries at a time) and collect the decoded answers; then the threshold queries
    (:data:`NARROWED`) for the GPUs whose series straddle a threshold in a chunk (all GPUs
    with ``narrow=False``: the same answers, more work); then the share weight of GPUs whose
    series overlap in a chunk (time-sliced), on those GPUs only. ``identify`` decodes a
    series' labels (``identify(labels, default_host=..., where=...)``): the caller passes
    :func:`gpuaudit.measure.fleet.dcgm.series_id`, so measure fetches and classify decides."""
    if step_s <= 0:
        raise InputError(f"step {step_s} s is not positive", fix="--step 15s, 1m, ...")
    sel = selector(matchers)
    start_s = np.ceil(start_s / step_s) * step_s
    end_s = np.floor(end_s / step_s) * step_s
    points = max(1, round(chunk_s / step_s))
    chunks = time_chunks(float(start_s), float(end_s), step_s, points)
    mig_sel = with_matcher(sel, 'GPU_I_ID!=""')
    # which series families exist: index lookups, no samples read
    probes = [client.label_names(m, float(start_s), float(end_s))
              for m in (_SM + sel, _GR + mig_sel)]
    has_sm, has_mig = bool(probes[0]), bool(probes[1])
    # node_exporter beside dcgm-exporter: the hosts' CPU per GPU (an index lookup)
    has_cpu = bool(client.label_names(NODE_CPU, float(start_s), float(end_s)))
    families = ["util", "mig"] if has_mig else ["util"]
    data = PushdownData(ids=[], chunks=list(chunks), step_s=step_s, values={},
                        origin=f"Prometheus {client.url} (PromQL pushdown, step {step_s:g} s)",
                        has_sm=has_sm)
    ids = _SeriesCodes(data, client.url, identify)
    jobs: list[tuple[int, str, str]] = []
    for i, (a, b) in enumerate(chunks):
        for fam in families:
            qs = build_queries(sel, step_s, b - a + step_s, has_sm=has_sm, family=fam,
                               signals=fam == "util", has_cpu=has_cpu and fam == "util")
            jobs += [(i, name, expr) for name, expr in qs.items()
                     if name not in MULTI_SAMPLE and not (narrow and name in SECOND_PASS)]
    # fleet mean utilization over the last hour and day: raw sums, run with the rest
    fleet_jobs: list[tuple[int, str, str]] = []
    for label, secs in (("1h", 3600.0), ("24h", 86400.0)):
        rng = duration(min(secs, end_s - start_s + step_s))
        for fam in families:
            metric, scale = (f"{_GR}{mig_sel}", "100 * ") if fam == "mig" else \
                (f"{_UTIL}{sel}", "")
            fleet_jobs += [(-1, f"{label} sum {fam}",
                            f"{scale}sum(sum_over_time({metric}[{rng}]))"),
                           (-1, f"{label} count {fam}", f"sum(count_over_time({metric}[{rng}]))")]
    # the costliest first (subqueries, then raw range functions), so that the last queries
    # in flight are short ones and the server's cores stay busy to the end
    jobs.sort(key=lambda j: _SUBQUERY.search(j[2]) is None)
    fleet = _run(client, jobs + fleet_jobs, chunks, data, ids, workers, "pushdown",
                 end_s=float(end_s))
    for label in ("1h", "24h"):
        total = sum(fleet.get(f"{label} sum {fam}", 0.0) for fam in families)
        count = sum(fleet.get(f"{label} count {fam}", 0.0) for fam in families)
        data.fleet_util_pct[label] = total / count if count > 0 else None
    # second pass: each SECOND_PASS query only for the series that need it, and the
    # several-samples-per-step forms for series with more samples than points; selected by
    # GPU and pod (a superset: answers of series that did not need one agree anyway)
    jobs2: list[tuple[int, str, str]] = []
    for i, (a, b) in enumerate(chunks):
        wanted: dict[str, dict[tuple[str, str], set[tuple[str, str]]]] = {}
        for (code, j), v in data.values.items():
            if j != i:
                continue
            names = [nm for nm in SECOND_PASS if narrow and needs(v, nm)]
            if "n" in v and v.get("raw_n", v["n"]) != v["n"]:  # the window forms do not hold
                names = [nm for nm in names if nm not in _WINDOW_FORMS] + list(MULTI_SAMPLE)
            (ulabel, uvalue), (plabel, pvalue) = ids.uuid_label[code], ids.pod_label[code]
            for nm in names:
                wanted.setdefault(nm, {}).setdefault((ulabel, plabel), set()).add(
                    (uvalue, pvalue))
        for nm, groups in wanted.items():
            for (ulabel, plabel), pairs in sorted(groups.items()):
                for part in _batches(sorted(pairs), 200):
                    gpus = with_matcher(sel, f'{ulabel}=~"{regex_of({u for u, _ in part})}"')
                    if plabel:
                        gpus = with_matcher(gpus, f'{plabel}=~"{regex_of({p for _, p in part})}"')
                    for fam in families:
                        qs = build_queries(gpus, step_s, b - a + step_s, has_sm=has_sm,
                                           family=fam, signals=False)
                        if nm in qs:
                            jobs2.append((i, nm, qs[nm]))
    _run(client, jobs2, chunks, data, ids, workers, "pushdown, second pass")
    jobs += jobs2
    for (_code, i), v in data.values.items():
        if v.pop("at_start", None) is not None and "first" not in v:
            v["first"] = chunks[i][0]
        if v.pop("at_end", None) is not None and "last" not in v:
            v["last"] = chunks[i][1]
        raw_sum = v.pop("raw_sum", None)
        if "n" in v and "sum" not in v and raw_sum is not None:
            v["sum"] = raw_sum  # one sample per step: the raw sum is the points' sum
        if "first_ts" in v:  # several samples per step: the timestamp forms hold
            v["first"], v["last"] = v.pop("first_ts"), v.pop("last_ts", v.get("last", 0.0))
        else:
            v.pop("changes", None)
            v.pop("last_ts", None)
    for (code, i), v in data.values.items():
        a, b = chunks[i]
        decode(v, b - a + step_s, step_s, where=f"{client.url}: pushdown, series "
               f"{data.ids[code].gpu_uuid}, chunk starting {a:.0f}")
    # time-sliced GPUs: series of one GPU whose [first, last] overlap within a chunk
    share_jobs: list[tuple[int, str, str]] = []
    for i, (a, b) in enumerate(chunks):
        by_gpu: dict[str, list[tuple[float, float, int]]] = {}
        for (code, j), v in data.values.items():
            if j == i and "first" in v and "last" in v:
                by_gpu.setdefault(data.ids[code].gpu_uuid, []).append(
                    (v["first"], v["last"], code))
        overlapping: dict[str, set[str]] = {}
        for spans in by_gpu.values():
            spans.sort()
            if any(spans[k + 1][0] <= max(x[1] for x in spans[:k + 1])
                   for k in range(len(spans) - 1)):
                for _f, _l, code in spans:
                    name, value = ids.uuid_label[code]
                    overlapping.setdefault(name, set()).add(value)
        for name, values in sorted(overlapping.items()):
            data.shared = True
            for uuids in _batches(sorted(values), 200):
                gpus = with_matcher(sel, f'{name}=~"{regex_of(set(uuids))}"')
                for fam in families:
                    share_jobs.append((i, "wsum", share_query(gpus, step_s, b - a + step_s,
                                                              family=fam)))
    _run(client, share_jobs, chunks, data, ids, workers, "time-sliced GPUs")
    data.queries = len(jobs) + len(fleet_jobs) + len(share_jobs) + len(probes)
    return data


class _SeriesCodes:
    """Series identity of query answers -> code in ``data.ids``. Prometheus lists each
    series' labels in the same order in every answer, so the label items key a cache and
    :func:`gpuaudit.measure.fleet.dcgm.series_id` runs once per series, not once per answer row."""

    def __init__(self, data: PushdownData, url: str, identify: Identify) -> None:
        self.data = data
        self.url = url
        self.identify = identify
        self.by_labels: dict[tuple[tuple[str, str], ...], int] = {}
        self.by_id: dict[SeriesId, int] = {}
        self.uuid_label: dict[int, tuple[str, str]] = {}  # code -> (UUID or uuid, value)
        #: code -> the pod label that tells its series apart (exported_pod, else pod; "")
        self.pod_label: dict[int, tuple[str, str]] = {}

    def code(self, labels: dict[str, str], query: str) -> int:
        key = tuple(labels.items())
        code = self.by_labels.get(key)
        if code is not None:
            return code
        sid = self.identify(labels, default_host="unknown", where=f"{self.url}: pushdown {query}")
        code = self.by_id.get(sid)
        if code is None:
            code = self.by_id[sid] = len(self.data.ids)
            self.data.ids.append(sid)
            self.uuid_label[code] = ("UUID", labels["UUID"]) if labels.get("UUID") else \
                ("uuid", labels.get("uuid", ""))
            pod = "exported_pod" if "exported_pod" in labels else \
                "pod" if "pod" in labels else ""
            self.pod_label[code] = (pod, labels.get(pod, "")) if pod else ("", "")
        self.by_labels[key] = code
        return code


def _run(client: QueryClient, jobs: list[tuple[int, str, str]],
         chunks: list[tuple[float, float]], data: PushdownData, ids: _SeriesCodes,
         workers: int, what: str, *, end_s: float | None = None) -> dict[str, float]:
    """Evaluate ``jobs`` (chunk, name, PromQL) at their chunk's end, ``workers`` at a time,
    into ``data.values``; NaN answers (nothing measured) are left out. Jobs of chunk -1 are
    fleet-wide aggregates evaluated at ``end_s``: returned by name, not stored per series."""
    out: dict[str, float] = {}
    if not jobs:
        return out
    advance = client.progress(what, len(jobs)) if client.progress else None

    def run(job: tuple[int, str, str]) -> tuple[int, str, list[tuple[dict[str, str], float]]]:
        i, name, expr = job
        at = chunks[i][1] if i >= 0 else end_s
        assert at is not None
        rows = client.query(expr, at)
        if advance:
            advance(1)
        return i, name, rows

    with cf.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for i, name, rows in pool.map(run, jobs):
            if i < 0:
                if rows and rows[0][1] == rows[0][1]:
                    out[name] = rows[0][1]
                continue
            for labels, value in rows:
                code = ids.code(labels, name)
                if value == value:  # NaN: nothing measured
                    data.values.setdefault((code, i), {})[name] = value
    return out


def _batches(items: list[_T], size: int) -> list[list[_T]]:
    return [items[k:k + size] for k in range(0, len(items), size)]




def _phase_values(v: Mapping[str, float], step_s: float) -> dict[str, float]:
    """PhaseTime fields of one series-chunk from its pushdown answers. A time-sliced GPU's
    series is weighted by its mean share over the chunk (``wsum / n``: exact when the pods
    sharing it overlap for the whole chunk)."""
    s = step_s
    get = v.get
    n = get("n", 0.0)
    share = get("wsum", n) / n if n > 0 else 1.0
    k = s * share
    out = {
        "idle_s": get("idle", 0.0) * k,
        "underutilized_s": get("under", 0.0) * k,
        "productive_s": get("prod", 0.0) * k,
        "compute_bound_s": get("cb", 0.0) * k,
        "underutilized_unused_s": get("unused", 0.0) * k / 100.0,
        "headroom_s": get("headroom", 0.0) * k / 100.0,
        "busy_s": get("busy", 0.0) * k / 100.0,
        "samples": float(n),
        "no_reading_s": 0.0,
        "sm_idle_s": get("sm_idle", 0.0) * k,
        "sm_underutilized_s": get("sm_under", 0.0) * k,
        "sm_productive_s": get("sm_prod", 0.0) * k,
        "sm_compute_bound_s": get("sm_cb", 0.0) * k,
        "sm_busy_s": get("sm_busy", 0.0) * k / 100.0,
    }
    out["gap_s"] = 0.0  # set per GPU in to_usage
    return out


def usage_from_pushdown(
    data: PushdownData,
    *,
    by: Sequence[str] = (),
    labels_for: Callable[[SeriesId], Mapping[str, str]] | None = None,
) -> tuple[Usage, pa.Table]:
    """The :class:`Usage` of the whole range (cells per GPU and group, as local classify
    builds), and a per-chunk cells table (column ``day_start``: the chunk's start, UTC) for
    daily figures. ``labels_for`` gives a series' label map (attribution: team, project ...)
    for label group keys."""
    keys = group_key_names(by)
    s = data.step_s

    def group_of(sid: SeriesId) -> tuple[str | None, ...]:
        labels = labels_for(sid) if labels_for else dict(sid.labels)
        out: list[str | None] = []
        for k in keys:
            out.append(labels.get(k[6:]) if k.startswith("label:") else getattr(sid, k))
        return tuple(out)

    groups = [group_of(sid) for sid in data.ids]
    cell_rows: dict[tuple[str, tuple[str | None, ...]], np.ndarray] = {}
    day_rows: dict[tuple[int, str, tuple[str | None, ...]], np.ndarray] = {}
    meta: dict[str, SeriesId] = {}
    ncol = len(CELL_VALUE_COLUMNS)
    per_gpu: dict[str, dict[str, Any]] = {}
    for (code, chunk), v in sorted(data.values.items()):
        sid = data.ids[code]
        if "n" not in v and "idle" not in v:
            continue  # a series with no utilization readings (signals only)
        pv = _phase_values(v, s)
        vec = np.array([pv[c] for c in CELL_VALUE_COLUMNS])
        key = (sid.gpu_uuid, groups[code])
        meta.setdefault(sid.gpu_uuid, sid)
        cell_rows[key] = cell_rows.get(key, np.zeros(ncol)) + vec
        dkey = (chunk, sid.gpu_uuid, groups[code])
        day_rows[dkey] = day_rows.get(dkey, np.zeros(ncol)) + vec
        g = per_gpu.setdefault(sid.gpu_uuid, {"first": np.inf, "last": -np.inf,
                                              "pods": set(), "sig": {}, "max": {}})
        g["first"] = min(g["first"], v.get("first", np.inf))
        g["last"] = max(g["last"], v.get("last", -np.inf))
        if sid.pod:
            g["pods"].add(sid.pod)
        for name, x in v.items():
            if name in MAX_FIELDS:
                g["max"][name] = max(g["max"].get(name, -np.inf), x)
            elif name not in ("first", "last"):
                g["sig"][name] = g["sig"].get(name, 0.0) + x
        cnt_p = v.get("cnt_power", 0.0)
        if cnt_p > 0 and "std_power" in v:
            mean_p = v.get("sum_power", 0.0) / cnt_p
            g["sig"]["sumsq_power"] = g["sig"].get("sumsq_power", 0.0) + cnt_p * (
                v["std_power"] ** 2 + mean_p**2)
        g["sig"]["observed_s"] = g["sig"].get("observed_s", 0.0) + (
            pv["idle_s"] + pv["underutilized_s"] + pv["productive_s"] + pv["compute_bound_s"])
        g["sig"]["busy_s"] = g["sig"].get("busy_s", 0.0) + pv["busy_s"]
        g["sig"]["idle_s"] = g["sig"].get("idle_s", 0.0) + pv["idle_s"]
        g["sig"]["high_s"] = g["sig"].get("high_s", 0.0) + pv["productive_s"] + \
            pv["compute_bound_s"]
    _spread_gaps(cell_rows, {u: (g["first"], g["last"]) for u, g in per_gpu.items()}, s)
    for i in range(len(data.chunks)):
        spans: dict[str, tuple[float, float]] = {}
        for (code, chunk), v in data.values.items():
            if chunk != i or "first" not in v:
                continue
            uuid = data.ids[code].gpu_uuid
            a, b = spans.get(uuid, (np.inf, -np.inf))
            spans[uuid] = (min(a, v["first"]), max(b, v["last"]))
        day_i = {(k[1], k[2]): vec for k, vec in day_rows.items() if k[0] == i}
        _spread_gaps(day_i, spans, s)
    cells = _cells_table([(k[0], k[1], v) for k, v in cell_rows.items()], keys, meta)
    day_cells = _cells_table([(k[1], k[2], v) for k, v in day_rows.items()], keys, meta,
                             days=[data.chunks[k[0]][0] for k in day_rows])
    series = tuple(_signals(uuid, meta[uuid], g, s) for uuid, g in per_gpu.items())
    t0 = min((g["first"] for g in per_gpu.values()), default=None)
    t1 = max((g["last"] for g in per_gpu.values()), default=None)
    patterns = detect_patterns(series, s)
    usage = Usage(
        cells=cells, by=keys, series=series, patterns=patterns,
        job_patterns=job_patterns(series, patterns),
        window_start=_dt(t0), window_end=_dt(t1 + s if t1 is not None else None),
        interval_s=s, cap_s=s, source="prometheus-pushdown", origin=data.origin,
        notes=tuple(data.notes),
    )
    return usage, day_cells


_OBS = [CELL_VALUE_COLUMNS.index(c) for c in ("idle_s", "underutilized_s", "productive_s",
                                              "compute_bound_s")]
_GAP = CELL_VALUE_COLUMNS.index("gap_s")


def _spread_gaps(rows: Mapping[tuple[str, tuple[str | None, ...]], np.ndarray],
                 spans: Mapping[str, tuple[float, float]], step_s: float) -> None:
    """Unobserved time of each GPU (its span, first to last point plus a step, less the
    observed time of all its series), shared among its cells by their observed time (in
    place). Local classify gives a gap to the sample before it; PromQL cannot say which."""
    by_gpu: dict[str, list[np.ndarray]] = {}
    for (uuid, _g), vec in rows.items():
        by_gpu.setdefault(uuid, []).append(vec)
    for uuid, vecs in by_gpu.items():
        if uuid not in spans:
            continue
        first, last = spans[uuid]
        obs = np.array([v[_OBS].sum() for v in vecs])
        gap = max(0.0, last - first + step_s - float(obs.sum()))
        if gap <= 1e-6:
            continue
        weights = obs / obs.sum() if obs.sum() > 0 else np.full(len(vecs), 1.0 / len(vecs))
        for v, w in zip(vecs, weights):
            v[_GAP] += gap * w


def _dt(t: float | None) -> datetime | None:
    if t is None or not np.isfinite(t):
        return None
    return datetime.fromtimestamp(t, tz=timezone.utc)


def _cells_table(rows: list[tuple[str, tuple[str | None, ...], np.ndarray]],
                 keys: tuple[str, ...], meta: Mapping[str, SeriesId],
                 days: list[float] | None = None) -> pa.Table:
    cols: dict[str, pa.Array] = {}
    if days is not None:
        cols["day_start"] = pa.array(np.array(days) * 1e9, type=pa.int64()).cast(
            pa.timestamp("ns", tz="UTC"))
    cols["gpu_uuid"] = pa.array([r[0] for r in rows], type=pa.string())
    cols["host"] = pa.array([meta[r[0]].host for r in rows], type=pa.string())
    cols["gpu_model"] = pa.array([meta[r[0]].gpu_model for r in rows], type=pa.string())
    for j, k in enumerate(keys):
        cols[k] = pa.array([r[1][j] for r in rows], type=pa.string())
    mat = np.array([r[2] for r in rows]).reshape(len(rows), len(CELL_VALUE_COLUMNS))
    for j, c in enumerate(CELL_VALUE_COLUMNS):
        col = mat[:, j]
        cols[c] = pa.array(np.round(col).astype(np.int64) if c == "samples" else col)
    return pa.table(cols)


def _signals(uuid: str, sid: SeriesId, g: Mapping[str, Any], step_s: float) -> SeriesSignals:
    sig: Mapping[str, float] = g["sig"]
    mx: Mapping[str, float] = g["max"]
    obs = sig.get("observed_s", 0.0)
    n = sig.get("n", 0.0)
    mean_u = 100.0 * sig.get("busy_s", 0.0) / obs if obs > 0 else None
    std_u = None
    if n > 0 and mean_u is not None:
        std_u = float(np.sqrt(max(sig.get("u2", 0.0) / n - mean_u**2, 0.0)))

    def mean(name: str) -> float | None:
        c = sig.get(f"cnt_{name}", 0.0)
        return sig.get(f"sum_{name}", 0.0) / c if c > 0 else None

    pcie = [mean("pcie_tx"), mean("pcie_rx")]
    p_mean = mean("power")
    p_std = None
    if p_mean is not None and "sumsq_power" in sig:
        p_std = float(np.sqrt(max(sig["sumsq_power"] / sig["cnt_power"] - p_mean**2, 0.0)))
    # idle runs: at least as many as there are (pushdown_queries.decode), so the mean idle
    # run below is a lower bound of the longest
    runs = max(sig.get("runs", 0.0), 1.0) if sig.get("idle_s", 0.0) > 0 else 0.0
    idle_s = sig.get("idle_s", 0.0)
    steps = sig.get("n", 0.0)
    energy = sig.get("energy_mj")
    xid = mx.get("xid")

    def m(name: str) -> float | None:
        x = mx.get(name)
        return None if x is None or not np.isfinite(x) else float(x)

    return SeriesSignals(
        gpu_uuid=uuid, host=sid.host, gpu_model=sid.gpu_model, mig_profile=sid.mig_profile,
        samples=int(n), observed_s=obs, mean_util_pct=mean_u, std_util_pct=std_u,
        mean_abs_step_pct=sig.get("absstep", 0.0) / steps if steps > 0 else None,  # per point
        idle_runs=round(runs), idle_s=idle_s,
        busy_high_s=sig.get("high_s", 0.0),
        max_idle_run_s=idle_s / runs if runs > 0 else 0.0,
        mean_sm_active=mean("sm_active"), mean_sm_occupancy=mean("sm_occupancy"),
        mean_tensor_active=mean("tensor_active"), mean_dram_active=mean("dram_active"),
        mean_pcie_bytes_per_s=None if pcie[0] is None and pcie[1] is None else
        (pcie[0] or 0.0) + (pcie[1] or 0.0),
        mean_power_w=p_mean, std_power_w=p_std,
        host_cpu_util_pct=mean("host_cpu"),
        host_cpu_util_pct_while_idle=mean("host_cpu_idle"),
        host_cpu_util_pct_while_busy=mean("host_cpu_busy"),
        max_temp_c=m("temp_c"), mem_used_max_mib=m("mem_used_mib"),
        mem_total_mib=m("mem_total_mib"),
        energy_j=energy / 1000.0 if energy is not None else None,
        ecc_dbe_delta=int(sig["ecc"]) if "ecc" in sig else None,
        xid_codes=(int(xid),) if xid is not None and xid > 0 else (),
        pods=tuple(sorted(g["pods"])),
    )
