"""Issue 21, parts 3 (the CPU evidence's use), 4, 5 and the real-recording premise check:
small work on a big GPU (MIG fit, packing, a smaller GPU for the same work), host CPU
evidence in the tree and the premises, diagnosis per ``--by`` group, stragglers by time lag,
and every efficiency saving on the bundled real recordings traced to a premise that held."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpuaudit.api import audit
from gpuaudit.classify.diagnose import (
    HOST_CPU_BUSY_PCT,
    SMALL_MEM_SHARE,
    SMALL_SM_ACTIVE,
    diagnose,
)
from gpuaudit.classify.lag import busy_onsets, onset_lags
from gpuaudit.classify.usage import SeriesSignals
from gpuaudit.recommend.premises import PREMISES
from gpuaudit.schema import Recording, build_table

sys.path.insert(0, str(Path(__file__).parent))
from test_diagnosis_eval import audit_file, cases

DIAG = Path(__file__).parents[1] / "data" / "diagnosis"
_NS = 1_000_000_000


def _recs(report):
    return {r.id: r for r in report.plan.recommendations}


# -- part 4: small work on a big GPU ---------------------------------------------------------

def test_136m_model_on_12_of_80_gib_gets_a_smaller_gpu_priced_for_the_same_work():
    """Issue 21: '136M model using 12 of 80 GiB at SM active 64%: no right-size or sharing
    finding'. Now: the cheapest smaller GPU that holds the peak (+20%), priced for the same
    work (its rate times the estimated slowdown), counted as a rate lever with its saving;
    MIG is ruled out with the reason (no slice under the whole GPU carries 64% of the SMs)."""
    r = audit(DIAG / "small_bf16_136m_h100.parquet", provider="aws")
    recs = _recs(r)
    rs = recs["right_size"]
    assert rs.counted and rs.fraction > Decimal("0.3")
    assert "L40S" in rs.evidence and "as long for the same work" in rs.evidence
    assert "gpuaudit simulate" in rs.evidence
    mig = recs["mig"]
    assert mig.status == "ruled_out" and "SM share" in (mig.why_not_counted or "")
    assert r.plan.rate_fraction >= rs.fraction
    assert r.plan.total_fraction < 1


def _read(path: Path) -> pa.Table:
    """A scenario recording as a sample table of today's schema (columns added since it was
    written are nulls)."""
    t = pq.read_table(path)
    return build_table({n: t.column(n).combine_chunks() for n in t.column_names})


def _scaled(path: Path, **cols: float) -> pa.Table:
    """A scenario recording with some columns set to constants (same timestamps, GPUs)."""
    t = _read(path)
    for name, value in cols.items():
        i = t.schema.get_field_index(name)
        t = t.set_column(i, name, pa.array(np.full(t.num_rows, value),
                                           type=t.schema.field(name).type))
    return t


def test_small_part_busy_job_gets_the_mig_slice_that_holds_its_peak_and_sm_share():
    """At SM 20% and utilization 40% the same 12 GiB job fits a 2g.20gb slice (14.4 GiB with
    headroom, 2/7 of the SMs >= 20%): MIG is counted, its saving the slices freed, capped by
    the measured waste; packing by MPS is priced too."""
    t = _scaled(DIAG / "small_bf16_136m_h100.parquet", sm_active=0.2, util_gpu_pct=40.0,
                tensor_active=0.06)
    r = audit(t, provider="aws")
    recs = _recs(r)
    mig = recs["mig"]
    assert mig.counted and "2g.20gb" in mig.evidence, mig.evidence
    assert 0 < mig.fraction <= r.plan.waste_fraction
    assert mig.premise_held and "SM active 20%" in mig.premise_held
    assert "mps" in recs and "4 jobs like it fit one GPU" in recs["mps"].evidence
    assert r.plan.efficiency_fraction <= r.plan.waste_fraction


def test_small_work_premise_is_refuted_by_a_big_job_and_unknown_without_memory():
    check = PREMISES["small_work"]
    big = audit_file("bf16_pretrain_8xh100.parquet")
    for s in big.usage.series:
        v = check(s, {})
        assert v.status == "refuted" and "needs most of the GPU's memory" in v.reason
    assert not any(r.id == "right_size" and "small work" in r.evidence
                   for r in big.plan.recommendations)
    s = audit_file("small_bf16_136m_h100.parquet").usage.series[0]
    assert check(s, {}).status == "holds"
    assert check(replace(s, mem_used_max_mib=None, mem_total_mib=None), {}).status == "unknown"
    busy = replace(s, mean_sm_active=SMALL_SM_ACTIVE + 0.01)
    assert check(busy, {}).status == "refuted"
    half = replace(s, mem_used_max_mib=(SMALL_MEM_SHARE + 0.01) * (s.mem_total_mib or 0))
    assert check(half, {}).status == "refuted"


# -- part 3's use: host CPU evidence -------------------------------------------------------

@dataclass(frozen=True)
class _WithCpu(SeriesSignals):
    """SeriesSignals with the CPU signals the sampler / node_exporter / --map fill, for a
    tree where SeriesSignals does not carry them yet (the cpu change lands apart)."""

    mean_host_cpu_util_pct: float | None = None
    mean_host_cpu_util_pct_while_idle: float | None = None


_HAS_CPU = "host_cpu_util_pct_while_idle" in {f.name for f in fields(SeriesSignals)}


def _cpu(s: SeriesSignals, idle: float, whole: float | None = None,
         busy: float | None = 30.0) -> SeriesSignals:
    """``s`` with the host's CPUs ``idle`` percent busy over its idle seconds and ``busy``
    over its busy seconds."""
    if _HAS_CPU:
        return replace(s, host_cpu_util_pct_while_idle=idle,  # type: ignore[call-arg]
                       host_cpu_util_pct=whole, host_cpu_util_pct_while_busy=busy)
    return _WithCpu(**s.__dict__, mean_host_cpu_util_pct=whole,
                    mean_host_cpu_util_pct_while_idle=idle)


def _fsdp_series() -> list[SeriesSignals]:
    return list(audit_file("fsdp_offload_8xh100_10hz.parquet").usage.series)


def test_cpu_evidence_is_named_in_the_host_compute_diagnosis():
    """'GPU idle 81% while the host's CPUs are 95% busy in the same seconds'."""
    series = [_cpu(s, 95.0, 60.0) for s in _fsdp_series()]
    tops = [d for d in diagnose(series, ()) if d.top]
    assert {d.kind for d in tops} == {"host_compute"}
    assert all("while the host's CPUs are 95% busy in the same seconds" in d.evidence
               for d in tops)
    assert dict(tops[0].numbers)["host_cpu_util_pct_while_idle"] == 95.0


