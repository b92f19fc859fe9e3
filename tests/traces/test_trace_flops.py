"""FLOP counts from Kineto traces: ``args.flops`` on CPU operators -> achieved TFLOP/s, share
of the GPU's dense peak, the trace report and the recommender's right-size evidence.

Data: tests/data/traces/cpu_linear_flops.json.gz is a REAL torch 2.13 CPU profile (README);
the GPU path uses a copy of the real A100 HTA trace with a SYNTHETIC ``args.flops`` added in
the test (that trace records no input shapes, so the profiler could not have counted them)."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from trace_synth import kernel, launch, write

from gpuaudit.cli import main
from gpuaudit.hardware import spec_for
from gpuaudit.price.catalog import embedded_catalog
from gpuaudit.traces.analysis import AnalysisOptions, analyze
from gpuaudit.traces.flops import SOURCE, achieved_flops
from gpuaudit.traces.loader import load_trace, load_traces

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
CPU = DATA / "cpu_linear_flops.json.gz"
A100 = DATA / "a100_1rank_ddp_nccl.json.gz"


def _doc(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        d: dict[str, Any] = json.load(f)
    return d


def test_real_cpu_trace_flops_are_the_profilers() -> None:
    """Every operator event with args.flops is read, the total is the JSON's own sum (and the
    profiler's key_averages total the generator asserted: 503,644,160)."""
    doc = _doc(CPU)
    with_flops = [e for e in doc["traceEvents"] if "flops" in e.get("args", {})]
    r = load_trace(CPU)
    assert r.flop_ops.size == len(with_flops) == 80
    assert r.flop_ops.total == sum(e["args"]["flops"] for e in with_flops) == 503_644_160
    assert set(r.flop_ops.names) == {e["name"] for e in with_flops}
    assert r.gpu.size == 0
    (row,) = achieved_flops(load_traces([CPU]), analyze(load_traces([CPU])))
    span = r.profiler_span
    assert span is not None
    assert row.window_source == "profiler span"
    assert row.window_ns == span[1] - span[0]
    assert row.tflops_per_s_window == pytest.approx(503_644_160 / row.window_ns / 1e3)
    assert row.gpu_busy_ns is None and row.share_of_peak_busy is None
    assert "no GPU kernels" in row.peak_reason
    assert row.top_ops[0]["name"] == "aten::addmm"


