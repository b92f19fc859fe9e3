"""A profiler trace as a gpuaudit recording (the sample table) plus trace-only findings.

Each rank becomes one GPU series: the kernel timeline is cut into windows (100 ms by
default) and each window becomes two samples, its busy time (``util_gpu_pct`` 100: the union
of the rank's GPU events over all streams) then its idle time (0), so the phase split of the
priced recording *is* the trace's own busy/idle split: idle share = the trace's idle share,
to the nanosecond, whatever the window. (One sample per window at its busy share, as NVML
``utilization.gpu`` reads, would call a window 22% busy "underutilized" and show idle 0%
beside a trace that is 77% idle.) The last window is as long as what remains of the
profiled window: the recording states each series' end (``series_end_ns``), so the last
sample stands until the last kernel ends, not one nominal interval past it. Timestamps are
the trace clock plus Kineto's ``baseTimeNanoseconds`` (Unix time when present).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gpuaudit.schema import ImportNote, Recording, build_table, validate
from gpuaudit.traces.analysis import (
    AnalysisOptions,
    RankAnalysis,
    TraceAnalysis,
    prepare_rank,
)
from gpuaudit.traces.intervals import busy_in_windows, merge
from gpuaudit.traces.loader import Trace

__all__ = ["TraceFinding", "findings", "rank_findings", "trace_to_recording"]


@dataclass(frozen=True)
class TraceFinding:
    """Evidence from a trace for the recommender: ``signal`` (e.g. ``input_stall_share``),
    its ``value`` (a ratio 0..1) and a sentence a person can read."""

    signal: str
    value: float
    sentence: str
    rank: int | None = None


def trace_to_recording(trace: Trace, *, window_s: float = 0.1,
                       options: AnalysisOptions | None = None) -> Recording:
    """The trace as a :class:`~gpuaudit.schema.Recording` of per-window busy shares.

    ``host`` is the trace's ``host_name`` (else the file name), ``gpu_uuid`` is
    ``trace:<host>:rank<r>:gpu<device>``, ``gpu_model`` comes from ``deviceProperties``.
    """
    opt = options or AnalysisOptions()
    window_ns = round(window_s * 1e9)
    if window_ns <= 0:
        raise ValueError("window_s must be positive")
    cols: dict[str, list[np.ndarray]] = {k: [] for k in
                                         ("ts", "util", "index")}
    hosts: list[str] = []
    uuids: list[str] = []
    models: list[str | None] = []
    labels: list[list[tuple[str, str]]] = []
    ends: dict[str, int] = {}
    notes: list[ImportNote] = [ImportNote(n.reason, n.count, n.where, n.column)
                               for n in trace.all_notes()]
    for r in trace.ranks:
        p = prepare_rank(r, opt)
        ms, me = merge(p.start, p.end)
        if ms.size == 0:
            notes.append(ImportNote(f"rank {r.rank} has no GPU events: no samples", 1,
                                    where=str(r.path)))
            continue
        lo, hi = int(ms.min()), int(me.max())
        edges = np.arange(lo, hi, window_ns, dtype=np.int64)
        edges = np.append(edges, hi)
        busy = np.clip(busy_in_windows(ms, me, edges), 0, np.diff(edges))
        # each window: its busy part (100%) from its start, then its idle part (0%)
        ts = np.stack([edges[:-1], edges[:-1] + busy], axis=1).ravel()
        util = np.tile(np.array([100.0, 0.0], dtype=np.float32), busy.size)
        length = np.stack([busy, np.diff(edges) - busy], axis=1).ravel()
        keep = length > 0
        ts, util = ts[keep], util[keep]
        n = ts.size
        device = r.first_device()
        cols["ts"].append(ts + r.base_time_ns)
        cols["util"].append(util)
        cols["index"].append(np.full(n, -1 if device is None else device, dtype=np.int16))
        uuid = f"trace:{r.host}:rank{r.rank}:gpu{device if device is not None else 'unknown'}"
        ends[uuid] = hi + r.base_time_ns
        hosts += [r.host] * n
        uuids += [uuid] * n
        models += [r.device_name(device)] * n
        labels += [[("source_file", r.path.name), ("rank", str(r.rank))]] * n
    if cols["ts"]:
        ts = np.concatenate(cols["ts"])
        idx = np.concatenate(cols["index"])
        table = build_table({
            "ts": pa.array(ts, pa.timestamp("ns", tz="UTC")),
            "host": hosts, "gpu_uuid": uuids, "gpu_model": models,
            "gpu_index": pa.array(idx, mask=idx < 0),
            "util_gpu_pct": np.concatenate(cols["util"]),
            "labels": pa.array(labels, pa.map_(pa.string(), pa.string())),
        })
    else:
        from gpuaudit.schema import empty_table

        table = empty_table()
    table = validate(table, source="trace")
    files = ", ".join(sorted({r.path.name for r in trace.ranks}))
    return Recording(
        table=table, source="trace",
        origin=f"PyTorch profiler trace(s) {files}: GPU busy and idle time per "
        f"{window_s * 1000:g} ms window from the kernel timeline",
        interval_s=window_s, notes=tuple(notes),
        meta={"ranks": str(len(trace.ranks)), "window_s": str(window_s)},
        series_end_ns=ends,
    )


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def rank_findings(a: RankAnalysis) -> list[TraceFinding]:
    """Trace evidence for one rank, as signals the recommender reads."""
    out: list[TraceFinding] = []
    if a.window_ns <= 0:
        return out
    idle = a.idle_ns
    if idle > 0 and a.dataloader_ns > 0:
        share = a.input_stall_ns / idle
        out.append(TraceFinding(
            "input_stall_share", share,
            f"rank {a.rank}: {_pct(share)} of GPU idle time falls inside DataLoader "
            f"iterations ({a.input_stall_ns / 1e6:.1f} ms of {idle / 1e6:.1f} ms): the GPU "
            "waits for input (raise num_workers, pin_memory, prefetch, or move decoding to "
            "the GPU with DALI)", a.rank))
    if idle > 0:
        host = a.idle_host_wait_ns / idle
        out.append(TraceFinding(
            "host_wait_share", host,
            f"rank {a.rank}: {_pct(host)} of GPU idle time is host wait (the next kernel was "
            "launched only after the GPU had gone idle)", a.rank))
    if a.matmul_ns > 0:
        tc = a.tensor_core_ns / a.matmul_ns
        out.append(TraceFinding(
            "tensor_core_share", tc,
            f"rank {a.rank}: {_pct(tc)} of matmul/convolution/attention kernel time runs on "
            "tensor cores" + ("; the rest is plain FP32 (sgemm): AMP/bf16 or TF32 would "
                              "use them" if tc < 0.5 else ""), a.rank))
    if a.kernel_count:
        small = a.small_kernel_count / a.kernel_count
        out.append(TraceFinding(
            "small_kernel_share", small,
            f"rank {a.rank}: {_pct(small)} of {a.kernel_count} GPU kernels run under 10 us; "
            f"{a.idle_kernel_wait_ns / 1e6:.1f} ms of idle is launch latency between queued "
            "kernels" + (" (CUDA graphs or torch.compile fuse them)" if small > 0.5 else ""),
            a.rank))
    if a.comm_ns > 0:
        exposed = a.comm_exposed_ns / a.window_ns
        out.append(TraceFinding(
            "comm_exposed_share", exposed,
            f"rank {a.rank}: communication not hidden behind computation takes "
            f"{_pct(exposed)} of the GPU window ({a.comm_exposed_ns / 1e6:.1f} ms; overlap "
            f"{(a.comm_comp_overlap_pct or 0):.1f}% of communication)", a.rank))
    return out


def findings(analysis: TraceAnalysis) -> list[TraceFinding]:
    """Findings of every rank, plus job-wide ones weighted by each rank's window."""
    out: list[TraceFinding] = []
    for a in analysis.ranks:
        out.extend(rank_findings(a))
    if len(analysis.ranks) > 1:
        by: dict[str, list[TraceFinding]] = {}
        for f in out:
            by.setdefault(f.signal, []).append(f)
        for signal, fs in by.items():
            # worst rank: most stall/exposure, but least tensor-core use
            pick = min if signal == "tensor_core_share" else max
            worst = pick(fs, key=lambda f: f.value)
            out.append(TraceFinding(signal, worst.value, f"job-wide worst rank: {worst.sentence}"))
    return out

