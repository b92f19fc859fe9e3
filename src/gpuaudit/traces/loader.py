"""Load PyTorch profiler (Kineto) chrome traces into a columnar kernel timeline.

Reads ``torch.profiler`` output (``export_chrome_trace`` / ``tensorboard_trace_handler``),
plain ``.json`` or ``.json.gz``, one file per rank or a directory of them; ROCm traces (HIP
runtime events under cat ``cuda_runtime``) load the same way. Timestamps are Chrome-trace
microseconds, integral (older Kineto) or fractional with nanosecond digits (newer Kineto):
they are read as decimal text and converted to integer nanoseconds exactly, so no duration
turns negative by float rounding (HTA issue #317).

The document is validated and decoded by :mod:`gpuaudit.traces._kineto_json` (msgspec's C
parser, the events array in slices, only the keys an analysis reads); no dict is built per
event and neither pyarrow nor DuckDB is imported on this path (:attr:`RankTrace.kernels` builds
an Arrow table on demand). Events a later analysis does not need (CPU operators, flow arrows)
are only counted.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat
from operator import contains, or_
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuaudit.errors import InputError
from gpuaudit.traces import _kineto_json as kj
from gpuaudit.traces._kineto_parts import decode_events, decode_file, load_ranks

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["GPU_CATS", "FlopOps", "GpuEvents", "RankTrace", "Spans", "Trace", "TraceNote", "load_trace",
           "load_traces"]

I64 = np.int64
#: Kineto categories of events that run on the GPU (HTA's list for the idle breakdown).
GPU_CATS = ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")
#: CPU-side events that carry the launch's correlation id (CUDA and HIP runtime, driver API).
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "Runtime", "Driver")
_SPAN_CATS = ("user_annotation", "cpu_op", "python_function")
_OTHER_CATS = ("gpu_user_annotation", "ac2g", "fwdbwd", "Trace", "cpu_instant_event", "python",
               "cuda_sync", "cuda_profiler_range", "overhead", "Operator", "Mtia_runtime",
               "Mtia_ccp_events")
_ALL_CATS = GPU_CATS + RUNTIME_CATS + _SPAN_CATS + _OTHER_CATS
_N_GPU, _N_RT = len(GPU_CATS), len(RUNTIME_CATS)
_TRACE_CODE = _ALL_CATS.index("Trace")
_CPU_OP_CODE = _ALL_CATS.index("cpu_op")
_SPAN_NAME = re.compile(r"^ProfilerStep#|DataLoader")  # what _select keeps, as a pattern
_STEP_PREFIX, _DATALOADER = "ProfilerStep#", "DataLoader"
_ABSURD_DUR_NS = 24 * 3600 * 1_000_000_000  # a GPU event longer than a day is corrupt


@dataclass(frozen=True)
class TraceNote:
    """Something loading changed or dropped (the fields of :class:`gpuaudit.schema.ImportNote`,
    which the recording converts to; kept separate so loading never imports pyarrow)."""

    reason: str
    count: int
    where: str | None = None
    column: str | None = None


@dataclass(frozen=True)
class GpuEvents:
    """One rank's GPU events (kernels, memcpy, memset), sorted by (stream, start).

    Names and categories are interned: ``names[name_idx[i]]``; ``launch_names[launch_idx[i]]``
    is the runtime call that launched event ``i`` (-1: no launch event with its correlation).
    ``device`` is -1 where the event carries no ``args.device``; ``correlation`` is -1 where
    absent.
    """

    stream: np.ndarray
    device: np.ndarray
    name_idx: np.ndarray
    names: list[str]
    cat_idx: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    correlation: np.ndarray
    launch_ts_ns: np.ndarray
    has_launch: np.ndarray
    launch_idx: np.ndarray
    launch_names: list[str]

    @property
    def size(self) -> int:
        return int(self.ts_ns.size)

    def take(self, sel: np.ndarray) -> GpuEvents:
        return dataclasses.replace(self, **{
            f.name: getattr(self, f.name)[sel] for f in dataclasses.fields(self)
            if f.name not in ("names", "launch_names")})


@dataclass(frozen=True)
class Spans:
    """CPU spans kept from a rank: ProfilerStep#N and DataLoader iterations."""

    names: list[str]
    ts_ns: np.ndarray
    dur_ns: np.ndarray


