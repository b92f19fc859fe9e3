"""Load PyTorch profiler (Kineto) chrome traces into a columnar kernel timeline.

Reads ``torch.profiler`` output (``export_chrome_trace`` / ``tensorboard_trace_handler``),
plain ``.json`` or ``.json.gz``, one file per rank or a directory of them; ROCm traces (HIP
runtime events under cat ``cuda_runtime``) load the same way. Timestamps are Chrome-trace
microseconds, integral (older Kineto) or fractional with nanosecond digits (newer Kineto):
they are read as decimal text and converted to integer nanoseconds exactly, so no duration
turns negative by float rounding (HTA issue #317).

The events array is parsed by DuckDB's C++ JSON reader (``read_json(format='array')``)
straight into Arrow columns; no Python object is built per event. Events a later analysis
does not need (CPU operators, flow arrows) are only counted.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuaudit.errors import InputError
from gpuaudit.schema import ImportNote
from gpuaudit.traces._jsoncut import cut_trace_events

__all__ = ["GPU_CATS", "RankTrace", "Trace", "load_trace", "load_traces"]

#: Kineto categories of events that run on the GPU (HTA's list for the idle breakdown).
GPU_CATS = ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")
#: CPU-side events that carry the launch's correlation id (CUDA and HIP runtime, driver API).
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "Runtime", "Driver")
_KNOWN_CATS = frozenset(GPU_CATS + RUNTIME_CATS + (
    "cpu_op", "user_annotation", "gpu_user_annotation", "python_function", "ac2g", "fwdbwd",
    "Trace", "cpu_instant_event", "python", "cuda_sync", "cuda_profiler_range", "overhead",
    "Operator", "Mtia_runtime", "Mtia_ccp_events",
))
#: Span names kept from the CPU side: training steps and data-loader iterations.
_SPAN_SQL = "(name LIKE 'ProfilerStep#%' OR name LIKE '%DataLoader%')"
_ABSURD_DUR_NS = 24 * 3600 * 1_000_000_000  # a GPU event longer than a day is corrupt

_COLUMNS = (
    "{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', tid: 'VARCHAR', ts: 'VARCHAR', "
    "dur: 'VARCHAR', args: 'STRUCT(stream VARCHAR, correlation VARCHAR, device VARCHAR)'}"
)


def _us_text_to_ns(col: str) -> str:
    # Exact decimal microseconds -> integer ns; scientific notation falls back to DOUBLE.
    return (
        f"COALESCE(TRY_CAST(TRY_CAST({col} AS DECIMAL(38,3)) * 1000 AS BIGINT), "
        f"TRY_CAST(round(TRY_CAST({col} AS DOUBLE) * 1000) AS BIGINT))"
    )


@dataclass(frozen=True)
class RankTrace:
    """One rank's profile: its GPU events, launch events, CPU spans and metadata.

    ``kernels`` columns: stream (int64), device (int32, null), name, cat, ts_ns, dur_ns
    (int64), correlation (int64, null), launch_ts_ns (int64, null: no runtime event seen),
    launch_name (the runtime call, e.g. ``cudaLaunchKernel``, ``cudaGraphLaunch``,
    ``hipExtModuleLaunchKernel``). ``spans`` holds ProfilerStep and DataLoader CPU spans
    (name, ts_ns, dur_ns). ``runtime`` holds runtime events (correlation, ts_ns, dur_ns).
    Timestamps are the trace's own clock in ns; ``base_time_ns`` (Kineto's
    ``baseTimeNanoseconds``) added to them gives Unix time when the trace has one.
    """

    rank: int
    path: Path
    meta: dict[str, Any]
    kernels: pa.Table
    spans: pa.Table
    runtime: pa.Table
    float_ts: bool
    profiler_span: tuple[int, int] | None
    base_time_ns: int
    host: str
    notes: tuple[ImportNote, ...] = ()

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


@dataclass(frozen=True)
class Trace:
    """Every rank of one profiled job, in rank order, and what loading changed or skipped."""

    ranks: tuple[RankTrace, ...]
    notes: tuple[ImportNote, ...] = field(default=())

    def timeline(self) -> pa.Table:
        """The kernel timeline of all ranks as one Arrow table with a ``rank`` column."""
        tables = []
        for r in self.ranks:
            t = r.kernels
            tables.append(t.add_column(0, "rank", pa.array(np.full(t.num_rows, r.rank,
                                                                    dtype=np.int32))))
        if not tables:
            return pa.table({"rank": pa.array([], pa.int32())})
        return pa.concat_tables(tables)

    def all_notes(self) -> tuple[ImportNote, ...]:
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


def load_traces(paths: Sequence[str | Path], *, threads: int | None = None) -> Trace:
    """Load one or more rank traces (files or directories) into a :class:`Trace`.

    A trace without ``distributedInfo.rank`` is rank 0 with a note (several such files get
    ranks by file order, also noted); two files claiming the same rank are an error.
    """
    files = _trace_files([Path(p) for p in paths])
    ranks: list[RankTrace] = []
    notes: list[ImportNote] = []
    with tempfile.TemporaryDirectory(prefix="gpuaudit-trace-") as tmp:
        for path in files:
            ranks.append(load_trace(path, tmp_dir=Path(tmp), threads=threads))
    missing = [r for r in ranks if "rank" not in _dist(r.meta)]
    if len(ranks) > 1 and missing:
        used = {r.rank for r in ranks if r not in missing}
        free = (i for i in range(len(ranks) * 2) if i not in used)
        fixed = []
        for r in ranks:
            if r in missing:
                r = RankTrace(**{**r.__dict__, "rank": next(free)})
            fixed.append(r)
        ranks = fixed
        notes.append(ImportNote(
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


def _skew_notes(ranks: list[RankTrace]) -> list[ImportNote]:
    """Ranks whose kernel windows do not overlap at all: their clocks disagree.

    Every analysis is per rank, on that rank's own clock, so skew changes no figure; it is
    reported because cross-rank timelines (and the recording's timestamps) would mislead.
    """
    spans = []
    for r in ranks:
        if r.kernels.num_rows:
            ts = r.kernels.column("ts_ns")
            end = pc.add(ts, r.kernels.column("dur_ns"))
            spans.append((r.rank, r.base_time_ns + int(pc.min(ts).as_py()),
                          r.base_time_ns + int(pc.max(end).as_py())))
    if len(spans) < 2:
        return []
    lo = max(s[1] for s in spans)
    hi = min(s[2] for s in spans)
    if lo <= hi:
        return []
    first = min(spans, key=lambda s: s[1])
    last = max(spans, key=lambda s: s[1])
    return [ImportNote(
        f"rank clocks look skewed: rank {last[0]} starts {(last[1] - first[1]) / 1e9:.3f} s "
        f"after rank {first[0]} and their kernel windows never overlap; per-rank figures "
        "are unaffected, cross-rank timestamps are not comparable", len(spans))]


def load_trace(path: str | Path, *, tmp_dir: Path | None = None,
               threads: int | None = None) -> RankTrace:
    """Load one Kineto trace file (``.json`` or ``.json.gz``) into a :class:`RankTrace`."""
    path = Path(path)
    if tmp_dir is None:
        with tempfile.TemporaryDirectory(prefix="gpuaudit-trace-") as tmp:
            return load_trace(path, tmp_dir=Path(tmp), threads=threads)
    cut = cut_trace_events(path, tmp_dir)
    try:
        events = _read_events(cut.array_path, path, cut.array_offset, threads)
    finally:
        cut.array_path.unlink(missing_ok=True)
    return _build_rank(path, cut.meta, events)


def _read_events(array_path: Path, path: Path, offset: int, threads: int | None) -> pa.Table:
    import duckdb

    con = duckdb.connect(config={"threads": threads or 2, "preserve_insertion_order": True})
    gpu = ", ".join(f"'{c}'" for c in GPU_CATS)
    rt = ", ".join(f"'{c}'" for c in RUNTIME_CATS)
    fname = str(array_path).replace("'", "''")
    sql = f"""
    WITH ev AS (
      SELECT ph, cat, name, tid, ts, dur, args.stream AS stream,
             args.correlation AS corr, args.device AS device,
             CASE WHEN ph = 'X' AND cat IN ({gpu}) THEN 1
                  WHEN ph = 'X' AND cat IN ({rt}) THEN 2
                  WHEN ph = 'X' AND cat IN ('user_annotation', 'cpu_op', 'python_function')
                       AND {_SPAN_SQL} THEN 3
                  WHEN ph = 'X' AND cat = 'Trace' THEN 4
                  ELSE 0 END AS kind
      FROM read_json('{fname}', format='array', columns={_COLUMNS},
                     maximum_object_size=268435456)
    )
    SELECT kind::TINYINT AS kind, ph, cat,
           CASE WHEN kind > 0 THEN name END AS name,
           {_us_text_to_ns('ts')} AS ts_ns,
           {_us_text_to_ns('dur')} AS dur_ns,
           CASE WHEN kind IN (1, 2) THEN contains(ts, '.') END AS float_ts,
           TRY_CAST(stream AS BIGINT) AS stream,
           stream IS NOT NULL AND TRY_CAST(stream AS BIGINT) IS NULL AS bad_stream,
           TRY_CAST(corr AS BIGINT) AS correlation,
           TRY_CAST(device AS INTEGER) AS device
    FROM ev
    """
    try:
        return con.sql(sql).to_arrow_table()
    except duckdb.Error as exc:
        msg = str(exc)
        byte = _locate_json_error(array_path)
        where = f"{path}: byte {offset + byte}" if byte is not None else str(path)
        raise InputError(
            f"invalid JSON in traceEvents: {msg.splitlines()[0][:300]}",
            where=where,
            fix="the trace file is damaged (cut short or edited); write it again with "
            "torch.profiler",
        ) from exc
    finally:
        con.close()


def _locate_json_error(array_path: Path, limit_bytes: int = 1 << 30) -> int | None:
    """Byte offset of the first JSON error in the events array (error path only).

    DuckDB names the record and the byte within it; :func:`json.loads` (C) gives the
    absolute position. Skipped above ``limit_bytes`` to keep memory bounded.
    """
    import json

    if array_path.stat().st_size > limit_bytes:
        return None
    try:
        json.loads(array_path.read_bytes())
    except json.JSONDecodeError as exc:
        return exc.pos
    except (UnicodeDecodeError, RecursionError):
        return None
    return None


def _build_rank(path: Path, meta: dict[str, Any], ev: pa.Table) -> RankTrace:
    notes: list[ImportNote] = []
    where = str(path)
    dist = _dist(meta)
    rank = dist.get("rank")
    if not isinstance(rank, int):
        notes.append(ImportNote(
            "the trace has no distributedInfo.rank; treated as rank 0", 1, where=where))
        rank = 0
    kind = ev.column("kind").to_numpy()
    # Unknown categories: counted, never silently dropped.
    cats = ev.column("cat")
    known = pc.is_in(cats, value_set=pa.array(sorted(_KNOWN_CATS)))
    unknown = pc.and_(pc.invert(pc.fill_null(known, True)), pc.is_valid(cats))
    n_unknown = int(pc.sum(unknown).as_py() or 0)
    if n_unknown:
        names = pc.unique(pc.filter(cats, unknown)).to_pylist()[:5]
        notes.append(ImportNote(
            f"{n_unknown} events of unknown categories {names} ignored", n_unknown, where=where))

    gpu = ev.filter(pa.array(kind == 1))
    n_gpu_raw = gpu.num_rows
    gpu = _clean_gpu(gpu, notes, where)
    rt = ev.filter(pa.array(kind == 2))
    rt = rt.filter(pc.is_valid(rt.column("correlation")))
    rt_sorted = rt.select(["correlation", "ts_ns", "dur_ns", "name"])
    spans = ev.filter(pa.array(kind == 3)).select(["name", "ts_ns", "dur_ns"])
    spans = spans.filter(pc.and_(pc.is_valid(spans.column("ts_ns")),
                                 pc.is_valid(spans.column("dur_ns"))))
    trace_ev = ev.filter(pa.array(kind == 4))
    profiler_span = None
    if trace_ev.num_rows:
        t0 = trace_ev.column("ts_ns")[0].as_py()
        d0 = trace_ev.column("dur_ns")[0].as_py()
        if t0 is not None and d0 is not None:
            profiler_span = (int(t0), int(t0) + int(d0))
    float_ts = bool(pc.any(pc.fill_null(ev.column("float_ts"), False)).as_py())
    gpu = _join_launch(gpu, rt_sorted, notes, where)
    gpu = _flag_absurd(gpu, profiler_span, notes, where)
    if n_gpu_raw == 0:
        notes.append(ImportNote(
            "the trace has no GPU events (kernel, gpu_memcpy, gpu_memset): was it recorded "
            "with ProfilerActivity.CUDA?", 1, where=where))
    base = meta.get("baseTimeNanoseconds")
    base_ns = int(base) if isinstance(base, (int, float)) else 0
    host = str(meta.get("host_name") or meta.get("hostname") or path.name)
    return RankTrace(
        rank=int(rank), path=path, meta=meta, kernels=gpu, spans=spans,
        runtime=rt_sorted.select(["correlation", "ts_ns", "dur_ns"]), float_ts=float_ts,
        profiler_span=profiler_span, base_time_ns=base_ns, host=host, notes=tuple(notes),
    )


def _clean_gpu(gpu: pa.Table, notes: list[ImportNote], where: str) -> pa.Table:
    gpu = gpu.select(["stream", "device", "name", "cat", "ts_ns", "dur_ns", "correlation",
                      "bad_stream"])
    no_time = pc.or_(pc.is_null(gpu.column("ts_ns")), pc.is_null(gpu.column("dur_ns")))
    n = int(pc.sum(no_time).as_py() or 0)
    if n:
        notes.append(ImportNote(f"{n} GPU events without a timestamp or duration dropped", n,
                                where=where))
        gpu = gpu.filter(pc.invert(no_time))
    no_stream = pc.is_null(gpu.column("stream"))
    n = int(pc.sum(no_stream).as_py() or 0)
    if n:
        notes.append(ImportNote(f"{n} GPU events without an integer args.stream dropped", n,
                                where=where))
        gpu = gpu.filter(pc.invert(no_stream))
    neg = pc.less(gpu.column("dur_ns"), 0)
    n = int(pc.sum(neg).as_py() or 0)
    if n:
        notes.append(ImportNote(f"{n} GPU events with a negative duration dropped", n,
                                where=where))
        gpu = gpu.filter(pc.invert(neg))
    return gpu.drop_columns(["bad_stream"])


def _join_launch(gpu: pa.Table, rt: pa.Table, notes: list[ImportNote],
                 where: str) -> pa.Table:
    """Attach each GPU event's launch (runtime/driver event with the same correlation id).

    One launch may have many GPU events (cudaGraphLaunch), so the join is many-to-one;
    matching by correlation rather than by runtime name keeps graph and cuLaunchKernelEx
    launches (HTA issue #290).
    """
    n = gpu.num_rows
    launch_ts = np.zeros(n, dtype=np.int64)
    found = np.zeros(n, dtype=bool)
    names = pa.nulls(n, pa.string())
    if rt.num_rows and n:
        rc = rt.column("correlation").to_numpy()
        order = np.argsort(rc, kind="stable")
        rc_sorted = rc[order]
        corr = gpu.column("correlation").fill_null(-1).to_numpy()
        idx = np.searchsorted(rc_sorted, corr)
        idx_c = np.minimum(idx, len(rc_sorted) - 1)
        found = rc_sorted[idx_c] == corr
        rts = rt.column("ts_ns").fill_null(0).to_numpy()[order]
        launch_ts = np.where(found, rts[idx_c], 0)
        take = pa.array(np.where(found, order[idx_c], 0))
        names = pc.if_else(pa.array(found), pc.take(rt.column("name"), take),
                           pa.nulls(n, pa.string()))
    mask = pa.array(~found)
    gpu = gpu.append_column("launch_ts_ns", pa.array(launch_ts, mask=~found))
    gpu = gpu.append_column("launch_name", names)
    missing = int((~found).sum())
    if missing and n:
        notes.append(ImportNote(
            f"{missing} GPU events have no runtime launch event with their correlation id "
            "(host wait cannot be judged for them)", missing, where=where))
    del mask
    order = np.lexsort((gpu.column("ts_ns").to_numpy(), gpu.column("stream").to_numpy()))
    return gpu.take(pa.array(order))


def _flag_absurd(gpu: pa.Table, span: tuple[int, int] | None, notes: list[ImportNote],
                 where: str) -> pa.Table:
    """Drop GPU events whose duration is corrupt (CUPTI sometimes reports years; HTA PR #325).

    Corrupt means longer than the profiler's own recorded span (or a day when the trace has
    none). They are counted in a note, not clamped: a clamped value would still be invented.
    """
    if gpu.num_rows == 0:
        return gpu
    limit = (span[1] - span[0]) if span else _ABSURD_DUR_NS
    limit = max(limit, 1)
    bad = pc.greater(gpu.column("dur_ns"), limit)
    n = int(pc.sum(bad).as_py() or 0)
    if n:
        worst = pc.max(pc.filter(gpu.column("dur_ns"), bad)).as_py()
        notes.append(ImportNote(
            f"{n} GPU events with an impossible duration (up to {worst / 1e9:.3g} s, longer "
            f"than the {limit / 1e9:.3g} s profiled) dropped as corrupt", n, where=where))
        gpu = gpu.filter(pc.invert(bad))
    return gpu
