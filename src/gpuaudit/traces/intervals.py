"""Interval arithmetic on NumPy arrays of [start, end) nanoseconds: union, sweep, clipping."""

from __future__ import annotations

import numpy as np

__all__ = ["busy_in_windows", "intersect_len", "merge", "sweep"]

I64 = np.int64


def merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint (start, end) arrays.

    Same grouping as HTA's ``merge_kernel_intervals``: an interval joins the current group
    unless it starts strictly after every earlier end (touching intervals merge).
    """
    if start.size == 0:
        return start.astype(I64), end.astype(I64)
    order = np.argsort(start, kind="stable")
    s = start[order].astype(I64)
    e = end[order].astype(I64)
    run_max = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_max[:-1]
    group = np.cumsum(new) - 1
    ms = s[new]
    me = np.full(ms.size, np.iinfo(I64).min, dtype=I64)
    np.maximum.at(me, group, e)
    return ms, me


def sweep(sets: list[tuple[np.ndarray, np.ndarray]]) -> dict[int, int]:
    """Time spent in each combination of the given interval sets.

    Each set must be disjoint (the output of :func:`merge`); set ``i`` contributes bit
    ``1 << i``. Returns {bitmask: total ns} for every nonzero mask that occurs.
    """
    times, deltas = [], []
    for i, (s, e) in enumerate(sets):
        v = 1 << i
        times.append(s)
        deltas.append(np.full(s.size, v, dtype=I64))
        times.append(e)
        deltas.append(np.full(e.size, -v, dtype=I64))
    if not times:
        return {}
    t = np.concatenate(times).astype(I64)
    d = np.concatenate(deltas)
    if t.size == 0:
        return {}
    order = np.argsort(t, kind="stable")
    t = t[order]
    running = np.cumsum(d[order])
    dur = np.diff(t)
    state = running[:-1]
    out: dict[int, int] = {}
    # every state is a bitmask of the sets (each set disjoint): at most 2 ** len(sets) - 1
    # of them, in increasing order (a loop over them rather than np.unique, whose first
    # plain call imports numpy.ma: ~10 ms of the trace command)
    for st in range(1, 1 << len(sets)):
        m = state == st
        if m.any():
            out[st] = int(dur[m].sum())
    return out


def intersect_len(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Total length of the intersection of two disjoint interval sets."""
    return sweep([a, b]).get(3, 0)


def busy_in_windows(ms: np.ndarray, me: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Busy ns of the disjoint sorted intervals (ms, me) inside each [edges[i], edges[i+1]).

    Uses the cumulative busy function B(t), evaluated at the edges with ``searchsorted``.
    """
    if ms.size == 0:
        return np.zeros(max(edges.size - 1, 0), dtype=I64)
    cum = np.concatenate([[0], np.cumsum(me - ms)]).astype(I64)

    def busy_until(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(ms, t, side="right")  # intervals starting at or before t
        done = cum[np.maximum(k - 1, 0)]
        last_s = ms[np.maximum(k - 1, 0)]
        last_e = me[np.maximum(k - 1, 0)]
        partial = np.clip(t - last_s, 0, last_e - last_s)
        return np.where(k > 0, done + partial, 0)

    b = busy_until(edges.astype(I64))
    return np.diff(b)
