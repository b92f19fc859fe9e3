"""Accumulation: the seconds of each phase per cell, and the utilization statistics per series.

The phase engine (:mod:`gpuaudit.classify.phases`) hands over rows whose duration is known
(grouped by series, in time order). Here:

- :func:`weigh` turns durations into observed seconds (capped at ``cap_intervals`` nominal
  intervals; the rest is a gap), weighted by a time-sliced GPU's share;
- :func:`add_phase_seconds` adds them to the cells (idle, underutilized, productive,
  compute-bound, busy, headroom, gaps, no reading, and the same split on SM activity);
- :class:`SeriesStats` keeps what cells cannot give: the time-weighted sum of u squared, the
  steps between consecutive samples, idle stretches (count, longest, the one still open), and
  each series' head (first row), so that an engine that read the next range of the stream can
  be stitched on (:meth:`SeriesStats.absorb`).

Everything is a ``numpy.bincount`` over integer ids; nothing runs per row in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpuaudit.classify.rows import NS
from gpuaudit.classify.usage import CELL_VALUE_COLUMNS, IDLE_BELOW_PCT, add_phase_index

__all__ = ["Grow", "SeriesStats", "Weights", "absorb_cells", "add_phase_seconds", "grown", "new_cells",
           "weigh"]


@dataclass
class Grow:
    """Named float64 accumulators indexed by a growing integer id."""

    names: Sequence[str]
    size: int = 0
    data: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data = {n: np.zeros(0) for n in self.names}

    def ensure(self, n: int) -> None:
        if n <= self.size:
            return
        new = max(n, self.size * 2, 64)
        for k, v in self.data.items():
            grown = np.zeros(new)
            grown[: v.shape[0]] = v
            self.data[k] = grown
        self.size = new

    def add(self, name: str, ids: np.ndarray, weights: np.ndarray) -> None:
        if ids.size:
            # over the ids these rows touch only: a batch of a recording grouped by the hour
            # touches a few thousand of its ~10^6 cells
            lo, hi = int(ids.min()), int(ids.max()) + 1
            self.data[name][lo:hi] += np.bincount(ids - lo, weights=weights, minlength=hi - lo)


def grown(a: np.ndarray, size: int, fill: float | bool) -> np.ndarray:
    """``a`` extended to ``size`` entries with ``fill``."""
    out = np.full(size, fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


def new_cells() -> Grow:
    """The per-cell accumulators: one per :data:`~gpuaudit.classify.usage.CELL_VALUE_COLUMNS`."""
    return Grow(CELL_VALUE_COLUMNS)


@dataclass
class Weights:
    """What the rows' durations weigh (one value per row)."""

    obs: np.ndarray  #: observed seconds: the duration, capped
    obs_w: np.ndarray  #: ``obs`` times the row's share of the GPU
    gap: np.ndarray  #: unobserved seconds beyond the cap, times the share
    u_ok: np.ndarray  #: utilization %, 0 where there is no reading
    read_w: np.ndarray  #: ``obs_w``, 0 where there is no reading
    no_reading: np.ndarray | None  #: rows without a reading; None when every row has one


def weigh(r: dict[str, np.ndarray], dt_ns: np.ndarray, cap_s: float) -> Weights:
    """The rows' observed and unobserved seconds and reading weights."""
    dt_s = dt_ns * (1.0 / NS)
    obs = np.minimum(dt_s, cap_s)
    gap = dt_s - obs
    share = r.get("share")
    obs_w = obs
    if share is not None:
        obs_w = obs * share
        gap = gap * share
    u = r["u"]
    no_reading = np.isnan(u)
    has_nr = bool(no_reading.any())
    u_ok = np.where(no_reading, 0.0, u) if has_nr else u
    read_w = np.where(no_reading, 0.0, obs_w) if has_nr else obs_w
    return Weights(obs, obs_w, gap, u_ok, read_w, no_reading if has_nr else None)


