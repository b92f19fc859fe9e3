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
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

import msgspec
import numpy as np
import pyarrow as pa

from gpuaudit.classify.patterns import detect_patterns, job_patterns
from gpuaudit.classify.phases import group_key_names
from gpuaudit.classify.pushdown_columns import Answers, decode_columns, straddles_columns
from gpuaudit.classify.pushdown_queries import (
    _LOWER_PCT,
    MAX_FIELDS,
    MULTI_SAMPLE,
    NARROWED,
    SECOND_PASS,
    build_queries,
    share_query,
)
from gpuaudit.classify.usage import CELL_VALUE_COLUMNS, SeriesSignals, Usage
from gpuaudit.errors import InputError, QueryTooLarge, SourceUnavailableError
from gpuaudit.promql import NODE_CPU, duration, regex_of, selector, time_chunks, with_matcher
from gpuaudit.schema import ImportNote, SeriesId
from gpuaudit.units import chunks_starting, utc_iso

__all__ = ["Answers", "PushdownData", "QueryClient", "RawUtil", "chunk_grid",
           "merge_pushdown", "pull_aggregates", "usage_from_pushdown"]


_T = TypeVar("_T")
_SUBQUERY = re.compile(r"\[\d+ms:\d+(?:ms|h)\]")
_UTIL = "DCGM_FI_DEV_GPU_UTIL"
_GR = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
_SM = "DCGM_FI_PROF_SM_ACTIVE"
_WINDOW_FORMS = ("first", "last", "edges", "idle_pairs")  # what MULTI_SAMPLE replaces
_IDLE_PCT = _LOWER_PCT[0]


@dataclass
class PushdownData:
    """Per-series, per-chunk sums from the store, columnar (:class:`Answers`: one array per
    query name over (series code, chunk) rows, NaN where none). ``ids[code]`` decodes the
    series; ``chunks`` are (start_s, end_s)."""

    ids: list[SeriesId]
    chunks: list[tuple[float, float]]
    step_s: float
    answers: Answers
    origin: str
    notes: list[ImportNote] = field(default_factory=list)
    fleet_util_pct: dict[str, float | None] = field(default_factory=dict)
    #: the fleet windows' raw utilization sum and point count ("1h", "24h"): what
    #: :func:`merge_pushdown` adds across stores; ``fleet_util_pct`` is their ratio
    fleet_util_sums: dict[str, tuple[float, float]] = field(default_factory=dict)
    queries: int = 0
    has_sm: bool = False
    shared: bool = False

    @classmethod
    def from_rows(cls, *, ids: list[SeriesId], chunks: list[tuple[float, float]],
                  step_s: float, values: Mapping[tuple[int, int], Mapping[str, float]],
                  origin: str) -> PushdownData:
        """From ``{(code, chunk): {name: value}}`` (decoded answers: tests, tools)."""
        return cls(ids=ids, chunks=chunks, step_s=step_s, origin=origin,
                   answers=Answers.from_rows(len(chunks), values))

    def rows(self) -> dict[tuple[int, int], dict[str, float]]:
        """The answers as ``{(code, chunk): {name: value}}`` (tests, debugging)."""
        return dict(self.answers.iter_rows())


class QueryClient(Protocol):
    """What the pushdown needs of a Prometheus client: instant queries and label-name probes
    (:class:`gpuaudit.measure.fleet.prometheus.PromClient` is one; classify does not import it)."""

    url: str
    progress: Callable[[str, int], Callable[[int], None]] | None

    def query(self, expr: str, time_s: float) -> list[tuple[dict[str, str], float]]: ...

    def query_rows(self, expr: str, time_s: float) -> tuple[list[bytes], list[float]]: ...

    def label_names(self, match: str, start_s: float, end_s: float) -> list[str]: ...


#: Decodes a series' labels into its identity: :func:`gpuaudit.measure.fleet.dcgm.series_id`.
Identify = Callable[..., SeriesId]


class RawUtil(Protocol):
    """The store's raw ``DCGM_FI_DEV_GPU_UTIL`` samples, read in its native form (measure's
    :class:`gpuaudit.measure.fleet.native.RawUtilReader`): what lets
    :func:`pull_aggregates` answer the utilization view's subqueries here
    (:mod:`gpuaudit.classify.pushdown_raw`) instead of in the store."""

    #: whether the store's windows leave their left edge out (``(t - w, t]``)
    left_open: bool
    #: the queries answered from these samples (of
    #: :data:`~gpuaudit.classify.pushdown_raw.RAW_VIEW`); the store answers the others
    names: tuple[str, ...]
    #: steps before a chunk the store's first / last subqueries see (VictoriaMetrics: 1;
    #: see :func:`~gpuaudit.classify.pushdown_raw.util_answers`)
    edges_before: int

    def samples(self, a_s: float, b_s: float
                ) -> list[tuple[Mapping[str, str], np.ndarray, np.ndarray]]:
        """Every util series the pushdown's selector selects, with its samples in
        ``(a - (2 + edges_before) step, b]`` at least: (labels, times in ms, values), stale
        markers out."""
        ...


