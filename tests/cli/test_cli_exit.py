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


def test_the_cli_asks_openblas_for_one_thread_unless_the_user_chose():
    """OpenBLAS's threads spin as NumPy is imported (cli.one_blas_thread): the command line's
    own process sets OPENBLAS_NUM_THREADS=1 before NumPy loads, which its workers inherit;
    a value the user set stays, and a caller passing argv keeps its environment."""
    import os

    code = ("import os, sys; from gpuaudit.cli import main; rc = main(); "
            "import numpy; print(os.environ.get('OPENBLAS_NUM_THREADS'), rc)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True,
                         text=True, check=True, env=env).stdout.split()
    assert out[-2:] == ["1", "0"]
    out = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True,
                         text=True, check=True,
                         env={**env, "OPENBLAS_NUM_THREADS": "4"}).stdout.split()
    assert out[-2:] == ["4", "0"]
    code = ("import os; from gpuaudit.cli import main; rc = main(['--version']); "
            "print(os.environ.get('OPENBLAS_NUM_THREADS'), rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout.split()
    assert out[-2:] == ["None", "0"]