def test_cli_on_cpu_trace_says_what_it_counted(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", str(CPU)]) == 2
    err = capsys.readouterr().err
    assert "no GPU kernel events" in err
    assert "0.504 GFLOP" in err and SOURCE in err


def _a100_with_flops(tmp: Path, per_op: dict[str, int]) -> tuple[Path, dict[str, Any]]:
    """The real A100 trace with a SYNTHETIC args.flops on the named operators."""
    doc = _doc(A100)
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and e.get("name") in per_op:
            e.setdefault("args", {})["flops"] = per_op[e["name"]]
    out = tmp / "a100_flops.json.gz"
    with gzip.open(out, "wt") as f:
        json.dump(doc, f)
    return out, doc


@pytest.mark.parametrize("include_last_step", [True, False])
def test_gpu_trace_achieved_vs_bf16_peak(tmp_path: Path, include_last_step: bool) -> None:
    per_op = {"aten::conv2d": 3_000_000_000, "aten::mm": 1_000_000_000,
              "aten::addmm": 500_000_000}
    path, doc = _a100_with_flops(tmp_path, per_op)
    ev = doc["traceEvents"]
    steps = [e["ts"] for e in ev if str(e.get("name", "")).startswith("ProfilerStep")
             and e.get("ph") == "X"]
    last = max(steps) if len(steps) >= 2 and not include_last_step else float("inf")
    expect = sum(per_op[e["name"]] for e in ev if e.get("cat") == "cpu_op"
                 and e.get("name") in per_op and e["ts"] < last)
    trace = load_traces([path])
    opt = AnalysisOptions(include_last_step=include_last_step)
    a = analyze(trace, opt)
    (row,) = achieved_flops(trace, a)
    ra = a.ranks[0]
    assert row.flops == expect
    assert row.window_ns == ra.window_ns and row.gpu_busy_ns == ra.busy_ns
    spec = spec_for("NVIDIA A100-PG509-200")
    assert spec is not None and spec.bf16_dense_tflops == 312
    # tensor-core kernels carry most of the matmul time in this trace: the bf16 dense peak
    assert ra.tensor_core_ns / ra.matmul_ns >= 0.5
    assert row.peak_precision == "bf16 dense" and row.peak_tflops == 312
    assert row.share_of_peak_busy == pytest.approx(expect / ra.busy_ns / 1e3 / 312)
    assert row.share_of_peak_window == pytest.approx(expect / ra.window_ns / 1e3 / 312)
    assert row.share_of_peak_window <= row.share_of_peak_busy


def test_trace_json_and_terminal_carry_flops(tmp_path: Path) -> None:
    path, _ = _a100_with_flops(tmp_path, {"aten::conv2d": 2_000_000_000})
    out = tmp_path / "r.json"
    assert main(["trace", str(path), "--price", "3", "--format", "json", "-o", str(out)]) == 0
    fl = json.loads(out.read_text())["extra"]["trace"]["flops"]
    assert fl["source"] == SOURCE
    (r0,) = fl["ranks"]
    assert r0["flops"] > 0 and r0["peak_precision"] == "bf16 dense"
    term = tmp_path / "r.txt"
    assert main(["trace", str(path), "--price", "3", "-o", str(term)]) == 0
    text = term.read_text()
    assert "TFLOP/s" in text and "operator FLOP counts" in text
    md = tmp_path / "r.md"
    assert main(["trace", str(path), "--price", "3", "--format", "markdown", "-o",
                 str(md)]) == 0
    assert "Achieved FLOP/s" in md.read_text()


def test_trace_without_flops_has_no_flops_section(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main(["trace", str(A100), "--price", "3", "--format", "json", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["extra"]["trace"]["flops"] is None


def _memory_bound_h100(tmp: Path, flops: int) -> Path:
    """1 ms window, 110 us busy: a bf16 GEMM (20 us) then elementwise kernels (90 us)."""
    ev = [launch(0, 1), kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
                               0, 20, 1),
          launch(10, 2), kernel("void at::native::vectorized_elementwise_kernel<4>", 20, 80, 2),
          launch(980, 3), kernel("void at::native::vectorized_elementwise_kernel<4>", 990, 10,
                                 3),
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0,
           "dur": 5, "args": {"flops": flops}}]
    return write(tmp / "mb.json", ev)


def _recs(tmp: Path, path: Path) -> dict[str, Any]:
    out = tmp / "r.json"
    assert main(["trace", str(path), "--gpu-model", "H100 80GB SXM", "--provider", "aws",
                 "--window-ms", "100", "--format", "json", "-o", str(out)]) == 0
    rep: dict[str, Any] = json.loads(out.read_text())
    return rep


def test_low_share_memory_bound_on_h100_points_to_a_cheaper_gpu(tmp_path: Path) -> None:
    rep = _recs(tmp_path, _memory_bound_h100(tmp_path, 1_000_000_000))
    (row,) = rep["extra"]["trace"]["flops"]["ranks"]
    assert row["memory_bound_kernel_share"] == pytest.approx(90 / 110)
    assert row["tflops_per_s_busy"] == pytest.approx(1e9 / 110_000 / 1e3)
    recs = [r for r in rep["recommendations"] if "TFLOP/s" in r["evidence"]]
    assert len(recs) == 1
    rec = recs[0]
    assert rec["id"] == "right_size"
    # a trace records no memory use: listed with its standalone saving, not counted
    assert not rec["counted"] and "memory" in rec["why_not_counted"]
    # the named candidate is cheaper at aws and keeps both limits under 70 %
    named = [e for e in embedded_catalog() if e.provider == "aws"
             and f"{e.instance} ({e.gpu_model})" in rec["evidence"]]
    assert named
    cand = min(named, key=lambda e: e.on_demand_usd_per_gpu_hour)
    rate = Decimal("6.88")
    assert cand.on_demand_usd_per_gpu_hour < rate
    assert Decimal(str(rec["fraction"])) == pytest.approx(
        1 - cand.on_demand_usd_per_gpu_hour / rate, abs=Decimal("0.000001"))
    spec = spec_for(cand.gpu_model)
    assert spec is not None
    peak = spec.bf16_dense_tflops or spec.fp16_dense_tflops
    assert peak is not None and row["tflops_per_s_busy"] <= 0.7 * peak
    assert 0.11 * 3350 / spec.memory_bandwidth_gb_per_s <= 0.7 + 1e-9


def test_high_share_or_no_memory_bound_evidence_keeps_the_gpu(tmp_path: Path) -> None:
    # 400 TFLOP/s over busy time on an H100 (989 dense bf16): 40 % of peak, not low
    rep = _recs(tmp_path, _memory_bound_h100(tmp_path, 44_000_000_000))
    assert not [r for r in rep["recommendations"] if "TFLOP/s" in r["evidence"]]
    # the real A100 trace: 44 % of kernel time memory-bound, under the 50 % the rule needs
    path, _ = _a100_with_flops(tmp_path, {"aten::conv2d": 1_000_000})
    out = tmp_path / "a.json"
    assert main(["trace", str(path), "--gpu-model", "A100 80GB SXM", "--provider", "aws",
                 "--format", "json", "-o", str(out)]) == 0
    rep = json.loads(out.read_text())
    (row,) = rep["extra"]["trace"]["flops"]["ranks"]
    assert row["memory_bound_kernel_share"] < 0.5
    assert not [r for r in rep["recommendations"] if "TFLOP/s" in r["evidence"]]


_FLOPS = st.one_of(st.integers(0, 9 * 10**15), st.integers(-10**6, -1), st.just(1.5),
                   st.just("12"), st.just(None),
                   st.text(alphabet="abc xyz", max_size=3))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_FLOPS, min_size=1, max_size=30))
