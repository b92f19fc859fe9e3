"""The busy onsets of the lags (classify.lag), gathered in classify's own pass, are exactly
the onsets a second read of the samples finds, however the rows are batched or split into
row-group ranges."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from coretables import recording, series_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.classify import classify, parallel, passes
from gpuaudit.classify.lag import busy_onsets, nanmedian_columns, onset_lags
from gpuaudit.classify.parallel import classify_ranges
from gpuaudit.classify.phases import _Engine
from gpuaudit.measure.files import open_samples
from gpuaudit.measure.parquet_io import write_recording
from gpuaudit.schema import Recording

UTILS = [0.0, 5.0, 9.0, 10.0, 50.0, 100.0]


@st.composite
def tables(draw):
    """A few GPUs (two on one host: a job) switching between idle and busy, with missing
    readings, readings only from gr_engine_active (which onsets do not read), rows left out
    (late starts, gaps)."""
    n_gpus = draw(st.integers(1, 4))
    length = draw(st.integers(2, 50))
    util, gr = {}, {}
    for g in range(n_gpus):
        vals = draw(st.lists(st.one_of(st.none(), st.sampled_from(UTILS)), min_size=length,
                             max_size=length))
        name = f"GPU-{g}"
        util[name] = vals
        gr[name] = [draw(st.sampled_from([None, 0.02, 0.5])) if v is None else None
                    for v in vals]
    table = series_table(util, extra={"gr_engine_active": gr})
    keep = draw(st.lists(st.booleans(), min_size=table.num_rows, max_size=table.num_rows))
    if any(keep):
        table = table.filter(pa.array(keep))
    return table


def _uuids(table: pa.Table) -> list[str]:
    return sorted(set(table.column("gpu_uuid").to_pylist()))


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray], uuids: list[str]) -> None:
    for u in uuids:
        assert a[u].dtype == np.int64 and np.array_equal(a[u], b[u]), u


@settings(max_examples=60, deadline=None)
@given(tables(), st.lists(st.integers(1, 200), max_size=5))
def test_property_onsets_in_the_pass_equal_a_second_read(table, cuts):
    uuids = _uuids(table)
    expected = busy_onsets(recording(table), uuids)
    engine = _Engine((), 1.0, 3.0, onsets=True)
    lo = 0
    for c in [*sorted(set(cuts)), table.num_rows]:
        if c > lo:
            for batch in table.slice(lo, c - lo).to_batches():
                engine.feed(batch, position="test")
            lo = c
    engine.finish()
    assert engine.onsets is not None
    _same(engine.onsets.onsets(list(engine.series_index)), expected, uuids)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), st.integers(1, 9), st.integers(2, 5))
def test_property_onsets_stitched_across_ranges_equal_a_second_read(table, rows_per_group,
                                                                    parts):
    uuids = _uuids(table)
    expected = busy_onsets(recording(table), uuids)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.parquet"
        write_recording(recording(table), path, row_group_rows=rows_per_group)
        recipes = open_samples(path, batch_rows=3).split(parts)
        if recipes is None:
            return
        engine = classify_ranges(recipes, (), 1.0, 3.0, onsets=True, processes=False)
        engine.finish()
    assert engine.onsets is not None
    _same(engine.onsets.onsets(list(engine.series_index)), expected, uuids)


def test_onsets_keep_the_first_max_onsets_per_gpu(monkeypatch):
    """A GPU switching every sample: only the first MAX_ONSETS onsets are kept, across
    batches and ranges as in one read."""
    monkeypatch.setattr("gpuaudit.classify.lag.MAX_ONSETS", 7)
    table = series_table({"GPU-a": [0.0, 100.0] * 30, "GPU-b": [100.0, 0.0] * 30})
    expected = busy_onsets(recording(table), ["GPU-a", "GPU-b"])
    assert expected["GPU-a"].size == 7
    engine = _Engine((), 1.0, 3.0, onsets=True)
    for batch in table.to_batches(max_chunksize=9):
        engine.feed(batch, position="test")
    assert engine.onsets is not None
    _same(engine.onsets.onsets(["GPU-a", "GPU-b"]), expected, ["GPU-a", "GPU-b"])


def test_classify_reads_the_samples_once_for_the_lags(tmp_path, monkeypatch):
    """A job of two GPUs, one a sample late at each step: the lags come out as a second read
    gives them, and classify reads the file only once (no busy_onsets pass)."""
    pattern = ([0.0] * 3 + [100.0] * 3) * 20
    table = series_table({"GPU-a": pattern, "GPU-b": [0.0, *pattern[:-1]]})
    path = tmp_path / "r.parquet"
    write_recording(recording(table), path, row_group_rows=17)
    jobs = {"h1": ["GPU-a", "GPU-b"]}
    expected = onset_lags(busy_onsets(recording(table), ["GPU-a", "GPU-b"]), jobs)
    assert expected and expected[0].steps > 10

    def no_second_read(*a: object, **k: object) -> None:
        raise AssertionError("the lags read the samples again")

    monkeypatch.setattr(passes, "busy_onsets", no_second_read)
    monkeypatch.setattr(parallel, "_start", lambda *a, **k: None)
    for workers in (1, 3):
        usage = classify(open_samples(path, batch_rows=5), workers=workers)
        assert usage.onset_lags == expected
    lag_b = {lg.gpu_uuid: lg for lg in expected}["GPU-b"]
    assert lag_b.median_lag_s == pytest.approx(1.0)


def test_no_onsets_gathered_without_a_timeline():
    table = series_table({"GPU-a": [0.0, 100.0] * 5, "GPU-b": [0.0, 100.0] * 5})
    usage = classify(Recording(table=table, source="t", origin="t", interval_s=1.0),
                     timeline=False)
    assert usage.onset_lags == ()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(1, 40), st.data())
def test_property_the_lag_median_is_numpys_nanmedian_to_the_bit(peers, steps, data):
    """The per-step median over peers (NaN: no peer onset near) is ``np.nanmedian``'s,
    bit for bit: odd and even counts, lags in whole nanoseconds and fractions, ties."""
    vals = st.one_of(st.just(np.nan), st.integers(-10**12, 10**12).map(float),
                     st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([0.0, 1.0, -1.0]))
    a = np.array(data.draw(st.lists(st.lists(vals, min_size=steps, max_size=steps),
                                    min_size=peers, max_size=peers)), dtype=np.float64)
    a = a[:, ~np.all(np.isnan(a), axis=0)]  # onset_lags keeps the steps some peer matched
    np.testing.assert_array_equal(nanmedian_columns(a), np.nanmedian(a, axis=0))


def _lags_pair_by_pair(onsets, jobs):
    """onset_lags as it was written first: one search per (GPU, peer) pair."""
    out = []
    for job, members in jobs.items():
        have = [m for m in members if onsets.get(m) is not None and onsets[m].size >= 2]
        if len(have) < 2:
            continue
        for g in have:
            mine = onsets[g].astype(np.int64)
            period = float(np.median(np.diff(mine))) / 1e9
            if period <= 0:
                continue
            half_ns = period * 1e9 / 2
            per_peer = []
            for p in have:
                if p == g:
                    continue
                theirs = onsets[p].astype(np.int64)
                i = np.clip(np.searchsorted(theirs, mine), 1, theirs.size - 1)
                left, right = theirs[i - 1], theirs[i]
                near = np.where(mine - left <= right - mine, left, right)
                d = (mine - near).astype(np.float64)
                per_peer.append(np.where(np.abs(d) <= half_ns, d, np.nan))
            lags = np.asarray(per_peer)
            matched = ~np.all(np.isnan(lags), axis=0)
            if not matched.any():
                continue
            step = np.nanmedian(lags[:, matched], axis=0) / 1e9
            out.append((g, job, int(step.size), period, float(np.median(step)),
                        float(np.mean(step > 0))))
    return out


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from([10**9, 60 * 10**9, 10**16]),
       st.sampled_from([0, 1_767_225_600 * 10**9, -(2**62)]))
def test_property_lags_equal_the_search_pair_by_pair(data, unit, t0):
    """The lags, NumPy's form (the medians over peers in one sort) and the compiled loop's,
    equal the first form, one search and np.nanmedian per (GPU, peer) pair: ties, onsets
    past either end of a peer's, peers of two onsets, GPUs of one onset (left out), spans
    near the ends of int64."""
    n_jobs = data.draw(st.integers(1, 3))
    onsets, jobs = {}, {}
    for j in range(n_jobs):
        members = []
        for g in range(data.draw(st.integers(2, 5))):
            steps = data.draw(st.lists(st.integers(0, 400), min_size=0, max_size=30,
                                       unique=True))
            name = f"GPU-{j}-{g}"
            onsets[name] = np.array(sorted(t0 + s * unit for s in steps), dtype=np.int64)
            members.append(name)
        jobs[f"job-{j}"] = members
    want = _lags_pair_by_pair(onsets, jobs)
    for compiled in (False, True):
        got = [(x.gpu_uuid, x.job, x.steps, x.period_s, x.median_lag_s, x.late_share)
               for x in onset_lags(onsets, jobs, compiled=compiled)]
        assert got == want, compiled


@st.composite
def onset_sets(draw):
    """Jobs of GPUs whose onsets come at a period with jitter, some far off (no peer within
    half a period), repeated times, peers with far fewer onsets than the GPU."""
    onsets, jobs = {}, {}
    for j in range(draw(st.integers(1, 3))):
        members = []
        for g in range(draw(st.integers(1, 5))):
            period = draw(st.sampled_from([1, 4, 10, 60])) * 10**9
            n = draw(st.integers(0, 40))
            jitter = draw(st.lists(st.integers(-3 * 10**9, 3 * 10**9), min_size=n,
                                   max_size=n))
            t = np.sort(np.array([k * period + x for k, x in enumerate(jitter)],
                                 dtype=np.int64))
            name = f"GPU-{j}-{g}"
            onsets[name] = t
            members.append(name)
        jobs[f"job-{j}"] = members
    return onsets, jobs


@settings(max_examples=200, deadline=None)
@given(onset_sets())
def test_property_the_compiled_lags_equal_the_numpy_ones(case):
    """The steps' lags in the compiled loop (merge walks, a median per onset) are the NumPy
    form's, figure for figure."""
    from gpuaudit.classify import fused

    assert fused.available(), "numba is a dependency: it must import"
    onsets, jobs = case
    assert onset_lags(onsets, jobs, compiled=True) == onset_lags(onsets, jobs, compiled=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 10**12)), max_size=300))