def add_phase_seconds(cells: Grow, cell: np.ndarray, w: Weights, sm: np.ndarray | None
                      ) -> None:
    """Add the rows' seconds to their cells: per phase, busy and unused, gaps, no reading,
    the sample count and, where ``sm`` (SM activity 0-1) was measured, the SM view."""
    if not cell.size:
        return
    # over the range of cells these rows touch (a batch grouped by the hour touches a few
    # thousand of ~10^6 cells), as views into the accumulators
    lo, hi = int(cell.min()), int(cell.max()) + 1
    n = hi - lo
    d = {k: v[lo:hi] for k, v in cells.data.items()}
    cell = cell - lo
    u_ok, read_w = w.u_ok, w.read_w
    # one pass per quantity over (cell, phase) keys instead of one per phase; the phase
    # is how many of the edges 10, 70, 90 the utilization reaches
    key = add_phase_index(cell * 4, u_ok)
    by_phase = np.bincount(key, weights=read_w, minlength=4 * n).reshape(n, 4)
    unused_w = u_ok * -0.01
    unused_w += 1.0
    unused_w *= read_w
    unused = np.bincount(key, weights=unused_w, minlength=4 * n).reshape(n, 4)
    for k, name in enumerate(("idle_s", "underutilized_s", "productive_s", "compute_bound_s")):
        d[name] += by_phase[:, k]
    d["underutilized_unused_s"] += unused[:, 1]
    d["headroom_s"] += unused[:, 2] + unused[:, 3]
    d["busy_s"] += (by_phase - unused).sum(axis=1)
    if w.gap.any():
        d["gap_s"] += np.bincount(cell, weights=w.gap, minlength=n)
    if w.no_reading is not None:
        d["no_reading_s"] += np.bincount(cell, weights=np.where(w.no_reading, w.obs_w, 0.0),
                                         minlength=n)
    d["samples"] += np.bincount(cell, minlength=n)
    if sm is not None:
        sm_ok = ~np.isnan(sm)
        if sm_ok.any():
            sm_w = np.where(sm_ok, w.obs_w, 0.0)
            sm_pct = np.where(sm_ok, sm * 100.0, 0.0)
            sm_by = np.bincount(add_phase_index(cell * 4, sm_pct), weights=sm_w,
                                minlength=4 * n).reshape(n, 4)
            for k, name in enumerate(
                ("sm_idle_s", "sm_underutilized_s", "sm_productive_s", "sm_compute_bound_s")
            ):
                d[name] += sm_by[:, k]
            d["sm_busy_s"] += np.bincount(cell, weights=sm_w * sm_pct / 100.0, minlength=n)


def absorb_cells(cells: Grow, other: Grow, cmap: np.ndarray) -> None:
    """Add ``other``'s cells, whose id ``i`` is ``cmap[i]`` here (``cells`` holds them)."""
    for name in CELL_VALUE_COLUMNS:
        cells.data[name][cmap] += other.data[name][: cmap.shape[0]]


_STAT_SUMS = ("u2_w", "abs_step", "steps", "idle_runs")

#: Edges (seconds) of the idle-gap histogram: 0.01 s to 10,000 s, ten log bins a decade, plus
#: an underflow and an overflow bin. Closed gaps only (an idle stretch between two busy rows):
#: the leading stretch of a series (loading) and the trailing one (the job ended) say nothing
#: about its cadence. Counts add exactly across batches and row-group ranges.
GAP_EDGES_S = np.logspace(-2, 4, 61)
GAP_BINS = GAP_EDGES_S.shape[0] + 1


