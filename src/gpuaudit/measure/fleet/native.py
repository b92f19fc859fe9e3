"""Raw samples in a store's cheapest native form: Prometheus' remote-read API with streamed
XOR chunks, VictoriaMetrics' ``/api/v1/export``.

Prometheus (``POST /api/v1/read``): a snappy-compressed protobuf ``ReadRequest`` that
accepts ``STREAMED_XOR_CHUNKS``; the server streams the stored chunks as they are, in
frames of ``uvarint length | CRC32-C (big-endian) | ChunkedReadResponse``. The request's
snappy block is written all-literal (a valid block: the length, then literal elements), the
protobuf messages by hand (a few fields, ``prompb/remote.proto`` and ``types.proto``); the
frames are checked (CRC32-C), scanned and their XOR chunks decoded by compiled loops
(:mod:`gpuaudit.measure.fleet._xor`, ``tsdb/chunkenc/xor.go``'s format).

VictoriaMetrics does not implement remote read. ``/api/v1/export/native`` streams its
stored blocks as they are (zstd-compressed varint deltas of the times and of the values'
decimal mantissas: a format of its own, undocumented, changed once in v1.82.0), read by
compiled loops (:mod:`gpuaudit.measure.fleet._vmnative`) into the same floats, bit for bit,
as ``/api/v1/export``'s JSON lines (``{"metric": {...}, "values": [...], "timestamps":
[...]}``), which it costs the store ~30x the CPU to write and ~6x the bytes to send. A store
that does not answer the native export, or answers in a layout not read here, is read
through the JSON export (a compiled scan, else pyarrow's JSON reader), with a note.

Both give :class:`RawSeries`: a series' labels and its samples (ms, float64); remote read's
whole chunks as stored (samples outside the asked range included: the caller trims).
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuaudit.errors import InputError, SourceUnavailableError

if TYPE_CHECKING:
    from gpuaudit.measure.fleet.prometheus import PromClient

__all__ = [
    "LeanSamples",
    "NativeExportUnreadable",
    "NativeSource",
    "RawSeries",
    "RemoteReadRefused",
    "decode_chunked_frames",
    "decode_native_export",
    "encode_read_request",
    "export_native",
    "export_series",
    "remote_read",
    "snappy_literal",
]

#: Prometheus' stale marker (a NaN with this bit pattern): not a sample
STALE_NAN_BITS = 0x7FF0000000000002
_MATCH = {"=": 0, "!=": 1, "=~": 2, "!~": 3}


class RemoteReadRefused(SourceUnavailableError):
    """The store does not answer remote read (VictoriaMetrics, a proxy, read disabled)."""


@dataclass(frozen=True)
class RawSeries:
    """One series: labels (``__name__`` included), sample times (ms) and values."""

    labels: dict[str, str]
    ts_ms: np.ndarray
    values: np.ndarray


# -- request encoding ---------------------------------------------------------------------
def _uvarint(x: int) -> bytes:
    out = bytearray()
    while True:
        b = x & 0x7F
        x >>= 7
        if x:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field_bytes(num: int, payload: bytes) -> bytes:
    return _uvarint(num << 3 | 2) + _uvarint(len(payload)) + payload


def _field_varint(num: int, value: int) -> bytes:
    return _uvarint(num << 3) + _uvarint(value & 0xFFFFFFFFFFFFFFFF)


def snappy_literal(data: bytes) -> bytes:
    """``data`` as a snappy block of literal elements only (no compression: a valid block,
    and no compression library needed)."""
    out = bytearray(_uvarint(len(data)))
    pos = 0
    while pos < len(data):
        n = min(len(data) - pos, 1 << 16)
        if n <= 60:
            out.append((n - 1) << 2)
        else:
            m = n - 1
            nbytes = (m.bit_length() + 7) // 8
            out.append((59 + nbytes) << 2)
            out += m.to_bytes(nbytes, "little")
        out += data[pos:pos + n]
        pos += n
    return bytes(out)


def encode_read_request(queries: Sequence[tuple[int, int, Sequence[tuple[str, str, str]]]],
                        ) -> bytes:
    """A ``ReadRequest`` (protobuf, not yet snappy) of ``queries``: (start ms, end ms,
    matchers as (name, op, value) with op one of ``= != =~ !~``), accepting streamed XOR
    chunks only."""
    body = bytearray()
    for start_ms, end_ms, matchers in queries:
        q = _field_varint(1, start_ms) + _field_varint(2, end_ms)
        for name, op, value in matchers:
            m = (_field_varint(1, _MATCH[op]) if _MATCH[op] else b"") \
                + _field_bytes(2, name.encode()) + _field_bytes(3, value.encode())
            q += _field_bytes(3, m)
        body += _field_bytes(1, q)
    body += _field_varint(2, 1)  # accepted_response_types: STREAMED_XOR_CHUNKS
    return bytes(body)


# -- response decoding --------------------------------------------------------------------
def _kernel() -> Any:
    from gpuaudit.measure.fleet import _xor

    return _xor


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    x = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        x |= (b & 0x7F) << shift
        if b < 0x80:
            return x, pos
        shift += 7


def _labels_of(buf: bytes, start: int, end: int) -> tuple[tuple[str, str], ...]:
    """The ``Label`` fields (1) of one ChunkedSeries message ``buf[start:end]``."""
    out = []
    pos = start
    while pos < end:
        key, pos = _read_varint(buf, pos)
        wire = key & 7
        if wire == 2:
            n, pos = _read_varint(buf, pos)
            if key >> 3 == 1:
                name = value = ""
                p, e = pos, pos + n
                while p < e:
                    k2, p = _read_varint(buf, p)
                    n2, p = _read_varint(buf, p)
                    text = buf[p:p + n2].decode()
                    if k2 >> 3 == 1:
                        name = text
                    elif k2 >> 3 == 2:
                        value = text
                    p += n2
                out.append((name, value))
            pos += n
        elif wire == 0:
            _v, pos = _read_varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            break
    return tuple(out)


_SCAN_ERRORS = {
    -1: "the stream ends inside a frame (truncated answer)",
    -2: "a frame's CRC32-C does not match its bytes (corrupt answer)",
    -3: "a frame is not a ChunkedReadResponse (malformed protobuf)",
    -4: "a chunk is not XOR-encoded (native histograms are not GPU telemetry)",
}


def decode_chunked_frames(buf: bytes, *, where: str,
                          labels_seen: dict[bytes, tuple[tuple[str, str], ...]] | None = None,
                          ) -> list[tuple[int, RawSeries]]:
    """A whole streamed remote-read answer -> (query index, series) in the stream's order;
    a series split over several frames is joined. Errors name ``where``. ``labels_seen``:
    label sets decoded before, by their bytes (a store's answers for successive time
    ranges repeat its series); new ones are added."""
    k = _kernel()
    arr = np.frombuffer(buf, dtype=np.uint8)
    counts = np.zeros(4, dtype=np.int64)
    n_series = max(16, len(buf) // 2048)
    n_chunks = max(64, len(buf) // 64)
    while True:
        series = np.zeros((n_series, 4), dtype=np.int64)
        meta = np.zeros((n_chunks, 6), dtype=np.int64)
        rc = k.scan_frames(arr, series, meta, counts)
        if rc != -5:
            break
        n_series *= 4
        n_chunks *= 4
    if rc:
        raise SourceUnavailableError(
            f"remote read: {_SCAN_ERRORS[rc]} at byte {int(counts[3]):,} of {len(buf):,}",
            where=where, fix="retry; if it persists, check a proxy between gpuaudit and the "
            "store does not alter or cut the answer, or use --fetch pushdown")
    ns, nc = int(counts[0]), int(counts[1])
    meta = meta[:nc]
    per = meta[:, 5]
    off = np.zeros(nc + 1, dtype=np.int64)
    np.cumsum(per, out=off[1:])
    ts = np.empty(int(off[-1]), dtype=np.int64)
    bits = np.empty(int(off[-1]), dtype=np.uint64)
    bad = k.decode_xor(arr, meta, nc, off, ts, bits)
    if bad >= 0:
        raise SourceUnavailableError(
            f"remote read: XOR chunk {bad} ends before its {int(per[bad])} samples do "
            "(corrupt answer)", where=where, fix="retry; or use --fetch pushdown")
    # stale markers out, once over all samples (each chunk's offsets moved to match)
    stale = bits == np.uint64(STALE_NAN_BITS)
    if stale.any():
        off, ts, bits = _without(~stale, off, ts, bits)
    values = bits.view(np.float64)
    # group chunks by series message; consecutive messages with the same labels and query
    # are one series (the server splits a long series over frames): their chunks, and so
    # their samples, lie next to each other in the stream
    out: list[tuple[int, RawSeries]] = []
    bounds = np.searchsorted(meta[:, 0], np.arange(ns + 1))
    prev: tuple[int, tuple[tuple[str, str], ...]] | None = None
    lo = 0
    seen = {} if labels_seen is None else labels_seen
    for i, (a, b, query, lab_end) in enumerate(series[:ns].tolist()):
        if lab_end < 0:  # (labels after the chunks: not a prefix to look up)
            labels = _labels_of(buf, a, b)
        else:
            raw = buf[a:lab_end]
            got = seen.get(raw)
            labels = seen[raw] = _labels_of(buf, a, lab_end) if got is None else got
        key = (query, labels)
        if key != prev:
            if prev is not None:
                hi = int(off[bounds[i]])
                out.append((prev[0], RawSeries(dict(prev[1]), ts[lo:hi], values[lo:hi])))
            prev, lo = key, int(off[bounds[i]])
    if prev is not None:
        hi = int(off[bounds[ns]])
        out.append((prev[0], RawSeries(dict(prev[1]), ts[lo:hi], values[lo:hi])))
    return out


def _without(keep: np.ndarray, at: np.ndarray, *flat: np.ndarray) -> tuple[np.ndarray, ...]:
    """Positions ``at`` (into samples end to end, any shape) moved to where they fall once
    only the samples ``keep`` marks are kept, then each array of ``flat`` with only those
    samples: what leaving stale markers out of an answer does to its series' bounds."""
    kept = np.zeros(keep.shape[0] + 1, dtype=np.int64)
    np.cumsum(keep, out=kept[1:])
    return (kept[at], *(x[keep] for x in flat))


