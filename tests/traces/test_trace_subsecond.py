"""Trace reports at sub-second scale (issue 14, item 7), on the real HTA traces: durations in
ms/us, the phase table equal to the trace's own busy/idle split, evidence without "0.0 observed
hours", and a profiler trace given to ``gpuaudit report`` pointed at ``gpuaudit trace``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuaudit.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
TRACES = ["a100_1rank_ddp_nccl.json.gz", "v100_1rank_ns_resolution.json.gz", "two_ranks",
          "mi250_rocm_minitoy.json.gz"]


def _run(args: list[str], out: Path) -> str:
    assert main(["trace", *args, "-o", str(out)]) == 0
    return out.read_text()


@pytest.mark.parametrize("src", TRACES)
def test_phase_table_is_the_traces_own_idle_share(tmp_path: Path, src: str) -> None:
    d = json.loads(_run([str(DATA / src), "--price", "2", "--format", "json"],
                        tmp_path / "r.json"))
    trace = d["extra"]["trace"]
    overall = d["phases"]["overall"]
    secs = overall["seconds"]
    window_s = sum(r["window_ns"] for r in trace["ranks"]) / 1e9
    assert overall["observed_s"] == pytest.approx(window_s, abs=1e-3)  # no interval added
    assert overall["unobserved_s"] == 0
    assert secs["idle"] / overall["observed_s"] == pytest.approx(trace["idle_share"], abs=1e-5)
    assert secs["underutilized"] == secs["productive"] == 0
    idle_pct = 100 * trace["idle_share"]
    assert abs(overall["shares_pct"]["idle"] - idle_pct) <= 1  # whole percents
    for g, r in zip(sorted(d["gpus"], key=lambda g: g["gpu_uuid"]), trace["ranks"]):
        assert g["phases"]["seconds"]["idle"] == pytest.approx(r["idle_ns"] / 1e9, abs=1e-6)


@pytest.mark.parametrize("src", TRACES)
def test_sub_second_windows_read_in_ms(tmp_path: Path, src: str) -> None:
    for fmt, name in (("terminal", "r.txt"), ("markdown", "r.md"), ("html", "r.html")):
        text = _run([str(DATA / src), "--price", "2", "--format", fmt], tmp_path / name)
        assert re.search(r"\(\d[\d,.]* ms\)", text), fmt  # the window, e.g. (435.6 ms)
        assert "(0 s)" not in text and "(1 s)" not in text, fmt
        assert "0.0 observed hours" not in text and "0.0 h of data" not in text, fmt
        assert re.search(r"interval 100[\s│]*ms", text), fmt
        assert re.search(r"window cost under[\s│]*a[\s│]*cent", text), fmt  # not just $0.00


def test_a100_trace_figures(tmp_path: Path) -> None:
    text = _run([str(DATA / "a100_1rank_ddp_nccl.json.gz"), "--price", "2"], tmp_path / "r")
    assert "(435.6 ms)" in text
    idle_row = next(ln for ln in text.splitlines() if ln.strip().startswith("idle (<10%)"))
    assert "336.4 ms" in idle_row and "77%" in idle_row
    assert "idle 77.2%" in text  # the trace section says the same


@pytest.mark.parametrize("src", ["a100_1rank_ddp_nccl.json.gz", "two_ranks/sampled_rank-0.json.gz",
                                 "mi250_rocm_minitoy.json.gz"])
def test_report_on_a_profiler_trace_points_at_gpuaudit_trace(
        src: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["report", str(DATA / src), "--price", "2"]) == 2
    err = capsys.readouterr().err
    assert "this is a profiler trace" in err and "use gpuaudit trace" in err
    assert "first line is empty" not in err and "Traceback" not in err
    plain = tmp_path / "t.json"  # uncompressed .json too
    import gzip

    plain.write_bytes(gzip.decompress((DATA / src).read_bytes()))
    assert main(["report", str(plain), "--price", "2"]) == 2
    assert "use gpuaudit trace" in capsys.readouterr().err
