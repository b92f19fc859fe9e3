"""Ask glibc to keep freed memory for reuse while gpuaudit crunches a large input.

The phase engine works in batches of ~131k rows, so each NumPy temporary is about 1 MiB.
glibc serves blocks that size with a fresh ``mmap`` and gives them back on ``free``, so every
temporary pays page faults and the kernel's zeroing again: on the audit benchmark that was about
half of the engine's time. ``mallopt(M_MMAP_THRESHOLD, 32 MiB)`` keeps such blocks on the heap
and ``mallopt(M_TRIM_THRESHOLD, 256 MiB)`` keeps up to that much freed heap instead of returning
it to the kernel. The effect is process-wide, so it is applied only where gpuaudit owns the
process (the CLI, classify's worker processes) or is about to classify a large file; set
``GPUAUDIT_NO_MALLOPT=1`` to leave the allocator alone. Other C libraries (musl, macOS): no-op.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 256 << 20

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Tune glibc's allocator once per process; True when it is (or already was) tuned."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("GPUAUDIT_NO_MALLOPT") or not sys.platform.startswith("linux"):
        return False
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _applied
