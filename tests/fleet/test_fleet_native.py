"""``--fetch native``: raw samples in each store's native form (Prometheus' remote read of
the stored XOR chunks, VictoriaMetrics' ``/api/v1/export``), classified here. The figures
are the raw pull's and the pushdown's (real Prometheus and VictoriaMetrics on 127.0.0.1);
the XOR decoder equals an encoder written from ``tsdb/chunkenc/xor.go``; a store that
refuses remote read, a corrupt frame and a truncated stream are clear errors naming it."""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
from fleetgen import Fleet, backfill, import_victoria_metrics, run_prometheus, run_victoria_metrics
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.api import audit_fleet
from gpuaudit.cli import main
from gpuaudit.errors import InputError, SourceUnavailableError
from gpuaudit.measure.fleet.native import (
    decode_chunked_frames,
    encode_read_request,
    remote_read,
    snappy_literal,
)
from gpuaudit.measure.fleet.prometheus import PromClient

TEAMS = Path(__file__).parents[1] / "data" / "fleet" / "teams.toml"
PHASE_FIELDS = ("idle_s", "underutilized_s", "productive_s", "compute_bound_s", "gap_s",
                "samples")


@pytest.fixture(scope="module")
def split(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The fleet's first and last node in a Prometheus, the middle one (with the MIG GPU)
    in VictoriaMetrics."""
    hosts = fleet.hosts()
    a = fleet.subset({hosts[0], hosts[2]})
    b = fleet.subset({hosts[1]})
    root = tmp_path_factory.mktemp("native")
    backfill(a, root / "prom")
    with run_prometheus(root / "prom") as prom_url, run_victoria_metrics(root / "vm") as vm_url:
        import_victoria_metrics(b, vm_url, root / "import")
        yield prom_url, vm_url


def _audit(stores: object, fleet: Fleet, **kw: object):  # type: ignore[no-untyped-def]
    return audit_fleet(prometheus=stores, start_s=fleet.start_s, end_s=fleet.end_s,  # type: ignore[arg-type]
                       step_s=fleet.step_s, by=("team",), map_file=TEAMS,
                       pricing={"price": "1.37"}, **kw)  # type: ignore[arg-type]


def _cells(report) -> dict[tuple[str, str], dict[str, float]]:  # type: ignore[no-untyped-def]
    return {(c["gpu_uuid"], c["label:team"]): c for c in report.usage.cells.to_pylist()}


def _same(mine, theirs, fields=PHASE_FIELDS, per_team=True) -> None:  # type: ignore[no-untyped-def]
    a, b = _cells(mine), _cells(theirs)
    assert a.keys() == b.keys()
    for key, cell in b.items():
        for f in fields:  # sums of steps, added in another order: to 1e-9 s
            assert a[key][f] == pytest.approx(cell[f], rel=1e-12, abs=1e-9), (key, f)
        # readings kept as float32 in the sample table (MIG's 100 x ratio) vs float64 sums
        assert a[key]["busy_s"] == pytest.approx(cell["busy_s"], rel=1e-6), key
    if per_team:
        sa = {e["group"]["team"]: e for e in mine.extra["fleet"]["showback"]}
        sb = {e["group"]["team"]: e for e in theirs.extra["fleet"]["showback"]}
        assert sa.keys() == sb.keys() and {"vision", "nlp", "recsys"} <= set(sa)
        for team in sb:
            assert sa[team]["cost_usd"] == sb[team]["cost_usd"], team
            assert sa[team]["gpu_hours"] == sb[team]["gpu_hours"], team
            assert sa[team]["phase_hours"] == sb[team]["phase_hours"], team
    ta, tb = mine.extra["fleet"]["total"], theirs.extra["fleet"]["total"]
    for f in ("cost_usd", "gpu_hours", "phase_hours"):
        assert ta[f] == tb[f], f


#: the pushdown puts a GPU's unobserved time (gap) into the cell its edge queries see, the
#: raw pull into the cell of the row before the gap: where a pod switches at a gap the two
#: split the same seconds (and their dollars) between two cells differently. Every cell's
#: phases and samples, and the fleet's totals, are the same.
VS_PUSHDOWN = {"fields": (*PHASE_FIELDS[:4], "samples"), "per_team": False}


def test_native_fetch_gives_the_raw_pull_and_the_pushdown_figures(prom: str,
                                                                  fleet: Fleet) -> None:
    native = _audit(prom, fleet, fetch="native")
    tr = native.extra["fleet"]["transfer"]
    assert tr["mode"] == "native raw samples"
    assert [s["form"] for s in tr["stores"]] == ["remote-read"]
    _same(native, _audit(prom, fleet, raw=True))
    _same(native, _audit(prom, fleet), **VS_PUSHDOWN)


def test_native_fetch_over_prometheus_and_victoriametrics_audits_as_one_store(
        prom: str, split: tuple[str, str], fleet: Fleet) -> None:
    two = _audit([f"eu={split[0]}", f"us={split[1]}"], fleet, fetch="auto")
    tr = two.extra["fleet"]["transfer"]
    assert [(s["name"], s["form"]) for s in tr["stores"]] == [("eu", "remote-read"),
                                                              ("us", "export")]
    assert all(s["wire_bytes"] > 0 for s in tr["stores"])
    _same(two, _audit(prom, fleet, fetch="native"))
    _same(two, _audit(prom, fleet), **VS_PUSHDOWN)


def test_cli_fetch_flag(prom: str, fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["fleet", "--prometheus", prom, "--start", str(fleet.start_s), "--end",
            str(fleet.end_s), "--step", "15s", "--format", "json", "-o", str(out), "--no-progress"]
    assert main([*args, "--fetch", "native"]) == 0
    import json

    doc = json.loads(out.read_text())
    assert doc["extra"]["fleet"]["transfer"]["mode"] == "native raw samples"
    assert main([*args, "--fetch", "native", "--raw"]) == 2


# -- the XOR chunk format, from tsdb/chunkenc/xor.go --------------------------------------
class _Bits:
    def __init__(self) -> None:
        self.bits: list[int] = []

    def write(self, value: int, n: int) -> None:
        self.bits += [(value >> (n - 1 - i)) & 1 for i in range(n)]

    def write_bytes(self, data: bytes) -> None:
        for b in data:
            self.write(b, 8)

    def tobytes(self) -> bytes:
        bits = self.bits + [0] * (-len(self.bits) % 8)
        return bytes(int("".join(map(str, bits[i:i + 8])), 2) for i in range(0, len(bits), 8))


def _uvarint(x: int) -> bytes:
    out = bytearray()
    while True:
        if x < 0x80:
            out.append(x)
            return bytes(out)
        out.append(x & 0x7F | 0x80)
        x >>= 7


def _bit_range(x: int, n: int) -> bool:
    return -((1 << (n - 1)) - 1) <= x <= 1 << (n - 1)


def xor_chunk(ts: list[int], vals: list[float]) -> bytes:
    """Prometheus' xorAppender.Append, sample by sample."""
    b = _Bits()
    t_prev = t_delta = 0
    v_prev = 0.0
    leading, trailing = 0xFF, 0
    for i, (t, v) in enumerate(zip(ts, vals)):
        if i == 0:
            zz = (t << 1) & (2**64 - 1)
            b.write_bytes(_uvarint(zz if t >= 0 else ~zz & (2**64 - 1)))
            b.write(struct.unpack(">Q", struct.pack(">d", v))[0], 64)
        else:
            d = t - t_prev
            if i == 1:
                b.write_bytes(_uvarint(d))
            else:
                dod = d - t_delta
                if dod == 0:
                    b.write(0, 1)
                elif _bit_range(dod, 14):
                    b.write(0b10, 2)
                    b.write(dod & (2**14 - 1), 14)
                elif _bit_range(dod, 17):
                    b.write(0b110, 3)
                    b.write(dod & (2**17 - 1), 17)
                elif _bit_range(dod, 20):
                    b.write(0b1110, 4)
                    b.write(dod & (2**20 - 1), 20)
                else:
                    b.write(0b1111, 4)
                    b.write(dod & (2**64 - 1), 64)
            t_delta = d
            delta = struct.unpack(">Q", struct.pack(">d", v))[0] ^ \
                struct.unpack(">Q", struct.pack(">d", v_prev))[0]
            if delta == 0:
                b.write(0, 1)
            else:
                b.write(1, 1)
                lead = 64 - delta.bit_length()
                trail = (delta & -delta).bit_length() - 1
                lead = min(lead, 31)
                if leading != 0xFF and lead >= leading and trail >= trailing:
                    b.write(0, 1)
                    b.write(delta >> trailing, 64 - leading - trailing)
                else:
                    leading, trailing = lead, trail
                    b.write(1, 1)
                    b.write(lead, 5)
                    sig = 64 - lead - trail
                    b.write(sig & 63, 6)
                    b.write(delta >> trail, sig)
        t_prev, v_prev = t, v
    return struct.pack(">H", len(ts)) + b.tobytes()


def _msg(num: int, payload: bytes) -> bytes:
    return _uvarint(num << 3 | 2) + _uvarint(len(payload)) + payload


def _varint_field(num: int, x: int) -> bytes:
    return _uvarint(num << 3) + _uvarint(x & (2**64 - 1))


def _crc32c(data: bytes) -> int:
    """CRC-32C bit by bit (Castagnoli, reflected 0x82F63B78)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def frames(series: list[tuple[dict[str, str], list[tuple[list[int], list[float]]]]],
           per_frame: int = 2, *, labels_after: int = 0) -> bytes:
    """A streamed remote-read answer: ``per_frame`` ChunkedSeries messages a frame; the
    last ``labels_after`` labels of each series written after its chunks (protobuf
    allows fields in any order; Prometheus writes the labels first)."""
    msgs = []
    for labels, chunks in series:
        fields = [_msg(1, _msg(1, k.encode()) + _msg(2, v.encode()))
                  for k, v in sorted(labels.items())]
        cut = len(fields) - labels_after
        m = b"".join(fields[:cut])
        for ts, vals in chunks:
            m += _msg(2, _varint_field(1, ts[0]) + _varint_field(2, ts[-1])
                      + _varint_field(3, 1) + _msg(4, xor_chunk(ts, vals)))
        m += b"".join(fields[cut:])
        msgs.append(_msg(1, m))
    out = b""
    for i in range(0, len(msgs), per_frame):
        body = b"".join(msgs[i:i + per_frame]) + _varint_field(2, 0)
        out += _uvarint(len(body)) + struct.pack(">I", _crc32c(body)) + body
    return out


_floats = st.one_of(
    st.floats(allow_nan=False, width=64),
    st.integers(0, 100).map(float),
    st.sampled_from([0.0, -0.0, 1.5, 1e300, -2.5e-300, math.inf, -math.inf]))


@st.composite
def _series(draw: st.DrawFn) -> tuple[list[int], list[float]]:
    n = draw(st.integers(1, 150))
    t0 = draw(st.integers(-(2**40), 2**42))
    gaps = draw(st.lists(st.one_of(st.just(15_000), st.integers(1, 15_000 + 9000),
                                   st.integers(1, 2**36)), min_size=n - 1, max_size=n - 1))
    ts = [t0]
    for g in gaps:
        ts.append(ts[-1] + g)
    vals = draw(st.lists(_floats, min_size=n, max_size=n))
    return ts, vals


@settings(max_examples=200, deadline=None)
@given(st.lists(_series(), min_size=1, max_size=6), st.integers(1, 3))
def test_xor_decoder_equals_the_encoder(series: list[tuple[list[int], list[float]]],
                                        per_frame: int) -> None:
    data = [({"__name__": "m", "i": str(i)}, [s]) for i, s in enumerate(series)]
    got = decode_chunked_frames(frames(data, per_frame), where="test")
    assert len(got) == len(series)
    for i, ((_q, s), (ts, vals)) in enumerate(zip(got, series)):
        assert s.labels == {"__name__": "m", "i": str(i)}
        assert s.ts_ms.tolist() == ts
        assert np.array_equal(s.values.view(np.uint64),
                              np.array(vals, dtype=np.float64).view(np.uint64))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), _series()), min_size=1,
                max_size=6), st.integers(1, 3))
def test_labels_seen_across_answers_decode_as_new(
        picks: list[tuple[int, int, tuple[list[int], list[float]]]], per_frame: int) -> None:
    """A store's answers for successive ranges repeat its series: label sets looked up by
    their bytes in ``labels_seen`` (kept across answers) decode as a fresh decode does,
    labels written after the chunks included (those are decoded each time)."""
    seen: dict[bytes, tuple[tuple[str, str], ...]] = {}
    for answer in range(2):
        data = [({"__name__": "m", "gpu": str(g), "pod": f"p{answer % 2}"}, [s])
                for g, _after, s in picks]
        after = picks[0][1]
        body = frames(data, per_frame, labels_after=after)
        fresh = decode_chunked_frames(body, where="test")
        again = decode_chunked_frames(body, where="test", labels_seen=seen)
        assert [q for q, _s in again] == [q for q, _s in fresh]
        for (_q, a), (_q2, f) in zip(again, fresh):
            assert a.labels == f.labels and list(a.labels) == list(f.labels)
            assert np.array_equal(a.ts_ms, f.ts_ms)
            assert np.array_equal(a.values.view(np.uint64), f.values.view(np.uint64))
        if after:  # no prefix holds every label: nothing is looked up
            assert not seen
        else:
            assert len(seen) == len({g for g, _a, _s in picks}) * (answer + 1)


def test_a_series_split_over_frames_is_one_series() -> None:
    a = ([0, 15_000, 30_000], [1.0, 2.0, 2.0])
    b = ([45_000, 60_000], [3.0, 0.5])
    body = frames([({"__name__": "m", "x": "1"}, [a]), ({"__name__": "m", "x": "1"}, [b]),
                   ({"__name__": "m", "x": "2"}, [b])], per_frame=1)
    got = decode_chunked_frames(body, where="test")
    assert [s.labels["x"] for _q, s in got] == ["1", "2"]
    assert got[0][1].ts_ms.tolist() == a[0] + b[0]
    assert got[0][1].values.tolist() == a[1] + b[1]


def test_decoder_against_the_samples_prometheus_serves(prom: str, fleet: Fleet) -> None:
    """Remote read's decoded chunks equal the raw samples the query API returns."""
    c = PromClient(prom)
    got = remote_read(c, [(fleet.start_s * 1000, fleet.end_s * 1000,
                           [("__name__", "=", "DCGM_FI_DEV_GPU_UTIL")])])
    hours = (fleet.end_s - fleet.start_s) // 3600 + 1
    r = httpx.post(f"{prom}/api/v1/query", data={
        "query": f"DCGM_FI_DEV_GPU_UTIL[{hours}h]", "time": str(fleet.end_s)}).json()
    ref = {tuple(sorted(x["metric"].items())): x["values"] for x in r["data"]["result"]}
    assert len(got) == len(ref) > 10
    for _q, s in got:
        vals = ref[tuple(sorted(s.labels.items()))]
        keep = (s.ts_ms >= (fleet.end_s - hours * 3600) * 1000) & (s.ts_ms <= fleet.end_s * 1000)
        assert s.ts_ms[keep].tolist() == [round(float(t) * 1000) for t, _v in vals]
        assert s.values[keep].tolist() == [float(v) for _t, v in vals]
    c.close()


def test_request_encoding_is_a_valid_snappy_block() -> None:
    data = bytes(range(256)) * 700  # past one literal element
    block = snappy_literal(data)
    # decode the literal-only block by the format's rules
    n, pos, shift = 0, 0, 0
    while True:
        b = block[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            break
    out = bytearray()
    while pos < len(block):
        tag = block[pos]
        pos += 1
        assert tag & 3 == 0  # literal
        size = tag >> 2
        if size >= 60:
            nb = size - 59
            size = int.from_bytes(block[pos:pos + nb], "little")
            pos += nb
        size += 1
        out += block[pos:pos + size]
        pos += size
    assert n == len(data) and bytes(out) == data
    req = encode_read_request([(1, 2, [("__name__", "=~", "a|b"), ("x", "=", "y")])])
    assert req.endswith(b"\x10\x01")  # accepted_response_types: STREAMED_XOR_CHUNKS


# -- errors -----------------------------------------------------------------------------
class _Canned:
    """A fake store on 127.0.0.1 answering every remote read with ``body``."""

    def __init__(self, body: bytes, status: int = 200,
                 ctype: str = "application/x-streamed-protobuf; "
                 "proto=prometheus.ChunkedReadResponse") -> None:
        canned = (status, ctype, body)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, ctype, payload = canned
                if self.path != "/api/v1/read":
                    status, ctype, payload = 404, "text/plain", b"404 page not found"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Canned:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


_GOOD = frames([({"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": f"GPU-{i}"},
                 [([0, 15_000, 30_000], [1.0, 2.0, 3.0 + i])]) for i in range(3)],
               per_frame=1)
_Q = [(0, 60_000, [("__name__", "=", "DCGM_FI_DEV_GPU_UTIL")])]


def test_a_corrupt_frame_is_an_error_naming_the_store() -> None:
    bad = bytearray(_GOOD)
    bad[-3] ^= 0x40
    with _Canned(bytes(bad)) as s, pytest.raises(SourceUnavailableError) as e:
        remote_read(PromClient(s.url, retries=0), _Q)
    assert "CRC32-C" in e.value.what and s.url in str(e.value.where)


def test_a_truncated_stream_is_an_error_naming_the_store() -> None:
    with _Canned(_GOOD[:-7]) as s, pytest.raises(SourceUnavailableError) as e:
        remote_read(PromClient(s.url, retries=0), _Q)
    assert "truncated" in e.value.what and s.url in str(e.value.where)


def test_the_canned_answer_itself_decodes() -> None:
    with _Canned(_GOOD) as s:
        got = remote_read(PromClient(s.url, retries=0), _Q)
    assert [x.values.tolist() for _q, x in got] == [[1.0, 2.0, 3.0 + i] for i in range(3)]


def test_a_store_refusing_remote_read_is_an_error_naming_it(fleet: Fleet) -> None:
    with _Canned(b"remote read is disabled", status=400, ctype="text/plain") as s:
        with pytest.raises(InputError) as e:
            _audit(s.url, fleet, fetch="native")
        assert s.url in str(e.value.where)
        assert "neither remote read" in e.value.what
        assert "--fetch pushdown" in (e.value.fix or "")


def test_native_rows_are_the_raw_pulls_rows(prom: str, fleet: Fleet) -> None:
    """The sample table from the stored chunks equals the one from query_range, row for row
    (every column), over chunk edges, the MIG GPU, the time-sliced one and the missed scrapes."""
    import pyarrow as pa

    from gpuaudit.measure.fleet.native import NativeSource
    from gpuaudit.measure.fleet.prometheus import PrometheusSource
    from gpuaudit.schema import SAMPLE_SCHEMA

    c = PromClient(prom)
    kw = {"start_s": float(fleet.start_s + 15), "end_s": float(fleet.end_s), "step_s": 15.0}
    raw = pa.Table.from_batches(list(PrometheusSource(c, **kw).batches()), schema=SAMPLE_SCHEMA)
    native = pa.Table.from_batches(list(NativeSource(c, "remote-read", **kw).batches()),
                                   schema=SAMPLE_SCHEMA)
    c.close()
    assert raw.num_rows > 10_000
    assert native.equals(raw)


class _RefusingNative:
    """A real store's native reads with some chunks refused, as a proxy's timeout or a
    store's limit refuses them (an error after the client's retries)."""

    @staticmethod
    def source(client: PromClient, form: str, refuse: object, **kw: object):  # type: ignore[no-untyped-def]
        from gpuaudit.measure.fleet.native import NativeSource

        class Source(NativeSource):
            asked = 0

            def fetch(self, a_s: float, b_s: float):  # type: ignore[no-untyped-def]
                k, Source.asked = Source.asked, Source.asked + 1  # (one prefetch at a time)
                if refuse(k):  # type: ignore[operator]
                    raise SourceUnavailableError(
                        "HTTP 504 from the proxy in front of the store",
                        where=f"{client.url}/api/v1/read")
                return super().fetch(a_s, b_s)

        return Source(client, form, **kw)


@pytest.mark.parametrize("form", ["remote-read", "export"])
@pytest.mark.parametrize("every", [False, True])
def test_a_chunk_the_store_will_not_stream_is_read_through_query_range(
        prom: str, split: tuple[str, str], fleet: Fleet, form: str, every: bool) -> None:
    """A chunk whose raw read the store refuses is read through ``query_range`` instead
    (the raw pull's query): the same sample table, row for row, and one note naming the
    chunks, how many, and the store's answer (before: the audit failed)."""
    import pyarrow as pa

    from gpuaudit.measure.fleet.prometheus import PrometheusSource
    from gpuaudit.promql import time_chunks
    from gpuaudit.schema import SAMPLE_SCHEMA

    c = PromClient(prom if form == "remote-read" else split[1])
    kw = {"start_s": float(fleet.start_s + 15), "end_s": float(fleet.end_s), "step_s": 15.0}
    n = len(time_chunks(kw["start_s"], kw["end_s"], 15.0, 2880))
    src = _RefusingNative.source(c, form, (lambda k: True) if every else (lambda k: k == 1),
                                 **kw)
    native = pa.Table.from_batches(list(src.batches()), schema=SAMPLE_SCHEMA)
    raw = pa.Table.from_batches(list(PrometheusSource(c, **kw).batches()), schema=SAMPLE_SCHEMA)
    c.close()
    assert n >= 3 and raw.num_rows > 5_000
    assert native.equals(raw)
    notes = [x for x in src.notes if "would not stream" in x.reason]
    assert len(notes) == 1 and notes[0].count == (n if every else 1), src.notes
    assert "HTTP 504" in notes[0].reason and "query_range" in notes[0].reason
    assert (f"{n} chunks starting" in notes[0].reason) is every, notes[0].reason


def test_a_store_whose_export_limit_refuses_the_native_fetch_audits_as_the_raw_pull(
        fleet: Fleet, tmp_path: Path) -> None:
    """A VictoriaMetrics whose ``-search.maxExportSeries`` is below the fleet's series
    answers the probe (no series) and query_range but refuses exports with HTTP 400
    where its index cache misses: ``--fetch native`` still audits, as the raw pull."""
    from gpuaudit.promql import time_chunks

    with run_victoria_metrics(tmp_path / "vm", extra_args=("-search.maxExportSeries=3",)) as vm:
        import_victoria_metrics(fleet, vm, tmp_path / "import")
        c = PromClient(vm)
        with pytest.raises(SourceUnavailableError, match="HTTP 400"):
            from gpuaudit.measure.fleet.native import export_series

            export_series(c, '{__name__="DCGM_FI_DEV_GPU_UTIL"}', float(fleet.start_s),
                          float(fleet.end_s))
        c.close()
        native = _audit(vm, fleet, fetch="native")
        raw = _audit(vm, fleet, raw=True)
    _same(native, raw)
    # (the native fetch asks for every metric in one regex no PromQL query uses: each
    # chunk's export misses the store's cache and is refused)
    notes = [x for x in native.usage.notes if "would not stream" in x.reason]
    chunks = len(time_chunks(float(fleet.start_s), float(fleet.end_s), 15.0, 2880))
    assert len(notes) == 1 and notes[0].count == chunks and "HTTP 400" in notes[0].reason, \
        notes


def test_lean_batches_are_the_native_rows(prom: str, fleet: Fleet) -> None:
    """The lean layout (identities per series: dictionary columns, the --by label resolved
    once per series, no per-row label maps) holds the rows of the sample table, and each
    row's label value is the one the attributed table's map gives it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpuaudit.measure.fleet.dcgm import LEAN_IDENTITY
    from gpuaudit.measure.fleet.native import NativeSource
    from gpuaudit.price.attribution import Attributor, attribute_table, load_mapping
    from gpuaudit.schema import SAMPLE_SCHEMA
    from gpuaudit.series import LEAN_LABEL_KEYS

    c = PromClient(prom)
    kw = {"start_s": float(fleet.start_s + 15), "end_s": float(fleet.end_s), "step_s": 15.0}
    attributor = Attributor(load_mapping(TEAMS), {})
    table = attribute_table(pa.Table.from_batches(
        list(NativeSource(c, "remote-read", **kw).batches()), schema=SAMPLE_SCHEMA), attributor)
    lean = list(NativeSource(c, "remote-read", **kw).lean_batches(
        lambda sid: attributor.resolve(sid.namespace, sid.pod, dict(sid.labels)),
        ["team", "nosuchlabel"]))
    c.close()
    assert len(lean) > 1 and sum(b.num_rows for b in lean) == table.num_rows > 10_000
    got = pa.Table.from_batches(lean)
    assert pa.types.is_dictionary(got.schema.field("pod").type)
    assert pa.types.is_null(got.schema.field("labels").type)
    assert pa.types.is_null(got.schema.field("power_limit_w").type)
    for name in table.column_names:
        if name == "labels":
            continue
        want, have = table.column(name), got.column(name)
        if name in LEAN_IDENTITY:  # the values, whatever the dictionaries' order
            want, have = want.cast(pa.string()), have.cast(pa.string())
        elif pa.types.is_null(have.type):  # a column without values holds no buffers
            have = have.cast(want.type)
        assert have.equals(want), name
    team = pc.map_lookup(table.column("labels"), "team", "first")
    assert got.column("label:team").cast(pa.string()).equals(team)
    assert got.column("label:nosuchlabel").null_count == got.num_rows
    keys = set(pc.unique(table.column("labels").combine_chunks().keys).to_pylist())
    for b in lean:
        assert set(b.schema.metadata[LEAN_LABEL_KEYS].decode().split("\x1f")) <= keys
    assert {"team", "project", "user"} <= set(lean[0].schema.metadata[LEAN_LABEL_KEYS]
                                              .decode().split("\x1f"))


def _fleet_view(report) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """What the fleet section says in figures: the totals, the showback per team (hours,
    phases, dollars), the per-day KPIs and the 1 h / 24 h utilization."""
    f = report.extra["fleet"]
    keep = ("gpu_hours", "effective_gpu_hours", "phase_hours", "cost_usd", "waste_usd",
            "unobserved_hours")
    return {"total": {k: f["total"][k] for k in keep},
            "showback": sorted((e["group"]["team"], {k: e[k] for k in keep})
                               for e in f["showback"]),
            "days": f["kpis"]["days"], "util_window_pct": f["kpis"]["util_window_pct"]}


@pytest.mark.parametrize("where", ["one", "split"])
def test_whole_audit_native_equals_raw_and_pushdown(prom: str, split: tuple[str, str],
                                                    fleet: Fleet, where: str) -> None:
    """The whole audit, phase seconds to dollars, per-day KPIs and the 1 h / 24 h windows:
    ``--fetch native`` (one Prometheus, or Prometheus + VictoriaMetrics) is the raw pull of
    the same fleet; against the pushdown every cell's phases and samples and the fleet's
    totals are equal (see VS_PUSHDOWN for the unobserved seconds at a pod switch)."""
    stores = prom if where == "one" else [f"eu={split[0]}", f"us={split[1]}"]
    native = _audit(stores, fleet, fetch="native")
    raw = _audit(prom, fleet, raw=True)
    _same(native, raw)
    assert _fleet_view(native) == _fleet_view(raw)
    assert len(_fleet_view(native)["days"]) == 2  # type: ignore[arg-type]
    pushdown = _audit(stores, fleet)
    _same(native, pushdown, **VS_PUSHDOWN)
    a, b = _fleet_view(native), _fleet_view(pushdown)
    assert a["total"] == b["total"]
    # per day too on this fleet, where no gap spans midnight (a gap that does is left out
    # of both days by the per-day classify, and split by the pushdown's chunks); the 1 h /
    # 24 h utilization is another figure there (the raw samples' mean), not compared
    assert [(d["day_start"], d["gpu_hours"], d["idle_gpu_hours"], d["cost_usd"])
            for d in a["days"]] == [(d["day_start"], d["gpu_hours"], d["idle_gpu_hours"],
                                     d["cost_usd"]) for d in b["days"]]  # type: ignore[union-attr]


def test_native_rows_do_not_depend_on_the_stores_answer_order(split: tuple[str, str],
                                                              fleet: Fleet) -> None:
    """VictoriaMetrics' export lists series in the order its search finishes: the same
    answer in any order gives the same rows (so the same series numbering, and the report's
    patterns and diagnoses in one order), Prometheus' label-set order."""
    import random

    import pyarrow as pa

    from gpuaudit.measure.fleet.native import NativeSource, RawSeries
    from gpuaudit.schema import SAMPLE_SCHEMA

    class Shuffled(NativeSource):
        seed = 0

        def fetch(self, a_s: float, b_s: float) -> list[RawSeries]:
            got = super().fetch(a_s, b_s)
            random.Random(self.seed).shuffle(got)
            return got

    c = PromClient(split[1])
    kw = {"start_s": float(fleet.start_s + 15), "end_s": float(fleet.end_s), "step_s": 15.0}
    tables = []
    for seed in (1, 2, 3):
        src = Shuffled(c, "export", **kw)
        src.seed = seed
        tables.append(pa.Table.from_batches(list(src.batches()), schema=SAMPLE_SCHEMA))
    c.close()
    assert tables[0].num_rows > 1_000
    assert all(t.equals(tables[0]) for t in tables[1:])


@pytest.mark.parametrize("batch_rows", [997, 20_000])
def test_days_and_windows_of_held_batches_are_those_of_the_table(prom: str, fleet: Fleet,
                                                                  batch_rows: int) -> None:
    """local_kpis over held batches (whole days, batches straddling a day or a window's
    edge: kept whole, left out or filtered) gives the per-day cells and the 1 h / 24 h
    utilization it gives over the same rows as one table."""
    import pyarrow as pa

    from gpuaudit.api import local_kpis
    from gpuaudit.measure.fleet.native import LeanSamples, NativeSource
    from gpuaudit.schema import SAMPLE_SCHEMA

    with PromClient(prom) as c:
        kw = {"start_s": float(fleet.start_s + 15), "end_s": float(fleet.end_s),
              "step_s": 15.0}
        table = pa.Table.from_batches(list(NativeSource(c, "remote-read", **kw).batches()),
                                      schema=SAMPLE_SCHEMA).sort_by("ts")
    # (days from a start mid-day, so the batches' edges and the days' edges differ)
    start = fleet.start_s + 5 * 3600 + 7.5
    whole_daily, whole_win = local_kpis(table, ("namespace",), 15.0, start_s=start)
    held = LeanSamples(table.to_batches(max_chunksize=batch_rows), origin="test",
                       interval_s=15.0)
    daily, win = local_kpis(held, ("namespace",), 15.0, start_s=start)
    assert whole_daily.num_rows >= 6 and whole_win["1h"] is not None
    # (sums over other batches: the same to the last bits)
    assert win == pytest.approx(whole_win, rel=1e-12)
    key = [(k, "ascending") for k in ("day_start", "gpu_uuid", "namespace")]
    got, want = daily.sort_by(key).to_pylist(), whole_daily.sort_by(key).to_pylist()
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for k, v in b.items():
            assert a[k] == (pytest.approx(v, rel=1e-12, abs=1e-9)
                            if isinstance(v, float) else v), k


@pytest.mark.parametrize("where", ["series", "chunk", "data", "skipped"])
@pytest.mark.parametrize("length", [2**63, 2**64 - 8, 2**40])
def test_a_length_past_the_message_is_malformed_protobuf(where: str, length: int) -> None:
    """A protobuf length of 2**63 or more (negative as an int64) or just more than the
    message holds, in any of the frame scan's length-delimited fields, with a valid CRC:
    a clear error, not a read outside the answer."""
    big = _uvarint(length)
    if where == "series":  # ChunkedReadResponse.chunked_series
        body = b"\x0a" + big + b"\x00" * 4
    elif where == "chunk":  # ChunkedSeries.chunks
        inner = b"\x12" + big + b"\x00" * 4
        body = _msg(1, inner)
    elif where == "data":  # Chunk.data
        inner = _msg(2, _varint_field(3, 1) + b"\x22" + big + b"\x00" * 4)
        body = _msg(1, inner)
    else:  # an unknown length-delimited field, skipped
        body = _msg(1, b"\x3a" + big + b"\x00" * 4)
    answer = _uvarint(len(body)) + struct.pack(">I", _crc32c(body)) + body
    with pytest.raises(SourceUnavailableError, match="malformed protobuf"):
        decode_chunked_frames(answer, where="http://prom:9090/api/v1/read")