def test_busy_host_cpu_decides_host_compute_where_the_gaps_cannot_show_their_cadence():
    """Gaps too few to show a cadence: without CPU data the GPU is not called host_compute;
    with the host's CPUs busy while it idles, it is (and the premise of offload_less holds
    on the CPU evidence alone)."""
    base = [replace(s, idle_gaps=3, idle_gap_quartiles_s=None) for s in _fsdp_series()]
    assert {d.kind for d in diagnose(base, ()) if d.top} != {"host_compute"}
    busy = [_cpu(s, HOST_CPU_BUSY_PCT + 5) for s in base]
    assert {d.kind for d in diagnose(busy, ()) if d.top} == {"host_compute"}
    v = PREMISES["host_wait"](busy[0], {})
    assert v.status == "holds" and "CPUs are 85% busy" in v.reason
    # CPUs busy while the GPU computes too: prefetching workers (a CPU-bound input
    # pipeline), not a host step taking turns with the GPU
    always = [_cpu(s, 90.0, busy=88.0) for s in base]
    assert "host_compute" not in {d.kind for d in diagnose(always, ()) if d.top}
    assert PREMISES["host_wait"](always[0], {}).status == "unknown"
    quiet = _cpu(base[0], 10.0)
    assert PREMISES["host_wait"](quiet, {}).status == "refuted"
    assert PREMISES["host_wait"](base[0], {}).status == "unknown"


def test_input_premise_refutation_names_the_busy_cpu():
    s = _cpu(_fsdp_series()[0], 93.0)
    v = PREMISES["input_gaps"](s, {})
    assert v.status == "refuted" and "the host's CPUs 93% busy in the same seconds" in v.reason


def test_transfer_fixes_need_traffic_on_the_link():
    """Pinned memory and overlap (overlap_transfers) need bytes crossing the host link: the
    FSDP + CPU offload run's link is quiet (0.13 GB/s while idle), so it is refuted there
    and holds on the ZeRO-Offload run (4.8% of PCIe 4)."""
    check = PREMISES["host_transfer"]
    assert {check(s, {}).status for s in _fsdp_series()} == {"refuted"}
    offload = audit_file("offload_2xa100_pcie_1hz.parquet").usage.series
    assert {check(s, {}).status for s in offload} == {"holds"}


# -- part 5: per group, per job, stragglers by lag --------------------------------------------

