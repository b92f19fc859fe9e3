"""The one way a command writes what it produced: to ``-o FILE`` (saying so on stderr) or to
stdout (no ``-o``, or ``-o -``). Light on purpose (click and the validators only), so commands
that render no report import nothing else.

A file is written whole or not at all: the text goes to a temporary file beside the target,
is fsynced, then renamed over it, so a failed write (disk full, ``ulimit -f``, Ctrl-C) leaves
the previous file as it was and no truncated report. A target that is not a regular file (a
device such as ``/dev/full``, a FIFO) is written in place, never replaced.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import click

from gpuaudit.errors import InputError
from gpuaudit.validate import check_output_path

__all__ = ["STDOUT", "write_output"]

#: ``-o -``: the report goes to stdout, as without ``-o``
STDOUT = Path("-")


def write_output(text: str, output: Path | None, what: str, hint: str = "") -> None:
    """Write ``text`` to ``output``, reporting ``wrote <what> to <output> <hint>``, or print it."""
    if output is None or output == STDOUT:
        # the text was rendered with or without colour already (cli.console.use_color);
        # color=True keeps click from stripping escapes the user asked for
        click.echo(text, nl=False, color=True)
        return
    check_output_path(output, "--output")  # the option checked it; the folder may have gone
    try:
        _write_atomic(output, text.encode("utf-8"))
    except OSError as exc:
        raise InputError(
            f"cannot write the {what}: {exc.strerror or exc}", where=str(output),
            fix="free space or raise the file size limit (ulimit -f), or choose another -o "
            "path; a file already there is left as it was") from None
    from gpuaudit.cli.console import quiet

    if not quiet():
        click.echo(f"wrote {what} to {output}" + (f" {hint}" if hint else ""), err=True)


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        with open(path, "wb") as f:  # a device or a pipe: nothing to rename over
            f.write(data)
            f.flush()
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, stat.S_IMODE(mode))  # keep the permissions of the file it replaces
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
