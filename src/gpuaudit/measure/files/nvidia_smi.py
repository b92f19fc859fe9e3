"""What ``nvidia-smi --query-gpu=... --format=csv`` logs contain, and columnar value parsers.

The field catalogue names each ``--query-gpu`` field gpuaudit imports, the sample-table column
it fills and the unit nvidia-smi prints after the value (``0 %``, ``17092 MiB``, ``73.41 W``,
``1980 MHz``) unless ``nounits`` is given. Headers keep the unit in brackets
(``utilization.gpu [%]``) even under ``nounits``. The parsers here work on whole Arrow arrays
(pyarrow.compute string kernels, numpy on raw buffers): no Python per value.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuaudit.errors import InputError

__all__ = [
    "FIELDS",
    "NULL_VALUES",
    "Field",
    "first_bad_row",
    "is_known_field",
    "parse_hex_mask",
    "parse_number",
    "parse_timestamp",
    "resolve_header",
    "split_header_unit",
]


@dataclass(frozen=True)
class Field:
    """One ``--query-gpu`` field: the column it fills, its value unit, its priority."""

    column: str  # sample-table column, or "label:<key>"
    unit: str | None  # unit nvidia-smi prints after values and in the header
    rank: int = 0  # lower wins when two fields fill the same column


#: ``--query-gpu`` field -> sample-table column (see ``nvidia-smi --help-query-gpu``).
FIELDS: dict[str, Field] = {
    "timestamp": Field("ts", None),
    "index": Field("gpu_index", None),
    "uuid": Field("gpu_uuid", None),
    "gpu_uuid": Field("gpu_uuid", None, 1),
    "name": Field("gpu_model", None),
    "gpu_name": Field("gpu_model", None, 1),
    "pci.bus_id": Field("label:pci_bus_id", None),
    "gpu_bus_id": Field("label:pci_bus_id", None, 1),
    "utilization.gpu": Field("util_gpu_pct", "%"),
    "utilization.memory": Field("util_mem_pct", "%"),
    "memory.used": Field("mem_used_mib", "MiB"),
    "memory.total": Field("mem_total_mib", "MiB"),
    "power.draw": Field("power_w", "W"),
    "power.draw.average": Field("power_w", "W", 1),
    "power.draw.instant": Field("power_w", "W", 2),
    "enforced.power.limit": Field("power_limit_w", "W"),
    "power.limit": Field("power_limit_w", "W", 1),
    "temperature.gpu": Field("temp_c", "C"),
    "clocks.current.sm": Field("sm_clock_mhz", "MHz"),
    "clocks.sm": Field("sm_clock_mhz", "MHz", 1),
    "clocks_event_reasons.active": Field("clocks_event_reasons", None),
    "clocks_throttle_reasons.active": Field("clocks_event_reasons", None, 1),
    "ecc.errors.uncorrected.volatile.total": Field("ecc_dbe_total", None),
    "mig.mode.current": Field("label:mig_mode", None),
}

#: Custom headers seen around nvidia-smi (normalised: lower case, non-alphanumerics -> "_").
#: ``timestamp,gpu_index,temperature_C,utilization_gpu_percent,power_W`` is nanoGPT PR #643.
ALIASES: dict[str, str] = {
    "gpu_index": "index",
    "gpu_idx": "index",
    "temperature_c": "temperature.gpu",
    "temperature": "temperature.gpu",
    "temp": "temperature.gpu",
    "utilization_gpu_percent": "utilization.gpu",
    "utilization_gpu_pct": "utilization.gpu",
    "gpu_utilization": "utilization.gpu",
    "utilization_memory_percent": "utilization.memory",
    "utilization_memory_pct": "utilization.memory",
    "memory_used_mib": "memory.used",
    "memory_total_mib": "memory.total",
    "power_draw_w": "power.draw",
    "power": "power.draw",
    "power_w": "power.draw",
    "temp_c": "temperature.gpu",
    "util_gpu_pct": "utilization.gpu",
    "util_mem_pct": "utilization.memory",
    "mem_used_mib": "memory.used",
    "mem_total_mib": "memory.total",
    "power_limit_w": "enforced.power.limit",
    "sm_clock_mhz": "clocks.current.sm",
    "power_limit": "power.limit",
    "clocks_sm_mhz": "clocks.current.sm",
    "clocks_current_sm_mhz": "clocks.current.sm",
    "time": "timestamp",
    "datetime": "timestamp",
}
ALIASES.update({f.replace(".", "_"): f for f in FIELDS if "." in f})

#: nvidia-smi field families gpuaudit knows but has no sample-table column for.
_KNOWN_PREFIXES = (
    "accounting", "addressing_mode", "clocks", "compute", "count", "display", "driver",
    "ecc", "encoder", "fabric", "fan", "gom", "gpu_", "inforom", "memory", "mig", "pcie",
    "persistence", "platform", "power", "protected_memory", "pstate", "remapped_rows",
    "reset_status", "retired_pages", "serial", "temperature", "utilization", "vbios",
    "enforced", "module", "c2c",
)

#: Cells nvidia-smi writes for "no value" (with and without the space after the comma).
NULL_VALUES = ["", " ", "[N/A]", " [N/A]", "N/A", " N/A", "[Not Supported]",
               " [Not Supported]", "[Unknown Error]", " [Unknown Error]",
               "[Insufficient Permissions]", " [Insufficient Permissions]"]

_HEADER_UNIT = re.compile(r"^(.*?)\s*\[([^\]]*)\]\s*$")


def split_header_unit(header: str) -> tuple[str, str | None]:
    """``'utilization.gpu [%]'`` -> ``('utilization.gpu', '%')``; no brackets -> unit None."""
    m = _HEADER_UNIT.match(header.strip())
    if m:
        return m.group(1).strip(), m.group(2).strip()
    return header.strip(), None


def _normalise(name: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def resolve_header(name: str) -> str | None:
    """The nvidia-smi field a header names (exact field or known alias), or None."""
    base, _unit = split_header_unit(name)
    low = base.lower()
    if low in FIELDS:
        return low
    return ALIASES.get(_normalise(base))


def is_known_field(name: str) -> bool:
    """A ``--query-gpu`` field gpuaudit recognises but does not import (fan.speed, pstate)."""
    low = split_header_unit(name)[0].lower()
    return ("." in low and low.startswith(_KNOWN_PREFIXES)) or low in (
        "driver_version", "pstate", "serial", "count", "vbios_version", "persistence_mode",
        "compute_mode", "display_mode", "display_active",
    )


# --------------------------------------------------------------------------- parsers


def first_bad_row(arr: pa.Array, attempt: Callable[[pa.Array], object]) -> int:
    """Index of the first element for which ``attempt`` raises (bisection, O(log n) calls).

    Used only once a whole-array conversion has failed, to name the offending row.
    """
    lo, hi = 0, len(arr)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            attempt(arr.slice(lo, mid - lo))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OverflowError):
            hi = mid
        else:
            lo = mid
    return lo


Locate = Callable[[int], str]


def _bad_value(arr: pa.Array, row: int) -> str:
    return str(arr[row].as_py())


def parse_number(
    arr: pa.Array,
    to_type: pa.DataType,
    *,
    unit: str | None,
    column: str,
    locate: Locate,
) -> pa.Array:
    """Strings like ``' 17092 MiB'``, ``'73.41'`` -> numbers; the unit suffix is optional.

    Only ``unit`` may follow the number: a value in another unit (``17 GiB`` where MiB is
    expected) is an error, never a silent rescale.
    """
    # One trim drops spaces and the unit's letters at either end ("73.41 W" -> "73.41");
    # a value in another unit keeps letters ("17 GiB" -> "17 G") and fails the cast below.
    s = pc.ascii_trim(arr, characters=" \t" + (unit or ""))

    def cast(a: pa.Array) -> pa.Array:
        return pc.cast(a, to_type)

    try:
        return cast(s)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        row = first_bad_row(s, cast)
        value = _bad_value(arr, row)
        kind = "a whole number" if pa.types.is_integer(to_type) else "a number"
        raise InputError(
            f"column '{column}' value {value!r} is not {kind}"
            + (f" in {unit}" if unit else ""),
            where=locate(row),
            fix=(f"give plain numbers or numbers followed by '{unit}'; convert other units "
                 f"to {unit} first" if unit else "give a plain number, or leave the cell "
                 "empty / [N/A] if it was not measured"),
        ) from exc


_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i


def parse_hex_mask(arr: pa.Array, *, column: str, locate: Locate) -> pa.Array:
    """``'0x0000000000000004'`` (NVML clocks event reasons, hex) or decimal -> uint64.

    Hex digits are decoded with a lookup table over the string buffer: no per-value Python.
    """
    s = pc.ascii_trim_whitespace(arr)
    n = len(s)
    if n == 0:
        return pa.array([], type=pa.uint64())
    is_hex = pc.fill_null(pc.starts_with(pc.ascii_lower(s), "0x"), True)
    if not pc.all(is_hex).as_py():
        if pc.any(pc.and_(is_hex, pc.is_valid(s))).as_py():
            row = int(pc.index(is_hex, False).as_py())
            raise InputError(
                f"column '{column}' mixes hex and decimal bitmasks ({_bad_value(arr, row)!r})",
                where=locate(row),
                fix="write every bitmask the same way, as nvidia-smi does (0x...)",
            )
        return parse_number(arr, pa.uint64(), unit=None, column=column, locate=locate)
    digits = pc.utf8_slice_codeunits(s, 2)
    ok = pc.fill_null(pc.match_substring_regex(digits, r"^[0-9a-fA-F]{1,16}$"), True)
    if not pc.all(ok).as_py():
        row = int(pc.index(ok, False).as_py())
        raise InputError(
            f"column '{column}' value {_bad_value(arr, row)!r} is not a 64-bit hex bitmask",
            where=locate(row),
            fix="give the mask as nvidia-smi prints it, e.g. 0x0000000000000004",
        )
    valid = pc.is_valid(digits)
    padded = pc.fill_null(pc.utf8_lpad(digits, width=16, padding="0"), "0" * 16)
    padded = pa.concat_arrays([padded])
    offsets = np.frombuffer(padded.buffers()[1], dtype=np.int32)[padded.offset:]
    data = np.frombuffer(padded.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[0] + 16 * n]
    nibbles = _HEX[data].reshape(n, 16).astype(np.uint64)
    out = np.zeros(n, dtype=np.uint64)
    for k in range(16):
        out |= nibbles[:, k] << np.uint64(4 * (15 - k))
    return pa.array(out, mask=~np.asarray(valid.to_numpy(zero_copy_only=False)))


_ZONE = re.compile(r"(Z|[+-]\d{2}:?\d{2})$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_EPOCH_UNITS = (("s", 1e11, 1_000_000_000), ("ms", 1e14, 1_000_000), ("us", 1e17, 1_000),
                ("ns", float("inf"), 1))
TS_UTC = pa.timestamp("ns", tz="UTC")


@dataclass
class TimeFormat:
    """How one stream's timestamps are written; decided on the first values, then fixed."""

    kind: str  # "iso-zone", "iso-naive", "epoch", "timestamp"
    slashes: bool = False
    epoch_unit: str | None = None
    assumed_tz: str | None = None
    #: the value the format was decided on, as the file wrote it, and where it is (file:line;
    #: the reader fills it in), so an error can quote the real first value, not an example
    example: str | None = None
    example_row: int = 0
    example_where: str | None = None


