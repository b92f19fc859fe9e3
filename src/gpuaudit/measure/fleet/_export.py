"""The compiled scan of VictoriaMetrics' ``/api/v1/export`` answer (imported only by
:mod:`gpuaudit.measure.fleet.native`: it imports numba): JSON lines of the form
``{"metric":{...},"values":[...],"timestamps":[...]}`` as VictoriaMetrics writes them
(that key order, no spaces: checked on its answers here). Numbers are read exactly: a decimal with
at most 19 significant digits whose value is ``m * 10**e`` with ``m <= 2**53`` and
``|e| <= 22`` is one correctly rounded operation (Clinger's fast path: both operands are
exact doubles), which is what a correct parser returns; any other number is handed back
to be read by Python's ``float``, and so are the infinities VictoriaMetrics writes as
``+Inf`` and ``-Inf`` (not JSON). A stale marker, which it writes as ``null`` (``NaN`` as a
line's first value), is read as NaN, for the caller to leave out. A line of any other
shape stops the scan (the caller reads the answer with a general JSON reader instead). The
machine code is cached on disk."""

# mypy: ignore-errors

from __future__ import annotations

import numba
import numpy as np

_POW10 = np.array([10.0 ** i for i in range(23)])
# the words VictoriaMetrics writes for a value that is not a number: a stale marker (null;
# NaN where it is a line's first value) and the infinities (not JSON: Go's text for them)
_NULL = np.frombuffer(b"null", dtype=np.uint8)
_NAN = np.frombuffer(b"NaN", dtype=np.uint8)
_INFS = (np.frombuffer(b"+Inf", dtype=np.uint8), np.frombuffer(b"-Inf", dtype=np.uint8),
         np.frombuffer(b"Inf", dtype=np.uint8))
_HEAD = np.frombuffer(b'{"metric":', dtype=np.uint8)
_VALUES = np.frombuffer(b',"values":[', dtype=np.uint8)
_STAMPS = np.frombuffer(b',"timestamps":[', dtype=np.uint8)

#: scan results (negative): the answer is not of the shape read here; the values and the
#: timestamps of a line differ in number; the output arrays are full (grow, call again)
NOT_EXPORT, COUNTS_DIFFER, FULL = -3, -6, -5


@numba.njit(cache=True, nogil=True)
def _expect(buf, pos, lit):
    """``pos`` past ``lit`` when ``buf`` holds it there, else -1."""
    if pos + lit.shape[0] > buf.shape[0]:
        return -1
    for i in range(lit.shape[0]):
        if buf[pos + i] != lit[i]:
            return -1
    return pos + lit.shape[0]


@numba.njit(cache=True, nogil=True)
def _after_item(buf, pos):
    """Past a list item's separator: ``(pos + 1, False)`` after ``,`` (more follow),
    ``(pos + 1, True)`` after ``]`` (the list ends), ``(-1, True)`` for anything else."""
    if pos < buf.shape[0]:
        if buf[pos] == 44:  # ,
            return pos + 1, False
        if buf[pos] == 93:  # ]
            return pos + 1, True
    return -1, True


@numba.njit(cache=True, nogil=True)
def _object_end(buf, pos):
    """Past the JSON object starting at ``pos`` (``{``), strings skipped; -1 if cut."""
    depth = 0
    n = buf.shape[0]
    while pos < n:
        c = buf[pos]
        if c == 34:  # "
            pos += 1
            while pos < n and buf[pos] != 34:
                pos += 2 if buf[pos] == 92 else 1  # a backslash escapes the next byte
        elif c == 123:  # {
            depth += 1
        elif c == 125:  # }
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    return -1


