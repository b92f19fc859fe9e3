"""The compiled loop of :mod:`gpuaudit.classify.pushdown_raw` (imported only there: it
imports numba): one pass over each series' raw samples, step by step, with the two-step
window's bounds moving forward. The machine code is cached on disk."""

# mypy: ignore-errors

from __future__ import annotations

import numba
import numpy as np

#: figures per series written by :func:`view`
FIELDS = 19


@numba.njit(cache=True, nogil=True)
def view(ts, vals, bounds, a_ms, step_ms, n_steps, base, idle, hi, top, shut, early, out):
    """Per series j (samples ``bounds[j]:bounds[j + 1]``, times ascending): the figures of
    :func:`gpuaudit.classify.pushdown_raw.util_answers` into ``out[j]``: points, lo count, lo packed sum, hi count, hi
    packed sum, top count, idle pairs, edges, windows with a sample, sum of window maxima,
    sum of window minima, first edge step (ms, or -1), last edge step (ms, or -1), samples
    in the first step, samples in the last step, raw samples in the chunk, their sum (in
    time order), the least and the greatest sample in the chunk and the step before it
    (NaN where none).
    ``shut``: 1 where a window's left edge is shut (``(t - w, t]``, VictoriaMetrics and
    Prometheus 3), 0 where it is in (``[t - w, t]``, Prometheus 2). ``early``: steps before
    ``a`` whose two-step windows count as edges too (the first edge is then looked for from
    there, not from the second step: VictoriaMetrics' subqueries, 1). Returns -1 if a
    series' times descend (the caller sorts), else 0."""
    for j in range(bounds.shape[0] - 1):
        for i in range(bounds[j] + 1, bounds[j + 1]):
            if ts[i] < ts[i - 1]:
                return -1
    b_ms = a_ms + (n_steps - 1) * step_ms
    for j in range(bounds.shape[0] - 1):
        lo_i, hi_i = bounds[j], bounds[j + 1]
        n = 0.0
        c_lo = s_lo = c_hi = s_hi = c_top = 0.0
        pairs = edges = nw = smax = smin = 0.0
        first_edge = -1
        last_edge = -1
        at_start = at_end = raw_n = 0.0
        # samples are walked once per step window: p marks the first sample with
        # ts > t - 2s, q the first with ts > t (both only move forward)
        p = lo_i
        q = lo_i
        for k in range(-early, 0):  # edges only, before the chunk
            t = a_ms + k * step_ms
            while p < hi_i and ts[p] <= t - 2 * step_ms + shut:
                p += 1
            while q < hi_i and ts[q] <= t:
                q += 1
            if q - p == 1:
                if first_edge < 0:
                    first_edge = t
                last_edge = t
        for k in range(n_steps):
            t = a_ms + k * step_ms
            while p < hi_i and ts[p] <= t - 2 * step_ms + shut:
                p += 1
            while q < hi_i and ts[q] <= t:
                q += 1
            # the window (t - 2s, t] is [p, q); the step's own (t - s, t] its tail
            cnt = q - p
            if cnt > 0:
                mx = vals[p]
                mn = vals[p]
                for i in range(p + 1, q):
                    if vals[i] > mx:
                        mx = vals[i]
                    if vals[i] < mn:
                        mn = vals[i]
                nw += 1.0
                smax += mx
                smin += mn
                if mx < idle:
                    pairs += 1.0
                if cnt == 1:
                    edges += 1.0
                    if (k >= 1 or early > 0) and first_edge < 0:
                        first_edge = t
                    last_edge = t
            own = 0
            i = q - 1
            while i >= p and ts[i] > t - step_ms + shut:
                own += 1
                i -= 1
            if own > 0:
                u = vals[q - 1]  # the step's point: its last sample
                n += 1.0
                if u < idle:
                    c_lo += 1.0
                    s_lo += u + base
                if u >= hi:
                    c_hi += 1.0
                    s_hi += u + base
                if u >= top:
                    c_top += 1.0
                if k == 0:
                    at_start = own
                if t == b_ms:
                    at_end = own
        # the chunk's raw window (b - r, b], r = its length less 1 ms: with the edge shut,
        # samples just past a step's window (at t - s + 1) are in it and in no step
        raw_sum = 0.0
        umin = np.nan
        umax = np.nan
        for i in range(lo_i, hi_i):
            if a_ms - step_ms + shut < ts[i] <= b_ms:
                raw_n += 1.0
                raw_sum += vals[i]
            if a_ms - 2 * step_ms + shut < ts[i] <= b_ms:
                if umin != umin or vals[i] < umin:  # (as min_over_time: NaN at first)
                    umin = vals[i]
                if umax != umax or vals[i] > umax:
                    umax = vals[i]
        o = out[j]
        o[0] = n
        o[1] = c_lo
        o[2] = s_lo
        o[3] = c_hi
        o[4] = s_hi
        o[5] = c_top
        o[6] = pairs
        o[7] = edges
        o[8] = nw
        o[9] = smax
        o[10] = smin
        o[11] = first_edge
        o[12] = last_edge
        o[13] = at_start
        o[14] = at_end
        o[15] = raw_n
        o[16] = raw_sum
        o[17] = umin
        o[18] = umax
    return 0
