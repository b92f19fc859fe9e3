"""The shape of a utilization series: same mean, different fixes.

A loop starved by its input pipeline bounces between idle and busy in short runs (the GPU
waits for the next batch, then races through it); a job that is steadily half busy sits in
the middle band with little variance; a job with long idle stretches (a notebook left open, a
job waiting between epochs or for a queue) idles for minutes at a time. The mean utilization
of all three can be the same; the remedies are different (input pipeline, batch size or a
smaller GPU, idle shutdown).

Decided from time-weighted statistics the classify engine streams per GPU: time share idle
(u < 10), time share busy (u >= 70), the standard deviation of u, the mean absolute change
between consecutive samples, and the number of idle runs (so the mean idle run length).

**Phases of the run.** A job that loads for a minute, trains for an hour and saves a
checkpoint has three shapes, not one "mixed" one. Where the per-GPU timeline exists
(:mod:`gpuaudit.classify.timeline`, up to 240 buckets), :func:`split_run` finds a warm-up
and a cool-down by change-point search on the bucket means (smoothed over
:data:`SMOOTH_BUCKETS`): the two cuts (each optional) that
minimise the squared error within the three stretches, each cut kept only when it pays for
itself (a BIC-style penalty of ``3 ln n`` times the bucket-to-bucket noise) and its stretch's
mean differs from the steady state's by at least :data:`EDGE_MIN_DIFF_PCT` points. The steady
stretch (the middle, the longest of the three and at least :data:`STEADY_MIN_SHARE` of the
run) decides the shape; the edges
are named beside it ("warm-up, then saturated, then cool-down"). Without a timeline (the fleet
pushdown), the whole run decides, as before.

**Per job.** :func:`job_patterns` names one shape per job (the GPUs of one host and pod
set): the shape at least :data:`JOB_MAJORITY` of its GPUs share; eight GPUs
with one clear shape are that shape, never "mixed".
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from gpuaudit.classify.usage import CPU_FIELDS, JobPattern, Pattern, RunPhase, SeriesSignals

if TYPE_CHECKING:
    from gpuaudit.classify.timeline import Timeline

__all__ = ["BURSTY_MAX_IDLE_RUN_S", "EDGE_MIN_DIFF_PCT", "JOB_MAJORITY", "PHASED_MIN_IDLE_RUN_S",
           "STEADY_MIN_SHARE", "detect_patterns", "job_patterns", "split_run"]

#: Idle runs shorter than this (on average) between busy runs read as input stalls.
BURSTY_MAX_IDLE_RUN_S = 10.0
#: An idle stretch at least this long reads as idle time worth shutting down or reclaiming.
PHASED_MIN_IDLE_RUN_S = 30.0
#: A warm-up or cool-down must differ from the steady state's mean utilization by this many
#: points: a smaller step is noise around one level (a bursty loop's buckets scatter by more).
EDGE_MIN_DIFF_PCT = 10.0
#: Bucket means are smoothed over this many buckets before the change-point search.
SMOOTH_BUCKETS = 5
#: The steady state is at least this share of the run's buckets (else the whole run decides).
STEADY_MIN_SHARE = 0.4
#: A job's shape is the shape at least this share of its GPUs have.
JOB_MAJORITY = 0.75
#: Utilization (percent) standing for each phase band when a stretch's spread is estimated
#: from its phase times (idle, underutilized, productive, compute-bound).
_BAND_MID_PCT = (2.0, 40.0, 80.0, 95.0)


def _classify_one(s: SeriesSignals, interval_s: float) -> Pattern:
    obs = s.observed_s
    if obs <= 0 or s.mean_util_pct is None:
        return Pattern(s.gpu_uuid, "unknown", "no utilization readings", 0.0, 0.0, None, 0.0)
    idle = s.idle_s / obs
    busy = s.busy_high_s / obs
    middle = max(0.0, 1.0 - idle - busy)
    run = s.idle_s / s.idle_runs if s.idle_runs else None
    longest = s.max_idle_run_s
    std = s.std_util_pct or 0.0
    step = s.mean_abs_step_pct or 0.0
    shares = f"idle {idle:.0%}, busy (>=70%) {busy:.0%}, middle {middle:.0%}"
    if idle >= 0.9:
        return Pattern(s.gpu_uuid, "idle", f"{shares}; idle almost all the time", idle, busy,
                       run, longest)
    if busy >= 0.85 and longest < PHASED_MIN_IDLE_RUN_S:
        return Pattern(s.gpu_uuid, "saturated", f"{shares}; busy almost all the time", idle,
                       busy, run, longest)
    two_sided = idle >= 0.1 and busy >= 0.1 and middle <= 0.5
    if two_sided and run is not None:
        # the average idle run must span at least two samples to be measured as a run at all
        short = run <= max(BURSTY_MAX_IDLE_RUN_S, 2 * interval_s)
        # bouncing: large changes between samples, or (sampled faster than the bursts, so
        # most consecutive samples are equal) a two-sided spread of at least 25 points
        if short and (step >= 20.0 or std >= 25.0):
            return Pattern(
                s.gpu_uuid, "bursty",
                f"{shares}; bouncing between idle and busy: mean idle run {run:.1f} s, "
                f"mean change between samples {step:.0f} points, std {std:.0f} points",
                idle, busy, run, longest)
    if idle >= 0.05 and longest >= PHASED_MIN_IDLE_RUN_S:
        return Pattern(
            s.gpu_uuid, "phased",
            f"{shares}; long idle stretches: the longest {longest:.0f} s, "
            f"{s.idle_runs} idle stretch(es) in all",
            idle, busy, run, longest)
    if middle >= 0.6 and std <= 20.0:
        return Pattern(
            s.gpu_uuid, "steady",
            f"{shares}; steadily part-busy at {s.mean_util_pct:.0f}% (std {std:.0f} points, "
            f"mean change between samples {step:.0f} points)",
            idle, busy, run, longest)
    return Pattern(s.gpu_uuid, "mixed", f"{shares}; std {std:.0f} points", idle, busy, run,
                   longest)


def split_run(util_pct: np.ndarray) -> tuple[int, int]:
    """Change points ``(a, b)`` in a GPU's bucket means: warm-up ``[0, a)``, steady
    ``[a, b)``, cool-down ``[b, n)``; ``a == 0`` / ``b == n`` where there is none.

    Buckets without a reading (NaN) are skipped and the cuts mapped back. Exhaustive search
    over both cuts with cumulative sums (at most 240 buckets: ~14,000 pairs where the
    steady stretch can be the longest, vectorised).
    """
    n_all = int(util_pct.shape[0])
    valid = np.flatnonzero(~np.isnan(util_pct))
    n = int(valid.shape[0])
    if n < 8:
        return 0, n_all
    raw = util_pct[valid].astype(np.float64)
    # a centred moving mean over SMOOTH_BUCKETS first: a loop slower than one bucket (a 10 s
    # compute/wait cycle over 2.5 s buckets) is one level, not noise that hides a warm-up
    k = min(SMOOTH_BUCKETS, n)
    pad = np.concatenate([np.full(k // 2, raw[0]), raw, np.full(k - 1 - k // 2, raw[-1])])
    x = np.convolve(pad, np.ones(k) / k, mode="valid")
    s1 = np.concatenate([[0.0], np.cumsum(x)])
    s2 = np.concatenate([[0.0], np.cumsum(x * x)])

    def sse(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        m = np.maximum(j - i, 1)
        tot = s1[j] - s1[i]
        return np.asarray((s2[j] - s2[i]) - tot * tot / m)

    def mean(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        return np.asarray((s1[j] - s1[i]) / np.maximum(j - i, 1))

    noise = float(np.mean(np.diff(x) ** 2) / 2.0) if n > 1 else 0.0
    penalty = 3.0 * math.log(n) * max(noise, 1.0)
    min_steady = max(2, math.ceil(STEADY_MIN_SHARE * n))
    kernel = sys.modules.get("gpuaudit.classify._kernel")
    if kernel is not None:  # classify's pass loaded the compiled loops: the same search
        i, j, found = kernel.best_cuts(s1, s2, n, min_steady, penalty, EDGE_MIN_DIFF_PCT)
        if not found:
            return 0, n_all
        return (0 if i == 0 else int(valid[i])), (n_all if j == n else int(valid[j]))
    # the steady stretch is the longest of the three (b - a >= a and b - a >= n - b): so
    # a <= n / 2 <= b, and the pairs outside that quarter of the grid need no cost
    b_lo = (n + 1) // 2
    a = np.arange(0, n // 2 + 1)[:, None]
    b = np.arange(b_lo, n + 1)[None, :]
    # ... and an edge spans at least 2 buckets
    ok = (b - a >= min_steady) & (b - a >= a) & (b - a >= n - b)
    ok &= ((a == 0) | (a >= 2)) & ((b == n) | (n - b >= 2))
    zero, end = np.zeros_like(a), np.full_like(b, n)
    cost = sse(zero, a) + sse(a, b) + sse(b, end)
    steady_mean = mean(a, b)
    ok &= (a == 0) | (np.abs(mean(zero, a) - steady_mean) >= EDGE_MIN_DIFF_PCT)
    ok &= (b == n) | (np.abs(mean(b, end) - steady_mean) >= EDGE_MIN_DIFF_PCT)
    cost = cost + penalty * ((a > 0).astype(float) + (b < n).astype(float))
    cost = np.where(ok, cost, np.inf)
    i, j = np.unravel_index(int(np.argmin(cost)), cost.shape)
    if not np.isfinite(cost[i, j]):
        return 0, n_all
    j = j + b_lo
    # back to bucket indices: a cut sits just before the first valid bucket of its stretch
    cut_a = 0 if i == 0 else int(valid[i])
    cut_b = n_all if j == n else int(valid[j])
    return cut_a, cut_b


def _stretch(name: str, tl: Timeline, row: int, lo: int, hi: int) -> RunPhase:
    obs = tl.observed_s[row, lo:hi]
    total = float(obs.sum())
    ph = tl.phase_s[row, lo:hi] if tl.phase_s is not None else np.zeros((hi - lo, 4))
    util = tl.util_pct[row, lo:hi]
    seen = obs > 0
    mean_u = float(np.sum(util[seen] * obs[seen]) / total) if total > 0 else None
    signals: dict[str, float] = {}
    # a bucket's mean of a signal read over idle (busy) time only weighs by that time
    busy = ph[:, 1:].sum(axis=1)
    weight = {"pcie_idle_bytes_per_s": ph[:, 0], "nvlink_busy_bytes_per_s": busy,
              "host_cpu_util_pct_while_idle": ph[:, 0], "host_cpu_util_pct_while_busy": busy,
              "proc_cpu_util_pct_while_idle": ph[:, 0], "proc_cpu_util_pct_while_busy": busy}
    for key, arr in tl.signals.items():
        v = arr[row, lo:hi]
        wk = weight.get(key, obs)
        m = seen & ~np.isnan(v) & (wk > 0)
        w = float(wk[m].sum())
        if w > 0:
            signals[key] = float(np.sum(v[m] * wk[m]) / w)
    return RunPhase(
        name=name, start_s=lo * tl.bucket_s, end_s=hi * tl.bucket_s, observed_s=total,
        mean_util_pct=mean_u,
        idle_share=float(ph[:, 0].sum()) / total if total > 0 else 0.0,
        busy_share=float(ph[:, 2:].sum()) / total if total > 0 else 0.0,
        signals=signals,
    )


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _steady_view(s: SeriesSignals, tl: Timeline, row: int, a: int, b: int,
                 edges: Sequence[RunPhase]) -> SeriesSignals:
    """``s`` restricted to the steady stretch, from the timeline's buckets: time shares exact;
    the spread estimated from the phase bands; the idle-run count less one per idle edge;
    the longest idle run from whole idle buckets (at bucket resolution)."""
    st = _stretch("steady", tl, row, a, b)
    ph = tl.phase_s[row, a:b] if tl.phase_s is not None else np.zeros((b - a, 4))
    obs = st.observed_s
    shares = ph.sum(axis=0) / obs if obs > 0 else np.zeros(4)
    mean_u = st.mean_util_pct or 0.0
    std = math.sqrt(float(sum(sh * (m - mean_u) ** 2 for sh, m in zip(shares, _BAND_MID_PCT))))
    idle_edges = sum(1 for e in edges if e.idle_share >= 0.5)
    whole_idle = (ph[:, 0] > 0) & (ph[:, 0] >= tl.observed_s[row, a:b] * 0.999)
    longest = run = 0
    for flag in whole_idle.tolist():
        run = run + 1 if flag else 0
        longest = max(longest, run)
    max_run = min(s.max_idle_run_s, (longest + 2) * tl.bucket_s) if edges else s.max_idle_run_s
    idle_s = float(ph[:, 0].sum())
    view = replace(
        s, observed_s=obs, mean_util_pct=st.mean_util_pct, std_util_pct=std,
        idle_s=idle_s, busy_high_s=float(ph[:, 2:].sum()),
        idle_runs=max(0 if idle_s <= 0 else 1, s.idle_runs - idle_edges),
        max_idle_run_s=max_run,
    )
    if all(getattr(s, f) is None for f in CPU_FIELDS):
        return view
    cpu = st.signals.get  # the CPU over the steady stretch (bucket means; None: no reading)
    return replace(
        view, host_cpu_util_pct=cpu("host_cpu_util_pct"),
        host_cpu_util_pct_while_idle=cpu("host_cpu_util_pct_while_idle"),
        host_cpu_util_pct_while_busy=cpu("host_cpu_util_pct_while_busy"),
        proc_cpu_util_pct=cpu("proc_cpu_util_pct"),
        proc_cpu_util_pct_while_idle=cpu("proc_cpu_util_pct_while_idle"),
        proc_cpu_util_pct_while_busy=cpu("proc_cpu_util_pct_while_busy"),
    )


def _by_run_phase(s: SeriesSignals, tl: Timeline, row: int, interval_s: float) -> Pattern:
    a, b = split_run(tl.util_pct[row])
    n = tl.util_pct.shape[1]
    edges = []
    if a > 0:
        edges.append(_stretch("warm-up", tl, row, 0, a))
    if b < n:
        edges.append(_stretch("cool-down", tl, row, b, n))
    steady = _stretch("steady", tl, row, a, b)
    if not edges:
        base = _classify_one(s, interval_s)
        return replace(base, shape=base.kind, run_phases=(steady,))
    view = _steady_view(s, tl, row, a, b, edges)
    base = _classify_one(view, interval_s)
    parts = []
    notes = []
    for e in edges:
        mean = e.mean_util_pct or 0.0
        notes.append(f"{e.name} {_duration(e.end_s - e.start_s)} at {mean:.0f}% "
                     f"(idle {e.idle_share:.0%})")
    if a > 0:
        parts.append("warm-up")
    parts.append(base.kind)
    if b < n:
        parts.append("cool-down")
    shape = ", then ".join(parts)
    evidence = (f"{shape}: steady {_duration(steady.end_s - steady.start_s)}: {base.evidence}; "
                + "; ".join(notes))
    phases = tuple(sorted([*edges, steady], key=lambda p: p.start_s))
    return replace(base, evidence=evidence, shape=shape, run_phases=phases)


def detect_patterns(series: Sequence[SeriesSignals], interval_s: float,
                    timeline: Timeline | None = None) -> tuple[Pattern, ...]:
    """One :class:`Pattern` per GPU series, in the order given; judged on the steady stretch
    of the run where ``timeline`` has the GPU (see :func:`split_run`)."""
    rows = {u: i for i, u in enumerate(timeline.gpu_uuids)} if timeline is not None else {}
    out = []
    for s in series:
        row = rows.get(s.gpu_uuid)
        if timeline is None or row is None or s.mean_util_pct is None:
            base = _classify_one(s, interval_s)
            out.append(replace(base, shape=base.kind))
        else:
            out.append(_by_run_phase(s, timeline, row, interval_s))
    return tuple(out)


def job_key(s: SeriesSignals) -> str:
    """The job a GPU belongs to: its host and pod set (a whole host where no pod is known)."""
    return s.host + (f" / {','.join(s.pods)}" if s.pods else "")


def multi_gpu_jobs(series: Sequence[SeriesSignals]) -> dict[str, list[str]]:
    """The jobs of two GPUs or more (:func:`job_key` -> their uuids): those whose GPUs can
    lag one another (stragglers by time lag, :mod:`gpuaudit.classify.lag`)."""
    jobs: dict[str, list[str]] = {}
    for s in series:
        jobs.setdefault(job_key(s), []).append(s.gpu_uuid)
    return {k: v for k, v in jobs.items() if len(v) >= 2}


def job_patterns(series: Sequence[SeriesSignals], patterns: Sequence[Pattern]
                 ) -> tuple[JobPattern, ...]:
    """One shape per job: the kind (and shape) at least :data:`JOB_MAJORITY` of its GPUs
    share, else ``mixed`` with the count of each."""
    by_uuid = {p.gpu_uuid: p for p in patterns}
    jobs: dict[str, list[Pattern]] = {}
    for s in series:
        p = by_uuid.get(s.gpu_uuid)
        if p is not None:
            jobs.setdefault(job_key(s), []).append(p)
    out = []
    for job, members in jobs.items():
        kinds = Counter(p.kind for p in members)
        kind, n = kinds.most_common(1)[0]
        total = len(members)
        if n >= JOB_MAJORITY * total:
            shapes = Counter(p.shape or p.kind for p in members if p.kind == kind)
            shape = shapes.most_common(1)[0][0]
            others = [f"{c} {k}" for k, c in kinds.items() if k != kind]
            ev = f"{n} of {total} GPU(s) {shape}" + (f" ({', '.join(others)})" if others else "")
            example = next(p for p in members if p.kind == kind)
            ev += f"; e.g. {example.gpu_uuid}: {example.evidence}"
        else:
            kind = shape = "mixed"
            ev = "GPUs differ: " + ", ".join(f"{c} {k}" for k, c in kinds.most_common())
        out.append(JobPattern(job=job, gpu_uuids=tuple(p.gpu_uuid for p in members),
                              kind=kind, shape=shape, evidence=ev))
    return tuple(out)
