"""The compiled loops of VictoriaMetrics' native export (``/api/v1/export/native``), imported
only by :mod:`gpuaudit.measure.fleet.native` (it imports numba). The answer, as
``app/vmselect/prometheus/prometheus.go`` (``ExportNativeHandler``) writes it:

- the time range: two int64, zig-zag, big-endian (``encoding.MarshalInt64``);
- then per stored block: a uint32 big-endian length and the series' ``MetricName``
  (``lib/storage/metric_name.go``: the metric name then key, value, each escaped and ended
  by byte 1), a uint32 big-endian length and the block (``Block.MarshalPortable``):
  varint first timestamp, [varint last timestamp,] varint first value, uvarint rows, varint
  decimal scale, a byte each for the timestamps' and values' encodings, [a byte of
  precision bits,] then the timestamps' and the values' bytes, each after its uvarint
  length. The bracketed fields came with v1.82.0 (commit 5fa9525, September 2022):
  ``LAYOUT_OLD`` is the format before, ``LAYOUT_NEW`` since.

Timestamps (ms) and values (decimal mantissas, ``value = mantissa * 10**scale``) are int64
arrays in one of six encodings (``lib/encoding/encoding.go``): 1 and 4 are 5 and 6 inside
a zstd frame (decompressed by the caller: :func:`zstd_sizes` finds each frame's size),
2 a constant step, 3 a constant, 5 zig-zag varint second differences ("nearest delta2"),
6 first differences. Values become floats as ``lib/decimal``'s ``AppendDecimalToFloat``
makes them (Go's ``math.Pow10``: the same float64 operations), so they are bit for bit the
floats the JSON export prints. Errors come back as codes (see ``native``); the machine code
is cached on disk."""

# mypy: ignore-errors

from __future__ import annotations

import numba
import numpy as np

from gpuaudit.measure.fleet._xor import _length, _uvarint

LAYOUT_OLD, LAYOUT_NEW = 1, 2

#: scan results (negative): the answer ends inside a record; a block does not read as the
#: layout asked (or holds an encoding not known here); a zstd frame does not state its
#: size; the record array is full (grow it, call again)
TRUNCATED, NOT_LAYOUT, NO_FRAME_SIZE, FULL = -1, -2, -3, -5

#: columns of a record (one stored block) in :func:`scan_blocks`' output
(R_MN_A, R_MN_B, R_FIRST_TS, R_FIRST_V, R_ROWS, R_SCALE, R_TS_TYPE, R_V_TYPE, R_TS_A, R_TS_N,
 R_V_A, R_V_N, R_TS_RAW, R_V_RAW) = range(14)
N_COLS = 14

# Go's math.Pow10 (src/math/pow10.go): 10**n as the product (or quotient) of two tabled
# float64 constants, which rounds differently from 10.0 ** n above 10**22
_POW10 = np.array([float(f"1e{i}") for i in range(32)])
_POW10_POS32 = np.array([float(f"1e{32 * i}") for i in range(10)])

_V_INF_POS = np.int64(2**63 - 1)
_V_INF_NEG = np.int64(-(2**63))
_V_STALE = np.int64(2**63 - 2)


@numba.njit(cache=True, nogil=True, inline="always")
def _zigzag(u):
    return np.int64(u >> np.uint64(1)) ^ -np.int64(u & np.uint64(1))


@numba.njit(cache=True, nogil=True, inline="always")
def _varint(buf, pos, end):
    """A zig-zag varint: (value, new position); position -1 when malformed."""
    u, pos = _uvarint(buf, pos, end)
    return _zigzag(u), pos


@numba.njit(cache=True, nogil=True)
def _be32(buf, pos):
    return (np.int64(buf[pos]) << 24) | (np.int64(buf[pos + 1]) << 16) \
        | (np.int64(buf[pos + 2]) << 8) | np.int64(buf[pos + 3])


@numba.njit(cache=True, nogil=True)
def time_range(buf):
    """The answer's (start, end) in ms: its first 16 bytes."""
    out = np.zeros(2, dtype=np.int64)
    for k in range(2):
        u = np.uint64(0)
        for i in range(8):
            u = (u << np.uint64(8)) | np.uint64(buf[8 * k + i])
        out[k] = _zigzag(u)
    return out[0], out[1]


@numba.njit(cache=True, nogil=True)
def _frame_size(buf, a, n):
    """The content size a zstd frame at ``buf[a:a + n]`` states in its header, or -1."""
    if n < 6 or buf[a] != 0x28 or buf[a + 1] != 0xB5 or buf[a + 2] != 0x2F \
            or buf[a + 3] != 0xFD:
        return -1
    fhd = np.int64(buf[a + 4])
    fcs_flag = fhd >> 6
    single = (fhd >> 5) & 1
    dict_flag = fhd & 3
    p = a + 5 + (1 - single)
    p += (0, 1, 2, 4)[dict_flag]
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if size == 0 or p + size > a + n:
        return -1
    v = np.int64(0)
    for i in range(size):
        v |= np.int64(buf[p + i]) << (8 * i)
    if size == 2:
        v += 256
    return v


