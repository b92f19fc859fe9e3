"""Limits on what one input may make gpuaudit do: how far a compressed file may inflate, how
deep a JSON value may nest, how long a label may be.

Every reader of user files goes through here, so a hostile or broken file (a decompression
bomb, JSON nested 100,000 deep, a multi-megabyte "label") is a clear :class:`InputError` naming
the limit and how to raise it, never a crash, a traceback or gigabytes of memory.
docs/options-and-errors.md lists the limits.

- ``max_input_bytes()``: the most bytes one compressed input (``.gz``, ``.bz2``, ``.zst``,
  ``.lz4``) may inflate to; ``GPUAUDIT_MAX_INPUT_BYTES`` (the CLI's ``--max-input-bytes``
  sets it) raises it. Plain files are read as they are: their size is the user's own.
- ``MAX_JSON_DEPTH``: nesting of one JSON Lines row (a row object holding a labels object is
  depth 2); the C JSON parser under pyarrow recurses per level and crashes past ~10^4.
- ``MAX_LABEL_CHARS``: characters of a label key or value.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from gpuaudit.errors import InputError

__all__ = [
    "DEFAULT_MAX_INPUT_BYTES",
    "MAX_INPUT_BYTES_ENV",
    "MAX_JSON_DEPTH",
    "MAX_LABEL_CHARS",
    "BoundedStream",
    "check_json_depth",
    "inflate_gzip",
    "max_input_bytes",
    "parse_bytes",
    "parse_memory_limit",
]

DEFAULT_MAX_INPUT_BYTES = 2 * 1024**3  # 2 GiB decompressed per input file
MAX_INPUT_BYTES_ENV = "GPUAUDIT_MAX_INPUT_BYTES"
MAX_JSON_DEPTH = 64
MAX_LABEL_CHARS = 1024

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
          "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024,
          "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, what: str = "--max-input-bytes") -> int:
    """``"8GiB"``, ``"500MB"``, ``"1000000"`` -> bytes; a clear error otherwise."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise InputError(f"{what} {text!r} is not a size",
                         fix="give bytes with an optional unit: 8GiB, 500MB, 1000000")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise InputError(f"{what} {text!r} is below one byte", fix="give a positive size")
    return value


def parse_memory_limit(text: int | str, what: str = "--memory-limit") -> int:
    """A memory limit (the bill's DuckDB): bytes, or a size such as ``"4GB"``; at least
    1 MiB."""
    value = parse_bytes(text, what) if isinstance(text, str) else int(text)
    if value < 1 << 20:
        raise InputError(f"{what} {text!r} is below 1 MiB",
                         fix="give DuckDB room to work: e.g. 4GB (it spills to disk past it)")
    return value


def max_input_bytes() -> int:
    """The decompressed-size limit in force (the environment's, else the default)."""
    raw = os.environ.get(MAX_INPUT_BYTES_ENV)
    return parse_bytes(raw, MAX_INPUT_BYTES_ENV) if raw else DEFAULT_MAX_INPUT_BYTES


def _too_big(where: str, limit: int) -> InputError:
    return InputError(
        f"the compressed input inflates to more than {limit:,} bytes (the limit on one "
        "decompressed input): a decompression bomb, or a very large file",
        where=where,
        fix=f"if the file is genuine, raise the limit: --max-input-bytes {2 * limit}B "
        f"(or {MAX_INPUT_BYTES_ENV}); otherwise do not read it")


_IN_STEP = 1 << 18  # compressed bytes fed per decompression call (a view, not a copy)
_OUT_STEP = 1 << 20  # inflated bytes per call: JSON inflates 50x in places
_HINT_RATIO = 64  # trace JSON compresses 10-30x; beyond this the buffer grows as it fills


def _inflater() -> Any:
    """A gzip stream decompressor: ISA-L's (``isal``, a core dependency: 2-4x zlib's speed on
    trace JSON), else zlib's; both raise ``zlib.error`` for a corrupt stream here."""
    try:
        from isal import isal_zlib
    except ImportError:  # a platform without an isal wheel: zlib, same results
        return zlib.decompressobj(31)
    return isal_zlib.decompressobj(31)


def inflate_gzip(raw: bytes | bytearray, where: str, limit: int | None = None,
                 inflater: Any = None) -> bytearray:
    """Every gzip member of ``raw``, decompressed into one buffer, a step at a time, so
    memory stays within ``limit`` plus one step (the gzip trailer's size field can lie, so it
    is not trusted: it only sizes the buffer up front, within the limit, so a document of the
    size it states is written in place, with no second copy while the buffer grows).
    Truncated or corrupt streams raise ``zlib.error`` / ``EOFError`` for the caller.
    ``inflater``: makes each member's decompressor (default :func:`_inflater`)."""
    limit = max_input_bytes() if limit is None else limit
    hint = int.from_bytes(raw[-4:], "little") if len(raw) >= 18 else 0
    # the hint is believed only up to _HINT_RATIO times the compressed size: a 20-byte file
    # whose trailer claims 2 GiB must not cost 2 GiB of zeroed memory before a byte inflates
    out = bytearray(min(hint, limit, _HINT_RATIO * len(raw)))
    view = memoryview(raw)
    with _isal_errors_as_zlib():
        return _inflate(view, out, where, limit, inflater or _inflater)


