"""Idle gaps (the loop's cadence, for telling a host step from an input pipeline): the
histogram classify keeps equals the closed idle runs counted by hand, whatever the batch
size and however the file is cut into row-group ranges."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from coretables import series_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.classify import classify, parallel
from gpuaudit.classify.accumulate import GAP_EDGES_S, gap_quantiles
from gpuaudit.measure.files import open_samples
from gpuaudit.measure.parquet_io import write_recording
from gpuaudit.schema import Recording


def _closed_runs(vals: list[float]) -> list[int]:
    """Lengths (rows) of idle runs with a busy row before and after them."""
    out, j, n = [], 0, len(vals)
    while j < n:
        if vals[j] < 10:
            k = j
            while k < n and vals[k] < 10:
                k += 1
            if j > 0 and k < n:
                out.append(k - j)
            j = k
        else:
            j += 1
    return out


@st.composite
def loops(draw: st.DrawFn) -> dict[str, list[float]]:
    out = {}
    for g in range(draw(st.integers(1, 3))):
        runs = draw(st.lists(st.tuples(st.sampled_from([0.0, 5.0, 50.0, 95.0]),
                                       st.integers(1, 15)), min_size=1, max_size=12))
        out[f"GPU-{g}"] = [v for v, k in runs for _ in range(k)]
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loops(), st.integers(1, 7), st.integers(1, 4), st.sampled_from([3, 1 << 20]))
def test_gap_histogram_equals_the_closed_runs(util, rows_per_group, parts, batch_rows):
    table = series_table(util, interval_s=1.0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.parquet"
        write_recording(Recording(table=table, source="test", origin="test", interval_s=1.0),
                        path, row_group_rows=rows_per_group)
        old = parallel._start
        parallel._start = lambda *a, **k: None  # ranges stitched in this process
        try:
            usage = classify(open_samples(path, batch_rows=batch_rows), workers=parts)
        finally:
            parallel._start = old
    for s in usage.series:
        runs = _closed_runs(util[s.gpu_uuid])
        assert s.idle_gaps == len(runs), s.gpu_uuid
        if runs:
            q = s.idle_gap_quartiles_s
            assert q is not None
            lo, hi = min(runs), max(runs)
            # quantiles interpolate inside one log bin (a factor 10**0.1) of the true values
            assert lo / 1.26 <= q[0] <= q[1] <= q[2] <= hi * 1.26
        else:
            assert s.idle_gap_quartiles_s is None


def test_regular_and_scattered_gaps_tell_apart() -> None:
    regular = ([95.0] * 5 + [0.0] * 3) * 40  # 3 s gaps, every 8 s
    rng = np.random.default_rng(1)
    scattered: list[float] = []
    for _ in range(40):
        scattered += [95.0] * int(rng.integers(2, 8)) + [0.0] * int(rng.choice([1, 2, 5, 13]))
    scattered.append(95.0)
    usage = classify(series_table({"reg": [*regular, 95.0], "sc": scattered}))
    by = {s.gpu_uuid: s for s in usage.series}
    assert by["reg"].idle_gaps == 40
    assert by["reg"].idle_gap_median_s == pytest.approx(3.0, rel=0.13)
    assert by["reg"].idle_gap_dispersion is not None and by["reg"].idle_gap_dispersion < 0.1
    assert by["sc"].idle_gap_dispersion is not None and by["sc"].idle_gap_dispersion > 0.3


def test_quantiles_of_an_empty_histogram() -> None:
    assert gap_quantiles(np.zeros(GAP_EDGES_S.shape[0] + 1)) is None
