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
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuaudit.classify.usage import Pattern, SeriesSignals

__all__ = ["BURSTY_MAX_IDLE_RUN_S", "PHASED_MIN_IDLE_RUN_S", "detect_patterns"]

#: Idle runs shorter than this (on average) between busy runs read as input stalls.
BURSTY_MAX_IDLE_RUN_S = 10.0
#: An idle stretch at least this long reads as idle time worth shutting down or reclaiming.
PHASED_MIN_IDLE_RUN_S = 30.0


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
        if short and step >= 20.0:
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


def detect_patterns(series: Sequence[SeriesSignals], interval_s: float) -> tuple[Pattern, ...]:
    """One :class:`Pattern` per GPU series, in the order given."""
    return tuple(_classify_one(s, interval_s) for s in series)
