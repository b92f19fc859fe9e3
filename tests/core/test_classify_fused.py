"""The compiled pass (classify.fused) gives what the NumPy path gives: every cell, series
statistic, pattern, timeline bucket and lag, across batches and row-group ranges, and the
same error for a GPU whose time runs backwards."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from coretables import recording, series_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_classify_parallel import assert_same_usage

from gpuaudit.classify import classify, fused, parallel
from gpuaudit.classify.usage import Usage
from gpuaudit.errors import SampleTableError
from gpuaudit.measure.files import open_samples
from gpuaudit.measure.parquet_io import write_recording
from gpuaudit.schema import Recording

UTILS = [0.0, 3.0, 9.0, 10.0, 42.0, 69.0, 70.0, 89.0, 90.0, 99.5, 100.0]


@st.composite
def tables(draw):
    """GPUs (two hosts) with utilization runs: idle stretches across batches and ranges,
    missing readings, readings from gr_engine_active only, gaps past the cap, late starts
    and early ends (rows left out)."""
    n_gpus = draw(st.integers(1, 5))
    length = draw(st.integers(2, 60))
    util, gr, host, pod = {}, {}, {}, {}
    for g in range(n_gpus):
        runs = draw(st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(UTILS)),
                                       st.integers(1, 12)), min_size=1, max_size=8))
        vals = [v for v, k in runs for _ in range(k)][:length]
        name = f"GPU-{g}"
        util[name] = vals
        gr[name] = [draw(st.sampled_from([None, 0.05, 0.95])) if v is None else None
                    for v in vals]
        host[name] = [f"h{g % 2}"] * len(vals)
        pod[name] = [f"pod-{(i // 7 + g) % 3}" for i in range(len(vals))]
    table = series_table(util, extra={"gr_engine_active": gr, "pod": pod})
    table = table.set_column(table.schema.get_field_index("host"), "host",
                             pa.array([f"h{int(u[4:]) % 2}"
                                       for u in table.column("gpu_uuid").to_pylist()]))
    keep = draw(st.lists(st.booleans(), min_size=table.num_rows, max_size=table.num_rows))
    if any(keep):
        table = table.filter(pa.array(keep))
    return table


@pytest.fixture
def taken(monkeypatch):
    """The compiled pass for every batch, however small; counts the batches it took."""
    assert fused.available(), "numba is a dependency: it must import"
    monkeypatch.setattr(fused, "MIN_ROWS", 1)
    monkeypatch.setattr(fused, "MIN_SOURCE_ROWS", 1)
    monkeypatch.setattr(parallel, "_start", lambda *a, **k: None)
    count = [0]
    real = fused.stream_batch

    def counting(*a, **k):
        out = real(*a, **k)
        count[0] += out is not None
        return out

    monkeypatch.setattr(fused, "stream_batch", counting)
    return count


def _numpy_path(fn):
    state = fused._state
    fused._state = False
    try:
        return fn()
    finally:
        fused._state = state


def _same_timeline(a: Usage, b: Usage) -> None:
    assert (a.timeline is None) == (b.timeline is None)
    if a.timeline is None or b.timeline is None:
        return
    ta, tb = a.timeline, b.timeline
    assert ta.start == tb.start and ta.bucket_s == tb.bucket_s and ta.gpu_uuids == tb.gpu_uuids
    np.testing.assert_allclose(ta.observed_s, tb.observed_s, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ta.util_pct, tb.util_pct, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ta.hist_s, tb.hist_s, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ta.phase_s, tb.phase_s, rtol=1e-9, atol=1e-9)
    assert (ta.phase == tb.phase).all()


def _both_paths(taken, table: pa.Table, rows_per_group: int, workers: int,
                batch_rows: int, by: tuple[str, ...]) -> tuple[Usage, Usage]:
    """``table`` written as a recording and classified by the compiled pass (which must
    take some batch) and by the NumPy path."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.parquet"
        write_recording(recording(table), path, row_group_rows=rows_per_group)

        def run() -> Usage:
            return classify(open_samples(path, batch_rows=batch_rows), by=by,
                            workers=workers)

        before = taken[0]
        fast = run()
        assert taken[0] > before  # the compiled pass did take batches
        slow = _numpy_path(run)
    return fast, slow


