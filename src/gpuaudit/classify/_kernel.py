"""The compiled loops of :mod:`gpuaudit.classify.fused` (imported only there: it imports
numba). Module-level constants are compiled in; the machine code is cached on disk."""

# mypy: ignore-errors

from __future__ import annotations

import numba
import numpy as np

from gpuaudit.classify.rows import NS
from gpuaudit.classify.usage import HIST_EDGES_PCT, IDLE_BELOW_PCT, PHASE_LOWER_PCT

_E1, _E2, _E3 = (float(x) for x in PHASE_LOWER_PCT[1:])
_IDLE = float(IDLE_BELOW_PCT)
_INV_NS = 1.0 / NS
_N_HIST = len(HIST_EDGES_PCT) - 1


@numba.njit(cache=True, nogil=True)
def stream(code, cell, ts, u, util, cap_s, st, cell_lo, cell_acc, unused_col,
           head_u, head_run, gap_hist, gap_edges,
           has_tl, tl_start, tl_width, tl_lo, tl_hi, tl_uw, tl_ph, tl_hist,
           has_on, on_head_ts, max_onsets, out_oc, out_ots):
    """One pass over a batch's rows in file order (see gpuaudit.classify.fused). Each row
    ends its series' carried row, which is accumulated with that duration; the row is then
    carried. ``st``: each series' state as one record (fused.STATE: the carried row, the
    statistics and onset state every row reads), so a row touches one place per series;
    ``head_u``, ``head_run``, ``gap_hist`` and ``on_head_ts``, written rarely, apart.
    Returns (onsets written to out_oc/out_ots, the latest end accumulated or -1);
    (-1, -1) at the first row whose timestamp does not come after its series' carried one,
    having accumulated the rows before it (the caller raises the order error).
    The timeline's sums go to ``tl_uw[bucket - tl_lo, series]`` and
    ``tl_ph[bucket - tl_lo, series, band]``: bucket-major, so consecutive rows (consecutive
    GPUs of one tick) touch neighbouring memory."""
    n_on = 0
    t_end = -1
    for i in range(code.shape[0]):
        # unsigned indices: no wraparound fix-up for negative ones
        c = np.uint64(code[i])
        r = st[c]
        t = ts[i]
        if r.pend and t <= r.p_ts:
            return -1, -1
        if has_on:  # busy onsets (classify.lag) read util_gpu_pct alone
            x = util[i]
            if not np.isnan(x):
                busy = x >= _IDLE
                if not r.on_head_seen:
                    r.on_head_seen = True
                    r.on_head_busy = busy
                    on_head_ts[c] = t
                # (& rather than `and`: no branch on busy, which a fleet makes random)
                if (busy & (not r.on_last_busy)) and r.on_kept < max_onsets:
                    out_oc[n_on] = code[i]
                    out_ots[n_on] = t
                    n_on += 1
                    r.on_kept += 1
                r.on_last_busy = busy
        if r.pend:
            # the carried row of series c lasts until this one
            k = np.uint64(r.p_cell - cell_lo)
            ui = r.p_u
            dt_s = (t - r.p_ts) * _INV_NS
            if t > t_end:
                t_end = t
            obs = min(dt_s, cap_s)
            gap = dt_s - obs
            reading = not np.isnan(ui)
            u_ok = ui if reading else 0.0
            read_w = obs if reading else 0.0
            band = np.uint64((u_ok >= _E1) + (u_ok >= _E2) + (u_ok >= _E3))
            unused = (u_ok * -0.01 + 1.0) * read_w
            # the cell's sums side by side (see fused.CELL_SUMS), no branch on the band
            cell_acc[k, band] += read_w
            cell_acc[k, np.uint64(unused_col[band])] += unused
            cell_acc[k, 6] += read_w - unused
            cell_acc[k, 7] += gap
            cell_acc[k, 8] += obs - read_w
            cell_acc[k, 9] += 1.0
            # the series' statistics, in time order
            r.u2_w += read_w * u_ok * u_ok
            idle = reading & (u_ok < _IDLE)
            if not r.started:
                r.started = True
                head_u[c] = ui
                r.head_idle = idle
                r.head_open = idle
            step = abs(ui - r.last_u)
            if not np.isnan(step):
                r.abs_step += step
                r.steps += 1.0
            # the idle stretch, without a branch on idle (random across a fleet's GPUs): it
            # continues (+ read_w), begins (read_w, one run more) or is 0 past its end
            was_idle = r.last_idle
            length = r.cur_idle
            run = (length + read_w) if was_idle else read_w
            run = run if idle else 0.0
            r.idle_runs += 1.0 if (idle & (not was_idle)) else 0.0
            r.cur_idle = run
            top = r.max_idle
            r.max_idle = run if run > top else top  # (run is 0 when not idle; top >= 0)
            if was_idle & (not idle):  # an idle stretch ends here
                if r.head_open:  # the leading one: loading, not the loop's cadence
                    head_run[c] = length
                    r.head_open = False
                elif length > 0:
                    gap_hist[c, np.searchsorted(gap_edges, length, side="right")] += 1.0
            r.last_u = ui
            r.last_idle = idle
            if has_tl:
                # the bucket by comparison, not a 64-bit division: a batch spans a few
                # (tl_lo .. tl_hi - 1, the clipped buckets of its earliest and latest rows)
                tp = r.p_ts
                bucket = tl_lo
                while bucket + 1 < tl_hi and tp >= tl_start + (bucket + 1) * tl_width:
                    bucket += 1
                ut = u_ok if read_w > 0 else 0.0
                tband = np.uint64((ut >= _E1) + (ut >= _E2) + (ut >= _E3))
                b = np.uint64(bucket - tl_lo)
                tl_uw[b, c] += read_w * ut
                tl_ph[b, c, tband] += read_w
                # floor(ut / 5), exactly, without a floating-point floor division
                hb = int(ut * 0.2)
                if (hb + 1) * 5.0 <= ut:
                    hb += 1
                elif hb * 5.0 > ut:
                    hb -= 1
                if hb < 0:
                    hb = 0
                elif hb > _N_HIST - 1:
                    hb = _N_HIST - 1
                tl_hist[np.uint64(hb)] += read_w
        r.pend = True
        r.p_ts = t
        r.p_cell = cell[i]
        r.p_u = u[i]
    return n_on, t_end


