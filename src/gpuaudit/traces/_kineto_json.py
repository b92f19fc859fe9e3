"""Decode a Kineto/Chrome trace's JSON into per-event columns with msgspec, slice by slice.

A Kineto trace (``torch.profiler`` ``export_chrome_trace`` / ``tensorboard_trace_handler``) is
one JSON object: a small header (``schemaVersion``, ``deviceProperties``,
``distributedInfo``), the huge ``traceEvents`` array, a small tail (``baseTimeNanoseconds``,
``traceName``). Parsing every event into a dict is what makes other tools slow and large
(``json.loads`` of a 54 MB trace: ~0.9 s, 377 MB). Here:

1. the ``traceEvents`` array is found from the document's ends and the header and tail
   around it are proven valid (:func:`locate_events`, :func:`meta_around`), so the array's
   own decoding (step 2) proves the rest and no pass goes over the whole document first.
   Where that does not apply or anything fails, the whole document is validated by msgspec's
   C parser as ``dict[str, Raw]`` (every value skipped without building objects, ~1.5 GB/s)
   and then decoded: damaged JSON is an error with the byte offset msgspec reports, never
   silently skipped. The header and tail values are decoded as JSON;
2. the ``traceEvents`` array (a zero-copy :class:`msgspec.Raw` view) is decoded in slices of
   about :data:`SLICE_BYTES`, each into compact :class:`_Event` structs holding only ``ph``,
   ``cat``, ``name``, ``ts``, ``dur`` and ``args.{stream,correlation,device,flops}`` (plus
   ``Input Dims`` and ``Concrete Inputs``, to count FLOPs where ``flops`` is absent; every other
   key is skipped in C). A slice ends at a ``}`` followed by ``,`` and ``{``; such a cut can lie
   inside a string or a nested object, and then the slice is malformed and the next candidate
   is tried: a slice that parses ends exactly at an element of the array (the parser's state
   after the same bytes is the same as in the whole document, and only "after an element of
   the array" accepts the closing ``]``);
3. per slice, the selector keeps the events an analysis needs; their numbers (kept as raw
   JSON text) are decoded column-wise in NumPy as exact decimals (microseconds -> integer ns,
   no float rounding, HTA issue #317); names are interned (one ``str`` per distinct name, an
   int32 code per event); the slice's structs are then freed, so memory is the document plus
   one slice's structs plus the kept columns.

How the events array is walked is the caller's choice (``decode(..., events=...)``): in one
pass here by default, or in parts by helper processes
(:func:`gpuaudit.traces._kineto_parts.decode_events`), which use :func:`decode_part` and the
accumulator's :meth:`~_Accumulator.state` / :meth:`~_Accumulator.absorb` and give the same
columns.
"""

from __future__ import annotations

import gzip
import mmap
import os
import re
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import attrgetter, eq
from pathlib import Path
from typing import Any, cast

import msgspec
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gpuaudit.errors import InputError
from gpuaudit.limits import inflate_gzip
from gpuaudit.traces.op_flops import FORMULA_OPS, op_flops

__all__ = ["PROBE_BYTES", "SLICE_BYTES", "Columns", "decode", "locate_events", "meta_around",
           "parse_ns", "read_document"]

I64 = np.int64
#: bytes of the traceEvents array decoded at a time (bounds the transient Python structs;
#: a 1 MiB slice's, ~1 MB, stay in a core's cache while its columns are read: 1 MiB slices
#: took 11-17 % less CPU than 4 MiB ones on a 106 MB trace, 3-4 % on the real traces)
SLICE_BYTES = 1 << 20
_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
#: where a document's events array opens (the ``[`` ends the match) and may close (a ``}``
#: then the ``]`` that ends the match): candidates, proven by :func:`meta_around`
_EVENTS_OPEN = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_EVENTS_CLOSE = re.compile(rb"\}[ \t\r\n]*\]")
_CUT_TRIES = 8  # candidate cuts per slice before the slice runs to the end of the array
_GZIP_MAGIC = b"\x1f\x8b"
_NUM_ROWS = 1 << 13  # numbers per decode step (a few 2-D int64 temporaries)
_POW10 = np.array([10 ** i for i in range(19)], dtype=I64)
_NON_WS = re.compile(rb"[^ \t\r\n]")
_BYTE_AT = re.compile(r"\(byte (\d+)\)")
_INDEX_AT = re.compile(r"`\$\[(\d+)\]")

