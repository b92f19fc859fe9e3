"""Row-group ranges classified apart and stitched give exactly what one pass gives."""

from __future__ import annotations

import dataclasses
import itertools
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from coretables import NS, recording, series_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.classify import classify, parallel
from gpuaudit.classify.timeline import timeline_for
from gpuaudit.classify.usage import Usage
from gpuaudit.errors import SampleTableError
from gpuaudit.measure.files import open_samples
from gpuaudit.measure.parquet_io import write_recording

UTILS = [0.0, 3.0, 9.0, 10.0, 42.0, 69.0, 70.0, 89.0, 90.0, 100.0]


def assert_same_usage(a: Usage, b: Usage) -> None:
    assert a.window_start == b.window_start and a.window_end == b.window_end
    assert a.interval_s == b.interval_s
    # cells come in the order batches first met them: compare them by key
    keys = [(name, "ascending") for name in ("gpu_uuid", *a.by)]
    ca = a.cells.sort_by(keys).to_pydict()
    cb = b.cells.sort_by(keys).to_pydict()
    assert list(ca) == list(cb)
    for name in ca:
        if ca[name] and isinstance(ca[name][0], float):
            np.testing.assert_allclose(ca[name], cb[name], rtol=1e-9, atol=1e-9, err_msg=name)
        else:
            assert ca[name] == cb[name], name
    assert [s.gpu_uuid for s in a.series] == [s.gpu_uuid for s in b.series]
    for sa, sb in zip(a.series, b.series):
        for f in dataclasses.fields(sa):
            x, y = getattr(sa, f.name), getattr(sb, f.name)
            if isinstance(x, float) and isinstance(y, float):
                # a standard deviation is sqrt(E[u^2] - E[u]^2): near zero, rounding in the
                # two sums shows as ~1e-7 whatever order they were added in
                tol = 1e-5 if f.name.startswith("std_") else 1e-9
                assert x == pytest.approx(y, rel=1e-9, abs=tol), (sa.gpu_uuid, f.name)
            else:
                assert x == y, (sa.gpu_uuid, f.name)
    # patterns: the same words; their numbers (run phases included) up to float rounding
    assert [(p.gpu_uuid, p.kind, p.shape, p.evidence) for p in a.patterns] == \
        [(p.gpu_uuid, p.kind, p.shape, p.evidence) for p in b.patterns]
    for pa_, pb_ in zip(a.patterns, b.patterns):
        assert pa_.busy_share == pytest.approx(pb_.busy_share, rel=1e-9, abs=1e-12)
        assert pa_.idle_share == pytest.approx(pb_.idle_share, rel=1e-9, abs=1e-12)
        assert [r.name for r in pa_.run_phases] == [r.name for r in pb_.run_phases]
        for ra, rb in zip(pa_.run_phases, pb_.run_phases):
            assert ra.observed_s == pytest.approx(rb.observed_s, rel=1e-9, abs=1e-9)
            assert ra.signals == pytest.approx(rb.signals, rel=1e-9, abs=1e-9)
    assert a.job_patterns == b.job_patterns


@st.composite
def recordings(draw):
    """A few GPUs with utilization runs (idle stretches that span row groups), missing
    readings, gaps, late starts and early ends, plus power, energy, SM activity and pods."""
    n_gpus = draw(st.integers(1, 5))
    length = draw(st.integers(2, 60))
    util, sm, power, energy, pod = {}, {}, {}, {}, {}
    for g in range(n_gpus):
        runs = draw(st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(UTILS)),
                                       st.integers(1, 12)), min_size=1, max_size=8))
        vals = [v for v, k in runs for _ in range(k)][:length]
        name = f"GPU-{g}"
        util[name] = vals
        sm[name] = [None if v is None else v / 100.0 for v in vals]
        power[name] = [None if v is None else 60.0 + 6.0 * v for v in vals]
        energy[name] = list(np.cumsum([100.0] * len(vals)))
        pod[name] = [f"pod-{(i // 7 + g) % 3}" for i in range(len(vals))]
    extra = {"sm_active": sm, "power_w": power, "energy_j": energy, "pod": pod}
    table = series_table(util, extra=extra)
    keep = draw(st.lists(st.booleans(), min_size=table.num_rows, max_size=table.num_rows))
    if any(keep):
        table = table.filter(pa.array(keep))
    return table