@numba.njit(cache=True, nogil=True)
def max_signals(code, ts, u, xs, cap_s, pend, p_ts, p_u, p_x, smax,
                tl_col, tl_start, tl_width, tl_lo, tl_hi, tl_t, tl_x):
    """The ``max_*`` signal columns of a batch's rows (``xs``, one row per column, NaN: not
    measured) in file order, beside :func:`stream`:

    - where ``tl_col >= 0``, that column's value of each series' carried row, weighted by
      the carried row's reading seconds (its observed seconds where it has a utilization
      reading), into the timeline's bucket sums ``tl_t`` (seconds with a value) and
      ``tl_x`` (seconds x value), bucket-major as in :func:`stream`;
    - each series' largest value into ``smax[column, series]``, as ``Signals.add`` does it:
      the batch's largest per series, where finite, into the running largest.

    ``pend``/``p_ts``/``p_u``: copies of the carried rows' state (changed here, as
    :func:`stream` changes its own); ``p_x[column, series]``: the carried rows' values,
    replaced by each row's own."""
    n = code.shape[0]
    if tl_col >= 0:
        x = xs[tl_col]
        px = p_x[tl_col]
        for i in range(n):
            c = code[i]
            if pend[c]:
                v = px[c]
                if not np.isnan(v) and not np.isnan(p_u[c]):
                    tp = p_ts[c]
                    obs = min((ts[i] - tp) * _INV_NS, cap_s)
                    bucket = tl_lo
                    while bucket + 1 < tl_hi and tp >= tl_start + (bucket + 1) * tl_width:
                        bucket += 1
                    tl_t[bucket - tl_lo, c] += obs
                    tl_x[bucket - tl_lo, c] += obs * v
            pend[c] = True
            p_ts[c] = ts[i]
            p_u[c] = u[i]
            px[c] = x[i]
    n_series = smax.shape[1]
    top = np.empty(n_series)
    for k in range(xs.shape[0]):
        x = xs[k]
        px = p_x[k]
        top[:] = -np.inf
        for i in range(n):
            c = code[i]
            v = x[i]
            if v > top[c]:  # NaN compares False
                top[c] = v
            px[c] = v
        for c in range(n_series):
            m = top[c]
            if np.isfinite(m):
                cur = smax[k, c]
                smax[k, c] = m if np.isnan(cur) or m > cur else cur


@numba.njit(cache=True, nogil=True)
def mean_signals(code, ts, u, xs, cap_s, pend, p_ts, p_u, p_x, sums_w, sums_t, power_row,
                 power2_w, tl_on, tl_start, tl_width, tl_lo, tl_hi, tl_t, tl_x):
    """The ``sig_*`` (time-weighted mean) signal columns of a batch's rows (``xs``, one row
    per column, NaN: not measured) in file order, beside :func:`stream`, as
    ``Signals.add`` and ``TimelineAcc.add`` take them: each series' carried row, once the
    series' next row gives its duration, adds its observed seconds (the duration, capped
    at ``cap_s``) to ``sums_t[column, series]`` and those seconds x its value to
    ``sums_w`` (and x its value squared to ``power2_w`` for the column ``power_row``) where
    it has a value; where ``tl_on[column]``, its reading seconds (the observed seconds
    where it has a utilization reading) and those x its value into the timeline's bucket
    sums ``tl_t[column]`` and ``tl_x[column]``, bucket-major as in :func:`stream`.

    ``pend``/``p_ts``/``p_u``: copies of the carried rows' state (changed here, as
    :func:`stream` changes its own); ``p_x[column, series]``: the carried rows' values,
    replaced by each row's own."""
    n = code.shape[0]
    n_cols = xs.shape[0]
    for i in range(n):
        c = code[i]
        if pend[c]:
            tp = p_ts[c]
            obs = min((ts[i] - tp) * _INV_NS, cap_s)
            read = not np.isnan(p_u[c])
            bucket = tl_lo
            while bucket + 1 < tl_hi and tp >= tl_start + (bucket + 1) * tl_width:
                bucket += 1
            for k in range(n_cols):
                v = p_x[k, c]
                if np.isnan(v):
                    continue
                sums_t[k, c] += obs
                sums_w[k, c] += obs * v
                if k == power_row:
                    power2_w[c] += obs * (v * v)
                if read and tl_on[k]:
                    tl_t[k, bucket - tl_lo, c] += obs
                    tl_x[k, bucket - tl_lo, c] += obs * v
        pend[c] = True
        p_ts[c] = ts[i]
        p_u[c] = u[i]
        for k in range(n_cols):
            p_x[k, c] = xs[k, i]