def test_diagnosis_per_by_group():
    """Two recordings in one table, grouped by host: each group gets its own cause."""
    a = _read(DIAG / "held_idle_notebook_a100.parquet")
    b = _read(DIAG / "memory_bound_a100.parquet")
    r = audit(pa.concat_tables([a, b]), price="2.00", by=["host"])
    groups = {g.key: g for g in r.group_diagnoses}
    assert groups[("jupyter-3",)].kind == "held_idle"
    assert groups[("recsys-0",)].kind == "memory_bound"
    assert groups[("recsys-0",)].share == 1.0
    js = r.to_dict()["group_diagnoses"]
    assert {g["key"]["host"]: g["kind"] for g in js} == {"jupyter-3": "held_idle",
                                                         "recsys-0": "memory_bound"}
    assert "group host=jupyter-3: held_idle (100% of its GPU time" in r.render("terminal")
    assert "- group `host=recsys-0`: **memory_bound**" in r.render("markdown")
    assert audit(a, price="2.00").group_diagnoses == ()


def test_straggler_found_by_time_lag_where_busyness_cannot():
    """Rank 5 starts each step ~0.2 s late; its peers spin in the all-reduce and read busier
    than it. The busyness rule alone (no lags) does not call it a straggler; the onset lag
    does, on every GPU of the job, with rank 5 named."""
    r = audit_file("straggler_lag_8xh100_10hz.parquet")
    lags = {lg.gpu_uuid: lg for lg in r.usage.onset_lags}
    assert abs(lags["GPU-laggard-5"].median_lag_s - 0.2) < 0.05
    assert all(abs(lg.median_lag_s) < 0.05 for u, lg in lags.items() if u != "GPU-laggard-5")
    tops = {d.gpu_uuid: d for d in r.diagnoses if d.top}
    assert {d.kind for d in tops.values()} == {"straggler"}
    assert "after its 7 peers'" in tops["GPU-laggard-5"].evidence
    without = {d.gpu_uuid: d for d in diagnose(r.usage.series, r.usage.patterns) if d.top}
    assert without["GPU-laggard-5"].kind != "straggler"
    util = {s.gpu_uuid: s.mean_util_pct or 0 for s in r.usage.series}
    assert util["GPU-laggard-5"] < min(v for u, v in util.items() if u != "GPU-laggard-5")


def test_no_lag_straggler_in_jobs_that_start_together():
    for name in ("comm_bound_8xh100.parquet", "fsdp_offload_8xh100_10hz.parquet",
                 "offload_8xh100_10hz.parquet", "bf16_pretrain_8xh100.parquet"):
        r = audit_file(name)
        assert not any(d.kind == "straggler" for d in r.diagnoses), name


class _Split:
    """A sample source that yields a table in batches cut at the given row counts."""

    def __init__(self, table: pa.Table, cuts: list[int]) -> None:
        self.table = table
        self.cuts = cuts

    def batches(self) -> Iterator[pa.RecordBatch]:
        lo = 0
        for c in [*sorted(set(self.cuts)), self.table.num_rows]:
            if c > lo:
                yield from self.table.slice(lo, c - lo).to_batches()
                lo = c


_LAG_TABLE = _read(DIAG / "straggler_lag_8xh100_10hz.parquet").slice(0, 4000)
_UUIDS = sorted(set(_LAG_TABLE.column("gpu_uuid").to_pylist()))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 4000), max_size=6))
def test_busy_onsets_do_not_depend_on_how_the_rows_are_batched(cuts: list[int]):
    whole = busy_onsets(Recording(table=_LAG_TABLE, source="t", origin="t"), _UUIDS)
    split = busy_onsets(_Split(_LAG_TABLE, cuts), _UUIDS)  # type: ignore[arg-type]
    for u in _UUIDS:
        assert np.array_equal(whole[u], split[u])


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(0, 5), st.floats(0.05, 0.4), st.floats(0.8, 3.0),
       st.integers(0, 2**32 - 1))
def test_onset_lag_recovers_a_shift(n_gpus: int, late: int, shift_s: float, period_s: float,
                                    seed: int):
    """Peers start each step within 10 ms of each other; one GPU ``shift_s`` later (under a
    third of the step period: a shift near half the period is the next step's onset as much
    as this one's): its median lag is the shift (within the jitter), every peer's is under
    half of it."""
    assume(shift_s <= period_s / 3)
    late %= n_gpus
    rng = np.random.default_rng(seed)
    steps = 50
    base = np.cumsum(np.full(steps, period_s)) * _NS
    onsets = {}
    for i in range(n_gpus):
        t = base + rng.uniform(-0.005, 0.005, steps) * _NS + (shift_s * _NS if i == late else 0)
        onsets[f"g{i}"] = np.sort(t).astype(np.int64)
    lags = {lg.gpu_uuid: lg for lg in onset_lags(onsets, {"job": list(onsets)})}
    assert abs(lags[f"g{late}"].median_lag_s - shift_s) <= 0.011
    assert lags[f"g{late}"].late_share > 0.9
    for u, lg in lags.items():
        if u != f"g{late}":
            assert lg.median_lag_s < shift_s / 2


# -- done when: every efficiency saving on the real recordings traces to a premise ------------