def test_loader_keeps_whole_nonnegative_counts_and_notes_the_rest(
        tmp_path_factory: pytest.TempPathFactory, values: list[Any]) -> None:
    """Every whole count >= 0 is summed exactly (JSON strings holding one too, as the loader
    reads every number); anything else is dropped with a note, never read as zero."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": i,
           "dur": 1, "args": {"flops": v}} for i, v in enumerate(values)]
    p = write(tmp_path_factory.mktemp("f") / "t.json", ev)
    r = load_trace(p)
    good = [int(v) for v in values if (isinstance(v, int) and v >= 0)
            or (isinstance(v, str) and v.isascii() and v.isdigit())]
    assert r.flop_ops.total == sum(good)
    assert r.flop_ops.size == len(good)
    bad = len(values) - len(good)
    noted = sum(n.count for n in r.notes if "args.flops" in n.reason)
    assert noted == bad


NANOGPT = Path(__file__).resolve().parents[2] / "src" / "gpuaudit" / "data" / \
    "nanogpt_8xh100.parquet"


def test_rightsize_takes_achieved_flops_from_a_trace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # plumbing only: an A100 trace beside an 8 x H100 recording is not one job, and the
    # note says the rank count differs
    path, _ = _a100_with_flops(tmp_path, {"aten::conv2d": 2_000_000_000})
    trace = load_traces([path])
    (row,) = achieved_flops(trace, analyze(trace), gpu_model="H100")
    assert main(["rightsize", str(NANOGPT), "--trace", str(path), "--no-plan",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["rightsize"]
    assert doc["achieved_tflops"] == pytest.approx(row.tflops_per_s_window, rel=1e-3)
    # the report rounds the share to 5 decimals
    assert doc["mfu"] == pytest.approx(row.tflops_per_s_window / (989 * 8), abs=1e-5)
    assert any("operator FLOP counts" in n and "1 rank(s) but the run 8 GPU(s)" in n
               for n in doc["notes"])
    # both sources of the achieved FLOP/s at once, or a trace without counts: errors
    assert main(["rightsize", str(NANOGPT), "--trace", str(path), "--throughput", "1200/s",
                 "--flops-per-unit", "1e9"]) == 2
    assert "--trace and --flops-per-unit" in capsys.readouterr().err
    assert main(["rightsize", str(NANOGPT), "--trace", str(A100)]) == 2
    assert "no operator FLOP counts" in capsys.readouterr().err


def test_html_report_shows_the_flops_section(tmp_path: Path) -> None:
    path, _ = _a100_with_flops(tmp_path, {"aten::conv2d": 2_000_000_000})
    out = tmp_path / "r.html"
    assert main(["trace", str(path), "--price", "3", "--format", "html", "-o", str(out)]) == 0
    html = out.read_text()
    assert "share_of_peak_busy" in html and "operator FLOP counts" in html


@settings(max_examples=60, deadline=None)
@given(old=st.lists(st.tuples(st.integers(0, 10**6), st.booleans()), max_size=3),
       new=st.lists(st.tuples(st.integers(0, 10**6), st.booleans()), max_size=3))
def test_at_most_one_right_size_pick_is_counted(old: list[tuple[int, bool]],
                                                new: list[tuple[int, bool]]) -> None:
    """An hour moves to one GPU: whatever right-size picks meet, at most one is counted, it is
    the largest counted one, and nothing is lost from the list."""
    from gpuaudit.recommend.plan import Recommendation, remediation_catalog
    from gpuaudit.recommend.rules import _one_sku_move

    rem = remediation_catalog()["right_size"]

    def rec(f: int, counted: bool) -> Recommendation:
        frac = Decimal(f) / Decimal(10**6)
        return Recommendation(remediation=rem, fraction=frac, cap=Decimal(1), counted=counted,
                              evidence="e", scope=("all",), monthly_usd=frac * 100)

    olds = [rec(f, c) for f, c in old]
    news = [rec(f, c) for f, c in new]
    counted_before = [r for r in olds if r.counted]
    assume(len(counted_before) <= 1)  # the other rules yield at most one right-size pick
    out = _one_sku_move(olds, news)
    assert len(out) == len(olds) + len(news)
    counted = [r for r in out if r.counted]
    assert len(counted) <= 1
    wanted = [r.fraction for r in [*olds, *news] if r.counted]
    if wanted:
        assert counted and counted[0].fraction == max(wanted)


def _without_flops(doc: dict[str, Any], tmp: Path) -> Path:
    for e in doc["traceEvents"]:
        (e.get("args") or {}).pop("flops", None)
    out = tmp / "no_flops.json"
    out.write_text(json.dumps(doc))
    return out


def test_counts_from_input_shapes_equal_the_profilers(tmp_path: Path) -> None:
    """torch 2.x exports no args.flops; the real trace's operators still carry their Input
    Dims, and the counts computed from them are, event by event, the profiler's own (the
    args.flops the fixture's generator copied from KinetoEvent.flops())."""
    doc = _doc(CPU)
    truth = [(e["name"], e["args"]["flops"]) for e in doc["traceEvents"]
             if "flops" in e.get("args", {})]
    r = load_trace(_without_flops(doc, tmp_path))
    got = [(r.flop_ops.names[i], int(f)) for i, f in zip(r.flop_ops.name_idx, r.flop_ops.flops)]
    assert sorted(got) == sorted(truth)
    assert any("80 operator FLOP counts computed from their input shapes" in n.reason
               for n in r.notes)
    # the original, with args.flops, says nothing about shapes: nothing was derived
    assert not any("input shapes" in n.reason for n in load_trace(CPU).notes)