@numba.njit(cache=True, nogil=True)
def lag_steps(mine, theirs, bounds, half_ns, out):
    """Per onset of ``mine``: the median, over the peers, of the time from the peer's
    nearest onset (ns; NaN where no peer has one within ``half_ns``), as
    :func:`gpuaudit.classify.lag.onset_lags` computes it with NumPy. The peers' onsets are
    ``theirs[bounds[k]:bounds[k + 1]]``, each sorted and at least two long."""
    n_peers = bounds.shape[0] - 1
    d = np.empty(n_peers)
    pos = np.zeros(n_peers, dtype=np.int64)
    for j in range(mine.shape[0]):
        m = mine[j]
        k = 0
        for p in range(n_peers):
            lo, hi = bounds[p], bounds[p + 1]
            # searchsorted(theirs, m, side="left"), walked forward (mine is sorted)
            i = pos[p]
            while lo + i < hi and theirs[lo + i] < m:
                i += 1
            pos[p] = i
            i = min(max(i, 1), hi - lo - 1)
            left = theirs[lo + i - 1]
            right = theirs[lo + i]
            near = left if m - left <= right - m else right
            x = float(m - near)
            if abs(x) <= half_ns:
                # insertion into the sorted matches of this onset
                q = k
                while q > 0 and d[q - 1] > x:
                    d[q] = d[q - 1]
                    q -= 1
                d[q] = x
                k += 1
        if k == 0:
            out[j] = np.nan
        elif k % 2 == 1:
            out[j] = (d[k // 2] + d[k // 2]) / 2.0
        else:
            out[j] = (d[k // 2 - 1] + d[k // 2]) / 2.0


@numba.njit(cache=True, nogil=True)
def group_by_series(c, t, n_series, out_c, out_t):
    """Onsets ``(c, t)`` grouped by series into ``out_c``/``out_t``, each series' in their
    order (a counting sort: what a stable sort by ``c`` gives, in two passes)."""
    start = np.zeros(n_series + 1, dtype=np.int64)
    for i in range(c.shape[0]):
        start[c[i] + 1] += 1
    for k in range(n_series):
        start[k + 1] += start[k]
    for i in range(c.shape[0]):
        k = c[i]
        j = start[k]
        out_c[j] = k
        out_t[j] = t[i]
        start[k] = j + 1


@numba.njit(cache=True, nogil=True)
def best_cuts(s1, s2, n, min_steady, penalty, edge):
    """:func:`gpuaudit.classify.patterns.split_run`'s search over both cuts ``(a, b)`` as
    loops, the same figures in the same order as its NumPy matrices (``s1``/``s2``: running
    sums of the smoothed means and their squares). Returns (a, b, whether any pair is
    allowed); the first lowest cost in row-major order, as ``argmin``."""
    best = np.inf
    bi = 0
    bj = 0
    for a in range(n + 1):
        ma = max(a, 1)
        t0a = s1[a] - s1[0]
        sse0a = (s2[a] - s2[0]) - t0a * t0a / ma
        mean0a = t0a / ma
        # the pairs before b_lo fail the first test below (the steady stretch the longest
        # of the three, at least min_steady): not visited, the order of the rest unchanged
        b_lo = max(2 * a, (n + a + 1) // 2, a + min_steady)
        for b in range(b_lo, n + 1):
            w = b - a
            ok = (w >= min_steady) and (w >= a) and (w >= n - b)
            ok = ok and (a == 0 or a >= 2) and (b == n or n - b >= 2)
            if not ok:
                continue
            mab = max(w, 1)
            tab = s1[b] - s1[a]
            steady = tab / mab
            if a != 0 and not abs(mean0a - steady) >= edge:
                continue
            mbn = max(n - b, 1)
            tbn = s1[n] - s1[b]
            if b != n and not abs(tbn / mbn - steady) >= edge:
                continue
            cost = (sse0a + ((s2[b] - s2[a]) - tab * tab / mab)) \
                + ((s2[n] - s2[b]) - tbn * tbn / mbn)
            cost = cost + penalty * ((1.0 if a > 0 else 0.0) + (1.0 if b < n else 0.0))
            if cost < best:
                best = cost
                bi = a
                bj = b
    return bi, bj, best < np.inf
