"""Where a rank's GPU time goes: busy/idle, idle causes, kernel classes, overlap, input stalls.

Definitions follow HolisticTraceAnalysis 0.5.0 (``TraceAnalysis.get_temporal_breakdown``,
``get_idle_time_breakdown``, ``get_gpu_kernel_breakdown(include_memory_kernels=True)``,
``get_comm_comp_overlap``); ``hta_compat=True`` also reproduces its rounding (float
timestamps: start ceiled, end floored to whole microseconds) and its NCCL regex. The
deliberate differences are listed in docs/traces.md. All arithmetic is integer nanoseconds
on NumPy arrays; neither pyarrow nor DuckDB is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuaudit.traces import kernels as kclass
from gpuaudit.traces.intervals import intersect_len, merge, sweep
from gpuaudit.traces.loader import RankTrace, Spans, Trace

__all__ = ["AnalysisOptions", "RankAnalysis", "TraceAnalysis", "analyze", "prepare_rank"]

_TYPES = (kclass.COMPUTATION, kclass.COMMUNICATION, kclass.MEMORY)


@dataclass(frozen=True)
class AnalysisOptions:
    """``hta_compat``: HTA 0.5.0's rounding and NCCL regex. ``include_last_step``: keep the
    last ProfilerStep (HTA drops it). ``kernel_wait_ns``: a gap under this on a stream whose
    next kernel was already launched is launch latency (HTA: 30, in microseconds).
    ``small_kernel_ns``: kernels shorter than this count as small (launch-bound)."""

    hta_compat: bool = False
    include_last_step: bool = False
    kernel_wait_ns: int = 30_000
    small_kernel_ns: int = 10_000


@dataclass
class PreparedRank:
    """One rank's GPU events after time normalisation and the last-step filter."""

    rank: int
    start: np.ndarray
    end: np.ndarray
    stream: np.ndarray
    launch: np.ndarray  # int64, -1 where unknown
    has_launch: np.ndarray
    name_idx: np.ndarray
    uniq_names: list[str]
    hta_type: np.ndarray  # per unique name
    category: np.ndarray  # per unique name
    tensor_core: np.ndarray  # per unique name
    spans: Spans
    dropped_last_step: int


@dataclass(frozen=True)
class RankAnalysis:
    """Figures for one rank, all in ns unless the name says otherwise."""

    rank: int
    window_ns: int
    busy_ns: int
    idle_ns: int
    compute_ns: int
    non_compute_ns: int
    kernel_count: int
    idle_by_stream: list[dict[str, Any]]
    idle_host_wait_ns: int
    idle_kernel_wait_ns: int
    idle_other_ns: int
    kernel_type_ns: dict[str, int]
    comm_ns: int
    comm_comp_overlap_ns: int
    comm_exposed_ns: int
    category_ns: dict[str, int]
    top_kernels: list[dict[str, Any]]
    matmul_ns: int
    tensor_core_ns: int
    small_kernel_count: int
    small_kernel_ns: int
    dataloader_ns: int
    input_stall_ns: int
    dropped_last_step: int

    @property
    def comm_comp_overlap_pct(self) -> float | None:
        return 100.0 * self.comm_comp_overlap_ns / self.comm_ns if self.comm_ns else None

    def as_dict(self) -> dict[str, Any]:
        """Every field plus the shares a report shows (ratios 0..1, None where undefined)."""
        def ratio(a: int, b: int) -> float | None:
            return a / b if b else None

        d = dict(self.__dict__)
        d["comm_comp_overlap_pct"] = self.comm_comp_overlap_pct
        w, idle = self.window_ns, self.idle_ns
        kernel_ns = sum(self.category_ns.values())
        d.update({
            "busy_share": ratio(self.busy_ns, w), "idle_share": ratio(idle, w),
            "compute_share": ratio(self.compute_ns, w),
            "non_compute_share": ratio(self.non_compute_ns, w),
            "host_wait_share_of_idle": ratio(self.idle_host_wait_ns, idle),
            "kernel_wait_share_of_idle": ratio(self.idle_kernel_wait_ns, idle),
            "input_stall_share_of_idle": ratio(self.input_stall_ns, idle),
            "tensor_core_share": ratio(self.tensor_core_ns, self.matmul_ns),
            "small_kernel_share": ratio(self.small_kernel_count, self.kernel_count),
            "comm_comp_overlap_share": ratio(self.comm_comp_overlap_ns, self.comm_ns),
            "comm_exposed_share": ratio(self.comm_exposed_ns, w),
            "category_share": {c: v / kernel_ns for c, v in self.category_ns.items()}
            if kernel_ns else {},
        })
        return d


