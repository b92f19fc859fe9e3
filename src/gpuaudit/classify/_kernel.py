"""The compiled loop of :mod:`gpuaudit.classify.fused` (imported only there: it imports
numba). Module-level constants are compiled in; the machine code is cached on disk."""

# mypy: ignore-errors
# ruff: noqa: ANN001, ANN202, PLR0913, PLR0912, PLR0915

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
def accumulate_rows(code, cell, ts, u, dt_ns, share, has_share, cap_s,
                    idle_s, under_s, prod_s, comp_s, unused_s, headroom_s, busy_s, gap_s,
                    noread_s, samples,
                    u2_w, abs_step, steps, idle_runs,
                    last_u, last_idle, cur_idle, max_idle,
                    started, head_u, head_idle, head_open, head_run,
                    gap_hist, gap_edges,
                    has_tl, tl_start, tl_width, tl_nb, tl_uw, tl_ph, tl_hist):
    """See gpuaudit.classify.fused: one pass over rows grouped by series, in time order."""
    for i in range(code.shape[0]):
        c = code[i]
        k = cell[i]
        dt_s = dt_ns[i] * _INV_NS
        obs = min(dt_s, cap_s)
        gap = dt_s - obs
        obs_w = obs
        if has_share:
            obs_w = obs * share[i]
            gap = gap * share[i]
        ui = u[i]
        reading = not np.isnan(ui)
        u_ok = ui if reading else 0.0
        read_w = obs_w if reading else 0.0
        band = (u_ok >= _E1) + (u_ok >= _E2) + (u_ok >= _E3)
        unused = (u_ok * -0.01 + 1.0) * read_w
        if band == 0:
            idle_s[k] += read_w
        elif band == 1:
            under_s[k] += read_w
            unused_s[k] += unused
        elif band == 2:
            prod_s[k] += read_w
            headroom_s[k] += unused
        else:
            comp_s[k] += read_w
            headroom_s[k] += unused
        busy_s[k] += read_w - unused
        gap_s[k] += gap
        if not reading:
            noread_s[k] += obs_w
        samples[k] += 1.0
        # the series' statistics, in time order
        u2_w[c] += read_w * u_ok * u_ok
        idle = reading and u_ok < _IDLE
        if not started[c]:
            started[c] = True
            head_u[c] = ui
            head_idle[c] = idle
            head_open[c] = idle
        step = abs(ui - last_u[c])
        if not np.isnan(step):
            abs_step[c] += step
            steps[c] += 1.0
        prev_idle = last_idle[c]
        if idle:
            if prev_idle:
                cur_idle[c] += read_w
            else:
                idle_runs[c] += 1.0
                cur_idle[c] = read_w
            if cur_idle[c] > max_idle[c]:
                max_idle[c] = cur_idle[c]
        else:
            if prev_idle:  # an idle stretch ends here
                length = cur_idle[c]
                if head_open[c]:  # the leading one: loading, not the loop's cadence
                    head_run[c] = length
                    head_open[c] = False
                elif length > 0:
                    gap_hist[c, np.searchsorted(gap_edges, length, side="right")] += 1.0
            cur_idle[c] = 0.0
        last_u[c] = ui
        last_idle[c] = idle
        if has_tl:
            bucket = (ts[i] - tl_start) // tl_width
            if bucket < 0:
                bucket = 0
            elif bucket > tl_nb - 1:
                bucket = tl_nb - 1
            ut = u_ok if read_w > 0 else 0.0
            tband = (ut >= _E1) + (ut >= _E2) + (ut >= _E3)
            tl_uw[c, bucket] += read_w * ut
            tl_ph[c, bucket, tband] += read_w
            hb = int(ut // 5.0)
            if hb < 0:
                hb = 0
            elif hb > _N_HIST - 1:
                hb = _N_HIST - 1
            tl_hist[hb] += read_w

