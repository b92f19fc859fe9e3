"""The fleet pushdown decodes answers in many threads; glibc gives each new thread its own
malloc arena (up to 8 per core), and each arena keeps what it freed. ``cap_arenas`` (called
before the fleet's threads start) holds them to two."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CODE = """
import ctypes, sys, threading
from gpuaudit._heap import cap_arenas
print(cap_arenas(), flush=True)
together = threading.Barrier(12)
def work():
    b = bytearray(200_000)  # this thread's first allocation attaches it to an arena
    together.wait()  # all 12 alive at once: none can take over an arena another left
    del b
threads = [threading.Thread(target=work) for _ in range(12)]
for t in threads: t.start()
for t in threads: t.join()
sys.stderr.flush()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


def _arenas(env: dict[str, str]) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip(), sum(line.startswith("Arena ") for line in out.stderr.splitlines())


def test_fleet_threads_share_two_malloc_arenas() -> None:
    if not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"):
        pytest.fail("this test needs glibc (the allocator it tunes); run it on Linux/glibc")
    env = {k: v for k, v in os.environ.items() if k != "GPUAUDIT_NO_MALLOPT"}
    capped, n = _arenas(env)
    assert capped == "True"
    assert 1 <= n <= 2
    refused, m = _arenas({**env, "GPUAUDIT_NO_MALLOPT": "1"})
    assert refused == "False"
    assert m > 2  # without the cap every thread took an arena of its own


ONE_HEAP = """
import ctypes, sys, threading
import numpy as np
from gpuaudit import _heap
if sys.argv[1] == "owned":
    _heap.own_process()  # as the command line's process does
print(_heap.one_heap(), flush=True)


class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (size_t fields)
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
mapped = []
def work():
    # a native fetch thread's array of a chunk: 96 MiB, above glibc's largest mmap threshold
    a = np.ones(12 << 20)
    mapped.append(libc.mallinfo2().hblkhd)  # bytes in blocks that are mappings of their own
    del a
t = threading.Thread(target=work)
t.start(); t.join()
print(mapped[0] < 96 << 20)
"""


@pytest.mark.parametrize("owned", [True, False])
def test_native_fetch_threads_allocate_from_one_heap_in_an_owned_process(owned: bool) -> None:
    """one_heap (the native fleet fetch, where gpuaudit owns the process): a thread's
    array of 96 MiB comes from the one heap, not from a mapping of its own that the kernel
    zeroes and takes back when it is freed; in a process gpuaudit does not own, or with
    GPUAUDIT_NO_MALLOPT, the allocator is left alone."""
    if not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"):
        pytest.fail("this test needs glibc (the allocator it tunes); run it on Linux/glibc")
    env = {k: v for k, v in os.environ.items() if k != "GPUAUDIT_NO_MALLOPT"}
    for extra, applied in (({}, owned), ({"GPUAUDIT_NO_MALLOPT": "1"}, False)):
        out = subprocess.run([sys.executable, "-c", ONE_HEAP, "owned" if owned else "library"],
                             env={**env, **extra}, capture_output=True, text=True, check=True)
        assert out.stdout.split() == [str(applied), str(applied)], (extra, out.stdout)
