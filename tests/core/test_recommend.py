from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
from coretables import recording, series_table
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.api import audit
from gpuaudit.recommend.plan import Finding, Recommendation, remediation_catalog
from gpuaudit.recommend.savings import combine
from gpuaudit.schema import Recording

REAL = set(remediation_catalog())


def _ids(result, counted_only=False):
    return [r.id for r in result.plan.recommendations if r.counted or not counted_only]


def test_catalog_entries_have_sources_ranges_and_preconditions():
    for rem in remediation_catalog().values():
        assert rem.source and rem.savings_range and rem.preconditions
        assert rem.lever in ("efficiency", "rate")


def test_idle_heavy_real_slice_names_two_real_remediations(nanogpt: Recording):
    # The first 45 s of the real nanoGPT recording: the GPUs sit idle before training.
    t = nanogpt.table
    ts = t.column("ts").cast(pa.int64()).to_numpy()
    head = t.filter(pa.array(ts < ts.min() + 45 * 10**9))
    r = audit(Recording(head, "nvidia-smi-csv", "nanoGPT first 45 s", nanogpt.interval_s),
              provider="aws")
    ids = _ids(r)
    assert {"idle_shutdown", "time_slicing"} <= set(ids) or len(set(ids) & REAL) >= 2
    assert "idle_shutdown" in ids
    assert len([i for i in ids if i in REAL]) >= 2


def test_compute_bound_real_slice_names_two_real_remediations(nanogpt: Recording):
    t = nanogpt.table
    ts = t.column("ts").cast(pa.int64()).to_numpy()
    mid = t.filter(pa.array((ts > ts.min() + 60 * 10**9) & (ts < ts.min() + 200 * 10**9)))
    r = audit(Recording(mid, "nvidia-smi-csv", "nanoGPT training", nanogpt.interval_s))
    ids = _ids(r)
    assert {"amp_bf16", "torch_compile", "fp8"} <= set(ids)
    assert "spot" in ids


def test_same_mean_different_shape_different_advice():
    n = 720
    # an input-starved loop: 3 s of compute, then waits that scatter (3-14 s) batch to batch
    bursty: list[float] = []
    for k in range(200):
        bursty += [100.0] * 3 + [0.0] * [3, 9, 4, 14, 5, 7][k % 6]
    bursty = [*bursty[:n], 100.0]
    steady = [50.0 + (i % 5) for i in range(n)]
    rb = audit(recording(series_table({"g": bursty})), gpu_model="A100", provider="aws")
    # a larger batch needs memory headroom (premise memory_headroom): 20 of 80 GiB used
    mem = {"g": [20480.0] * n}
    rs = audit(recording(series_table({"g": [s - 2 for s in steady]},
                                      extra={"mem_used_mib": mem})), gpu_model="A100",
               provider="aws")
    eb, es = set(_ids(rb, True)), set(_ids(rs, True))
    assert "dataloader" in eb and "dataloader" not in es
    assert "larger_batch" in es and "larger_batch" not in eb
    # without memory used the same advice is listed as unverified, naming the field
    rn = audit(recording(series_table({"g": [s - 2 for s in steady]})), gpu_model="A100",
               provider="aws")
    lb = next(x for x in rn.plan.recommendations if x.id == "larger_batch")
    assert lb.status == "unverified" and lb.decided_by and "mem_used_mib" in lb.decided_by
    full = audit(recording(series_table({"g": [s - 2 for s in steady]},
                                        extra={"mem_used_mib": {"g": [78000.0] * n}})),
                 gpu_model="A100", provider="aws")
    lb = next(x for x in full.plan.recommendations if x.id == "larger_batch")
    assert lb.status == "ruled_out" and "no room" in (lb.why_not_counted or "")


def test_unresolvable_gaps_leave_input_fixes_unverified_with_the_field():
    """At 1 Hz a 1-2 s wait is one or two samples: its spread cannot show whether it is an
    input pipeline or a host step, so DataLoader advice is listed, not counted, and says
    what would decide."""
    n = 720
    bursty = [0.0 if (i // 2) % 2 == 0 else 100.0 for i in range(n)]
    r = audit(recording(series_table({"g": bursty})), gpu_model="A100", provider="aws")
    rec = next(x for x in r.plan.recommendations if x.id == "dataloader")
    assert rec.status == "unverified" and not rec.counted
    assert rec.decided_by is not None and "10 Hz" in rec.decided_by
    assert "unverified" in (rec.why_not_counted or "")


def test_trace_finding_drives_input_advice():
    r = audit(recording(series_table({"g": [60.0] * 100})), gpu_model="H100",
              findings=[Finding("input_stall_share", 0.3,
                                "30% of the window the GPU waited on the DataLoader")])
    rec = next(x for x in r.plan.recommendations if x.id == "dataloader")
    assert "DataLoader" in rec.evidence


def test_worked_example_from_the_evidence_doc():
    # 30% idle, 25% input stall, AMP 2x on what is left: F = 1 - 0.7 x 0.75 x 0.5 = 73.75 %
    cat = remediation_catalog()

    def rec(rid, f, cap):
        return Recommendation(cat[rid], Decimal(f), Decimal(cap), True, "", (), Decimal(0))

    plan = combine([rec("idle_shutdown", "0.30", "0.30"), rec("dataloader", "0.25", "0.25"),
                    rec("amp_bf16", "0.50", "0.50")], waste_fraction=Decimal(1),
                   monthly_cost_usd=Decimal("39628.80"))
    assert plan.efficiency_fraction == Decimal("0.7375")
    assert plan.naive_sum_fraction == Decimal("1.05")  # the wrong answer exceeds 100 %


fractions = st.decimals(min_value=0, max_value=1, places=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(REAL)), fractions, fractions, st.booleans()),
                max_size=10), fractions)
def test_property_savings_never_exceed_waste_or_100_percent(items, waste):
    cat = remediation_catalog()
    recs = [Recommendation(cat[i], min(f, c), c, counted, "", (), Decimal(0))
            for i, f, c, counted in items]
    plan = combine(recs, waste_fraction=waste, monthly_cost_usd=Decimal(1000))
    assert Decimal(0) <= plan.efficiency_fraction <= waste
    assert Decimal(0) <= plan.rate_fraction <= 1
    assert Decimal(0) <= plan.total_fraction <= 1
    assert Decimal(0) <= plan.monthly_savings_usd <= plan.monthly_cost_usd
    assert plan.total_fraction >= plan.efficiency_fraction


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 100), min_size=4, max_size=80))
def test_property_end_to_end_savings_within_waste_and_cost(util):
    r = audit(recording(series_table({"a": util, "b": util[::-1]})), gpu_model="H100")
    p = r.plan
    waste = r.cost.total.waste
    cost = r.cost.total.observed_cost
    assert 0 <= p.efficiency_fraction * cost <= waste + Decimal("1e-6")
    assert p.total_fraction <= 1 and p.monthly_savings_usd <= p.monthly_cost_usd
