"""Property tests: the trace loader reads what json.loads reads, and refuses damage."""

from __future__ import annotations

import json
import random
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.errors import InputError
from gpuaudit.traces.loader import load_trace

names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",),
                                      exclude_characters="\x00"),
                min_size=1, max_size=30)
us = st.decimals(min_value=0, max_value=Decimal("9999999999999.999"), places=3,
                 allow_nan=False, allow_infinity=False)
durs = st.decimals(min_value=0, max_value=Decimal("86000000000.999"), places=3,  # < a day
                   allow_nan=False, allow_infinity=False)


@st.composite
def traces(draw: st.DrawFn) -> dict[str, object]:
    """Kernel events with decimal-us times written as JSON numbers (NUL-marked strings are
    unquoted after dumping), shuffled keys, nested args, any unicode name."""
    events: list[dict[str, object]] = []
    for i in range(draw(st.integers(1, 12))):
        stream = draw(st.integers(0, 200))
        k: dict[str, object] = {
            "ph": "X", "cat": "kernel", "name": draw(names), "pid": 0, "tid": stream,
            "ts": f"\x00{draw(us)}\x00", "dur": f"\x00{draw(durs)}\x00",
            "args": {"x": {"y": None}, "stream": stream, "grid": [1, 2, 3],
                     "correlation": i + 1, "device": 0}}
        items = list(k.items())
        random.Random(draw(st.integers(0, 99))).shuffle(items)
        events.append(dict(items))
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                       "pid": 1, "tid": 1, "ts": 0, "dur": 1, "args": {"correlation": i + 1}})
    return {"schemaVersion": 1, "traceEvents": events, "distributedInfo": {"rank": 0},
            "baseTimeNanoseconds": 1}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(traces(), st.sampled_from([None, 1, 4]), st.booleans())
def test_scanner_reads_what_json_reads(tmp_path: Path, doc: dict[str, object],
                                       indent: int | None, ascii_only: bool) -> None:
    text = json.dumps(doc, indent=indent, ensure_ascii=ascii_only)
    text = text.replace('"\\u0000', "").replace('\\u0000"', "")
    p = tmp_path / "t.json"
    p.write_text(text, encoding="utf-8")
    ref = json.loads(text, parse_float=Decimal)
    r = load_trace(p)
    got = sorted(zip(r.kernels.column("name").to_pylist(), r.kernels.column("ts_ns").to_pylist(),
                     r.kernels.column("dur_ns").to_pylist(),
                     r.kernels.column("stream").to_pylist()))
    want = sorted((e["name"], int(Decimal(e["ts"]) * 1000), int(Decimal(e["dur"]) * 1000),
                   e["args"]["stream"]) for e in ref["traceEvents"] if e["cat"] == "kernel")
    assert got == want
    assert r.meta["baseTimeNanoseconds"] == 1


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10_000), st.sampled_from([b"@", b"{", b"]", b'"', b":", b"x!"]))
def test_damage_is_an_error_or_harmless(tmp_path: Path, where: int, junk: bytes) -> None:
    """Inserting a stray byte anywhere either raises InputError with a byte offset or leaves
    a document json.loads also accepts (e.g. inside a string)."""
    text = (Path(__file__).resolve().parents[1] / "data" / "traces" /
            "mi250_rocm_minitoy.json.gz").read_bytes()
    import gzip

    raw = gzip.decompress(text)
    pos = where % len(raw)
    bad = raw[:pos] + junk + raw[pos:]
    p = tmp_path / "bad.json"
    p.write_bytes(bad)
    try:
        json.loads(bad)
        valid = True
    except (json.JSONDecodeError, UnicodeDecodeError):
        valid = False
    if valid:
        try:
            load_trace(p)
        except InputError as exc:  # still JSON, but a damaged key ("trace@Events") is no trace
            assert "traceEvents" in str(exc) and bad.find(b'"traceEvents"') < 0
    else:
        with pytest.raises(InputError) as exc:
            load_trace(p)
        assert exc.value.where is not None and "byte" in exc.value.where


_INT_TOKENS = st.one_of(
    st.integers(0, 10**17).map(lambda i: str(i).encode()),
    st.integers(-10**6, 10**6).map(lambda i: str(i).encode()),
    st.sampled_from([b"", b"0007", b"7.0", b"7.5", b'"7"', b"null", b"true", b"1e3",
                     b"123456789012345", b"1234567890123456", b"9" * 19]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_INT_TOKENS, max_size=30))
def test_integer_fast_path_equals_the_decimal_path(tokens: list[bytes]) -> None:
    """parse_int_raw's digits-only path decides exactly as the exact decimal path."""
    import msgspec
    import numpy as np

    from gpuaudit.traces._kineto_json import parse_int_raw, parse_raw

    raws = [msgspec.Raw(t) for t in tokens]
    vals, ok = parse_int_raw(raws)
    ns, valid, _ = parse_raw(raws)
    valid &= ns % 1000 == 0
    np.testing.assert_array_equal(ok, valid)
    np.testing.assert_array_equal(vals[ok], (ns // 1000)[valid])