_ABSENT = msgspec.Raw(b"")


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys the loader reads, as raw JSON text (any type is accepted here):
    ``flops`` (torch.profiler(with_flops=True) on operator events), and the operator input
    shapes and scalar arguments (``record_shapes``), which give a FLOP count where the export
    left ``flops`` out (torch 2.x, see :mod:`gpuaudit.traces.op_flops`). Absent keys cost
    nothing to decode; present ones are zero-copy views."""

    stream: msgspec.Raw = _ABSENT
    correlation: msgspec.Raw = _ABSENT
    device: msgspec.Raw = _ABSENT
    flops: msgspec.Raw = _ABSENT
    input_dims: msgspec.Raw = msgspec.field(default=_ABSENT, name="Input Dims")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_ABSENT, name="Concrete Inputs")


_NO_ARGS = _Args()


class _Event(msgspec.Struct, frozen=True, gc=False):
    """One trace event, only the keys the loader reads (Chrome Trace Event Format: ``ph``,
    ``cat`` and ``name`` are strings; ``ts``/``dur`` stay raw text for exact decoding)."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    ts: msgspec.Raw = _ABSENT
    dur: msgspec.Raw = _ABSENT
    args: _Args = _NO_ARGS


_SLICE_DECODER = msgspec.json.Decoder(list[_Event])
_TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])

#: (ph == "X", category code (-1: none or unknown), names of the events a mask selects
#: ("" for none), whether the events a mask selects carry ``args.flops``) -> kind per event
#: (0: not kept)
Selector = Callable[[np.ndarray, np.ndarray, Callable[[np.ndarray], list[str]],
                     Callable[[np.ndarray], np.ndarray]], np.ndarray]
_NO_NAME: dict[str | None, str] = {None: ""}  # .get(name, name): None -> "", else the name


def _bad(path: Path, offset: int, what: str) -> InputError:
    return InputError(
        f"not a valid Kineto/Chrome trace: {what}",
        where=f"{path}: byte {offset}",
        fix="give a trace written by torch.profiler (export_chrome_trace or "
        "tensorboard_trace_handler), plain .json or .json.gz",
    )


def _invalid_json(path: Path, exc: msgspec.DecodeError, size: int, base: int = 0
                  ) -> InputError:
    msg = str(exc)
    m = _BYTE_AT.search(msg)
    pos = base + int(m.group(1)) if m else size
    msg = _BYTE_AT.sub("", msg).strip()
    return InputError(
        f"invalid JSON in the trace: {msg}",
        where=f"{path}: byte {pos}",
        fix="the trace file is damaged (cut short or edited); write it again with "
        "torch.profiler",
    )


def read_document(path: Path) -> tuple[bytes | bytearray, bool]:
    """The decompressed document and whether it was gzip (magic bytes, not the suffix).

    A truncated or corrupt gzip stream is an :class:`InputError` naming the decompressed
    byte offset where it failed.
    """
    with path.open("rb") as fh:
        # a plain document is read into a mutable buffer: slices are framed in place
        # (see _Frame), never copied
        raw = bytearray(os.fstat(fh.fileno()).st_size)
        got = fh.readinto(raw)
        if got < len(raw):  # the file shrank under us: what was read is the document
            del raw[got:]
    if raw[:2] != _GZIP_MAGIC:
        return raw, False
    try:
        # bounded: never more than limits.max_input_bytes() of output, whatever the
        # gzip trailer claims (a decompression bomb's trailer lies)
        return inflate_gzip(raw, str(path)), True
    except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as exc:
        got = _decompressed_before_failure(raw)
        kind = "truncated" if isinstance(exc, EOFError) or "incomplete" in str(exc) \
            else "corrupt"
        raise InputError(
            f"the gzip stream is {kind} after {got:,} decompressed bytes ({exc})",
            where=f"{path}: byte {got}",
            fix="copy the trace again (the profiler or the transfer stopped early); "
            "`gzip -t FILE` checks a file",
        ) from exc


def _decompressed_before_failure(raw: bytes | bytearray) -> int:
    d = zlib.decompressobj(wbits=31)
    got = 0
    try:
        for i in range(0, len(raw), 1 << 16):
            got += len(d.decompress(raw[i:i + (1 << 16)]))
    except zlib.error:
        pass
    return got


@dataclass
class Columns:
    """The kept events (``kind > 0``), in file order, as NumPy columns.

    ``names[name_idx[i]]`` is event ``i``'s name (-1: none). Numbers are exact integer ns
    (``ts``, ``dur``: microsecond text x 1000) or integers (``stream``, ``device``,
    ``correlation``, ``flops``), each with a validity mask (absent, ``null`` or not a number:
    invalid; never zero); the integer args are read only for the kinds of event an analysis
    reads them for (``_INT_ARGS``) and invalid on the others. ``ts_frac``: the timestamp had
    a fractional part. ``unknown_cats`` counts the events whose category the selector's
    table does not know, by category.
    """

    n_events: int
    kind: np.ndarray
    cat: np.ndarray
    name_idx: np.ndarray
    names: list[str]
    ts_ns: np.ndarray
    ts_ok: np.ndarray
    ts_frac: np.ndarray
    dur_ns: np.ndarray
    dur_ok: np.ndarray
    stream: np.ndarray
    stream_ok: np.ndarray
    device: np.ndarray
    device_ok: np.ndarray
    correlation: np.ndarray
    correlation_ok: np.ndarray
    flops: np.ndarray
    flops_ok: np.ndarray
    #: the FLOP count was computed from the operator's input shapes (no ``args.flops``)
    flops_derived: np.ndarray
    unknown_cats: Counter[str]