def test_property_onsets_grouped_by_series_keep_each_series_order(pairs):
    """The counting sort of the compiled loops groups onsets by series as a stable sort does
    (each series' in the order met), and OnsetAcc.onsets gives the same either way."""
    from gpuaudit.classify import fused
    from gpuaudit.classify.lag import OnsetAcc, _by_series

    assert fused.available(), "numba is a dependency: it must import"
    c = np.array([p[0] for p in pairs], dtype=np.int64)
    t = np.array([p[1] for p in pairs], dtype=np.int64)
    order = np.argsort(c, kind="stable")
    got_c, got_t = _by_series(c, t)
    assert got_c.tolist() == c[order].tolist() and got_t.tolist() == t[order].tolist()
    acc = OnsetAcc()
    acc.grow(41)
    for part in np.array_split(np.arange(c.size), 11):  # more parts than are sliced apart
        acc.parts.append((c[part], t[part]))
    uuids = [f"GPU-{k}" for k in range(41)]
    many = acc.onsets(uuids)
    acc.compact()
    assert len(acc.parts) <= 1
    one = acc.onsets(uuids)
    for k, u in enumerate(uuids):
        assert many[u].tolist() == one[u].tolist() == t[c == k].tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), max_size=30), max_size=4), st.booleans())
def test_property_onsets_pickle_back_the_same(parts, compact):
    """A range's onsets travel back from its worker as per-series counts where a part is
    grouped by series: unpickled, the very same parts (codes, times, dtypes, order)."""
    import pickle

    acc = passes_onset_acc()
    acc.grow(8)
    for k, codes in enumerate(parts):
        c = np.array(codes, dtype=np.int64)
        acc.parts.append((c, np.arange(c.size, dtype=np.int64) + 100 * k))
    if compact:
        acc.compact()
    back = pickle.loads(pickle.dumps(acc, pickle.HIGHEST_PROTOCOL))
    assert len(back.parts) == len(acc.parts)
    for (c0, t0), (c1, t1) in zip(acc.parts, back.parts):
        assert c0.dtype == c1.dtype and t0.dtype == t1.dtype
        assert c0.tolist() == c1.tolist() and t0.tolist() == t1.tolist()
    assert (back.kept == acc.kept).all() and back.size == acc.size


