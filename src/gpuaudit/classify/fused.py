"""The engine's pass over a large batch as one compiled loop (numba): order check, step,
bands, idle stretches, busy onsets and, when asked, the timeline, per row in file order.

The NumPy path of :class:`~gpuaudit.classify.phases._Engine` groups a batch's rows by series
(a sort and a gather of every column), finds each row's successor, sets aside the rows whose
successor has not arrived, and accumulates the rest in some thirty passes (weights, band
keys, a weighted ``bincount`` per quantity, steps, idle stretches from running sums, the
timeline's buckets, the onsets). Here no row is moved: each series keeps its carried row (the
last one seen), and each new row of the series ends it. One loop then does per row what the
outputs need, into the very accumulators of the NumPy path (so ranges stitch, and the engine
finishes, exactly as before):

- the carried row's observed seconds (capped; the rest a gap) into its cell's band seconds,
  unused and busy seconds, gap, no-reading time and sample count;
- its series' u squared, step from the previous value, idle stretch (begun, continued, closed:
  closed ones into the gap histogram, the leading one kept apart, as
  :class:`~gpuaudit.classify.accumulate.SeriesStats` does);
- when the timeline is asked for, its bucket's band and utilization-weighted seconds and the
  histogram (:class:`~gpuaudit.classify.timeline.TimelineAcc`);
- when the lags are asked for, the new row's busy onset (:class:`~gpuaudit.classify.lag.OnsetAcc`).

The per-GPU maxima (memory used and total, temperature, the power limit: every nvidia-smi
log and sampler recording has the first two) go through a loop of their own beside it
(:func:`_max_signals`): each series' largest value, and the memory used bucketed on the
timeline as the NumPy path buckets it. So do the time-weighted mean signals (power, which
dcgm-exporter records on every GPU, PCIe and NVLink traffic, tensor and DRAM activity, the
host's and the process's CPU, with their idle and busy shares: :func:`_mean_signals`): each
series' value x seconds and seconds (power squared too, for its spread), and those the
timeline shows bucketed as the NumPy path buckets them.

Each series' state the loop reads and writes per row (its carried row, the statistics and
the onsets' state) is gathered into one record per series for the batch (:data:`STATE`) and
put back after it: a row touches one place for its series rather than some twenty arrays
(~15 % less time a row on a 1,000-GPU fleet).

The loop checks each row's time against its series' carried row as it goes; at the first
that does not come after it, the batch goes to the NumPy path, which raises the error naming
the GPU and time. Batches with time-sliced rows (``share``), SM activity (which also splits
the phases) or the throttle reasons take the NumPy path,
and so do batches under :data:`MIN_ROWS` and sources under :data:`MIN_SOURCE_ROWS`, where
the one-off cost of the loop (importing numba, ~0.5 s, and loading its machine code, compiled
once per machine and cached) would not pay back. Sums are added row by row rather than per batch, so a total may differ from the NumPy
path's in the last bits (a property test holds the two to 1e-9).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuaudit.classify.accumulate import GAP_EDGES_S, Grow, SeriesStats
from gpuaudit.classify.signals import MAX_SIGNALS, MEAN_SIGNALS, timeline_signals
from gpuaudit.classify.usage import HIST_EDGES_PCT

if TYPE_CHECKING:
    from gpuaudit.classify.lag import OnsetAcc
    from gpuaudit.classify.signals import Signals
    from gpuaudit.classify.timeline import TimelineAcc

__all__ = ["COLUMNS", "MAX_KEYS", "MEAN_KEYS", "MIN_ROWS", "MIN_SOURCE_ROWS", "STATE",
           "available",
           "loaded", "stream_batch", "warm"]

#: From this many rows in a batch on, the compiled loop is used (when numba imports and
#: GPUAUDIT_NO_NUMBA is not set)...
MIN_ROWS = 32_768
#: ... and only for a source of this many rows or more (its size where the file says so up
#: front, else the rows seen so far): importing numba and loading its machine code costs
#: ~0.3 s warm (~1.5 s on a machine's first run, compiling) and ~110 MiB, which the loop
#: wins back at ~80 ns a row. Measured (docs/benchmarks.md): 288k rows took 0.59 s with the
#: loop and 0.30 s without; 10.1M rows 1.38 s with and 1.88 s without.
MIN_SOURCE_ROWS = 4_000_000
#: The per-series maxima the loop takes beside (:func:`_max_signals`): their row-dict keys
MAX_KEYS = frozenset(f"max_{name}" for name in MAX_SIGNALS)
#: The time-weighted mean signals the loop takes beside (:func:`_mean_signals`; SM activity,
#: the row dict's ``sm``, also splits the phases and keeps the NumPy path): their keys
MEAN_KEYS = frozenset(f"sig_{name}" for name in MEAN_SIGNALS if name != "sm_active")
#: The row-dict keys the loop handles (see gpuaudit.classify.rows); any other takes NumPy.
COLUMNS = frozenset(("code", "ts", "cell", "u", "util")) | MAX_KEYS | MEAN_KEYS
#: the maximum the timeline buckets as a mean too (classify.signals.timeline_signals)
_TIMELINE_MAX = ("max_mem_used_mib", "mem_used_mib")

_N_HIST = len(HIST_EDGES_PCT) - 1
#: The per-cell sums the loop adds side by side (one row of a scratch array per cell), added
#: to the engine's cells after each batch; column 10 takes the idle band's unused time,
#: which no output reads.
CELL_SUMS = ("idle_s", "underutilized_s", "productive_s", "compute_bound_s",
             "underutilized_unused_s", "headroom_s", "busy_s", "gap_s", "no_reading_s",
             "samples")
_UNUSED_COL = np.array([10, 4, 5, 5], dtype=np.int64)
_kernel: Any = None
_state: bool | None = None


def available() -> bool:
    """Whether the compiled loop can be used (numba imports). The first call imports numba
    and loads the loop's machine code (:func:`warm`), with the cyclic collector paused
    (:func:`gpuaudit._heap.loading_code`)."""
    global _state, _kernel
    if _state is None:
        _state = False
        if not os.environ.get("GPUAUDIT_NO_NUMBA"):
            from gpuaudit._heap import loading_code

            with loading_code():
                try:
                    from gpuaudit.classify import _kernel as kernel
                except ImportError:
                    return False
                _kernel = kernel
                _state = True
                _load()
    return _state


def warm() -> None:
    """Load the loop's machine code now (a worker started ahead of its task does this while
    it waits); nothing where numba is not available."""
    available()


def _load() -> None:
    """The loop's machine code loaded (compiled on a machine's first run, then from numba's
    cache) through one tiny batch."""
    from gpuaudit.classify.accumulate import new_cells
    from gpuaudit.classify.lag import OnsetAcc

    ts = np.array([0, 1], dtype=np.int64)
    ts.setflags(write=False)  # as Arrow's timestamps come: the same machine code
    rows = {"code": np.zeros(2, dtype=np.int64), "ts": ts,
            "cell": np.zeros(2, dtype=np.int64), "u": np.array([5.0, 50.0]),
            "max_mem_used_mib": np.array([1.0, 2.0])}  # the maxima's loop too
    cells = new_cells()
    cells.ensure(1)
    stats = SeriesStats()
    stats.grow(1)
    onsets = OnsetAcc()
    onsets.grow(1)
    from gpuaudit.classify.signals import Signals

    signals = Signals()
    signals.grow(1)
    stream_batch(rows, None, 1, 3.0, cells, stats, None, onsets, signals)


def loaded() -> bool:
    """Whether the compiled loops are loaded already (nothing more to pay for using them)."""
    return _kernel is not None


def stream_batch(rows: dict[str, np.ndarray], pending: dict[str, np.ndarray] | None,
                 n_series: int, cap_s: float, cells: Grow, stats: SeriesStats,
                 timeline: TimelineAcc | None, onsets: OnsetAcc | None,
                 signals: Signals | None = None
                 ) -> tuple[dict[str, np.ndarray], int] | None:
    """Rows (in file order, keys :data:`COLUMNS`) through the loop, ``pending`` (at most one
    carried row per series) first. Returns the rows carried on (one per series, the row
    dict the NumPy path carries) and the latest end accumulated (-1: none); None when a
    timestamp repeats or runs backwards, which the NumPy path then reports as the order
    error it is (the series statistics, onsets and maxima may hold the rows before it by
    then: the engine is not used on after that error). ``signals``: where the per-series
    maxima go (rows with ``max_*`` keys need it)."""
    assert _kernel is not None
    st = _state_of(stats, onsets, n_series)
    if pending is not None and pending["code"].shape[0]:
        pc = pending["code"]
        st["pend"][pc] = True
        st["p_ts"][pc] = pending["ts"]
        st["p_cell"][pc] = pending["cell"]
        st["p_u"][pc] = pending["u"]
    code = np.ascontiguousarray(rows["code"], dtype=np.int64)
    ts = np.ascontiguousarray(rows["ts"], dtype=np.int64)
    # the earliest and latest timestamp of the carried rows and these (the timeline's
    # buckets); each series' order is checked in the loop itself
    t_lo, t_hi = int(ts.min()), int(ts.max())
    if pending is not None and pending["ts"].shape[0]:
        t_lo = min(t_lo, int(pending["ts"].min()))
        t_hi = max(t_hi, int(pending["ts"].max()))
    d = cells.data
    # the cells these rows touch: a range of ids (cells are numbered as first met, so a
    # batch's, grouped by the hour say, are the latest few thousand of many)
    cell = np.ascontiguousarray(rows["cell"], dtype=np.int64)
    c_lo, c_hi = int(cell.min()), int(cell.max()) + 1
    if pending is not None and pending["cell"].shape[0]:
        c_lo = min(c_lo, int(pending["cell"].min()))
        c_hi = max(c_hi, int(pending["cell"].max()) + 1)
    cell_acc = np.zeros((c_hi - c_lo, len(CELL_SUMS) + 1))
    if timeline is not None:
        # the buckets the accumulated rows fall in (a batch spans a few), bucket-major
        g = timeline.grid
        b_lo = min(max((t_lo - g.start_ns) // g.width_ns, 0), g.nb - 1)
        b_hi = min(max((t_hi - g.start_ns) // g.width_ns, 0), g.nb - 1) + 1
        uw = np.zeros((b_hi - b_lo, n_series))
        ph = np.zeros((b_hi - b_lo, n_series, 4))
        tl = (True, g.start_ns, g.width_ns, b_lo, b_hi, uw, ph, timeline.hist)
    else:
        tl = (False, 0, 1, 0, 1, np.zeros((1, 1)), np.zeros((1, 1, 4)), np.zeros(_N_HIST))
    n = code.shape[0]
    if onsets is not None:
        on = (True, onsets.head_ts, _max_onsets(), np.empty(n, np.int64),
              np.empty(n, np.int64))
    else:
        none_i = np.zeros(1, dtype=np.int64)
        on = (False, none_i, 0, none_i, none_i)
    u = np.ascontiguousarray(rows["u"], dtype=np.float64)
    util = np.ascontiguousarray(rows.get("util", u), dtype=np.float64)
    maxima = _max_signals(rows, pending, code, ts, u, float(cap_s), st, n_series, signals,
                          timeline, tl)
    maxima.update(_mean_signals(rows, pending, code, ts, u, float(cap_s), st, n_series,
                                signals, timeline, tl))
    n_on, t_end = _kernel.stream(
        code, cell, ts, u, util, float(cap_s), st, c_lo, cell_acc, _UNUSED_COL,
        stats.head_u, stats.head_run, stats.gap_hist, GAP_EDGES_S, *tl, *on,
    )
    _state_back(st, stats, onsets, n_series)
    if n_on < 0:  # a timestamp repeats or runs backwards: the caller raises the error
        return None
    for j, name in enumerate(CELL_SUMS):
        d[name][c_lo:c_hi] += cell_acc[:, j]
    if timeline is not None:
        timeline.acc.ensure(n_series)
        timeline.acc.uw[:n_series, b_lo:b_hi] += uw.T
        timeline.acc.ph[:n_series, b_lo:b_hi] += ph.transpose(1, 0, 2)
    if onsets is not None and n_on:
        onsets.parts.append((on[3][:n_on].copy(), on[4][:n_on].copy()))
    carried = np.flatnonzero(st["pend"])
    out = {"code": carried, "ts": st["p_ts"][carried], "cell": st["p_cell"][carried],
           "u": st["p_u"][carried]}
    for key, p_x in maxima.items():
        out[key] = p_x[carried]
    return out, int(t_end)


#: Each series' state as the loop keeps it, one record per series (a row reads and writes
#: one place per series instead of ~20 arrays): the carried row (``pend``: there is one),
#: then :class:`~gpuaudit.classify.accumulate.SeriesStats`' and
#: :class:`~gpuaudit.classify.lag.OnsetAcc`'s per-row state under their own names
STATE = np.dtype([
    ("p_ts", np.int64), ("p_cell", np.int64), ("p_u", np.float64),
    ("u2_w", np.float64), ("abs_step", np.float64), ("steps", np.float64),
    ("idle_runs", np.float64), ("last_u", np.float64), ("cur_idle", np.float64),
    ("max_idle", np.float64), ("on_kept", np.int64),
    ("pend", np.bool_), ("last_idle", np.bool_), ("started", np.bool_), ("head_idle", np.bool_),
    ("head_open", np.bool_), ("on_last_busy", np.bool_), ("on_head_seen", np.bool_),
    ("on_head_busy", np.bool_),
])
#: STATE's fields and where they live between batches: (field, owner, attribute); owner
#: "sums": stats.sums.data, "stats": stats, "onsets": onsets
_HOMES = (("u2_w", "sums", "u2_w"), ("abs_step", "sums", "abs_step"),
          ("steps", "sums", "steps"), ("idle_runs", "sums", "idle_runs"),
          ("last_u", "stats", "last_u"), ("cur_idle", "stats", "cur_idle_run"),
          ("max_idle", "stats", "max_idle_run"), ("last_idle", "stats", "last_idle"),
          ("started", "stats", "started"), ("head_idle", "stats", "head_idle"),
          ("head_open", "stats", "head_open"), ("on_kept", "onsets", "kept"),
          ("on_last_busy", "onsets", "last_busy"), ("on_head_seen", "onsets", "head_seen"),
          ("on_head_busy", "onsets", "head_busy"))


def _homes(stats: SeriesStats, onsets: OnsetAcc | None
           ) -> list[tuple[str, np.ndarray]]:
    owners: dict[str, Any] = {"sums": stats.sums.data, "stats": stats, "onsets": onsets}
    out = []
    for field, owner, name in _HOMES:
        home = owners[owner]
        if home is not None:
            out.append((field, home[name] if owner == "sums" else getattr(home, name)))
    return out


def _state_of(stats: SeriesStats, onsets: OnsetAcc | None, n_series: int) -> np.ndarray:
    """The series' state (:data:`STATE`) gathered from where it lives, no carried row yet."""
    st = np.zeros(n_series, dtype=STATE)
    for field, home in _homes(stats, onsets):
        st[field] = home[:n_series]
    return st


