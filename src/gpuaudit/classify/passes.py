"""``classify``: one pass over a sample source, or row-group ranges on several cores, stitched.

The entry point of the stage. It feeds the samples through the phase engine
(:mod:`gpuaudit.classify.phases`) in this process, or hands a large Parquet recording's
row-group ranges to :mod:`gpuaudit.classify.parallel`, and turns the finished engine into a
:class:`~gpuaudit.classify.usage.Usage`. The per-GPU timeline is folded into that pass where the
window is known up front; elsewhere a re-readable source is read a second time for it here, so
every caller gets ``Usage.timeline`` from one place.

Modules below it do not import it: ``phases`` (the engine) <- ``parallel`` (ranges) <- this.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, TypeVar

from gpuaudit._heap import arrow_on_heap, keep_freed_memory
from gpuaudit.classify.lag import busy_onsets, onset_lags
from gpuaudit.classify.parallel import (
    MIN_ROWS_PER_WORKER,
    RANGES_PER_PROCESS,
    BoundaryOrderError,
    available_cpus,
    claim_ranges,
    classify_ranges,
)
from gpuaudit.classify.patterns import detect_patterns, job_patterns, multi_gpu_jobs
from gpuaudit.classify.phases import (
    _LARGE_ROWS,
    _NS,
    DEFAULT_CAP_INTERVALS,
    TIMELINE_BUCKETS,
    _Engine,
    engine_batches,
    group_key_names,
    unmatched_group_notes,
)
from gpuaudit.classify.timeline import Grid, timeline_for, timeline_grid
from gpuaudit.classify.usage import OnsetLag, SeriesSignals, Usage
from gpuaudit.errors import SampleTableError
from gpuaudit.validate import CAP_INTERVALS, INTERVAL_S, WORKERS

if TYPE_CHECKING:
    import pyarrow as pa

    from gpuaudit.schema import Recording, SampleSource

__all__ = ["classify", "classify_cells"]

T = TypeVar("T")


def classify(
    samples: SampleSource | Recording | pa.Table,
    *,
    by: Sequence[str] = (),
    interval_s: float | None = None,
    cap_intervals: float = DEFAULT_CAP_INTERVALS,
    findings: Iterable[object] = (),
    workers: int | None = None,
    timeline: bool = True,
) -> Usage:
    """Split every observed GPU-second into a phase, per GPU, per group and overall.

    ``samples`` is a :class:`~gpuaudit.schema.SampleSource` (streamed batch by batch), a
    :class:`~gpuaudit.schema.Recording` or a bare sample table. ``by`` adds group keys: table
    columns (host, pod, namespace, container, gpu_model, mig_profile) or label keys.
    ``interval_s`` overrides the nominal interval (else the source's, else inferred).
    ``workers``: how many processes share a large gpuaudit Parquet recording (row-group
    ranges, see :mod:`gpuaudit.classify.parallel`); None picks one per available core with at
    least 8M rows each; 1 reads it in this process. The result is the same either way.
    ``timeline``: build ``Usage.timeline`` (in the same pass where the window is known up
    front, else by reading a re-readable source once more; a one-shot stream gets none).
    """
    import pyarrow as pa  # a sample table's path (plain columns: classify.columns)

    from gpuaudit.schema import Recording

    if isinstance(samples, pa.Table):
        samples = Recording(table=samples, source="table", origin="an in-memory sample table")
    cap_intervals = CAP_INTERVALS.check(cap_intervals, "cap_intervals")
    if interval_s is not None:
        interval_s = INTERVAL_S.check(interval_s, "interval_s")
    if workers is not None:
        workers = int(WORKERS.check(workers, "workers"))
    keys = group_key_names(by)
    findings = tuple(findings)
    # the engine checks each GPU's time order in the pass it makes anyway: a file source
    # need not check it too; a violation is read again with the source's own check, which
    # names the file line
    defer = getattr(samples, "defer_order_check", None)
    if callable(defer) and getattr(samples, "rereadable", False) \
            and getattr(samples, "checks_order", False):
        defer()
        try:
            return _classify(samples, keys, interval_s, cap_intervals, findings, workers,
                             timeline)
        except SampleTableError as exc:
            if exc.column != "ts":
                raise
        finally:
            samples.checks_order = True  # type: ignore[union-attr]
    return _classify(samples, keys, interval_s, cap_intervals, findings, workers, timeline)


def _classify(samples: SampleSource | Recording, keys: tuple[str, ...],
              interval_s: float | None, cap_intervals: float, findings: tuple[object, ...],
              workers: int | None, timeline: bool) -> Usage:
    from gpuaudit.schema import Recording

    interval = interval_s if interval_s is not None else samples.interval_s
    rows = _rows_up_front(samples)
    if rows is not None and rows >= _LARGE_ROWS:
        keep_freed_memory()
        arrow_on_heap()  # the decoded columns from the tuned heap (see gpuaudit._heap)
    grid = _grid_up_front(samples, interval) if timeline else None
    recipes, claimed = _ranges(samples, workers, interval)
    engine: _Engine | None = None
    if recipes is not None and interval is not None:
        try:
            if claimed:
                engine = claim_ranges(recipes, keys, interval, cap_intervals, grid=grid,
                                      onsets=timeline,
                                      expected_rows=rows)
            else:
                engine = classify_ranges(recipes, keys, interval, cap_intervals, grid=grid,
                                         onsets=timeline)
        except BoundaryOrderError:
            engine = None  # one pass again: the reader names the file row of the bad sample
    if engine is None:
        engine = _Engine(keys, interval, cap_intervals, grid, onsets=timeline)
        engine.expected_rows = rows
        for i, batch in enumerate(engine_batches(samples, keys)):
            engine.feed(batch, position=f"{samples.origin} (batch {i})")
    engine.finish(getattr(samples, "series_end_ns", None))
    series = engine.series_signals()
    start = _dt(engine.t_min)
    end = _dt(engine.t_end)
    folded = None
    if engine.timeline is not None and start is not None and end is not None and (
            timeline_grid(start, end, engine.interval_s or 1.0, TIMELINE_BUCKETS)
            == engine.timeline.grid):  # the footer told the truth about the window
        folded = engine.timeline.timeline(list(engine.series_index),
                                            [m[0] for m in engine.series_meta])
    cells = engine.cells_table()
    wants_lags = timeline and (isinstance(samples, Recording)
                               or getattr(samples, "rereadable", False))
    # the lags from the onsets the pass gathered run beside the patterns: both are mostly
    # compiled loops that let go of the interpreter, and the other core is free by now
    lags = _beside(_lags, samples, series, engine) if wants_lags and engine.onsets is not None \
        else None
    usage = Usage(
        cells=cells,
        by=keys,
        series=series,
        patterns=detect_patterns(series, engine.interval_s or 1.0, folded),
        window_start=start,
        window_end=end,
        interval_s=engine.interval_s or 1.0,
        cap_s=(engine.interval_s or 1.0) * cap_intervals,
        source=samples.source,
        origin=samples.origin,
        notes=(*samples.notes, *unmatched_group_notes(cells, keys, engine.label_keys)),
        events=tuple(samples.events),
        findings=tuple(findings),
        timeline=folded,
    )
    if timeline and folded is None and (isinstance(samples, Recording)
                                        or getattr(samples, "rereadable", False)):
        usage = replace(usage, timeline=timeline_for(samples, usage))
    if usage.timeline is not None and folded is None:
        # the run's phases (warm-up, steady, cool-down) are judged on the timeline
        usage = replace(usage, patterns=detect_patterns(series, usage.interval_s,
                                                        usage.timeline))
    usage = replace(usage, job_patterns=job_patterns(series, usage.patterns))
    if lags is not None:
        usage = replace(usage, onset_lags=lags())
    elif wants_lags:
        usage = replace(usage, onset_lags=_lags(samples, series, engine))
    return usage


def _rows_up_front(samples: object) -> int | None:
    """The rows a source says it holds before it is read (a Parquet footer, rows held in
    memory), else None."""
    rows = getattr(samples, "num_rows", None)
    return rows if isinstance(rows, int) else None


def classify_cells(samples: SampleSource | Recording | pa.Table, *, by: Sequence[str] = (),
                   interval_s: float | None = None,
                   cap_intervals: float = DEFAULT_CAP_INTERVALS,
                   ) -> pa.Table:
    """The cells :func:`classify` gives (``Usage.cells``: the same rows, in the same order,
    the same sums) and nothing else: no series statistics, signals, patterns, timeline or
    lags. For callers that read only the phase seconds (the fleet audit's per-day cells and
    its 1 h / 24 h utilization); one pass in this process."""
    import pyarrow as pa

    from gpuaudit.schema import Recording

    if isinstance(samples, pa.Table):
        samples = Recording(table=samples, source="table", origin="an in-memory sample table")
    keys = group_key_names(by)
    interval = (INTERVAL_S.check(interval_s, "interval_s") if interval_s is not None
                else samples.interval_s)
    engine = _Engine(keys, interval, CAP_INTERVALS.check(cap_intervals, "cap_intervals"),
                     cells_only=True)
    # (a source that says its size up front takes the compiled loop from its first batch,
    # as classify's engine does: the same path, so the same bits, as classify's cells)
    engine.expected_rows = _rows_up_front(samples)
    for i, batch in enumerate(engine_batches(samples, keys)):
        engine.feed(batch, position=f"{samples.origin} (batch {i})")
    engine.finish(getattr(samples, "series_end_ns", None))
    return engine.cells_table()


def _beside(fn: Callable[..., T], *args: object) -> Callable[[], T]:
    """``fn(*args)`` started in a thread now; the returned call waits for its result (or
    raises its exception)."""
    import threading

    done: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(fn(*args))
        except BaseException as exc:  # handed to the waiting caller
            failed.append(exc)

    thread = threading.Thread(target=run, name="gpuaudit-lags", daemon=True)
    thread.start()

    def result() -> T:
        thread.join()
        if failed:
            raise failed[0]
        return done[0]

    return result


def _lags(samples: SampleSource | Recording, series: Sequence[SeriesSignals],
          engine: _Engine) -> tuple[OnsetLag, ...]:
    """The busy-onset lags of the GPUs in jobs of two or more, for stragglers by time lag
    (classify.lag): from the onsets the engine gathered in its pass, else from one more pass
    over three columns."""
    jobs = multi_gpu_jobs(series)
    if not jobs:
        return ()
    if engine.onsets is not None:
        return onset_lags(engine.onsets.onsets(list(engine.series_index)), jobs)
    return onset_lags(busy_onsets(samples, [u for v in jobs.values() for u in v]), jobs)


def _grid_up_front(samples: SampleSource | Recording, interval_s: float | None) -> Grid | None:
    """The timeline's buckets where the window is known before reading: a recording in
    memory, or a file whose footer gives the first and last timestamp."""
    if interval_s is None:
        return None
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpuaudit.schema import Recording

    if isinstance(samples, Recording):
        if samples.table.num_rows == 0:
            return None
        ts = samples.table.column("ts").cast(pa.int64())
        span: object = (pc.min(ts).as_py(), pc.max(ts).as_py())
    else:
        span = getattr(samples, "ts_range_ns", None)
    if not isinstance(span, tuple):
        return None
    lo, hi = span
    start, end = _dt(int(lo)), _dt(int(hi) + round(interval_s * _NS))
    if start is None or end is None:
        return None
    return timeline_grid(start, end, interval_s, TIMELINE_BUCKETS)


def _ranges(samples: SampleSource | Recording, workers: int | None,
            interval_s: float | None) -> tuple[list[Callable[[], SampleSource]] | None, bool]:
    """Row-group range recipes when the source can be split and it is worth it, and whether
    they are claimed from both ends by this process and one worker (two processes:
    :func:`~gpuaudit.classify.parallel.claim_ranges`) rather than one range per process."""
    split = getattr(samples, "split", None)
    if split is None or interval_s is None or workers == 1:
        return None, False
    procs = min(available_cpus(), 8) if workers is None else workers
    least = MIN_ROWS_PER_WORKER if workers is None else 1
    recipes: list[Callable[[], SampleSource]] | None = split(procs, min_rows_per_part=least)
    if recipes is None or len(recipes) < 2:
        return None, False
    if len(recipes) == 2 and CLAIM_RANGES:
        finer = split(2, min_rows_per_part=least, pieces=RANGES_PER_PROCESS)
        if finer is not None and len(finer) > 2:
            return finer, True
    return recipes, False


#: Two processes claim ranges from both ends (classify.parallel.claim_ranges) only where
#: this is set: where they meet moves from run to run, and with it how the per-cell float
#: sums are grouped, so the last bits (and a figure rounded at a .5 boundary) could differ
#: between runs of one file. Off until ranges are stitched in one fixed order.
CLAIM_RANGES = False


def _dt(ns: int | None) -> datetime | None:
    if ns is None:
        return None
    return datetime.fromtimestamp(ns // _NS, tz=timezone.utc).replace(
        microsecond=(ns % _NS) // 1000
    )
