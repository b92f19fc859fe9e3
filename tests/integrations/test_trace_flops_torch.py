"""A trace written by the torch installed here (2.13, CPU) has no ``args.flops``; gpuaudit
counts each operator's FLOPs from its input shapes and must agree with the profiler's own
counts (``key_averages()``), operator by operator, including convolutions with stride,
padding, dilation and groups, batched and broadcast operators."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.integrations


def _profile(path: Path) -> Counter[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
    dil = torch.nn.Conv2d(6, 12, (3, 5), stride=(1, 2), padding=(2, 0), dilation=(2, 1),
                          groups=3)
    lin = torch.nn.Linear(64, 32)
    x, z = torch.randn(4, 8, 32, 32), torch.randn(2, 6, 20, 17)
    a, b = torch.randn(5, 7, 9), torch.randn(5, 9, 3)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for _ in range(3):
            conv(x)
            dil(z)
            lin(torch.randn(10, 64))
            torch.bmm(a, b)
            torch.baddbmm(torch.randn(5, 7, 3), a, b)
            torch.matmul(torch.randn(3, 4, 5), torch.randn(5, 6))
            a * 2.0
            a + a
            torch.randn(6, 1) * torch.randn(1, 4)
            prof.step()
    prof.export_chrome_trace(str(path))
    truth: Counter[str] = Counter()
    for e in prof.key_averages():
        if e.flops:
            truth[e.key] += int(e.flops)
    return truth


def test_counts_from_a_real_torch_trace_equal_the_profilers(tmp_path: Path) -> None:
    from gpuaudit.traces.loader import load_trace

    path = tmp_path / "trace.json"
    truth = _profile(path)
    doc = json.loads(path.read_text())
    assert not any("flops" in (e.get("args") or {}) for e in doc["traceEvents"]), \
        "this torch writes args.flops again: the derived path is no longer what users meet"
    assert {"aten::conv2d", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mm",
            "aten::mul", "aten::add"} <= set(truth)
    r = load_trace(path)
    got: Counter[str] = Counter()
    for i, f in zip(r.flop_ops.name_idx, r.flop_ops.flops):
        got[r.flop_ops.names[i]] += int(f)
    assert got == truth
    assert any("computed from their input shapes" in n.reason for n in r.notes)


def test_rightsize_reads_the_achieved_flops_of_a_torch_trace(tmp_path: Path) -> None:
    """``gpuaudit rightsize --trace`` on a torch 2.13 trace: achieved TFLOP/s = the
    profiler's total over the profiler's span (the trace has no GPU kernels)."""
    from importlib.resources import files

    from gpuaudit.cli import main
    from gpuaudit.traces.loader import load_trace

    path = tmp_path / "trace.json"
    truth = _profile(path)
    span = load_trace(path).profiler_span
    assert span is not None
    rec = Path(str(files("gpuaudit.data").joinpath("nanogpt_8xh100.parquet")))
    out = tmp_path / "rs.json"
    assert main(["rightsize", str(rec), "--trace", str(path), "--throughput", "1200/s",
                 "--no-plan", "--format", "json", "-o", str(out)]) == 0
    got = json.loads(out.read_text())["rightsize"]["achieved_tflops"]
    assert got == pytest.approx(sum(truth.values()) / (span[1] - span[0]) / 1e3, rel=1e-3)