def chunk_grid(start_s: float, end_s: float, step_s: float,
               chunk_s: float = 86_400.0) -> list[tuple[float, float]]:
    """The step-aligned chunks of [start, end] that :func:`pull_aggregates` asks: the first
    step at or after ``start_s`` to the last at or before ``end_s``, ``chunk_s`` long each
    (inclusive (first step, last step) pairs). A time shard is a run of these chunks, so
    shards answer exactly what one pull over the whole range answers."""
    if step_s <= 0:
        raise InputError(f"step {step_s} s is not positive", fix="--step 15s, 1m, ...")
    a = float(np.ceil(start_s / step_s) * step_s)
    b = float(np.floor(end_s / step_s) * step_s)
    return time_chunks(a, b, step_s, max(1, round(chunk_s / step_s)))


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
    chunks: Sequence[tuple[float, float]] | None = None,
    fleet: bool = True,
    fleet_start_s: float | None = None,
    raw_util: RawUtil | None = None,
) -> PushdownData:
    """Run the pushdown queries chunk by chunk (step-aligned, ``chunk_s`` long, ``workers``
    queries at a time) and collect the decoded answers; then the threshold queries
    (:data:`NARROWED`) for the GPUs whose series straddle a threshold in a chunk (all GPUs
    with ``narrow=False``: the same answers, more work); then the share weight of GPUs whose
    series overlap in a chunk (time-sliced), on those GPUs only. ``identify`` decodes a
    series' labels (``identify(labels, default_host=..., where=...)``): the caller passes
    :func:`gpuaudit.measure.fleet.dcgm.series_id`, so measure fetches and classify decides.

    ``chunks`` (a run of :func:`chunk_grid`'s chunks: a time shard) replaces the grid of
    [start, end]; ``fleet`` asks the fleet's 1 h / 24 h utilization windows at the last
    chunk's end, reaching back no further than ``fleet_start_s`` (default: the first chunk's
    start); the time shard holding the audit's end asks them, the others do not.

    ``raw_util``: the store's raw utilization samples. Then the utilization view's
    subqueries (:data:`~gpuaudit.classify.pushdown_raw.RAW_VIEW`) are answered here from
    them, chunk by chunk, with the same numbers the store's PromQL gives, and the store
    evaluates only the rest (see :mod:`gpuaudit.classify.pushdown_raw`). A chunk the store
    will not stream (an error after the client's retries) or whose samples leave out series
    its own answers name (read twice) is asked of its PromQL instead, with a source note."""
    if step_s <= 0:
        raise InputError(f"step {step_s} s is not positive", fix="--step 15s, 1m, ...")
    sel = selector(matchers)
    if chunks is None:
        chunks = chunk_grid(start_s, end_s, step_s, chunk_s)
    chunks = [(float(a), float(b)) for a, b in chunks]
    if not chunks:
        raise InputError("the range holds no step", fix="give a range longer than --step")
    start_s, end_s = chunks[0][0], chunks[-1][1]
    span_start_s = start_s if fleet_start_s is None else fleet_start_s
    mig_sel = with_matcher(sel, 'GPU_I_ID!=""')
    # which series families exist: index lookups, no samples read
    probes = [client.label_names(m, float(start_s), float(end_s))
              for m in (_SM + sel, _GR + mig_sel)]
    has_sm, has_mig = bool(probes[0]), bool(probes[1])
    # node_exporter beside dcgm-exporter: the hosts' CPU per GPU (an index lookup)
    has_cpu = bool(client.label_names(NODE_CPU, float(start_s), float(end_s)))
    families = ["util", "mig"] if has_mig else ["util"]
    data = PushdownData(ids=[], chunks=list(chunks), step_s=step_s, answers=Answers(len(chunks)),
                        origin=f"Prometheus {client.url} (PromQL pushdown, step {step_s:g} s)",
                        has_sm=has_sm)
    ans = data.answers
    ids = _SeriesCodes(data, client.url, identify)
    jobs: list[tuple[int, str, str]] = []
    here = raw_util.names if raw_util is not None else ()

    def first_pass(name: str) -> bool:
        return name not in MULTI_SAMPLE and not (narrow and name in SECOND_PASS)

    witness: set[str] = set()  # the store's stddev of util: names each series it holds
    for i, (a, b) in enumerate(chunks):
        for fam in families:
            qs = build_queries(sel, step_s, b - a + step_s, has_sm=has_sm, family=fam,
                               signals=fam == "util", has_cpu=has_cpu and fam == "util")
            jobs += [(i, name, expr) for name, expr in qs.items()
                     if first_pass(name) and not (fam == "util" and name in here)]
            if fam == "util":
                witness.add(qs["std"])
    local = _LocalView(data, ids, raw_util, step_s, narrow, witness) \
        if raw_util is not None else None
    # fleet mean utilization over the last hour and day: raw sums, run with the rest
    fleet_jobs: list[tuple[int, str, str]] = []
    for label, secs in (("1h", 3600.0), ("24h", 86400.0)) if fleet else ():
        rng = duration(min(secs, end_s - span_start_s + step_s))
        for fam in families:
            metric, scale = (f"{_GR}{mig_sel}", "100 * ") if fam == "mig" else \
                (f"{_UTIL}{sel}", "")
            fleet_jobs += [(-1, f"{label} sum {fam}",
                            f"{scale}sum(sum_over_time({metric}[{rng}]))"),
                           (-1, f"{label} count {fam}", f"sum(count_over_time({metric}[{rng}]))")]
    # the costliest first (subqueries, then raw range functions), so that the last queries
    # in flight are short ones and the server's cores stay busy to the end
    jobs.sort(key=lambda j: _SUBQUERY.search(j[2]) is None)
    fleet_answers = _run(client, jobs + fleet_jobs, chunks, data, ids, workers, "pushdown",
                         end_s=float(end_s), local=local)
    # a chunk whose raw read left out series the store's answers name, twice, or that the
    # store would not stream: its utilization view asked of the store, as without a reader
    # (the same figures)
    back: list[tuple[int, str, str]] = []
    given_back = local.given_back() if local is not None else set()
    for i in sorted(given_back):
        a, b = chunks[i]
        qs = build_queries(sel, step_s, b - a + step_s, has_sm=has_sm, family="util",
                           signals=False)
        back += [(i, name, expr) for name, expr in qs.items() if name in here and first_pass(name)]
    for i, missed in sorted(local.to_store.items()) if local is not None else ():
        data.notes.append(ImportNote(
            f"the store's raw DCGM_FI_DEV_GPU_UTIL samples of {chunks_starting([chunks[i][0]])}"
            f" left out {missed} series its own queries answer, read twice: that chunk's utilization view was asked of its PromQL instead (the same "
            "figures, more of the store's CPU)", missed, where=client.url))
    if local is not None:
        data.notes.extend(_unread_notes(local.unread, chunks, client.url))
    _run(client, back, chunks, data, ids, workers, "pushdown, chunks the raw read missed")
    jobs += back
    for label in ("1h", "24h") if fleet else ():
        total = sum(fleet_answers.get(f"{label} sum {fam}", 0.0) for fam in families)
        count = sum(fleet_answers.get(f"{label} count {fam}", 0.0) for fam in families)
        data.fleet_util_sums[label] = (total, count)
        data.fleet_util_pct[label] = total / count if count > 0 else None
    # second pass: each SECOND_PASS query only for the series that need it, and the
    # several-samples-per-step forms for series with more samples than points; selected by
    # GPU and pod (a superset: answers of series that did not need one agree anyway)
    jobs2: list[tuple[int, str, str]] = []
    wanted = _second_pass_rows(ans, narrow)
    row_code, row_chunk = ans.code, ans.chunk
    if local is not None:  # the util series' answers from their raw samples
        wanted = local.settle(wanted)
    for i, (a, b) in enumerate(chunks):
        in_chunk = row_chunk == i
        # (the util series' answers come from the raw samples, but in a chunk given back)
        raw_here = here if i not in given_back else ()
        for nm, mask in wanted.items():
            groups: dict[tuple[str, str], set[tuple[str, str]]] = {}
            for code in np.unique(row_code[mask & in_chunk]).tolist():
                (ulabel, uvalue), (plabel, pvalue) = ids.uuid_label[code], ids.pod_label[code]
                groups.setdefault((ulabel, plabel), set()).add((uvalue, pvalue))
            for (ulabel, plabel), pairs in sorted(groups.items()):

                def second(part: list[tuple[str, str]], nm: str = nm, ulabel: str = ulabel,
                           plabel: str = plabel, a: float = a, b: float = b,
                           raw_here: tuple[str, ...] = raw_here) -> list[str]:
                    gpus = with_matcher(sel, f'{ulabel}=~"{regex_of({u for u, _ in part})}"')
                    if plabel:
                        gpus = with_matcher(gpus, f'{plabel}=~"{regex_of({p for _, p in part})}"')
                    out = []
                    for fam in (["mig"] if nm in raw_here else families):
                        qs = build_queries(gpus, step_s, b - a + step_s, has_sm=has_sm,
                                           family=fam, signals=False)
                        if nm in qs:
                            out.append(qs[nm])
                    return out

                for part in _batches(sorted(pairs), 200):
                    jobs2 += [(i, nm, e) for e in _fitting(part, second)]
    _run(client, jobs2, chunks, data, ids, workers, "pushdown, second pass")
    jobs += jobs2
    _settle_edges(ans, chunks)
    lengths = np.array([b - a + step_s for a, b in chunks])
    decode_columns(ans, lengths[ans.chunk] if ans.rows else np.zeros(0), step_s,
                   where=lambda r: f"{client.url}: pushdown, series "
                   f"{data.ids[int(ans.code[r])].gpu_uuid}, chunk starting "
                   f"{chunks[int(ans.chunk[r])][0]:.0f}")
    # time-sliced GPUs: series of one GPU whose [first, last] overlap within a chunk
    share_jobs: list[tuple[int, str, str]] = []
    for i, overlapping in enumerate(_overlapping(data, ids)):
        for name, values in sorted(overlapping.items()):
            a, b = chunks[i]
            data.shared = True

            def shares(uuids: list[str], name: str = name, a: float = a,
                       b: float = b) -> list[str]:
                gpus = with_matcher(sel, f'{name}=~"{regex_of(set(uuids))}"')
                return [share_query(gpus, step_s, b - a + step_s, family=fam)
                        for fam in families]

            for uuids in _batches(sorted(values), 200):
                share_jobs += [(i, "wsum", e) for e in _fitting(uuids, shares)]
    _run(client, share_jobs, chunks, data, ids, workers, "time-sliced GPUs")
    data.queries = len(jobs) + len(fleet_jobs) + len(share_jobs) + len(probes)
    return data