def test_shapes_that_do_not_fit_are_dropped_with_a_note(tmp_path: Path) -> None:
    doc = _doc(CPU)
    ops = [e for e in doc["traceEvents"] if e.get("name") == "aten::addmm"]
    ops[0]["args"]["Input Dims"] = [[512], [64, 256], [7, 512]]  # K mismatch
    ops[1]["args"]["Input Dims"] = "not a list"
    n_all = sum(1 for e in doc["traceEvents"] if "flops" in e.get("args", {}))
    # a present but unreadable args.flops is never replaced by a derived count
    ops[2]["args"]["flops"] = "many"
    bad = ops[2]
    path = tmp_path / "bad.json"
    for e in doc["traceEvents"]:
        if e is not bad:
            (e.get("args") or {}).pop("flops", None)
    path.write_text(json.dumps(doc))
    r = load_trace(path)
    assert r.flop_ops.size == n_all - 3
    assert any(n.reason.startswith("3 operators whose FLOP count cannot be read")
               for n in r.notes)


@pytest.mark.parametrize(("name", "dims", "concrete", "flops"), [
    ("aten::mm", [[12, 5], [5, 6]], None, 2 * 12 * 5 * 6),
    ("aten::addmm", [[6], [12, 5], [5, 6]], None, 2 * 12 * 5 * 6),
    ("aten::bmm", [[5, 7, 9], [5, 9, 3]], None, 2 * 5 * 7 * 9 * 3),
    ("aten::baddbmm", [[5, 7, 3], [5, 7, 9], [5, 9, 3], [], []], None, 2 * 5 * 7 * 9 * 3),
    ("aten::mul", [[6, 1], [1, 4]], None, 6),  # the first input's elements, not the output's
    ("aten::add", [[5, 7, 9], [5, 7, 9], []], None, 315),
    # torch 2.13 on this convolution (stride 2, padding 1): key_averages() says 2,359,296
    ("aten::conv2d", [[4, 8, 32, 32], [16, 8, 3, 3], [16], [], [], [], []],
     ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"], 2_359_296),
    ("aten::conv2d", [[4, 8, 32, 32], [16, 8, 3, 3], [16], [], [], [], []],
     ["", "", ""], None),  # stride etc. not recorded: no guess
    ("aten::matmul", [[3, 4, 5], [5, 6]], None, None),  # composite: its mm is counted
    ("aten::mul_", [[5, 7, 9], [5, 7, 9]], None, None),  # in place: no count, as torch
    ("aten::bmm", [[5, 7, 9], [4, 9, 3]], None, None),  # batch mismatch
])
def test_op_flops_formulas(name: str, dims: Any, concrete: Any, flops: int | None) -> None:
    from gpuaudit.traces.op_flops import op_flops

    raw_concrete = json.dumps(concrete).encode() if concrete is not None else b""
    assert op_flops(name, json.dumps(dims).encode(), raw_concrete) == flops
