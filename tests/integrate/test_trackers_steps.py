"""GPU series on the training step, without a tracker library: the cost-per-step curve of a
real recording (nanoGPT on 8x H100, bundled), the bounded step log (property-tested), a
monitor's step counter reaching the summary, and `run --steps` kept when no GPU is sampled
(issue 26 part 5)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gpuaudit
from gpuaudit.api import audit
from gpuaudit.integrate.trackers import (
    PREFIX,
    StepLog,
    TrackerSummary,
    nothing_sampled,
    step_series,
    summarize,
    table_ts_ns,
)
from gpuaudit.measure.live.fake_nvml import FakeNvml

NANOGPT = Path(gpuaudit.__file__).parent / "data" / "nanogpt_8xh100.parquet"


class Capture:
    """A tracker that keeps what it is given (the Tracker protocol, nothing faked of ours)."""

    name = "capture"

    def __init__(self) -> None:
        self.summaries: list[TrackerSummary] = []

    def begin(self) -> dict[str, str]:
        return {}

    def finish(self, summary: TrackerSummary, *, failed: bool = False) -> str:
        self.summaries.append(summary)
        return "capture"


@pytest.fixture(scope="module")
def nanogpt() -> tuple[Any, pa.Table]:
    return audit(NANOGPT), pq.read_table(NANOGPT)


def test_cost_per_step_curve_of_a_real_recording(nanogpt: tuple[Any, pa.Table]) -> None:
    report, table = nanogpt
    ts = np.sort(table_ts_ns(table))
    t0, t1 = int(ts[0]), int(ts[-1])
    n_steps = 5000  # one step every ~60 ms, the last one after the last sample
    step_ts = np.linspace(t0, t1 + 1, n_steps).astype(np.int64)
    steps = np.arange(1, n_steps + 1)
    s = summarize(report, samples=table, steps=(step_ts, steps), max_points=300, html=False)
    by = s.step_series
    assert by is not None and 0 < len(by) <= 300
    assert by.steps[-1] == n_steps and np.all(np.diff(by.steps) > 0)
    total = report.cost.total
    cost, hours = by.columns["cost_usd"], by.columns["gpu_hours"]
    assert np.all(np.diff(cost) >= 0) and np.all(np.diff(hours) >= 0)
    assert math.isclose(cost[-1], float(total.observed_cost), rel_tol=1e-12)
    assert math.isclose(hours[-1], float(total.gpu_hours), rel_tol=1e-12)
    assert np.allclose(by.columns["usd_per_step"], cost / by.steps, rtol=1e-12)
    # utilisation at a step: the mean of every reading since the previous logged step
    util = np.asarray(table.column("util_gpu_pct").cast(pa.float64())
                      .to_numpy(zero_copy_only=False))
    all_ts = table_ts_ns(table)
    i = len(by) // 2
    lo, hi = by.ts_ms[i - 1], by.ts_ms[i]
    t_lo = step_ts[steps == by.steps[i - 1]][0]
    t_hi = step_ts[steps == by.steps[i]][0]
    assert lo <= hi
    sel = (all_ts > t_lo) & (all_ts <= t_hi) & ~np.isnan(util)
    assert math.isclose(by.columns["util_gpu_pct"][i], float(util[sel].mean()), rel_tol=1e-9)
    # the per-GPU series carry the step reached at their time: increasing, within the run
    assert s.series is not None and s.series_steps is not None
    assert len(s.series_steps) == len(s.series)
    assert np.all(np.diff(s.series_steps) >= 0) and s.series_steps[-1] <= n_steps
    assert s.series_steps[-1] > n_steps * 0.9  # the last point is near the end of the run


def test_no_step_counted_keeps_seconds(nanogpt: tuple[Any, pa.Table]) -> None:
    report, table = nanogpt
    s = summarize(report, samples=table, html=False)
    assert s.step_series is None and s.series_steps is None
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert step_series(table, *empty, cost_usd=1.0, gpu_hours=1.0) is None


@given(st.lists(st.integers(1, 5), min_size=1, max_size=3000), st.integers(2, 64))
def test_step_log_is_bounded_and_true(increments: list[int], cap: int) -> None:
    log = StepLog(cap=cap)
    real: dict[int, int] = {}
    step = 0
    for k, inc in enumerate(increments):
        step += inc
        log.add(1_000 * k, step)
        real[step] = 1_000 * k
    assert len(log) < cap
    ts, steps = log.arrays()
    assert steps[-1] == step and ts[-1] == real[step]  # the latest step is always there
    assert np.all(np.diff(steps) > 0)
    assert all(real[int(s)] == int(t) for t, s in zip(ts, steps))  # every pair is real


def test_monitor_counts_steps_for_the_trackers() -> None:
    cap = Capture()
    with gpuaudit.monitor(backend=FakeNvml.backend({"gpus": [{}]}), hz=50, quiet=True,
                          trackers=[cap]) as m:
        for _ in range(12):
            time.sleep(0.03)
            m.step(samples=8)
    (summary,) = cap.summaries
    assert summary.sampled
    by = summary.step_series
    assert by is not None and by.steps[-1] == 12 and by.steps[0] >= 1
    assert summary.metrics[f"{PREFIX}/steps"] == 12
    assert math.isclose(by.columns["cost_usd"][-1], summary.metrics[f"{PREFIX}/cost_usd"],
                        rel_tol=1e-9)


def test_run_keeps_counted_work_without_gpu() -> None:
    from gpuaudit.cli.run import _log_trackers

    cap = Capture()
    _log_trackers([cap], None, None, "no NVIDIA driver", {"team": "a"}, 0, None,
                  counts={"steps": 100.0, "tokens": 5e5})
    (summary,) = cap.summaries
    assert not summary.sampled
    assert summary.metrics == {f"{PREFIX}/steps": 100.0, f"{PREFIX}/tokens": 5e5}
    assert nothing_sampled("x").metrics == {}  # nothing counted: nothing invented