_TS_DUR = attrgetter("ts", "dur")
#: the integer args and the kinds of event (see the selector) they are read for: stream
#: and device of GPU events, the correlation of GPU events and launches, the FLOPs of CPU
#: operators; elsewhere they are left invalid
_INT_ARGS = (("stream", (1,)), ("device", (1,)), ("correlation", (1, 2)), ("flops", (5,)))
_NUMERIC = ("ts_ns", "ts_ok", "ts_frac", "dur_ns", "dur_ok", "stream", "stream_ok", "device",
            "device_ok", "correlation", "correlation_ok", "flops", "flops_ok", "flops_derived")


class _Accumulator:
    """Columns of the kept events, one slice at a time (the slices' structs are not kept)."""

    def __init__(self, cats: tuple[str, ...], select: Selector) -> None:
        self.cats = cats
        self.cat_code: dict[str | None, int] = {c: i for i, c in enumerate(cats)}
        self.cat_code[None] = -2
        self.select = select
        self.name_code: dict[str | None, int] = {}
        self.parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("kind", "cat", "name_idx", *_NUMERIC)}
        self.unknown: Counter[str] = Counter()
        self.n_events = 0

    def add(self, evs: list[_Event]) -> None:
        n = len(evs)
        self.n_events += n
        if not n:
            return
        is_x = np.fromiter(map(eq, map(attrgetter("ph"), evs), repeat("X")), bool, n)
        code = np.fromiter(map(self.cat_code.get, map(attrgetter("cat"), evs), repeat(-1)),
                           np.int16, n)
        unknown = code == -1
        if unknown.any():
            self.unknown.update(map(attrgetter("cat"), compress(evs, unknown)))
        code[code == -2] = -1

        def names_of(mask: np.ndarray) -> list[str]:
            return list(map(_NO_NAME.get, map(attrgetter("name"), compress(evs, mask)),
                            map(attrgetter("name"), compress(evs, mask))))

        def has_flops(mask: np.ndarray) -> np.ndarray:
            sel = list(compress(evs, mask))
            got = np.fromiter(map(len, map(attrgetter("args.flops"), sel)), I64, len(sel)) > 0
            if got.all():
                return got
            # no args.flops (torch 2.x exports): operators with input shapes and a formula
            lack = np.flatnonzero(~got)
            some = sel if lack.size == len(sel) else map(sel.__getitem__, lack)
            dims = np.fromiter(map(len, map(attrgetter("args.input_dims"), some)), I64,
                               lack.size) > 0
            at = lack[dims]
            if at.size:
                names = map(attrgetter("name"), map(sel.__getitem__, at))
                got[at[np.fromiter(map(FORMULA_OPS.__contains__, names), bool, at.size)]] = True
            return got

        kind = self.select(is_x, code, names_of, has_flops)
        keep = kind > 0
        kept = list(compress(evs, keep))
        kept_kind = kind[keep]
        p = self.parts
        p["kind"].append(kept_kind)
        p["cat"].append(code[keep])
        p["name_idx"].append(self._intern(list(map(attrgetter("name"), kept))))
        # ts and dur read in one call, interleaved (each column a strided view of its result)
        ns, ok, frac = parse_raw(list(chain.from_iterable(map(_TS_DUR, kept))))
        for i, key in enumerate(("ts", "dur")):
            p[f"{key}_ns"].append(ns[i::2])
            p[f"{key}_ok"].append(ok[i::2])
        p["ts_frac"].append(frac[0::2])
        args = list(map(attrgetter("args"), kept))
        for key, kinds in _INT_ARGS:  # each read only where an analysis reads it
            val = np.zeros(len(kept), I64)
            ok = np.zeros(len(kept), bool)
            rows = np.isin(kept_kind, kinds)
            if rows.any():
                val[rows], ok[rows] = parse_int_raw(list(map(attrgetter(key),
                                                             compress(args, rows))))
            p[key].append(val)
            p[f"{key}_ok"].append(ok)
        p["flops_derived"].append(
            _derive_flops(kept_kind, kept, args, p["flops"][-1], p["flops_ok"][-1]))

    def state(self) -> _PartState:
        """What this accumulator holds, to be absorbed by another (a part's helper)."""
        return _PartState(self.parts, list(self.name_code), self.unknown, self.n_events)

    def absorb(self, part: _PartState) -> None:
        """Append the next part's columns, as if its events had been added here: its names
        join this table in their first-seen order."""
        table = self.name_code
        code = np.array([table.setdefault(v, len(table)) for v in part.names], np.int32)
        for key, arrays in part.parts.items():
            self.parts[key].extend(code[a] if key == "name_idx" else a for a in arrays)
        self.unknown.update(part.unknown)
        self.n_events += part.n_events

    def _intern(self, values: list[str | None]) -> np.ndarray:
        table = self.name_code
        for v in dict.fromkeys(values):  # distinct names of the slice, first seen first
            table.setdefault(v, len(table))
        return np.fromiter(map(table.__getitem__, values), np.int32, len(values))

    def finish(self) -> Columns:
        out = {k: np.concatenate(v) if v else np.zeros(0, _DTYPES.get(k, I64))
               for k, v in self.parts.items()}
        names = [n if n is not None else "" for n in self.name_code]
        if None in self.name_code:
            idx = out["name_idx"]
            idx[idx == self.name_code[None]] = -1
        return Columns(n_events=self.n_events, names=names, unknown_cats=self.unknown, **out)


