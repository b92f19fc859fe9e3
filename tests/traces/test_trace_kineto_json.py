"""The msgspec trace decoder: slices cut anywhere read what one pass reads, exact numbers,
errors with a byte offset or an event index."""

from __future__ import annotations

import gzip
import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trace_synth import kernel, launch, span, write

from gpuaudit.errors import InputError
from gpuaudit.traces import _kineto_json as kj
from gpuaudit.traces import loader
from gpuaudit.traces.loader import load_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
FIELDS = ("kind", "cat", "name_idx", "ts_ns", "ts_ok", "ts_frac", "dur_ns", "dur_ok", "stream",
          "stream_ok", "device", "device_ok", "correlation", "correlation_ok")

# names full of false cut candidates: "}, {" inside strings
tricky = st.text(alphabet=st.sampled_from(['}', ',', '{', ' ', '\n', '"', '\\', 'a', 'é', ']']),
                 max_size=12)


def _decode(data: bytes, slice_bytes: int) -> tuple[dict[str, object], kj.Columns]:
    return kj.decode(data, Path("t.json"), loader._ALL_CATS, loader._select,
                     slice_bytes=slice_bytes)


def _same(a: kj.Columns, b: kj.Columns) -> None:
    assert a.n_events == b.n_events
    assert [a.names[i] for i in a.name_idx.tolist()] == [b.names[i] for i in b.name_idx.tolist()]
    for f in FIELDS[:2] + FIELDS[3:]:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert a.unknown_cats == b.unknown_cats


@st.composite
def events(draw: st.DrawFn) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(draw(st.integers(1, 25))):
        args: dict[str, object] = {"nested": [{"a": draw(tricky)}, {"b": {}}]}
        if draw(st.booleans()):
            args["stream"] = draw(st.integers(0, 99))
        args["correlation"] = i
        ev = {"args": args, "ph": draw(st.sampled_from(["X", "i", "f"])),
              "cat": draw(st.sampled_from(["kernel", "cuda_runtime", "cpu_op", "odd_cat"])),
              "name": draw(st.sampled_from(["ProfilerStep#1", "k", "DataLoader x"]))
              + draw(tricky),
              "ts": draw(st.integers(0, 10**15)) / 1000, "dur": draw(st.integers(0, 10**6))}
        if draw(st.booleans()):  # args last, as Kineto writes it
            ev["args"] = ev.pop("args")
        out.append(ev)
    return out


@settings(max_examples=60, deadline=None)
@given(events(), st.integers(1, 400), st.sampled_from([None, 1]))
def test_any_slice_size_reads_what_one_slice_reads(evs: list[dict[str, object]], size: int,
                                                   indent: int | None) -> None:
    data = json.dumps({"a": 1, "traceEvents": evs, "z": [2]}, indent=indent).encode()
    meta, whole = _decode(data, 1 << 30)
    meta2, sliced = _decode(data, size)
    assert meta == meta2 == {"a": 1, "z": [2]}
    _same(whole, sliced)
    assert whole.n_events == len(evs)
    kept = [e for e in evs if e["ph"] == "X" and e["cat"] in ("kernel", "cuda_runtime")]
    assert (whole.kind > 0).sum() >= len(kept)


def test_cut_inside_a_string_is_retried() -> None:
    """A name holding ``}, {`` right where a slice would end: the slice is malformed, the
    next cut is used, and the name survives whole."""
    name = 'x"}, {"y' * 20
    evs = [kernel(name, 10 + i, 1, i) for i in range(5)]
    data = json.dumps({"traceEvents": evs}, indent=1).encode()
    at = data.index(b"}, {") - 5  # the first false candidate
    _, cols = _decode(data, at)
    assert cols.n_events == 5
    assert [cols.names[i] for i in cols.name_idx.tolist()] == [name] * 5


def test_real_trace_in_small_slices_matches_one_pass() -> None:
    data = gzip.decompress((DATA / "mi250_rocm_minitoy.json.gz").read_bytes())
    _same(_decode(data, 1 << 30)[1], _decode(data, 997)[1])


def test_load_trace_uses_small_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = load_trace(DATA / "mi250_rocm_minitoy.json.gz")
    monkeypatch.setattr(kj, "SLICE_BYTES", 512)
    got = load_trace(DATA / "mi250_rocm_minitoy.json.gz")
    assert got.kernels.equals(ref.kernels)