def _same_timeline_signals(a: Usage, b: Usage) -> None:
    assert a.timeline is not None and b.timeline is not None
    assert set(a.timeline.signals) == set(b.timeline.signals)
    for name, arr in b.timeline.signals.items():
        np.testing.assert_allclose(a.timeline.signals[name], arr, rtol=1e-9, atol=1e-9,
                                   err_msg=name)


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(tables(), st.integers(1, 9), st.integers(1, 4), st.integers(1, 7),
       st.sampled_from([(), ("pod",), ("host",)]))
def test_property_the_compiled_pass_equals_the_numpy_path(taken, table, rows_per_group,
                                                          workers, batch_rows, by):
    fast, slow = _both_paths(taken, table, rows_per_group, workers, batch_rows, by)
    assert_same_usage(fast, slow)
    _same_timeline(fast, slow)
    assert fast.onset_lags == slow.onset_lags
    assert sum(fast.overall().phase_shares_pct().values()) in (0, 100)


MAXIMA = ("mem_used_mib", "mem_total_mib", "temp_c", "power_limit_w")


@st.composite
def tables_with_maxima(draw):
    """:func:`tables` with the per-GPU maxima a sampler records beside utilization (memory
    used and total, temperature, the power limit), some of them missing on some rows or
    for the whole recording."""
    table = draw(tables())
    n = table.num_rows
    for name in MAXIMA:
        if draw(st.booleans()):
            continue  # never measured
        top = 120.0 if name == "temp_c" else 90_000.0
        vals = draw(st.lists(st.one_of(st.none(), st.floats(0.0, top)),
                             min_size=n, max_size=n))
        table = table.set_column(table.schema.get_field_index(name), name,
                                 pa.array(vals, pa.float32()))
    return table


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(tables_with_maxima(), st.integers(1, 9), st.integers(1, 4), st.integers(1, 7),
       st.sampled_from([(), ("pod",)]))
def test_property_the_maxima_take_the_compiled_pass(taken, table, rows_per_group, workers,
                                                    batch_rows, by):
    """Memory used and total, temperature and the power limit (every nvidia-smi log has the
    first two) no longer send a batch to the NumPy path: each GPU's maxima and the memory
    bucketed on the timeline are the NumPy path's."""
    fast, slow = _both_paths(taken, table, rows_per_group, workers, batch_rows, by)
    assert_same_usage(fast, slow)  # the series' maxima among the rest
    _same_timeline(fast, slow)
    _same_timeline_signals(fast, slow)
    assert fast.onset_lags == slow.onset_lags


#: sample-table columns of the time-weighted mean signals (power, PCIe with its idle share,
#: the host's CPU with its idle and busy shares, tensor activity)
MEANS = {"power_w": 700.0, "pcie_tx_bytes_per_s": 3e10, "pcie_rx_bytes_per_s": 3e10,
         "host_cpu_util_pct": 100.0, "tensor_active": 1.0}


@st.composite
def tables_with_means(draw):
    """:func:`tables_with_maxima` with mean signals (dcgm-exporter records power on every
    GPU), some missing on some rows or for the whole recording."""
    table = draw(tables_with_maxima())
    n = table.num_rows
    for name, top in MEANS.items():
        if draw(st.booleans()):
            continue  # never measured
        vals = draw(st.lists(st.one_of(st.none(), st.floats(0.0, top)),
                             min_size=n, max_size=n))
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, pa.array(vals, table.schema.field(i).type))
    return table


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(tables_with_means(), st.integers(1, 9), st.integers(1, 4), st.integers(1, 7),
       st.sampled_from([(), ("pod",)]))
def test_property_the_mean_signals_take_the_compiled_pass(taken, table, rows_per_group,
                                                          workers, batch_rows, by):
    """Power, PCIe, the host's CPU and tensor activity no longer send a batch to the NumPy
    path: each GPU's time-weighted means (power's spread too) and the signals bucketed on
    the timeline are the NumPy path's."""
    fast, slow = _both_paths(taken, table, rows_per_group, workers, batch_rows, by)
    assert_same_usage(fast, slow)  # the series' means, power's spread among the rest
    _same_timeline(fast, slow)
    _same_timeline_signals(fast, slow)
    assert fast.onset_lags == slow.onset_lags