@dataclass
class _PartState:
    """An accumulator's columns so far and its names in code order."""

    parts: dict[str, list[np.ndarray]]
    names: list[str | None]
    unknown: Counter[str]
    n_events: int


def _derive_flops(kind: np.ndarray, kept: list[_Event], args: list[_Args],
                  flops: np.ndarray, flops_ok: np.ndarray) -> np.ndarray:
    """Fill in (in place) the FLOP count of each kept operator without ``args.flops`` from its
    input shapes (:func:`gpuaudit.traces.op_flops.op_flops`); which ones were derived. An
    ``args.flops`` present but unreadable is left invalid (dropped with a note), never
    replaced by a derived count."""
    derived = np.zeros(kind.size, dtype=bool)
    for i in np.flatnonzero((kind == 5) & ~flops_ok):
        a = args[i]
        if len(a.flops):
            continue
        f = op_flops(kept[i].name or "", bytes(a.input_dims), bytes(a.concrete_inputs))
        if f is not None:
            flops[i], flops_ok[i], derived[i] = f, True, True
    return derived


_DTYPES = {"kind": np.int8, "cat": np.int16, "name_idx": np.int32, "ts_ok": bool,
           "ts_frac": bool, "dur_ok": bool, "stream_ok": bool, "device_ok": bool,
           "correlation_ok": bool, "flops_ok": bool, "flops_derived": bool}


def decode(data: bytes | bytearray, path: Path, cats: tuple[str, ...], select: Selector,
           slice_bytes: int | None = None, *, events: EventsDecoder | None = None
           ) -> tuple[dict[str, Any], Columns]:
    """Validate ``data``, decode its header/tail keys (``meta``) and the kept events' columns.

    The events array found from the document's ends (:func:`locate_events`) is decoded
    directly, which validates the document (step 1 of the module docstring); where it is not
    found so, or that fails, the document is validated whole first and then decoded, so an
    error is named as it always was.

    ``cats`` is the table of known categories (``Columns.cat`` indexes it); ``select`` says
    per event which kind it is (0: not kept). ``slice_bytes``: default :data:`SLICE_BYTES`.
    ``events``: how the events array is decoded into the accumulator (default: in one pass
    here; :func:`gpuaudit.traces._kineto_parts.decode_events` decodes a large one in parts,
    with the same columns).
    """
    found = locate_events(lambda pos, n: bytes(memoryview(data)[pos:pos + n]), len(data),
                          PROBE_BYTES)
    if found is not None:  # no pass over the whole document: its events prove themselves
        meta, lo, end = found
        try:
            return meta, _columns(memoryview(data)[lo - 1:end + 1], data, path, cats, select,
                                  slice_bytes, events)
        except (NotABoundary, InputError, msgspec.DecodeError, RecursionError):
            pass  # validated whole below, which names what is wrong as it always has
    if _NON_WS.search(data) is None:
        raise _bad(path, 0, "the file is empty")
    try:
        top = _TOP_DECODER.decode(data)
    except RecursionError as exc:
        raise _bad(path, 0, "JSON nested too deep to be a trace (Kineto events are flat "
                   "objects)") from exc
    except msgspec.ValidationError as exc:
        first = _NON_WS.search(data)
        if first is not None and first.group() == b"[":
            raise _bad(path, 0, "a bare JSON array; expected an object with a "
                       "'traceEvents' key") from exc
        raise _bad(path, 0, "the document is not a JSON object") from exc
    except msgspec.DecodeError as exc:
        raise _invalid_json(path, exc, len(data)) from exc
    raw_events = top.pop("traceEvents", None)
    if raw_events is None:
        raise _bad(path, 0, "no 'traceEvents' array found")
    meta = {k: msgspec.json.decode(v) for k, v in top.items()}
    del top
    arr = memoryview(raw_events)  # a view into ``data``: no copy
    if not len(arr) or arr[0] != 0x5B:  # "["
        raise _bad(path, max(data.find(b'"traceEvents"'), 0), "'traceEvents' is not an array")
    return meta, _columns(arr, data, path, cats, select, slice_bytes, events)


