"""``classify_columns``: the classify stage over samples given as plain columns, without Arrow.

A source that holds its samples as NumPy columns already (a profiler trace's per-rank
busy/idle series, :mod:`gpuaudit.traces.windows`) need not build a sample table to be
classified: :func:`classify_columns` feeds the same phase engine (:mod:`gpuaudit.classify.
phases`) the same rows, series by series, builds the timeline from them with the same
accumulator (:func:`gpuaudit.classify.timeline.timeline_of_rows`) and the busy-onset lags from
the onsets the engine gathers in its pass (:class:`gpuaudit.classify.lag.OnsetAcc`), and returns a
:class:`~gpuaudit.classify.usage.Usage` whose cells are :class:`~gpuaudit.classify.usage.
CellColumns`. It equals :func:`gpuaudit.classify.classify` of the same samples as a
:class:`~gpuaudit.schema.Recording` field for field (tests/traces/test_trace_plain_path.py
checks it on every real trace), and imports neither pyarrow nor pandas.

What plain columns carry: per series its identity (``gpu_uuid``, ``host``, ``gpu_model``,
``mig_profile``), timestamps and utilization, and where its observation ends; no other
signal, no labels, no ``--by`` keys (a trace has none).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import numpy as np

from gpuaudit.classify.lag import onset_lags
from gpuaudit.classify.patterns import detect_patterns, job_patterns, multi_gpu_jobs
from gpuaudit.classify.phases import DEFAULT_CAP_INTERVALS, TIMELINE_BUCKETS, _Engine
from gpuaudit.classify.rows import NS
from gpuaudit.classify.timeline import timeline_grid, timeline_of_rows
from gpuaudit.classify.usage import Usage
from gpuaudit.series import ImportNote
from gpuaudit.validate import CAP_INTERVALS

__all__ = ["SeriesColumns", "classify_columns"]


@dataclass(frozen=True)
class SeriesColumns:
    """One GPU's samples as plain columns: ``ts_ns`` (int64 epoch ns, strictly increasing)
    and ``util_pct`` (utilization %, NaN: no reading), of one length. ``end_ns``: where its
    observation ends (the last sample stands until then; None: one nominal interval)."""

    gpu_uuid: str
    host: str
    gpu_model: str | None
    mig_profile: str | None
    ts_ns: np.ndarray
    util_pct: np.ndarray
    end_ns: int | None = None


def classify_columns(
    series: Sequence[SeriesColumns],
    *,
    interval_s: float,
    source: str,
    origin: str,
    notes: Sequence[ImportNote] = (),
    events: Sequence[str] = (),
    cap_intervals: float = DEFAULT_CAP_INTERVALS,
    findings: Iterable[object] = (),
    timeline: bool = True,
) -> Usage:
    """Split every observed GPU-second of ``series`` into a phase, per GPU and overall, as
    :func:`gpuaudit.classify.classify` does for the same samples in a sample table
    (``interval_s``: the nominal interval; ``source``, ``origin``, ``notes``, ``events``: as
    a :class:`~gpuaudit.schema.Recording` states them)."""
    if not interval_s > 0:  # a source's own interval, as a Recording's (not a user's option)
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    cap_intervals = CAP_INTERVALS.check(cap_intervals, "cap_intervals")
    findings = tuple(findings)
    live = [s for s in series if s.ts_ns.shape[0]]
    grid = None
    if timeline and live:
        lo = min(int(s.ts_ns[0]) for s in live)
        hi = max(int(s.ts_ns[-1]) for s in live)
        start, end = _dt(lo), _dt(hi + round(interval_s * NS))
        grid = timeline_grid(start, end, interval_s, TIMELINE_BUCKETS)
    engine = _Engine((), interval_s, cap_intervals, grid, onsets=timeline)
    codes = [engine.add_series(s.gpu_uuid, s.host, s.gpu_model, s.mig_profile,
                               int(s.ts_ns[0])) for s in live]
    rows = _rows(live, codes)
    if rows is not None:
        engine.feed_columns(rows["code"], rows["ts"], rows["u"], position=origin)
    ends = {s.gpu_uuid: int(s.end_ns) for s in live if s.end_ns is not None}
    engine.finish(ends)
    signals = engine.series_signals()
    start_dt = _dt(engine.t_min) if engine.t_min is not None else None
    end_dt = _dt(engine.t_end) if engine.t_end is not None else None
    folded = None
    if engine.timeline is not None and start_dt is not None and end_dt is not None and (
            timeline_grid(start_dt, end_dt, engine.interval_s or 1.0, TIMELINE_BUCKETS)
            == engine.timeline.grid):
        folded = engine.timeline.timeline(list(engine.series_index),
                                          [m[0] for m in engine.series_meta])
    step_s = engine.interval_s or 1.0
    usage = Usage(
        cells=engine.cell_columns(), by=(), series=signals,
        patterns=detect_patterns(signals, step_s, folded),
        window_start=start_dt, window_end=end_dt, interval_s=step_s,
        cap_s=step_s * cap_intervals, source=source, origin=origin, notes=tuple(notes),
        events=tuple(events), findings=findings, timeline=folded,
    )
    if timeline and folded is None and rows is not None and start_dt and end_dt:
        index = {s.gpu_uuid: c for s, c in zip(live, codes)}
        hosts = [s.host for s in live]
        tl = timeline_of_rows([{**rows, "share": np.ones(rows["code"].shape[0])}], index,
                              hosts, start=start_dt, end=end_dt, interval_s=usage.interval_s,
                              cap_s=usage.cap_s, max_buckets=TIMELINE_BUCKETS)
        usage = replace(usage, timeline=tl,
                        patterns=detect_patterns(signals, usage.interval_s, tl))
    usage = replace(usage, job_patterns=job_patterns(signals, usage.patterns))
    jobs = multi_gpu_jobs(signals)
    if jobs and engine.onsets is not None:  # gathered in the engine's pass, as classify's
        usage = replace(usage, onset_lags=onset_lags(
            engine.onsets.onsets(list(engine.series_index)), jobs))
    return usage


def _rows(live: Sequence[SeriesColumns], codes: Sequence[int]) -> dict[str, np.ndarray] | None:
    """Every series' rows in one row dict, series after series (as a trace's recording
    holds them)."""
    if not live:
        return None
    return {
        "code": np.concatenate([np.full(s.ts_ns.shape[0], c, dtype=np.int64)
                                for s, c in zip(live, codes)]),
        "ts": np.concatenate([s.ts_ns.astype(np.int64, copy=False) for s in live]),
        "u": np.concatenate([s.util_pct.astype(np.float64) for s in live]),
    }


def _dt(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // NS, tz=timezone.utc).replace(
        microsecond=(ns % NS) // 1000)