def test_a_time_sliced_batch_after_compiled_ones_continues_them(taken):
    """Rows with gpu_share (time-slicing) take the NumPy path; a GPU carried over from a
    compiled batch continues there as if one path had read both."""
    plain = series_table({"GPU-a": [0.0, 50.0, 95.0, 5.0, 5.0, 80.0] * 4})
    shared = series_table({"GPU-a": [30.0, 0.0, 0.0, 100.0]}, t0_s=1_700_000_024,
                          extra={"gpu_share": {"GPU-a": [0.5, 0.5, 0.5, 0.5]}})
    table = pa.concat_tables([plain, shared])
    rec = Recording(table=table, source="t", origin="t", interval_s=1.0)
    fast = classify(rec)
    assert taken[0] >= 1
    assert_same_usage(fast, _numpy_path(lambda: classify(rec)))


def test_unsliced_rows_after_a_time_sliced_batch_take_the_compiled_pass(taken):
    """A batch with time-sliced rows takes the NumPy path and leaves every carried row with
    a share (1 where the GPU was not sliced). When no carried row is sliced, the batches
    after it (none sliced) take the compiled pass again, a share of 1 weighing as none;
    a GPU still sliced at the batch's end sends the next batch to the NumPy path first.
    Either way the figures are the NumPy path's."""
    after = series_table({"GPU-a": [0.0, 50.0, 95.0, 5.0, 5.0, 80.0] * 4,
                          "GPU-b": [90.0, 3.0, 40.0] * 8}, t0_s=1_700_000_024)
    for last_sliced, compiled in ((False, 6), (True, 5)):
        shares = [0.5, 0.5, 0.5, 0.5 if last_sliced else None]
        shared = series_table({"GPU-a": [30.0, 0.0, 0.0, 100.0], "GPU-b": [5.0, 95.0] * 2},
                              extra={"gpu_share": {"GPU-a": shares, "GPU-b": [None] * 4}})
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "r.parquet"
            write_recording(recording(pa.concat_tables([shared, after])), path,
                            row_group_rows=8)

            def run(path: Path = path) -> Usage:
                return classify(open_samples(path, batch_rows=8), workers=1)

            before = taken[0]
            fast = run()
            took = taken[0] - before
            slow = _numpy_path(run)
        assert took == compiled  # of the 6 batches after the sliced one
        assert_same_usage(fast, slow)
        _same_timeline(fast, slow)


def test_time_running_backwards_is_the_same_error_on_both_paths(taken):
    util = {f"GPU-{g}": [float(10 * (i % 11)) for i in range(40)] for g in range(3)}
    table = series_table(util)
    ts = table.column("ts").cast(pa.int64()).to_numpy().copy()
    ts[70], ts[73] = ts[73], ts[70]  # GPU-1 goes back a second
    table = table.set_column(0, "ts", pa.array(ts).cast(pa.timestamp("ns", "UTC")))

    def run() -> Usage:
        return classify(Recording(table=table, source="t", origin="t", interval_s=1.0))

    with pytest.raises(SampleTableError) as fast:
        run()
    with pytest.raises(SampleTableError) as slow:
        _numpy_path(run)
    assert str(fast.value) == str(slow.value) and fast.value.column == "ts"
    assert "GPU-1" in str(fast.value)


def test_the_loop_is_taken_only_for_a_large_source(taken, monkeypatch, tmp_path):
    """numba's import and machine-code load cost more than a small recording's whole NumPy
    pass: the loop is taken from the first batch where the file's footer says it is large,
    for a source of unknown size (CSV) once that many rows were seen, and never otherwise."""
    util = {f"GPU-{g}": [float(10 * (i % 11)) for i in range(60)] for g in range(2)}
    table = series_table(util)
    path = tmp_path / "r.parquet"
    write_recording(recording(table), path, row_group_rows=20)
    n = table.num_rows  # 120 rows, six batches of 20

    def batches_taken(threshold: int, source_path: Path = path) -> int:
        monkeypatch.setattr(fused, "MIN_SOURCE_ROWS", threshold)
        before = taken[0]
        classify(open_samples(source_path, batch_rows=20), workers=1)
        return taken[0] - before

    assert batches_taken(n) == 6  # the footer says 120: every batch, the first included
    assert batches_taken(n + 1) == 0  # smaller than the threshold: NumPy throughout
    csv = tmp_path / "r.csv"
    _write_csv(table, csv)
    got = batches_taken(60, csv)
    assert 0 < got < 6  # unknown size: from the batch where 60 rows had been fed