@numba.njit(cache=True, nogil=True)
def _raw_size(buf, kind, a, n, rows):
    """The decompressed size of a block's field of encoding ``kind`` at ``buf[a:a + n]``
    when it is a zstd frame (1, 4); -1 when it is not one; NO_FRAME_SIZE when the frame does
    not state its size; NOT_LAYOUT when the size is more than a 10-byte varint a row (not a
    block of this layout)."""
    if kind != 1 and kind != 4:
        return np.int64(-1)
    size = _frame_size(buf, a, n)
    if size < 0:
        return np.int64(NO_FRAME_SIZE)
    return np.int64(NOT_LAYOUT) if size > 10 * rows else size


@numba.njit(cache=True, nogil=True)
def scan_blocks(buf, layout, recs, out_counts):
    """The records of a native export answer ``buf`` read in ``layout``: per stored block a
    row of ``recs`` (columns ``R_*``: the MetricName's bytes, the block's header, where its
    timestamps' and values' bytes lie and, for a zstd frame, its decompressed size).
    Returns 0 (``out_counts[0]`` records), or a negative code (see the module's constants;
    ``out_counts[1]`` the byte or record where it happened)."""
    n = buf.shape[0]
    pos = np.int64(16)
    i = 0
    while pos < n:
        out_counts[1] = pos
        if pos + 4 > n:
            return TRUNCATED
        mn_a = pos + 4
        mn_b = mn_a + _be32(buf, pos)
        if mn_b + 4 > n:
            return TRUNCATED
        a = mn_b + 4
        e = a + _be32(buf, mn_b)
        if e > n:
            return TRUNCATED
        out_counts[1] = i
        first_ts, p = _varint(buf, a, e)
        last_ts = first_ts
        if layout == LAYOUT_NEW and p >= 0:
            last_ts, p = _varint(buf, p, e)
        first_v = np.int64(0)
        if p >= 0:
            first_v, p = _varint(buf, p, e)
        rows = np.int64(0)
        if p >= 0:
            u, p = _uvarint(buf, p, e)
            rows = np.int64(u) if u < np.uint64(1 << 24) else np.int64(-1)
        scale = np.int64(0)
        if p >= 0:
            scale, p = _varint(buf, p, e)
        n_head = 3 if layout == LAYOUT_NEW else 2
        if p < 0 or p + n_head > e:
            return NOT_LAYOUT
        ts_type = np.int64(buf[p])
        v_type = np.int64(buf[p + 1])
        prec = np.int64(buf[p + 2]) if layout == LAYOUT_NEW else np.int64(64)
        p += n_head
        ts_n, p = _length(buf, p, e)
        if p < 0:
            return NOT_LAYOUT
        ts_a = p
        p += ts_n
        v_n, p = _length(buf, p, e)
        if p < 0 or p + v_n != e:
            return NOT_LAYOUT
        v_a = p
        if ts_type < 1 or ts_type > 6 or v_type < 1 or v_type > 6 or rows < 1 \
                or scale < -32768 or scale > 32767 or prec < 1 \
                or prec > 64 or last_ts < first_ts:
            return NOT_LAYOUT
        t_raw = _raw_size(buf, ts_type, ts_a, ts_n, rows)
        v_raw = _raw_size(buf, v_type, v_a, v_n, rows)
        for got in (t_raw, v_raw):
            if got == NO_FRAME_SIZE or got == NOT_LAYOUT:
                return got
        if i >= recs.shape[0]:
            return FULL
        rec = (mn_a, mn_b, first_ts, first_v, rows, scale, ts_type, v_type, ts_a, ts_n, v_a,
               v_n, t_raw, v_raw)  # (in the order of the R_* columns)
        for c in range(N_COLS):
            recs[i, c] = rec[c]
        i += 1
        pos = e
    out_counts[0] = i
    return 0


@numba.njit(cache=True, nogil=True)
def gather_frames(buf, recs, packed):
    """The zstd frames of records ``recs`` (a block's timestamps, then its values, block by
    block) end to end into ``packed`` (its size their sum): one input for one
    decompression call, which inflates frames back to back into their contents back to
    back. Returns the bytes written."""
    k = 0
    for r in range(recs.shape[0]):
        for raw, a, n in ((R_TS_RAW, R_TS_A, R_TS_N), (R_V_RAW, R_V_A, R_V_N)):
            if recs[r, raw] >= 0:
                m = recs[r, n]
                packed[k:k + m] = buf[recs[r, a]:recs[r, a] + m]
                k += m
    return k


