"""Hostile and broken files: each is a clear error (exit 2, `error:` + `fix:`), never a crash,
a traceback or gigabytes of memory (issue 22, items 1 and 2). Each case crashed, printed a
traceback or inflated without bound before gpuaudit.limits existed."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaudit.errors import InputError
from gpuaudit.limits import (
    MAX_INPUT_BYTES_ENV,
    BoundedStream,
    check_json_depth,
    inflate_gzip,
    inflate_gzip_bytes,
    parse_bytes,
)

GPUAUDIT = [sys.executable, "-c", "import sys; from gpuaudit.cli import main; sys.exit(main())"]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([*GPUAUDIT, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _clean_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert p.stderr.startswith("error:") and "fix:" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    return p.stderr


def _jsonl(tmp: Path, labels: str, name: str = "deep.jsonl") -> Path:
    path = tmp / name
    path.write_text("".join(
        f'{{"ts": "2026-01-01T00:00:0{i}Z", "gpu_uuid": "GPU-1", "util_gpu_pct": 50, '
        f'"labels": {labels}}}\n' for i in range(3)))
    return path


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_jsonl_nested_deep_is_an_error_not_a_segfault(tmp_path: Path, depth: int) -> None:
    path = _jsonl(tmp_path, '{"x":' * depth + "1" + "}" * depth)
    err = _clean_error(_cli("report", str(path), "--price", "2"))
    assert f"{path}:1" in err and "nested" in err


def test_jsonl_nested_label_value_is_an_error(tmp_path: Path) -> None:
    err = _clean_error(_cli("report", str(_jsonl(tmp_path, '{"a": {"b": 1}}')), "--price",
                            "2"))
    assert "label 'a'" in err and "nested value" in err


def test_a_bracket_inside_a_label_string_is_not_nesting(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, '{"job": "' + "[{" * 200 + '\\"' + '"}')
    p = _cli("report", str(path), "--price", "2", "--format", "json")
    assert p.returncode == 0, p.stderr


def test_label_longer_than_the_limit_is_located(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text("ts,gpu_uuid,util_gpu_pct,team\n2026-01-01T00:00:00Z,G,5,a\n"
                    f"2026-01-01T00:00:01Z,G,5,{'x' * 5000}\n")
    err = _clean_error(_cli("report", str(path), "--price", "2", "--map", "team=label:team"))
    assert f"{path}:3" in err and "5,000 characters" in err


def test_trace_nested_deep_is_an_error_not_a_recursion_traceback(tmp_path: Path) -> None:
    for name, doc in {
        "top.json": '{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "meta.json": '{"traceEvents": [], "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "args.json": '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": '
                     + '{"a":' * 100_000 + "1" + "}" * 100_000 + "}]}",
    }.items():
        path = tmp_path / name
        path.write_text(doc)
        assert "nested too deep" in _clean_error(_cli("trace", str(path), "--price", "2"))


def test_truncated_csv_gz_is_a_clear_error(tmp_path: Path) -> None:
    rows = "".join(f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z,G,{i % 100}\n"
                   for i in range(3000))
    blob = gzip.compress(("ts,gpu_uuid,util_gpu_pct\n" + rows).encode())
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(blob[: len(blob) // 2])
    err = _clean_error(_cli("report", str(path), "--price", "2"))
    assert "gzip -t" in err


def test_decompression_bomb_trace_is_refused_within_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b"0" * (64 << 20), 9))  # 64 MiB of zeros, ~64 KiB on disk
    p = _cli("trace", str(path), "--price", "2", "--max-input-bytes", "8MiB")
    err = _clean_error(p)
    assert "inflates to more than 8,388,608 bytes" in err and "--max-input-bytes" in err
    # two members: the second is counted too
    path.write_bytes(gzip.compress(b"{}" * 10) + gzip.compress(b" " * (16 << 20)))
    err = _clean_error(_cli("trace", str(path), "--price", "2", env={
        MAX_INPUT_BYTES_ENV: "4MiB"}))
    assert "inflates to more than 4,194,304 bytes" in err


def test_csv_gz_bomb_is_refused_by_the_streaming_reader(tmp_path: Path) -> None:
    rows = "".join(f"2026-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z,G,50\n"
                   for i in range(40_000))
    path = tmp_path / "big.csv.gz"
    path.write_bytes(gzip.compress(("ts,gpu_uuid,util_gpu_pct\n" + rows).encode()))
    err = _clean_error(_cli("report", str(path), "--price", "2", "--max-input-bytes",
                            "200kB"))
    assert "inflates to more than 200,000 bytes" in err
    p = _cli("report", str(path), "--price", "2", "--max-input-bytes", "10MB")
    assert p.returncode == 0, p.stderr


# -- the limits themselves -------------------------------------------------------------------

def test_inflate_gzip_never_holds_much_more_than_the_limit() -> None:
    blob = gzip.compress(b"a" * (200 << 20), 9)
    with pytest.raises(InputError, match="inflates to more than"):
        inflate_gzip(blob, "x", limit=1 << 20)
    assert inflate_gzip(gzip.compress(b"ab") + gzip.compress(b"cd"), "x") == b"abcd"
    with pytest.raises(EOFError):
        inflate_gzip(gzip.compress(b"abc" * 1000)[:-12], "x")


def test_a_lying_gzip_trailer_costs_no_memory() -> None:
    """The trailer's size field sizes the buffer up front, but only within a ratio of the
    compressed size: a 32-byte file that claims 2 GiB does not allocate it, and the stream's own
    length check still calls it corrupt (the caller's error says to check it with gzip -t)."""
    import subprocess
    import sys

    blob = bytearray(gzip.compress(b"ab" * 6))
    blob[-4:] = (2**31 - 1).to_bytes(4, "little")  # claims 2 GiB; holds 12 bytes
    code = ("import sys\n"
            "import zlib\n"
            "from gpuaudit.limits import inflate_gzip\n"
            "try:\n"
            f"    inflate_gzip({bytes(blob)!r}, 'x', limit=2**31)\n"
            "    sys.exit('the wrong size was not noticed')\n"
            "except zlib.error as exc:\n"
            "    assert 'checksum' in str(exc) or 'length' in str(exc), exc\n"
            # the child's own high-water mark: ru_maxrss keeps the parent's (pytest's) peak
            # across fork + exec
            "hwm = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
            "print(int(hwm) // 1024)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.strip()) < 300, f"peak RSS {p.stdout.strip()} MiB"


def test_bounded_stream_counts_what_comes_out() -> None:
    import io

    s = BoundedStream(io.BytesIO(b"x" * 100), "where", limit=50)
    assert s.read(40) == b"x" * 40
    with pytest.raises(InputError, match="where"):
        s.read(40)


def test_json_depth_ignores_strings_and_names_the_line() -> None:
    ok = b'{"a": "[[[[[[{{{{", "b": {"c": 1}}\n' * 3
    check_json_depth(iter([ok]), "f", limit=2)
    bad = ok + b'{"a": [[[1]]]}\n'
    with pytest.raises(InputError) as e:
        check_json_depth(iter([bad[:7], bad[7:]]), "f", limit=2)  # split mid-line
    assert e.value.where == "f:4"


@pytest.mark.parametrize(("text", "n"), [("8GiB", 8 << 30), ("500MB", 500_000_000),
                                         ("1000", 1000), ("1.5kB", 1500)])
def test_parse_bytes(text: str, n: int) -> None:
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["", "x", "-1", "0", "10XB"])
def test_parse_bytes_refuses(text: str) -> None:
    with pytest.raises(InputError):
        parse_bytes(text)


def test_inflate_gzip_backends_agree() -> None:
    """ISA-L (isal, the default) and zlib inflate the same members to the same bytes, and
    both report a truncated stream as EOFError and a corrupt one as zlib.error."""
    import os
    import zlib

    from isal import isal_zlib

    doc = os.urandom(50_000) + b'{"ph": "X", "cat": "kernel"},' * 40_000
    blob = gzip.compress(doc) + b"\0\0" + gzip.compress(doc[:999])
    for make in (lambda: zlib.decompressobj(31), lambda: isal_zlib.decompressobj(31)):
        assert inflate_gzip(blob, "x", inflater=make) == doc + doc[:999]
        with pytest.raises(EOFError):
            inflate_gzip(blob[: len(blob) // 3], "x", inflater=make)
        with pytest.raises(zlib.error):
            inflate_gzip(blob[:30] + b"\xff" * 64 + blob[94:], "x", inflater=make)


def test_inflate_gzip_bytes_is_inflate_gzip_in_one_call() -> None:
    """The one-call inflate of a whole HTTP body: the same bytes as the stepwise one,
    several members included, and the same refusals (over the limit, truncated, corrupt)."""
    import zlib

    doc = b'{"metric":{"a":"b"},"values":[1,2],"timestamps":[3,4]}\n' * 5000
    blob = gzip.compress(doc)
    assert inflate_gzip_bytes(blob, "x") == doc == bytes(inflate_gzip(blob, "x"))
    assert type(inflate_gzip_bytes(blob, "x")) is bytes
    two = gzip.compress(b"ab") + b"\0\0" + gzip.compress(b"cd")
    assert inflate_gzip_bytes(two, "x") == b"abcd"
    with pytest.raises(InputError, match="more than 1,000 bytes"):
        inflate_gzip_bytes(blob, "http://vm:8428/api/v1/export", limit=1000)
    assert inflate_gzip_bytes(blob, "x", limit=len(doc)) == doc
    with pytest.raises(EOFError):
        inflate_gzip_bytes(blob[: len(blob) // 2], "x")
    with pytest.raises(zlib.error):
        inflate_gzip_bytes(blob[:30] + b"\xff" * 64 + blob[94:], "x")