@dataclass(frozen=True)
class FlopOps:
    """CPU operators that carry a FLOP count (``torch.profiler(with_flops=True)`` writes
    ``args.flops`` on operators it has a formula for: aten::mm, addmm, bmm, conv2d, mul, add
    ...). The counts are the profiler's own, from each operator's input shapes; ``ts_ns`` is
    when the operator ran on the CPU (its kernels run on the GPU later)."""

    names: list[str]
    name_idx: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    flops: np.ndarray

    @property
    def size(self) -> int:
        return int(self.ts_ns.size)

    @property
    def total(self) -> int:
        return int(self.flops.sum())


_NO_OPS = FlopOps([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                  np.zeros(0, np.int64))


@dataclass(frozen=True)
class RankTrace:
    """One rank's profile: its GPU events, launch events, CPU spans and metadata.

    ``gpu`` holds the GPU events (NumPy columns); :attr:`kernels` is the same as an Arrow table
    (stream, device, name, cat, ts_ns, dur_ns, correlation, launch_ts_ns, launch_name).
    ``spans`` holds ProfilerStep and DataLoader CPU spans; ``runtime_*`` the runtime events
    with a correlation id. Timestamps are the trace's own clock in ns; ``base_time_ns``
    (Kineto's ``baseTimeNanoseconds``) added to them gives Unix time when the trace has one.
    """

    rank: int
    path: Path
    meta: dict[str, Any]
    gpu: GpuEvents
    spans: Spans
    runtime_correlation: np.ndarray
    runtime_ts_ns: np.ndarray
    float_ts: bool
    profiler_span: tuple[int, int] | None
    base_time_ns: int
    host: str
    notes: tuple[TraceNote, ...] = ()
    flop_ops: FlopOps = _NO_OPS

    def device_name(self, device: int | None) -> str | None:
        """GPU marketing name from ``deviceProperties`` (None when the trace has none)."""
        props = self.meta.get("deviceProperties")
        if not isinstance(props, list):
            return None
        for p in props:
            if isinstance(p, dict) and (device is None or p.get("id") == device):
                name = p.get("name")
                return str(name) if name is not None else None
        return None

    def first_device(self) -> int | None:
        """The ``args.device`` of the first GPU event that has one."""
        d = self.gpu.device[self.gpu.device >= 0]
        return int(d[0]) if d.size else None

    @cached_property
    def kernels(self) -> pa.Table:
        """The GPU events as an Arrow table (built on first use; imports pyarrow)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        g = self.gpu

        def interned(names: list[str], idx: np.ndarray) -> pa.Array:
            valid = idx >= 0
            out = pc.take(pa.array(names, pa.string()),
                          pa.array(np.where(valid, idx, 0), pa.int64()))
            return pc.if_else(pa.array(valid), out, pa.nulls(idx.size, pa.string()))

        cats = np.array(_ALL_CATS, dtype=object)
        return pa.table({
            "stream": pa.array(g.stream, pa.int64()),
            "device": pa.array(g.device.astype(np.int32), mask=g.device < 0),
            "name": interned(g.names, g.name_idx) if g.size else pa.array([], pa.string()),
            "cat": pa.array(cats[g.cat_idx].tolist() if g.size else [], pa.string()),
            "ts_ns": pa.array(g.ts_ns, pa.int64()),
            "dur_ns": pa.array(g.dur_ns, pa.int64()),
            "correlation": pa.array(g.correlation, mask=g.correlation < 0),
            "launch_ts_ns": pa.array(g.launch_ts_ns, mask=~g.has_launch),
            "launch_name": interned(g.launch_names, g.launch_idx) if g.size
            else pa.array([], pa.string()),
        })


@dataclass(frozen=True)
class Trace:
    """Every rank of one profiled job, in rank order, and what loading changed or skipped."""

    ranks: tuple[RankTrace, ...]
    notes: tuple[TraceNote, ...] = field(default=())

    def timeline(self) -> pa.Table:
        """The kernel timeline of all ranks as one Arrow table with a ``rank`` column."""
        import pyarrow as pa

        tables = []
        for r in self.ranks:
            t = r.kernels
            tables.append(t.add_column(0, "rank", pa.array(np.full(t.num_rows, r.rank,
                                                                    dtype=np.int32))))
        if not tables:
            return pa.table({"rank": pa.array([], pa.int32())})
        return pa.concat_tables(tables)

    def all_notes(self) -> tuple[TraceNote, ...]:
        out = list(self.notes)
        for r in self.ranks:
            out.extend(r.notes)
        return tuple(out)


def _trace_files(paths: Sequence[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(q for q in p.iterdir()
                           if q.is_file() and (q.name.endswith(".json")
                                               or q.name.endswith(".json.gz")))
            if not found:
                raise InputError(
                    "the directory holds no .json or .json.gz trace",
                    where=str(p),
                    fix="point at the folder torch.profiler's tensorboard_trace_handler "
                    "wrote, or at the trace files themselves",
                )
            files.extend(found)
        elif p.exists():
            files.append(p)
        else:
            raise InputError("no such file or directory", where=str(p),
                             fix="check the path")
    return files


def load_traces(paths: Sequence[str | Path]) -> Trace:
    """Load one or more rank traces (files or directories) into a :class:`Trace`.

    A trace without ``distributedInfo.rank`` is rank 0 with a note (several such files get
    ranks by file order, also noted); two files claiming the same rank are an error.
    """
    files = _trace_files([Path(p) for p in paths])
    # several files are loaded side by side by helper processes where that pays
    ranks = load_ranks(files, load_trace, RankTrace)
    notes: list[TraceNote] = []
    missing = [r for r in ranks if "rank" not in _dist(r.meta)]
    if len(ranks) > 1 and missing:
        used = {r.rank for r in ranks if r not in missing}
        free = (i for i in range(len(ranks) * 2) if i not in used)
        ranks = [dataclasses.replace(r, rank=next(free)) if r in missing else r for r in ranks]
        notes.append(TraceNote(
            f"{len(missing)} trace(s) carry no distributedInfo.rank; ranks assigned by file "
            "name order", len(missing), where=str(missing[0].path)))
    seen: dict[int, Path] = {}
    for r in ranks:
        if r.rank in seen:
            raise InputError(
                f"rank {r.rank} appears in two traces ({seen[r.rank]} and {r.path})",
                where=str(r.path),
                fix="give one trace per rank (e.g. one profiling run's folder)",
            )
        seen[r.rank] = r.path
    ranks.sort(key=lambda r: r.rank)
    notes.extend(_skew_notes(ranks))
    return Trace(tuple(ranks), tuple(notes))


def _dist(meta: dict[str, Any]) -> dict[str, Any]:
    d = meta.get("distributedInfo")
    return d if isinstance(d, dict) else {}


def _skew_notes(ranks: list[RankTrace]) -> list[TraceNote]:
    """Ranks whose kernel windows do not overlap at all: their clocks disagree.

    Every analysis is per rank, on that rank's own clock, so skew changes no figure; it is
    reported because cross-rank timelines (and the recording's timestamps) would mislead.
    """
    spans = [(r.rank, r.base_time_ns + int(r.gpu.ts_ns.min()),
              r.base_time_ns + int((r.gpu.ts_ns + r.gpu.dur_ns).max()))
             for r in ranks if r.gpu.size]
    if len(spans) < 2:
        return []
    lo = max(s[1] for s in spans)
    hi = min(s[2] for s in spans)
    if lo <= hi:
        return []
    first = min(spans, key=lambda s: s[1])
    last = max(spans, key=lambda s: s[1])
    return [TraceNote(
        f"rank clocks look skewed: rank {last[0]} starts {(last[1] - first[1]) / 1e9:.3f} s "
        f"after rank {first[0]} and their kernel windows never overlap; per-rank figures "
        "are unaffected, cross-rank timestamps are not comparable", len(spans))]


def load_trace(path: str | Path, *, parts: bool = True) -> RankTrace:
    """Load one Kineto trace file (``.json`` or ``.json.gz``) into a :class:`RankTrace`.

    ``parts``: a large trace's events may be decoded in parts by helper processes where the
    process may use two cores or more (the same result: docs/traces.md, Loader)."""
    path = Path(path)
    got = decode_file(path, _ALL_CATS, _select) if parts else None
    if got is None:
        got = _decode_whole(path, parts)
    return _build_rank(path, *got)


def _decode_whole(path: Path, parts: bool) -> tuple[dict[str, Any], kj.Columns]:
    """The document read whole (inflated where gzip) and decoded (its events in parts where
    ``parts`` and it pays; :func:`~gpuaudit.traces._kineto_json.decode` validates it whole
    where its events cannot prove it); every error of a damaged trace is raised here."""
    data, _ = kj.read_document(path)
    try:
        return kj.decode(data, path, _ALL_CATS, _select,
                         events=decode_events if parts else None)
    except RecursionError as exc:  # msgspec's guard against a value nested too deep
        raise InputError("not a valid Kineto/Chrome trace: a JSON value nested too deep "
                         "(trace events and their args are flat objects)", where=str(path),
                         fix="give a trace written by torch.profiler") from exc
    except UnicodeDecodeError as exc:  # msgspec: invalid UTF-8 in a string or key
        raise InputError(f"not a valid Kineto/Chrome trace: byte 0x{exc.object[exc.start]:02x}"
                         " is not UTF-8 text", where=str(path),
                         fix="the file is damaged or not a trace; write it again with "
                         "torch.profiler") from None


def _select(is_x: np.ndarray, cat: np.ndarray,
            names_of: Callable[[np.ndarray], list[str]],
            has_flops: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Which events to keep: 1 GPU event, 2 runtime launch, 3 ProfilerStep#N or DataLoader
    CPU span, 4 the profiler's own span (cat ``Trace``), 5 a CPU operator with a FLOP count
    (``args.flops``, ``with_flops=True``); 0 the rest (other CPU operators, flows)."""
    kind = np.zeros(is_x.size, dtype=np.int8)
    kind[is_x & (cat >= 0) & (cat < _N_GPU)] = 1
    kind[is_x & (cat >= _N_GPU) & (cat < _N_GPU + _N_RT)] = 2
    cand = is_x & (cat >= _N_GPU + _N_RT) & (cat < _N_GPU + _N_RT + 3)
    # _SPAN_NAME as two C-level string tests (a regex search per CPU operator name cost
    # ~0.4 us each: most of the selector on an operator-heavy trace)
    names = names_of(cand)
    step = map(str.startswith, names, repeat(_STEP_PREFIX))
    loader_span = map(contains, names, repeat(_DATALOADER))
    hit = np.fromiter(map(or_, step, loader_span), bool, len(names))
    kind[np.flatnonzero(cand)[hit]] = 3
    kind[is_x & (cat == _TRACE_CODE)] = 4
    ops = is_x & (cat == _CPU_OP_CODE)
    hit = np.flatnonzero(ops)[has_flops(ops)]
    kind[hit[kind[hit] == 0]] = 5
    return kind


def _build_rank(path: Path, meta: dict[str, Any], c: kj.Columns) -> RankTrace:
    notes: list[TraceNote] = []
    where = str(path)
    rank = _dist(meta).get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool):
        notes.append(TraceNote(
            "the trace has no distributedInfo.rank; treated as rank 0", 1, where=where))
        rank = 0
    n_unknown = sum(c.unknown_cats.values())
    if n_unknown:
        notes.append(TraceNote(
            f"{n_unknown} events of unknown categories {list(c.unknown_cats)[:5]} ignored",
            n_unknown, where=where))
    k = c.kind
    ts, ts_ok, dur, dur_ok = c.ts_ns, c.ts_ok, c.dur_ns, c.dur_ok
    float_ts = bool((c.ts_frac & ((k == 1) | (k == 2))).any())

    # runtime launches with a correlation id
    rt = np.flatnonzero((k == 2) & c.correlation_ok)
    rt_corr, rt_ts, rt_name = c.correlation[rt], ts[rt], c.name_idx[rt]
    # CPU spans
    sm = np.flatnonzero((k == 3) & ts_ok & dur_ok)
    spans = Spans([c.names[i] for i in c.name_idx[sm].tolist()], ts[sm], dur[sm])
    # the profiler's own span
    profiler_span = None
    tr = np.flatnonzero((k == 4) & ts_ok & dur_ok)
    if tr.size:
        profiler_span = (int(ts[tr[0]]), int(ts[tr[0]] + dur[tr[0]]))
    flop_ops = _flop_ops(c, notes, where)
    # GPU events
    g_ev = np.flatnonzero(k == 1)
    n_gpu_raw = int(g_ev.size)
    timed = ts_ok[g_ev] & dur_ok[g_ev]
    keep = _drop(~timed, "GPU events without a timestamp or duration dropped", notes, where)
    keep &= _drop(keep & ~c.stream_ok[g_ev], "GPU events without an integer args.stream "
                  "dropped", notes, where)
    keep &= _drop(keep & (dur[g_ev] < 0), "GPU events with a negative duration dropped",
                  notes, where)
    g = g_ev[keep]
    names, name_idx = _reintern(c.names, c.name_idx[g])
    corr = np.where(c.correlation_ok[g], c.correlation[g], -1)
    launch_ts, has_launch, launch_row = _join_launch(corr, rt_corr, rt_ts)
    found = np.flatnonzero(has_launch)
    launch_names, lidx = _reintern(c.names, rt_name[launch_row[found]])
    launch_idx = np.full(g.size, -1, dtype=I64)
    launch_idx[found] = lidx
    missing = int(g.size - found.size)
    if missing:
        notes.append(TraceNote(
            f"{missing} GPU events have no runtime launch event with their correlation id "
            "(host wait cannot be judged for them)", missing, where=where))
    gpu = GpuEvents(
        stream=c.stream[g], device=np.where(c.device_ok[g], c.device[g], -1).astype(np.int32),
        name_idx=name_idx, names=names, cat_idx=c.cat[g], ts_ns=ts[g], dur_ns=dur[g],
        correlation=corr, launch_ts_ns=launch_ts, has_launch=has_launch,
        launch_idx=launch_idx, launch_names=launch_names)
    gpu = gpu.take(np.lexsort((gpu.ts_ns, gpu.stream)))
    gpu = _flag_absurd(gpu, profiler_span, notes, where)
    if n_gpu_raw == 0:
        notes.append(TraceNote(
            "the trace has no GPU events (kernel, gpu_memcpy, gpu_memset): was it recorded "
            "with ProfilerActivity.CUDA?", 1, where=where))
    base = meta.get("baseTimeNanoseconds")
    base_ns = int(base) if isinstance(base, (int, float)) else 0
    host = str(meta.get("host_name") or meta.get("hostname") or path.name)
    return RankTrace(
        rank=int(rank), path=path, meta=meta, gpu=gpu, spans=spans,
        runtime_correlation=rt_corr, runtime_ts_ns=rt_ts, float_ts=float_ts,
        profiler_span=profiler_span, base_time_ns=base_ns, host=host, notes=tuple(notes),
        flop_ops=flop_ops,
    )


def _flop_ops(c: kj.Columns, notes: list[TraceNote], where: str) -> FlopOps:
    """The operators with a FLOP count; counts that are not a whole number >= 0, and
    operators without a time, are dropped with a note (never read as zero)."""
    ev = np.flatnonzero(c.kind == 5)
    if not ev.size:
        return _NO_OPS
    keep = _drop(~(c.ts_ok[ev] & c.dur_ok[ev]), "operators with a FLOP count but no "
                 "timestamp or duration dropped", notes, where)
    keep &= _drop(keep & ~(c.flops_ok[ev] & (c.flops[ev] >= 0)), "operators whose FLOP "
                  "count cannot be read (args.flops not a whole number >= 0, or Input Dims "
                  "that do not fit the operator) dropped", notes, where)
    derived = int((keep & c.flops_derived[ev]).sum())
    if derived:
        notes.append(TraceNote(
            f"{derived} operator FLOP counts computed from their input shapes (the export "
            "has no args.flops, as torch 2.x writes none) with the profiler's own formulas "
            "for mm, addmm, bmm, baddbmm, conv2d, mul and add", derived, where=where))
    o = ev[keep]
    names, idx = _reintern(c.names, c.name_idx[o])
    return FlopOps(names, idx, c.ts_ns[o], c.dur_ns[o], c.flops[o])


def _reintern(table: list[str], idx: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The names ``idx`` uses (first use first) and each event's index into them; -1 stays
    -1 (no name)."""
    named = idx >= 0
    uniq, first, inv = np.unique(idx[named], return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(order.size, dtype=I64)
    rank[order] = np.arange(order.size)
    out = np.full(idx.size, -1, dtype=I64)
    out[named] = rank[inv.reshape(-1)]
    return [table[i] for i in uniq[order].tolist()], out


def _drop(bad: np.ndarray, reason: str, notes: list[TraceNote], where: str) -> np.ndarray:
    n = int(bad.sum())
    if n:
        notes.append(TraceNote(f"{n} {reason}", n, where=where))
    return ~bad


def _join_launch(corr: np.ndarray, rt_corr: np.ndarray, rt_ts: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each GPU event's launch (runtime/driver event with the same correlation id):
    (launch ts, found, row in the runtime arrays).

    One launch may have many GPU events (cudaGraphLaunch), so the join is many-to-one;
    matching by correlation rather than by runtime name keeps graph and cuLaunchKernelEx
    launches (HTA issue #290).
    """
    n = corr.size
    if not rt_corr.size or not n:
        return np.zeros(n, I64), np.zeros(n, bool), np.zeros(n, I64)
    order = np.argsort(rt_corr, kind="stable")
    rc = rt_corr[order]
    idx = np.minimum(np.searchsorted(rc, corr), rc.size - 1)
    found = (rc[idx] == corr) & (corr >= 0)
    row = order[idx]
    return np.where(found, rt_ts[row], 0), found, np.where(found, row, 0)


def _flag_absurd(gpu: GpuEvents, span: tuple[int, int] | None, notes: list[TraceNote],
                 where: str) -> GpuEvents:
    """Drop GPU events whose duration is corrupt (CUPTI sometimes reports years; HTA PR #325).

    Corrupt means longer than the profiler's own recorded span (or a day when the trace has
    none). They are counted in a note, not clamped: a clamped value would still be invented.
    """
    if gpu.size == 0:
        return gpu
    limit = max((span[1] - span[0]) if span else _ABSURD_DUR_NS, 1)
    bad = gpu.dur_ns > limit
    n = int(bad.sum())
    if n:
        worst = int(gpu.dur_ns[bad].max())
        notes.append(TraceNote(
            f"{n} GPU events with an impossible duration (up to {worst / 1e9:.3g} s, longer "
            f"than the {limit / 1e9:.3g} s profiled) dropped as corrupt", n, where=where))
        gpu = gpu.take(~bad)
    return gpu