@numba.njit(cache=True, nogil=True)
def _number(buf, pos):
    """(value, next position, exact) of the JSON number at ``pos``; next position -1 when
    there is none; ``exact`` False when the value needs a general parser."""
    n = buf.shape[0]
    neg = False
    if pos < n and buf[pos] == 45:  # -
        neg = True
        pos += 1
    m = np.uint64(0)
    digits = 0
    exp10 = 0
    start = pos
    while pos < n and 48 <= buf[pos] <= 57:
        if digits < 19:
            m = m * np.uint64(10) + np.uint64(buf[pos] - 48)
            if m > 0:
                digits += 1
        else:
            exp10 += 1
            digits += 1
        pos += 1
    if pos == start:
        return 0.0, -1, False
    if pos < n and buf[pos] == 46:  # .
        pos += 1
        frac = pos
        while pos < n and 48 <= buf[pos] <= 57:
            if digits < 19:
                m = m * np.uint64(10) + np.uint64(buf[pos] - 48)
                exp10 -= 1
                if m > 0:
                    digits += 1
            else:
                digits += 1
            pos += 1
        if pos == frac:
            return 0.0, -1, False
    if pos < n and (buf[pos] == 101 or buf[pos] == 69):  # e E
        pos += 1
        eneg = False
        if pos < n and (buf[pos] == 43 or buf[pos] == 45):
            eneg = buf[pos] == 45
            pos += 1
        e = 0
        estart = pos
        while pos < n and 48 <= buf[pos] <= 57:
            if e < 100000:
                e = e * 10 + (buf[pos] - 48)
            pos += 1
        if pos == estart:
            return 0.0, -1, False
        exp10 += -e if eneg else e
    exact = digits <= 19 and m <= np.uint64(1 << 53) and -22 <= exp10 <= 22
    if not exact:
        return 0.0, pos, False
    x = float(m)
    if exp10 > 0:
        x = x * _POW10[exp10]
    elif exp10 < 0:
        x = x / _POW10[-exp10]
    return -x if neg else x, pos, True


@numba.njit(cache=True, nogil=True)
def scan_export(buf, lines, vals, ts, slow, counts):
    """Scan a whole export answer. Per line ``i``: ``lines[i] = (metric object start, end,
    first sample, end of samples)`` into ``vals``/``ts``; each number that needs a general
    parser: ``slow[j] = (sample index, token start, token end)``. ``counts`` receives
    (lines, samples, slow numbers, position reached). Returns 0, or :data:`NOT_EXPORT`,
    :data:`COUNTS_DIFFER`, :data:`FULL`."""
    n = buf.shape[0]
    pos = 0
    nl = 0
    ns = 0
    nslow = 0
    while True:
        while pos < n and (buf[pos] == 10 or buf[pos] == 13 or buf[pos] == 32):
            pos += 1
        counts[3] = pos
        if pos >= n:
            break
        if nl >= lines.shape[0]:
            return FULL
        p = _expect(buf, pos, _HEAD)
        if p < 0 or p >= n or buf[p] != 123:
            return NOT_EXPORT
        me = _object_end(buf, p)
        if me < 0:
            return NOT_EXPORT
        p = _expect(buf, me, _VALUES)
        if p < 0:
            return NOT_EXPORT
        first = ns
        if p < n and buf[p] == 93:  # ]
            p += 1
        else:
            while True:
                if ns >= vals.shape[0]:
                    return FULL
                t0 = p
                x, p, exact = _number(buf, p)
                if p < 0:  # a word: a stale marker (NaN, left out after), an infinity
                    p = _expect(buf, t0, _NULL)
                    if p < 0:
                        p = _expect(buf, t0, _NAN)
                    if p >= 0:
                        x, exact = np.nan, True
                    else:
                        for word in _INFS:
                            p = _expect(buf, t0, word)
                            if p >= 0:
                                break
                        if p < 0:
                            return NOT_EXPORT
                if not exact:
                    if nslow >= slow.shape[0]:
                        return FULL
                    slow[nslow, 0] = ns
                    slow[nslow, 1] = t0
                    slow[nslow, 2] = p
                    nslow += 1
                vals[ns] = x
                ns += 1
                p, done = _after_item(buf, p)
                if p < 0:
                    return NOT_EXPORT
                if done:
                    break
        p = _expect(buf, p, _STAMPS)
        if p < 0:
            return NOT_EXPORT
        nt = first
        if p < n and buf[p] == 93:
            p += 1
        else:
            while True:
                neg = p < n and buf[p] == 45
                if neg:
                    p += 1
                start = p
                t = 0
                while p < n and 48 <= buf[p] <= 57 and p - start < 18:
                    t = t * 10 + (buf[p] - 48)
                    p += 1
                if p == start or (p < n and (48 <= buf[p] <= 57 or buf[p] == 46
                                             or buf[p] == 101 or buf[p] == 69)):
                    return NOT_EXPORT  # not a plain integer of at most 18 digits
                if nt < ns:
                    ts[nt] = -t if neg else t
                nt += 1
                p, done = _after_item(buf, p)
                if p < 0:
                    return NOT_EXPORT
                if done:
                    break
        if nt != ns:
            return COUNTS_DIFFER
        if p >= n or buf[p] != 125:
            return NOT_EXPORT
        lines[nl, 0] = _HEAD.shape[0] + pos
        lines[nl, 1] = me
        lines[nl, 2] = first
        lines[nl, 3] = ns
        nl += 1
        pos = p + 1
    counts[0] = nl
    counts[1] = ns
    counts[2] = nslow
    return 0
