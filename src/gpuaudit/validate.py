"""One validation layer for every number, duration, time, time zone and output path a user gives.

The CLI's parameter types (:mod:`gpuaudit.cli.params`) and the Python API
(:func:`gpuaudit.audit`, :func:`gpuaudit.monitor`, :class:`~gpuaudit.measure.live.sampler.Sampler`,
:func:`gpuaudit.price.price_usage`, ...) call the same checks, so ``--price nan`` and
``gpuaudit.audit(..., price=float("nan"))`` fail the same way: an
:class:`~gpuaudit.errors.InputError` naming the option or argument, the bad value, the unit
and the allowed range. Nothing here computes a figure; it only refuses what cannot be one.

Each :class:`Quantity` is the single statement of what a value means and which values make
sense (the bounds are deliberately generous: they refuse only what cannot be meant, such as a
GPU-hour priced above $1,000 or a scrape interval of a month).
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from gpuaudit.errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "ALERT_HELD_IDLE_HOURS",
    "ALERT_TEMPERATURE_C",
    "ALERT_UNDERUTIL_PCT",
    "BUSY_PCT",
    "CAP_INTERVALS",
    "CONCURRENCY",
    "DUTY",
    "ENERGY_USD_PER_KWH",
    "EPOCHS",
    "EPOCH_S",
    "EXPORTER_INTERVAL_S",
    "EXPORTER_REFRESH_S",
    "FLEET_CHUNK_S",
    "FLEET_SHARD_S",
    "FLEET_SINCE_S",
    "FLEET_STEP_S",
    "FLUSH_S",
    "HEADROOM",
    "HZ",
    "INTERVAL_S",
    "LATENCY_MS",
    "LIVE_DURATION_S",
    "MEMORY_PRESSURE_RATIO",
    "PRICE_USD_PER_GPU_HOUR",
    "PROM_WINDOW_S",
    "RATIO",
    "REPLICAS",
    "RETRIES",
    "SAMPLING_INTERVAL_S",
    "SCRAPE_DURATION_S",
    "SCRAPE_EVERY_S",
    "STEP_S",
    "TENSOR_IDLE_RATIO",
    "THROUGHPUT_PER_S",
    "TIMEOUT_S",
    "WINDOW_MS",
    "WORKERS",
    "Quantity",
    "check_counts",
    "check_output_dir",
    "check_output_path",
    "check_time_zone",
    "count_quantity",
    "parse_duration_s",
    "parse_prom_duration_s",
    "parse_time_s",
    "read_toml_file",
]


def _num(x: float) -> str:
    """1000 -> '1,000', 0.01 -> '0.01', 1e18 -> '1e+18' (bounds in messages)."""
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:g}"


def _show(value: object) -> str:
    """The value as the user wrote it, quoted, cut to 40 characters."""
    text = repr(value) if isinstance(value, str) else repr(str(value))
    return text if len(text) <= 42 else text[:39] + "...'"


@dataclass(frozen=True)
class Quantity:
    """What a numeric value means and the values that make sense for it.

    ``unit`` is named in every message (``USD per GPU-hour``, ``seconds``, ``Hz``);
    ``low``/``high`` bound it (``low_open``: the low bound itself is refused); ``whole``
    asks for a whole number; ``example`` is a sensible value for the fix line.
    """

    what: str
    unit: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    whole: bool = False
    example: str = ""
    #: said when a value is above ``high``: why the bound, and what the user may have meant
    above_hint: str = ""

    def range_text(self) -> str:
        """``more than 0 and at most 1,000 USD per GPU-hour``."""
        parts = []
        if self.low is not None:
            parts.append(f"{'more than' if self.low_open else 'at least'} {_num(self.low)}")
        if self.high is not None:
            parts.append(f"at most {_num(self.high)}")
        if self.unit.startswith("ratio"):
            kind = "a ratio"
        else:
            kind = ("a whole number" if self.whole else "a number") + f" of {self.unit}"
        return kind + (f", {' and '.join(parts)}" if parts else "")

    def _unit_after(self) -> str:
        return "" if self.unit.startswith("ratio") else f" {self.unit}"

    def fix(self, name: str) -> str:
        eg = f", e.g. {name} {self.example}" if self.example else ""
        return f"give {self.what} as {self.range_text()}{eg}"

    def check(self, value: object, name: str) -> float:
        """``value`` (a number or its text) as a float in range, else :class:`InputError`
        naming ``name`` (the option, e.g. ``--price``, or the argument, e.g. ``price``)."""
        if isinstance(value, bool):
            raise InputError(f"{_show(value)} is not a number of {self.unit}", where=name,
                             fix=self.fix(name))
        try:
            x = float(value if isinstance(value, (int, float, Decimal)) else str(value).strip())
        except OverflowError:  # an int beyond any float
            x = math.inf
        except (ValueError, TypeError):  # not a number; Decimal('sNaN')
            raise InputError(f"{_show(value)} is not a number of {self.unit}", where=name,
                             fix=self.fix(name)) from None
        if not math.isfinite(x):
            raise InputError(f"{_show(value)} is not a finite number of {self.unit}",
                             where=name, fix=self.fix(name))
        if self.low is not None and (x < self.low or (self.low_open and x == self.low)):
            bound = "must be more than" if self.low_open else "is below the minimum,"
            raise InputError(f"{_num(x)} {bound} {_num(self.low)}{self._unit_after()}",
                             where=name, fix=self.fix(name))
        if self.high is not None and x > self.high:
            hint = f" ({self.above_hint.format(x=x, share=x / 100)})" if self.above_hint else ""
            raise InputError(f"{_num(x)} is above the maximum, "
                             f"{_num(self.high)}{self._unit_after()}{hint}", where=name,
                             fix=self.fix(name))
        if self.whole and x != int(x):
            raise InputError(f"{_num(x)} {self.unit} is not a whole number", where=name,
                             fix=self.fix(name))
        return x

    def check_decimal(self, value: object, name: str) -> Decimal:
        """As :meth:`check`, returning the value as the exact Decimal the user wrote (money)."""
        self.check(value, name)
        if isinstance(value, Decimal):
            return value
        if isinstance(value, float):
            return Decimal(repr(value))
        try:
            return Decimal(str(value).strip())
        except InvalidOperation:  # float() reads forms Decimal does not ('1_000')
            raise InputError(f"{str(value)!r} is not a plain decimal number of {self.unit}",
                             where=name, fix=self.fix(name)) from None


# -- the quantities ----------------------------------------------------------------------------
#: No cloud GPU-hour costs near $1,000 (the dearest list prices are about $15 per GPU-hour).
PRICE_USD_PER_GPU_HOUR = Quantity(
    "the price of one GPU-hour", "USD per GPU-hour", 0.0, 1000.0, example="2.50",
    above_hint="no GPU-hour costs near that: is it a monthly, yearly or per-node price?")
#: Retail electricity is $0.05-0.60 per kWh; $10 per kWh is no tariff anywhere.
ENERGY_USD_PER_KWH = Quantity("the price of energy", "USD per kWh", 0.0, 10.0, example="0.12",
                              above_hint="no tariff is near that: is it per MWh?")
EPOCHS = Quantity("the epochs run", "epochs", 0.0, 1e9, low_open=True, example="3")
INTERVAL_S = Quantity("the nominal sample interval", "seconds", 0.001, 86400.0, example="1")
CAP_INTERVALS = Quantity("the gap cap", "nominal intervals", 1.0, 1e6, example="3")
HZ = Quantity("the sampling rate", "samples per second (Hz)", 0.01, 1000.0, example="10")
LIVE_DURATION_S = Quantity("how long to sample", "seconds", 0.0, 366 * 86400.0, low_open=True,
                           example="60")
SAMPLING_INTERVAL_S = Quantity("the sampling interval", "seconds", 0.001, 100.0, example="0.1")
FLUSH_S = Quantity("the time between journal flushes", "seconds", 0.01, 3600.0, example="5")
EXPORTER_INTERVAL_S = Quantity("the time between samples", "seconds", 0.01, 3600.0,
                               example="1")
EXPORTER_REFRESH_S = Quantity("the time between audits", "seconds", 0.1, 86400.0,
                              example="15")
WINDOW_MS = Quantity("the busy-series window", "milliseconds", 0.01, 3_600_000.0,
                     example="100")
WORKERS = Quantity("the number of processes", "processes", 1.0, 1024.0, whole=True,
                   example="4")
TIMEOUT_S = Quantity("the time to wait for one request", "seconds", 0.0, 3600.0,
                     low_open=True, example="60")
RETRIES = Quantity("the retries per request", "retries", 0.0, 100.0, whole=True, example="4")
SCRAPE_DURATION_S = Quantity("how long to record", "seconds", 0.0, 366 * 86400.0,
                             low_open=True, example="10m")
SCRAPE_EVERY_S = Quantity("the scrape interval", "seconds", 0.1, 86400.0, example="15s")
FLEET_SINCE_S = Quantity("the length of the range", "seconds", 0.0, 10 * 366 * 86400.0,
                         low_open=True, example="7d")
FLEET_STEP_S = Quantity("the scrape interval of the series", "seconds", 0.001, 86400.0,
                        example="15s")
FLEET_CHUNK_S = Quantity("the time chunk per query batch", "seconds", 60.0, 366 * 86400.0,
                         example="1d")
CONCURRENCY = Quantity("the requests in flight per store", "requests", 1.0, 64.0, whole=True,
                       example="4")
FLEET_SHARD_S = Quantity("the time shard (whole chunks fetched together)", "seconds", 60.0,
                         3660 * 86400.0, example="7d")
PROM_WINDOW_S = Quantity("a Prometheus duration", "seconds", 0.0, 366 * 86400.0,
                         low_open=True, example="15m")
STEP_S = Quantity("the time step", "seconds", 0.001, 86400.0, example="1m")
LATENCY_MS = Quantity("a latency", "milliseconds", 0.0, 3_600_000.0, low_open=True,
                      example="50")
THROUGHPUT_PER_S = Quantity("the throughput", "units per second", 0.0, 1e15, low_open=True,
                            example="1200/s")
HEADROOM = Quantity("the memory headroom", "share of the peak (0.1 is 10%)", 0.0, 10.0,
                    example="0.1")
BUSY_PCT = Quantity("the highest busy share", "percent", 0.0, 100.0, low_open=True,
                    example="90")
DUTY = Quantity("the share of the month's hours the work runs", "ratio (0 to 1)", 0.0, 1.0,
                low_open=True, example="0.5")
REPLICAS = Quantity("the time-slicing replicas per GPU", "replicas", 1.0, 1024.0, whole=True,
                    example="4")
_NOT_PERCENT = "a ratio runs from 0 to 1, not percent: {x:g} percent is {share:g}"
RATIO = Quantity("a ratio", "ratio (0 to 1)", 0.0, 1.0, example="0.5", above_hint=_NOT_PERCENT)
TENSOR_IDLE_RATIO = Quantity("a tensor-pipe activity ratio", "ratio (0 to 1)", 0.0, 1.0,
                             low_open=True, example="0.01", above_hint=_NOT_PERCENT)
MEMORY_PRESSURE_RATIO = Quantity("the share of framebuffer in use", "ratio (0 to 1)", 0.0, 1.0,
                                 low_open=True, example="0.85", above_hint=_NOT_PERCENT)
ALERT_UNDERUTIL_PCT = Quantity("the utilization threshold", "percent", 0.0, 100.0,
                               low_open=True, example="50")
ALERT_TEMPERATURE_C = Quantity("the temperature threshold", "degrees C", 0.0, 150.0,
                               low_open=True, example="85")
ALERT_HELD_IDLE_HOURS = Quantity("the idle time of a held GPU", "hours", 0.0, 8760.0,
                                 low_open=True, example="4")


# -- durations and times -------------------------------------------------------------------
_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0,
            "y": 31536000.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_PROM_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def parse_duration_s(text: str, q: Quantity | None = None, name: str = "duration") -> float:
    """``15s``, ``1m``, ``7d``, ``1h30m`` or plain seconds, as seconds, checked against ``q``
    (finite and positive when ``q`` is None)."""
    q = q or Quantity("a duration", "seconds", 0.0, None, low_open=True, example="15s")
    t = str(text).strip()
    try:
        seconds = float(t)
    except ValueError:
        parts = _PART.findall(t)
        if not parts or "".join(a + b for a, b in parts) != t:
            raise InputError(f"cannot read duration {text!r}", where=name,
                             fix="write e.g. 15s, 1m, 7d, 1h30m (or plain seconds)") from None
        seconds = sum(float(a) * _UNITS_S[b] for a, b in parts)
    return q.check(seconds, name) if math.isfinite(seconds) else q.check(t, name)


def parse_prom_duration_s(text: str, q: Quantity = PROM_WINDOW_S,
                          name: str = "duration") -> float:
    """A PromQL duration (``30m``, ``1h30m``: whole numbers with a unit; it is written into
    PromQL as is), as seconds checked against ``q``."""
    t = str(text).strip()
    parts = _PROM_PART.findall(t)
    if not parts or "".join(a + b for a, b in parts) != t:
        raise InputError(f"{text!r} is not a Prometheus duration", where=name,
                         fix="write whole numbers with a unit: 30s, 15m, 1h, 1h30m, 7d")
    return q.check(sum(int(a) * _UNITS_S[b] for a, b in parts), name)


#: Times are Unix epoch seconds from 1970 to 2200: wider than any telemetry.
EPOCH_S = Quantity("a time", "Unix epoch seconds", 0.0, 7_258_118_400.0,
                   example="2025-01-31T00:00:00Z")


def parse_time_s(text: str, name: str = "time", *, now: float | None = None) -> float:
    """An absolute time: ISO 8601 (UTC when no zone), epoch seconds, or ``now``."""
    import time
    from datetime import datetime, timezone

    t = str(text).strip()
    if t == "now":
        return time.time() if now is None else now
    try:
        value = float(t)
    except ValueError:
        try:
            dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
        except ValueError:
            raise InputError(f"cannot read time {text!r}", where=name,
                             fix="write ISO 8601 (2025-01-31T00:00:00Z), epoch seconds or "
                             "now") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        value = dt.timestamp()
    return EPOCH_S.check(value, name)


# -- time zones, counts, output paths ----------------------------------------------------------
_OFFSET = re.compile(r"^[+-](0\d|1[0-4]):?[0-5]\d$")


def check_time_zone(tz: str, name: str = "tz") -> str:
    """An IANA time zone name (``Europe/Berlin``, ``UTC``) or a fixed offset (``+02:00``),
    as Arrow reads it; anything else is an :class:`InputError` suggesting close names."""
    import zoneinfo

    text = str(tz).strip()
    if text.upper() == "UTC" or _OFFSET.match(text):
        return "UTC" if text.upper() == "UTC" else text
    try:
        zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        import difflib

        known = zoneinfo.available_timezones()
        if not known:  # not the name's fault: this machine has no zone database at all
            raise InputError(f"cannot look up time zone {tz!r}: this machine has no time-zone "
                             "database", where=name,
                             fix="install one (apt-get install tzdata, or pip install tzdata), "
                             "or give an offset such as +02:00") from None
        close = difflib.get_close_matches(text, sorted(known), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise InputError(f"unknown time zone {tz!r}{hint}", where=name,
                         fix="give an IANA zone name such as UTC, Europe/Berlin or "
                         "America/New_York, or an offset such as +02:00") from None
    return text


_WHOLE_COUNTS = frozenset({"tokens", "samples", "steps"})


def count_quantity(unit: str) -> Quantity:
    """What a count of ``unit`` (tokens, samples, epochs, steps, ...) may be: finite, above 0,
    at most 1e18; tokens, samples and steps whole."""
    if unit == "epochs":
        return EPOCHS
    return Quantity(f"the {unit} processed", unit, 0.0, 1e18, low_open=True,
                    whole=unit in _WHOLE_COUNTS, example="2e9" if unit == "tokens" else "1000")


def check_counts(counts: object, name: str = "counts") -> dict[str, Decimal]:
    """Units of work for unit costs (``{"tokens": 2e9, "epochs": 3}``): each a finite
    number above 0 (see :func:`count_quantity`); returned as exact Decimals."""
    if counts is None:
        return {}
    if not isinstance(counts, Mapping):
        raise InputError(f"{_show(counts)} is not a mapping of unit -> count", where=name,
                         fix='give e.g. {"tokens": 2e9, "epochs": 3}')
    return {str(k): count_quantity(str(k)).check_decimal(v, f"{name}[{str(k)!r}]")
            for k, v in counts.items()}


def check_output_path(path: str | os.PathLike[str], name: str = "output") -> Path:
    """A file to write: its folder must exist (nothing is created behind the user's back) and
    it must not be a folder itself."""
    p = Path(path)
    parent = p.parent
    if p.is_dir():
        raise InputError(f"{str(p)!r} is a folder, not a file", where=name,
                         fix=f"give a file name inside it, e.g. {p / 'report.json'}")
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise InputError(f"cannot write {str(p)!r}: the folder {str(parent)!r} {what}",
                         where=name, fix=f"create it first (mkdir -p {parent}) or write "
                         "somewhere that exists")
    return p


def check_output_dir(path: str | os.PathLike[str], name: str = "output") -> Path:
    """A folder gpuaudit writes files into: it may be new (the writer makes that one folder),
    but the folder it goes in must exist, and it must not be a file."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(f"{str(p)!r} is a file, not a folder", where=name,
                         fix="give a folder for the output files")
    if not p.parent.is_dir():
        raise InputError(f"cannot write into {str(p)!r}: the folder {str(p.parent)!r} does not "
                         "exist", where=name, fix=f"create it first (mkdir -p {p.parent}) or "
                         "write somewhere that exists")
    return p


def read_toml_file(path: Path, *, what: str, option: str, format_fix: str) -> dict[str, Any]:
    """A user's TOML file (``--catalog``, ``--budgets``, ``--map-file``) as a dict: a file that
    cannot be read or is not TOML is an :class:`InputError` naming the file, ``what`` it is,
    the ``option`` that gave it and ``format_fix`` (where its format is documented)."""
    try:
        doc: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", where=str(path),
                         fix=f"give an existing TOML file ({option})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", where=str(path), fix=format_fix) from exc
    return doc
