"""``simulate`` and ``rightsize`` with their plan: the profiles and the plan's audit come from
one read of the recording (issue 27), and the plan is the one the audit of the file gives."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpuaudit.api import audit, rightsize, simulate
from gpuaudit.api.compose import plan_dict
from gpuaudit.capacity.profiles import ProfileBuilder, build_profiles
from gpuaudit.classify import fused
from gpuaudit.errors import InputError
from gpuaudit.measure.files import open_samples
from gpuaudit.measure.files.reader import FileSource
from gpuaudit.schema import build_table

ROOT = Path(__file__).parents[2]
NANOGPT = ROOT / "src" / "gpuaudit" / "data" / "nanogpt_8xh100.parquet"
NANOGPT_CSV = ROOT / "tests" / "data" / "core" / "nanogpt_8xh100_nvidia_smi.csv"
T0 = 1_767_225_600 * 10**9


def _recording(path: Path, gpus: int, steps: int, *, swap: int | None = None,
               per_job: int = 1) -> Path:
    """``gpus`` GPUs (``per_job`` to a job: one pod on one host) at one sample a minute,
    with the memory used and total every sampler records; ``swap``: that row and the next
    exchanged (one GPU's samples out of time order)."""
    rng = np.random.default_rng(3)
    t = np.repeat(np.arange(steps), gpus)
    g = np.tile(np.arange(gpus), steps)
    ts = T0 + t * 60 * 10**9
    if swap is not None:
        ts[[swap, swap + gpus]] = ts[[swap + gpus, swap]]
    table = build_table({
        "ts": pa.array(ts).cast(pa.timestamp("ns", "UTC")),
        "host": pa.array([f"node-{i // 8}" for i in g]),
        "gpu_uuid": pa.array([f"GPU-{i:04d}" for i in g]),
        "gpu_model": pa.array(["NVIDIA H100 80GB HBM3"] * g.size),
        "util_gpu_pct": pa.array(rng.uniform(0, 100, g.size).round().astype(np.float32)),
        "mem_used_mib": pa.array(rng.uniform(1000, 60000, g.size).astype(np.float32)),
        "mem_total_mib": pa.array(np.full(g.size, 81559.0, np.float32)),
        "namespace": pa.array([f"team-{i % 3}" for i in g]),
        "pod": pa.array([f"job-{i // per_job}" for i in g]),
    })
    meta = {b"gpuaudit.version": b"0.1.0", b"gpuaudit.interval_s": b"60",
            b"gpuaudit.source": b"synthetic"}
    pq.write_table(table.replace_schema_metadata(meta), path, row_group_size=gpus * 50)
    return path


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The compiled pass (classify.fused) for every batch, however small, as for a large
    recording; the threads whose batches it took."""
    assert fused.available(), "numba is a dependency: it must import"
    monkeypatch.setattr(fused, "MIN_ROWS", 1)
    monkeypatch.setattr(fused, "MIN_SOURCE_ROWS", 1)
    took: list[str] = []
    real = fused.stream_batch

    def counting(*a, **k):  # type: ignore[no-untyped-def]
        out = real(*a, **k)
        if out is not None:
            took.append(threading.current_thread().name)
        return out

    monkeypatch.setattr(fused, "stream_batch", counting)
    return took


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every pass over a file (the priming read at open included), by file name."""
    seen: list[str] = []
    real = FileSource._stream

    def counted(self: FileSource, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(self.path.name)
        return real(self, *a, **k)

    monkeypatch.setattr(FileSource, "_stream", counted)
    return seen


def test_simulate_plan_reads_the_recording_once(tmp_path: Path, passes: list[str]) -> None:
    # one GPU per job: the audit has no busy-onset lags to read for
    path = _recording(tmp_path / "fleet.parquet", gpus=6, steps=600)
    simulate(path, policy="all", gpu_model="H100", plan=False)
    without = len(passes)
    passes.clear()
    rep = simulate(path, policy="all", gpu_model="H100", plan=True)
    assert rep.audit is not None
    assert passes == ["fleet.parquet"] * without  # the plan added no read


def test_plan_with_multi_gpu_jobs_reads_the_recording_once(tmp_path: Path,
                                                          passes: list[str]) -> None:
    """Jobs of several GPUs: the plan's lags (stragglers by time lag) come from the onsets
    classify gathers in the shared pass, not from another read of the file."""
    path = _recording(tmp_path / "jobs.parquet", gpus=8, steps=400, per_job=4)
    simulate(path, policy="all", gpu_model="H100", plan=False)
    without = len(passes)
    passes.clear()
    rep = simulate(path, policy="all", gpu_model="H100", plan=True)
    assert rep.audit is not None
    assert rep.audit.usage.onset_lags  # the lags were computed ...
    assert passes == ["jobs.parquet"] * without  # ... and the plan added no read


def test_the_compiled_pass_takes_the_shared_batches(tmp_path: Path,
                                                    compiled: list[str]) -> None:
    """A large recording's plan (here: any, the thresholds lowered) is classified by the
    compiled loop in the plan's thread, memory columns and all, from the batches the
    profiles read; the plan is the audit's of the file, lags included."""
    path = _recording(tmp_path / "big.parquet", gpus=8, steps=400, per_job=4)
    rep = simulate(path, policy="all", gpu_model="H100", plan=True, price="2.50")
    assert rep.audit is not None and rep.plan is not None
    in_thread = compiled.count("gpuaudit-plan-classify")
    assert in_thread == len(compiled) >= 8  # every batch in the plan's thread
    alone = audit(path, findings=rep.findings, price="2.50", workers=1)
    assert rep.plan == plan_dict(alone, rep.findings)
    assert rep.audit.usage.onset_lags == alone.usage.onset_lags
    assert rep.audit.to_dict()["phases"] == alone.to_dict()["phases"]
    mem = rep.audit.usage.series_by_uuid()
    assert all(s.mem_used_max_mib is not None and s.mem_total_mib == 81559.0
               for s in mem.values())


def test_rightsize_plan_reads_the_recording_once(tmp_path: Path, passes: list[str]) -> None:
    path = _recording(tmp_path / "one.parquet", gpus=1, steps=900)
    rightsize(path, throughput="100/s", plan=False)
    without = len(passes)
    passes.clear()
    rep = rightsize(path, throughput="100/s", plan=True)
    assert rep.audit is not None
    assert passes == ["one.parquet"] * without


@pytest.mark.parametrize("source", [NANOGPT, NANOGPT_CSV], ids=["parquet", "csv"])
def test_simulate_plan_equals_the_audit_of_the_file(source: Path) -> None:
    rep = simulate(source, policy="all", gpu_model="H100", plan=True, price="2.50")
    assert rep.audit is not None and rep.plan is not None
    alone = audit(source, findings=rep.findings, price="2.50")
    assert rep.plan == plan_dict(alone, rep.findings)
    assert rep.audit.to_dict()["phases"] == alone.to_dict()["phases"]


@pytest.mark.parametrize("source", ["fleet", NANOGPT], ids=["consolidation", "nanogpt"])
def test_the_plan_is_the_reports_recommendations_and_savings(tmp_path: Path,
                                                             source: Path | str) -> None:
    """The capacity document's plan, built from the audit's plan alone, holds what the
    audit's whole JSON report holds under ``recommendations`` and ``savings``."""
    path = _recording(tmp_path / "fleet.parquet", gpus=8, steps=400, per_job=4) \
        if source == "fleet" else Path(source)
    rep = simulate(path, policy="all", gpu_model="H100", plan=True, price="2.50")
    assert rep.audit is not None and rep.plan is not None
    whole = rep.audit.to_dict()
    assert rep.plan["recommendations"] == whole["recommendations"]
    assert rep.plan["savings"] == whole["savings"]
    assert rep.plan["recommendations"]  # a plan with something in it


def test_rightsize_plan_equals_the_audit_of_the_file() -> None:
    rep = rightsize(NANOGPT, throughput="1200/s", plan=True)
    assert rep.audit is not None and rep.plan is not None
    alone = audit(NANOGPT, findings=rep.findings)
    assert rep.plan == plan_dict(alone, rep.findings)


def test_plan_of_a_table_in_memory_equals_the_audit() -> None:
    table = open_samples(NANOGPT).to_recording().table
    rep = simulate(table, policy="mps", gpu_model="H100", plan=True)
    assert rep.plan == plan_dict(audit(table, findings=rep.findings), rep.findings)


def test_order_violation_still_names_the_file_row(tmp_path: Path) -> None:
    path = _recording(tmp_path / "bad.parquet", gpus=4, steps=400, swap=4 * 300 + 2)
    for plan in (False, True):
        with pytest.raises(InputError) as err:
            simulate(path, policy="mps", gpu_model="H100", plan=plan)
        assert "bad.parquet" in str(err.value.where), plan


def test_profile_builder_equals_build_profiles() -> None:
    src = open_samples(NANOGPT)
    window = src.ts_range_ns
    assert window is not None
    b = ProfileBuilder(window, step_s=10, by=("pod",))
    for batch in src.batches():
        b.add(batch)
    got = b.finish()
    want = build_profiles(open_samples(NANOGPT), step_s=10, by=("pod",))
    assert got.workload == want.workload and got.start_ns == want.start_ns
    np.testing.assert_array_equal(got.util_pct, want.util_pct)
    np.testing.assert_array_equal(got.mem_mib, want.mem_mib)