@contextlib.contextmanager
def _isal_errors_as_zlib() -> Iterator[None]:
    """isal's ``IsalError`` (the same corrupt stream zlib reports) raised as ``zlib.error``,
    so callers catch one type whichever decompressor ran."""
    try:
        yield
    except zlib.error:
        raise
    except Exception as exc:
        if type(exc).__name__ != "IsalError":
            raise
        raise zlib.error(str(exc)) from exc


def inflate_gzip_bytes(raw: bytes, where: str, limit: int | None = None) -> bytes:
    """:func:`inflate_gzip` for a body held whole (an HTTP answer): one decompression call
    straight into the result (no buffer zeroed up front, no copy of each step into it),
    within the same limit; a body of several gzip members goes through
    :func:`inflate_gzip`."""
    limit = max_input_bytes() if limit is None else limit
    d = _inflater()
    with _isal_errors_as_zlib():
        out = d.decompress(raw, limit + 1)
    if len(out) > limit:
        raise _too_big(where, limit)
    if not d.eof:
        raise EOFError("compressed body ended before the end-of-stream marker")
    if d.unused_data.strip(b"\0"):  # (another member follows)
        return bytes(inflate_gzip(raw, where, limit))
    return bytes(out)


def _inflate(view: memoryview, out: bytearray, where: str, limit: int,
             inflater: Any) -> bytearray:
    pos = 0
    start = 0
    while start < len(view):
        d = inflater()
        i = start
        while True:
            tail = d.unconsumed_tail
            if tail:
                piece: bytes | memoryview = tail
            else:
                piece = view[i:i + _IN_STEP]
                i += len(piece)
            chunk = d.decompress(piece, _OUT_STEP)
            n = len(chunk)
            if pos + n > limit:
                raise _too_big(where, limit)
            if pos + n <= len(out):
                out[pos:pos + n] = chunk
            else:
                del out[pos:]
                out += chunk
            pos += n
            if d.eof or (i >= len(view) and not d.unconsumed_tail):
                break
        if not d.eof:
            rest = d.flush()
            out[pos:] = rest
            raise EOFError("compressed file ended before the end-of-stream marker")
        start = i - len(d.unused_data)
        while start < len(view) and view[start] == 0:  # members may be padded with zeros
            start += 1
    del out[pos:]
    return out


class BoundedStream(io.RawIOBase):
    """A readable stream over another that raises :class:`InputError` once more than
    ``limit`` bytes have come out of it (a decompressing stream, so the limit is on the
    inflated size). pyarrow's CSV and JSON readers take it as a file object."""

    def __init__(self, inner: Any, where: str, limit: int | None = None) -> None:
        super().__init__()
        self._inner = inner
        self._where = where
        self._limit = max_input_bytes() if limit is None else limit
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        chunk = self._inner.read(len(view))
        n = len(chunk)
        view[:n] = chunk
        self.read_bytes += n
        if self.read_bytes > self._limit:
            raise _too_big(self._where, self._limit)
        return n

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            super().close()


_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("{"), ord("[")]] = 1
_OPEN[[ord("}"), ord("]")]] = -1


def check_json_depth(blocks: Iterator[bytes], path: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise a located :class:`InputError` at the first JSON Lines row nested deeper than
    ``limit``. ``blocks`` are consecutive pieces of the decompressed file. Strings are
    removed first (a bracket in a label value is not nesting), then each line's depth is the
    running sum of its opening and closing brackets (vectorised: no Python per byte)."""
    carry = b""
    line_no = 1
    for block in blocks:
        data = carry + block
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            carry = data
            continue
        carry = data[cut:]
        line_no = _check_lines(data[:cut], path, limit, line_no)
    if carry:
        _check_lines(carry + b"\n", path, limit, line_no)


def _check_lines(text: bytes, path: str, limit: int, line_no: int) -> int:
    if b"{" not in text and b"[" not in text:
        return line_no + text.count(b"\n")
    bare = _STRING.sub(b'""', text)
    a = np.frombuffer(bare, np.uint8)
    step = _OPEN[a].astype(np.int32)
    ends = np.flatnonzero(a == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    depth = np.cumsum(step)
    before = np.where(starts > 0, depth[np.maximum(starts - 1, 0)], 0)
    nonempty = starts < len(a)
    peak = np.maximum.reduceat(depth, starts[nonempty]) - before[nonempty]
    over = np.flatnonzero(peak > limit)
    if over.size:
        row = int(np.flatnonzero(nonempty)[over[0]])
        raise InputError(
            f"a JSON value nested {int(peak[over[0]]):,} levels deep (the limit is {limit}): "
            "a sample row holds flat values and one labels object",
            where=f"{path}:{line_no + row}",
            fix='write labels as a flat object, {"team": "a", "job": "b"}; nested values '
            "cannot be labels")
    return line_no + len(ends)