def gap_quantiles(hist: np.ndarray, qs: tuple[float, ...] = (0.25, 0.5, 0.75)
                  ) -> tuple[float, ...] | None:
    """Quantiles (seconds) of the closed idle gaps a histogram row counts, interpolated in
    log space inside the bin; None without gaps."""
    n = float(hist.sum())
    if n <= 0:
        return None
    cum = np.cumsum(hist)
    lo_edges = np.concatenate(([GAP_EDGES_S[0] / 10], GAP_EDGES_S))
    hi_edges = np.concatenate((GAP_EDGES_S, [GAP_EDGES_S[-1] * 10]))
    out = []
    for q in qs:
        b = int(np.searchsorted(cum, q * n, side="left"))
        before = cum[b - 1] if b > 0 else 0.0
        frac = (q * n - before) / hist[b] if hist[b] > 0 else 0.5
        lo, hi = np.log(lo_edges[b]), np.log(hi_edges[b])
        out.append(float(np.exp(lo + frac * (hi - lo))))
    return tuple(out)


class SeriesStats:
    """Per-series utilization statistics the cells cannot give, carried across batches."""

    def __init__(self) -> None:
        #: u2_w: time-weighted u squared; abs_step, steps: |u - previous u| summed and
        #: counted; idle_runs: idle stretches begun
        self.sums = Grow(_STAT_SUMS)
        # each series' last row (the previous value for the next batch's first row)
        self.last_u = np.zeros(0)
        self.last_idle = np.zeros(0, dtype=bool)
        # idle stretches: the one still open at the series' last row, and the longest
        self.cur_idle_run = np.zeros(0)
        self.max_idle_run = np.zeros(0)
        # each series' head (first accumulated row) and leading idle stretch, so that stats
        # that read a later range of the stream can be stitched onto these (absorb)
        self.started = np.zeros(0, dtype=bool)
        self.head_u = np.zeros(0)
        self.head_idle = np.zeros(0, dtype=bool)
        self.head_open = np.zeros(0, dtype=bool)
        self.head_run = np.zeros(0)
        # closed idle gaps per series, a log histogram (GAP_EDGES_S): the loop's cadence
        self.gap_hist = np.zeros((0, GAP_BINS))

    @property
    def size(self) -> int:
        """How many series codes the arrays hold (at least the series seen)."""
        return self.sums.size

    def grow(self, n: int) -> None:
        """Make room for series codes below ``n``."""
        self.sums.ensure(n)
        size = self.sums.size
        if self.last_u.shape[0] < size:
            self.last_u = grown(self.last_u, size, np.nan)
            self.last_idle = grown(self.last_idle, size, False)
            self.cur_idle_run = grown(self.cur_idle_run, size, 0.0)
            self.max_idle_run = grown(self.max_idle_run, size, 0.0)
            self.started = grown(self.started, size, False)
            self.head_u = grown(self.head_u, size, np.nan)
            self.head_idle = grown(self.head_idle, size, False)
            self.head_open = grown(self.head_open, size, False)
            self.head_run = grown(self.head_run, size, 0.0)
        if self.gap_hist.shape[0] < size:
            more = np.zeros((size, GAP_BINS))
            more[: self.gap_hist.shape[0]] = self.gap_hist
            self.gap_hist = more

    def add_gaps(self, codes: np.ndarray, lengths_s: np.ndarray) -> None:
        """Count closed idle gaps of series ``codes`` lasting ``lengths_s``."""
        ok = lengths_s > 0
        if not ok.any():
            return
        idx = np.searchsorted(GAP_EDGES_S, lengths_s[ok], side="right")
        np.add.at(self.gap_hist, (codes[ok], idx), 1.0)

    def add(self, c: np.ndarray, u: np.ndarray, w: Weights) -> None:
        """Rows of series ``c`` (grouped by series, in time order) with utilization ``u``
        (NaN: no reading)."""
        s = self.sums
        u0 = w.u_ok
        s.add("u2_w", c, w.read_w * u0 * u0)
        idle = u0 < IDLE_BELOW_PCT
        if w.no_reading is not None:
            idle &= ~w.no_reading
        # consecutive steps within a series, the first row of each series against the carry
        first = np.ones(c.shape[0], dtype=bool)
        first[1:] = c[1:] != c[:-1]
        prev_u = np.empty_like(u)
        prev_u[1:] = u[:-1]
        prev_u[first] = self.last_u[c[first]]
        prev_idle = np.empty(c.shape[0], dtype=bool)
        prev_idle[1:] = idle[:-1]
        prev_idle[first] = self.last_idle[c[first]]
        fresh = first.copy()  # each series' first row ever (in this engine)
        fresh[first] = ~self.started[c[first]]
        self._record_heads(c[first], np.flatnonzero(first), u, idle)
        step = np.abs(u - prev_u)
        ok = ~np.isnan(step)
        if ok.all():
            s.add("abs_step", c, step)
            s.data["steps"][: s.size] += np.bincount(c, minlength=s.size)
        else:
            s.add("abs_step", c, np.where(ok, step, 0.0))
            s.data["steps"][: s.size] += np.bincount(c[ok], minlength=s.size)
        run_start = idle & ~prev_idle
        s.data["idle_runs"][: s.size] += np.bincount(c[run_start], minlength=s.size)
        last = np.append(c[1:] != c[:-1], True)
        self._idle_run_lengths(c, idle, prev_idle, run_start, first, last, w.read_w, fresh)
        self.last_u[c[last]] = u[last]
        self.last_idle[c[last]] = idle[last]

    def _idle_run_lengths(self, c: np.ndarray, idle: np.ndarray, prev_idle: np.ndarray,
                          run_start: np.ndarray, first: np.ndarray, last: np.ndarray,
                          w: np.ndarray, fresh: np.ndarray) -> None:
        """Longest idle stretch per series, carried across batches (rows sorted by series).

        A stretch here is a maximal run of idle rows of one series in this batch: it starts
        where the series' previous row was not idle (or at its first row here) and ends where
        the next row is not idle (or at its last row here). Its length is the difference of
        the running sum of idle time at its two ends, plus the carried stretch it continues.
        """
        n = c.shape[0]
        idle_w = np.where(idle, w, 0.0)
        cs = np.cumsum(idle_w)
        next_busy = np.ones(n, dtype=bool)
        next_busy[:-1] = ~idle[1:]
        starts = np.flatnonzero(run_start | (first & idle))
        ends = np.flatnonzero(idle & (last | next_busy))
        length = cs[ends] - cs[starts] + idle_w[starts]
        cont = first[starts] & prev_idle[starts]
        length[cont] += self.cur_idle_run[c[starts[cont]]]
        series_starts = np.flatnonzero(first)
        cs_ = c[series_starts]
        open_ = self.head_open[cs_]
        leading_open = open_.copy()  # the carried stretch is the series' leading one
        if open_.any():
            # a leading idle stretch ends at its series' first busy (or unread) row: at this
            # batch's boundary, or at the end of the series' first stretch here
            o, oc = series_starts[open_], cs_[open_]
            at_edge = ~idle[o]
            self.head_run[oc[at_edge]] = self.cur_idle_run[oc[at_edge]]
            self.head_open[oc[at_edge]] = False
            o, oc = o[~at_edge], oc[~at_edge]
            k = np.searchsorted(starts, o)
            closed = ~last[ends[k]]
            self.head_run[oc[closed]] = length[k[closed]]
            self.head_open[oc[closed]] = False
        np.maximum.at(self.max_idle_run, c[starts], length)
        # closed gaps: a carried stretch that ends at this batch's first (busy) row, and the
        # stretches that end inside the batch, but not a series' leading stretch
        ends_carried = series_starts[~idle[series_starts] & prev_idle[series_starts]
                                     & ~leading_open]
        self.add_gaps(c[ends_carried], self.cur_idle_run[c[ends_carried]])
        # (a stretch that continues the series' still-open leading one is that one)
        lead_row = np.zeros(n, dtype=bool)
        lead_row[series_starts] = leading_open
        closed = ~last[ends] & ~fresh[starts] & ~(cont & lead_row[starts])
        self.add_gaps(c[starts[closed]], length[closed])
        self.cur_idle_run[cs_] = 0.0
        tail = last[ends]
        self.cur_idle_run[c[ends[tail]]] = length[tail]

    def _record_heads(self, codes: np.ndarray, rows: np.ndarray, u: np.ndarray,
                      idle: np.ndarray) -> None:
        """Note the first accumulated row of series seen for the first time."""
        new = ~self.started[codes]
        if not new.any():
            return
        codes, rows = codes[new], rows[new]
        self.started[codes] = True
        self.head_u[codes] = u[rows]
        self.head_idle[codes] = idle[rows]
        self.head_open[codes] = idle[rows]

    def absorb(self, other: SeriesStats, m: np.ndarray) -> None:
        """Continue these statistics with ``other``'s, which read the rows that follow (the
        next range of the stream) and whose series ``i`` is ``m[i]`` here.

        ``other`` saw each series start cold; its first row of each series is corrected
        here: the step from this side's last value, an idle stretch that merely continues
        (counted once, not twice) and the idle stretch that spans the boundary."""
        n_other = m.shape[0]
        for name in _STAT_SUMS:
            self.sums.data[name][m] += other.sums.data[name][:n_other]
        sc = np.flatnonzero(other.started[:n_other])
        ms = m[sc]
        # idle gaps across the boundary: ``other`` never counts its leading stretch; here it
        # is a gap when this side saw the series before it (joined to this side's open
        # stretch if both are idle at the boundary), and this side's open stretch closes
        # where ``other`` begins busy
        other.grow(n_other)
        self.gap_hist[m] += other.gap_hist[:n_other]
        seen = self.started[ms]
        continued_ = other.head_idle[sc] & self.last_idle[ms]
        mine_leading = self.head_open[ms]  # this side's open stretch is the leading one
        head_closed = (other.head_idle[sc] & ~other.head_open[sc] & seen
                       & ~(continued_ & mine_leading))
        joined_len = other.head_run[sc] + np.where(continued_, self.cur_idle_run[ms], 0.0)
        self.add_gaps(ms[head_closed], joined_len[head_closed])
        closes = seen & self.last_idle[ms] & ~other.head_idle[sc] & ~mine_leading
        self.add_gaps(ms[closes], self.cur_idle_run[ms[closes]])
        # this side's leading stretch, if it was still open, may end in ``other``
        lead_closed = seen & mine_leading & ~(continued_ & other.head_open[sc])
        lead_len = np.where(continued_, joined_len, self.cur_idle_run[ms])
        self.head_run[ms[lead_closed]] = lead_len[lead_closed]
        self.head_open[ms] = np.where(seen, mine_leading & continued_ & other.head_open[sc],
                                      self.head_open[ms])
        step = np.abs(other.head_u[sc] - self.last_u[ms])
        ok = ~np.isnan(step)
        self.sums.data["abs_step"][ms[ok]] += step[ok]
        self.sums.data["steps"][ms[ok]] += 1.0
        continued = other.head_idle[sc] & self.last_idle[ms]
        self.sums.data["idle_runs"][ms[continued]] -= 1.0
        head_run = np.where(other.head_open[sc], other.cur_idle_run[sc], other.head_run[sc])
        joined = np.where(continued, self.cur_idle_run[ms] + head_run, 0.0)
        self.max_idle_run[ms] = np.maximum(
            np.maximum(self.max_idle_run[ms], other.max_idle_run[sc]), joined)
        self.cur_idle_run[ms] = np.where(other.head_open[sc] & continued,
                                         self.cur_idle_run[ms] + other.cur_idle_run[sc],
                                         other.cur_idle_run[sc])
        self.last_u[ms] = other.last_u[sc]
        self.last_idle[ms] = other.last_idle[sc]
        newly = ~self.started[ms]
        for name in ("head_u", "head_idle", "head_open", "head_run"):
            getattr(self, name)[ms[newly]] = getattr(other, name)[sc[newly]]
        self.started[ms] = True
