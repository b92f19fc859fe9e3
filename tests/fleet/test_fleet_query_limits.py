"""A store's limit on what one query may hold, and the per-day figures whatever the chunk.

Prometheus refuses a query whose samples in memory pass ``--query.max-samples`` (50M by
default). The pushdown's subqueries hold series x steps of a chunk: a day at 15 s is 5,760
steps, so one Prometheus holding ~8,700 GPU series refused the default audit. The pushdown
now cuts its chunks smaller until the store answers (the same figures), and the cells per
chunk its callers asked for (``gpuaudit bill --prometheus``: hours) are summed back from the
smaller ones. Real Prometheus on 127.0.0.1, its limit lowered to the test fleet's size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from fleetgen import (
    Fleet,
    backfill,
    import_victoria_metrics,
    run_prometheus,
    run_victoria_metrics,
    team_report,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.api.fleet import _smaller_chunk, fleet_usage, regroup_cells
from gpuaudit.classify.usage import CELL_VALUE_COLUMNS


@pytest.fixture(scope="module")
def tsdb(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared fleet backfilled once; each test starts the Prometheus it needs on it."""
    data = tmp_path_factory.mktemp("limits") / "data"
    backfill(fleet, data)
    return data




def _too_large(report: dict) -> list:  # type: ignore[type-arg]
    return [n for n in report["source"]["notes"] if "too large" in n["reason"]]


def test_a_store_refusing_day_chunks_as_too_large_is_asked_in_smaller_ones(
        tsdb: Path, fleet: Fleet) -> None:
    with run_prometheus(tsdb) as url:
        want = team_report(url, fleet)
    # 12 GPU series x 5,760 steps of a day pass 40,000 samples; 6 h (1,440 steps) do not
    with run_prometheus(tsdb, extra_args=("--query.max-samples=40000",)) as url:
        got = team_report(url, fleet)
    notes = _too_large(got)
    assert len(notes) == 1, got["source"]["notes"]
    assert "would load too many samples" in notes[0]["reason"]
    assert "24.00 h chunks" in notes[0]["reason"] and "in 6.00 h chunks" in notes[0]["reason"]
    got["source"]["notes"].remove(notes[0])
    assert got == want
    assert not _too_large(want)


def test_the_hourly_cells_keep_their_hours_when_hour_chunks_are_refused(
        tsdb: Path, fleet: Fleet) -> None:
    """``bill --prometheus`` reads the fleet's cells per hour: a store that refuses hour
    chunks is asked in quarter hours, and the cells are those of the hours again."""
    # (3 h: the fleet's 1 h / 24 h utilization windows, one series' samples at a time in
    # Prometheus, reach back no further than the range: 720 samples, under the limit)
    kw = {"start_s": fleet.start_s, "end_s": fleet.start_s + 3 * 3600,
          "step_s": float(fleet.step_s), "by": ("team", "namespace", "pod"), "chunk_s": 3600.0}

    def cells(url: str) -> tuple[pa.Table, list[str]]:
        usage, hourly, _w, _t = fleet_usage(url, **kw)  # type: ignore[arg-type]
        assert hourly is not None
        keys = [c for c in hourly.column_names if c not in CELL_VALUE_COLUMNS]
        return (hourly.sort_by([(k, "ascending") for k in keys]),
                [n.reason for n in usage.notes if "too large" in n.reason])

    with run_prometheus(tsdb) as url:
        want, none = cells(url)
    # an hour's subqueries refused, a quarter hour's not (the 1 h window: 240 a series)
    with run_prometheus(tsdb, extra_args=("--query.max-samples=1000",)) as url:
        got, notes = cells(url)
    assert not none and len(notes) == 1 and "in 0.25 h chunks" in notes[0], notes
    starts = got.column("day_start").cast(pa.int64()).to_numpy()
    assert len(np.unique(starts)) == 3 and np.all((starts - starts.min()) % (3600 * 10**9) == 0)
    assert got.schema == want.schema and got.num_rows == want.num_rows > 20
    for name in got.column_names:  # (four quarters' seconds added: to the float's last bits)
        mine, theirs = got.column(name).to_pylist(), want.column(name).to_pylist()
        if name in CELL_VALUE_COLUMNS and name != "samples":
            assert mine == pytest.approx(theirs, rel=1e-12, abs=1e-9), name
        else:
            assert mine == theirs, name


def test_the_per_day_figures_are_days_whatever_the_chunk(tsdb: Path, fleet: Fleet) -> None:
    """``--chunk 6h``: the report's per-day table lists days (each the sum of its four
    chunks), not chunks, as ``--chunk 1d`` does; every figure is the same."""
    with run_prometheus(tsdb) as url:
        day = team_report(url, fleet)
        quarter = team_report(url, fleet, chunk_s=21600.0)
        raw_quarter = team_report(url, fleet, chunk_s=21600.0, fetch="raw")
        raw_day = team_report(url, fleet, fetch="raw")
    assert len(day["extra"]["fleet"]["kpis"]["days"]) == 2
    assert quarter == day
    assert raw_quarter["extra"]["fleet"]["kpis"] == raw_day["extra"]["fleet"]["kpis"]