def passes_onset_acc():
    from gpuaudit.classify.lag import OnsetAcc

    return OnsetAcc()


def test_the_lags_run_beside_the_patterns_and_their_errors_reach_the_caller(monkeypatch):
    """The lags from the gathered onsets run in a thread of their own while the patterns are
    found (both mostly compiled loops that release the interpreter); the result is the one
    computed in line, and an exception in that thread is raised by classify."""
    import threading

    pattern = ([0.0] * 3 + [100.0] * 3) * 20
    table = series_table({"GPU-a": pattern, "GPU-b": [0.0, *pattern[:-1]]})
    rec = recording(table)
    in_line = passes.onset_lags(busy_onsets(rec, ["GPU-a", "GPU-b"]), {"h1": ["GPU-a", "GPU-b"]})
    names: list[str] = []
    real = passes._lags

    def spy(*a: object) -> object:
        names.append(threading.current_thread().name)
        return real(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(passes, "_lags", spy)
    usage = classify(rec)
    assert names == ["gpuaudit-lags"] and usage.onset_lags == in_line and in_line

    def broken(*a: object) -> object:
        raise RuntimeError("lags failed")

    monkeypatch.setattr(passes, "_lags", broken)
    with pytest.raises(RuntimeError, match="lags failed"):
        classify(rec)