def epoch_unit_for(magnitude: float) -> str:
    """Seconds, ms, us or ns since 1970, told apart by magnitude (valid for years 1973-5138)."""
    for name, limit, _mult in _EPOCH_UNITS:
        if magnitude < limit:
            return name
    return "ns"


def _epoch_to_ts(values: pa.Array, unit: str) -> pa.Array:
    mult = next(m for name, _lim, m in _EPOCH_UNITS if name == unit)
    if pa.types.is_integer(values.type):
        ns = pc.multiply_checked(pc.cast(values, pa.int64()), mult)
    elif mult >= 1000:
        # float64 holds today's epoch in microseconds exactly (< 2**53); finer digits of a
        # float are noise, so round to the microsecond before scaling to ns.
        us = pc.round(pc.multiply(pc.cast(values, pa.float64()), float(mult // 1000)))
        ns = pc.multiply_checked(pc.cast(us, pa.int64()), 1000)
    else:
        ns = pc.cast(pc.round(pc.cast(values, pa.float64())), pa.int64())
    return pc.cast(ns, TS_UTC)


def detect_time_format(arr: pa.Array, tz: str, explicit_unit: str | None) -> TimeFormat | None:
    """Look at the first non-null value and decide the format of the whole column."""
    if pa.types.is_timestamp(arr.type):
        return TimeFormat("timestamp", assumed_tz=None if arr.type.tz else tz)
    valid = pc.is_valid(arr)
    row = pc.index(valid, True).as_py()
    if row is None or row < 0:
        return None
    vals = pc.drop_null(arr)
    first = str(arr[row].as_py()).strip()
    if pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type):
        mag = float(pc.max(pc.abs(pc.cast(vals, pa.float64()))).as_py())
        return TimeFormat("epoch", epoch_unit=explicit_unit or epoch_unit_for(mag),
                          example=first, example_row=row)
    if _NUMBER.match(first):
        nums = pc.cast(pc.ascii_trim_whitespace(vals), pa.float64())
        mag = float(pc.max(pc.abs(nums)).as_py())
        return TimeFormat("epoch", epoch_unit=explicit_unit or epoch_unit_for(mag),
                          example=first, example_row=row)
    slashes = "/" in first[:10]
    if _ZONE.search(first):
        return TimeFormat("iso-zone", slashes=slashes, example=first, example_row=row)
    return TimeFormat("iso-naive", slashes=slashes, assumed_tz=tz, example=first,
                      example_row=row)


def _assume_local(naive: pa.Array, tz: str, state: dict[str, int] | None) -> pa.Array:
    """Local wall-clock times in ``tz`` -> UTC, through a daylight-saving change.

    When the clock falls back, an hour of local times repeats: a log written in order shows
    them twice, first in summer time, then (after the wall clock goes back) in standard
    time. Each ambiguous time is read as the earlier instant until the log's local time has
    gone back, then as the later one. ``state`` carries the latest local time seen across
    batches. A time that does not exist (the hour skipped in spring) cannot come from a
    clock that was running, and stays an error."""
    if isinstance(naive, pa.ChunkedArray):
        naive = naive.combine_chunks()
    ints = pc.cast(naive, pa.int64()).to_numpy(zero_copy_only=False)
    ints = np.where(np.isnan(ints), np.iinfo(np.int64).min, ints).astype(np.int64) \
        if ints.dtype.kind == "f" else ints
    before = np.maximum.accumulate(ints)
    prev = state.get("max_local_ns") if state is not None else None
    seen = np.empty_like(before)
    seen[0] = prev if prev is not None else np.iinfo(np.int64).min
    seen[1:] = before[:-1]
    if prev is not None:
        np.maximum(seen, prev, out=seen)
    if state is not None and ints.shape[0]:
        state["max_local_ns"] = int(max(before[-1], prev if prev is not None else before[-1]))
    try:
        return pc.cast(pc.assume_timezone(naive, timezone=tz), TS_UTC)
    except pa.ArrowInvalid as exc:
        if "ambiguous" not in str(exc):
            raise
    early = pc.cast(pc.assume_timezone(naive, timezone=tz, ambiguous="earliest"),
                    pa.int64()).to_numpy(zero_copy_only=False)
    late = pc.cast(pc.assume_timezone(naive, timezone=tz, ambiguous="latest"),
                   pa.int64()).to_numpy(zero_copy_only=False)
    second_pass = ints < seen  # the wall clock went back: the repeated hour's second time
    out = np.where(second_pass & (early != late), late, early)
    return pa.array(out.astype(np.int64), pa.int64(), mask=~np.asarray(
        pc.is_valid(naive).to_numpy(zero_copy_only=False))).cast(TS_UTC)


def parse_timestamp(arr: pa.Array, fmt: TimeFormat, *, column: str, locate: Locate,
                    state: dict[str, int] | None = None) -> pa.Array:
    """Timestamps as nvidia-smi (``2025/10/15 15:57:04.086``, local), ISO 8601 (with or
    without a zone), epoch numbers, or Arrow timestamps -> ``timestamp[ns, UTC]``.
    ``state``: carried between the batches of one file (local times through a DST change)."""

    def convert(a: pa.Array) -> pa.Array:
        if fmt.kind == "timestamp":
            if a.type.tz is None:
                naive = pc.cast(a, pa.timestamp("ns"))
                if fmt.assumed_tz and fmt.assumed_tz != "UTC":
                    return _assume_local(naive, fmt.assumed_tz, state)
                return pc.cast(naive, TS_UTC)
            return pc.cast(a, TS_UTC)
        if fmt.kind == "epoch":
            if pa.types.is_string(a.type) or pa.types.is_large_string(a.type):
                a = pc.cast(pc.ascii_trim_whitespace(a), pa.float64())
            return _epoch_to_ts(a, fmt.epoch_unit or "s")
        s = pc.ascii_trim_whitespace(pc.cast(a, pa.string()))
        if fmt.slashes:
            s = pc.replace_substring(s, pattern="/", replacement="-")
        if fmt.kind == "iso-zone":
            return pc.cast(s, TS_UTC)
        naive = pc.cast(s, pa.timestamp("ns"))
        if fmt.assumed_tz and fmt.assumed_tz != "UTC":
            return _assume_local(naive, fmt.assumed_tz, state)
        return pc.cast(naive, TS_UTC)

    try:
        return convert(arr)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        row = first_bad_row(arr, convert)
        value = _bad_value(arr, row)
        expected = {
            "iso-zone": "an ISO 8601 time with a zone",
            "iso-naive": "a date and time without a zone",
            "epoch": f"a number of epoch {fmt.epoch_unit}",
            "timestamp": "a valid time",
        }[fmt.kind]
        if fmt.example is not None:  # the file's own first value, quoted where it stands
            expected += f" like the column's first value {fmt.example!r}"
            if fmt.example_where:
                expected += f" ({fmt.example_where})"
        raise InputError(
            f"column '{column}' value {value!r} is not {expected}: {exc}",
            where=locate(row),
            fix="write every timestamp in one format (ISO 8601 with Z, nvidia-smi's "
            "'YYYY/MM/DD HH:MM:SS.mmm', or epoch seconds); remove or repair this row",
        ) from exc