def _columns(arr: memoryview, data: bytes | bytearray, path: Path, cats: tuple[str, ...],
             select: Selector, slice_bytes: int | None, events: EventsDecoder | None
             ) -> Columns:
    """The kept events' columns of the events array ``arr`` (a view into ``data``, its
    brackets included: the elements are ``arr[1:len(arr) - 1]``), walked by ``events``."""
    acc = _Accumulator(cats, select)
    (events or _one_pass)(arr, len(arr) - 1, path, acc, slice_bytes or SLICE_BYTES,
                          _Frame(data, arr))
    return acc.finish()


#: bytes of a document's head and tail in which its events array's ends are looked for
PROBE_BYTES = 1 << 20


def locate_events(read_at: Callable[[int, int], bytes], size: int, probe_bytes: int
                  ) -> tuple[dict[str, Any], int, int] | None:
    """A document's header and tail keys and its events array's elements' span ``(lo, end)``
    (from the byte after its ``[`` to its ``]``), found in its first and last
    ``probe_bytes`` (``read_at(pos, n)``: at most ``n`` bytes from ``pos``) and proven by
    :func:`meta_around`; None where not found (gzip, a header or tail larger than that, no
    events, not a trace). The elements are not read: decoding them proves them."""
    head = read_at(0, min(size, probe_bytes))
    m = _EVENTS_OPEN.search(head) if head[:2] != _GZIP_MAGIC else None
    if m is None:
        return None
    open_at = m.end() - 1
    tail_at = max(open_at + 1, size - probe_bytes)
    tail = read_at(tail_at, size - tail_at)
    # the array's last element ends it: candidates from the end backwards (the last is the
    # one, but in a document with an array of objects after its events, which no Kineto
    # trace has: meta_around may accept that one, and then the last slice refutes it)
    for close in list(_EVENTS_CLOSE.finditer(tail))[:-5:-1]:
        meta = meta_around(head[:open_at] + b"[]" + tail[close.end():], open_at)
        if meta is not None:
            return meta, open_at + 1, tail_at + close.end() - 1
    return None


def meta_around(doc: bytes, at: int) -> dict[str, Any] | None:
    """The header and tail keys of ``doc``, a trace document whose events array was replaced
    by ``[]`` at byte ``at``, decoded as :func:`decode` decodes them; None unless ``doc`` is a
    JSON object whose ``traceEvents`` value is that ``[]``.

    Putting any JSON array back in place of the ``[]`` gives a valid document in which that
    array is the ``traceEvents`` value (a JSON value can stand wherever another can), so a
    document is proven valid by this and its events array's parts
    (:func:`gpuaudit.traces._kineto_parts.decode_file`), with no pass over the whole."""
    try:
        top = _TOP_DECODER.decode(doc)
        raw = top.pop("traceEvents", None)
        if raw is None or bytes(raw) != b"[]" or _offset(raw, doc) != at:
            return None
        return {k: msgspec.json.decode(v) for k, v in top.items()}
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None  # decode() names what is wrong, reading the whole document


def _offset(view: Any, buf: Any) -> int:
    """Where the buffer ``view`` lies in ``buf`` (-1 where it does not)."""
    a = np.frombuffer(view, np.uint8).__array_interface__["data"][0]
    b = np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
    off = a - b
    return off if 0 <= off and off + len(view) <= len(buf) else -1


#: (the events array, its closing bracket's index, the path, the accumulator, the slice size,
#: the frame) -> None: decodes the array's elements into the accumulator
EventsDecoder = Callable[[memoryview, int, Path, "_Accumulator", int, "_Frame"], None]


def _one_pass(arr: memoryview, end: int, path: Path, acc: _Accumulator, slice_bytes: int,
              frame: _Frame) -> None:
    decode_part(arr, 1, end, path, acc, slice_bytes, frame)


class NotABoundary(Exception):
    """A part's end (a candidate cut, see :mod:`gpuaudit.traces._kineto_parts`) is not
    just after an element of the array: the part decoded up to ``at`` and no further."""

    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at


