"""Trace -> sample table, findings, nsys summary and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from trace_synth import kernel, launch, span, write

from gpuaudit.cli import main
from gpuaudit.errors import InputError
from gpuaudit.schema import SAMPLE_SCHEMA
from gpuaudit.traces.analysis import analyze
from gpuaudit.traces.loader import load_traces
from gpuaudit.traces.nsys import read_nsys_kern_sum
from gpuaudit.traces.recording import findings, trace_to_recording

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


@pytest.mark.parametrize("src", ["two_ranks", "a100_1rank_ddp_nccl.json.gz",
                                 "v100_1rank_ns_resolution.json.gz"])
def test_recording_busy_share_matches_analysis(src: str) -> None:
    t = load_traces([DATA / src])
    rec = trace_to_recording(t, window_s=0.05)
    assert rec.table.schema == SAMPLE_SCHEMA and rec.source == "trace"
    a = analyze(t)
    for r in a.ranks:
        rows = rec.table.filter(
            np.array([f"rank{r.rank}:" in u for u in rec.table.column("gpu_uuid").to_pylist()]))
        ts = rows.column("ts").cast("int64").to_numpy()
        util = rows.column("util_gpu_pct").to_numpy().astype(np.float64)
        length = np.diff(np.append(ts, ts[0] + r.window_ns))
        busy = float((util / 100.0 * length).sum())
        assert abs(busy - r.busy_ns) <= 1e-5 * r.window_ns  # float32 percent rounding


def test_recording_identity_and_model() -> None:
    rec = trace_to_recording(load_traces([DATA / "a100_1rank_ddp_nccl.json.gz"]))
    row = rec.table.drop_columns(["ts"]).slice(0, 1).to_pylist()[0]
    assert row["gpu_model"] == "NVIDIA A100-PG509-200"
    assert row["gpu_uuid"].startswith("trace:") and "rank0" in row["gpu_uuid"]
    ts_ns = rec.table.column("ts").cast("int64")[0].as_py()
    assert 2024 == 1970 + ts_ns // (365.2425 * 86400e9)  # baseTimeNanoseconds applied


def test_dataloader_stall_finding(tmp_path: Path) -> None:
    """GPU idle 100..900 us while the DataLoader runs 100..700 us: 75% of idle is input."""
    ev = [launch(0, 1), kernel("volta_sgemm_128x64_nn", 0, 100, 1),
          span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 100, 600),
          launch(850, 2), kernel("volta_sgemm_128x64_nn", 900, 100, 2)]
    t = load_traces([write(tmp_path / "dl.json", ev)])
    a = analyze(t)
    r = a.ranks[0]
    assert (r.idle_ns, r.input_stall_ns, r.idle_host_wait_ns) == (800_000, 600_000, 800_000)
    by = {f.signal: f for f in findings(a)}
    assert by["input_stall_share"].value == pytest.approx(0.75)
    assert "num_workers" in by["input_stall_share"].sentence
    assert by["tensor_core_share"].value == 0.0  # sgemm only


def test_nsys_kern_sum() -> None:
    s = read_nsys_kern_sum(DATA / "nsys_cuda_gpu_kern_sum.csv")
    d = s.as_dict()
    cats = d["category_ns"]
    assert cats["gemm"] == 104_200_000 + 42_800_000
    assert cats["communication"] == 24_000_000
    assert d["tensor_core_share"] == pytest.approx(104.2 / 147.0)
    assert d["cannot_show"]


def test_nsys_wrong_csv(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="cuda_gpu_kern_sum"):
        read_nsys_kern_sum(p)


def test_cli_json_and_price(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    rc = main(["trace", str(DATA / "two_ranks"), "--format", "json", "--price", "2.50",
               "-o", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    trace = rep["extra"]["trace"]
    assert [r["rank"] for r in trace["ranks"]] == [0, 1]
    assert {g["gpu_uuid"].split(":")[-2] for g in rep["gpus"]} == {"rank0", "rank1"}
    # the priced recording is the trace's busy share: idle phase share follows the idle ns
    idle_ns = sum(r["idle_ns"] for r in trace["ranks"])
    window_ns = sum(r["window_ns"] for r in trace["ranks"])
    assert trace["idle_share"] == pytest.approx(idle_ns / window_ns)
    assert [r["usd_per_gpu_hour"] for r in rep["rates"]] == ["2.50"]
    assert rep["rates"][0]["source"].startswith("--price")


def test_cli_error_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "t.json.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00garbage")
    assert main(["trace", str(p)]) == 2
    assert "error:" in capsys.readouterr().err
