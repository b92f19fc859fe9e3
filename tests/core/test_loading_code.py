"""The cyclic collector paused while gpuaudit loads code (gpuaudit._heap.loading_code)."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from gpuaudit._heap import loading_code


def test_the_collector_is_paused_in_the_block_and_as_it_was_after():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with loading_code():
        assert not gc.isenabled()
        with loading_code():  # nested: still paused, and not turned on by the inner block
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    # a library's caller keeps a collectable heap: nothing was frozen
    assert gc.get_freeze_count() == frozen


def test_an_error_in_the_block_turns_the_collector_back_on():
    with pytest.raises(ZeroDivisionError), loading_code():
        1 / 0  # noqa: B018
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_caller_stays_off():
    gc.disable()
    try:
        with loading_code():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def _run(code: str) -> list[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.split()


def test_in_a_process_of_ours_what_the_block_loaded_is_frozen():
    code = ("import gc; from gpuaudit._heap import loading_code, own_process; "
            "own_process(); before = gc.get_freeze_count()\n"
            "with loading_code():\n"
            "    import decimal, email.parser, json\n"
            "print(before, gc.get_freeze_count() > before + 100, gc.isenabled())")
    _, grew, enabled = _run(code)
    assert (grew, enabled) == ("True", "True")


def test_the_compiled_loop_loads_with_the_collector_paused_and_is_ready_after():
    """fused.available(): numba's import and the loop's machine code under loading_code;
    the collector is on after it, and in a process of ours numba's objects are frozen."""
    code = ("import gc\n"
            "from gpuaudit._heap import own_process\n"
            "own_process()\n"
            "from gpuaudit.classify import fused\n"
            "seen = []\n"
            "gc.callbacks.append(lambda phase, info: seen.append(info['generation'])"
            " if phase == 'start' else None)\n"
            "ok = fused.available()\n"
            "print(ok, gc.isenabled(), gc.get_freeze_count() > 10_000, len(seen),"
            " len(fused._kernel.stream.signatures) > 0)")
    assert _run(code) == ["True", "True", "True", "0", "True"]
