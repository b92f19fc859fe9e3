"""The utilization view's subquery answers of one pushdown chunk, computed here from the
store's raw samples instead of by the store's PromQL engine: the same numbers, bit for bit.

What a pushdown costs a Prometheus store is the per-point work of its subqueries
(:mod:`gpuaudit.classify.pushdown_queries`): a 1,000-GPU week asks ~60 CPU-s of the two
Prometheus stores of ``benchmarks/bench_fleet_shards.py``, ~75 % of it in the subqueries
over ``DCGM_FI_DEV_GPU_UTIL`` (the points, the threshold filters, the two-step windows).
Reading that one metric's raw samples costs a store next to nothing (remote read streams its
stored chunks; VictoriaMetrics exports its blocks). So where a store answers a native form,
:func:`gpuaudit.classify.pushdown.pull_aggregates` reads the metric raw, chunk by chunk,
and :func:`util_answers` evaluates the queries below as the store would; every other query
(raw range functions, power and memory, the SM and MIG views, node CPU, time-sliced share
weights) still runs in the store.

The queries, with the chunk's steps ``t = a, a + s, ..., b`` (evaluated at ``b``; times in
integer milliseconds; a window ``[s-1ms]`` holds the samples in ``(t - s, t]`` where the
store keeps a window's left edge, Prometheus 2, and in ``(t - s + 1ms, t]`` where it leaves
it out, Prometheus 3 and VictoriaMetrics: ``left_open``; below, the first form):

- a step's point: the last sample in ``(t - s, t]`` (``last_over_time(U[s-1ms])``);
- ``n``: points; ``lo``: ``sum(U + K)`` over points ``U < 10`` (count x K + sum, summed in
  time order as ``sum_over_time`` does); ``hi``: the same for ``U >= 70``; ``top``: points
  ``U >= 90``;
- two-step windows ``W = (t - 2s, t]``: ``idle_pairs`` (windows whose max is below 10),
  ``edges`` (windows holding one sample), ``absstep`` (the sum over windows of their max
  less the sum of their min, each summed in time order);
- ``at_start`` / ``at_end``: samples in the first / last step's window; ``first``: ``a``
  where there is one at the start, else the first step after ``a`` whose two-step window
  holds one sample; ``last``: ``b`` where there is one at the end, else the last step
  whose window holds one sample, less a step;
- ``raw_n`` and ``raw_sum``: the samples in ``(a - s, b]`` and their sum, added in time
  order (exact for DCGM's integer GPU_UTIL whatever order a store adds in);
  ``umin`` / ``umax``: the least and greatest sample in ``(a - 2s, b]``.

An answer PromQL would leave out (no point passes a filter) is left out here too. Each
query's answer is tested equal to the store's on a real Prometheus and VictoriaMetrics
(tests/fleet/test_fleet_pushdown_raw.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuaudit.classify._raw_view_kernel import FIELDS, view
from gpuaudit.classify.pushdown_queries import _LOWER_PCT, pack_base

__all__ = ["RAW_VIEW", "SUBQUERIES", "util_answers"]

#: the util family's queries :func:`util_answers` answers (the store answers the rest)
RAW_VIEW = ("n", "lo", "hi", "top", "idle_pairs", "edges", "absstep", "first", "last",
            "at_start", "at_end", "raw_n", "raw_sum", "umin", "umax")
#: of them, the subqueries over every step: what costs a store, and what VictoriaMetrics
#: answers by the same rules. Its raw range functions stay with it: at a UTC midnight they
#: miss a series whose only sample in the window is there, and the pushdown's
#: several-samples forms make up for it. Its first / last point forms are answered here
#: too, as its subqueries see them (``edges_before``).
SUBQUERIES = ("n", "lo", "hi", "top", "idle_pairs", "edges", "absstep")

_IDLE, _HI, _TOP = _LOWER_PCT


def util_answers(ts_ms: Sequence[np.ndarray], values: Sequence[np.ndarray], *, a_s: float,
                 b_s: float, step_s: float, left_open: bool, edges_before: int = 0
                 ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The answers of :data:`RAW_VIEW` for the chunk ``[a_s, b_s]`` (its first and last
    step) from each series' raw samples in ``(a - 2 step, b]`` (``ts_ms[j]``, ``values[j]``;
    samples outside are ignored, stale markers must be out): name -> (series indices that
    have an answer, answers), as the store's instant queries at ``b`` would give them.

    ``edges_before`` (VictoriaMetrics: 1): the store's ``first`` / ``last`` subqueries see the
    two-step windows of that many steps before ``a`` too, and their first edge from there
    on; ``first`` / ``last`` are then the edge forms alone (the store asks them only of
    series it sees no sample of at the chunk's first / last step), and the samples must
    reach back to ``a - (2 + edges_before) step``."""
    step_ms = round(step_s * 1000)
    a_ms, b_ms = round(a_s * 1000), round(b_s * 1000)
    n_steps = (b_ms - a_ms) // step_ms + 1
    m = len(ts_ms)
    bounds = np.zeros(m + 1, np.int64)
    np.cumsum([t.shape[0] for t in ts_ms], out=bounds[1:])
    ts = np.concatenate(ts_ms).astype(np.int64, copy=False) if m else np.zeros(0, np.int64)
    vals = np.concatenate(values).astype(np.float64, copy=False) if m else np.zeros(0)
    out = np.zeros((m, FIELDS))
    range_s = b_s - a_s + step_s
    base = pack_base(round(range_s / step_s))
    shut = 1 if left_open else 0
    if view(ts, vals, bounds, a_ms, step_ms, n_steps, base, _IDLE, _HI, _TOP, shut,
            edges_before, out) < 0:
        order = np.lexsort((ts, np.repeat(np.arange(m), np.diff(bounds))))
        ts, vals = ts[order], vals[order]
        view(ts, vals, bounds, a_ms, step_ms, n_steps, base, _IDLE, _HI, _TOP, shut,
             edges_before, out)
    n, c_lo, s_lo, c_hi, s_hi, c_top, pairs, edges, nw, smax, smin, fe, le, st, en, rn, rs, \
        umin, umax = out.T
    idx = np.arange(m)

    def ans(mask: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return idx[mask], np.asarray(x, np.float64)[mask]

    offset = range_s - step_s
    # as the queries write them, every digit: ``time() - {offset:.17g}``, ``- {step_s:.17g}``
    offset_q, step_q = float(f"{offset:.17g}"), float(f"{step_s:.17g}")
    now = b_ms / 1000.0  # time() at the evaluation instant, from its milliseconds
    # with edges_before, the edge forms alone (see above)
    at_a, at_b = (np.zeros(m), np.zeros(m)) if edges_before else (st, en)
    first = np.where(at_a > 0, now - offset_q, fe / 1000.0)
    last = np.where(at_b > 0, now, le / 1000.0 - step_q)
    got = {
        "n": ans(n > 0, n), "lo": ans(c_lo > 0, s_lo), "hi": ans(c_hi > 0, s_hi),
        "top": ans(c_top > 0, c_top), "idle_pairs": ans(pairs > 0, pairs),
        "edges": ans(edges > 0, edges), "absstep": ans(nw > 0, smax - smin),
        "first": ans((at_a > 0) | (fe >= 0) if offset > 0 or edges_before else at_a > 0,
                     first),
        "last": ans((at_b > 0) | (le >= 0), last), "at_start": ans(st > 0, st),
        "at_end": ans(en > 0, en), "raw_n": ans(rn > 0, rn), "raw_sum": ans(rn > 0, rs),
        "umin": ans(~np.isnan(umin), umin), "umax": ans(~np.isnan(umax), umax),
    }
    return got