def test_invalid_json_deep_in_the_array_reports_its_byte(tmp_path: Path) -> None:
    evs = [kernel(f"k{i}", 10 * i, 1, i) for i in range(300)]
    p = write(tmp_path / "t.json", evs)
    text = p.read_bytes()
    pos = text.index(b'"name": "k250"')
    p.write_bytes(text[:pos] + b"@" + text[pos:])
    with pytest.raises(InputError, match="invalid JSON") as exc:
        load_trace(p)
    assert exc.value.where == f"{p}: byte {pos}"


def test_cut_short_json_is_invalid_at_its_end(tmp_path: Path) -> None:
    p = write(tmp_path / "t.json", [kernel("k", 10, 1, 1)] * 50)
    text = p.read_bytes()[:-300]
    p.write_bytes(text)
    with pytest.raises(InputError, match="invalid JSON") as exc:
        load_trace(p)
    assert exc.value.where == f"{p}: byte {len(text)}"


def test_wrong_type_names_the_event_across_slices(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    evs = [kernel(f"k{i}", 10 * i, 1, i) for i in range(100)]
    evs[77]["name"] = 5
    p = write(tmp_path / "t.json", evs)
    monkeypatch.setattr(kj, "SLICE_BYTES", 300)
    with pytest.raises(InputError, match="got `int`") as exc:
        load_trace(p)
    assert exc.value.where == f"{p}: traceEvents[77]"
    assert "traceEvents[77].name" in str(exc.value)


def test_traceevents_not_an_array(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": {"a": 1}}')
    with pytest.raises(InputError, match="not an array"):
        load_trace(p)


def test_invalid_utf8_in_a_name_is_replaced(tmp_path: Path) -> None:
    p = write(tmp_path / "t.json", [launch(0, 1), kernel("kXX", 10, 5, 1)])
    p.write_bytes(p.read_bytes().replace(b"kXX", b"k\xff\xfe"))
    r = load_trace(p)
    assert r.kernels.column("name").to_pylist() == ["k\ufffd\ufffd"]


def test_args_and_numbers_of_odd_types_are_invalid_not_zero(tmp_path: Path) -> None:
    k_null = kernel("no_ts", 10, 5, 2)
    k_null["ts"] = None
    k_str = kernel("str_stream", 30, 5, 3)
    k_str["args"]["stream"] = "7"  # type: ignore[index]
    k_obj = kernel("obj_stream", 40, 5, 4)
    k_obj["args"]["stream"] = {"id": 7}  # type: ignore[index]
    p = write(tmp_path / "t.json", [launch(0, 2), k_null, launch(1, 3), k_str, launch(2, 4),
                                    k_obj, span("ProfilerStep#3", 0, 100)])
    r = load_trace(p)
    assert r.kernels.column("name").to_pylist() == ["str_stream"]  # "7" reads as 7
    assert r.kernels.column("stream").to_pylist() == [7]
    reasons = " | ".join(n.reason for n in r.notes)
    assert "without a timestamp" in reasons and "without an integer args.stream" in reasons
    assert r.spans.names == ["ProfilerStep#3"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
    st.decimals(min_value=Decimal("-9e15"), max_value=Decimal("9e15"), allow_nan=False,
                allow_infinity=False).map(lambda d: format(d, "f")),
    st.integers(-10**20, 10**20).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr),
    st.sampled_from(["null", '"12.5"', '"x"', "true", "[1]", "1e3", "-0.0005", ""])),
    max_size=40))
def test_numbers_decode_exactly(texts: list[str]) -> None:
    """Each number is round-half-up(value x 1000) exactly, as Decimal computes it; anything
    that is not a number (or out of int64 range) is invalid, never a zero."""
    raws = [msgspec.Raw(t.encode()) for t in texts]
    ns, ok, _ = kj.parse_raw(raws)
    for t, v, good in zip(texts, ns.tolist(), ok.tolist()):
        body = t[1:-1] if len(t) >= 2 and t[0] == t[-1] == '"' else t
        try:
            want: int | None = int((Decimal(body) * 1000).to_integral_value(ROUND_HALF_UP))
            if not -(2**63) <= want < 2**63 or body.strip() != body:
                want = None
        except ArithmeticError:
            want = None
        if want is None:
            assert not good, t
            assert v == 0
        else:
            assert good and v == want, (t, v, want)


def test_slices_bound_the_decoding_memory() -> None:
    """Decoding in slices holds one slice's structs at a time: the peak Python allocation
    beyond the document is far below decoding the whole array at once (tracemalloc)."""
    import tracemalloc

    evs = [kernel(f"void some::templated_kernel<{i % 50}>(float*, int)", 10 * i, 1, i)
           if i % 3 else {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 40}", "ts": i,
                          "dur": 1, "args": {"External id": i}} for i in range(20_000)]
    data = json.dumps({"traceEvents": evs}, indent=1).encode()
    del evs
    peaks = []
    for size in (1 << 30, 1 << 16):
        tracemalloc.start()
        _, cols = _decode(data, size)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert cols.n_events == 20_000
    whole, sliced = peaks
    assert sliced < whole / 3, (whole, sliced)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(alphabet="0123456789.", max_size=22), max_size=40))