def _second_pass_rows(ans: Answers, narrow: bool) -> dict[str, np.ndarray]:
    """Which rows each second-pass query is asked for (:func:`needs` of every row; the
    several-samples-per-step forms where a row has more raw samples than points, or none
    seen raw: VictoriaMetrics' per-day index misses a series whose only sample in a window
    is at the UTC midnight the query is evaluated at)."""
    has_n = ans.has("n")
    with np.errstate(invalid="ignore"):
        multi = has_n & (ans.col("raw_n") != ans.col("n"))  # NaN raw_n: not seen raw
        lo, hi = ans.col("umin"), ans.col("umax")
        known = ~np.isnan(lo) & ~np.isnan(hi)
        need: dict[str, np.ndarray] = {}
        for nm in SECOND_PASS if narrow else ():
            if nm in NARROWED:
                m = ans.has(f"{NARROWED[nm][0]}n") & straddles_columns(ans, nm)
            elif nm == "first":
                m = has_n & ~ans.has("at_start")
            elif nm == "last":
                m = has_n & ~ans.has("at_end")
            elif nm == "edges":
                m = has_n & (~known | (lo < _IDLE_PCT))
            else:  # absstep
                m = has_n & (~known | (lo < hi))
            need[nm] = m & ~multi if nm in _WINDOW_FORMS else m
    for nm in MULTI_SAMPLE:
        need[nm] = need.get(nm, np.zeros(ans.rows, bool)) | multi
    return {nm: m for nm, m in need.items() if m.any()}


def _settle_edges(ans: Answers, chunks: Sequence[tuple[float, float]]) -> None:
    """First / last point from the first pass's edge answers where the second pass asked
    none; the sum of points from the raw sum where each step holds one sample; the timestamp
    forms where the steps hold several (in place)."""
    if not ans.rows:
        return
    starts = np.array([a for a, _ in chunks])[ans.chunk]
    ends = np.array([b for _, b in chunks])[ans.chunk]
    first, last = ans.col("first"), ans.col("last")
    first = np.where(ans.has("at_start") & np.isnan(first), starts, first)
    last = np.where(ans.has("at_end") & np.isnan(last), ends, last)
    ans.pop("at_start")
    ans.pop("at_end")
    raw_sum = ans.pop("raw_sum")
    total = ans.col("sum")
    ans.put("sum", np.where(ans.has("n") & np.isnan(total), raw_sum, total))
    multi = ans.has("first_ts")  # several samples per step: the timestamp forms hold
    last_ts = ans.pop("last_ts")
    ans.put("first", np.where(multi, ans.pop("first_ts"), first))
    ans.put("last", np.where(multi, np.where(np.isnan(last_ts), np.nan_to_num(last), last_ts),
                             last))
    ans.put("changes", np.where(multi, ans.col("changes"), np.nan))


def _overlapping(data: PushdownData, ids: _SeriesCodes) -> list[dict[str, set[str]]]:
    """Per chunk: the GPUs (UUID label -> values) whose series' [first, last] overlap."""
    ans = data.answers
    out: list[dict[str, set[str]]] = [{} for _ in data.chunks]
    rows = np.flatnonzero(ans.has("first") & ans.has("last"))
    first, last = ans.col("first")[rows], ans.col("last")[rows]
    codes, chunk_of = ans.code[rows], ans.chunk[rows]
    uuids = [data.ids[c].gpu_uuid for c in codes.tolist()]
    by: dict[tuple[int, str], list[tuple[float, float, int]]] = {}
    for k in range(rows.shape[0]):
        by.setdefault((int(chunk_of[k]), uuids[k]), []).append(
            (float(first[k]), float(last[k]), int(codes[k])))
    for (i, _uuid), spans in by.items():
        if len(spans) < 2:
            continue
        spans.sort()
        if any(spans[k + 1][0] <= max(x[1] for x in spans[:k + 1])
               for k in range(len(spans) - 1)):
            for _f, _l, code in spans:
                name, value = ids.uuid_label[code]
                out[i].setdefault(name, set()).add(value)
    return out