def remote_read(client: PromClient, queries: Sequence[
        tuple[int, int, Sequence[tuple[str, str, str]]]], *,
        labels_seen: dict[bytes, tuple[tuple[str, str], ...]] | None = None,
        ) -> list[tuple[int, RawSeries]]:
    """One remote-read request of ``queries`` (see :func:`encode_read_request`) to the
    store ``client`` reads: (query index, series). A store that does not answer remote
    read with streamed chunks: :class:`RemoteReadRefused`; a corrupt or truncated answer:
    :class:`~gpuaudit.errors.SourceUnavailableError`; both name the store's URL.
    ``labels_seen``: see :func:`decode_chunked_frames`."""
    where = f"{client.url}/api/v1/read"
    body = snappy_literal(encode_read_request(queries))
    resp = client.post_raw("/api/v1/read", content=body, headers={
        "Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
        "X-Prometheus-Remote-Read-Version": "0.1.0"})
    ctype = resp.headers.get("content-type", "")
    if resp.status_code != 200 or "x-streamed-protobuf" not in ctype:
        text = " ".join(resp.text[:200].split()) if "protobuf" not in ctype else ""
        raise RemoteReadRefused(
            f"the store does not answer remote read with streamed XOR chunks (HTTP "
            f"{resp.status_code}, {ctype or 'no content type'}{': ' + text if text else ''})",
            where=where, fix="use --fetch pushdown, or --fetch auto (remote read where a "
            "store answers it, VictoriaMetrics' export, else the pushdown)")
    return decode_chunked_frames(resp.content, where=where, labels_seen=labels_seen)