def test_digits_and_dots_only_decode_exactly(texts: list[str]) -> None:
    """The digits-and-dots path (Kineto's own number format, where no byte's class is
    counted) decides as Decimal does: "1.", ".5", "..", "" and 20-digit runs included."""
    raws = [msgspec.Raw(t.encode()) for t in texts]
    ns, ok, frac = kj.parse_raw(raws)
    for t, v, good, f in zip(texts, ns.tolist(), ok.tolist(), frac.tolist()):
        try:
            want: int | None = int((Decimal(t) * 1000).to_integral_value(ROUND_HALF_UP))
            if not -(2**63) <= want < 2**63:
                want = None
        except ArithmeticError:
            want = None
        assert (good, v) == ((False, 0) if want is None else (True, want)), t
        if good:
            assert f == ("." in t), t


# -- no pass over the whole document where its events array is found from its ends ----------


def _validated_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """decode() as it was: the document validated whole before its events."""
    monkeypatch.setattr(kj, "locate_events", lambda read_at, size, probe: None)


def _never_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail where decode() would validate the whole document (the first thing that path
    does is look for a non-blank byte in it)."""
    class NoScan:
        def search(self, *args: object) -> None:
            raise AssertionError("the document was validated whole")

    monkeypatch.setattr(kj, "_NON_WS", NoScan())


_TAILS = [{"z": [2]}, {}, {"samples": [{"a": 1}], "z": 2}, {"traceName": "a}]b"}]


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events(), st.integers(1, 400), st.sampled_from(range(len(_TAILS))), st.booleans(),
       st.sampled_from([None, 1]), st.integers(8, 4096))
def test_events_found_from_the_ends_read_what_a_whole_validation_reads(
        monkeypatch: pytest.MonkeyPatch, evs: list[dict[str, object]], size: int, tail: int,
        decoy: bool, indent: int | None, probe: int) -> None:
    """Random events (arrays of objects in args, false cuts in names), tails with and
    without an array of objects after the events, a decoy ``"traceEvents": [`` in a header
    string, any probe size: the same meta and columns as the document validated whole."""
    doc: dict[str, object] = {"a": 1}
    if decoy:
        doc["note"] = '"traceEvents": [{"ph": "X"}]'
    doc["traceEvents"] = evs
    doc.update(_TAILS[tail])
    data = bytearray(json.dumps(doc, indent=indent).encode())
    monkeypatch.setattr(kj, "PROBE_BYTES", probe)
    meta, got = _decode(data, size)
    with monkeypatch.context() as m:
        _validated_whole(m)
        meta2, whole = _decode(data, size)
    assert meta == meta2
    _same(whole, got)


@pytest.mark.parametrize("name", ["a100_1rank_ddp_nccl.json.gz", "v100_1rank_ns_resolution.json.gz",
                                  "mi250_rocm_minitoy.json.gz", "cpu_linear_flops.json.gz",
                                  "two_ranks/sampled_rank-0.json.gz"])
def test_real_traces_are_never_validated_whole_and_read_the_same(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    data = bytearray(gzip.decompress((DATA / name).read_bytes()))
    with monkeypatch.context() as m:
        _validated_whole(m)
        meta, whole = _decode(data, 1 << 16)
    _never_whole(monkeypatch)
    meta2, got = _decode(data, 1 << 16)
    assert meta == meta2
    _same(whole, got)
    assert whole.flops_derived.tolist() == got.flops_derived.tolist()


def test_an_array_of_objects_after_the_events_is_validated_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The one document shape whose events' end is taken wrongly (an array of objects after
    them: no Kineto trace has one): the last slice refutes it, and the whole validation
    reads it right."""
    data = bytearray(json.dumps({"traceEvents": [kernel("k", 1, 1, 0)],
                                 "samples": [{"a": 1}], "z": 2}).encode())
    calls: list[int] = []
    real = kj._NON_WS

    class Spy:
        def search(self, *args: object) -> object:
            calls.append(1)
            return real.search(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(kj, "_NON_WS", Spy())
    meta, got = _decode(data, 1 << 16)
    assert meta == {"samples": [{"a": 1}], "z": 2} and got.n_events == 1 and calls