def decode_part(arr: memoryview, lo: int, end: int, path: Path, acc: _Accumulator,
                slice_bytes: int, frame: _Frame, done: Callable[[int], None] | None = None
                ) -> None:
    """Decode the elements ``arr[lo:end]`` slice by slice into ``acc``. ``lo`` must start an
    element; ``end`` is the array's end or a candidate cut (:class:`NotABoundary` where the
    slice that ends there does not decode). ``done(lo)``, where given, is told after each
    slice that the bytes before ``lo`` are no longer read."""
    while lo < end:
        evs, lo = _next_slice(arr, lo, end, slice_bytes, path, acc.n_events, frame)
        acc.add(evs)
        del evs
        if done is not None:
            done(lo)


class _Frame:
    """A slice ``arr[lo:hi]`` of the events array as a JSON array of its own, without copying
    it: the byte before ``lo`` (``[``, a comma or white space) becomes ``[`` and the byte at
    ``hi`` (a comma, white space or the closing ``]``) becomes ``]`` in the document itself,
    for the decode only, then both are put back. Where the document is immutable (bytes) or
    the array is not a view into it, the slice is copied between brackets instead."""

    def __init__(self, data: bytes | bytearray, events: memoryview) -> None:
        self.buf: bytearray | mmap.mmap | None = None
        self.base = 0
        if isinstance(data, bytearray) and len(events):
            off = _offset(events, data)
            if off >= 0 and data[off] == 0x5B:
                self.buf, self.base = data, off

    @classmethod
    def over(cls, buf: bytearray | mmap.mmap) -> _Frame:
        """Slices of ``buf``, which holds an events array from its first byte."""
        frame = cls(b"", memoryview(b""))
        frame.buf = buf
        return frame

    def decode(self, dec: msgspec.json.Decoder[Any], arr: memoryview, lo: int,
               hi: int) -> Any:
        buf = self.buf
        if buf is None:
            return dec.decode(b"".join((b"[", arr[lo:hi], b"]")))
        i, j = self.base + lo - 1, self.base + hi
        before, after = buf[i], buf[j]
        buf[i], buf[j] = 0x5B, 0x5D
        try:
            # the decoded events' raw numbers are views into it: the view is not released
            return dec.decode(memoryview(buf)[i:j + 1])
        finally:
            buf[i], buf[j] = before, after

    def text(self, arr: memoryview, lo: int, hi: int) -> bytes:
        """The slice between brackets, as bytes (a copy: the rare invalid UTF-8 path)."""
        return b"".join((b"[", arr[lo:hi], b"]"))


def _next_slice(arr: memoryview, lo: int, end: int, slice_bytes: int, path: Path,
                n_before: int, frame: _Frame | None = None) -> tuple[list[_Event], int]:
    """Decode the events from ``lo`` up to a cut about ``slice_bytes`` on (see the module
    docstring); returns them and where the next slice starts."""
    pos = lo + slice_bytes
    for _ in range(_CUT_TRIES):
        m = _CUT.search(arr, pos, end) if pos < end else None
        cut, nxt = (m.start() + 1, m.end() - 1) if m else (end, end)
        try:
            return _decode_slice(arr, lo, cut, path, n_before, frame), nxt
        except msgspec.DecodeError as exc:
            if cut == end:  # a part's cut inside a string, or an array's end not proven
                raise NotABoundary(lo) from exc  # (damaged JSON): the caller decides
            pos = cut  # the cut was inside a string or a nested object: try the next one
    try:
        return _decode_slice(arr, lo, end, path, n_before, frame), end
    except msgspec.DecodeError as exc:
        raise NotABoundary(lo) from exc


def _decode_slice(arr: memoryview, lo: int, hi: int, path: Path, n_before: int,
                  frame: _Frame | None = None) -> list[_Event]:
    frame = frame or _Frame(b"", memoryview(b""))
    try:
        try:
            return cast(list[_Event], frame.decode(_SLICE_DECODER, arr, lo, hi))
        except UnicodeDecodeError:
            # invalid UTF-8 inside a string: decode it as U+FFFD, as other trace viewers do
            text = frame.text(arr, lo, hi)
            return _SLICE_DECODER.decode(text.decode("utf-8", errors="replace").encode())
    except msgspec.ValidationError as exc:
        m = _INDEX_AT.search(str(exc))
        at = f"traceEvents[{n_before + int(m.group(1))}]" if m else "traceEvents"
        msg = _INDEX_AT.sub("`$", str(exc)).replace("`$", f"`{at}", 1) if m else str(exc)
        raise InputError(
            f"not a valid Kineto/Chrome trace: {msg}",
            where=f"{path}: {at}",
            fix="every trace event is an object whose ph, cat and name are strings and "
            "whose args is an object (Chrome Trace Event Format)",
        ) from exc