def export_series(client: PromClient, match: str, start_s: float, end_s: float, *,
                  labels_seen: dict[bytes, dict[str, str]] | None = None,
                  ) -> list[RawSeries]:
    """VictoriaMetrics' ``/api/v1/export`` of the series ``match`` selects in [start, end]
    (labels with ``__name__``, raw samples). A store without it: :class:`RemoteReadRefused`.
    ``labels_seen``: label sets decoded before, by their JSON text (a store's answers for
    successive time ranges repeat its series); new ones are added."""
    where = f"{client.url}/api/v1/export"
    content = _exported(client, "/api/v1/export", match, start_s, end_s, RemoteReadRefused,
                        fix="use --fetch pushdown (export is VictoriaMetrics' API)")
    if not content.strip():
        return []
    got = _scan_export(content, where, labels_seen=labels_seen)
    return got if got is not None else _read_export_json(content, where)


class NativeExportUnreadable(SourceUnavailableError):
    """VictoriaMetrics' native export is not answered, or not in a layout read here (the
    caller reads the JSON export instead)."""


#: a Prometheus metric name (what a native export's MetricName must start with)
_METRIC_NAME = re.compile(rb"[a-zA-Z_:][a-zA-Z0-9_:]*")
_ESCAPED = re.compile(rb"\x00([012])")


def export_native(client: PromClient, match: str, start_s: float, end_s: float, *,
                  labels_seen: dict[bytes, dict[str, str]] | None = None,
                  ) -> list[RawSeries]:
    """The series of :func:`export_series` (the same samples, bit for bit) from
    VictoriaMetrics' ``/api/v1/export/native``: the stored blocks as they are (zstd and
    varint deltas: ~1/30 of the JSON's CPU in the store and ~1/7 of its bytes), decoded by
    compiled loops (:mod:`~gpuaudit.measure.fleet._vmnative`). The format is not
    documented and has changed once (v1.82.0); an answer not read here:
    :class:`NativeExportUnreadable`. ``labels_seen``: label sets decoded before, by their
    MetricName bytes."""
    content = _exported(client, "/api/v1/export/native", match, start_s, end_s,
                        NativeExportUnreadable,
                        fix="nothing to do: its JSON export is read instead")
    return decode_native_export(content, where=f"{client.url}/api/v1/export/native",
                                labels_seen=labels_seen)


