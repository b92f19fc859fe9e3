"""The compiled loops of :mod:`gpuaudit.measure.fleet.native` (imported only there: it
imports numba): CRC32-Castagnoli of a frame, the scan of a ``ChunkedReadResponse`` frame
(protobuf) into its chunks, and Prometheus' XOR (Gorilla) chunk decoder
(``tsdb/chunkenc/xor.go``). Errors come back as negative codes (see ``native``); the
machine code is cached on disk."""

# mypy: ignore-errors

from __future__ import annotations

import numba
import numpy as np


def _crc_table() -> np.ndarray:
    poly = 0x82F63B78  # Castagnoli, reflected
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table[i] = c
    return table


_CRC = _crc_table()


@numba.njit(cache=True, nogil=True)
def crc32c(buf, start, end):
    """CRC32-C of ``buf[start:end]`` (as Go's ``crc32.MakeTable(crc32.Castagnoli)``)."""
    c = np.uint32(0xFFFFFFFF)
    for i in range(start, end):
        c = _CRC[(c ^ np.uint32(buf[i])) & np.uint32(0xFF)] ^ (c >> np.uint32(8))
    return c ^ np.uint32(0xFFFFFFFF)


@numba.njit(cache=True, nogil=True)
def _uvarint(buf, pos, end):
    """(value, new position); new position -1: truncated or longer than 10 bytes."""
    x = np.uint64(0)
    shift = np.uint64(0)
    for _k in range(10):
        if pos >= end:
            return np.uint64(0), -1
        b = buf[pos]
        pos += 1
        x |= np.uint64(b & 0x7F) << shift
        if b < 0x80:
            return x, pos
        shift += np.uint64(7)
    return np.uint64(0), -1


@numba.njit(cache=True, nogil=True)
def _length(buf, pos, end):
    """A uvarint that counts the bytes after it: (count, new position); new position -1
    when it is malformed or counts more bytes than are left before ``end`` (a count of
    2**63 or more would turn negative as an int64 and point backwards)."""
    n, pos = _uvarint(buf, pos, end)
    if pos < 0 or n > np.uint64(end - pos):
        return np.int64(0), -1
    return np.int64(n), pos


@numba.njit(cache=True, nogil=True)
def _skip(buf, pos, end, wire):
    """Skip a field of wire type ``wire`` at ``pos``; -1 on a malformed field."""
    if wire == 0:
        _v, pos = _uvarint(buf, pos, end)
        return pos
    if wire == 1:
        return pos + 8 if pos + 8 <= end else -1
    if wire == 2:
        n, pos = _length(buf, pos, end)
        return -1 if pos < 0 else pos + n
    if wire == 5:
        return pos + 4 if pos + 4 <= end else -1
    return -1