def test_every_efficiency_saving_on_the_real_recordings_traces_to_a_premise_that_held():
    checked = 0
    for c in cases():
        if c.origin != "real":
            continue
        plan = audit_file(c.file).plan
        for r in plan.recommendations:
            if r.counted and r.remediation.lever == "efficiency":
                checked += 1
                assert r.remediation.premise, (c.name, r.id)
                assert r.premise_held, (c.name, r.id)
    assert checked >= 3


def test_the_cpu_columns_when_present_reach_the_diagnosis():
    """Where the recording carries host CPU columns (cpu helper's schema), the diagnosis'
    numbers include them; a recording without them has none (never a fake 0)."""
    r = audit_file("fsdp_offload_8xh100_10hz.parquet")
    for d in r.diagnoses:
        assert "host_cpu_util_pct_while_idle" not in dict(d.numbers)
    t = pq.read_table(DIAG / "fsdp_offload_8xh100_10hz.parquet")
    assert "host_cpu_util_pct" not in t.column_names or \
        pc.all(pc.is_null(t.column("host_cpu_util_pct"))).as_py()


def _with(t: pa.Table, **cols: object) -> pa.Table:
    """``t`` with some columns set to one value, rebuilt as a sample table."""
    data: dict[str, object] = {n: t.column(n).combine_chunks() for n in t.column_names}
    data.update({name: [value] * t.num_rows for name, value in cols.items()})
    return build_table(data)


def test_four_gpus_training_beside_four_serving_get_their_own_causes_per_pod():
    """Issue 21's 'four GPUs training beside four serving' on one 8x H100 host: grouped by
    pod, the training pod is compute-bound (bf16, FP8 next), each serving pod small work on a
    big GPU with the MIG slice that holds it; per job the same split."""
    pre = _read(DIAG / "bf16_pretrain_8xh100.parquet")
    keep = pc.is_in(pre.column("gpu_uuid"),
                    pa.array([f"GPU-bf16_pretrain_8xh100-{i}" for i in range(4)]))
    train = _with(pre.filter(keep), pod="train-0", host="node-1")
    small = _scaled(DIAG / "small_bf16_136m_h100.parquet", sm_active=0.25,
                    util_gpu_pct=45.0, tensor_active=0.08)
    serve = [_with(small, gpu_uuid=f"GPU-serve-{i}", pod=f"serve-{i}", host="node-1",
                   gpu_index=4 + i) for i in range(4)]
    table = pa.concat_tables([train, *serve]).sort_by([("ts", "ascending"),
                                                       ("gpu_index", "ascending")])
    r = audit(table, provider="aws", by=["pod"])
    groups = {g.key[0]: g for g in r.group_diagnoses}
    assert groups["train-0"].kind == "compute_bound" and groups["train-0"].fixes == ("fp8",)
    for i in range(4):
        assert groups[f"serve-{i}"].kind == "small_kernels", groups[f"serve-{i}"].evidence
    jobs = {j.job: j.kind for j in r.job_diagnoses}
    assert jobs["node-1 / train-0"] == "compute_bound"
    assert jobs["node-1 / serve-0"] == "small_kernels"
    recs = _recs(r)
    assert recs["mig"].counted and "2g.20gb" in recs["mig"].evidence
    assert set(recs["mig"].scope) == {f"GPU-serve-{i}" for i in range(4)}
    assert recs["amp_bf16"].status == "ruled_out"
    assert r.plan.efficiency_fraction <= r.plan.waste_fraction


def test_the_hosts_cpu_decides_the_1hz_offload_run_and_without_it_nothing_is_claimed():
    """At 1 Hz the FSDP + CPU offload run's 2.8 s waits cannot show their cadence; with the
    host's CPU recorded (busy while the GPUs wait, resting while they compute) it is
    host_compute and offload_less counts on that premise; with the CPU column removed it is
    not called host_compute and offload_less does not count."""
    r = audit_file("fsdp_offload_cpu_8xh100_1hz.parquet")
    tops = [d for d in r.diagnoses if d.top]
    assert {d.kind for d in tops} == {"host_compute"}
    assert "while the host's CPUs are 9" in tops[0].evidence
    rec = _recs(r)["offload_less"]
    assert rec.counted and rec.premise_held and "take turns" in rec.premise_held
    t = _read(DIAG / "fsdp_offload_cpu_8xh100_1hz.parquet")
    blind = t.set_column(t.schema.get_field_index("host_cpu_util_pct"), "host_cpu_util_pct",
                         pa.nulls(t.num_rows, t.schema.field("host_cpu_util_pct").type))
    r2 = audit(blind, price="2.00")
    assert "host_compute" not in {d.kind for d in r2.diagnoses if d.top}
    assert not any(x.counted for x in r2.plan.recommendations if x.id == "offload_less")
