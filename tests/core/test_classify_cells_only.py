"""``classify_cells``: the cells of :func:`classify` (same rows, order and sums, to the bit)
without the rest, for the fleet audit's per-day cells and 1 h / 24 h windows; and a lean
batch's ``label:<key>`` column read as the label map's value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit import schema
from gpuaudit.classify import classify
from gpuaudit.classify.passes import classify_cells
from gpuaudit.series import LEAN_LABEL_KEYS

NS = 1_000_000_000


def _table(rows: list[tuple[int, int, float | None, float | None, int, int]]) -> pa.Table:
    """(gpu, step, util, power, pod, team) rows: GPUs in time order, steps with gaps."""
    rows = sorted(rows, key=lambda r: (r[0], r[1]))
    seen: set[tuple[int, int]] = set()
    rows = [r for r in rows if (r[0], r[1]) not in seen and not seen.add((r[0], r[1]))]
    return schema.build_table({
        "ts": pa.array([(1_700_000_000 + 15 * r[1]) * NS for r in rows]).cast(schema.TS_TYPE),
        "host": [f"h{r[0] // 2}" for r in rows], "gpu_uuid": [f"GPU-{r[0]}" for r in rows],
        "util_gpu_pct": [r[2] for r in rows], "power_w": [r[3] for r in rows],
        "pod": [None if r[4] == 0 else f"p{r[4]}" for r in rows],
        "namespace": [None if r[4] == 0 else "ns" for r in rows],
        "labels": [[("team", f"t{r[5]}")] if r[5] else [] for r in rows]})


_ROW = st.tuples(st.integers(0, 3), st.integers(0, 60),
                 st.one_of(st.none(), st.floats(0, 100)),
                 st.one_of(st.none(), st.floats(50, 300)), st.integers(0, 2), st.integers(0, 2))


@settings(max_examples=60, deadline=None)
@given(st.lists(_ROW, min_size=1, max_size=80), st.sampled_from([1.0, 3.0]))
def test_property_classify_cells_are_classifys_cells(rows, cap) -> None:
    table = _table(rows)
    by = ("team", "namespace", "pod")
    want = classify(table, by=by, interval_s=15.0, cap_intervals=cap).cells
    got = classify_cells(table, by=by, interval_s=15.0, cap_intervals=cap)
    assert got.equals(want)


@settings(max_examples=40, deadline=None)
@given(st.lists(_ROW, min_size=1, max_size=80))
def test_property_a_lean_label_column_groups_as_the_label_map(rows) -> None:
    """The same rows with ``labels`` null and the team as a ``label:team`` dictionary column
    (the native fleet fetch's lean batches) give the same cells and label keys."""
    table = _table(rows)
    team = pa.compute.map_lookup(table.column("labels"), "team", "first").combine_chunks()
    lean = table.set_column(table.schema.get_field_index("labels"), "labels",
                            pa.nulls(table.num_rows, table.schema.field("labels").type))
    lean = lean.append_column("label:team", pa.compute.dictionary_encode(team))
    lean = lean.replace_schema_metadata({LEAN_LABEL_KEYS: b"team"})
    want = classify(table, by=("team", "pod"), interval_s=15.0, cap_intervals=1.0)
    got = classify(lean, by=("team", "pod"), interval_s=15.0, cap_intervals=1.0)
    assert got.cells.equals(want.cells)
    notes = [n.reason for n in classify(lean, by=("nosuch",), interval_s=15.0).notes
             if n.where == "--by"]
    if any(r[5] for r in rows):
        assert notes and "the labels present are: team" in notes[0]
    assert np.isfinite(got.overall().total_s)
