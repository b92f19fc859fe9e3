from __future__ import annotations

from dataclasses import fields

import numpy as np
import pyarrow as pa
import pytest
from coretables import recording, series_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.classify import PhaseTime, classify
from gpuaudit.classify.usage import largest_remainder
from gpuaudit.schema import Recording


def test_hand_computed_phases_and_unobserved_gap():
    # g0: idle, under, productive, compute-bound, then a 10 s gap, then idle
    t = series_table({"g0": [5, 50, 80, 95]}, interval_s=1.0)
    late = series_table({"g0": [0]}, t0_s=1_700_000_000 + 13)
    u = classify(recording(pa.concat_tables([t, late])))
    pt = u.overall()
    # each of the first three samples stands 1 s; the 4th stands until t=13 s, capped at 3 s
    assert pt.idle_s == pytest.approx(1.0 + 1.0)  # first sample + the last (1 interval)
    assert pt.underutilized_s == pytest.approx(1.0)
    assert pt.productive_s == pytest.approx(1.0)
    assert pt.compute_bound_s == pytest.approx(3.0)
    assert pt.gap_s == pytest.approx(7.0)
    assert pt.total_s == pytest.approx(14.0)
    assert pt.underutilized_unused_s == pytest.approx(0.5)
    assert pt.busy_s == pytest.approx(0.05 + 0.5 + 0.8 + 3 * 0.95)
    assert u.wall_s == pytest.approx(14.0)


def test_missing_reading_is_unobserved_never_idle():
    t = series_table({"g0": [None, None, 50.0]})
    pt = classify(recording(t)).overall()
    assert pt.no_reading_s == pytest.approx(2.0)
    assert pt.idle_s == 0.0
    assert pt.phase_shares_pct()["underutilized"] == 100


def test_mig_instance_uses_gr_engine_active_when_util_missing():
    t = series_table({"g0/gi1": [None, None]},
                     extra={"gr_engine_active": {"g0/gi1": [0.95, 0.05]}})
    pt = classify(recording(t)).overall()
    assert pt.compute_bound_s == pytest.approx(1.0) and pt.idle_s == pytest.approx(1.0)


def test_sm_view_reported_beside_utilization():
    # a tiny kernel running nonstop: 100% utilization, 10% SM active
    t = series_table({"g0": [100.0] * 5}, extra={"sm_active": {"g0": [0.1] * 5}})
    pt = classify(recording(t)).overall()
    assert pt.phase_shares_pct()["compute_bound"] == 100
    assert pt.has_sm_view and pt.sm_underutilized_s == pytest.approx(5.0)


def test_time_sliced_gpu_is_split_not_billed_twice():
    base = series_table({"g0": [60.0, 60.0, 60.0]})
    rows = []
    for i in range(3):
        rows += [base.slice(i, 1), base.slice(i, 1)]
    t = pa.concat_tables(rows)
    t = t.set_column(t.schema.get_field_index("pod"), "pod", pa.array(["a", "b"] * 3))
    t = t.set_column(t.schema.get_field_index("gpu_share"), "gpu_share",
                     pa.array([0.5] * 6, pa.float32()))
    u = classify(recording(t), by=["pod"])
    assert u.overall().total_s == pytest.approx(3.0)
    groups = dict(u.per_group())
    assert groups[("a",)].total_s == pytest.approx(1.5) == groups[("b",)].total_s


def test_groups_by_label_and_unheld_gpu_stays_visible():
    t = series_table({"g0": [50.0, 50.0], "g1": [0.0, 0.0]})
    labels = pa.array([[("team", "vision")], [], [("team", "vision")], []],
                      pa.map_(pa.string(), pa.string()))
    t = t.set_column(t.schema.get_field_index("labels"), "labels", labels)
    u = classify(recording(t), by=["team"])
    groups = dict(u.per_group())
    assert set(groups) == {("vision",), (None,)}
    assert groups[(None,)].idle_s == pytest.approx(2.0)


def test_interval_inferred_when_unknown():
    t = series_table({"g0": [50.0] * 10}, interval_s=0.5)
    u = classify(recording(t, interval_s=None))
    assert u.interval_s == pytest.approx(0.5)


@st.composite
def random_tables(draw):
    n_gpus = draw(st.integers(1, 4))
    data = {}
    for g in range(n_gpus):
        n = draw(st.integers(1, 40))
        data[f"g{g}"] = draw(st.lists(
            st.one_of(st.none(), st.sampled_from([0.0, 5.0, 10.0, 42.0, 69.0, 70.0, 89.0,
                                                  90.0, 100.0])),
            min_size=n, max_size=n))
    t = series_table(data)
    # random gaps: drop some rows
    keep = draw(st.lists(st.booleans(), min_size=t.num_rows, max_size=t.num_rows))
    if any(keep):
        t = t.filter(pa.array(keep))
    return t


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_tables(), st.integers(1, 17))
def test_property_batch_split_invariance_and_shares_sum_to_100(table, chunk):
    whole = classify(recording(table))

    class Chunked:
        source = "test"
        origin = "chunked"
        interval_s = 1.0
        notes = ()
        events = ()

        def batches(self):
            yield from table.to_batches(max_chunksize=chunk)

    split = classify(Chunked())
    a, b = whole.overall(), split.overall()
    for f in fields(PhaseTime):
        assert getattr(a, f.name) == pytest.approx(getattr(b, f.name), abs=1e-6), f.name
    for _, pt in whole.per_gpu():
        shares = pt.phase_shares_pct()
        assert sum(shares.values()) in (0, 100)
        assert all(v >= 0 for v in shares.values())
        # observed + unobserved = the time from first sample to end of the last interval
    assert a.samples == table.num_rows
    assert sum(pt.total_s for _, pt in whole.per_gpu()) == pytest.approx(a.total_s)


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=12))
def test_property_largest_remainder_sums_exactly(values):
    out = largest_remainder(values)
    assert sum(out) in (0, 100)
    total = sum(values)
    if total > 0:
        for v, o in zip(values, out):
            assert abs(o - 100 * v / total) < 1.0 + 1e-9


def _shape(kind: str, n: int = 720) -> list[float]:
    rng = np.random.default_rng(7)
    if kind == "bursty":  # input-starved: 1 s waits, 1 s bursts at 100%
        return [0.0 if (i // 2) % 2 == 0 else 100.0 for i in range(n)]
    if kind == "steady":
        return list(50.0 + rng.normal(0, 3, n).clip(-9, 9))
    if kind == "phased":  # 2 min idle, 2 min at 100%
        return [0.0 if (i // 120) % 2 == 0 else 100.0 for i in range(n)]
    raise AssertionError(kind)


def test_same_mean_different_shapes_are_told_apart():
    t = series_table({"bursty": _shape("bursty"), "steady": _shape("steady"),
                      "phased": _shape("phased")})
    u = classify(recording(t))
    kinds = {p.gpu_uuid: p.kind for p in u.patterns}
    means = {s.gpu_uuid: s.mean_util_pct for s in u.series}
    assert all(abs(m - 50) < 2 for m in means.values())
    assert kinds == {"bursty": "bursty", "steady": "steady", "phased": "phased"}


def test_real_recording_nanogpt(nanogpt: Recording):
    u = classify(nanogpt)
    assert len(u.series) == 8
    pt = u.overall()
    shares = pt.phase_shares_pct()
    # The log: ~40 s idle, ~3.5 min at 100 %, idle again: mostly compute-bound, some idle.
    assert shares["compute_bound"] > 70 and 5 < shares["idle"] < 30
    assert sum(shares.values()) == 100
    assert 0.3 < u.interval_s < 0.36
