"""Click parameter types over :mod:`gpuaudit.validate`: every numeric, duration, time, time
zone and output-file option of every command is one of these, so a bad value fails while the
command line is parsed (before any sampling or querying starts) with click's
``error: Invalid value for '--price': ...`` naming the option, the value, the unit and the
range, and exit status 2. ``tests/cli/test_cli_validation.py`` walks every command's options
and fails on a numeric option that is not one of these.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from gpuaudit.errors import InputError
from gpuaudit.validate import (
    PROM_WINDOW_S,
    Quantity,
    check_output_dir,
    check_output_path,
    check_time_zone,
    parse_duration_s,
    parse_prom_duration_s,
    parse_time_s,
)

if TYPE_CHECKING:  # generic in click >= 8.2; plain at run time for older clicks
    _ParamType = click.ParamType[Any]
else:
    _ParamType = click.ParamType

__all__ = ["Duration", "Money", "Number", "OutputDir", "OutputFile", "Parsed", "PromDuration",
           "Time", "TimeZone", "one_value"]


def _fail(t: _ParamType, exc: InputError, param: click.Parameter | None,
          ctx: click.Context | None) -> NoReturn:
    t.fail(exc.what + (f"\n  fix: {exc.fix}" if exc.fix else ""), param, ctx)


def _name(param: click.Parameter | None) -> str:
    if param is None:
        return "value"
    opts = getattr(param, "opts", None) or [param.name or "value"]
    return str(max(opts, key=len))


class Number(_ParamType):
    """A finite number within a :class:`~gpuaudit.validate.Quantity`'s range (float, or int
    where the quantity is whole)."""

    def __init__(self, quantity: Quantity) -> None:
        self.quantity = quantity
        self.name = quantity.unit

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "INTEGER" if self.quantity.whole else "NUMBER"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        try:
            x = self.quantity.check(value, _name(param))
        except InputError as exc:
            _fail(self, exc, param, ctx)
        return int(x) if self.quantity.whole else x


class Money(Number):
    """A price, as the exact :class:`~decimal.Decimal` the user wrote."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, Decimal):
            return value
        try:
            return self.quantity.check_decimal(value, _name(param))
        except InputError as exc:
            _fail(self, exc, param, ctx)


class Duration(_ParamType):
    """``15s``, ``1h30m``, ``7d`` or plain seconds, as seconds within the quantity's range."""

    name = "duration"

    def __init__(self, quantity: Quantity) -> None:
        self.quantity = quantity

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, float):
            return value
        try:
            return parse_duration_s(value, self.quantity, _name(param))
        except InputError as exc:
            _fail(self, exc, param, ctx)


class PromDuration(_ParamType):
    """A PromQL duration (``30m``, ``1h``), checked and kept as text: it is written into
    PromQL as is."""

    name = "duration"

    def __init__(self, quantity: Quantity = PROM_WINDOW_S) -> None:
        self.quantity = quantity

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        try:
            parse_prom_duration_s(value, self.quantity, _name(param))
        except InputError as exc:
            _fail(self, exc, param, ctx)
        return str(value).strip()


class Time(_ParamType):
    """An absolute time (ISO 8601, epoch seconds or ``now``) as epoch seconds."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, float):
            return value
        try:
            return parse_time_s(value, _name(param))
        except InputError as exc:
            _fail(self, exc, param, ctx)


class TimeZone(_ParamType):
    """An IANA time zone name or a fixed UTC offset."""

    name = "zone"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        try:
            return check_time_zone(value, _name(param))
        except InputError as exc:
            _fail(self, exc, param, ctx)


class Parsed(_ParamType):
    """Structured text read by a parser elsewhere in gpuaudit (``"module:function"``,
    imported only when the option is given, so ``--help`` stays light); the parser's
    InputError becomes a usage error naming the option."""

    def __init__(self, parser: str, metavar: str) -> None:
        self.parser = parser
        self.name = metavar

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return self.name

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        import importlib

        module, func = self.parser.split(":")
        try:
            return getattr(importlib.import_module(module), func)(value)
        except InputError as exc:
            _fail(self, exc, param, ctx)


class OutputDir(click.Path):
    """A folder gpuaudit writes files into (see :func:`gpuaudit.validate.check_output_dir`):
    the folder itself may be new, the one it goes in must exist."""

    def __init__(self) -> None:
        super().__init__(file_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        try:
            return check_output_dir(value, _name(param))
        except InputError as exc:
            _fail(self, exc, param, ctx)


class OutputFile(click.Path):
    """A file gpuaudit writes: its folder must exist (see
    :func:`gpuaudit.validate.check_output_path`); never created behind the user's back."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        try:
            return check_output_path(value, _name(param))
        except InputError as exc:
            _fail(self, exc, param, ctx)


class SamplesPath(click.Path):
    """A file of samples that must exist, or a recording whose recorder was killed: its
    ``<path>.partial.arrows`` journal beside it is read instead (``report`` recovers it)."""

    def __init__(self) -> None:
        super().__init__(exists=False, dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        path = Path(str(super().convert(value, param, ctx)))
        if not path.exists() and not Path(str(path) + ".partial.arrows").exists():
            self.fail(f"File {str(path)!r} does not exist (nor a recording journal "
                      f"{path.name}.partial.arrows beside it).", param, ctx)
        return path


def one_value(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> str:
    """A single-valued option given more than once is a mistake, not "the last one wins"."""
    if len(value) > 1:
        raise click.BadParameter(f"given {len(value)} times ({', '.join(value)}): give one",
                                 ctx=ctx, param=param)
    return value[0]
