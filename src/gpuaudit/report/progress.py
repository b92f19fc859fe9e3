"""Progress bars for long imports and queries, on stderr, only when a person is watching.

::

    from gpuaudit.report.progress import progress

    with progress("importing run.csv", total=n_bytes) as advance:
        for batch in batches:
            ...
            advance(batch_bytes)

When stderr is not a terminal (CI, pipes, tests) nothing is drawn and ``advance`` is a
no-op, so callers never branch on it. ``total=None`` draws a spinner with a running count.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["progress", "progress_bars"]


@contextmanager
def progress(description: str, total: float | None = None, *, unit: str = "",
             stream: TextIO | None = None, force: bool = False
             ) -> Iterator[Callable[[float], None]]:
    """A context that yields ``advance(amount)``; draws a rich bar on a tty (or ``force``)."""
    out = stream if stream is not None else sys.stderr
    quiet = bool(os.environ.get("GPUAUDIT_NO_PROGRESS"))  # the CLI's -q (cli/console.py)
    if not force and not (not quiet and hasattr(out, "isatty") and out.isatty()):
        yield lambda amount: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = ([SpinnerColumn(), TextColumn("{task.description}"), TextColumn(
        "{task.completed:,.0f} " + unit), TimeElapsedColumn()] if total is None else
               [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeRemainingColumn()])
    with Progress(*columns, console=Console(file=out, force_terminal=force or None),
                  transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda amount: bar.advance(task, amount)


def progress_bars() -> tuple[Callable[[str, int], Callable[[int], None]], Callable[[], None]]:
    """Several labelled bars on stderr: ``hook(description, total)`` adds one and returns its
    ``advance(n)``; the second function closes them. The Prometheus client
    (``gpuaudit.measure.fleet.prometheus.ProgressHook``) reports each query chunk through it."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=False)
    prog.start()

    def hook(desc: str, total: int) -> Callable[[int], None]:
        task = prog.add_task(desc, total=total)

        def advance(n: int) -> None:
            prog.advance(task, n)

        return advance

    return hook, prog.stop
