"""Ask glibc to keep freed memory for reuse while gpuaudit crunches a large input.

The phase engine works in batches of ~131k rows, so each NumPy temporary is about 1 MiB.
glibc serves blocks that size with a fresh ``mmap`` and gives them back on ``free``, so every
temporary pays page faults and the kernel's zeroing again: on the audit benchmark that was about
half of the engine's time. ``mallopt(M_MMAP_THRESHOLD, 32 MiB)`` keeps such blocks on the heap
and ``mallopt(M_TRIM_THRESHOLD, 256 MiB)`` keeps up to that much freed heap instead of returning
it to the kernel. The effect is process-wide, so it is applied only where gpuaudit owns the
process (the CLI, classify's worker processes) or is about to classify a large file; set
``GPUAUDIT_NO_MALLOPT=1`` to leave the allocator alone. Other C libraries (musl, macOS): no-op.

Arrow's buffers (the decoded Parquet columns, ~1 MiB each per batch) come from Arrow's own
allocator (mimalloc), which hands freed pages back and faults fresh ones in for the next batch:
~0.3 s of kernel time per process on 100M rows. :func:`arrow_on_heap` points Arrow at the
system allocator (its ``system`` pool: malloc, tuned so) where classify reads a large file,
unless the user chose a pool with ``ARROW_DEFAULT_MEMORY_POOL``.
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["arrow_on_heap", "cap_arenas", "keep_freed_memory", "loading_code", "one_heap",
           "own_process", "spare_the_exit"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 256 << 20

_applied: bool | None = None


def _mallopt() -> Any:
    """glibc's ``mallopt`` through ctypes, or None: not Linux, not glibc, not found, or
    ``GPUAUDIT_NO_MALLOPT`` set."""
    if os.environ.get("GPUAUDIT_NO_MALLOPT") or not sys.platform.startswith("linux"):
        return None
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def keep_freed_memory() -> bool:
    """Tune glibc's allocator once per process; True when it is (or already was) tuned."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _applied


#: Arrow's variable naming its default pool: where the user set it, Arrow is left alone
ARROW_POOL_VAR = "ARROW_DEFAULT_MEMORY_POOL"


def arrow_on_heap() -> bool:
    """Arrow's default pool = the system allocator, where glibc is tuned
    (:func:`keep_freed_memory`) and the user named no pool; True when it is. Before pyarrow
    is imported this sets the variable Arrow reads at its first allocation, which reaches
    the allocations Arrow's C++ makes on its default pool directly (the Parquet reader's
    page buffers) and the worker processes started after it; after, the running pyarrow's
    default pool is set (the buffers Python asks for). Called by ``gpuaudit report`` first
    thing and where classify reads a large file (this process and each worker)."""
    if os.environ.get(ARROW_POOL_VAR) and "pyarrow" not in sys.modules:
        return os.environ[ARROW_POOL_VAR] == "system"
    if not keep_freed_memory():
        return False
    pa = sys.modules.get("pyarrow")
    if pa is None:
        os.environ[ARROW_POOL_VAR] = "system"
        return True
    if os.environ.get(ARROW_POOL_VAR, "system") != "system":
        return False  # the user's choice
    if pa.default_memory_pool().backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())
    return True


_arenas_capped: bool | None = None


def cap_arenas(arenas: int = 2) -> bool:
    """Let glibc keep at most ``arenas`` malloc arenas (``mallopt(M_ARENA_MAX)``), once per
    process; True when it does. The fleet pushdown decodes answers in up to 16 threads at
    once, and glibc gives each new thread an arena of its own (up to 8 per core), each
    keeping what it freed; with two, a 1,000-GPU 4-store audit peaked at 245 MiB instead of
    259 MiB (docs/benchmarks.md). The threads mostly wait on the stores, so two arenas cost
    no measurable time. Called before the fleet's threads start;
    ``GPUAUDIT_NO_MALLOPT=1`` leaves the allocator alone; no-op outside glibc."""
    global _arenas_capped
    if _arenas_capped is not None:
        return _arenas_capped
    _arenas_capped = False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    _arenas_capped = bool(mallopt(_M_ARENA_MAX, max(1, arenas)))
    return _arenas_capped


_M_MMAP_MAX = -4
_one_heap: bool | None = None


def one_heap() -> bool:
    """In a process gpuaudit owns (:func:`own_process`): every thread's blocks from one
    heap (``mallopt(M_ARENA_MAX, 1)``) and none from their own ``mmap``
    (``mallopt(M_MMAP_MAX, 0)``), once per process; True when it is so. The native fleet
    fetch decodes and joins in eight threads, in arrays of 64-256 MiB a chunk (above the
    largest ``mmap`` threshold glibc allows, 32 MiB), each a fresh mapping the kernel zeroes
    and takes back when freed: ~28 GiB mapped and unmapped in a 1,000-GPU week, ~10 of its
    ~50 CPU-s in the kernel. From one heap, freed blocks are reused: ~5 CPU-s in the kernel
    and ~0.3 GiB less at the peak (docs/benchmarks.md). Elsewhere (gpuaudit imported as a
    library) the allocator is left alone: memory a heap keeps is not given back as readily
    as a mapping. ``GPUAUDIT_NO_MALLOPT=1`` leaves it alone too; no-op outside glibc.
    glibc fixes its arena count the first time a second thread allocates (Arrow's and
    DuckDB's pools start threads as the price catalogs load): ``gpuaudit fleet`` calls this
    first thing, the native fetch again (a no-op after the first call)."""
    global _one_heap
    if _one_heap is not None:
        return _one_heap
    if not _ours:
        return False
    _one_heap = False
    mallopt = _mallopt()
    if mallopt is None or not keep_freed_memory():
        return False
    _one_heap = bool(mallopt(_M_ARENA_MAX, 1)) and bool(mallopt(_M_MMAP_MAX, 0))
    return _one_heap


_ours = False


def own_process() -> None:
    """Say that gpuaudit owns this process (the command line's process, classify's worker):
    :func:`loading_code` may then freeze what it loaded."""
    global _ours
    _ours = True


@contextmanager
def loading_code() -> Iterator[None]:
    """The cyclic collector paused while the block runs: for imports and numba loading its
    machine code. Such a load makes ~10^5 long-lived objects (numba's and pyarrow's types,
    functions, registries) and no garbage, and the collector, counting the allocations,
    walks the growing heap again and again meanwhile: ~0.15-0.2 s of a core per process
    for classify's imports and compiled loops (the command's and its worker's, before
    either reads a row: docs/benchmarks.md). In a process gpuaudit owns
    (:func:`own_process`) what the block loaded is then frozen (``gc.freeze()``), so no
    later collection walks it either; elsewhere (gpuaudit imported as a library) the
    collector is only paused, and walks those objects after the block as it would have."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if _ours:
                gc.freeze()
            gc.enable()


def spare_the_exit() -> None:
    """Let the interpreter's exit skip its cyclic collection: every object now tracked is
    frozen (``gc.freeze()``), which the collections at shutdown do not walk. A process of
    ours about to end (the CLI's command done, classify's worker with its answer written)
    holds numba's and pyarrow's type registries, ~10^5 tracked objects: their walk at exit
    took ~0.2-0.25 s of one core (~0.03 s frozen), and the worker's exit is part of the
    wait for its answer (the command reads its pipe to the end). Objects are still freed
    as their references go; a cycle left at exit is not collected (nor was it before the
    interpreter's teardown reached it, with nothing left to run its finalizers)."""
    import gc

    gc.freeze()
