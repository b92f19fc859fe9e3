"""Durations as a reader reads them, at the scale of the figure: a profiler trace's window is
436 ms, a sampling gap 993 ms, a job 266 s, a fleet 1,234.50 h. One function, so every report
and every sentence of evidence writes time the same way (no "(0 s)" for 436 ms, no "0.0
observed hours"). Instants as ISO 8601 in UTC (:func:`utc_iso`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

__all__ = ["chunks_starting", "duration", "utc_iso"]


def utc_iso(t_s: float) -> str:
    """A Unix time (seconds) as ISO 8601 in UTC: ``2024-01-01T00:00:15+00:00``."""
    return datetime.fromtimestamp(t_s, tz=timezone.utc).isoformat()


def chunks_starting(starts_s: Sequence[float]) -> str:
    """Time chunks named by their starts (in order): ``the chunk starting <t>``, or ``<n>
    chunks starting <first> to <last>``."""
    if len(starts_s) == 1:
        return f"the chunk starting {utc_iso(starts_s[0])}"
    return (f"{len(starts_s)} chunks starting {utc_iso(starts_s[0])} to "
            f"{utc_iso(starts_s[-1])}")


def _trim(x: float) -> str:
    text = f"{x:,.1f}"
    return text[:-2] if text.endswith(".0") else text


def duration(seconds: float) -> str:
    """``seconds`` in us, ms, s or h: under 1 ms in microseconds, under 1 s in milliseconds
    (one decimal where it has one), under 10 s with one decimal, under 6 minutes in whole
    seconds, longer in hours to the hundredth."""
    s = float(seconds)
    a = abs(s)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{_trim(s * 1e6)} us"
    if a < 1:
        return f"{_trim(s * 1e3)} ms"
    if a < 10:
        return f"{_trim(s)} s"
    if a < 360:
        return f"{s:,.0f} s"
    return f"{s / 3600:,.2f} h"
