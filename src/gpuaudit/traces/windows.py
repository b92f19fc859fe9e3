"""A profiler trace as per-rank busy/idle series: plain NumPy columns, no Arrow.

Each rank becomes one GPU series: the kernel timeline is cut into windows (100 ms by
default) and each window becomes two samples, its busy time (``util_gpu_pct`` 100: the union
of the rank's GPU events over all streams) then its idle time (0), so the phase split of the
priced series *is* the trace's own busy/idle split: idle share = the trace's idle share, to
the nanosecond, whatever the window. (One sample per window at its busy share, as NVML
``utilization.gpu`` reads, would call a window 22% busy "underutilized" and show idle 0%
beside a trace that is 77% idle.) The last window is as long as what remains of the profiled
window: each series states its end (``end_ns``), so the last sample stands until the last
kernel ends, not one nominal interval past it. Timestamps are the trace clock plus Kineto's
``baseTimeNanoseconds`` (Unix time when present).

``gpuaudit trace`` classifies these columns directly
(:func:`gpuaudit.classify.columns.classify_columns`, from :mod:`gpuaudit.api.trace`);
:func:`gpuaudit.traces.recording.trace_to_recording` writes the same samples into a sample
table for everything that reads one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuaudit.traces.analysis import AnalysisOptions, prepare_rank
from gpuaudit.traces.intervals import busy_in_windows, merge
from gpuaudit.traces.loader import Trace, TraceNote

__all__ = ["RankSeries", "busy_series", "series_origin"]


@dataclass(frozen=True)
class RankSeries:
    """One rank's busy/idle samples: ``ts_ns`` (Unix ns when the trace has a base time),
    ``util_pct`` (100 busy, 0 idle, float32), the series' end, and who it is: ``gpu_uuid``
    ``trace:<host>:rank<r>:gpu<device>``, ``host`` (the trace's ``host_name``, else the file
    name), ``gpu_model`` (``deviceProperties``), ``device`` (None: unknown)."""

    rank: int
    host: str
    gpu_uuid: str
    gpu_model: str | None
    device: int | None
    source_file: str
    ts_ns: np.ndarray
    util_pct: np.ndarray
    end_ns: int


def busy_series(trace: Trace, *, window_s: float = 0.1,
                options: AnalysisOptions | None = None,
                ) -> tuple[list[RankSeries], list[TraceNote]]:
    """Every rank with GPU events as a :class:`RankSeries`, and a note for each rank
    without any (it has no samples)."""
    opt = options or AnalysisOptions()
    window_ns = round(window_s * 1e9)
    if window_ns <= 0:
        raise ValueError("window_s must be positive")
    out: list[RankSeries] = []
    notes: list[TraceNote] = []
    for r in trace.ranks:
        p = prepare_rank(r, opt)
        ms, me = merge(p.start, p.end)
        if ms.size == 0:
            notes.append(TraceNote(f"rank {r.rank} has no GPU events: no samples", 1,
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
        device = r.first_device()
        uuid = f"trace:{r.host}:rank{r.rank}:gpu{device if device is not None else 'unknown'}"
        out.append(RankSeries(
            rank=r.rank, host=r.host, gpu_uuid=uuid, gpu_model=r.device_name(device),
            device=device, source_file=r.path.name, ts_ns=ts[keep] + r.base_time_ns,
            util_pct=util[keep], end_ns=hi + r.base_time_ns))
    return out, notes


def series_origin(trace: Trace, window_s: float) -> str:
    """The sentence every report shows for where the samples came from."""
    files = ", ".join(sorted({r.path.name for r in trace.ranks}))
    return (f"PyTorch profiler trace(s) {files}: GPU busy and idle time per "
            f"{window_s * 1000:g} ms window from the kernel timeline")


def rows(series: Sequence[RankSeries]) -> int:
    """How many samples the series hold together."""
    return sum(int(s.ts_ns.shape[0]) for s in series)