class _SeriesCodes:
    """Series identity of query answers -> code in ``data.ids``. A store writes each
    series' labels the same way in every answer, so the label object's JSON text keys a
    cache and :func:`gpuaudit.measure.fleet.dcgm.series_id` runs once per series, not once
    per answer row (the labels are not even parsed again)."""

    def __init__(self, data: PushdownData, url: str, identify: Identify) -> None:
        self.data = data
        self.url = url
        self.identify = identify
        self.by_raw: dict[bytes, int] = {}
        self.by_labels: dict[tuple[tuple[str, str], ...], int] = {}
        self.by_id: dict[SeriesId, int] = {}
        self.lock = threading.Lock()
        self.uuid_label: dict[int, tuple[str, str]] = {}  # code -> (UUID or uuid, value)
        #: code -> the pod label that tells its series apart (exported_pod, else pod; "")
        self.pod_label: dict[int, tuple[str, str]] = {}

    def codes(self, raws: list[bytes], query: str) -> np.ndarray:
        get = self.by_raw.get
        out = [get(r) for r in raws]
        for k, c in enumerate(out):
            if c is None:
                out[k] = self.code(raws[k], query)
        return np.array(out, dtype=np.int64)

    def code(self, raw: bytes, query: str) -> int:
        code = self.by_raw.get(raw)
        if code is not None:
            return code
        labels = {str(k): str(v) for k, v in msgspec.json.decode(raw).items()}
        code = self.by_raw[raw] = self.code_of(labels, query)
        return code

    def code_of(self, labels: Mapping[str, str], query: str) -> int:
        """The code of the series ``labels`` (``__name__`` aside, as PromQL's answers drop
        it) names; a new one for a series not seen before."""
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))
        with self.lock:  # raw reads name their series from the query threads
            code = self.by_labels.get(key)
            if code is not None:
                return code
            named = dict(key)
            sid = self.identify(named, default_host="unknown",
                                where=f"{self.url}: pushdown {query}")
            code = self.by_id.get(sid)
            if code is None:
                code = self.by_id[sid] = len(self.data.ids)
                self.data.ids.append(sid)
                self.uuid_label[code] = ("UUID", named["UUID"]) if named.get("UUID") else \
                    ("uuid", named.get("uuid", ""))
                pod = "exported_pod" if "exported_pod" in named else \
                    "pod" if "pod" in named else ""
                self.pod_label[code] = (pod, named.get(pod, "")) if pod else ("", "")
            self.by_labels[key] = code
            return code


def _run(client: QueryClient, jobs: list[tuple[int, str, str]],
         chunks: list[tuple[float, float]], data: PushdownData, ids: _SeriesCodes,
         workers: int, what: str, *, end_s: float | None = None,
         local: _LocalView | None = None) -> dict[str, float]:
    """Evaluate ``jobs`` (chunk, name, PromQL) at their chunk's end, ``workers`` at a time,
    into ``data.answers``; NaN answers (nothing measured) are left out. Jobs of chunk -1 are
    fleet-wide aggregates evaluated at ``end_s``: returned by name, not stored per series.
    ``local``: each chunk's utilization view read raw and answered here, beside the jobs."""
    out: dict[str, float] = {}
    if not jobs and local is None:
        return out
    advance = client.progress(what, len(jobs)) if client.progress else None
    nchunks = data.answers.nchunks

    def run(job: tuple[int, str, str]) -> tuple[tuple[int, str, str],
                                                tuple[list[bytes], list[float]]]:
        i, name, expr = job
        at = chunks[i][1] if i >= 0 else end_s
        assert at is not None
        try:
            rows = client.query_rows(expr, at)
        except QueryTooLarge as exc:
            if i >= 0:
                raise  # a chunk's query: a shorter chunk makes it smaller (the caller's call)
            window = name.split()[0]
            fixed = QueryTooLarge(
                f"{exc.what} (the fleet's {window} utilization window, which holds every "
                f"series' samples of the last {window} whatever the chunk)", where=exc.where,
                fix="raise the store's limit (Prometheus --query.max-samples, "
                "VictoriaMetrics -search.maxSamplesPerQuery) or audit fewer series at a "
                "time (--match)")
            fixed.by_chunk = False
            raise fixed from exc
        if advance:
            advance(1)
        return job, rows

    # the raw reads one chunk at a time, beside the queries: a chunk's samples are the
    # largest thing a pull holds, so one in flight per store (not one per query worker)
    raw_pool: cf.ThreadPoolExecutor | None = None
    reads: list[cf.Future[None]] = []
    if local is not None:
        raw_pool = cf.ThreadPoolExecutor(max_workers=1)
        reads = [raw_pool.submit(local.read, i) for i in range(len(chunks))]
    try:
        with cf.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for (i, name, expr), (raws, values) in pool.map(run, jobs):
                if i < 0:
                    if values and values[0] == values[0]:
                        out[name] = values[0]
                    continue
                codes = ids.codes(raws, name)
                vals = np.array(values, dtype=np.float64)
                live = ~np.isnan(vals)  # NaN: nothing measured
                keys = codes[live] * nchunks + i
                data.answers.add(name, keys, vals[live])
                if local is not None and expr in local.witness:
                    local.named_by_store.append(keys)
        for i, f in enumerate(reads):
            try:
                f.result()
            except SourceUnavailableError as exc:  # (after the client's retries)
                assert local is not None
                local.unread[i] = exc.what  # the store's PromQL answers the chunk instead
    finally:
        if raw_pool is not None:
            raw_pool.shutdown(cancel_futures=True)
    if local is not None:
        local.verify()
        local.add_first_pass()
    data.answers.flush()
    return out


def _unread_notes(unread: Mapping[int, str], chunks: Sequence[tuple[float, float]],
                  url: str) -> list[ImportNote]:
    """One note for the chunks whose raw samples the store would not stream (count: how
    many), with its answer for the first (a store's answers differ by the request they
    quote, so one note per answer would be one per chunk)."""
    if not unread:
        return []
    idx = sorted(unread)
    which = chunks_starting([chunks[i][0] for i in idx])
    return [ImportNote(
        f"the store would not stream its raw DCGM_FI_DEV_GPU_UTIL samples of {which} (the "
        f"first: {unread[idx[0]]}): their utilization view was asked of its PromQL instead "
        "(the same figures, more of the store's CPU)", len(idx), where=url)]