def parse_raw(raws: list[msgspec.Raw]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw JSON values (decimal microsecond numbers, or strings holding one) -> exact integer
    ns, valid, had a fraction (see :func:`parse_ns`)."""
    n = len(raws)
    length = np.fromiter(map(len, raws), I64, n)
    got = _milli(raws, length)
    if got is not None:
        return got
    hi = np.cumsum(length)
    lo = hi - length
    buf = b"".join(raws)
    b = np.frombuffer(buf, np.uint8)
    if n and b.size:
        quoted = (length >= 2) & (b[np.minimum(lo, b.size - 1)] == 34)
        lo = lo + quoted
        hi = hi - quoted
    return parse_ns(buf, lo, hi)


def _milli(raws: list[msgspec.Raw], length: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`parse_raw`'s common case in one C text parse, or None where it does not apply.

    Every value is digits with at most one dot and at most three decimals (Kineto's ``%.3f``
    microseconds, integer ids, a JSON writer's shortest floats): the value in ns is then the
    digits without the dot, times 10 ** (3 - decimals), exactly. At most 16 integer digits
    (Unix microseconds have 16), read as uint64, and every value below 2 ** 63 ns; anything
    else takes :func:`parse_ns`'s path."""
    n = length.size
    if not n or int(length.min()) < 1 or int(length.max()) > 20:  # 16 digits . 3
        return None
    text = b",".join(raws)
    b = np.frombuffer(text, np.uint8)
    if not bool(_DIGIT_DOT_COMMA[b].all()):
        return None
    hi = np.cumsum(length + 1) - 1  # one past each value's last byte in ``text``
    dots = np.flatnonzero(b == 46)
    decimals = np.zeros(n, I64)
    frac = np.zeros(n, bool)
    if dots.size:
        owner = np.searchsorted(hi, dots, side="right")
        if owner.size > 1 and bool((owner[1:] == owner[:-1]).any()):
            return None  # two dots in one value
        decimals[owner] = hi[owner] - dots - 1
        frac[owner] = True
    digits = length - frac
    if bool((decimals > 3).any() | (digits < 1).any() | (digits - decimals > 16).any()):
        return None
    u = np.fromstring(text.replace(b".", b""), dtype=np.uint64, sep=",")  # < 10 ** 19
    if u.size != n:
        return None
    u *= _POW10_U64[3 - decimals]  # < 10 ** 19 < 2 ** 64
    if int(u.max()) >= 1 << 63:
        return None
    return u.astype(I64), np.ones(n, bool), frac


def parse_int_raw(raws: list[msgspec.Raw]) -> tuple[np.ndarray, np.ndarray]:
    """Raw JSON integers (or integral decimals such as ``7.0``) -> (int64, valid).

    The common case, every value present a plain run of at most 15 digits (a stream,
    device or correlation id), is read by NumPy's C text parser in one call; anything else
    (absent values aside) takes :func:`parse_raw`'s exact decimal path."""
    n = len(raws)
    length = np.fromiter(map(len, raws), I64, n)
    present = length > 0
    if n and 0 < int(length.max()) <= _INT_DIGITS:
        some = present.all()
        text = b",".join(raws if some else compress(raws, present))
        c = np.frombuffer(text, np.uint8)
        if bool(((c - 48 <= 9) | (c == 44)).all()):  # digits and commas only
            got = np.fromstring(text, dtype=I64, sep=",")
            if got.size == int(present.sum()):
                vals = np.zeros(n, dtype=I64)
                vals[present] = got
                return vals, present
    ns, valid, _ = parse_raw(raws)
    valid &= ns % 1000 == 0
    return ns // 1000, valid


_INT_DIGITS = 15  # x 1000 (parse_raw's ns) still fits in int64: the two paths agree


def parse_ns(data: bytes, lo: np.ndarray, hi: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decimal microsecond text ``data[lo:hi]`` -> (integer ns, valid, had a fraction), exactly.

    The spans are in increasing order and do not overlap (as :func:`parse_raw` lays them out).

    ``123.4567`` -> 123457 ns (half up on the fourth decimal, away from zero). Plain numbers
    (optional ``-``, up to 16 integer digits, optional fraction) are decoded in NumPy: byte
    classes counted per value by one cumulative sum, each value's dot found, then its integer
    digits read from a window that ends at the dot and its first four decimals from one that
    starts there. Exponents and longer numbers take the exact :class:`decimal.Decimal` path;
    anything else (``null``, text, empty) is invalid.
    """
    b = np.frombuffer(data, np.uint8)
    n = lo.size
    lo = lo.astype(I64, copy=False)
    hi = hi.astype(I64, copy=False)
    ns = np.zeros(n, dtype=I64)
    valid = np.zeros(n, dtype=bool)
    frac = np.zeros(n, dtype=bool)
    if n == 0 or b.size == 0:
        return ns, valid, frac
    length = hi - lo
    dotpos = hi.copy()
    dots = np.flatnonzero(b == 46)
    owner = np.zeros(0, dtype=I64)
    if dots.size:
        owner = np.searchsorted(hi, dots, side="right")
        inside = owner < n
        owner, dots = owner[inside], dots[inside]
        inside = dots >= lo[owner]
        owner, dots = owner[inside], dots[inside]
        dotpos[owner] = dots
    if bool(_DIGIT_OR_DOT[b].all()):
        # the common case (Kineto's %.3f microseconds, integer ids): digits and dots only,
        # so only the dots need counting per value, not every byte's class
        zero = np.zeros(n, dtype=I64)
        n_bad = n_exp = n_minus = zero
        n_dot = np.bincount(owner, minlength=n).astype(I64) if owner.size else zero
        neg = np.zeros(n, dtype=bool)
    else:
        cs = np.zeros(b.size + 1, dtype=I64)
        np.cumsum(_CLASS_WEIGHT[b], out=cs[1:])
        counts = cs[hi] - cs[lo]
        n_bad, n_exp = counts >> 30, (counts >> 20) & 1023
        n_dot, n_minus = (counts >> 10) & 1023, counts & 1023
        neg = (length > 0) & (b[np.minimum(lo, b.size - 1)] == 45)
    nint = dotpos - lo - neg
    plain = (length > 0) & (length <= 1023) & (n_bad == 0) & (n_exp == 0) & (n_dot <= 1) & (
        n_minus == neg)
    fast = plain & (nint >= 1) & (nint <= 16)
    # integer digits: the 16 bytes before the dot (the buffer padded in front), masked to the
    # value's own digits; first four decimals: the 4 bytes after it, masked to the value
    pad = np.concatenate([np.zeros(16, np.uint8), b, np.zeros(32, np.uint8)])
    win = sliding_window_view(pad, 16)
    for i in range(0, n, _NUM_ROWS):
        sl = slice(i, i + _NUM_ROWS)
        dp, ni = dotpos[sl], np.clip(nint[sl], 0, 16)
        d = win[dp].astype(I64) - 48  # pad offset 16: window [dp - 16, dp)
        d[_COL16 < (16 - ni)[:, None]] = 0
        ip = d @ _POW16
        f = win[dp + 17][:, :4].astype(I64) - 48  # [dp + 1, dp + 5)
        f[_COL16[:4] >= (hi[sl] - dp - 1)[:, None]] = 0
        fp = f[:, :3] @ _POW3
        fast[sl] &= ip < 9_000_000_000_000_000  # ip * 1000 + 999 fits in int64
        v = np.where(fast[sl], ip, 0) * 1000 + fp + (f[:, 3] >= 5)
        ns[sl] = np.where(neg[sl], -v, v)
    valid[:] = fast
    frac[:] = n_dot == 1
    slow = np.flatnonzero(~fast & (length > 0) & ((length > 1023) | (n_bad == 0)))
    if slow.size:
        _parse_slow(data, lo, hi, slow.tolist(), ns, valid, frac)
    ns[~valid] = 0
    return ns, valid, frac


_CLASS_WEIGHT = np.full(256, 1 << 30, dtype=I64)  # per byte: other (bits 30+), exponent
_CLASS_WEIGHT[list(b"0123456789")] = 0  # (20-29), dot (10-19), minus (0-9)
_CLASS_WEIGHT[list(b"eE+")] = 1 << 20
_CLASS_WEIGHT[ord(".")] = 1 << 10
_CLASS_WEIGHT[ord("-")] = 1
_DIGIT_OR_DOT = np.zeros(256, dtype=bool)
_DIGIT_OR_DOT[list(b"0123456789.")] = True
_DIGIT_DOT_COMMA = _DIGIT_OR_DOT.copy()
_DIGIT_DOT_COMMA[ord(",")] = True
_POW10_U64 = _POW10[:4].astype(np.uint64)
_COL16 = np.arange(16, dtype=I64)
_POW16 = _POW10[15::-1].copy()
_POW3 = np.array([100, 10, 1], dtype=I64)


def _parse_slow(data: bytes, lo: np.ndarray, hi: np.ndarray, rows: list[int], ns: np.ndarray,
                valid: np.ndarray, frac: np.ndarray) -> None:
    """Exponents, long numbers and anything odd, one by one with :class:`decimal.Decimal`."""
    from decimal import Decimal, InvalidOperation

    for j in rows:
        text = data[int(lo[j]):int(hi[j])]
        valid[j] = False
        try:
            x = Decimal(text.decode("ascii")) * 1000
            if not x.is_finite() or text.strip() != text or b"_" in text:
                raise InvalidOperation
            v = int(x.to_integral_value(rounding="ROUND_HALF_UP"))
            if -(2 ** 63) <= v < 2 ** 63:
                ns[j] = v
                valid[j] = True
                frac[j] = b"." in text or b"e" in text.lower()
        except (InvalidOperation, UnicodeDecodeError, ValueError, OverflowError):
            pass
