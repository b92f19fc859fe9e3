"""Loading Kineto traces: formats, ranks, launches, and bad input reported with a location."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pytest
from trace_synth import kernel, launch, span, write

from gpuaudit.errors import InputError
from gpuaudit.traces.analysis import AnalysisOptions, analyze
from gpuaudit.traces.loader import load_trace, load_traces

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def test_gzip_and_plain_load_identically(tmp_path: Path) -> None:
    plain = tmp_path / "rank-0.json"
    plain.write_bytes(gzip.decompress((DATA / "mi250_rocm_minitoy.json.gz").read_bytes()))
    a = load_trace(DATA / "mi250_rocm_minitoy.json.gz")
    b = load_trace(plain)
    assert a.kernels.equals(b.kernels)
    assert a.meta == b.meta


def test_rocm_hip_launches_are_joined() -> None:
    r = load_trace(DATA / "mi250_rocm_minitoy.json.gz")
    assert r.kernels.num_rows > 0
    names = set(pc.drop_null(r.kernels.column("launch_name")).to_pylist())
    assert any(n.startswith("hip") for n in names)
    assert r.device_name(0) == "AMD Radeon Graphics"


def test_float_ns_timestamps_are_exact() -> None:
    r = load_trace(DATA / "v100_1rank_ns_resolution.json.gz")
    assert r.float_ts
    # the first kernel in the file: "ts": 1712195495505582.988, "dur": 4.928 (a float64
    # holds that ts as 1712195495505583.0: 12 ns lost)
    ts = r.kernels.column("ts_ns").to_pylist()
    dur = r.kernels.column("dur_ns").to_pylist()
    assert 1712195495505582988 in ts
    assert dur[ts.index(1712195495505582988)] == 4928
    assert min(dur) >= 0


def test_trace_without_rank_is_rank_zero_with_note(tmp_path: Path) -> None:
    p = write(tmp_path / "t.json", [launch(0, 1), kernel("k", 10, 5, 1)], rank=None)
    r = load_trace(p)
    assert r.rank == 0
    assert any("no distributedInfo.rank" in n.reason for n in r.notes)


def test_several_rankless_traces_get_distinct_ranks(tmp_path: Path) -> None:
    for i in range(2):
        write(tmp_path / f"r{i}.json", [launch(0, 1), kernel("k", 10, 5, 1)], rank=None)
    t = load_traces([tmp_path])
    assert [r.rank for r in t.ranks] == [0, 1]
    assert any("ranks assigned" in n.reason for n in t.notes)


def test_duplicate_rank_is_an_error(tmp_path: Path) -> None:
    for i in range(2):
        write(tmp_path / f"r{i}.json", [launch(0, 1), kernel("k", 10, 5, 1)], rank=3)
    with pytest.raises(InputError, match="rank 3 appears in two traces"):
        load_traces([tmp_path])


def test_truncated_gzip_reports_offset(tmp_path: Path) -> None:
    src = (DATA / "a100_1rank_ddp_nccl.json.gz").read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(src[: len(src) // 2])
    with pytest.raises(InputError) as exc:
        load_trace(p)
    assert "truncated" in str(exc.value)
    assert exc.value.where is not None and "byte" in exc.value.where
    assert exc.value.fix


def test_invalid_json_reports_byte_offset(tmp_path: Path) -> None:
    p = write(tmp_path / "bad.json", [launch(0, 1), kernel("k", 10, 5, 1),
                                      kernel("k", 20, 5, 2)])
    text = p.read_bytes()
    pos = text.index(b'"name": "k"', text.index(b'"ts": 20') - 200)
    bad = text[:pos] + b"@@" + text[pos:]
    p.write_bytes(bad)
    with pytest.raises(InputError) as exc:
        load_trace(p)
    assert exc.value.where is not None
    offset = int(exc.value.where.rsplit("byte ", 1)[1])
    assert abs(offset - pos) < 200  # points at the damage, in the user's file


def test_not_a_trace(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text('[{"a": 1}]')
    with pytest.raises(InputError, match="traceEvents"):
        load_trace(p)
    p.write_text("")
    with pytest.raises(InputError, match="empty"):
        load_trace(p)


def test_no_gpu_events_is_noted_not_refused(tmp_path: Path) -> None:
    p = write(tmp_path / "cpu.json", [span("aten::mm", 0, 10, cat="cpu_op")])
    r = load_trace(p)
    assert r.kernels.num_rows == 0
    assert any("no GPU events" in n.reason for n in r.notes)
    a = analyze(load_traces([p]))
    assert a.ranks[0].window_ns == 0


def test_unknown_categories_are_counted(tmp_path: Path) -> None:
    ev = [launch(0, 1), kernel("k", 10, 5, 1),
          {"ph": "X", "cat": "weird_cat", "name": "x", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
          {"ph": "X", "cat": "weird_cat", "name": "y", "pid": 1, "tid": 1, "ts": 2, "dur": 1}]
    r = load_trace(write(tmp_path / "u.json", ev))
    note = next(n for n in r.notes if "unknown categories" in n.reason)
    assert note.count == 2 and "weird_cat" in note.reason


def test_negative_and_absurd_durations_are_dropped_with_notes(tmp_path: Path) -> None:
    ev = [launch(0, 1), kernel("ok", 10, 5, 1), launch(1, 2), kernel("neg", 30, -3, 2),
          launch(2, 3), kernel("years", 40, 3.0e13, 3),
          {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
           "tid": "PyTorch Profiler", "ts": 0, "dur": 1000}]
    r = load_trace(write(tmp_path / "d.json", ev))
    assert r.kernels.column("name").to_pylist() == ["ok"]
    reasons = " | ".join(n.reason for n in r.notes)
    assert "negative duration" in reasons and "impossible duration" in reasons


def test_graph_launch_attaches_every_kernel(tmp_path: Path) -> None:
    """cudaGraphLaunch: one runtime event, several kernels with its correlation id."""
    ev = [launch(0, 9, name="cudaGraphLaunch"), kernel("a", 10, 5, 9),
          kernel("b", 16, 5, 9), kernel("c", 22, 5, 9)]
    r = load_trace(write(tmp_path / "g.json", ev))
    assert r.kernels.column("launch_name").to_pylist() == ["cudaGraphLaunch"] * 3
    assert r.kernels.column("launch_ts_ns").to_pylist() == [0] * 3


def test_ncclDevKernel_is_communication_except_in_hta_compat(tmp_path: Path) -> None:
    name = "void ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    ev = [launch(0, 1), kernel("void at::native::vectorized_elementwise_kernel<4>(int)",
                               10, 100, 1), launch(1, 2), kernel(name, 50, 100, 2, stream=20)]
    t = load_traces([write(tmp_path / "n.json", ev)])
    native = analyze(t).ranks[0]
    compat = analyze(t, AnalysisOptions(hta_compat=True)).ranks[0]
    assert native.comm_ns == 100_000
    assert native.comm_comp_overlap_ns == 60_000
    assert compat.comm_ns == 0  # HTA 0.5.0's regex misses the modern name (#122, #247)


def test_kernel_categories_matmul_and_tensor_core_time(tmp_path: Path) -> None:
    """Each kernel's time lands in its category; GEMM, convolution and attention kernels
    are the matmul time, those of them on tensor cores the tensor-core time."""
    names = {"ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn": 100,  # TC
             "implicit_convolve_sgemm": 200,  # convolution, no tensor-core marker
             "flash_fwd_kernel": 400,  # attention, tensor cores
             "void at::native::vectorized_elementwise_kernel<4>(int)": 800,
             "void at::native::reduce_kernel<512, 1>(int)": 1600}
    ev: list[dict[str, object]] = []
    for i, (name, dur) in enumerate(names.items()):
        ev += [launch(10_000 * i, i), kernel(name, 10_000 * i + 10, dur, i)]
    r = analyze(load_traces([write(tmp_path / "k.json", ev)])).ranks[0]
    assert r.category_ns == {"gemm": 100_000, "convolution": 200_000, "attention": 400_000,
                             "elementwise": 800_000, "reduction": 1_600_000}
    assert r.matmul_ns == 700_000 and r.tensor_core_ns == 500_000
    assert r.kernel_count == 5


def test_skewed_rank_clocks_are_noted(tmp_path: Path) -> None:
    write(tmp_path / "r0.json", [launch(0, 1), kernel("k", 10, 5, 1)], rank=0)
    write(tmp_path / "r1.json", [launch(5e6, 1), kernel("k", 5e6 + 10, 5, 1)], rank=1)
    t = load_traces([tmp_path])
    assert any("skewed" in n.reason for n in t.notes)
    a = analyze(t)
    assert a.ranks[0].window_ns == a.ranks[1].window_ns == 5000


def test_directory_of_real_rank_traces(tmp_path: Path) -> None:
    shutil.copytree(DATA / "two_ranks", tmp_path / "run")
    t = load_traces([tmp_path / "run"])
    assert [r.rank for r in t.ranks] == [0, 1]
    tl = t.timeline()
    assert set(tl.column("rank").to_pylist()) == {0, 1}
    for col in ("stream", "name", "cat", "ts_ns", "dur_ns", "correlation", "launch_ts_ns"):
        assert col in tl.column_names