#: what the first pass asks of every util series (the rest waits for the second pass's need)
_FIRST = ("n", "raw_n", "at_start", "at_end", "raw_sum", "umin", "umax")


class _LocalView:
    """The utilization view answered here (:func:`~gpuaudit.classify.pushdown_raw.util_answers`)
    from the store's raw samples, chunk by chunk: the first pass's answers go into the
    answers as the store's would; the second pass's are held until
    :func:`_second_pass_rows` says which rows need them (:meth:`settle`)."""

    def __init__(self, data: PushdownData, ids: _SeriesCodes, raw: RawUtil, step_s: float,
                 narrow: bool, witness: set[str]) -> None:
        self.data, self.ids, self.raw, self.step_s, self.narrow = data, ids, raw, step_s, narrow
        self.lock = threading.Lock()
        self.got: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.util_keys: list[np.ndarray] = []
        #: the store's queries whose answers name every util series with a sample in the
        #: chunk (its ``stddev_over_time``), and the keys they named
        self.witness = witness
        self.named_by_store: list[np.ndarray] = []
        #: chunk -> series its raw read left out, read twice: the store answers that chunk
        self.to_store: dict[int, int] = {}
        #: chunk -> why the store would not stream its raw samples (a limit on what its
        #: export may return, a proxy's timeout): the store answers that chunk too
        self.unread: dict[int, str] = {}

    def read(self, i: int) -> None:
        from gpuaudit.classify.pushdown_raw import util_answers

        a, b = self.data.chunks[i]
        series = self.raw.samples(a, b)
        codes = np.array([self.ids.code_of(labels, "raw DCGM_FI_DEV_GPU_UTIL")
                          for labels, _t, _v in series], dtype=np.int64)
        got = util_answers([t for _l, t, _v in series], [v for _l, _t, v in series], a_s=a,
                           b_s=b, step_s=self.step_s, left_open=self.raw.left_open,
                           edges_before=self.raw.edges_before)
        nch = self.data.answers.nchunks
        with self.lock:
            self.util_keys.append(codes * nch + i)
            for name, (idx, vals) in got.items():
                if name not in self.raw.names:
                    continue
                self.got.setdefault(name, []).append((codes[idx] * nch + i, vals))

    def verify(self) -> None:
        """Every util series the store's own answers name in a chunk must be in the raw
        read of that chunk (whose range holds the queries' windows). A chunk short of any
        is read again; still short, its raw answers are dropped and the chunk is listed in
        :attr:`to_store` for the store's PromQL to answer (a store's index can answer one
        request without series it answers the next: once in CI a VictoriaMetrics 1.79.5
        raw read of a day came back without its series; nothing is silently lost to it).
        A read again that the store refuses goes to :attr:`unread`, as a first read does."""
        for again in (True, False):
            short = self._short()
            for i, missed in sorted(short.items()):
                self._drop(i)
                if not again:
                    self.to_store[i] = missed
                    continue
                try:
                    self.read(i)
                except SourceUnavailableError as exc:
                    self.unread[i] = exc.what

    def _short(self) -> dict[int, int]:
        """Chunk -> util series the store named there that the raw read has not."""
        nch = self.data.answers.nchunks
        named = np.unique(np.concatenate(self.named_by_store)) if self.named_by_store \
            else np.zeros(0, np.int64)
        read = np.concatenate(self.util_keys) if self.util_keys else np.zeros(0, np.int64)
        missing = np.setdiff1d(named, read)
        chunk, count = np.unique(missing % nch, return_counts=True)
        given_back = self.given_back()
        return {int(i): int(n) for i, n in zip(chunk, count) if int(i) not in given_back}

    def given_back(self) -> set[int]:
        """The chunks the store's PromQL answers (short twice, or not streamed)."""
        return {*self.to_store, *self.unread}

    def _drop(self, i: int) -> None:
        """Chunk ``i``'s raw answers left out (before it is read again or given back)."""
        nch = self.data.answers.nchunks
        self.util_keys = [k[k % nch != i] for k in self.util_keys]
        self.got = {name: [(k[k % nch != i], v[k % nch != i]) for k, v in parts]
                    for name, parts in self.got.items()}

    def _column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        parts = self.got.get(name, [])
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0)
        return np.concatenate([k for k, _ in parts]), np.concatenate([v for _, v in parts])

    def add_first_pass(self) -> None:
        names = self.raw.names
        for name in [n for n in names if n in _FIRST or not self.narrow]:
            keys, vals = self._column(name)
            self.data.answers.add(name, keys, vals)

    def settle(self, wanted: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Put the held answers of the rows ``wanted`` asks for into the answers; returns
        what is left for the store (its MIG series, and the several-samples forms)."""
        ans = self.data.answers
        util = np.concatenate(self.util_keys) if self.util_keys else np.zeros(0, np.int64)
        is_util = np.isin(ans.key, util)
        left: dict[str, np.ndarray] = {}
        for nm, mask in wanted.items():
            if nm not in self.raw.names:
                left[nm] = mask
                continue
            keys, vals = self._column(nm)
            asked = np.isin(keys, ans.key[mask & is_util])
            ans.add(nm, keys[asked], vals[asked])
            rest = mask & ~is_util
            if rest.any():
                left[nm] = rest
        ans.flush()
        return left


#: the longest PromQL text a query may have: VictoriaMetrics refuses longer ones
#: (``-search.maxQueryLen``, 16 KiB by default: HTTP 422 "too long query")
MAX_QUERY_BYTES = 16_000


def _fitting(items: list[_T], build: Callable[[list[_T]], list[str]],
             limit: int | None = None) -> list[str]:
    """``build(items)``'s queries, the items halved until every query is at most ``limit``
    bytes (:data:`MAX_QUERY_BYTES`); a single item's queries are kept whatever their size."""
    limit = MAX_QUERY_BYTES if limit is None else limit
    exprs = build(items)
    if len(items) <= 1 or all(len(e.encode()) <= limit for e in exprs):
        return exprs
    half = len(items) // 2
    return _fitting(items[:half], build, limit) + _fitting(items[half:], build, limit)


def _batches(items: list[_T], size: int) -> list[list[_T]]:
    return [items[k:k + size] for k in range(0, len(items), size)]


def _sid_key(sid: SeriesId) -> tuple[Any, ...]:
    """A total order of series identities (None before any text), so merged answers are
    laid out the same however the fleet was split."""
    def t(x: str | None) -> tuple[bool, str]:
        return (x is not None, x or "")

    return (sid.gpu_uuid, sid.host, t(sid.pod), t(sid.namespace), t(sid.container),
            t(sid.mig_profile), t(sid.gpu_model),
            (sid.gpu_index is not None, sid.gpu_index or 0), sid.labels)


def merge_pushdown(parts: Sequence[tuple[str, PushdownData]], *,
                   dedupe: bool = False) -> PushdownData:
    """The answers of several stores and time shards (``(name, data)`` pairs, each from
    :func:`pull_aggregates` on chunks of one :func:`chunk_grid`) as one store holding
    everything would give them: every figure is a per-series, per-chunk sum computed wholly
    inside one store, so merging moves answers, never re-adds a series' numbers. Series are
    laid out in one canonical order (one part in, the same order out), so the
    :class:`Usage` built from the merge is the same to the last bit whichever way the fleet
    was split. Columnar: each part's rows are renumbered and concatenated, never unpacked.

    A GPU answered by two parts for the same chunk (HA replicas, or stores that both scrape
    a node) would be counted twice: an :class:`InputError` naming the GPU, the chunk and both
    stores; with ``dedupe`` the part with the most points for that GPU and chunk is kept
    (ties: the first part given), as Thanos' querier keeps one replica, and a note counts
    what was dropped."""
    if not parts:
        raise InputError("no store answered", fix="give at least one --prometheus URL")
    steps = {d.step_s for _, d in parts}
    if len(steps) > 1:
        raise InputError(
            "the stores were read at different steps: "
            + ", ".join(f"{n} {d.step_s:g} s" for n, d in parts),
            fix="give --step (the longest scrape interval) so every store is read alike")
    step_s = parts[0][1].step_s
    grid = sorted({c for _, d in parts for c in d.chunks})
    chunk_of = {c: i for i, c in enumerate(grid)}
    ng = max(1, len(grid))
    ids = sorted({sid for _, d in parts for sid in d.ids}, key=_sid_key)
    code_of = {sid: c for c, sid in enumerate(ids)}
    gpus = sorted({sid.gpu_uuid for sid in ids})
    gpu_of = {u: g for g, u in enumerate(gpus)}
    gpu_of_code = np.array([gpu_of[sid.gpu_uuid] for sid in ids], dtype=np.int64)
    # each part's rows in the merged numbering: series code and grid chunk
    mapped: list[tuple[np.ndarray, np.ndarray]] = []
    owner_keys, owner_part, owner_pts = [], [], []
    for p, (_name, d) in enumerate(parts):
        a = d.answers
        cmap = np.array([code_of[sid] for sid in d.ids], dtype=np.int64)
        kmap = np.array([chunk_of[c] for c in d.chunks], dtype=np.int64)
        code = cmap[a.code] if a.rows else np.zeros(0, np.int64)
        chunk = kmap[a.chunk] if a.rows else np.zeros(0, np.int64)
        mapped.append((code, chunk))
        # who answers for each (GPU, chunk): points per part
        gk = gpu_of_code[code] * ng + chunk
        pts = np.nan_to_num(a.col("n")) + np.nan_to_num(a.col("sm_n"))
        uk, inv = np.unique(gk, return_inverse=True)
        owner_keys.append(uk)
        owner_part.append(np.full(uk.shape[0], p, np.int64))
        owner_pts.append(np.bincount(inv, weights=pts, minlength=uk.shape[0]))
    okey = np.concatenate(owner_keys) if owner_keys else np.zeros(0, np.int64)
    opart = np.concatenate(owner_part) if owner_part else np.zeros(0, np.int64)
    opts = np.concatenate(owner_pts) if owner_pts else np.zeros(0)
    order = np.lexsort((opart, -opts, okey))  # by key; most points first; ties: first part
    okey, opart = okey[order], opart[order]
    first_of_key = np.ones(okey.shape[0], bool)
    first_of_key[1:] = okey[1:] != okey[:-1]
    dropped = int((~first_of_key).sum())
    if dropped and not dedupe:
        k = int(np.flatnonzero(~first_of_key)[0])
        key = int(okey[k])
        names = [parts[p][0] for p in sorted(set(opart[okey == key].tolist()))]
        raise InputError(
            f"GPU {gpus[key // ng]} is in {len(names)} stores ({', '.join(names)}) for the "
            f"chunk starting {utc_iso(grid[key % ng][0])}: counting both would bill it twice",
            where=", ".join(names),
            fix="if the stores are HA replicas give one of them (or a Thanos / "
            "Mimir querier that deduplicates), or pass --dedupe to keep the store "
            "with the most points per GPU and chunk")
    keep_key, keep_part = okey[first_of_key], opart[first_of_key]
    out_ans = Answers(ng)
    keys_all: list[np.ndarray] = []
    pieces: list[tuple[int, np.ndarray]] = []
    for p in range(len(parts)):
        code, chunk = mapped[p]
        gk = gpu_of_code[code] * ng + chunk
        pos = np.searchsorted(keep_key, gk)
        kept = keep_part[np.minimum(pos, max(keep_key.shape[0] - 1, 0))] == p \
            if keep_key.shape[0] else np.zeros(gk.shape[0], bool)
        keys_all.append(code[kept] * ng + chunk[kept])
        pieces.append((p, kept))
    merged = np.concatenate(keys_all) if keys_all else np.zeros(0, np.int64)
    layout = np.argsort(merged, kind="stable")
    out_ans.key = merged[layout]
    names = list(dict.fromkeys(n for _, d in parts for n in d.answers.cols))
    for name in names:
        col = np.concatenate([parts[p][1].answers.col(name)[kept] for p, kept in pieces])
        out_ans.cols[name] = col[layout]
    out = PushdownData(
        ids=ids, chunks=grid, step_s=step_s, answers=out_ans,
        origin=parts[0][1].origin if len(parts) == 1 else
        f"{len({n for n, _ in parts})} Prometheus-compatible stores (PromQL pushdown, step "
        f"{step_s:g} s): " + ", ".join(dict.fromkeys(d.origin.split(" (")[0]
                                                   for _, d in parts)),
        notes=[n for _, d in parts for n in d.notes],
        queries=sum(d.queries for _, d in parts),
        has_sm=any(d.has_sm for _, d in parts), shared=any(d.shared for _, d in parts))
    for label in ("1h", "24h"):
        sums = [d.fleet_util_sums[label] for _, d in parts if label in d.fleet_util_sums]
        if sums:
            total, count = sum(x for x, _ in sums), sum(c for _, c in sums)
            out.fleet_util_sums[label] = (total, count)
            out.fleet_util_pct[label] = total / count if count > 0 else None
    if dropped:
        out.notes.append(ImportNote(
            where="--dedupe", column="gpu_uuid", count=dropped,
            reason=f"{dropped} GPU-chunk(s) answered by more than one store: the store with "
            "the most points kept, the others' copies dropped (replicas)"))
    return out


def _phase_columns(a: Answers, rows: np.ndarray, step_s: float) -> np.ndarray:
    """PhaseTime fields (:data:`CELL_VALUE_COLUMNS`, one column each) of the rows ``rows``
    from their pushdown answers. A time-sliced GPU's series is weighted by its mean share
    over the chunk (``wsum / n``: exact when the pods sharing it overlap for the whole
    chunk)."""
    def get(name: str) -> np.ndarray:
        x: np.ndarray = np.nan_to_num(a.col(name)[rows])
        return x

    n = get("n")
    wsum = a.col("wsum")[rows]
    wsum = np.where(np.isnan(wsum), n, wsum)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(n > 0, wsum / np.where(n > 0, n, 1.0), 1.0)
    k = step_s * share
    cols = {
        "idle_s": get("idle") * k,
        "underutilized_s": get("under") * k,
        "productive_s": get("prod") * k,
        "compute_bound_s": get("cb") * k,
        "underutilized_unused_s": get("unused") * k / 100.0,
        "headroom_s": get("headroom") * k / 100.0,
        "busy_s": get("busy") * k / 100.0,
        "samples": n,
        "no_reading_s": np.zeros(n.shape[0]),
        "sm_idle_s": get("sm_idle") * k,
        "sm_underutilized_s": get("sm_under") * k,
        "sm_productive_s": get("sm_prod") * k,
        "sm_compute_bound_s": get("sm_cb") * k,
        "sm_busy_s": get("sm_busy") * k / 100.0,
        "gap_s": np.zeros(n.shape[0]),  # set per GPU below
    }
    return np.column_stack([cols[c] for c in CELL_VALUE_COLUMNS]) if n.shape[0] else \
        np.zeros((0, len(CELL_VALUE_COLUMNS)))


def _sum_by(index: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Per group sums of ``values`` (rows x columns), added in row order."""
    out = np.zeros((size, values.shape[1]))
    np.add.at(out, index, values)
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
    for label group keys. Columnar: every sum is a grouped sum over the answer rows."""
    keys = group_key_names(by)
    s = data.step_s
    a = data.answers

    def group_of(sid: SeriesId) -> tuple[str | None, ...]:
        labels = labels_for(sid) if labels_for else dict(sid.labels)
        out: list[str | None] = []
        for k in keys:
            out.append(labels.get(k[6:]) if k.startswith("label:") else getattr(sid, k))
        return tuple(out)

    rows = np.flatnonzero(a.has("n") | a.has("idle"))  # series with utilization readings
    code, chunk = a.code[rows], a.chunk[rows]
    pv = _phase_columns(a, rows, s)
    # GPU and cell (GPU x group) of each row, numbered in order of first appearance
    used = np.unique(code).tolist()
    groups = {c: group_of(data.ids[c]) for c in used}
    gpu_num: dict[str, int] = {}
    cell_num: dict[tuple[str, tuple[str | None, ...]], int] = {}
    gpu_of_code: dict[int, int] = {}
    cell_of_code: dict[int, int] = {}
    first_row = {c: k for k, c in reversed(list(enumerate(code.tolist())))}
    for c in sorted(used, key=first_row.__getitem__):
        uuid = data.ids[c].gpu_uuid
        gpu_of_code[c] = gpu_num.setdefault(uuid, len(gpu_num))
        cell_of_code[c] = cell_num.setdefault((uuid, groups[c]), len(cell_num))
    gpu_list = list(gpu_num)
    meta = {uuid: data.ids[c] for c in sorted(used, key=first_row.__getitem__)[::-1]
            for uuid in [data.ids[c].gpu_uuid]}
    gpu = np.array([gpu_of_code[c] for c in code.tolist()], dtype=np.int64)
    cell = np.array([cell_of_code[c] for c in code.tolist()], dtype=np.int64)
    ng = len(gpu_list)
    cells_mat = _sum_by(cell, pv, len(cell_num))
    cell_gpu = np.array([gpu_num[u] for u, _g in cell_num], dtype=np.int64)
    # per-chunk cells: (chunk, cell) in order of first appearance
    dkey = chunk * len(cell_num) + cell
    _u, first_at, dinv = np.unique(dkey, return_index=True, return_inverse=True)
    rank = np.empty(first_at.shape[0], np.int64)
    rank[np.argsort(first_at, kind="stable")] = np.arange(first_at.shape[0])
    day_index = rank[dinv.reshape(-1)]
    day_key = np.empty(first_at.shape[0], np.int64)
    day_key[day_index] = dkey
    day_mat = _sum_by(day_index, pv, first_at.shape[0])
    # the GPUs' spans, first to last point
    first = a.col("first")[rows]
    last = a.col("last")[rows]
    g_first = np.full(ng, np.inf)
    g_last = np.full(ng, -np.inf)
    np.minimum.at(g_first, gpu, np.where(np.isnan(first), np.inf, first))
    np.maximum.at(g_last, gpu, np.where(np.isnan(last), -np.inf, last))
    _spread_gaps_columns(cells_mat, cell_gpu, g_first, g_last, s)
    # per chunk: spans from every row with a first point
    srows = np.flatnonzero(a.has("first"))
    span_key = np.full(0, 0, np.int64)
    d_first = d_last = np.zeros(0)
    if srows.shape[0]:
        uu = [gpu_num.get(data.ids[c].gpu_uuid, -1) for c in a.code[srows].tolist()]
        sg = np.array(uu, dtype=np.int64)
        ok = sg >= 0
        skey = a.chunk[srows][ok] * max(ng, 1) + sg[ok]
        span_key, sinv = np.unique(skey, return_inverse=True)
        d_first = np.full(span_key.shape[0], np.inf)
        d_last = np.full(span_key.shape[0], -np.inf)
        f, la = a.col("first")[srows][ok], a.col("last")[srows][ok]
        np.minimum.at(d_first, sinv, np.where(np.isnan(f), np.inf, f))
        np.maximum.at(d_last, sinv, np.where(np.isnan(la), -np.inf, la))
    day_chunk = day_key // max(len(cell_num), 1)
    day_cell = day_key % max(len(cell_num), 1)
    day_gpu_key = day_chunk * max(ng, 1) + cell_gpu[day_cell] if day_key.shape[0] else day_key
    pos = np.searchsorted(span_key, day_gpu_key)
    pos_c = np.minimum(pos, max(span_key.shape[0] - 1, 0))
    has_span = (span_key.shape[0] > 0) & (span_key[pos_c] == day_gpu_key) \
        if span_key.shape[0] else np.zeros(day_key.shape[0], bool)
    sf = np.where(has_span, d_first[pos_c] if span_key.shape[0] else 0.0, np.inf)
    sl = np.where(has_span, d_last[pos_c] if span_key.shape[0] else 0.0, -np.inf)
    # a span per (chunk, GPU): group the per-chunk cells by it
    _spread_gaps_columns(day_mat, day_gpu_key, sf, sl, s, per_row_span=True, has=has_span)
    cell_list = list(cell_num)
    cells = _cells_table([(u, g, cells_mat[j]) for j, (u, g) in enumerate(cell_list)], keys,
                         meta)
    day_cells = _cells_table([(cell_list[int(c)][0], cell_list[int(c)][1], day_mat[j])
                              for j, c in enumerate(day_cell.tolist())], keys, meta,
                             days=[data.chunks[int(i)][0] for i in day_chunk.tolist()])
    series = _signals_columns(data, rows, gpu, gpu_list, meta, pv, g_first, g_last, s)
    t0 = float(g_first.min()) if ng else None
    t1 = float(g_last.max()) if ng else None
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


def _spread_gaps_columns(mat: np.ndarray, owner: np.ndarray, first: np.ndarray,
                         last: np.ndarray, step_s: float, *, per_row_span: bool = False,
                         has: np.ndarray | None = None) -> None:
    """Unobserved time of each GPU (its span, first to last point plus a step, less the
    observed time of all its cells), shared among its cells (rows of ``mat``, ``owner``:
    the GPU of each) by their observed time (in place). Local classify gives a gap to the
    sample before it; PromQL cannot say which. ``first``/``last``: per GPU, or per row
    (``per_row_span``, rows without a span in ``has`` get none)."""
    if mat.shape[0] == 0:
        return
    obs = mat[:, _OBS[0]] + mat[:, _OBS[1]] + mat[:, _OBS[2]] + mat[:, _OBS[3]]
    uo, inv = np.unique(owner, return_inverse=True)
    inv = inv.reshape(-1)
    tot = np.bincount(inv, weights=obs, minlength=uo.shape[0])
    cnt = np.bincount(inv, minlength=uo.shape[0])
    if per_row_span:
        f = np.zeros(uo.shape[0])
        la = np.zeros(uo.shape[0])
        f[inv], la[inv] = first, last
        ok = np.zeros(uo.shape[0], bool)
        if has is not None:
            ok[inv[has]] = True
    else:
        f, la = first[uo], last[uo]
        ok = np.isfinite(f) & np.isfinite(la)
    with np.errstate(invalid="ignore"):
        gap = np.maximum(0.0, la - f + step_s - tot)
    gap = np.where(ok & (gap > 1e-6), gap, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where(tot[inv] > 0, obs / np.where(tot[inv] > 0, tot[inv], 1.0),
                     1.0 / cnt[inv])
    mat[:, _GAP] += np.where(gap[inv] > 0, gap[inv] * w, 0.0)


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


def _signals_columns(data: PushdownData, rows: np.ndarray, gpu: np.ndarray,
                     gpu_list: list[str], meta: Mapping[str, SeriesId], pv: np.ndarray,
                     g_first: np.ndarray, g_last: np.ndarray, step_s: float,
                     ) -> tuple[SeriesSignals, ...]:
    """Each GPU's :class:`SeriesSignals` from grouped sums (maxima for :data:`MAX_FIELDS`)
    of its rows' answers; a field no row of the GPU answered stays absent."""
    a = data.answers
    ng = len(gpu_list)
    sig: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray] = {}
    mx: dict[str, np.ndarray] = {}
    for name, col in a.cols.items():
        if name in ("first", "last"):
            continue
        x = col[rows]
        hit = ~np.isnan(x)
        if not hit.any():
            continue
        if name in MAX_FIELDS:
            m = np.full(ng, -np.inf)
            np.maximum.at(m, gpu[hit], x[hit])
            mx[name] = np.where(np.bincount(gpu[hit], minlength=ng) > 0, m, np.nan)
        else:
            sig[name] = np.bincount(gpu, weights=np.where(hit, x, 0.0), minlength=ng)
            present[name] = np.bincount(gpu[hit], minlength=ng) > 0
    cnt_p = np.nan_to_num(a.col("cnt_power")[rows])
    std_p = a.col("std_power")[rows]
    with_sq = (cnt_p > 0) & ~np.isnan(std_p)
    if with_sq.any():
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_p = np.nan_to_num(a.col("sum_power")[rows]) / np.where(cnt_p > 0, cnt_p, 1.0)
        sq = np.where(with_sq, cnt_p * (np.nan_to_num(std_p) ** 2 + mean_p**2), 0.0)
        sig["sumsq_power"] = np.bincount(gpu, weights=sq, minlength=ng)
        present["sumsq_power"] = np.bincount(gpu[with_sq], minlength=ng) > 0
    c = {col: CELL_VALUE_COLUMNS.index(col) for col in CELL_VALUE_COLUMNS}
    obs_row = pv[:, c["idle_s"]] + pv[:, c["underutilized_s"]] + pv[:, c["productive_s"]] + \
        pv[:, c["compute_bound_s"]]
    derived = {
        "observed_s": obs_row, "busy_s": pv[:, c["busy_s"]], "idle_s": pv[:, c["idle_s"]],
        "high_s": pv[:, c["productive_s"]] + pv[:, c["compute_bound_s"]],
    }
    for name, x in derived.items():
        sig[name] = np.bincount(gpu, weights=x, minlength=ng)
        present[name] = np.ones(ng, bool)
    pods: list[set[str]] = [set() for _ in range(ng)]
    for cd, g in zip(a.code[rows].tolist(), gpu.tolist()):
        p = data.ids[cd].pod
        if p:
            pods[g].add(p)
    out = []
    for g, uuid in enumerate(gpu_list):
        sg = {k: float(v[g]) for k, v in sig.items() if present[k][g]}
        mg = {k: float(v[g]) for k, v in mx.items() if v[g] == v[g]}
        out.append(_signals(uuid, meta[uuid], {"sig": sg, "max": mg, "pods": pods[g]},
                            step_s))
    return tuple(out)


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
