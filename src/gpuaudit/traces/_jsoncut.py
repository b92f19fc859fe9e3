"""Cut the ``traceEvents`` array out of a Chrome/Kineto trace without parsing every event.

A Kineto trace is one JSON object: a small header (``schemaVersion``, ``deviceProperties``,
``distributedInfo``, ...), the huge ``traceEvents`` array, and a small tail (``traceName``,
``displayTimeUnit``, ``baseTimeNanoseconds``, sometimes ``INFO``). We stream the (possibly
gzip-compressed) file once, write only the array's bytes to a temporary file, and parse the
header and tail with :mod:`json` (a few kB). The array is then read column by column by
DuckDB's C++ JSON reader, so no Python object is ever built per event.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpuaudit.errors import InputError

__all__ = ["CutTrace", "cut_trace_events"]

_CHUNK = 1 << 20
_TAIL_KEEP = 4 << 20
_HEAD_MAX = 64 << 20
_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class CutTrace:
    """The events array in ``array_path`` and the document's other keys in ``meta``.

    ``array_offset`` is the byte offset of the array's ``[`` in the decompressed document,
    so a byte offset reported by the JSON reader maps back to the user's file.
    """

    array_path: Path
    array_offset: int
    meta: dict[str, Any]
    compressed: bool
    size_bytes: int


def _open(path: Path) -> tuple[IO[bytes], bool]:
    fh = open(path, "rb")
    magic = fh.read(2)
    fh.seek(0)
    if magic == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=fh, mode="rb"), True  # type: ignore[return-value]
    return fh, False


def _read(fh: IO[bytes], n: int, path: Path, offset: int, compressed: bool) -> bytes:
    try:
        return fh.read(n)
    except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as exc:
        raise InputError(
            f"the gzip stream is {'truncated' if isinstance(exc, EOFError) else 'corrupt'} "
            f"after {offset:,} decompressed bytes ({exc})",
            where=f"{path}: byte {offset}",
            fix="copy the trace again (the profiler or the transfer stopped early); "
            "`gzip -t FILE` checks a file",
        ) from exc


def _bad_json(path: Path, offset: int, what: str) -> InputError:
    return InputError(
        f"not a valid Kineto/Chrome trace: {what}",
        where=f"{path}: byte {offset}",
        fix="give a trace written by torch.profiler (export_chrome_trace or "
        "tensorboard_trace_handler), plain .json or .json.gz",
    )


def cut_trace_events(path: Path, tmp_dir: Path) -> CutTrace:
    """Stream ``path`` once; write the bytes of its ``traceEvents`` array to ``tmp_dir``.

    Raises :class:`InputError` (with the byte offset) for a truncated gzip, a document that is
    not a JSON object with a ``traceEvents`` array, or a header/tail that is not valid JSON.
    """
    fh, compressed = _open(path)
    out_path = tmp_dir / (path.name.replace(os.sep, "_") + ".events.json")
    try:
        head = b""
        match = None
        while match is None:
            chunk = _read(fh, _CHUNK, path, len(head), compressed)
            if not chunk:
                break
            head += chunk
            match = _KEY_RE.search(head)
            if len(head) > _HEAD_MAX and match is None:
                break
        if match is None:
            stripped = head.lstrip()
            if not stripped:
                raise _bad_json(path, 0, "the file is empty")
            if stripped[:1] == b"[":
                raise _bad_json(path, 0, "a bare JSON array; expected an object with "
                                "a 'traceEvents' key")
            raise _bad_json(path, 0, "no 'traceEvents' array found")
        start = match.end() - 1  # offset of '['
        try:
            header = json.loads(head[:start + 1] + b"]}")
        except json.JSONDecodeError as exc:
            raise _bad_json(path, exc.pos, f"the header before 'traceEvents' is invalid "
                            f"JSON ({exc.msg})") from exc
        if not isinstance(header, dict):
            raise _bad_json(path, 0, "the document is not a JSON object")
        header.pop("traceEvents", None)
        total = len(head)
        tail = head[start:]
        with open(out_path, "wb") as out:
            out.write(tail)
            written = len(tail)
            while True:
                chunk = _read(fh, _CHUNK, path, total, compressed)
                if not chunk:
                    break
                total += len(chunk)
                out.write(chunk)
                written += len(chunk)
                tail = (tail + chunk)[-_TAIL_KEEP:]
        end_rel, tail_meta = _find_array_end(tail, path, total)
        cut_at = written - (len(tail) - end_rel) + 1
        os.truncate(out_path, cut_at)
    except BaseException:
        out_path.unlink(missing_ok=True)
        raise
    finally:
        fh.close()
    meta = {**header, **tail_meta}
    return CutTrace(out_path, start, meta, compressed, total)


def _find_array_end(tail: bytes, path: Path, total: int) -> tuple[int, dict[str, Any]]:
    """Position in ``tail`` of the ``]`` that closes ``traceEvents``, and the keys after it.

    Scans candidate ``]`` from the end: the right one is preceded by the end of an event
    object (``}``) or by ``[`` and followed by the rest of a JSON object.
    """
    pos = len(tail)
    body = tail.rstrip()
    if not body.endswith(b"}"):
        raise _bad_json(path, total, "the document does not end with '}' (cut short?)")
    while True:
        pos = tail.rfind(b"]", 0, pos)
        if pos < 0:
            raise _bad_json(path, total - len(tail), "the end of the 'traceEvents' array "
                            "was not found (the file may be cut short)")
        before = tail[:pos].rstrip()[-1:]
        if before not in (b"}", b"["):
            continue
        try:
            rest = json.loads(b'{"_":[]' + tail[pos + 1:])
        except json.JSONDecodeError:
            continue
        if isinstance(rest, dict):
            rest.pop("_", None)
            return pos, rest