def _state_back(st: np.ndarray, stats: SeriesStats, onsets: OnsetAcc | None,
                n_series: int) -> None:
    """The loop's state (:data:`STATE`) put back where it lives."""
    for field, home in _homes(stats, onsets):
        home[:n_series] = st[field]


def _max_signals(rows: dict[str, np.ndarray], pending: dict[str, np.ndarray] | None,
                 code: np.ndarray, ts: np.ndarray, u: np.ndarray, cap_s: float,
                 st: np.ndarray, n_series: int,
                 signals: Signals | None, timeline: TimelineAcc | None, tl: tuple[Any, ...]
                 ) -> dict[str, np.ndarray]:
    """The rows' ``max_*`` columns (and the carried rows'): each series' maxima into
    ``signals``, and the memory used bucketed on the timeline as the NumPy path buckets it
    (:meth:`~gpuaudit.classify.timeline.TimelineAcc.add`, weighted by reading seconds), by
    a loop of their own (:func:`gpuaudit.classify._kernel.max_signals`, over copies of the
    carried rows' state in ``st``), before :func:`stream` changes it. Returns each key's
    value per series for the rows carried on."""
    keys, xs, p_x = _signal_columns(MAX_KEYS, rows, pending, code.shape[0], n_series)
    if not keys:
        return {}
    assert signals is not None
    names = [k.removeprefix("max_") for k in keys]
    smax = np.stack([signals.series_max[name][:n_series] for name in names])
    tl_col = -1
    tl_t = tl_x = np.zeros((1, 1))
    key_tl, name_tl = _TIMELINE_MAX
    if timeline is not None and key_tl in keys:
        j = keys.index(key_tl)
        # the signal is bucketed from the first batch with a value (as the NumPy path makes
        # its sums on first sight)
        if name_tl in timeline.acc.sig or not (np.isnan(xs[j]).all()
                                               and np.isnan(p_x[j]).all()):
            tl_col = j
            tl_t = np.zeros((tl[4] - tl[3], n_series))
            tl_x = np.zeros((tl[4] - tl[3], n_series))
    # (copies: the maxima's loop moves the carried rows on as it goes)
    pend, p_ts, p_u = (st[name].copy() for name in ("pend", "p_ts", "p_u"))
    _kernel.max_signals(code, ts, u, xs, cap_s, pend, p_ts, p_u, p_x, smax, tl_col,
                        *tl[1:5], tl_t, tl_x)
    for j, name in enumerate(names):
        signals.series_max[name][:n_series] = smax[j]
    if tl_col >= 0:
        assert timeline is not None
        timeline.acc.ensure(n_series)
        t_sum, x_sum = timeline.acc.signal(name_tl)
        t_sum[:n_series, tl[3]:tl[4]] += tl_t.T
        x_sum[:n_series, tl[3]:tl[4]] += tl_x.T
    return dict(zip(keys, p_x))


