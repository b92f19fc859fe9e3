"""The command line's process ends without walking its heap (gpuaudit._heap.spare_the_exit)."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_freezes_its_heap_once_the_command_is_done():
    code = ("import gc, sys; from gpuaudit.cli import main; "
            "before = gc.get_freeze_count(); rc = main(); "
            "print(before, gc.get_freeze_count() > 1000, rc)")
    for argv, rc in ((["--version"], "0"), (["no-such-command"], "2")):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                             text=True, check=True).stdout.split()
        assert out[-3:] == ["0", "True", rc]


def test_a_caller_passing_its_command_line_keeps_a_collectable_heap():
    """main(argv) runs inside someone else's process (a test, a program running several
    command lines): its heap is not frozen."""
    code = ("import gc; from gpuaudit.cli import main; rc = main(['--version']); "
            "print(gc.get_freeze_count(), rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[-2:] == ["0", "0"]
