"""A structural JSON scanner for Chrome/Kineto traces in NumPy: no Python object per event.

A Kineto trace (``torch.profiler`` ``export_chrome_trace`` / ``tensorboard_trace_handler``) is
one JSON object: a small header (``schemaVersion``, ``deviceProperties``,
``distributedInfo``), the huge ``traceEvents`` array, a small tail (``baseTimeNanoseconds``,
``traceName``). Parsing every event into a dict is what makes other tools slow and large
(``json.loads`` of a 54 MB trace: ~0.9 s, 377 MB). Instead, like simdjson's first stage, this
module indexes the document with vectorised passes over its bytes:

1. real quotes (``"`` not escaped by an odd run of backslashes) delimit strings;
2. structural bytes ``{ } [ ] : ,`` outside strings, with their nesting depth (a cumulative
   sum), checked for balance, matching bracket types and JSON's grammar (what may stand
   between two structural bytes: nothing, one string or one scalar), so damaged input is an
   error with a byte offset, never silently skipped;
3. the keys an analysis needs (event ``ph``, ``cat``, ``name``, ``ts``, ``dur``; ``args.stream``,
   ``args.correlation``, ``args.device``) located by their position and nesting, and their
   values decoded column-wise: numbers as exact decimal text (microseconds -> integer ns,
   no float rounding, HTA issue #317), strings as byte spans.

Only event names that are kept (GPU events, runtime launches, step/DataLoader spans) become
Python strings, one per distinct name. The header and tail (a few kB) go through :mod:`json`.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gpuaudit.errors import InputError

__all__ = ["Doc", "Scan", "read_document", "scan"]

I64 = np.int64
_IDX = np.int32  # byte offsets: documents up to 2 GiB
_BLOCK = 1 << 22  # bytes per vectorised pass: bounds the temporaries
_ROWS = 1 << 14
_NUM_ROWS = 1 << 12  # numbers per decode step (a few 2-D int64 temporaries)
_TOKENS = 1 << 18  # structural bytes per grammar-check chunk  # values per 2-D gather
_GZIP_MAGIC = b"\x1f\x8b"
_W = 24  # widest number decoded in NumPy; longer ones take the exact Decimal path
_WIDTHS = (8, 64)  # gather widths for whitespace runs and scalars; longer: a slow path
_COLS = np.arange(64, dtype=I64)

_STRUCT = np.zeros(256, dtype=bool)
_STRUCT[list(b"{}[]:,")] = True
_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[list(b"{[")] = 1
_DELTA[list(b"}]")] = -1
_WS = np.zeros(256, dtype=bool)
_WS[list(b" \t\r\n")] = True
_SCALAR = np.zeros(256, dtype=bool)
_SCALAR[list(b"0123456789+-.eE")] = True
_POW10 = np.array([10 ** i for i in range(19)], dtype=I64)
_LITERALS = (b"true", b"false", b"null")
_NOT_JSON = np.ones(256, dtype=bool)  # bytes that may not stand outside a string
_NOT_JSON[list(b' \t\r\n{}[]:,"0123456789+-.eEtruefalsn')] = False


def _bad(path: Path, offset: int, what: str) -> InputError:
    return InputError(
        f"not a valid Kineto/Chrome trace: {what}",
        where=f"{path}: byte {offset}",
        fix="give a trace written by torch.profiler (export_chrome_trace or "
        "tensorboard_trace_handler), plain .json or .json.gz",
    )


def _invalid_json(path: Path, doc: bytes, offset: int, what: str) -> InputError:
    """The error for damaged JSON; :func:`json.loads` pins the offset (error path only)."""
    pos, msg = offset, what
    if len(doc) <= (1 << 30):
        try:
            json.loads(doc)
        except json.JSONDecodeError as exc:
            pos, msg = exc.pos, exc.msg
        except (UnicodeDecodeError, RecursionError):
            pass
    return InputError(
        f"invalid JSON in traceEvents: {msg}",
        where=f"{path}: byte {pos}",
        fix="the trace file is damaged (cut short or edited); write it again with "
        "torch.profiler",
    )


def read_document(path: Path) -> tuple[bytes, bool]:
    """The decompressed document and whether it was gzip (magic bytes, not the suffix).

    A truncated or corrupt gzip stream is an :class:`InputError` naming the decompressed
    byte offset where it failed.
    """
    raw = path.read_bytes()
    if raw[:2] != _GZIP_MAGIC:
        return raw, False
    isize = int.from_bytes(raw[-4:], "little") if len(raw) >= 4 else 0
    try:
        # one allocation of the size the gzip trailer states (gzip.decompress grows its
        # buffer and peaks at ~3x the document)
        out = zlib.decompress(raw, 31, max(isize, 1 << 16))
        if len(out) % (1 << 32) != isize:  # several gzip members: decode them all
            out = gzip.decompress(raw)
        return out, True
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


def _decompressed_before_failure(raw: bytes) -> int:
    d = zlib.decompressobj(wbits=31)
    got = 0
    try:
        for i in range(0, len(raw), 1 << 16):
            got += len(d.decompress(raw[i:i + (1 << 16)]))
    except zlib.error:
        pass
    return got


@dataclass
class Doc:
    """The structural index of one document: real quotes ``q`` (pairs open/close), structural
    byte positions ``s``, their bytes ``c``, depth after each (``depth``) and, per structural
    byte, the number of real quotes before it (``kq``)."""

    data: bytes
    b: np.ndarray
    q: np.ndarray
    s: np.ndarray
    c: np.ndarray
    depth: np.ndarray
    kq: np.ndarray


def _quotes(b: np.ndarray, path: Path, data: bytes) -> np.ndarray:
    parts = [(np.flatnonzero(b[lo:lo + _BLOCK] == 34) + lo).astype(_IDX)
             for lo in range(0, b.size, _BLOCK)]
    q = np.concatenate(parts) if parts else np.zeros(0, _IDX)
    del parts
    cand = q[(q > 0)]
    cand = cand[b[cand - 1] == 92]
    if cand.size:  # a quote after backslashes is escaped when the run is odd
        escaped = np.zeros(q.size, dtype=bool)
        where = np.searchsorted(q, cand)
        for pos, k in zip(cand.tolist(), where.tolist()):
            run = 0
            while pos - run - 1 >= 0 and data[pos - run - 1] == 92:
                run += 1
            escaped[k] = run % 2 == 1
        q = q[~escaped]
    if q.size % 2:
        raise _invalid_json(path, data, int(q[-1]), "unterminated string")
    return q


def index(data: bytes, path: Path) -> Doc:
    """Quotes, structural bytes outside strings, depths; bracket balance and types checked."""
    b = np.frombuffer(data, dtype=np.uint8)
    if b.size >= 2**31 - 1:
        raise InputError("the trace is larger than 2 GiB decompressed", where=str(path),
                         fix="profile fewer steps (torch.profiler schedule active=...)")
    q = _quotes(b, path, data)
    s_parts, k_parts = [], []
    for lo in range(0, b.size, _BLOCK):
        pos = np.flatnonzero(_STRUCT[b[lo:lo + _BLOCK]]) + lo
        k = np.searchsorted(q, pos)
        out = (k & 1) == 0
        s_parts.append(pos[out].astype(_IDX))
        k_parts.append(k[out].astype(_IDX))
    s = np.concatenate(s_parts) if s_parts else np.zeros(0, I64)
    kq = np.concatenate(k_parts) if k_parts else np.zeros(0, I64)
    _check_charset(b, q, path, data)
    c = b[s]
    depth = np.cumsum(_DELTA[c], dtype=np.int32)
    if s.size == 0:
        if not data.strip():
            raise _bad(path, 0, "the file is empty")
        raise _bad(path, 0, "no 'traceEvents' array found")
    if depth.min() < 0:
        at = int(s[int(np.argmax(depth < 0))])
        raise _invalid_json(path, data, at, "a closing bracket without an opening one")
    if depth[-1] != 0:
        raise _invalid_json(path, data, len(data), "the document ends inside an object or "
                            "array (cut short?)")
    _check_pairs(c, depth, s, path, data)
    return Doc(data, b, q, s, c, depth, kq)


def _check_charset(b: np.ndarray, q: np.ndarray, path: Path, data: bytes) -> None:
    """Outside strings a JSON document holds only whitespace, structural bytes and the
    letters of numbers and true/false/null; one reduction per stretch between strings."""
    bounds = np.empty(q.size + 1, dtype=_IDX)
    bounds[0] = 0
    bounds[1::2] = q[0::2]
    bounds[2::2] = q[1::2] + 1
    bounds = bounds[bounds < b.size]
    bad = np.zeros(bounds.size, dtype=bool)
    for lo in range(0, b.size, _BLOCK):
        hi = min(lo + _BLOCK, b.size)
        i0, i1 = np.searchsorted(bounds, [lo, hi])
        idx = np.concatenate([[0], bounds[i0:i1].astype(np.intp) - lo])
        r = np.logical_or.reduceat(_NOT_JSON[b[lo:hi]], idx)
        # r[0] covers [lo, first bound): it belongs to the segment open at lo
        seg = np.arange(i0 - 1, i1)
        outside = (seg % 2 == 0) & (seg >= 0)
        bad[seg[outside & r]] = True
    if bad.any():
        i = int(np.argmax(bad))
        seg_lo = int(bounds[i])
        seg_hi = int(bounds[i + 1]) if i + 1 < bounds.size else b.size
        off = seg_lo + int(np.argmax(_NOT_JSON[b[seg_lo:seg_hi]]))
        raise _invalid_json(path, data, off, f"unexpected byte {data[off:off + 1]!r}")


def _check_pairs(c: np.ndarray, depth: np.ndarray, s: np.ndarray, path: Path,
                 data: bytes) -> None:
    """Each ``}``/``]`` closes an opening bracket of its own kind."""
    d = _DELTA[c]
    opens = np.flatnonzero(d > 0)
    closes = np.flatnonzero(d < 0)
    level = np.concatenate([depth[opens], depth[closes] + 1])
    idx = np.concatenate([opens, closes])
    order = np.lexsort((idx, level))
    idx = idx[order]
    pair_open, pair_close = idx[0::2], idx[1::2]
    ok = (_DELTA[c[pair_open]] > 0) & (_DELTA[c[pair_close]] < 0)
    ok &= ((c[pair_open] == 123) & (c[pair_close] == 125)) | (
        (c[pair_open] == 91) & (c[pair_close] == 93))
    if not ok.all():
        at = int(s[pair_close[int(np.argmin(ok))]])
        raise _invalid_json(path, data, at, "mismatched brackets")


def _gather(b: np.ndarray, start: np.ndarray, width: int) -> np.ndarray:
    """Rows of ``width`` bytes from each start (past the end reads as 0): row copies from a
    sliding-window view, no index matrix."""
    if b.size < width:
        out = np.zeros((start.size, width), dtype=np.uint8)
        for i, st in enumerate(start.tolist()):
            tail = b[st:st + width]
            out[i, :tail.size] = tail
        return out
    lim = b.size - width
    rows = sliding_window_view(b, width)[np.minimum(start, lim)]
    for i in np.flatnonzero(start > lim).tolist():
        rows[i] = 0
        tail = b[int(start[i]):]
        rows[i, :tail.size] = tail
    return np.asarray(rows)


def _ws_run(doc: Doc, start: np.ndarray, limit: np.ndarray, backward: bool) -> np.ndarray:
    """Length of the whitespace run from ``start`` (forward) or ending just before ``start``
    (backward), at most ``limit``. One vectorised step per byte of run length, on the rows
    still running (JSON gaps are short: a space, a newline and indentation)."""
    run = np.zeros(start.size, dtype=I64)
    active = np.flatnonzero(limit > 0)
    steps = 0
    while active.size and steps < 64:
        pos = start[active] - run[active] - 1 if backward else start[active] + run[active]
        active = active[_WS[doc.b[pos]]]
        run[active] += 1
        active = active[run[active] < limit[active]]
        steps += 1
    for j in active.tolist():
        a, z = int(start[j]), int(limit[j])
        seg = doc.data[a - z:a] if backward else doc.data[a:a + z]
        strip = seg.rstrip(b" \t\r\n") if backward else seg.lstrip(b" \t\r\n")
        run[j] = len(seg) - len(strip)
    return run


def _all_ws(doc: Doc, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether every byte in each [lo, hi) is JSON whitespace."""
    n = np.maximum(hi - lo, 0)
    return np.asarray(_ws_run(doc, lo, n, backward=False) == n)