def _exported(client: PromClient, path: str, match: str, start_s: float, end_s: float,
              refused: type[SourceUnavailableError], *, fix: str) -> bytes:
    """The body of VictoriaMetrics' export at ``path`` (gzip on the wire) of the series
    ``match`` selects in [start, end]; an answer other than 200: ``refused``."""
    resp = client.post_raw(path, data={
        "match[]": match, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}"}, gzip=True)
    if resp.status_code != 200:
        raise refused(
            f"the store does not answer {path} (HTTP {resp.status_code}: "
            f"{' '.join(resp.text[:200].split())})", where=f"{client.url}{path}", fix=fix)
    return resp.content


def decode_native_export(content: bytes, *, where: str,
                         labels_seen: dict[bytes, dict[str, str]] | None = None,
                         ) -> list[RawSeries]:
    """A whole ``/api/v1/export/native`` answer -> one :class:`RawSeries` per series (its
    blocks joined in the order they came), samples within the answer's time range, stale
    markers left out. Not in a layout read here: :class:`NativeExportUnreadable`."""
    from gpuaudit.measure.fleet import _vmnative as vm

    def unreadable(what: str) -> NativeExportUnreadable:
        return NativeExportUnreadable(
            f"the native export answer is not read here: {what}", where=where,
            fix="nothing to do: its JSON export is read instead (a VictoriaMetrics release "
            "newer than this gpuaudit may have changed the format)")

    if len(content) < 16:
        raise unreadable(f"{len(content)} bytes, shorter than its 16-byte time range")
    buf = np.frombuffer(content, dtype=np.uint8)
    lo_ms, hi_ms = vm.time_range(buf)
    counts = np.zeros(2, dtype=np.int64)
    rc = vm.NOT_LAYOUT
    n_recs = len(content) // 256 + 16
    for layout in (vm.LAYOUT_NEW, vm.LAYOUT_OLD):
        while True:
            recs = np.empty((n_recs, vm.N_COLS), dtype=np.int64)
            rc = vm.scan_blocks(buf, layout, recs, counts)
            if rc != vm.FULL:
                break
            n_recs *= 4
        if rc != vm.NOT_LAYOUT:
            break
    if rc == vm.TRUNCATED:
        raise unreadable(f"it ends inside a block (byte {int(counts[1]):,} of "
                         f"{len(content):,})")
    if rc == vm.NOT_LAYOUT:
        raise unreadable(f"block {int(counts[1])} is in neither known layout")
    if rc == vm.NO_FRAME_SIZE:
        raise unreadable(f"block {int(counts[1])}'s zstd frame does not state its size")
    n = int(counts[0])
    recs = recs[:n]
    # the series of each block, numbered as first met; labels decoded once per MetricName
    seen = {} if labels_seen is None else labels_seen
    number: dict[bytes, int] = {}
    series_of = np.empty(n, dtype=np.int64)
    labels: list[dict[str, str]] = []
    for r, (a, b) in enumerate(recs[:, vm.R_MN_A:vm.R_MN_B + 1].tolist()):
        mn = content[a:b]
        s = number.get(mn)
        if s is None:
            got = seen.get(mn)
            if got is None:
                got = _metric_name_labels(mn)
                if got is None:
                    raise unreadable(f"block {r}'s MetricName does not start with a metric "
                                     f"name ({mn[:40]!r})")
                seen[mn] = got
            s = number[mn] = len(labels)
            labels.append(got)
        series_of[r] = s
    # the zstd fields (a block's timestamps, its values: a frame each, stating its size)
    # inflated end to end by one call over the frames end to end (not a call per frame:
    # each call lets another thread take the interpreter, ~30k times per store and week)
    stated = recs[:, [vm.R_TS_RAW, vm.R_V_RAW]].ravel()  # (-1: not a frame)
    sizes = np.maximum(stated, 0)
    ends = np.cumsum(sizes)
    raw_at = (ends - sizes).reshape(n, 2)
    raw = np.empty(0, dtype=np.uint8)
    if n and ends[-1]:
        import pyarrow as pa

        framed = recs[:, [vm.R_TS_N, vm.R_V_N]].ravel()[stated >= 0]
        packed = np.empty(int(framed.sum()), np.uint8)
        vm.gather_frames(buf, recs, packed)
        try:
            raw = np.frombuffer(pa.Codec("zstd").decompress(
                packed, decompressed_size=int(ends[-1])), dtype=np.uint8)
        except OSError as exc:
            raise unreadable(f"a zstd frame: {exc}") from exc
    order = np.argsort(series_of, kind="stable")
    ts = np.empty(int(recs[:, vm.R_ROWS].sum()), dtype=np.int64)
    vals = np.empty(ts.shape[0], dtype=np.float64)
    bounds = np.zeros(len(labels) + 1, dtype=np.int64)
    k = vm.decode_blocks(buf, raw, raw_at, recs, order, series_of, lo_ms, hi_ms, ts, vals,
                         bounds)
    if k < 0:
        raise unreadable(f"block {-k - 1}'s bytes do not hold its "
                         f"{int(recs[-k - 1, vm.R_ROWS])} rows")
    out = []
    for s, got in enumerate(labels):
        a, b = int(bounds[s]), int(bounds[s + 1])
        if b > a:
            out.append(RawSeries(dict(got), ts[a:b], vals[a:b]))
    return out


def _metric_name_labels(mn: bytes) -> dict[str, str] | None:
    """VictoriaMetrics' marshalled MetricName (``lib/storage/metric_name.go``: the metric
    name, then key and value, each ended by byte 1, bytes 0, 1 and 2 escaped as 0 then
    '0', '1', '2') as labels with ``__name__``, as the JSON export writes them; None when
    it does not start with a metric name (a cluster's tenant prefix, another format)."""
    parts = mn.split(b"\x01")
    if len(parts) % 2 or parts[-1] or not _METRIC_NAME.fullmatch(parts[0]):
        return None
    if b"\x00" in mn:
        parts = [_ESCAPED.sub(lambda m: bytes((m[1][0] - 48,)), p) for p in parts]
    text = [p.decode("utf-8", "replace") for p in parts[:-1]]
    return {"__name__": text[0], **dict(zip(text[1::2], text[2::2]))}


def _scan_export(content: bytes, where: str, *,
                 labels_seen: dict[bytes, dict[str, str]] | None = None,
                 ) -> list[RawSeries] | None:
    """The export answer read by the compiled scan (:mod:`~gpuaudit.measure.fleet._export`);
    None when it is not of the shape that scan reads (then a general JSON reader does).
    ``labels_seen``: see :func:`export_series`."""
    import json

    from gpuaudit.measure.fleet import _export

    buf = np.frombuffer(content, dtype=np.uint8)
    counts = np.zeros(4, dtype=np.int64)
    n_lines, n_samples, n_slow = len(content) // 256 + 16, len(content) // 16 + 16, 64
    while True:
        lines = np.empty((n_lines, 4), dtype=np.int64)
        vals = np.empty(n_samples, dtype=np.float64)
        ts = np.empty(n_samples, dtype=np.int64)
        slow = np.empty((n_slow, 3), dtype=np.int64)
        rc = _export.scan_export(buf, lines, vals, ts, slow, counts)
        if rc != _export.FULL:
            break
        n_lines, n_samples, n_slow = 4 * n_lines, 4 * n_samples, 64 * n_slow
    if rc == _export.COUNTS_DIFFER:
        raise _counts_differ(where)
    if rc:
        return None
    for j, a, b in slow[:int(counts[2])].tolist():
        vals[j] = float(content[a:b])
    spans = lines[:int(counts[0])]
    ns = int(counts[1])
    stale = np.isnan(vals[:ns])  # (the scan reads only a stale marker as NaN)
    gone = np.zeros(spans.shape[0], dtype=bool)
    if stale.any():  # left out, as the native export's and remote read's answers are read
        now, ts, vals = _without(~stale, spans[:, 2:], ts[:ns], vals[:ns])
        # (a series of stale markers only is no series, as the native export has it)
        gone = (now[:, 0] == now[:, 1]) & (spans[:, 2] < spans[:, 3])
        spans = np.concatenate([spans[:, :2], now], axis=1)
    labels_of = {} if labels_seen is None else labels_seen  # a series' labels decoded once
    out = []
    for (a, b, lo, hi), skip in zip(spans.tolist(), gone.tolist()):
        if skip:
            continue
        text = content[a:b]
        labels = labels_of.get(text)
        if labels is None:
            labels = labels_of[text] = {k: v for k, v in json.loads(text).items()
                                        if v is not None}
        out.append(RawSeries(dict(labels), ts[lo:hi], vals[lo:hi]))
    return out


def _counts_differ(where: str) -> SourceUnavailableError:
    return SourceUnavailableError(
        "the export answer has a series whose values and timestamps differ in number",
        where=where, fix="retry; if it persists, use --fetch pushdown")


def _read_export_json(content: bytes, where: str) -> list[RawSeries]:
    """The export answer read by pyarrow's JSON reader (any JSON lines of that schema)."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema([("values", pa.list_(pa.float64())),
                        ("timestamps", pa.list_(pa.int64()))])
    try:
        table = pj.read_json(io.BytesIO(content), parse_options=pj.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="infer"),
            read_options=pj.ReadOptions(block_size=8 << 20))
    except pa.ArrowInvalid as exc:
        raise SourceUnavailableError(
            f"the export answer is not JSON lines of series: {str(exc)[:200]}", where=where,
            fix="check the URL is VictoriaMetrics' (or use --fetch pushdown)") from exc
    metric = table.column("metric").combine_chunks()
    names = [f.name for f in metric.type]
    cols = [metric.field(i).to_pylist() for i in range(len(names))]
    values = table.column("values").combine_chunks()
    stamps = table.column("timestamps").combine_chunks()
    voff = values.offsets.to_numpy()
    if values.null_count or stamps.null_count or stamps.values.null_count or \
            not np.array_equal(voff, stamps.offsets.to_numpy()):
        raise _counts_differ(where)
    vflat = values.values.to_numpy(zero_copy_only=False)
    tflat = stamps.values.to_numpy(zero_copy_only=False)
    out = []
    gone = np.zeros(table.num_rows, dtype=bool)
    if values.values.null_count:  # stale markers (null): left out, as the scan leaves them
        now, vflat, tflat = _without(values.values.is_valid().to_numpy(zero_copy_only=False),
                                     voff, vflat, tflat)
        gone = (now[1:] == now[:-1]) & (voff[1:] > voff[:-1])
        voff = now
    for i in range(table.num_rows):
        if gone[i]:
            continue
        labels = {n: c[i] for n, c in zip(names, cols) if c[i] is not None}
        a, b = int(voff[i]), int(voff[i + 1])
        out.append(RawSeries(labels, tflat[a:b], vflat[a:b]))
    return out


#: the forms a store's raw samples are read in
FORMS = ("remote-read", "export")


def probe_form(client: PromClient) -> str | None:
    """The native form the store ``client`` reads answers: ``remote-read`` (Prometheus,
    Mimir), else ``export`` (VictoriaMetrics), else None. Asks for a 1 ms range (no
    samples move)."""
    try:
        remote_read(client, [(0, 1, [("__name__", "=", "gpuaudit_probe")])])
        return "remote-read"
    except RemoteReadRefused:
        pass
    try:
        export_series(client, '{__name__="gpuaudit_probe"}', 0.0, 0.001)
        return "export"
    except RemoteReadRefused:
        return None


def window_left_open(client: PromClient, form: str | None) -> bool | None:
    """Whether the store's range windows leave their left edge out (``(t - w, t]``:
    VictoriaMetrics, Prometheus 3) or keep it (``[t - w, t]``: Prometheus 2), which decides
    which sample a step's window holds; None where the store's answer says neither (its
    subqueries are then left to it). A remote-read store is asked how many points the
    subquery ``vector(1)[2s:1s]`` has at a whole second: 3 (edge kept) or 2 (left out)."""
    if form == "export":  # VictoriaMetrics: (t - w, t]
        return True
    if form != "remote-read":
        return None
    try:
        got = client.query("count_over_time(vector(1)[2s:1s])", 1_700_000_000.0)
    except (InputError, SourceUnavailableError):
        return None
    counts = {v for _labels, v in got}
    if counts == {3.0}:
        return False
    if counts == {2.0}:
        return True
    return None


class RawUtilReader:
    """A store's raw ``DCGM_FI_DEV_GPU_UTIL`` samples in its native form, for the pushdown
    to answer the utilization view's subqueries itself (:class:`gpuaudit.classify.pushdown.RawUtil`:
    the store streams stored chunks instead of evaluating PromQL per point)."""

    def __init__(self, client: PromClient, form: str, *, step_s: float,
                 matchers: Mapping[str, str] | None, left_open: bool,
                 names: tuple[str, ...], edges_before: int = 0) -> None:
        self.left_open = left_open
        self.names = names  # the queries the pushdown answers from these samples
        self.edges_before = edges_before  # steps before a chunk its edge forms see
        self._step_s = step_s
        # its label caches are dicts the query threads share: a race decodes a set twice
        self._source = NativeSource(client, form, start_s=0.0, end_s=0.0, step_s=step_s,
                                    matchers=matchers, metrics=("DCGM_FI_DEV_GPU_UTIL",))

    def samples(self, a_s: float, b_s: float
                ) -> list[tuple[Mapping[str, str], np.ndarray, np.ndarray]]:
        """Every util series with its samples in (a - (2 + edges_before) step, b + step),
        stale markers out."""
        got = self._source.fetch(a_s - self.edges_before * self._step_s, b_s)
        return [(s.labels, s.ts_ms, s.values) for s in got]


def on_grid(series: Sequence[RawSeries], start_ms: int, step_ms: int, n_steps: int,
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every series' samples on the step grid ``start_ms + k * step_ms`` (k < ``n_steps``)
    as a range query of ``last_over_time(x[step - 1ms])`` reads them: a sample at t belongs
    to the first step at or after it, the latest sample of a step wins, samples outside
    the grid are dropped. Returns (series index, step k, value) of each kept point, in
    series then step order."""
    if not series:
        z = np.zeros(0, np.int64)
        return z, z, np.zeros(0)
    return _on_grid_joined(*_joined(series), start_ms, step_ms, n_steps)


