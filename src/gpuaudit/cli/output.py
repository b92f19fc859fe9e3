"""The one way a command writes what it produced: to ``-o FILE`` (saying so on stderr) or to
stdout. Light on purpose (click and the validators only), so commands that render no report import nothing else."""

from __future__ import annotations

from pathlib import Path

import click

from gpuaudit.validate import check_output_path

__all__ = ["write_output"]


def write_output(text: str, output: Path | None, what: str, hint: str = "") -> None:
    """Write ``text`` to ``output``, reporting ``wrote <what> to <output> <hint>``, or print it."""
    if output is None:
        click.echo(text, nl=False)
        return
    check_output_path(output, "--output")  # the option checked it; the folder may have gone
    output.write_text(text, encoding="utf-8")
    click.echo(f"wrote {what} to {output}" + (f" {hint}" if hint else ""), err=True)