def test_a_fixed_window_refused_as_too_large_is_a_clear_error_not_smaller_chunks(
        fleet: Fleet, tmp_path: Path) -> None:
    """VictoriaMetrics counts a query's samples over all its series
    (``-search.maxSamplesPerQuery``): the fleet's 24 h utilization window holds a day of
    every series whatever the chunk, so it is an error naming that window and the store's
    limit, not a search through ever smaller chunks."""
    from gpuaudit.errors import QueryTooLarge

    with run_victoria_metrics(tmp_path / "vm",
                              extra_args=("-search.maxSamplesPerQuery=40000",)) as vm:
        import_victoria_metrics(fleet, vm, tmp_path / "import")
        with pytest.raises(QueryTooLarge) as e:
            team_report(vm, fleet)
    assert not e.value.by_chunk
    assert "-search.maxSamplesPerQuery=40000" in e.value.what
    assert "the fleet's 24h utilization window" in e.value.what
    assert "-search.maxSamplesPerQuery" in (e.value.fix or "")


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 11), st.sampled_from(["a", "b", None]),
                               st.floats(0, 1e5), st.integers(0, 10**6)),
                     min_size=1, max_size=40, unique_by=lambda r: (r[0], r[1])),
       per=st.sampled_from([1, 2, 3, 4, 6, 24]), offset_s=st.integers(0, 86_399))
def test_property_regrouped_cells_are_the_sums_of_their_periods_chunks(
        rows: list[tuple[int, str | None, float, int]], per: int, offset_s: int) -> None:
    """Cells of chunks k (one hour each, from ``start``; one row per chunk and cell)
    regrouped into periods of ``per`` chunks: one row per (period, cell key), each the sum
    of its chunks' rows, in every value column (a null where every row is null); the schema
    unchanged."""
    start = 1_704_067_200 + offset_s
    n = len(rows)
    cols: dict[str, pa.Array] = {
        "day_start": pa.array([(start + k * 3600) * 10**9 for k, *_ in rows],
                              pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
        "gpu_uuid": pa.array(["GPU-1"] * n), "pod": pa.array([p for _, p, *_ in rows])}
    for name in CELL_VALUE_COLUMNS:
        if name == "samples":
            cols[name] = pa.array([s for *_, s in rows], pa.int64())
        elif name.startswith("sm_"):
            cols[name] = pa.nulls(n, pa.float64())
        else:
            cols[name] = pa.array([x for _, _, x, _ in rows], pa.float64())
    cells = pa.table(cols)
    got = regroup_cells(cells, float(start), per * 3600.0)
    assert got is not None and got.schema == cells.schema
    want: dict[tuple[int, str | None], tuple[float, int]] = {}
    for k, pod, x, s in rows:
        key = (start + k // per * per * 3600, pod)
        x0, s0 = want.get(key, (0.0, 0))
        want[key] = (x0 + x, s0 + s)
    have = {(int(t.timestamp()), pod): (x, s) for t, pod, x, s in zip(
        got.column("day_start").to_pylist(), got.column("pod").to_pylist(),
        got.column("idle_s").to_pylist(), got.column("samples").to_pylist())}
    assert have.keys() == want.keys() and got.num_rows == len(want)
    for key, (x, s) in want.items():
        assert have[key][1] == s and have[key][0] == pytest.approx(x, rel=1e-12, abs=1e-9)
    assert got.column("sm_busy_s").null_count == got.num_rows
    if per == 1:
        assert got is cells  # every chunk starts its period already


@pytest.mark.parametrize(("chunk", "step", "want"), [
    (86400.0, 15.0, 21600.0), (3600.0, 15.0, 900.0), (1350.0, 15.0, 675.0),
    (675.0, 15.0, None), (60.0, 15.0, 30.0), (30.0, 15.0, None), (240.0, 60.0, 120.0)])
def test_a_refused_chunk_is_cut_to_whole_steps_that_divide_it(chunk: float, step: float,
                                                             want: float | None) -> None:
    assert _smaller_chunk(chunk, step) == want


def test_regrouping_nothing_is_nothing() -> None:
    assert regroup_cells(None, 0.0, 86400.0) is None
    empty = pa.table({"day_start": pa.array([], pa.timestamp("ns", tz="UTC")),
                      "idle_s": pa.array([], pa.float64())})
    assert regroup_cells(empty, 0.0, 86400.0) is empty