def _trim(doc: Doc, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) without leading and trailing whitespace."""
    lo = lo + _ws_run(doc, lo, hi - lo, backward=False)
    hi = hi - _ws_run(doc, hi, hi - lo, backward=True)
    return lo, hi


def check_grammar(doc: Doc, path: Path) -> None:
    """JSON's grammar on the structural index: what may stand between two structural bytes.

    Between consecutive structural bytes there is whitespace (E), one string (S) or one
    scalar (V: number, true, false, null). Allowed: ``{`` S ``:`` / ``{`` E ``}``; ``:`` then
    a value; ``,`` in an object then S ``:``; ``[`` or ``,`` in an array then a value; after
    ``}``/``]`` only E. A value is S or V before ``,``/closing, or E before ``{``/``[``.
    """
    s, c, kq, q = doc.s, doc.c, doc.kq, doc.q
    n = s.size
    # before the first and after the last structural byte: whitespace only
    if c[0] == 91:
        raise _bad(path, int(s[0]), "a bare JSON array; expected an object with a "
                   "'traceEvents' key")
    if kq[0] != 0 or c[0] != 123 or not _all_ws(doc, np.array([0]), s[:1])[0]:
        raise _bad(path, 0, "the document is not a JSON object")
    if kq[-1] != q.size or not _all_ws(doc, s[-1:] + 1, np.array([doc.b.size]))[0]:
        raise _invalid_json(path, doc.data, int(s[-1]) + 1, "text after the document")
    opens = np.flatnonzero(_DELTA[c] > 0)
    for t0 in range(0, n - 1, _TOKENS):
        _check_gaps(doc, path, t0, min(t0 + _TOKENS, n - 1), opens)


def _check_gaps(doc: Doc, path: Path, t0: int, t1: int, opens: np.ndarray) -> None:
    """The grammar for the gaps after structural bytes t0..t1-1 (see :func:`check_grammar`)."""
    s, c, kq, q = doc.s, doc.c, doc.kq, doc.q
    prev, nxt = c[t0:t1], c[t0 + 1:t1 + 1]
    nstr = (kq[t0 + 1:t1 + 1] - kq[t0:t1]) // 2
    lo, hi = s[t0:t1].astype(I64) + 1, s[t0 + 1:t1 + 1].astype(I64)
    kind = np.zeros(t1 - t0, dtype=np.int8)  # 0 E, 1 S, 2 V, 3 bad
    kind[nstr > 1] = 3
    one = np.flatnonzero(nstr == 1)
    k1 = kq[t0:t1][one].astype(I64)
    qo, qc = q[k1].astype(I64), q[k1 + 1].astype(I64)
    ws_ok = _all_ws(doc, lo[one], qo) & _all_ws(doc, qc + 1, hi[one])
    kind[one] = np.where(ws_ok, 1, 3)
    zero = np.flatnonzero(nstr == 0)
    # no string: whitespace (E) or a scalar (V); the charset check already allowed only
    # number letters and true/false/null outside strings
    kind[zero[~_all_ws(doc, lo[zero], hi[zero])]] = 2
    is_val_end = (nxt == 44) | (nxt == 125) | (nxt == 93)
    is_open = (nxt == 123) | (nxt == 91)
    value = ((kind == 1) | (kind == 2)) & is_val_end | (kind == 0) & is_open
    key = (kind == 1) & (nxt == 58)
    ok = (prev == 123) & (key | (kind == 0) & (nxt == 125))
    ok |= (prev == 91) & (value | (kind == 0) & (nxt == 93))
    ok |= (prev == 58) & value
    comma = np.flatnonzero(prev == 44)
    in_obj = _in_object(doc, comma + t0, opens)
    ok[comma] |= np.where(in_obj, key[comma], value[comma])
    ok |= ((prev == 125) | (prev == 93)) & (kind == 0) & is_val_end
    if not ok.all():
        i = int(np.argmin(ok))
        raise _invalid_json(path, doc.data, int(s[t0 + i]) + 1, "unexpected content")


def _scalar_ok(doc: Doc, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether each trimmed [lo, hi) is a number-like token or true/false/null."""
    n = hi - lo
    ok = np.zeros(lo.size, dtype=bool)
    done = np.zeros(lo.size, dtype=bool)
    for width in (_W, 64):
        todo = np.flatnonzero(~done & (n <= width))
        for i in range(0, todo.size, _ROWS):
            sel = todo[i:i + _ROWS]
            rows = _gather(doc.b, lo[sel], width)
            inside = _COLS[:width] < n[sel, None]
            num = (_SCALAR[rows] | ~inside).all(axis=1)
            for word in _LITERALS:
                w = np.frombuffer(word, np.uint8)
                num |= (n[sel] == w.size) & (rows[:, :w.size] == w).all(axis=1)
            ok[sel] = num
        done[todo] = True
    return ok


def _in_object(doc: Doc, tok: np.ndarray, opens: np.ndarray) -> np.ndarray:
    """For structural bytes ``tok``: whether the innermost container they sit in is an
    object (the last opening bracket before them at their depth)."""
    c, depth = doc.c, doc.depth
    before = depth[tok] - _DELTA[c[tok]]
    out = np.zeros(tok.size, dtype=bool)
    od = depth[opens]
    for lvl in np.unique(before).tolist():
        if lvl <= 0:
            continue
        mine = np.flatnonzero(before == lvl)
        op = opens[od == lvl]
        k = np.searchsorted(op, tok[mine]) - 1
        good = k >= 0
        out[mine[good]] = c[op[k[good]]] == 123
    return out


@dataclass
class Scan:
    """Per event of the ``traceEvents`` array: byte spans of ``ph``, ``cat``, ``name`` values
    (string content; -1 where absent or not a string) and of ``ts``, ``dur``,
    ``args.stream``, ``args.correlation``, ``args.device`` (scalar text, or a string's
    content), plus the header/tail keys in ``meta`` and the array's byte offset."""

    doc: Doc
    meta: dict[str, Any]
    array_offset: int
    n_events: int
    spans: dict[str, tuple[np.ndarray, np.ndarray]]
    is_str: dict[str, np.ndarray]


_EVENT_KEYS = ("ph", "cat", "name", "ts", "dur", "args")
_ARG_KEYS = ("stream", "correlation", "device")


def _key_is(doc: Doc, ko: np.ndarray, kc: np.ndarray, word: str) -> np.ndarray:
    w = np.frombuffer(word.encode(), np.uint8)
    m = (kc - ko - 1) == w.size
    sel = np.flatnonzero(m)
    if sel.size:
        rows = _gather(doc.b, ko[sel] + 1, w.size)
        m[sel] = (rows == w).all(axis=1)
    return np.asarray(m)


def _values(doc: Doc, ci: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For colons at structural index ``ci``: value span [lo, hi) and whether it is a string
    (span = content). Containers get lo = hi = -1."""
    s, kq, q = doc.s, doc.kq, doc.q
    has_str = (kq[ci + 1] - kq[ci]) == 2
    lo = np.full(ci.size, -1, dtype=I64)
    hi = np.full(ci.size, -1, dtype=I64)
    st = np.flatnonzero(has_str)
    lo[st] = q[kq[ci[st]]] + 1
    hi[st] = q[kq[ci[st]] + 1]
    nxt = doc.c[ci + 1]
    sc = np.flatnonzero(~has_str & (nxt != 123) & (nxt != 91))
    tlo, thi = _trim(doc, s[ci[sc]] + 1, s[ci[sc] + 1])
    lo[sc], hi[sc] = tlo, thi
    return lo, hi, has_str


def _column(doc: Doc, n_ev: int, ev: np.ndarray, col: np.ndarray
            ) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """One key's value span per event (-1 where the event lacks the key); a repeated key
    keeps its last value, as JSON parsers do."""
    vlo, vhi, vstr = _values(doc, col)
    lo = np.full(n_ev, -1, dtype=_IDX)
    hi = np.full(n_ev, -1, dtype=_IDX)
    st = np.zeros(n_ev, dtype=bool)
    lo[ev], hi[ev], st[ev] = vlo, vhi, vstr
    return (lo, hi), st


def scan(data: bytes, path: Path) -> Scan:
    """Index ``data``, check it, and locate the fields of every trace event."""
    doc = index(data, path)
    check_grammar(doc, path)
    s, c, depth, q, kq = doc.s, doc.c, doc.depth, doc.q, doc.kq
    colon = np.flatnonzero(c == 58)
    kc_all = q[kq[colon] - 1]
    ko_all = q[kq[colon] - 2]
    top = colon[depth[colon] == 1]
    tk = np.flatnonzero(depth[colon] == 1)
    hit = _key_is(doc, ko_all[tk], kc_all[tk], "traceEvents")
    if not hit.any():
        raise _bad(path, 0, "no 'traceEvents' array found")
    ti = int(top[int(np.flatnonzero(hit)[-1])])
    if c[ti + 1] != 91:
        raise _bad(path, int(s[ti]), "'traceEvents' is not an array")
    a_open = ti + 1
    rest = np.flatnonzero((c[a_open + 1:] == 93) & (depth[a_open + 1:] == 1))
    a_close = a_open + 1 + int(rest[0])
    off_open, off_close = int(s[a_open]), int(s[a_close])
    meta_bytes = data[:off_open] + b"[]" + data[off_close + 1:]
    try:
        meta = json.loads(meta_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(path, 0, f"the header or tail around 'traceEvents' is invalid ({exc})") \
            from exc
    meta.pop("traceEvents", None)
    inner = slice(a_open + 1, a_close)
    ci, di = c[inner], depth[inner]
    base = a_open + 1
    ev_open = np.flatnonzero((ci == 123) & (di == 3)) + base
    n_ev = ev_open.size
    spans: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    is_str: dict[str, np.ndarray] = {}
    # event-level keys: colons at depth 3 inside the array
    in_arr = (colon > a_open) & (colon < a_close)
    lvl3 = np.flatnonzero(in_arr & (depth[colon] == 3))
    col3 = colon[lvl3]
    ev3 = np.searchsorted(ev_open, col3) - 1
    args_col = np.zeros(0, dtype=I64)
    args_ev = np.zeros(0, dtype=I64)
    for key in _EVENT_KEYS:
        m = _key_is(doc, ko_all[lvl3], kc_all[lvl3], key)
        if key == "args":
            args_col, args_ev = col3[m], ev3[m]
            continue
        spans[key], is_str[key] = _column(doc, n_ev, ev3[m], col3[m])
    # args keys: colons at depth 4 whose innermost object is the value of an "args" key
    is_obj = c[args_col + 1] == 123
    obj4, owner = args_col[is_obj] + 1, args_ev[is_obj]
    lvl4 = np.flatnonzero(in_arr & (depth[colon] == 4))
    col4 = colon[lvl4]
    opens4 = np.flatnonzero((c == 123) & (depth == 4))
    enc = opens4[np.maximum(np.searchsorted(opens4, col4) - 1, 0)] if opens4.size else col4
    k = np.minimum(np.searchsorted(obj4, enc), max(obj4.size - 1, 0))
    sel = np.flatnonzero(obj4[k] == enc) if obj4.size else np.zeros(0, I64)
    col4, lvl4 = col4[sel], lvl4[sel]
    ev4 = owner[k[sel]]
    for key in _ARG_KEYS:
        m = _key_is(doc, ko_all[lvl4], kc_all[lvl4], key)
        spans[key], is_str[key] = _column(doc, n_ev, ev4[m], col4[m])
    return Scan(doc, meta, off_open, n_ev, spans, is_str)


def parse_ns(doc: Doc, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                   np.ndarray]:
    """Decimal microsecond text -> (integer ns, valid, had a fraction), exactly.

    ``123.4567`` -> 123457 ns (half up on the fourth decimal); plain digits with an optional
    sign and fraction are decoded in NumPy; exponents and very long numbers take the exact
    :class:`decimal.Decimal` path; anything else (``null``, text) is invalid.
    """
    n = lo.size
    ns = np.zeros(n, dtype=I64)
    valid = np.zeros(n, dtype=bool)
    frac = np.zeros(n, dtype=bool)
    length = hi - lo
    slow: list[int] = []
    cols = np.arange(_W, dtype=I64)
    for i in range(0, n, _NUM_ROWS):
        sl = slice(i, i + _NUM_ROWS)
        L = length[sl]
        rows = _gather(doc.b, np.maximum(lo[sl], 0), _W).astype(I64)
        inside = cols < L[:, None]
        neg = rows[:, 0] == 45
        first = neg.astype(I64)
        digit = (rows >= 48) & (rows <= 57) & inside
        dot = (rows == 46) & inside
        ndot = dot.sum(axis=1)
        dotpos = np.where(ndot == 1, np.argmax(dot, axis=1), L)
        sign_ok = (cols[None, :] == 0) & neg[:, None]
        chars_ok = (digit | dot | sign_ok | ~inside).all(axis=1)
        nint = dotpos - first
        fast = chars_ok & (ndot <= 1) & (nint >= 1) & (nint <= 16) & (L > 0) & (L <= _W) & (
            lo[sl] >= 0)
        d = np.where(digit, rows - 48, 0)
        e = dotpos[:, None] - 1 - cols[None, :]
        w_int = np.where((cols[None, :] >= first[:, None]) & (e >= 0), _POW10[np.clip(e, 0, 18)],
                         0)
        ip = (d * w_int).sum(axis=1)
        kf = cols[None, :] - dotpos[:, None]
        w_frac = np.where((kf >= 1) & (kf <= 3), _POW10[np.clip(3 - kf, 0, 3)], 0)
        fp = (d * w_frac).sum(axis=1)
        up = np.where(kf == 4, d, 0).sum(axis=1) >= 5
        fast &= ip < 9_000_000_000_000_000  # ip * 1000 fits in int64
        v = ip * 1000 + fp + up
        ns[sl] = np.where(neg, -v, v)
        valid[sl] = fast
        frac[sl] = ndot == 1
        todo = np.flatnonzero(~fast & (lo[sl] >= 0) & (L > 0)) + i
        slow.extend(todo.tolist())
    if slow:
        from decimal import Decimal, InvalidOperation

        for j in slow:
            text = doc.data[int(lo[j]):int(hi[j])]
            try:
                x = Decimal(text.decode("ascii")) * 1000
                if not x.is_finite():
                    raise InvalidOperation
                ns[j] = int(x.to_integral_value(rounding="ROUND_HALF_UP"))
                valid[j] = True
                frac[j] = b"." in text or b"e" in text.lower()
            except (InvalidOperation, UnicodeDecodeError, ValueError, OverflowError):
                pass
    return ns, valid, frac


def parse_int(doc: Doc, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer text (or an integral decimal such as ``7.0``) -> (int64, valid)."""
    ns, valid, _ = parse_ns(doc, lo, hi)
    valid &= ns % 1000 == 0
    return ns // 1000, valid


def strings(doc: Doc, lo: np.ndarray, hi: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Distinct strings of the spans and each span's index into them (JSON escapes decoded).

    One Python ``bytes`` per span for the lookup, one ``str`` per distinct value.
    """
    data = doc.data
    uniq: dict[bytes, int] = {}
    idx = np.fromiter((uniq.setdefault(data[a:b], len(uniq))
                       for a, b in zip(lo.tolist(), hi.tolist())), dtype=I64, count=lo.size)
    out = []
    for raw in uniq:
        if b"\\" in raw:
            out.append(str(json.loads(b'"' + raw + b'"')))
        else:
            out.append(raw.decode("utf-8", errors="replace"))
    return out, idx


def short_codes(doc: Doc, lo: np.ndarray, hi: np.ndarray, words: tuple[str, ...]) -> np.ndarray:
    """Index of each span's text in ``words`` (-1: absent or another text), vectorised."""
    code = np.full(lo.size, -1, dtype=np.int16)
    width = max((len(w) for w in words), default=1)
    ok = lo >= 0
    length = np.where(ok, hi - lo, -1)
    for i in range(0, lo.size, _ROWS):
        sl = slice(i, i + _ROWS)
        rows = _gather(doc.b, np.maximum(lo[sl], 0), width)
        for j, w in enumerate(words):
            wb = np.frombuffer(w.encode(), np.uint8)
            m = (length[sl] == wb.size) & (rows[:, :wb.size] == wb).all(axis=1)
            code[sl][m] = j
    return code