@numba.njit(cache=True, nogil=True)
def scan_frames(buf, series_lab, chunk_meta, out_counts):
    """Frames ``uvarint length | CRC32-C (big-endian) | ChunkedReadResponse`` in ``buf``
    (all of them, back to back) -> per ChunkedSeries message: (start, end) of its bytes'
    labels part as offsets, query index, and where its leading labels end (``series_lab[i]
    = [msg_start, msg_end, query, labels_end]``; labels_end -2 when a label field follows
    another field);
    per XOR chunk: (series message, min_t, max_t, data offset, data length, samples).
    ``out_counts`` receives (series, chunks, frames). Returns 0, or -1 a truncated frame,
    -2 a CRC mismatch, -3 malformed protobuf, -4 a chunk encoding other than XOR, -5 more
    series or chunks than the arrays hold (grow them and call again). Position of the
    error in ``out_counts[3]``."""
    n = buf.shape[0]
    pos = 0
    ns = 0
    nc = 0
    nf = 0
    while pos < n:
        out_counts[3] = pos
        length, p = _length(buf, pos, n)
        if p < 0 or p + 4 + length > n:
            return -1
        want = (np.uint32(buf[p]) << np.uint32(24)) | (np.uint32(buf[p + 1]) << np.uint32(16)) \
            | (np.uint32(buf[p + 2]) << np.uint32(8)) | np.uint32(buf[p + 3])
        s = p + 4
        e = s + length
        if crc32c(buf, s, e) != want:
            return -2
        nf += 1
        # ChunkedReadResponse: 1 chunked_series (repeated, message), 2 query_index (int64)
        query = 0
        first_series = ns
        q = s
        while q < e:
            key, q = _uvarint(buf, q, e)
            if q < 0:
                return -3
            field = np.int64(key >> np.uint64(3))
            wire = np.int64(key & np.uint64(7))
            if field == 1 and wire == 2:
                ln, q = _length(buf, q, e)
                if q < 0:
                    return -3
                ms = q
                me = q + ln
                if ns >= series_lab.shape[0]:
                    return -5
                series_lab[ns, 0] = ms
                series_lab[ns, 1] = me
                # ChunkedSeries: 1 labels (message), 2 chunks (message)
                r = ms
                lab_end = np.int64(-1)  # where the leading labels end (-2: one comes later)
                while r < me:
                    r0 = r
                    k2, r = _uvarint(buf, r, me)
                    if r < 0:
                        return -3
                    f2 = np.int64(k2 >> np.uint64(3))
                    w2 = np.int64(k2 & np.uint64(7))
                    if f2 != 1 and lab_end == -1:
                        lab_end = r0
                    elif f2 == 1 and lab_end >= 0:
                        lab_end = np.int64(-2)
                    if f2 == 2 and w2 == 2:
                        l2, r = _length(buf, r, me)
                        if r < 0:
                            return -3
                        cs = r
                        ce = r + l2
                        mint = np.int64(0)
                        maxt = np.int64(0)
                        enc = np.int64(0)
                        doff = np.int64(-1)
                        dlen = np.int64(0)
                        # Chunk: 1 min_time_ms, 2 max_time_ms, 3 type, 4 data
                        t = cs
                        while t < ce:
                            k3, t = _uvarint(buf, t, ce)
                            if t < 0:
                                return -3
                            f3 = np.int64(k3 >> np.uint64(3))
                            w3 = np.int64(k3 & np.uint64(7))
                            if w3 == 0 and f3 <= 3:
                                v, t = _uvarint(buf, t, ce)
                                if t < 0:
                                    return -3
                                if f3 == 1:
                                    mint = np.int64(v)
                                elif f3 == 2:
                                    maxt = np.int64(v)
                                else:
                                    enc = np.int64(v)
                            elif f3 == 4 and w3 == 2:
                                l3, t = _length(buf, t, ce)
                                if t < 0:
                                    return -3
                                doff = t
                                dlen = l3
                                t += dlen
                            else:
                                t = _skip(buf, t, ce, w3)
                                if t < 0:
                                    return -3
                        if enc != 1:
                            return -4
                        if doff < 0 or dlen < 2:
                            return -3
                        if nc >= chunk_meta.shape[0]:
                            return -5
                        chunk_meta[nc, 0] = ns
                        chunk_meta[nc, 1] = mint
                        chunk_meta[nc, 2] = maxt
                        chunk_meta[nc, 3] = doff
                        chunk_meta[nc, 4] = dlen
                        chunk_meta[nc, 5] = (np.int64(buf[doff]) << 8) | np.int64(buf[doff + 1])
                        nc += 1
                        r = ce
                    else:
                        r = _skip(buf, r, me, w2)
                        if r < 0:
                            return -3
                series_lab[ns, 3] = me if lab_end == -1 else lab_end
                ns += 1
                q = me
            elif field == 2 and wire == 0:
                v, q = _uvarint(buf, q, e)
                if q < 0:
                    return -3
                query = np.int64(v)
            else:
                q = _skip(buf, q, e, wire)
                if q < 0:
                    return -3
        for i in range(first_series, ns):
            series_lab[i, 2] = query
        pos = e
    out_counts[0] = ns
    out_counts[1] = nc
    out_counts[2] = nf
    return 0


@numba.njit(cache=True, nogil=True, inline="always")
def _bits(buf, end, bitpos, n):
    """``n`` (<= 64) bits at bit ``bitpos`` of ``buf`` (big-endian bit order), and the new
    position; -1 when they run past byte ``end``."""
    if bitpos + n > end * 8:
        return np.uint64(0), -1
    x = np.uint64(0)
    while n > 0:
        byte = bitpos >> 3
        off = bitpos & 7
        avail = 8 - off
        take = avail if avail < n else n
        b = (np.uint64(buf[byte]) >> np.uint64(avail - take)) & np.uint64((1 << take) - 1)
        x = (x << np.uint64(take)) | b
        bitpos += take
        n -= take
    return x, bitpos


@numba.njit(cache=True, nogil=True, inline="always")
def _bit_uvarint(buf, end, bitpos):
    """An unsigned varint (at most 10 bytes) read byte by byte from bit ``bitpos`` (the XOR
    chunk's first two samples are not byte-aligned past the header), and the new position;
    -1 when it runs past byte ``end`` or past 10 bytes."""
    ux = np.uint64(0)
    shift = np.uint64(0)
    for _k in range(10):
        b, bitpos = _bits(buf, end, bitpos, 8)
        if bitpos < 0:
            return np.uint64(0), -1
        ux |= (b & np.uint64(0x7F)) << shift
        if b < np.uint64(0x80):
            return ux, bitpos
        shift += np.uint64(7)
    return np.uint64(0), -1