def write(table: pa.Table, path: Path, rows_per_group: int) -> Path:
    write_recording(recording(table), path, row_group_rows=rows_per_group)
    return path


@pytest.fixture
def no_worker_processes(monkeypatch):
    """Every range runs in this process through the same stitching (no interpreter starts)."""
    monkeypatch.setattr(parallel, "_start", lambda *a, **k: None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(recordings(), st.integers(1, 9), st.integers(2, 6),
       st.sampled_from([(), ("pod",), ("host",)]))
def test_property_ranges_stitched_equal_one_pass(no_worker_processes, table, rows_per_group,
                                                  parts, by):
    with tempfile.TemporaryDirectory() as tmp:
        path = write(table, Path(tmp) / "r.parquet", rows_per_group)
        whole = classify(open_samples(path, batch_rows=5), by=by, workers=1)
        src = open_samples(path, batch_rows=5)
        stitched = classify(src, by=by, workers=parts)
        assert_same_usage(whole, stitched)
        n_groups = pq.ParquetFile(path).metadata.num_row_groups
        recipes = open_samples(path).split(parts)
        assert (recipes is None) == (n_groups < 2)


def _ramp_table(n_gpus: int = 3, ticks: int = 300) -> pa.Table:
    rng = np.random.default_rng(7)
    util = {f"GPU-{g}": [float(v) for v in rng.choice(UTILS, ticks)] for g in range(n_gpus)}
    for g in range(n_gpus):  # long idle stretches crossing row-group boundaries
        util[f"GPU-{g}"][50 + g * 40: 170 + g * 40] = [0.0] * 120
    return series_table(util)


def test_worker_processes_give_the_same_usage(tmp_path):
    path = write(_ramp_table(), tmp_path / "r.parquet", 100)
    whole = classify(open_samples(path), workers=1)
    recipes = open_samples(path).split(4)
    assert recipes is not None and len(recipes) == 4
    assert_same_usage(whole, classify(open_samples(path), workers=4))


def test_worker_processes_say_nothing_on_stderr(tmp_path, capfd):
    # a worker started with `python -m` ran this module twice (the package imports it first)
    # and printed runpy's RuntimeWarning into every user's terminal
    path = write(_ramp_table(), tmp_path / "r.parquet", 100)
    classify(open_samples(path), workers=3)
    err = capfd.readouterr().err
    assert err == "", err


def test_worker_that_cannot_start_leaves_its_range_to_this_process(tmp_path, monkeypatch):
    path = write(_ramp_table(), tmp_path / "r.parquet", 100)
    whole = classify(open_samples(path), workers=1)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    assert_same_usage(whole, classify(open_samples(path), workers=3))


def test_worker_answering_garbage_leaves_its_range_to_this_process(tmp_path, monkeypatch):
    path = write(_ramp_table(), tmp_path / "r.parquet", 100)
    whole = classify(open_samples(path), workers=1)
    code = "import sys; sys.stdin.buffer.read(); print('not a pickle')"

    def chatty(*_args, **_kw):
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        proc.stdin.close()
        return proc

    monkeypatch.setattr(parallel, "_start", chatty)
    assert_same_usage(whole, classify(open_samples(path), workers=3))


def _backwards(table: pa.Table, row: int) -> pa.Table:
    ts = table.column("ts").cast(pa.int64()).to_numpy().copy()
    ts[row] -= 10 * NS
    return table.set_column(0, "ts", pa.array(ts).cast(pa.timestamp("ns", "UTC")))


def test_backwards_time_inside_a_worker_range_names_the_file_row(tmp_path):
    table = _ramp_table()
    bad_row = 3 * 250 + 1  # well inside the last of four ranges
    path = tmp_path / "r.parquet"
    pq.write_table(pa.Table.from_batches(recording(_backwards(table, bad_row)).table.to_batches()),
                   tmp_path / "plain.parquet")
    # a gpuaudit recording written directly (write_recording would itself refuse it)
    write(table, path, 100)
    meta = pq.ParquetFile(path).schema_arrow.metadata
    pq.write_table(_backwards(table, bad_row).replace_schema_metadata(meta), path,
                   row_group_size=100)
    with pytest.raises(SampleTableError) as err:
        classify(open_samples(path), workers=4)
    assert f"row {bad_row + 1}" in str(err.value) and err.value.column == "ts"


def test_backwards_time_across_a_range_boundary_is_caught(tmp_path):
    table = _ramp_table()
    path = tmp_path / "r.parquet"
    write(table, path, 100)
    meta = pq.ParquetFile(path).schema_arrow.metadata
    # GPU-0's first sample of the second range (row 450 = tick 150) goes back before its last
    # sample of the first range
    pq.write_table(_backwards(table, 450).replace_schema_metadata(meta), path,
                   row_group_size=450)
    for workers in (2, 1):  # named at its file row either way
        with pytest.raises(SampleTableError, match="runs backwards for GPU GPU-0") as err:
            classify(open_samples(path), workers=workers)
        assert "row 451" in str(err.value)


def test_only_untimesliced_gpuaudit_parquet_is_split(tmp_path):
    table = _ramp_table()
    csv = tmp_path / "r.csv"
    csv.write_text("timestamp,index,utilization.gpu [%]\n"
                   + "".join(f"2025/01/01 00:00:{i:02d}.000,0,{i} %\n" for i in range(50)))
    assert open_samples(csv).split(2) is None
    one_group = write(table, tmp_path / "one.parquet", 10_000)
    assert open_samples(one_group).split(2) is None
    shared = table.set_column(table.schema.get_field_index("gpu_share"), "gpu_share",
                              pa.array([0.5] * table.num_rows, pa.float64()))
    sliced = write(shared, tmp_path / "sliced.parquet", 100)
    assert open_samples(sliced).split(2) is None
    # with few rows per part, fewer parts
    path = write(table, tmp_path / "r.parquet", 100)
    ranges = [r.args[3] for r in open_samples(path).split(8)]  # 9 row groups of 100 rows
    assert len(ranges) == 8 and ranges[0][0] == 0 and ranges[-1][1] == 9
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert len(open_samples(path).split(20)) == 9
    assert open_samples(path).split(8, min_rows_per_part=400) is not None
    assert len(open_samples(path).split(8, min_rows_per_part=400)) == 2
    assert open_samples(path).split(8, min_rows_per_part=10_000) is None


def test_errors_cross_process_boundaries_whole():
    err = SampleTableError("bad", column="ts", row=3, value="x", where="f: row 4", fix="sort")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is SampleTableError and str(back) == str(err)
    assert (back.column, back.row, back.value, back.where, back.fix) == ("ts", 3, "x",
                                                                         "f: row 4", "sort")


def test_allocator_tuning_applies_once_and_can_be_refused():
    code = ("from gpuaudit._heap import keep_freed_memory as k; "
            "print(k(), k())")
    env = {k: v for k, v in os.environ.items() if k != "GPUAUDIT_NO_MALLOPT"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    import platform

    expected = str(sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc")
    assert out == [expected, expected]
    out = subprocess.run([sys.executable, "-c", code], env={**env, "GPUAUDIT_NO_MALLOPT": "1"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def assert_same_timeline(a, b) -> None:
    assert a.start == b.start and a.bucket_s == b.bucket_s and a.gpu_uuids == b.gpu_uuids
    assert a.hosts == b.hosts and a.truncated_gpus == b.truncated_gpus
    np.testing.assert_allclose(a.observed_s, b.observed_s, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(a.util_pct, b.util_pct, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(a.hist_s, b.hist_s, rtol=1e-9, atol=1e-9)
    assert (a.phase == b.phase).all()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(recordings(), st.integers(1, 9), st.integers(1, 4))
def test_property_timeline_folded_into_the_pass_equals_a_second_pass(
        no_worker_processes, table, rows_per_group, parts):

    rec = recording(table)
    usage = classify(rec)
    assert usage.timeline is not None
    assert_same_timeline(usage.timeline, timeline_for(rec, usage))
    with tempfile.TemporaryDirectory() as tmp:
        path = write(table, Path(tmp) / "r.parquet", rows_per_group)
        from_file = classify(open_samples(path, batch_rows=4), workers=parts)
        assert from_file.timeline is not None
        assert_same_timeline(from_file.timeline, timeline_for(open_samples(path), from_file))


def test_no_timeline_in_the_pass_when_the_window_is_unknown_up_front():
    table = _ramp_table(2, 20)

    class Live:
        source, origin, interval_s, notes, events = "live", "a live stream", 1.0, (), ()

        def batches(self):
            yield from table.to_batches(max_chunksize=7)

    assert classify(Live()).timeline is None  # a one-shot stream cannot be read again
    # a recording can: classify reads it a second time for the timeline (one path for every
    # caller), which equals the timeline built from scratch over the window it found
    rec = recording(table, interval_s=None)
    usage = classify(rec)
    assert usage.timeline is not None
    again = timeline_for(rec, usage)
    assert again is not None and usage.timeline.to_dict() == again.to_dict()
    assert classify(rec, timeline=False).timeline is None


def test_coding_absorb_keeps_first_timestamps_and_codes_of_new_series():
    """A series first seen in a later range keeps that range's first timestamp when absorbed
    (where a further range's carried rows would end), and a batch read after absorbing codes
    it as the same series, not a second one, even when that batch shares its uuid dictionary
    with the last one read before (the cached mapping predates the absorbed series)."""
    import pyarrow as pa

    from gpuaudit.classify.coding import Coding

    dictionary = pa.array(["GPU-x", "GPU-y", "GPU-z"])

    def batch(rows: list[int]) -> pa.RecordBatch:
        n = len(rows)
        uuid = pa.DictionaryArray.from_arrays(pa.array(rows, pa.int32()), dictionary)
        return pa.record_batch({"gpu_uuid": uuid, "host": ["h"] * n, "gpu_model": ["L4"] * n,
                                "mig_profile": pa.nulls(n, pa.string())})

    a, b = Coding(()), Coding(())
    a.series_codes(batch([0]), np.array([100]))
    a.series_codes(batch([1]), np.array([150]))  # z is in the dictionary, unused yet
    b.series_codes(batch([2, 0, 1]), np.array([200, 210, 220]))
    m, _ = a.absorb(b)
    z = a.series_index["GPU-z"]
    assert z == 2 and list(m) == [2, 0, 1]
    assert a.first_ts[z] == 200 and a.first_ts[0] == 100 and a.first_ts[1] == 150
    codes = a.series_codes(batch([1, 2]), np.array([300, 310]))
    assert list(codes) == [1, 2] and a.n_series == 3 and a.series_index["GPU-z"] == 2


def test_classify_leaves_the_order_check_to_its_engine(tmp_path, monkeypatch):
    """The reader's per-batch order check is skipped when classify reads (its engine groups
    and checks every row anyway), and a violation is still named at its file row."""
    from gpuaudit import schema

    calls = []
    real = schema.OrderCheck.check
    monkeypatch.setattr(schema.OrderCheck, "check",
                        lambda self, *a, **k: (calls.append(1), real(self, *a, **k))[1])
    path = write(_ramp_table(), tmp_path / "r.parquet", 100)
    src = open_samples(path)  # opening reads (and checks) the first batch
    opened = len(calls)
    usage = classify(src, workers=1)
    assert usage.series and len(calls) == opened <= 1  # none of the 9 row groups again
    assert src.checks_order  # left as it was given
    bad = write(_backwards(_ramp_table(), 500), tmp_path / "bad.parquet", 100)
    with pytest.raises(SampleTableError) as e:
        classify(open_samples(bad), workers=1)
    assert e.value.where is not None and "bad.parquet" in e.value.where and calls


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(recordings(), st.integers(1, 5), st.integers(0, 8), st.sampled_from([(), ("pod",)]))
def test_property_ranges_claimed_from_both_ends_equal_one_pass(monkeypatch, table,
                                                               rows_per_group, meet, by):
    """Two processes claim the ranges from both ends (classify.parallel.claim_ranges) and
    meet wherever their speeds put them: here the worker's side (run in this process) has
    taken the ranges from ``meet`` on, this process the ones before; the stitched engine
    is the one pass's, wherever they meet (none taken by either side included)."""

    class Done:
        def __init__(self, answer):
            self.answer = answer

        def poll(self):
            return 0

    def worker(recipes, by_, interval_s, cap, grid, onsets, claims=None, expected_rows=None):
        if claims is None:  # two row groups: one range each, no claims (no worker here)
            return None
        mine = [os.path.join(claims, str(k)) for k in range(min(meet, len(recipes)))]
        for p in mine:  # the ranges before `meet` are this process's: the worker stops there
            open(p, "x").close()
        answer = parallel._claim_from_the_end(recipes, claims, by_, interval_s, cap, grid,
                                              onsets, expected_rows)
        for p in mine:
            os.remove(p)
        return Done(pickle.loads(pickle.dumps(answer)))  # as it crosses the pipe

    from gpuaudit.classify import passes

    monkeypatch.setattr(passes, "CLAIM_RANGES", True)
    monkeypatch.setattr(parallel, "_start", worker)
    monkeypatch.setattr(parallel, "_collect", lambda proc: proc.answer)
    with tempfile.TemporaryDirectory() as tmp:
        path = write(table, Path(tmp) / "r.parquet", rows_per_group)
        whole = classify(open_samples(path, batch_rows=4), by=by, workers=1)
        claimed = classify(open_samples(path, batch_rows=4), by=by, workers=2)
    assert_same_usage(whole, claimed)
    assert whole.onset_lags == claimed.onset_lags


def test_two_processes_claim_the_ranges_and_give_the_same_usage(tmp_path, monkeypatch):
    """A real worker process claiming ranges from the end (nine row groups: eight ranges)."""
    from gpuaudit.classify import passes

    monkeypatch.setattr(passes, "CLAIM_RANGES", True)
    path = write(_ramp_table(), tmp_path / "r.parquet", 100)
    recipes = open_samples(path).split(2, pieces=parallel.RANGES_PER_PROCESS)
    assert recipes is not None and len(recipes) == 8
    whole = classify(open_samples(path), workers=1)
    assert_same_usage(whole, classify(open_samples(path), workers=2))


def test_arrow_allocates_from_the_tuned_malloc_unless_told_otherwise():
    """Where classify reads a large file and glibc is tuned, Arrow's default pool is the
    system allocator (its mimalloc pages are faulted in afresh per batch); a pool the user
    names, or GPUAUDIT_NO_MALLOPT, leaves Arrow alone, and so does the tuning alone."""
    import platform

    if not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"):
        pytest.skip("glibc only")
    code = ("import pyarrow as pa; from gpuaudit._heap import arrow_on_heap as a, "
            "keep_freed_memory as k; k(); before = pa.default_memory_pool().backend_name; "
            "print(before, a(), pa.default_memory_pool().backend_name)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPUAUDIT_NO_MALLOPT", "ARROW_DEFAULT_MEMORY_POOL")}

    def run(**extra: str) -> list[str]:
        return subprocess.run([sys.executable, "-c", code], env={**env, **extra},
                              capture_output=True, text=True, check=True).stdout.split()

    default = run(GPUAUDIT_NO_MALLOPT="1")
    assert default[1:] == ["False", default[0]] and default[0] != "system"
    assert run() == [default[0], "True", "system"]
    if "mimalloc" in pa.supported_memory_backends():
        assert run(ARROW_DEFAULT_MEMORY_POOL="mimalloc") == ["mimalloc", "False", "mimalloc"]
    # before pyarrow is imported (gpuaudit report's first step): through Arrow's variable,
    # which Arrow's own C++ allocations and the worker processes started after it follow
    first = ("import os; from gpuaudit._heap import arrow_on_heap as a; ok = a(); "
             "import pyarrow as pa; print(ok, pa.default_memory_pool().backend_name, "
             "os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))")
    out = subprocess.run([sys.executable, "-c", first], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["True", "system", "system"]
    out = subprocess.run([sys.executable, "-c", first], env={**env, "GPUAUDIT_NO_MALLOPT": "1"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", default[0], "None"]


def test_a_large_classify_decodes_onto_the_system_pool(tmp_path):
    """The whole path: classify of a file past the size where the allocator is tuned leaves
    Arrow on the system pool (a worker's range, parallel.run_range, sets its own so)."""
    code = ("import sys, pyarrow as pa; from gpuaudit.classify import passes; "
            "passes._LARGE_ROWS = 1; from gpuaudit.classify import classify; "
            "from gpuaudit.measure.files import open_samples; "
            "classify(open_samples(sys.argv[1])); print(pa.default_memory_pool().backend_name)")
    table = series_table({f"GPU-{g}": [float(g * 10)] * 50 for g in range(3)})
    path = tmp_path / "r.parquet"
    write_recording(recording(table), path, row_group_rows=30)
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPUAUDIT_NO_MALLOPT", "ARROW_DEFAULT_MEMORY_POOL")}
    import platform

    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    out = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == (["system"] if glibc else out)


def test_a_worker_answers_through_a_wide_pipe():
    """A range's engine (~30 MB at 100M rows) comes back through a pipe widened from the
    default 64 KiB (Linux, where /proc/sys/fs/pipe-max-size allows it)."""
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_GETPIPE_SZ"):
        pytest.skip("no F_GETPIPE_SZ here")
    from gpuaudit import _workers

    proc = _workers.spawn("import sys; sys.stdin.read()")
    assert proc is not None and proc.stdout is not None and proc.stdin is not None
    try:
        limit = int(Path("/proc/sys/fs/pipe-max-size").read_text())
        size = fcntl.fcntl(proc.stdout.fileno(), fcntl.F_GETPIPE_SZ)
        assert size >= min(_workers.PIPE_BYTES, limit)
    finally:
        proc.stdin.close()
        proc.wait()
        proc.stdout.close()


def test_a_worker_ends_with_its_heap_frozen(tmp_path):
    """The worker's exit (which the command waits for: it reads the answer to its end) does
    not walk the heap: everything is frozen once the answer is written (_heap.spare_the_exit)."""
    path = write(_ramp_table(), tmp_path / "r.parquet", 100)
    recipe = open_samples(path).split(2)[1]
    task = pickle.dumps((recipe, (), 1.0, 3.0, None, False, None, None))
    code = ("import gc, sys; from gpuaudit.classify.parallel import _main; "
            "before = gc.get_freeze_count(); rc = _main(); "
            "print(before, gc.get_freeze_count() > 1000, rc, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], input=task, capture_output=True,
                         check=True)
    kind, engine = pickle.loads(out.stdout)
    assert kind == "ok" and engine.rows_fed > 0
    assert out.stderr.decode().split() == ["0", "True", "0"]