def _signal_columns(wanted: frozenset[str], rows: dict[str, np.ndarray],
                    pending: dict[str, np.ndarray] | None, n: int, n_series: int,
                    ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The keys of ``wanted`` the rows or the carried rows have (sorted), the rows' values
    one row per key (NaN where a row lacks the key) and the carried rows' values per
    series (``[key, series]``, NaN where none is carried)."""
    keys = sorted(k for k in wanted if k in rows or (pending is not None and k in pending))
    xs = np.stack([rows[k] if k in rows else np.full(n, np.nan) for k in keys]
                  ).astype(np.float64, copy=False) if keys else np.zeros((0, n))
    p_x = np.full((len(keys), n_series), np.nan)
    for j, key in enumerate(keys):
        if pending is not None and key in pending:
            p_x[j, pending["code"]] = pending[key]
    return keys, xs, p_x


def _mean_signals(rows: dict[str, np.ndarray], pending: dict[str, np.ndarray] | None,
                  code: np.ndarray, ts: np.ndarray, u: np.ndarray, cap_s: float,
                  st: np.ndarray, n_series: int,
                  signals: Signals | None, timeline: TimelineAcc | None, tl: tuple[Any, ...]
                  ) -> dict[str, np.ndarray]:
    """:func:`_max_signals` for the rows' ``sig_*`` columns: each series' time-weighted
    sums into ``signals`` as ``Signals.add`` makes them, and each signal the timeline shows
    bucketed as :meth:`~gpuaudit.classify.timeline.TimelineAcc.add` buckets it
    (:func:`gpuaudit.classify._kernel.mean_signals`)."""
    keys, xs, p_x = _signal_columns(MEAN_KEYS, rows, pending, code.shape[0], n_series)
    if not keys:
        return {}
    assert signals is not None  # (stream_batch's caller passes them with such rows)
    names = [k.removeprefix("sig_") for k in keys]
    sums = signals.sums.data
    sums_w = np.stack([sums[f"{name}_w"][:n_series] for name in names])
    sums_t = np.stack([sums[f"{name}_t"][:n_series] for name in names])
    power2_w = sums["power2_w"][:n_series].copy()
    power_row = names.index("power") if "power" in names else -1
    n_b = tl[4] - tl[3]
    tl_on = np.zeros(len(keys), dtype=np.bool_)
    tl_names: list[str | None] = []
    for j, key in enumerate(keys):
        shown = next(iter(timeline_signals({key: xs[j]})), None)
        # (bucketed from the first batch with a value, as the NumPy path makes its sums)
        tl_on[j] = timeline is not None and shown is not None and (
            shown in timeline.acc.sig
            or not (np.isnan(xs[j]).all() and np.isnan(p_x[j]).all()))
        tl_names.append(shown)
    tl_t = np.zeros((len(keys), n_b if tl_on.any() else 1, n_series if tl_on.any() else 1))
    tl_x = np.zeros_like(tl_t)
    pend, p_ts, p_u = (st[name].copy() for name in ("pend", "p_ts", "p_u"))
    _kernel.mean_signals(code, ts, u, xs, cap_s, pend, p_ts, p_u, p_x, sums_w, sums_t,
                         power_row, power2_w, tl_on, *tl[1:5], tl_t, tl_x)
    for j, name in enumerate(names):
        sums[f"{name}_w"][:n_series] = sums_w[j]
        sums[f"{name}_t"][:n_series] = sums_t[j]
    sums["power2_w"][:n_series] = power2_w
    if tl_on.any():
        assert timeline is not None
        timeline.acc.ensure(n_series)
        for j, shown in enumerate(tl_names):
            if tl_on[j] and shown is not None:
                t_sum, x_sum = timeline.acc.signal(shown)
                t_sum[:n_series, tl[3]:tl[4]] += tl_t[j].T
                x_sum[:n_series, tl[3]:tl[4]] += tl_x[j].T
    return dict(zip(keys, p_x))


def _max_onsets() -> int:
    from gpuaudit.classify import lag

    return int(lag.MAX_ONSETS)