def _on_grid_joined(ts: np.ndarray, val: np.ndarray, bounds: np.ndarray, start_ms: int,
                    step_ms: int, n_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`on_grid` of series already end to end (:func:`_joined`)."""
    kern = _kernel()
    sid, k, out = (np.empty(ts.shape[0], np.int64), np.empty(ts.shape[0], np.int64),
                   np.empty(ts.shape[0]))
    n = kern.grid_points(ts, val, bounds, start_ms, step_ms, n_steps, sid, k, out)
    if n < 0:  # not in time order within a series (several export lines): sort
        order = np.lexsort((ts, np.repeat(np.arange(bounds.shape[0] - 1), np.diff(bounds))))
        ts, val = ts[order], val[order]
        n = kern.grid_points(ts, val, bounds, start_ms, step_ms, n_steps, sid, k, out)
    return sid[:n], k[:n], out[:n]


def _joined(series: Sequence[RawSeries]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The series' times and values end to end, and where each series starts (and the
    last ends)."""
    bounds = np.zeros(len(series) + 1, dtype=np.int64)
    np.cumsum([s.ts_ms.shape[0] for s in series], out=bounds[1:])
    ts = np.concatenate([s.ts_ms for s in series]).astype(np.int64, copy=False) \
        if series else np.zeros(0, np.int64)
    val = np.concatenate([s.values for s in series]).astype(np.float64, copy=False) \
        if series else np.zeros(0)
    return ts, val, bounds


def _spans(series: Sequence[RawSeries],
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The series as spans of the arrays they were decoded into (one answer's: every
    series a view of the same times and the same values), with no copy: (times, values,
    each series' start, its end); None when they are not views of one pair of arrays."""
    if not series:
        return None
    t0, v0 = series[0].ts_ms.base, series[0].values.base
    if not (isinstance(t0, np.ndarray) and isinstance(v0, np.ndarray) and t0.ndim == 1
            and v0.ndim == 1 and t0.dtype.itemsize == 8 and v0.dtype.itemsize == 8
            and t0.flags.c_contiguous and v0.flags.c_contiguous
            and t0.shape == v0.shape):
        return None
    ts, val = t0.view(np.int64), v0.view(np.float64)
    at_t, at_v = ts.ctypes.data, val.ctypes.data
    n = len(series)
    starts = np.empty(n, dtype=np.int64)
    ends = np.empty(n, dtype=np.int64)
    for j, s in enumerate(series):
        if s.ts_ms.base is not t0 or s.values.base is not v0 or s.ts_ms.dtype != np.int64 \
                or s.values.dtype != np.float64 or s.ts_ms.strides != (8,) \
                or s.values.strides != (8,):
            return None
        a = (s.ts_ms.ctypes.data - at_t) >> 3
        if (s.values.ctypes.data - at_v) >> 3 != a:
            return None
        starts[j], ends[j] = a, a + s.ts_ms.shape[0]
    return ts, val, starts, ends


def _grid_join(ids: Sequence[Any], series: Sequence[RawSeries], code_of: np.ndarray,
               metric_of: np.ndarray, metrics: Sequence[str], start_ms: int, step_ms: int,
               n_steps: int, *, where: str,
               lean: tuple[Sequence[Mapping[str, str]], Sequence[str]] | None = None,
               ) -> tuple[Any, list[Any]]:
    """:func:`on_grid` then :func:`_dense_join` of series ``series`` (series j of code
    ``code_of[j]``, metric index ``metric_of[j]``), in one compiled pass when every
    series' times ascend (``_xor.grid_cells``: no per-point arrays), else in those two
    steps."""
    from gpuaudit.measure.fleet.dcgm import UTIL_METRICS

    start_ns, step_ns = start_ms * 1_000_000, step_ms * 1_000_000
    is_util = np.array([m in UTIL_METRICS for m in metrics], dtype=bool)
    spans = _spans(series)
    joined = None
    if spans is None:
        joined = ts, val, bounds = _joined(series)
        spans = ts, val, bounds[:-1], bounds[1:]
    ok, present, rows, grid, has = _kernel().grid_cells(
        *spans, code_of, metric_of, len(ids), start_ms, step_ms, n_steps, is_util)
    if not ok or present.shape[0] == 0:  # (no point at all: as _dense_join has it)
        sidx, k, v = _on_grid_joined(*(joined or _joined(series)), start_ms, step_ms,
                                     n_steps)
        return _dense_join(ids, code_of[sidx], metric_of[sidx], k, v, metrics, start_ns,
                           step_ns, n_steps, where=where, lean=lean)
    return _rows_table(ids, present, rows, grid, has, metrics, start_ns, step_ns, n_steps,
                       where=where, lean=lean)


class NativeSource:
    """dcgm-exporter series read raw in the store's native form (:func:`remote_read`,
    :func:`export_series`), as a :class:`~gpuaudit.schema.SampleSource` whose rows are
    those of :class:`~gpuaudit.measure.fleet.prometheus.PrometheusSource` (``query_range``
    of ``last_over_time(<metric>[step - 1ms])``): the same chunks, the same steps (see
    :func:`on_grid`), the same join. The store decodes nothing and evaluates no PromQL;
    the next chunk is fetched while this one is joined."""

    source = "prometheus"

    def __init__(self, client: PromClient, form: str, *, start_s: float, end_s: float,
                 step_s: float, matchers: Mapping[str, str] | None = None,
                 metrics: Sequence[str] | None = None, chunk_points: int = 2880) -> None:
        from gpuaudit.measure.fleet.prometheus import MAX_POINTS_PER_SERIES, RAW_METRICS
        from gpuaudit.promql import selector

        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        self.client, self.form = client, form
        self.start_s, self.end_s, self.step_s = start_s, end_s, step_s
        self.matchers = dict(matchers or {})
        selector(self.matchers)  # label names checked
        self.metrics = tuple(metrics or RAW_METRICS)
        self.chunk_points = min(chunk_points, MAX_POINTS_PER_SERIES)
        self.interval_s: float | None = step_s
        self._notes: list[Any] = []
        # a series' labels decoded once across the chunks' answers (by their bytes)
        self._labels_seen: dict[bytes, tuple[tuple[str, str], ...]] = {}
        self._export_labels: dict[bytes, dict[str, str]] = {}
        self._block_labels: dict[bytes, dict[str, str]] = {}
        self._blocks = form == "export"

    @property
    def origin(self) -> str:
        """Where and how the samples are read (the native export's blocks, or, after the
        store refused them, its JSON export)."""
        how = "remote read, XOR chunks" if self.form == "remote-read" else \
            f"export, {'native blocks' if self._blocks else 'JSON'}"
        return f"Prometheus {self.client.url} (raw samples, {how}; step {self.step_s:g} s)"

    @property
    def notes(self) -> tuple[Any, ...]:
        return tuple(self._notes)

    @property
    def events(self) -> tuple[str, ...]:
        return ()

    def fetch(self, a_s: float, b_s: float) -> list[RawSeries]:
        """Raw samples of every metric in (a - step, b], asked with a step's margin on
        either side (VictoriaMetrics' export leaves out a sample at exactly ``end``; whole
        stored chunks reach past it anyway: :func:`on_grid` trims)."""
        step_ms = round(self.step_s * 1000)
        a_ms, b_ms = round(a_s * 1000) - 2 * step_ms, round(b_s * 1000) + step_ms
        names = "|".join(self.metrics)
        if self.form == "remote-read":
            m = [("__name__", "=~", names), *((k, "=", v) for k, v in
                                              sorted(self.matchers.items()))]
            return [s for _q, s in remote_read(self.client, [(a_ms, b_ms, m)],
                                                labels_seen=self._labels_seen)]
        from gpuaudit.promql import escape_label_value

        sel = ",".join([f'__name__=~"{escape_label_value(names)}"',
                        *(f'{k}="{escape_label_value(v)}"'
                          for k, v in sorted(self.matchers.items()))])
        match = "{" + sel + "}"
        if self._blocks:  # the native export's blocks, while the store answers them
            try:
                return export_native(self.client, match, a_ms / 1000, b_ms / 1000,
                                     labels_seen=self._block_labels)
            except NativeExportUnreadable as exc:
                from gpuaudit.schema import ImportNote

                self._blocks = False
                self._notes.append(ImportNote(
                    f"{exc.what}; read its JSON export (the same samples, ~30x the "
                    "store's CPU)", 1, where=exc.where))
        return export_series(self.client, match, a_ms / 1000, b_ms / 1000,
                             labels_seen=self._export_labels)

    def batches(self) -> Iterator[Any]:
        for table in self._tables(None, ()):
            yield from table.to_batches()

    def lean_batches(self, resolve: Callable[[Any], Mapping[str, str]],
                     label_keys: Sequence[str]) -> Iterator[Any]:
        """The rows of :meth:`batches` in the lean layout classify's engine reads
        (:func:`~gpuaudit.measure.fleet.dcgm.lean_columns`): identities per series, not per
        row. ``resolve``: a series' (:class:`~gpuaudit.schema.SeriesId`) labels with its
        attribution (what :func:`~gpuaudit.price.attribution.attribute_table` puts in each
        row's map); ``label_keys``: the keys read from them (``--by team``: ``team``), a
        ``label:<key>`` column each. The batch's schema metadata lists the label keys its
        series carry (:data:`~gpuaudit.series.LEAN_LABEL_KEYS`)."""
        for table in self._tables(resolve, tuple(label_keys)):
            yield from table.to_batches()

    def _tables(self, resolve: Callable[[Any], Mapping[str, str]] | None,
                label_keys: tuple[str, ...]) -> Iterator[Any]:
        import bisect
        import concurrent.futures as cf

        from gpuaudit.measure.fleet.dcgm import SeriesId, series_id
        from gpuaudit.measure.fleet.prometheus import attach_host_cpu, node_cpu_by_host
        from gpuaudit.promql import NODE_CPU, time_chunks
        from gpuaudit.schema import ImportNote

        chunks = time_chunks(self.start_s, self.end_s, self.step_s, self.chunk_points)
        has_cpu = bool(self.client.label_names(NODE_CPU, self.start_s, self.end_s))
        unmatched: set[str] = set()
        advance = self.client.progress("raw pull", len(chunks)) \
            if self.client.progress else None
        ids: list[SeriesId] = []
        id_index: dict[SeriesId, int] = {}
        resolved: list[Mapping[str, str]] = []  # per series, when lean
        known: dict[tuple[tuple[str, str], ...], tuple[int, int]] = {}  # labels -> codes
        ranks: dict[tuple[tuple[str, str], ...], tuple[Any, ...]] = {}  # labels -> sort key
        ordered: list[tuple[Any, ...]] = []  # the sort keys met, in order
        place: dict[tuple[Any, ...], int] = {}  # a sort key's place in ordered
        step_ms = round(self.step_s * 1000)
        where = f"{self.client.url}"
        order = {m: i for i, m in enumerate(self.metrics)}
        refused: list[tuple[float, str]] = []  # chunks the store would not stream
        with cf.ThreadPoolExecutor(1) as pool:
            ahead = pool.submit(self.fetch, *chunks[0]) if chunks else None
            for i, (a, b) in enumerate(chunks):
                assert ahead is not None
                try:
                    got = ahead.result()
                except SourceUnavailableError as exc:  # (after the client's retries)
                    refused.append((a, exc.what))
                    got = self._fetch_range(a, b)
                ahead = pool.submit(self.fetch, *chunks[i + 1]) if i + 1 < len(chunks) \
                    else None
                n_steps = round((b - a) / self.step_s) + 1
                # as the raw pull: per metric (in RAW_METRICS order), series by series in
                # the order of their label sets (Prometheus answers in it; VictoriaMetrics'
                # export in whatever order its search finishes, which would otherwise
                # number the series, and list the report's patterns, differently per run)
                # (a label set's sort key made once: later chunks repeat the series)
                keyed = []
                for s in got:
                    rank = ranks.get(key := tuple(s.labels.items()))
                    if rank is None:
                        name = s.labels.get("__name__")
                        rank = ranks[key] = (order[name], tuple(sorted(key))) \
                            if name in order else ()
                    if rank:
                        keyed.append((rank, key, s))
                # sorted by each key's place among the keys met so far (new ones put in
                # place once) rather than comparing the keys' label pairs in every chunk
                fresh = {r for r, _k, _s in keyed if r not in place}
                if fresh:
                    for r in sorted(fresh):
                        bisect.insort(ordered, r)
                    place = {r: i for i, r in enumerate(ordered)}
                keyed.sort(key=lambda x: place[x[0]])
                got = [s for _r, _k, s in keyed]
                # each series' code (its identity without __name__), then the rows of
                # _join_chunk (steps carrying GPU_UTIL or GR_ENGINE_ACTIVE, every metric's
                # value or NaN) from a dense (code, step) grid instead of a sort
                code_of = np.empty(len(got), dtype=np.int64)
                metric_of = np.empty(len(got), dtype=np.int64)
                for j, (_r, key, s) in enumerate(keyed):
                    # a series' labels are decoded once (later chunks: a dictionary hit)
                    hit = known.get(key)
                    if hit is None:
                        labels = {k2: v for k2, v in s.labels.items() if k2 != "__name__"}
                        metric = s.labels["__name__"]
                        sid = series_id(labels, default_host="unknown",
                                        where=f"{where}: {metric}")
                        code = id_index.get(sid)
                        if code is None:
                            code = id_index[sid] = len(ids)
                            ids.append(sid)
                            if resolve is not None:
                                resolved.append(resolve(sid))
                        hit = known[key] = (code, order[metric])
                    code_of[j], metric_of[j] = hit
                lean = None if resolve is None else (resolved, label_keys)
                table, notes = _grid_join(ids, got, code_of, metric_of, self.metrics,
                                          round(a * 1000), step_ms, n_steps, where=where,
                                          lean=lean)
                self._notes.extend(notes)
                if has_cpu and table.num_rows:
                    cpu = node_cpu_by_host(self.client, a, b, self.step_s)
                    table = attach_host_cpu(table, cpu, unmatched)
                if advance:
                    advance(1)
                if table.num_rows:
                    yield table
        if unmatched:
            self._notes.append(ImportNote(
                f"host CPU: no node_exporter {NODE_CPU} series matches host(s) "
                f"{', '.join(sorted(unmatched)[:5])}{' ...' if len(unmatched) > 5 else ''} "
                "(by node_uname_info nodename or instance address); their CPU is null",
                len(unmatched), where=f"{self.client.url}: {NODE_CPU}",
                column="host_cpu_util_pct"))
        if refused:
            from gpuaudit.units import chunks_starting

            which = chunks_starting([a for a, _why in refused])
            self._notes.append(ImportNote(
                f"the store would not stream the raw samples of {which} (the first: "
                f"{refused[0][1]}): read through query_range instead (the same rows, more of "
                "the store's CPU)", len(refused), where=self.client.url))

    def _fetch_range(self, a_s: float, b_s: float) -> list[RawSeries]:
        """The chunk [a, b] as :meth:`fetch` gives it, from ``query_range`` of
        ``last_over_time(<metric>[step - 1ms])`` (the raw pull's query): one point per step
        at the step's time, which :func:`on_grid` puts on that very step."""
        from gpuaudit.promql import fresh, selector

        sel = selector(self.matchers)
        out = []
        for metric in self.metrics:
            for part in self.client.query_range(fresh(f"{metric}{sel}", self.step_s), a_s, b_s,
                                                self.step_s):
                out += [RawSeries({"__name__": metric, **r.labels}, r.ts_ns // 1_000_000,
                                  r.values) for r in part]
        return out


class LeanSamples:
    """Lean batches held in memory (:meth:`NativeSource.lean_batches`, several stores'
    one after another) as the source classify reads: re-readable, its time span known up
    front (so the timeline is folded into the one pass, as for a sample table)."""

    rereadable = True

    def __init__(self, batches: Sequence[Any], *, origin: str, interval_s: float | None,
                 notes: Sequence[Any] = (), source: str = "prometheus") -> None:
        self._batches = [b for b in batches if b.num_rows]
        self.source, self.origin, self.interval_s = source, origin, interval_s
        self._notes = tuple(notes)
        self.num_rows = sum(b.num_rows for b in self._batches)
        lo = [int(b.column("ts").cast("int64").to_numpy().min()) for b in self._batches]
        hi = [int(b.column("ts").cast("int64").to_numpy().max()) for b in self._batches]
        self.ts_range_ns = (min(lo), max(hi)) if lo else None

    @property
    def notes(self) -> tuple[Any, ...]:
        return self._notes

    @property
    def events(self) -> tuple[str, ...]:
        return ()

    def batches(self) -> Iterator[Any]:
        return iter(self._batches)


def _dense_join(ids: Sequence[Any], code: np.ndarray, metric: np.ndarray, k: np.ndarray,
                val: np.ndarray, metrics: Sequence[str], start_ns: int, step_ns: int,
                n_steps: int, *, where: str,
                lean: tuple[Sequence[Mapping[str, str]], Sequence[str]] | None = None,
                ) -> tuple[Any, list[Any]]:
    """The rows :func:`~gpuaudit.measure.fleet.prometheus._join_chunk` builds from the same
    points (series ``code``, ``metric`` index, step ``k``, value): one row per (code, step)
    where GPU_UTIL or GR_ENGINE_ACTIVE has a point, in (code, step) order, each metric's
    value or NaN; put on a dense grid of the chunk's codes x steps (no sort)."""
    from gpuaudit.measure.fleet.dcgm import UTIL_METRICS, series_table

    if code.shape[0] == 0:
        out: tuple[Any, list[Any]] = series_table(
            [], np.zeros(0, np.int64), np.zeros(0, np.int64), {}, where=where, lean=lean)
        return out
    seen = np.bincount(code, minlength=len(ids)) > 0
    present = np.flatnonzero(seen)
    local = (np.cumsum(seen) - 1)[code]
    is_util = np.array([m in UTIL_METRICS for m in metrics], dtype=bool)
    rows, grid, has = _kernel().dense_rows(local, k, metric, val, n_steps,
                                           present.shape[0], is_util)
    return _rows_table(ids, present, rows, grid, has, metrics, start_ns, step_ns, n_steps,
                       where=where, lean=lean)


def _rows_table(ids: Sequence[Any], present: np.ndarray, rows: np.ndarray, grid: np.ndarray,
                has: np.ndarray, metrics: Sequence[str], start_ns: int, step_ns: int,
                n_steps: int, *, where: str,
                lean: tuple[Sequence[Mapping[str, str]], Sequence[str]] | None = None,
                ) -> tuple[Any, list[Any]]:
    """The sample table of a chunk's joined rows: row r is code ``present[rows[r] //
    n_steps]`` at step ``rows[r] % n_steps``, metric i's values ``grid[i]`` (those with
    ``has[i]``)."""
    from gpuaudit.measure.fleet.dcgm import series_table

    values = {m: grid[i] for i, m in enumerate(metrics) if has[i]}
    codes = present[rows // n_steps]
    ts_ns = start_ns + (rows % n_steps) * step_ns
    out = series_table(ids, codes, ts_ns.astype(np.int64), values, where=where, lean=lean)
    return out
