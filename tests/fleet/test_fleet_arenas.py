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
