"""The diagnosis on real and scenario recordings: causes, thresholds relative to the GPU,
phases of the run judged apart, the fixes it feeds and the savings they imply."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from gpuaudit.api import audit
from gpuaudit.classify.diagnose import HOST_LINK_BUSY_SHARE
from gpuaudit.classify.patterns import EDGE_MIN_DIFF_PCT, split_run
from gpuaudit.cli.audit import demo_path
from gpuaudit.hardware import spec_for
from gpuaudit.recommend.savings import combine_efficiency
from gpuaudit.schema import build_table

DIAG = Path(__file__).parents[1] / "data" / "diagnosis"
T0 = 1_767_225_600 * 1_000_000_000


def _tops(report):
    return {d.gpu_uuid: d for d in report.diagnoses if d.top}


def test_offload_run_from_issue_16_gets_the_host_fed_diagnosis_and_its_fixes():
    r = audit(DIAG / "offload_8xh100_10hz.parquet", gpu_model="H100", provider="aws")
    tops = _tops(r)
    assert len(tops) == 8
    for d in tops.values():
        assert d.kind == "host_bound"
        assert d.phase == "steady"
        assert d.evidence.startswith("held but idle: 32 GiB allocated while the GPU is idle 80%")
        assert "the host is feeding it (PCIe busy while SMs wait): CPU / NVMe offload or input " \
               "pipeline" in d.evidence
        # transfers: offload less, pinned buffers and overlap; never the DataLoader
        assert d.fixes == ("offload_less", "overlap_transfers", "larger_batch")
        nums = dict(d.numbers)
        assert 0.02 <= nums["pcie_link_share"] < 0.05  # ~2 GB/s of H100's 63 GB/s
        assert nums["sm_active"] < 0.1
    # the fixes are in the plan with their evidence; efficiency is not 0 and within waste
    recs = {x.id: x for x in r.plan.recommendations}
    for fid in ("offload_less", "larger_batch", "overlap_transfers"):
        assert fid in recs and recs[fid].fraction > 0
        assert "host bound on 8 GPU(s)" in recs[fid].evidence
    assert recs["offload_less"].counted and recs["overlap_transfers"].counted
    plan = r.plan
    assert plan.waste_fraction > Decimal("0.8")
    assert Decimal(0) < plan.efficiency_fraction <= plan.waste_fraction
    # combined as savings.py says: F = 1 - prod(1 - f_i) per group, capped by the cap, by W
    counted = [x for x in plan.recommendations if x.counted and x.remediation.lever == "efficiency"]
    keep = Decimal(1)
    for x in counted:
        keep *= 1 - x.fraction
    assert plan.efficiency_fraction == min(1 - keep, plan.waste_fraction).quantize(Decimal("1e-6"))
    assert combine_efficiency(plan.recommendations, plan.waste_fraction)[1] == \
        plan.efficiency_fraction
    # one cause per job, in the JSON report too
    (job,) = r.job_diagnoses
    assert (job.kind, job.with_kind, len(job.gpu_uuids)) == ("host_bound", 8, 8)
    doc = r.to_dict()
    assert doc["job_diagnoses"][0]["kind"] == "host_bound"
    assert doc["job_diagnoses"][0]["fixes"][0] == "offload_less"
    tops = [d for d in doc["diagnoses"] if d["top"]]
    assert len(tops) == 8 and tops[0]["phase"] == "steady"
    assert tops[0]["numbers"]["pcie_link_share"] > 0.02
    assert doc["job_patterns"][0]["shape"] == "warm-up, then bursty, then cool-down"
    # the shape is named per GPU and per job, not "mixed"
    assert {p.kind for p in r.usage.patterns} == {"bursty"}
    assert {p.shape for p in r.usage.patterns} == {"warm-up, then bursty, then cool-down"}
    assert [j.kind for j in r.usage.job_patterns] == ["bursty"]


def test_nanogpt_eight_gpus_one_shape_not_mixed_or_phased():
    """Issue 14 item 8: the bundled 8x H100 recording was labelled mixed (6) and phased (2)."""
    r = audit(demo_path(), price=Decimal("2"))
    kinds = [p.kind for p in r.usage.patterns]
    assert kinds == ["saturated"] * 8
    assert all(p.shape == "warm-up, then saturated, then cool-down" for p in r.usage.patterns)
    for p in r.usage.patterns:
        names = [x.name for x in p.run_phases]
        assert names == ["warm-up", "steady", "cool-down"]
        warm, steady, cool = p.run_phases
        assert 25 <= warm.end_s - warm.start_s <= 50  # ~40 s idle start
        assert steady.busy_share > 0.95 and warm.idle_share > 0.8 and cool.idle_share > 0.8
    (job,) = r.usage.job_patterns
    assert job.kind == "saturated" and len(job.gpu_uuids) == 8
    assert job.evidence.startswith("8 of 8 GPU(s) warm-up, then saturated, then cool-down")
    assert {d.kind for d in r.diagnoses if d.top} == {"compute_bound"}


def test_warm_up_is_judged_apart_and_the_steady_state_decides():
    r = audit(DIAG / "warmup_memory_bound_a100.parquet", price=Decimal("2"))
    (top,) = [d for d in r.diagnoses if d.top]
    assert top.kind == "memory_bound" and top.phase == "steady"
    whole = r.usage.series[0]
    assert whole.mean_dram_active is not None and whole.mean_dram_active < 0.5  # mean hides it
    r2 = audit(DIAG / "warmup_compute_8xh100.parquet", price=Decimal("2"))
    warm = [d for d in r2.diagnoses if d.phase == "warm-up"]
    assert len(warm) == 8 and all(d.kind == "host_bound" and not d.top for d in warm)
    assert {d.kind for d in r2.diagnoses if d.top} == {"compute_bound"}


def _table(model: str, pcie_bytes_per_s: float, n: int = 600) -> pa.Table:
    busy = (np.arange(n) % 6) < 1
    return build_table({
        "ts": pa.array(T0 + np.arange(n) * 1_000_000_000).cast(pa.timestamp("ns", tz="UTC")),
        "host": ["h"] * n, "gpu_uuid": ["GPU-x"] * n, "gpu_model": [model] * n,
        "util_gpu_pct": np.where(busy, 85.0, 1.0), "sm_active": np.where(busy, 0.5, 0.01),
        "pcie_tx_bytes_per_s": np.full(n, pcie_bytes_per_s / 2),
        "pcie_rx_bytes_per_s": np.full(n, pcie_bytes_per_s / 2),
        "mem_used_mib": np.full(n, 10_000.0),
    })


def test_pcie_threshold_is_a_share_of_the_gpus_own_link():
    """The same 0.5 GB/s is 3% of a T4's PCIe 3 link (host-fed) but under 1% of an H100's
    PCIe 5 link (not host-fed): the threshold follows the hardware, not a constant."""
    bps = 0.5e9
    t4, h100 = spec_for("Tesla T4"), spec_for("NVIDIA H100 80GB HBM3")
    assert bps / t4.host_link_bytes_per_s >= HOST_LINK_BUSY_SHARE
    assert bps / h100.host_link_bytes_per_s < HOST_LINK_BUSY_SHARE
    on_t4 = _tops(audit(_table("Tesla T4", bps), price=Decimal("1")))["GPU-x"]
    on_h100 = _tops(audit(_table("NVIDIA H100 80GB HBM3", bps), price=Decimal("1")))["GPU-x"]
    assert on_t4.kind == "host_bound"
    assert on_h100.kind != "host_bound"


def test_undetermined_names_the_field_that_would_decide():
    r = audit(DIAG / "undetermined_a10g.parquet", price=Decimal("1"))
    (top,) = [d for d in r.diagnoses if d.top]
    assert top.kind == "undetermined" and top.fixes == ()
    assert top.decides is not None and "DCGM_FI_PROF_SM_ACTIVE" in top.decides
    assert any("DCGM_FI_PROF_SM_ACTIVE" in n for n in r.plan.notes)


def test_straggler_overrides_the_peers_own_shape():
    r = audit(DIAG / "straggler_4xa100_1hz.parquet", price=Decimal("2"))
    tops = _tops(r)
    assert {d.kind for d in tops.values()} == {"straggler"}
    assert "waiting for straggler GPU-straggler-2" in tops["GPU-straggler-0"].evidence
    rec = next(x for x in r.plan.recommendations if x.id == "straggler")
    assert rec.counted and rec.fraction > 0


@given(warm=st.integers(8, 60), low=st.floats(0, 20), high=st.floats(45, 100),
       seed=st.integers(0, 1000))
def test_property_split_run_finds_a_clear_warm_up(warm, low, high, seed):
    n = 240
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.full(warm, low), np.full(n - warm, high)]) + rng.normal(0, 1.0, n)
    a, b = split_run(x)
    assert abs(a - warm) <= 1
    assert b == n


@given(level=st.floats(0, 100), seed=st.integers(0, 1000), n=st.integers(1, 240))
def test_property_split_run_leaves_a_flat_run_whole(level, seed, n):
    rng = np.random.default_rng(seed)
    x = np.clip(level + rng.normal(0, EDGE_MIN_DIFF_PCT / 4, n), 0, 100)
    a, b = split_run(x)
    assert 0 <= a < b <= n or n == 0
    assert (a, b) == (0, n)


def test_bucketed_signals_agree_across_one_pass_parallel_and_second_pass(tmp_path):
    from gpuaudit.classify import classify
    from gpuaudit.classify.timeline import timeline_for
    from gpuaudit.measure.files import open_samples, read_samples
    from gpuaudit.measure.parquet_io import write_recording

    path = tmp_path / "offload.parquet"
    write_recording(read_samples(DIAG / "offload_8xh100_10hz.parquet"), path,
                    row_group_rows=5000)
    one = classify(open_samples(path), workers=1)
    two = classify(open_samples(path), workers=2)
    assert one.timeline is not None and two.timeline is not None
    again = timeline_for(open_samples(path), one)
    assert again is not None
    assert set(one.timeline.signals) == {"sm_active", "tensor_active", "dram_active",
                                         "pcie_bytes_per_s", "nvlink_bytes_per_s",
                                         "mem_used_mib", "power_w", "pcie_idle_bytes_per_s",
                                         "nvlink_busy_bytes_per_s"}
    for name, arr in one.timeline.signals.items():
        np.testing.assert_allclose(two.timeline.signals[name], arr, rtol=1e-9, err_msg=name)
        np.testing.assert_allclose(again.signals[name], arr, rtol=1e-9, err_msg=name)
    # 2 GB/s sustained in the steady buckets, as the raw samples say
    steady = one.timeline.signals["pcie_bytes_per_s"][0, 40:200]
    assert 1.5e9 < float(np.nanmean(steady)) < 2.5e9