@numba.njit(cache=True, nogil=True)
def _ints(src, a, n, kind, first, rows, out):
    """``rows`` int64 of encoding ``kind`` (the zstd ones already decompressed: 1 read as
    5, 4 as 6) from ``src[a:a + n]`` into ``out``; False when the bytes do not hold
    exactly that many."""
    e = a + n
    if kind == 3:  # a constant
        if n != 0:
            return False
        for j in range(rows):
            out[j] = first
        return True
    if kind == 2:  # a constant step
        d, p = _varint(src, a, e)
        if p != e:
            return False
        v = first
        for j in range(rows):
            out[j] = v
            v += d
        return True
    delta2 = kind == 1 or kind == 5
    if delta2 and rows < 2:
        return False
    out[0] = first
    v = first
    d1 = np.int64(0)
    p = a
    for j in range(1, rows):
        d, p = _varint(src, p, e)
        if p < 0:
            return False
        if delta2:
            d1 = d if j == 1 else d1 + d
            v += d1
        else:
            v += d
        out[j] = v
    return p == e


@numba.njit(cache=True, nogil=True, inline="always")
def _field(buf, raw, raw_at, rec, c_type, c_a, c_n, c_raw, c_first, out):
    """A block's timestamps or values (record ``rec``'s columns ``c_*``) into ``out``: from
    the answer's bytes, or from ``raw`` at ``raw_at`` where they were a zstd frame."""
    kind = rec[c_type]
    if kind == 1 or kind == 4:
        return _ints(raw, raw_at, rec[c_raw], kind, rec[c_first], rec[R_ROWS], out)
    return _ints(buf, rec[c_a], rec[c_n], kind, rec[c_first], rec[R_ROWS], out)


@numba.njit(cache=True, nogil=True, inline="always")
def _pow10(n):
    """Go's ``math.Pow10(n)`` for n >= 0."""
    if n > 308:
        return np.inf
    return _POW10_POS32[n // 32] * _POW10[n % 32]


@numba.njit(cache=True, nogil=True)
def decode_blocks(buf, raw, raw_at, recs, order, series_of, lo_ms, hi_ms, ts, vals,
                  bounds):
    """The samples of records ``order`` (grouped by series: ``series_of[r]``), each block
    trimmed to [``lo_ms``, ``hi_ms``] as the JSON export trims it, stale markers left out
    (as remote read's answers are read), each series in time order, into ``ts`` and
    ``vals``; series s's samples are
    ``bounds[s]:bounds[s + 1]``. The zstd fields' decompressed bytes are in ``raw`` at
    ``raw_at[r, 0]`` (timestamps) and ``raw_at[r, 1]`` (values). Returns the samples
    written, or -(r + 1) when record r's bytes do not hold its rows."""
    n_max = 0
    for r in order:
        n_max = max(n_max, recs[r, R_ROWS])
    t_buf = np.empty(n_max, dtype=np.int64)
    v_buf = np.empty(n_max, dtype=np.int64)
    k = np.int64(0)
    prev = np.int64(-1)
    for r in order:
        s = series_of[r]
        if s != prev and prev >= 0:
            _in_time_order(ts, vals, bounds[prev], k)
        while prev < s:
            prev += 1
            bounds[prev] = k
        rows = recs[r, R_ROWS]
        if not (_field(buf, raw, raw_at[r, 0], recs[r], R_TS_TYPE, R_TS_A, R_TS_N, R_TS_RAW,
                       R_FIRST_TS, t_buf)
                and _field(buf, raw, raw_at[r, 1], recs[r], R_V_TYPE, R_V_A, R_V_N, R_V_RAW,
                           R_FIRST_V, v_buf)):
            return -(r + 1)
        # AppendDecimalToFloat: m * 10**e, or m / 10**-e for e < 0 (one rounding either way)
        scale = recs[r, R_SCALE]
        mul = _pow10(scale) if scale > 0 else 1.0
        div = _pow10(-scale) if scale < 0 else 1.0
        for j in range(rows):
            t = t_buf[j]
            if t < lo_ms or t > hi_ms:
                continue
            m = v_buf[j]
            if m == _V_STALE:
                continue
            if m == _V_INF_POS:
                f = np.inf
            elif m == _V_INF_NEG:
                f = -np.inf
            elif scale < 0:
                f = np.float64(m) / div
            else:
                f = np.float64(m) * mul
            ts[k] = t
            vals[k] = f
            k += 1
    if prev >= 0:
        _in_time_order(ts, vals, bounds[prev], k)
    while prev < bounds.shape[0] - 1:
        prev += 1
        bounds[prev] = k
    return k


@numba.njit(cache=True, nogil=True)
def _in_time_order(ts, vals, a, b):
    """One series' samples ``a:b`` (its blocks one after another) in time order, as the
    JSON export merges a series' blocks (blocks of different parts overlap in time); a
    stable sort, so samples of equal times keep their blocks' order."""
    for i in range(a + 1, b):
        if ts[i] < ts[i - 1]:
            break
    else:
        return
    order = np.argsort(ts[a:b], kind="mergesort")
    t = ts[a:b][order]
    v = vals[a:b][order]
    ts[a:b] = t
    vals[a:b] = v