@dataclass(frozen=True)
class TraceAnalysis:
    """Every rank's figures plus the job-wide kernel-type breakdown (HTA's pie)."""

    ranks: tuple[RankAnalysis, ...]
    kernel_type_ns: dict[str, int]
    options: AnalysisOptions
    notes: tuple[str, ...] = field(default=())

    def kernel_type_rows(self) -> list[dict[str, Any]]:
        total = sum(self.kernel_type_ns.values())
        rows = [{"kernel_type": k, "sum_ns": v, "pct": 100.0 * v / total if total else 0.0}
                for k, v in self.kernel_type_ns.items()]
        return sorted(rows, key=lambda r: -int(r["sum_ns"]))

    def as_dict(self) -> dict[str, Any]:
        return {
            "options": dict(self.options.__dict__),
            "ranks": [r.as_dict() for r in self.ranks],
            "kernel_type_breakdown": self.kernel_type_rows(),
            "notes": list(self.notes),
        }


def _us_float(ns: np.ndarray) -> np.ndarray:
    """Nanoseconds as float64 microseconds, the way a JSON float parser would hold them."""
    return (ns // 1000).astype(np.float64) + (ns % 1000) / 1000.0


def prepare_rank(r: RankTrace, opt: AnalysisOptions) -> PreparedRank:
    """Normalise one rank's times (HTA rounding when asked) and drop the last ProfilerStep."""
    g = r.gpu
    ts = g.ts_ns.astype(np.int64)
    end = ts + g.dur_ns
    has_launch = g.has_launch
    launch = np.where(has_launch, g.launch_ts_ns, -1)
    span_ts = r.spans.ts_ns
    if opt.hta_compat and r.float_ts:
        # HTA parses microseconds into float64 (0.25 us resolution at today's epoch), then
        # ceils ts and floors ts + dur: reproduce that arithmetic, errors included.
        ts_f = _us_float(ts)
        end_f = ts_f + (end - ts) / 1000.0
        ts = np.ceil(ts_f).astype(np.int64) * 1000
        end = np.floor(end_f).astype(np.int64) * 1000
        launch = np.where(has_launch, np.ceil(_us_float(launch)).astype(np.int64) * 1000, -1)
        span_ts = np.ceil(_us_float(span_ts)).astype(np.int64) * 1000
    keep = np.ones(ts.size, dtype=bool)
    step_mask = np.array([n.startswith("ProfilerStep") for n in r.spans.names], dtype=bool)
    n_steps = len({n for n, m in zip(r.spans.names, step_mask) if m})
    if not opt.include_last_step and n_steps >= 2:
        last_start = int(span_ts[step_mask].max())
        if opt.hta_compat:
            keep = has_launch & (launch < last_start)
        else:
            keep = np.where(has_launch, launch < last_start, ts < last_start)
    dropped = int((~keep).sum())
    sel = np.flatnonzero(keep)
    used, idx = np.unique(g.name_idx[sel], return_inverse=True)
    uniq = [g.names[i] for i in used.tolist()]
    htype, cat, tc = kclass.unique_classes(uniq, hta_compat=opt.hta_compat)
    return PreparedRank(
        rank=r.rank, start=ts[sel], end=end[sel], stream=g.stream[sel],
        launch=launch[sel], has_launch=has_launch[sel],
        name_idx=idx.astype(np.int64).reshape(-1), uniq_names=uniq,
        hta_type=htype, category=cat, tensor_core=tc,
        spans=Spans(r.spans.names, span_ts, r.spans.dur_ns), dropped_last_step=dropped,
    )


def _idle_by_stream(p: PreparedRank, opt: AnalysisOptions) -> list[dict[str, Any]]:
    """HTA's per-stream idle breakdown: each gap between consecutive events of a stream is
    host wait (the next event's launch came after the previous event ended), kernel wait
    (otherwise, gap under ``kernel_wait_ns``) or other."""
    rows: list[dict[str, Any]] = []
    if p.start.size == 0:
        return rows
    order = np.lexsort((p.start, p.stream))
    st, s, e = p.stream[order], p.start[order], p.end[order]
    launch, has = p.launch[order], p.has_launch[order]
    first = np.ones(st.size, dtype=bool)
    first[1:] = st[1:] != st[:-1]
    prev_end = np.empty_like(e)
    prev_end[1:] = e[:-1]
    gap = s - prev_end
    host = ~first & has & (launch > prev_end)
    kwait = ~first & ~host & (gap < opt.kernel_wait_ns)
    other = ~first & ~host & ~kwait
    if not opt.hta_compat:
        gap = np.maximum(gap, 0)  # overlapping neighbours leave no idle time
    seen_order = list(dict.fromkeys(p.stream.tolist()))  # HTA: streams in first-seen order
    for stream in seen_order:
        m = st == stream
        h = int(gap[m & host].sum())
        kw = int(gap[m & kwait].sum())
        o = int(gap[m & other].sum())
        total = h + kw + o
        cats = {"host_wait": (h, (m & host).any()), "kernel_wait": (kw, (m & kwait).any()),
                "other": (o, True)}
        for cat, (val, present) in cats.items():
            if present:
                rows.append({"rank": p.rank, "stream": int(stream), "idle_category": cat,
                             "idle_time_ns": val,
                             "idle_time_ratio": val / total if total else None})
    return rows


def _rank_idle_causes(p: PreparedRank, ms: np.ndarray, me: np.ndarray,
                      opt: AnalysisOptions) -> tuple[int, int, int]:
    """GPU-level idle split: each gap of the busy union is charged by the event that ends
    it: host wait when that event was launched after the GPU went idle, kernel wait when it
    was already queued and the gap is short, other otherwise. The three sum to idle."""
    if ms.size < 2:
        return 0, 0, 0
    gap_start, gap_end = me[:-1], ms[1:]
    gap = gap_end - gap_start
    # the first event starting each busy group (after the first)
    order = np.argsort(p.start, kind="stable")
    starts = p.start[order]
    pos = np.searchsorted(starts, gap_end, side="left")
    ev = order[np.minimum(pos, order.size - 1)]
    host = p.has_launch[ev] & (p.launch[ev] > gap_start)
    kwait = ~host & (gap < opt.kernel_wait_ns)
    return int(gap[host].sum()), int(gap[kwait].sum()), int(gap[~host & ~kwait].sum())


def _top_kernels(p: PreparedRank, dur: np.ndarray, n: int = 10) -> list[dict[str, Any]]:
    if dur.size == 0:
        return []
    nu = len(p.uniq_names)
    total = np.bincount(p.name_idx, weights=dur, minlength=nu)
    count = np.bincount(p.name_idx, minlength=nu)
    mx = np.zeros(nu, dtype=np.int64)
    np.maximum.at(mx, p.name_idx, dur)
    top = np.argsort(-total, kind="stable")[:n]
    all_time = float(dur.sum())
    return [{
        "name": p.uniq_names[int(i)],
        "category": str(p.category[i]),
        "tensor_core": bool(p.tensor_core[i]),
        "count": int(count[i]),
        "total_ns": int(total[i]),
        "mean_ns": float(total[i] / count[i]),
        "max_ns": int(mx[i]),
        "share_of_kernel_time": float(total[i] / all_time) if all_time else 0.0,
    } for i in top]


def analyze_rank(p: PreparedRank, opt: AnalysisOptions) -> RankAnalysis:
    """Every figure of one rank from its prepared events."""
    s, e = p.start, p.end
    dur = e - s
    ms, me = merge(s, e)
    if ms.size:
        window = int(me.max() - ms.min())
        busy = int((me - ms).sum())
    else:
        window = busy = 0
    ev_type = _codes(p.hta_type, _TYPES, p.name_idx)
    sets = {t: merge(s[ev_type == i], e[ev_type == i]) for i, t in enumerate(_TYPES)}
    comp = sets[kclass.COMPUTATION]
    compute = int((comp[1] - comp[0]).sum())
    states = sweep([sets[t] for t in _TYPES])
    type_ns: dict[str, int] = {}
    for mask, ns in states.items():
        label = " overlapping ".join(t for i, t in enumerate(_TYPES) if mask & (1 << i))
        type_ns[label] = type_ns.get(label, 0) + ns
    comm = sets[kclass.COMMUNICATION]
    comm_ns = int((comm[1] - comm[0]).sum())
    overlap = intersect_len(comm, comp)
    h, kw, o = _rank_idle_causes(p, ms, me, opt)
    cat = _codes(p.category, kclass.CATEGORIES, p.name_idx)
    category_ns = {c: int(dur[cat == i].sum()) for i, c in enumerate(kclass.CATEGORIES)
                   if (cat == i).any()}
    matmul = np.isin(cat, [kclass.CATEGORIES.index(c)
                           for c in ("gemm", "convolution", "attention")])
    tc = p.tensor_core[p.name_idx] if p.name_idx.size else np.zeros(0, dtype=bool)
    small = dur < opt.small_kernel_ns
    dl, stall = _input_stall(p, ms, me)
    return RankAnalysis(
        rank=p.rank, window_ns=window, busy_ns=busy, idle_ns=window - busy,
        compute_ns=compute, non_compute_ns=window - (window - busy) - compute,
        kernel_count=int(s.size), idle_by_stream=_idle_by_stream(p, opt),
        idle_host_wait_ns=h, idle_kernel_wait_ns=kw, idle_other_ns=o,
        kernel_type_ns=type_ns, comm_ns=comm_ns, comm_comp_overlap_ns=overlap,
        comm_exposed_ns=comm_ns - overlap, category_ns=category_ns,
        top_kernels=_top_kernels(p, dur), matmul_ns=int(dur[matmul].sum()),
        tensor_core_ns=int(dur[matmul & tc].sum()), small_kernel_count=int(small.sum()),
        small_kernel_ns=int(dur[small].sum()), dataloader_ns=dl, input_stall_ns=stall,
        dropped_last_step=p.dropped_last_step,
    )


def _codes(per_name: np.ndarray, table: tuple[str, ...], name_idx: np.ndarray) -> np.ndarray:
    """Each event's value (``per_name[name_idx]``, strings) as its index in ``table`` (-1:
    not in it): integer compares per event, not string ones."""
    code = np.array([table.index(v) if v in table else -1 for v in per_name.tolist()],
                    dtype=np.int8)
    return code[name_idx] if name_idx.size else np.zeros(0, np.int8)


def _input_stall(p: PreparedRank, ms: np.ndarray, me: np.ndarray) -> tuple[int, int]:
    """(DataLoader span time inside the GPU window, GPU idle time during DataLoader spans).

    DataLoader spans are CPU ranges whose name contains ``DataLoader`` (e.g.
    ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``).
    """
    if ms.size == 0:
        return 0, 0
    m = np.array(["DataLoader" in n for n in p.spans.names], dtype=bool)
    if not m.any():
        return 0, 0
    ts = p.spans.ts_ns[m]
    te = ts + p.spans.dur_ns[m]
    lo, hi = int(ms.min()), int(me.max())
    ts, te = np.clip(ts, lo, hi), np.clip(te, lo, hi)
    ds, de = merge(ts, te)
    idle_s, idle_e = me[:-1], ms[1:]
    dl = int((de - ds).sum())
    return dl, intersect_len((ds, de), (idle_s, idle_e))


def analyze(trace: Trace, options: AnalysisOptions | None = None) -> TraceAnalysis:
    """Analyse every rank of ``trace``; the kernel-type breakdown sums over ranks (HTA)."""
    opt = options or AnalysisOptions()
    ranks = []
    total: dict[str, int] = {}
    notes: list[str] = []
    for r in trace.ranks:
        p = prepare_rank(r, opt)
        ra = analyze_rank(p, opt)
        ranks.append(ra)
        for k, v in ra.kernel_type_ns.items():
            total[k] = total.get(k, 0) + v
        if p.dropped_last_step:
            notes.append(f"rank {r.rank}: {p.dropped_last_step} GPU events of the last "
                         "ProfilerStep left out (as HTA does; --include-last-step keeps them)")
    return TraceAnalysis(tuple(ranks), total, opt, tuple(notes))
