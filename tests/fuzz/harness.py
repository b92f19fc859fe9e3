"""The readers under hostile bytes: real fixtures, mutated by hypothesis (byte flips,
insertions of structural characters, deep nesting, truncation, huge numbers, NULs, gzip with
and without a cut), fed to every reader a user can point at a file. Each must return or raise
a :class:`gpuaudit.errors.GpuauditError`; anything else (a traceback, a crash) fails.

Run as its own process by tests/fuzz/test_fuzz_readers.py, so a crash (a signal) or the
memory it took is measured from outside:

    python tests/fuzz/harness.py --examples 120
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.errors import GpuauditError

DATA = Path(__file__).parents[1] / "data"
SEEDS = {
    "csv": DATA / "nvidia_smi" / "smi_units.csv",
    "smi-noheader": DATA / "nvidia_smi" / "smi_iso_z.csv",
    "jsonl": DATA / "files" / "table.jsonl",
    "dcgm": DATA / "dcgm" / "l4_kops_conformance.prom",
    "kineto": DATA / "traces" / "mi250_rocm_minitoy.json.gz",
    "focus": DATA / "billing" / "focus_spec_commitment_flexibility_2_resources.csv",
}
SUFFIX = {"csv": ".csv", "smi-noheader": ".csv", "jsonl": ".jsonl", "dcgm": ".prom",
          "kineto": ".json", "focus": ".csv"}
TOKENS = [b"{", b"[", b"}", b"]", b'"', b",", b"\n", b"\r\n", b":", b"nan", b"-inf",
          b"1e309", b"-1", b"\x00", b"\xff\xfe", b"\xc3\x28", b"\x7f", b"[N/A]", b"#",
          b"{" * 5000, b"[" * 20000, b"9" * 400, b"\\", b"\\u0000", b"'", b"%", b"=",
          b"2026-13-45T99:99:99Z", b"GPU-", b"le=\"+Inf\"", b"NaN", b"null", b"true"]


def _seed(name: str) -> bytes:
    raw = SEEDS[name].read_bytes()
    return gzip.decompress(raw) if SEEDS[name].suffix == ".gz" else raw


@st.composite
def mutated(draw: st.DrawFn, seed: bytes) -> tuple[bytes, str]:
    data = bytearray(seed)
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 3, 6]))):
        op = draw(st.sampled_from(["flip", "insert", "token", "delete", "dup", "truncate"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=32))
        elif op == "token":
            data[at:at] = draw(st.sampled_from(TOKENS))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 200))]
        elif op == "dup":
            line_end = data.find(b"\n", at)
            chunk = data[at:line_end + 1 if line_end >= 0 else len(data)]
            data[at:at] = chunk * draw(st.integers(1, 50))
        elif op == "truncate":
            del data[at:]
    pack = draw(st.sampled_from(["plain", "plain", "gzip", "gzip-cut"]))
    out = bytes(data)
    if pack != "plain":
        out = gzip.compress(out)
        if pack == "gzip-cut":
            out = out[: draw(st.integers(0, max(len(out) - 1, 0)))]
    return out, pack


def _samples(path: Path) -> None:
    from gpuaudit.api import audit

    audit(path, price="1").render("json")


def _smi_noheader(path: Path) -> None:
    from gpuaudit.api import audit

    audit(path, price="1", fields=["timestamp", "index", "name", "utilization.gpu",
                                   "memory.used", "power.draw"]).render("json")


def _dcgm(path: Path) -> None:
    from gpuaudit.measure.fleet.dcgm import parse_metrics_text

    text = path.read_bytes().decode("utf-8", "replace")
    parse_metrics_text(text, ts_ns=1_700_000_000 * 10**9, default_host="h", where=str(path))


def _kineto(path: Path) -> None:
    from gpuaudit.traces.analysis import analyze
    from gpuaudit.traces.loader import load_traces

    analyze(load_traces([path]))


def _focus(path: Path) -> None:
    from gpuaudit.price.billing.readers import open_bill

    bill = open_bill(path)
    del bill


READERS: dict[str, Callable[[Path], None]] = {
    "csv": _samples, "smi-noheader": _smi_noheader, "jsonl": _samples, "dcgm": _dcgm,
    "kineto": _kineto, "focus": _focus,
}


def fuzz(name: str, examples: int, tmp: Path, derandomize: bool = True) -> dict[str, int]:
    counts = {"ok": 0, "clear_error": 0}
    seed = _seed(name)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              suppress_health_check=list(HealthCheck))
    @given(mutated(seed))
    def one(case: tuple[bytes, str]) -> None:
        data, pack = case
        path = tmp / (name + SUFFIX[name] + (".gz" if pack != "plain" else ""))
        path.write_bytes(data)
        try:
            READERS[name](path)
            counts["ok"] += 1
        except GpuauditError as exc:
            assert str(exc).strip(), "an error with no message"
            assert len(str(exc)) < 4000, f"an error of {len(str(exc))} characters"
            counts["clear_error"] += 1

    one()
    return counts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--only", default=None)
    ap.add_argument("--random", action="store_true",
                    help="new examples each run (CI uses the fixed, derandomized set)")
    args = ap.parse_args()
    summary = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in READERS:
            if args.only and name != args.only:
                continue
            try:
                summary[name] = fuzz(name, args.examples, Path(tmp), not args.random)
            except Exception:  # hypothesis re-raises the shrunk failing example
                traceback.print_exc()
                print(json.dumps({"failed": name}))
                return 1
    # this process's own high-water mark (kB): ru_maxrss would keep the parent's peak (a long
    # pytest session's) across fork + exec
    with open("/proc/self/status") as f:
        hwm_kib = int(f.read().split("VmHWM:")[1].split()[0])
    print(json.dumps({**summary, "peak_rss_mib": hwm_kib / 1024}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