@numba.njit(cache=True, nogil=True)
def decode_xor(buf, chunk_meta, n_chunks, out_off, ts, vals):
    """Every XOR chunk ``chunk_meta[:n_chunks]`` (data offset col 3, length col 4, samples
    col 5) into ``ts`` (ms) / ``vals`` from ``out_off[i]`` on. Returns -1, or the index of
    the first chunk whose data ends before its samples do."""
    for c in range(n_chunks):
        doff = chunk_meta[c, 3]
        end = doff + chunk_meta[c, 4]
        num = chunk_meta[c, 5]
        o = out_off[c]
        if num == 0:
            continue
        pos = (doff + 2) * 8
        # first sample: signed varint t, 64-bit value
        ux, pos = _bit_uvarint(buf, end, pos)
        if pos < 0:
            return c
        t = np.int64(ux >> np.uint64(1))
        if ux & np.uint64(1):
            t = ~t
        vb, pos = _bits(buf, end, pos, 64)
        if pos < 0:
            return c
        ts[o] = t
        vals[o] = vb
        if num == 1:
            continue
        # second sample: uvarint delta, then the value's xor
        ux, pos = _bit_uvarint(buf, end, pos)
        if pos < 0:
            return c
        delta = np.int64(ux)
        t += delta
        leading = 0xFF
        trailing = 0
        for i in range(1, num):
            if i >= 2:
                # delta of delta: 0 | 10+14 | 110+17 | 1110+20 | 1111+64
                d = 0
                for _k in range(4):
                    bit, pos = _bits(buf, end, pos, 1)
                    if pos < 0:
                        return c
                    d <<= 1
                    if bit == np.uint64(0):
                        break
                    d |= 1
                sz = 0
                dod = np.int64(0)
                if d == 0b10:
                    sz = 14
                elif d == 0b110:
                    sz = 17
                elif d == 0b1110:
                    sz = 20
                elif d == 0b1111:
                    raw, pos = _bits(buf, end, pos, 64)
                    if pos < 0:
                        return c
                    dod = np.int64(raw)
                if sz:
                    raw, pos = _bits(buf, end, pos, sz)
                    if pos < 0:
                        return c
                    dod = np.int64(raw)
                    if raw > np.uint64(1 << (sz - 1)):
                        dod -= np.int64(1) << sz
                delta += dod
                t += delta
            # value: 0 same | 10 + mbits (reuse) | 11 + 5 leading + 6 sig + sig bits
            bit, pos = _bits(buf, end, pos, 1)
            if pos < 0:
                return c
            if bit != np.uint64(0):
                bit, pos = _bits(buf, end, pos, 1)
                if pos < 0:
                    return c
                if bit != np.uint64(0):
                    lb, pos = _bits(buf, end, pos, 5)
                    if pos < 0:
                        return c
                    mb, pos = _bits(buf, end, pos, 6)
                    if pos < 0:
                        return c
                    leading = np.int64(lb)
                    mbits = np.int64(mb)
                    if mbits == 0:
                        mbits = 64
                    trailing = 64 - leading - mbits
                    if trailing < 0:
                        return c
                elif leading == 0xFF:
                    return c
                mbits = 64 - leading - trailing
                x, pos = _bits(buf, end, pos, mbits)
                if pos < 0:
                    return c
                vb ^= x << np.uint64(trailing)
            ts[o + i] = t
            vals[o + i] = vb
    return -1