def _write_csv(table: pa.Table, path: Path) -> None:
    import pyarrow.csv as pacsv

    plain = [f.name for f in table.schema if not pa.types.is_map(f.type)
             and table.column(f.name).null_count < table.num_rows]
    pacsv.write_csv(table.select(plain), path)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0, 100), st.sampled_from([0.0, 5.0, 95.0])),
                min_size=0, max_size=240),
       st.sampled_from([None, (0.2, 5.0), (0.3, 95.0), (0.5, 40.0)]))
def test_property_the_compiled_cut_search_equals_the_numpy_one(values, edge):
    """patterns.split_run's search for the warm-up and cool-down cuts, compiled (taken where
    classify's pass loaded the loops), finds the cuts the NumPy matrices find."""
    import sys

    from gpuaudit.classify import patterns

    x = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    if edge is not None and x.size:  # a warm-up at another level
        k = int(edge[0] * x.size)
        x[:k] = edge[1]
    assert fused.available(), "numba is a dependency: it must import"
    compiled = patterns.split_run(x)
    kernel = sys.modules.pop("gpuaudit.classify._kernel")
    try:
        assert compiled == patterns.split_run(x)
    finally:
        sys.modules["gpuaudit.classify._kernel"] = kernel


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(3, 119), st.sampled_from([0, 1]), st.integers(7, 50))
def test_property_a_backwards_step_anywhere_is_the_numpy_paths_error(taken, at, back, rows):
    """The loop checks the order as it goes (rows before the bad one already accumulated):
    wherever the step back or the repeated time falls (inside a batch, at a batch's first
    row against the carried one), classify raises the NumPy path's error, word for word."""
    util = {f"GPU-{g}": [float(10 * (i % 11)) for i in range(40)] for g in range(3)}
    table = series_table(util)
    ts = table.column("ts").cast(pa.int64()).to_numpy().copy()
    ts[at] = ts[at - 3] - back  # the same GPU's previous time again, or 1 ns before it
    table = table.set_column(0, "ts", pa.array(ts).cast(pa.timestamp("ns", "UTC")))

    def run() -> Usage:
        return classify(Recording(table=table, source="t", origin="t", interval_s=1.0))

    import gpuaudit.classify.phases as phases_mod

    real = phases_mod._Engine.feed

    def small_batches(self, batch, position):  # (as a file's batches arrive)
        for k, part in enumerate(pa.Table.from_batches([batch]).to_batches(max_chunksize=rows)):
            real(self, part, f"{position}.{k}")

    phases_mod._Engine.feed = small_batches
    try:
        with pytest.raises(SampleTableError) as fast:
            run()
        with pytest.raises(SampleTableError) as slow:
            _numpy_path(run)
    finally:
        phases_mod._Engine.feed = real
    assert str(fast.value) == str(slow.value) and fast.value.column == "ts"


def test_the_loops_series_record_round_trips_the_state_it_gathers():
    """Every field of the per-series record (fused.STATE) but the carried row's comes from
    the statistics or the onsets and goes back there unchanged, for the first n_series."""
    from gpuaudit.classify.accumulate import SeriesStats
    from gpuaudit.classify.lag import OnsetAcc

    rng = np.random.default_rng(3)
    stats, onsets = SeriesStats(), OnsetAcc()
    stats.grow(5)
    onsets.grow(5)
    homes = fused._homes(stats, onsets)
    assert {f for f, _ in homes} | {"pend", "p_ts", "p_cell", "p_u"} == set(fused.STATE.names)
    for _, home in homes:
        home[:] = (rng.integers(0, 2, home.shape[0]) if home.dtype == bool
                   else rng.integers(0, 99, home.shape[0]))
    before = [home.copy() for _, home in homes]
    st_ = fused._state_of(stats, onsets, 4)
    assert not st_["pend"].any()
    for field, home in homes:
        np.testing.assert_array_equal(st_[field], home[:4])
        st_[field] = 1 - st_[field] if home.dtype == bool else st_[field] + 1
    fused._state_back(st_, stats, onsets, 4)
    for (field, home), old in zip(fused._homes(stats, onsets), before):
        expected = old.copy()
        expected[:4] = 1 - old[:4] if old.dtype == bool else old[:4] + 1
        np.testing.assert_array_equal(home, expected, err_msg=field)
    # without onsets: only the statistics' fields
    assert {f for f, _ in fused._homes(stats, None)} == {
        f for f, owner, _ in fused._HOMES if owner != "onsets"}
