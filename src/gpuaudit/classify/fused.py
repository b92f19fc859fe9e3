"""The engine's accumulation as one compiled loop over the rows (numba), for large inputs.

:meth:`~gpuaudit.classify.phases._Engine._accumulate` hands over rows whose duration is known
(grouped by series, in time order). The NumPy path (:mod:`~gpuaudit.classify.accumulate`,
:class:`~gpuaudit.classify.timeline.TimelineAcc`) makes some thirty passes over them: weights,
band keys, a weighted ``bincount`` per quantity, steps, idle stretches from running sums, the
timeline's buckets. Here one loop does it all per row, in registers, into the same
accumulators (the same arrays, so ranges stitch and finish exactly as before):

- the row's observed seconds (capped; the rest a gap, weighted by a time-sliced share);
- its cell's band seconds, unused and busy seconds, gap, no-reading time and sample count;
- its series' u squared, step from the previous value, idle stretch (begun, continued,
  closed: the closed ones into the gap histogram, the leading one kept apart as
  :class:`~gpuaudit.classify.accumulate.SeriesStats` does);
- when the timeline is asked for, its bucket's band seconds, utilization-weighted seconds and
  the histogram.

Rows with SM activity or a diagnostic signal the timeline buckets take the NumPy path (those
are DCGM-rich recordings, a few columns more per row); so do batches under
:data:`MIN_ROWS`, where the compiled loop's one-off cost (importing numba, ~0.5 s, and loading
its cached machine code) would not pay back. Sums are added in row order rather than per
batch, so a total may differ from the NumPy path's in the last bits (a property test holds the
two to 1e-9).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuaudit.classify.accumulate import GAP_EDGES_S, Grow, SeriesStats
from gpuaudit.classify.usage import HIST_EDGES_PCT

if TYPE_CHECKING:
    from gpuaudit.classify.timeline import TimelineAcc

__all__ = ["MIN_ROWS", "available", "fused_accumulate"]

#: From this many rows in a batch on, the compiled loop is used (when numba is installed and
#: GPUAUDIT_NO_NUMBA is not set).
MIN_ROWS = 32_768

_N_HIST = len(HIST_EDGES_PCT) - 1
_kernel: Any = None
_state: bool | None = None


def available() -> bool:
    """Whether the compiled loop can be used (numba imports; compiled once per machine and
    cached beside this module or in the user's cache directory)."""
    global _state, _kernel
    if _state is None:
        _state = False
        if not os.environ.get("GPUAUDIT_NO_NUMBA"):
            try:
                _kernel = _compile()
                _state = True
            except ImportError:
                _state = False
    return _state


def fused_accumulate(cells: Grow, stats: SeriesStats, timeline: TimelineAcc | None,
                     n_series: int, r: dict[str, np.ndarray], dt_ns: np.ndarray,
                     cap_s: float) -> None:
    """Add rows ``r`` (grouped by series, in time order) lasting ``dt_ns`` to the cells, the
    series statistics and, when given, the timeline: what ``add_phase_seconds``,
    ``SeriesStats.add`` and ``TimelineAcc.add`` do, in one loop."""
    assert _kernel is not None
    d = cells.data
    s = stats.sums.data
    share = r.get("share")
    if timeline is not None:
        timeline.acc.ensure(n_series)
        acc, g = timeline.acc, timeline.grid
        tl = (True, g.start_ns, g.width_ns, g.nb, acc.uw, acc.ph, timeline.hist)
    else:
        tl = (False, 0, 1, 1, np.zeros((1, 1)), np.zeros((1, 1, 4)), np.zeros(_N_HIST))
    _kernel(
        r["code"], r["cell"], r["ts"], r["u"], dt_ns,
        share if share is not None else np.ones(1), share is not None, cap_s,
        d["idle_s"], d["underutilized_s"], d["productive_s"], d["compute_bound_s"],
        d["underutilized_unused_s"], d["headroom_s"], d["busy_s"], d["gap_s"],
        d["no_reading_s"], d["samples"],
        s["u2_w"], s["abs_step"], s["steps"], s["idle_runs"],
        stats.last_u, stats.last_idle, stats.cur_idle_run, stats.max_idle_run,
        stats.started, stats.head_u, stats.head_idle, stats.head_open, stats.head_run,
        stats.gap_hist, GAP_EDGES_S,
        *tl,
    )


def _compile() -> Any:
    from gpuaudit.classify import _kernel  # noqa: PLC0415 - imports numba: large inputs only

    return _kernel.accumulate_rows
