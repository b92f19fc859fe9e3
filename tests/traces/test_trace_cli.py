"""`gpuaudit trace` through the shared pipeline: audit(), cli.options, the trace section in
every format, trace evidence in the recommendations, and the nsys summary path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trace_synth import kernel, launch, span, write

from gpuaudit.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def _run(args: list[str], out: Path) -> str:
    assert main(["trace", *args, "-o", str(out)]) == 0
    return out.read_text()


def test_real_v100_trace_evidence_lands_in_recommendations(tmp_path: Path) -> None:
    """The V100 trace runs FP32 sgemm and many tiny kernels: AMP and torch.compile are
    counted, and their evidence is the trace's own sentences."""
    rep = json.loads(_run([str(DATA / "v100_1rank_ns_resolution.json.gz"), "--price", "3",
                           "--format", "json"], tmp_path / "r.json"))
    trace = rep["extra"]["trace"]
    r0 = trace["ranks"][0]
    recs = {r["id"]: r for r in rep["recommendations"]}
    tc = next(f for f in trace["findings"] if f["signal"] == "tensor_core_share")
    assert tc["value"] == pytest.approx(r0["tensor_core_ns"] / r0["matmul_ns"])
    if tc["value"] < 0.2:
        assert recs["amp_bf16"]["counted"]
        assert tc["sentence"] in recs["amp_bf16"]["evidence"]
    sk = next(f for f in trace["findings"] if f["signal"] == "small_kernel_share")
    assert sk["value"] == pytest.approx(r0["small_kernel_count"] / r0["kernel_count"])
    if sk["value"] >= 0.3:
        assert recs["torch_compile"]["counted"]
        assert "GPU kernels run under 10 us" in recs["torch_compile"]["evidence"]
    assert {f["signal"] for f in rep["findings"]} >= {"tensor_core_share",
                                                       "small_kernel_share"}


def test_input_stall_sentence_becomes_dataloader_evidence(tmp_path: Path) -> None:
    """GPU idle 100..900 us while the DataLoader runs 100..700 us (75% of idle)."""
    ev = [launch(0, 1), kernel("volta_sgemm_128x64_nn", 0, 100, 1),
          span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 100, 600),
          launch(850, 2), kernel("volta_sgemm_128x64_nn", 900, 100, 2)]
    p = write(tmp_path / "dl.json", ev)
    rep = json.loads(_run([str(p), "--price", "2", "--window-ms", "0.05", "--format", "json"],
                          tmp_path / "r.json"))
    recs = {r["id"]: r for r in rep["recommendations"]}
    ev_text = recs["dataloader"]["evidence"]
    assert "75% of GPU idle time falls inside DataLoader" in ev_text
    assert "num_workers" in ev_text
    assert recs["dataloader"]["counted"]


def test_markdown_is_markdown_with_the_trace_section(tmp_path: Path) -> None:
    md = _run([str(DATA / "two_ranks"), "--price", "2", "--format", "markdown"],
              tmp_path / "r.md")
    assert md.startswith("# gpuaudit report")
    assert "\n## Profiler trace\n" in md and "\n### Kernel types (all ranks)\n" in md
    lines = md.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| rank | window |"))
    assert lines[head + 1].startswith("|---:")
    assert lines[head + 1].count("|") == lines[head].count("|")
    assert [ln.split("|")[1].strip() for ln in lines[head + 2:head + 4]] == ["0", "1"]
    assert not any(ch in md for ch in "│─╭")  # no terminal box drawing


def test_terminal_shows_trace_section_and_recommendations(tmp_path: Path) -> None:
    text = _run([str(DATA / "a100_1rank_ddp_nccl.json.gz"), "--price", "2"], tmp_path / "r.txt")
    assert "Recommendations" in text and "Profiler trace" in text
    assert "kernel types (all ranks):" in text and "host wait" in text


def test_nsys_csv_unpriced_says_so(tmp_path: Path) -> None:
    text = _run([str(DATA / "nsys_cuda_gpu_kern_sum.csv")], tmp_path / "r.txt")
    assert "not priced" in text and "cannot show" in text


def test_nsys_csv_prices_kernel_time(tmp_path: Path) -> None:
    rep = json.loads(_run([str(DATA / "nsys_cuda_gpu_kern_sum.csv"), "--price", "3.60",
                           "--format", "json"], tmp_path / "r.json"))
    t = rep["trace"]
    hours = t["kernel_time_ns"] / 3.6e12
    assert float(t["cost"]["kernel_time_usd"]) == pytest.approx(round(3.6 * hours, 2))
    assert "lower bound" in t["cost_statement"]
    md = _run([str(DATA / "nsys_cuda_gpu_kern_sum.csv"), "--format", "markdown"],
              tmp_path / "r.md")
    assert "## nsys kernel summary" in md and "| category | time | share |" in md


def test_nsys_csv_html_is_refused_clearly(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", str(DATA / "nsys_cuda_gpu_kern_sum.csv"), "--format", "html"]) == 2
    assert "needs a timeline" in capsys.readouterr().err
