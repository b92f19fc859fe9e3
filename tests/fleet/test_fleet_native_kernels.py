"""The compiled loops of ``--fetch native`` held to plain references (no store needed): the
VictoriaMetrics export scan equals pyarrow's JSON reader bit for bit, the step grid equals
the NumPy formulation it replaced, and the dense join's rows and values equal a
dictionary-built join."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.errors import SourceUnavailableError
from gpuaudit.measure.fleet.native import (
    RawSeries,
    _dense_join,
    _read_export_json,
    _scan_export,
    on_grid,
)

_LABEL_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
_FLOAT = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-10**6, 10**6).map(float),
    st.sampled_from([0.0, -0.0, 72.5, 1e6, 1.5e-7, 9007199254740993.0, 1e23, 5e-324]),
)
#: how a value is written: as Python writes it, in Go's 'g' style, with trailing zeros
_STYLE = st.sampled_from(["repr", "g", "pad"])


def _write(x: float, style: str) -> str:
    if style == "g":
        return f"{x:.17g}"
    if style == "pad" and x.is_integer() and abs(x) < 1e15:
        return f"{x:.2f}"
    return repr(x)


def _line(labels: dict[str, str], values: list[str], stamps: list[int]) -> bytes:
    metric = json.dumps(labels, separators=(",", ":"))
    return (f'{{"metric":{metric},"values":[{",".join(values)}],'
            f'"timestamps":[{",".join(map(str, stamps))}]}}\n').encode()


@st.composite
def _answers(draw: st.DrawFn) -> bytes:
    out = b""
    for _ in range(draw(st.integers(1, 4))):
        labels = {"__name__": "DCGM_FI_DEV_GPU_UTIL",
                  **draw(st.dictionaries(_LABEL_TEXT, _LABEL_TEXT, max_size=3))}
        # (None: a stale marker, which VictoriaMetrics writes as null)
        xs = draw(st.lists(st.one_of(_FLOAT, st.none()), max_size=6))
        style = draw(_STYLE)
        stamps = draw(st.lists(st.integers(-10**15, 10**15), min_size=len(xs),
                               max_size=len(xs)))
        out += _line(labels, ["null" if x is None else _write(x, style) for x in xs], stamps)
    return out


def _same(a: list[RawSeries], b: list[RawSeries]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.labels == y.labels
        assert x.ts_ms.dtype == y.ts_ms.dtype and np.array_equal(x.ts_ms, y.ts_ms)
        assert x.values.dtype == y.values.dtype
        assert np.array_equal(x.values.view(np.int64), y.values.view(np.int64))


@settings(max_examples=200, deadline=None)
@given(_answers())
def test_export_scan_equals_the_json_reader(content: bytes) -> None:
    got = _scan_export(content, "test")
    assert got is not None  # VictoriaMetrics' shape: the compiled scan reads it
    _same(got, _read_export_json(content, "test"))


def test_export_scan_reads_the_words_victoriametrics_writes() -> None:
    """A stale marker (null; NaN as a line's first value) is left out, with its time, as
    the native export and remote read leave it out; the infinities, which VictoriaMetrics
    writes as +Inf and -Inf (not JSON), are read."""
    content = _line({"__name__": "x"}, ["NaN", "+Inf", "null", "-Inf", "2.5", "null"],
                    [1, 2, 3, 4, 5, 6]) + _line({"__name__": "y"}, ["null"], [7]) \
        + _line({"__name__": "z"}, ["Inf", "1"], [8, 9])
    got = _scan_export(content, "test")
    assert got is not None
    # (y: stale markers only, so no series, as the native export has it)
    assert [s.labels["__name__"] for s in got] == ["x", "z"]
    assert got[0].values.tolist() == [np.inf, -np.inf, 2.5]
    assert got[0].ts_ms.tolist() == [2, 4, 5]
    assert got[1].values.tolist() == [np.inf, 1.0] and got[1].ts_ms.tolist() == [8, 9]


def test_export_scan_leaves_another_shape_to_the_json_reader() -> None:
    content = (b'{"values": [1.5, 2], "metric": {"__name__": "x", "UUID": "u"}, '
               b'"timestamps": [1000, 2000]}\n')
    assert _scan_export(content, "test") is None
    got = _read_export_json(content, "test")
    assert got[0].labels == {"__name__": "x", "UUID": "u"}
    assert got[0].values.tolist() == [1.5, 2.0] and got[0].ts_ms.tolist() == [1000, 2000]


def test_export_values_and_timestamps_differing_in_number_is_an_error() -> None:
    content = _line({"__name__": "x"}, ["1", "2"], [1000])
    with pytest.raises(SourceUnavailableError, match="differ in number"):
        _scan_export(content, "http://vm:8428/api/v1/export")
    with pytest.raises(SourceUnavailableError, match="differ in number"):
        _read_export_json(content, "http://vm:8428/api/v1/export")


def _on_grid_numpy(series: list[RawSeries], start_ms: int, step_ms: int, n_steps: int,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """on_grid as it was written in NumPy (the specification the compiled loop keeps)."""
    lens = np.array([s.ts_ms.shape[0] for s in series], dtype=np.int64)
    sid = np.repeat(np.arange(len(series), dtype=np.int64), lens)
    ts = np.concatenate([s.ts_ms for s in series]).astype(np.int64, copy=False)
    val = np.concatenate([s.values for s in series]).astype(np.float64, copy=False)
    if ts.shape[0] > 1:
        back = (np.diff(ts) <= 0) & (sid[1:] == sid[:-1])
        if back.any():
            order = np.lexsort((ts, sid))
            sid, ts, val = sid[order], ts[order], val[order]
    k = -((start_ms - ts) // step_ms)
    inside = (k >= 0) & (k < n_steps)
    sid, k, val = sid[inside], k[inside], val[inside]
    last = np.ones(k.shape[0], dtype=bool)
    if k.shape[0] > 1:
        last[:-1] = (k[1:] != k[:-1]) | (sid[1:] != sid[:-1])
    return sid[last], k[last], val[last]


@st.composite
def _series(draw: st.DrawFn) -> RawSeries:
    ts = draw(st.lists(st.integers(-20_000, 200_000), max_size=30))
    if draw(st.booleans()):
        ts = sorted(ts)
    vals = draw(st.lists(st.floats(allow_nan=False), min_size=len(ts), max_size=len(ts)))
    return RawSeries({}, np.array(ts, dtype=np.int64), np.array(vals, dtype=np.float64))


@settings(max_examples=300, deadline=None)
@given(st.lists(_series(), min_size=1, max_size=5), st.integers(-5_000, 5_000),
       st.sampled_from([1, 1000, 15_000]), st.integers(1, 20))
def test_on_grid_equals_the_numpy_formulation(series: list[RawSeries], start_ms: int,
                                              step_ms: int, n_steps: int) -> None:
    got = on_grid(series, start_ms, step_ms, n_steps)
    want = _on_grid_numpy(series, start_ms, step_ms, n_steps)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(0, 5),
                          st.floats(0, 100, width=32)), min_size=1, max_size=40))
def test_dense_join_equals_a_dictionary_join(points: list[tuple[int, int, int, float]],
                                             ) -> None:
    from gpuaudit.measure.fleet.dcgm import series_id

    metrics = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE",
               "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    ids = [series_id({"UUID": f"GPU-{i}", "Hostname": "h"}, default_host="h", where="t")
           for i in range(5)]
    code = np.array([p[0] for p in points], dtype=np.int64)
    metric = np.array([p[1] for p in points], dtype=np.int64)
    k = np.array([p[2] for p in points], dtype=np.int64)
    val = np.array([p[3] for p in points])
    table, _notes = _dense_join(ids, code, metric, k, val, metrics, 0, 15_000_000_000, 6,
                                where="t")
    cells: dict[tuple[int, int], dict[int, float]] = {}
    for c, m, kk, v in points:
        cells.setdefault((c, kk), {})[m] = v  # a later point of a cell wins
    want = sorted((c, kk, got) for (c, kk), got in cells.items() if 0 in got or 2 in got)
    assert table.num_rows == len(want)
    rows = sorted(zip([int(u.split("-")[1]) for u in table.column("gpu_uuid").to_pylist()],
                      [t // 15_000_000_000 for t in
                       table.column("ts").cast("int64").to_pylist()],
                      table.column("util_gpu_pct").to_pylist(),
                      table.column("power_w").to_pylist()
                      if "power_w" in table.column_names else [None] * table.num_rows))
    for (c, kk, util, power), (wc, wk, got) in zip(rows, want):
        assert (c, kk) == (wc, wk)
        assert util == got.get(0) or (util is None and got.get(0) is None)
        assert power == got.get(1) or (power is None and got.get(1) is None)


@st.composite
def _near_grid(draw: st.DrawFn, start_ms: int, step_ms: int, n_steps: int) -> RawSeries:
    """A series whose times sit on, just before and just after the grid's steps and its
    edges (a step before the first, one past the last)."""
    ts = [start_ms + j * step_ms + d for j, d in draw(st.lists(st.tuples(
        st.integers(-2, n_steps + 1), st.sampled_from([-step_ms, -1, 0, 1])), max_size=12))]
    if draw(st.booleans()):
        ts = sorted(ts)
    vals = draw(st.lists(st.floats(allow_nan=False), min_size=len(ts), max_size=len(ts)))
    return RawSeries({}, np.array(ts, dtype=np.int64), np.array(vals, dtype=np.float64))


@settings(max_examples=400, deadline=None)
@given(st.data(), st.integers(-5_000, 5_000), st.sampled_from([1, 1000, 15_000]),
       st.integers(1, 20))
def test_grid_cells_equals_the_grid_then_the_dense_join(
        data: st.DataObject, start_ms: int, step_ms: int, n_steps: int) -> None:
    """The one-pass kernel gives what on_grid's points joined by dense_rows give: the codes
    with a point, the rows, every metric's values and which metrics have a point; or
    says the times descend (then the caller takes that two-step path)."""
    from gpuaudit.measure.fleet import _xor
    from gpuaudit.measure.fleet.native import _joined, _spans

    picks = data.draw(st.lists(st.tuples(
        st.one_of(_series(), _near_grid(start_ms, step_ms, n_steps)), st.integers(0, 3),
        st.integers(0, 2)), min_size=1, max_size=6))
    series = [s for s, _c, _m in picks]
    code_of = np.array([c for _s, c, _m in picks], dtype=np.int64)
    metric_of = np.array([m for _s, _c, m in picks], dtype=np.int64)
    is_util = np.array([True, False, True])
    ts, val, bounds = _joined(series)
    ok, present, rows, grid, has = _xor.grid_cells(ts, val, bounds[:-1], bounds[1:], code_of,
                                                   metric_of, 4, start_ms, step_ms, n_steps,
                                                   is_util)
    descends = any((np.diff(s.ts_ms) < 0).any() for s in series)
    assert ok == (not descends)
    # the same series as views of one decoded answer, laid out in another order with
    # samples of no series between them (_spans: no copy end to end): the same cells
    perm = data.draw(st.permutations(range(len(series))))
    parts_t, parts_v, at = [], [], {}
    n_at = 0
    for j in perm:
        parts_t += [np.array([-7], np.int64), series[j].ts_ms]
        parts_v += [np.array([99.0]), series[j].values]
        at[j] = n_at + 1
        n_at += 1 + series[j].ts_ms.shape[0]
    big_t, big_v = np.concatenate(parts_t), np.concatenate(parts_v)
    views = [RawSeries({}, big_t[at[j]:at[j] + s.ts_ms.shape[0]],
                       big_v[at[j]:at[j] + s.ts_ms.shape[0]]) for j, s in enumerate(series)]
    spans = _spans(views)
    assert spans is not None and spans[0] is not None
    again = _xor.grid_cells(*spans, code_of, metric_of, 4, start_ms, step_ms, n_steps, is_util)
    assert again[0] == ok
    for x, y in zip(again[1:], (present, rows, grid, has)):
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8))
    assert _spans([*views, series[0]]) is None  # (a series from elsewhere: joined instead)
    if not ok:
        return
    sidx, k, v = on_grid(series, start_ms, step_ms, n_steps)
    code = code_of[sidx]
    seen = np.bincount(code, minlength=4) > 0
    local = (np.cumsum(seen) - 1)[code]
    want_rows, want_grid, want_has = _xor.dense_rows(local, k, metric_of[sidx], v, n_steps,
                                                     int(seen.sum()), is_util)
    assert np.array_equal(present, np.flatnonzero(seen))
    assert np.array_equal(rows, want_rows)
    assert np.array_equal(has, want_has)
    assert grid.shape == want_grid.shape
    assert np.array_equal(grid.view(np.uint64), want_grid.view(np.uint64))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), st.integers(0, 4)),
                max_size=40), st.booleans())
def test_row_order_is_the_lexsort(rows: list[tuple[int, int, int]], by_code: bool) -> None:
    """series_table's row order equals np.lexsort((codes, ts, g)) (None: the rows are in
    it already), for rows in any order and for rows in (code, time) order as the native
    join gives them (there a stable sort by one key stands in for the lexsort)."""
    from gpuaudit.measure.fleet.dcgm import _row_order

    if by_code:
        rows = sorted(rows, key=lambda r: (r[2], r[1]))
    g = np.array([r[0] for r in rows], dtype=np.int64)
    ts = np.array([r[1] for r in rows], dtype=np.int64) * 15_000_000_000 + 1_700_000_000
    codes = np.array([r[2] for r in rows], dtype=np.int64)
    got = _row_order(g, ts, codes)
    want = np.lexsort((codes, ts, g))
    if got is None:
        assert np.array_equal(want, np.arange(len(rows)))
    else:
        assert np.array_equal(got, want)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5),
                          st.one_of(st.none(), st.floats(0, 100, width=32))),
                min_size=1, max_size=30), st.booleans())
def test_lean_table_holds_the_sample_table_rows(
        points: list[tuple[int, int, float | None]], by_code: bool) -> None:
    """series_table's lean layout (built by lean_table) holds the rows of its plain
    sample table: the same order, every identity column's text, every value; columns no
    row has a value in are of type null; the series' label keys in the metadata."""
    import pyarrow as pa

    from gpuaudit.measure.fleet.dcgm import LEAN_IDENTITY, series_id, series_table
    from gpuaudit.schema import LEAN_LABEL_KEYS

    ids = [series_id({"UUID": f"GPU-{i % 2}", "Hostname": "h", "gpu": str(i % 2),
                      "exported_pod": f"p{i}", "exported_namespace": "ns", "team": f"t{i}"},
                     default_host="h", where="t") for i in range(4)]
    if by_code:
        points = sorted(points, key=lambda p: (p[0], p[1]))
    codes = np.array([p[0] for p in points], dtype=np.int64)
    ts = np.array([p[1] for p in points], dtype=np.int64) * 15_000_000_000
    util = np.array([np.nan if p[2] is None else p[2] for p in points])
    maps = [dict(s.labels) for s in ids]
    plain, notes = series_table(ids, codes, ts, {"DCGM_FI_DEV_GPU_UTIL": util}, where="t")
    lean, lean_notes = series_table(ids, codes, ts, {"DCGM_FI_DEV_GPU_UTIL": util},
                                    where="t", lean=(maps, ["team"]))
    assert [str(n) for n in notes] == [str(n) for n in lean_notes]
    assert lean.num_rows == plain.num_rows
    for name in lean.column_names:
        col = lean.column(name)
        if name in plain.column_names and name not in LEAN_IDENTITY and name != "ts" and \
                plain.column(name).null_count == plain.num_rows:
            assert col.type == pa.null(), name  # (no buffers for a column of nothing)
        if name.startswith("label:"):
            want = [dict(m).get("team") for m in plain.column("labels").to_pylist()]
            assert col.to_pylist() == want
        elif name == "labels":
            assert col.type == pa.null()
        elif col.type == pa.null():
            assert plain.column(name).null_count == plain.num_rows
        else:
            assert col.to_pylist() == plain.column(name).to_pylist(), name
    keys = lean.schema.metadata[LEAN_LABEL_KEYS].decode().split("\x1f")
    assert keys == sorted({k for c in set(codes.tolist()) for k in maps[c]})