@numba.njit(cache=True, nogil=True)
def grid_points(ts_ms, vals, bounds, start_ms, step_ms, n_steps, sid, k, val):
    """Series j's samples ``ts_ms[bounds[j]:bounds[j + 1]]`` (not descending) onto the step
    grid ``start_ms + k * step_ms``, k in [0, n_steps): a sample at t belongs to the first
    step at or after it (PromQL ``last_over_time(x[step - 1ms])``), the last sample of a
    step wins, samples off the grid are dropped. Writes the kept points' series, step and
    value into ``sid``, ``k``, ``val`` (series then step order) and returns their number;
    -1 (nothing kept) when a series' times descend somewhere (the caller sorts first)."""
    for j in range(bounds.shape[0] - 1):
        for i in range(bounds[j] + 1, bounds[j + 1]):
            if ts_ms[i] < ts_ms[i - 1]:
                return -1
    n = 0
    for j in range(bounds.shape[0] - 1):
        end = bounds[j + 1]
        for i in range(bounds[j], end):
            kk = -((start_ms - ts_ms[i]) // step_ms)  # ceil((t - start) / step)
            if kk < 0 or kk >= n_steps:
                continue
            if i + 1 < end and -((start_ms - ts_ms[i + 1]) // step_ms) == kk:
                continue  # a later sample of this step wins
            sid[n] = j
            k[n] = kk
            val[n] = vals[i]
            n += 1
    return n


@numba.njit(cache=True, nogil=True)
def _number_cells(pos):
    """The cells marked 0 in ``pos`` (unmarked: -1) numbered in cell order, in place (each
    becomes its row); returns each row's cell."""
    n = 0
    for c in range(pos.shape[0]):
        if pos[c] == 0:
            pos[c] = n
            n += 1
    rows = np.empty(n, dtype=np.int64)
    for c in range(pos.shape[0]):
        if pos[c] >= 0:
            rows[pos[c]] = c
    return rows


@numba.njit(cache=True, nogil=True)
def dense_rows(local, k, metric, val, n_steps, n_local, is_util):
    """The joined rows of one chunk from its points (series' chunk-local code ``local``,
    step ``k``, ``metric`` index, value): a row per (code, step) cell where a metric with
    ``is_util`` has a point, in cell order. Returns each row's cell, each metric's value
    in each row (``[metric, row]``, NaN where it has no point; a later point of a cell
    wins) and whether a metric has any point at all."""
    n_metrics = is_util.shape[0]
    pos = np.full(n_local * n_steps, -1, dtype=np.int64)
    for i in range(local.shape[0]):
        if is_util[metric[i]]:
            pos[local[i] * n_steps + k[i]] = 0
    rows = _number_cells(pos)
    n = rows.shape[0]
    values = np.full((n_metrics, n), np.nan)
    seen = np.zeros(n_metrics, dtype=np.bool_)
    for i in range(local.shape[0]):
        seen[metric[i]] = True
        p = pos[local[i] * n_steps + k[i]]
        if p >= 0:
            values[metric[i], p] = val[i]
    return rows, values, seen


@numba.njit(cache=True, nogil=True)
def grid_cells(ts_ms, vals, starts, ends, code_of, metric_of, n_codes, start_ms, step_ms,
               n_steps, is_util):
    """:func:`grid_points` and :func:`dense_rows` in one pass over the samples, with no
    per-point arrays: series j (``ts_ms[starts[j]:ends[j]]``, not descending: the series
    may lie anywhere in ``ts_ms``, in any order, as decoded; no copy end to end) of code
    ``code_of[j]`` and metric ``metric_of[j]``, onto the step grid as ``grid_points`` puts
    it, then joined as ``dense_rows`` joins the points (the codes numbered in order among
    those with a point; a later point of a cell wins, which within a series is the step's
    last sample). Returns (ok, the codes with a point, rows, values, seen) as ``dense_rows``
    returns the last three; ok False (nothing else filled) when a series' times descend
    somewhere (the caller sorts, then takes the two-step path)."""
    n_series = starts.shape[0]
    empty = np.zeros(0, dtype=np.int64)
    for j in range(n_series):
        for i in range(starts[j] + 1, ends[j]):
            if ts_ms[i] < ts_ms[i - 1]:
                return False, empty, empty, np.zeros((0, 0)), np.zeros(0, dtype=np.bool_)
    # each series' samples on the grid: t in (start - step, start + (n_steps - 1) * step]
    lo_t, hi_t = start_ms - step_ms, start_ms + (n_steps - 1) * step_ms
    first = np.empty(n_series, dtype=np.int64)
    last = np.empty(n_series, dtype=np.int64)
    present = np.zeros(n_codes, dtype=np.bool_)
    for j in range(n_series):
        a, b = starts[j], ends[j]
        while a < b and ts_ms[a] <= lo_t:
            a += 1
        e = a
        while e < b and ts_ms[e] <= hi_t:
            e += 1
        first[j], last[j] = a, e
        if e > a:
            present[code_of[j]] = True
    local = np.empty(n_codes, dtype=np.int64)
    n_local = 0
    for c in range(n_codes):
        local[c] = n_local
        if present[c]:
            n_local += 1
    codes = np.empty(n_local, dtype=np.int64)
    for c in range(n_codes):
        if present[c]:
            codes[local[c]] = c
    pos = np.full(n_local * n_steps, -1, dtype=np.int64)
    for j in range(n_series):
        if is_util[metric_of[j]]:
            base = local[code_of[j]] * n_steps
            for i in range(first[j], last[j]):
                pos[base + (ts_ms[i] - lo_t - 1) // step_ms] = 0
    rows = _number_cells(pos)
    n = rows.shape[0]
    values = np.full((is_util.shape[0], n), np.nan)
    seen = np.zeros(is_util.shape[0], dtype=np.bool_)
    for j in range(n_series):
        if last[j] > first[j]:
            m = metric_of[j]
            seen[m] = True
            base = local[code_of[j]] * n_steps
            for i in range(first[j], last[j]):
                p = pos[base + (ts_ms[i] - lo_t - 1) // step_ms]
                if p >= 0:
                    values[m, p] = vals[i]
    return True, codes, rows, values, seen
