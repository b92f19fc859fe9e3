"""How the command line talks to a person: colour, verbosity and logging, set once per run.

- Colour: ``--color auto|always|never``; ``auto`` (the default) colours a report only when it
  goes to a terminal and the ``NO_COLOR`` environment variable is unset or empty
  (https://no-color.org); ``always`` wins over ``NO_COLOR``, as an explicit flag should.
- Verbosity: ``-q/--quiet`` shows errors only and no progress bars; ``-v`` adds the info
  messages of the library's loggers (``gpuaudit.*``), ``-vv`` the debug ones. The library
  only logs; this module is the one place that configures logging (on stderr).

The options are accepted before the command (``gpuaudit -q report ...``) and after it
(``gpuaudit report ... -q``).
"""

from __future__ import annotations

import logging
import os
from typing import Any, TextIO

import click

__all__ = ["COLOR_MODES", "common_options", "configure", "quiet", "use_color"]

COLOR_MODES = ("auto", "always", "never")
NO_PROGRESS_ENV = "GPUAUDIT_NO_PROGRESS"
_state: dict[str, Any] = {"color": "auto", "verbosity": 0}


def use_color(stream: TextIO) -> bool:
    """Whether to colour what goes to ``stream``."""
    mode = _state["color"]
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def quiet() -> bool:
    return bool(_state["verbosity"] < 0)


def configure(*, color: str | None = None, verbosity: int | None = None) -> None:
    """Set the colour mode and the verbosity (-1 quiet, 0 default, 1 info, 2 debug) and
    configure the ``gpuaudit`` loggers on stderr accordingly."""
    if color is not None:
        _state["color"] = color
    if verbosity is not None:
        _state["verbosity"] = verbosity
    level = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}.get(
        _state["verbosity"], logging.DEBUG)
    log = logging.getLogger("gpuaudit")
    log.setLevel(level)
    if not any(getattr(h, "_gpuaudit", False) for h in log.handlers):
        handler = logging.StreamHandler()  # stderr, looked up when each record is written
        handler.setFormatter(logging.Formatter("gpuaudit: %(levelname)s: %(message)s"))
        handler._gpuaudit = True  # type: ignore[attr-defined]
        log.addHandler(handler)
        log.propagate = False
    # progress bars (gpuaudit.report.progress) read this, here and in worker processes
    if _state["verbosity"] < 0:
        os.environ[NO_PROGRESS_ENV] = "1"
    else:
        os.environ.pop(NO_PROGRESS_ENV, None)


def _set_color(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        configure(color=value)


def _set_verbose(ctx: click.Context, param: click.Parameter, value: int) -> None:
    if value:
        configure(verbosity=min(2, value))


def _set_quiet(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        configure(verbosity=-1)


def common_options() -> list[click.Option]:
    """``--color``, ``-v``, ``-q`` as options that configure this module when parsed."""
    return [
        click.Option(["--color"], type=click.Choice(COLOR_MODES), default=None,
                     expose_value=False, is_eager=True, callback=_set_color,
                     help="Colour the report: auto (a terminal, and NO_COLOR unset), always, "
                     "never."),
        click.Option(["-v", "--verbose"], count=True, expose_value=False, is_eager=True,
                     callback=_set_verbose, help="More messages on stderr (-vv: debug)."),
        click.Option(["-q", "--quiet"], is_flag=True, expose_value=False, is_eager=True,
                     callback=_set_quiet, help="Errors only on stderr; no progress bars."),
    ]
