"""The replay of a packing (capacity.simulate._replay) adds each GPU's co-located demand row
by row, in workload order, without gathering the whole workloads x steps matrix sorted by
GPU as the form it replaced did (``np.add.reduceat`` over the sorted rows, kept here as the
reference). The contention and throttling shares count steps: equal exactly. The projected
utilization is a sum of floats whose grouping reduceat chose by the array's shape (row by
row over a recording's thousands of steps, where the two agree bit for bit:
docs/benchmarks.md; in pairs over a few): equal to the float type's rounding."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.capacity.simulate import _EPS, _replay


def _replay_by_reduceat(d, gpu_of, gpus, cap=None):
    if gpus == 0 or d.shape[1] == 0:
        return 0.0, 0.0, 0.0
    order = np.argsort(gpu_of, kind="stable")
    g_sorted = gpu_of[order]
    starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
    if cap is not None:
        served = np.minimum(d, cap[:, None])
        over = d > cap[:, None] + _EPS
        load = np.add.reduceat(served[order], starts, axis=0)
        per_gpu_over = np.logical_or.reduceat(over[order], starts, axis=0)
        util = float(load.sum()) / (gpus * d.shape[1]) * 100.0
        return util, float(per_gpu_over.sum()) / (gpus * d.shape[1]), float(over.mean())
    load = np.add.reduceat(d[order], starts, axis=0)
    over_gpu = load > 1.0 + _EPS
    util = float(np.minimum(load, 1.0).sum()) / (gpus * d.shape[1]) * 100.0
    over_w = over_gpu[np.searchsorted(starts, np.arange(len(order)), side="right") - 1]
    active = d[order] > 0
    throttled = float((over_w & active).sum()) / max(1, d.size)
    return util, float(over_gpu.sum()) / (gpus * d.shape[1]), throttled


def _close(got, want, mig):
    rel = 1e-12 if mig else 1e-5  # (MIG's served demand is float64, the rest float32)
    return got[1:] == want[1:] and abs(got[0] - want[0]) <= rel * max(1.0, abs(want[0]))


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(1, 12), st.integers(1, 40), st.booleans())
def test_property_the_replay_equals_the_sorted_reduceat(data, n_work, steps, mig):
    # demands as simulate makes them (float32 fractions of a GPU, some 0, some over 1)
    d = np.array(data.draw(st.lists(
        st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.3, 1 / 3, 0.5, 0.7, 0.99, 1.0, 1.2]),
                 min_size=steps, max_size=steps), min_size=n_work, max_size=n_work)),
        dtype=np.float32)
    gpus = data.draw(st.integers(1, n_work))
    gpu_of = np.array(data.draw(st.lists(st.integers(0, gpus - 1), min_size=n_work,
                                         max_size=n_work)), dtype=np.int64)
    cap = (np.array(data.draw(st.lists(st.sampled_from([1 / 7, 2 / 7, 3 / 7, 4 / 7, 1.0]),
                                       min_size=n_work, max_size=n_work)))
           if mig else None)
    assert _close(_replay(d, gpu_of, gpus, cap), _replay_by_reduceat(d, gpu_of, gpus, cap),
                  mig)


def test_the_projected_utilization_is_the_co_located_demand_capped_at_one_gpu():
    """Two GPUs, three workloads: GPU 0 holds 0.7 + 0.5 (over: 1.0 counted, contention),
    then 0.2 + 0.3; GPU 1 holds 0.4, then 0.0."""
    d = np.array([[0.7, 0.2], [0.4, 0.0], [0.5, 0.3]], dtype=np.float32)
    util, contention, throttled = _replay(d, np.array([0, 1, 0]), 2)
    assert abs(util - (1.0 + 0.5 + 0.4 + 0.0) / 4 * 100) < 1e-4
    assert contention == 1 / 4  # GPU 0 at step 0, of 2 GPUs x 2 steps
    assert throttled == 2 / 6  # workloads 0 and 2 at step 0, of 3 x 2 workload-steps


def test_a_packing_with_no_gpus_or_no_steps_replays_to_zero():
    d = np.zeros((2, 0), np.float32)
    assert _replay(d, np.array([0, 0]), 1) == (0.0, 0.0, 0.0)
    assert _replay(np.zeros((0, 5), np.float32), np.zeros(0, np.int64), 0) == (0.0, 0.0, 0.0)
