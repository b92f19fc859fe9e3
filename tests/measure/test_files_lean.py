"""A lean read (``FileSource.batches(lean=True)``, what classify's engine reads) decodes
neither the labels nor each row's host, model and MIG profile, yet gives every GPU its first
row's identity; the footer's statistics spare range checks they prove, and only those."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit import schema
from gpuaudit.classify import classify
from gpuaudit.errors import SampleTableError
from gpuaudit.measure.files import open_samples, write_recording
from gpuaudit.measure.files.reader import _proven_in_range
from gpuaudit.schema import Recording, build_table

NS = 1_000_000_000
IDENTITY = ("host", "gpu_model", "mig_profile")


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    """GPUs that appear at different ticks, whose host, model and MIG profile change from
    row to row (so a first row's identity differs from a later one's), with labels."""
    n_gpu = draw(st.integers(1, 5))
    n_t = draw(st.integers(1, 12))
    starts = [draw(st.integers(0, n_t - 1)) for _ in range(n_gpu)]
    cols: dict[str, list[object]] = {k: [] for k in ("ts", "host", "gpu_uuid", "gpu_model",
                                                      "mig_profile", "util_gpu_pct",
                                                      "labels")}
    for k in range(n_t):
        for g in range(n_gpu):
            if k < starts[g]:
                continue
            cols["ts"].append((1_700_000_000 + k) * NS)
            cols["host"].append(draw(st.sampled_from(["h1", "h2"])))
            cols["gpu_uuid"].append(f"GPU-{g}")
            cols["gpu_model"].append(draw(st.sampled_from([None, "NVIDIA A100", "NVIDIA L4"])))
            cols["mig_profile"].append(draw(st.sampled_from([None, "1g.10gb"])))
            cols["util_gpu_pct"].append(draw(st.sampled_from([None, 0.0, 55.0, 100.0])))
            cols["labels"].append([("team", draw(st.sampled_from(["a", "b"])))])
    cols["ts"] = pa.array(np.array(cols["ts"], dtype=np.int64)).cast(schema.TS_TYPE)
    return build_table(cols)


def _batches(path: Path, batch_rows: int, lean: bool, gpu_model: str | None = None
             ) -> pa.Table:
    src = open_samples(path, batch_rows=batch_rows, gpu_model=gpu_model)
    return pa.Table.from_batches(list(src.batches(lean=lean)), schema=schema.SAMPLE_SCHEMA)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), st.integers(1, 7), st.integers(1, 9), st.sampled_from([None, "H200"]))
def test_property_a_lean_read_gives_each_gpu_its_first_rows_identity(table, rows_per_group,
                                                                     batch_rows, gpu_model):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.parquet"
        write_recording(Recording(table=table, source="t", origin="t", interval_s=1.0), path,
                        row_group_rows=rows_per_group)
        full = _batches(path, batch_rows, lean=False, gpu_model=gpu_model)
        lean = _batches(path, batch_rows, lean=True, gpu_model=gpu_model)
        # classify reads the file lean: the same identities as from the full table
        read = classify(open_samples(path, batch_rows=batch_rows, gpu_model=gpu_model),
                        workers=1)
    assert lean.num_rows == full.num_rows
    for name in schema.SAMPLE_SCHEMA.names:
        if name not in (*IDENTITY, "labels"):
            assert lean.column(name).equals(full.column(name)), name
    assert lean.column("labels").null_count == lean.num_rows  # never decoded
    uuids = full.column("gpu_uuid").to_pylist()
    first = {u: uuids.index(u) for u in set(uuids)}
    for name in IDENTITY:
        got, want = lean.column(name).to_pylist(), full.column(name).to_pylist()
        for row in first.values():
            assert got[row] == want[row], (name, row)
    assert [(s.gpu_uuid, s.host, s.gpu_model, s.mig_profile) for s in
            classify(Recording(table=full, source="t", origin="t", interval_s=1.0)).series] \
        == [(s.gpu_uuid, s.host, s.gpu_model, s.mig_profile) for s in read.series]


def test_a_lean_batch_without_a_new_gpu_carries_no_identity(tmp_path):
    """The point of the lean read: past each GPU's first row, host, model and labels are not
    decoded (null), and the engine does not need them."""
    util = [float(i % 100) for i in range(40)]
    table = build_table({
        "ts": pa.array(np.repeat(np.arange(20) + 1_700_000_000, 2) * NS).cast(schema.TS_TYPE),
        "host": ["h1", "h2"] * 20, "gpu_uuid": ["GPU-a", "GPU-b"] * 20,
        "gpu_model": ["NVIDIA L4"] * 40, "util_gpu_pct": util,
        "labels": [[("team", "x")]] * 40})
    path = tmp_path / "r.parquet"
    write_recording(Recording(table=table, source="t", origin="t", interval_s=1.0), path,
                    row_group_rows=8)
    batches = list(open_samples(path, batch_rows=4).batches(lean=True))
    # given up to the last new GPU's first row, no further
    assert batches[0].column("host").to_pylist() == ["h1", "h2", None, None]
    for b in batches[1:]:
        assert b.column("host").null_count == b.num_rows
        assert b.column("gpu_model").null_count == b.num_rows
    assert all(b.column("labels").null_count == b.num_rows for b in batches)
    usage = classify(open_samples(path, batch_rows=4), workers=1)
    assert [(s.host, s.gpu_model) for s in usage.series] == [("h1", "NVIDIA L4"),
                                                              ("h2", "NVIDIA L4")]


def test_the_footer_proves_only_the_ranges_it_holds(tmp_path):
    table = build_table({
        "ts": pa.array((np.arange(6) + 1_700_000_000) * NS).cast(schema.TS_TYPE),
        "host": ["h"] * 6, "gpu_uuid": ["GPU-a"] * 6,
        "util_gpu_pct": [0.0, 50.0, None, 100.0, 3.0, 4.0],
        "temp_c": [40.0, 41.0, 42.0, 43.0, 44.0, 45.0]})
    path = tmp_path / "r.parquet"
    write_recording(Recording(table=table, source="t", origin="t", interval_s=1.0), path,
                    row_group_rows=3)
    footer = pq.ParquetFile(path).metadata
    proven = _proven_in_range(footer, range(footer.num_row_groups))
    assert {"util_gpu_pct", "temp_c"} <= proven
    assert "power_w" not in proven  # no values: no statistics to prove anything


def test_a_value_out_of_range_is_still_named_on_a_lean_read(tmp_path):
    """A file whose statistics do not prove the range is checked row by row, lean or not:
    the error names the file row."""
    table = build_table({
        "ts": pa.array((np.arange(6) + 1_700_000_000) * NS).cast(schema.TS_TYPE),
        "host": ["h"] * 6, "gpu_uuid": ["GPU-a"] * 6,
        "util_gpu_pct": [0.0, 50.0, 7.0, 100.0, 3.0, 4.0]})
    bad = table.set_column(table.schema.get_field_index("util_gpu_pct"), "util_gpu_pct",
                           pa.array([0.0, 50.0, 7.0, 100.0, 130.0, 4.0], pa.float32()))
    path = tmp_path / "r.parquet"
    write_recording(Recording(table=table, source="t", origin="t", interval_s=1.0), path)
    meta = pq.ParquetFile(path).schema_arrow.metadata
    pq.write_table(bad.replace_schema_metadata(meta), path, row_group_size=3)
    footer = pq.ParquetFile(path).metadata
    assert "util_gpu_pct" not in _proven_in_range(footer, range(footer.num_row_groups))
    for lean in (False, True):
        with pytest.raises(SampleTableError) as err:
            list(open_samples(path, batch_rows=2).batches(lean=lean))
        assert err.value.column == "util_gpu_pct" and "row 5:" in str(err.value)


def test_a_range_of_an_opened_file_reads_nothing_until_asked(tmp_path, monkeypatch):
    """FileSource.split's ranges take the whole file's footer facts (columns with data, the
    ranges it proves) rather than working them out again, and read no batch at open: each
    of a report's eight ranges did both."""
    from gpuaudit.measure.files import reader

    table = build_table({
        "ts": pa.array(np.repeat(np.arange(30) + 1_700_000_000, 2) * NS).cast(schema.TS_TYPE),
        "host": ["h"] * 60, "gpu_uuid": ["GPU-a", "GPU-b"] * 30,
        "util_gpu_pct": [float(i % 100) for i in range(60)]})
    path = tmp_path / "r.parquet"
    write_recording(Recording(table=table, source="t", origin="t", interval_s=1.0), path,
                    row_group_rows=10)
    whole = open_samples(path)
    recipes = whole.split(3)
    assert recipes is not None and len(recipes) == 3
    streams = []
    real = reader.FileSource._stream

    def counted(self, *a, **k):
        streams.append(self)
        return real(self, *a, **k)

    def refused(*_a, **_k):
        raise AssertionError("worked out again")

    monkeypatch.setattr(reader.FileSource, "_stream", counted)
    monkeypatch.setattr(reader, "_columns_with_data", refused)
    monkeypatch.setattr(reader, "_proven_in_range", refused)
    parts = [r() for r in recipes]
    assert streams == []
    rows = [b for p in parts for b in p.batches(lean=True)]
    assert len(streams) == 3
    assert sum(b.num_rows for b in rows) == 60
    assert pa.Table.from_batches(rows).column("util_gpu_pct").equals(
        table.column("util_gpu_pct"))


def test_parquet_batches_are_larger_than_text_ones_and_keep_to_batch_rows(tmp_path,
                                                                          monkeypatch):
    """A Parquet file is decoded up to _PARQUET_CHUNK_ROWS rows at a time, lean (classify's
    read) or whole (per-batch costs, not cache sizes, decide there; the text formats'
    _CHUNK_ROWS does not apply), and never more than the caller's batch_rows."""
    from gpuaudit.measure.files import reader

    monkeypatch.setattr(reader, "_CHUNK_ROWS", 8)
    monkeypatch.setattr(reader, "_PARQUET_CHUNK_ROWS", 32)
    n = 100
    table = build_table({
        "ts": pa.array((np.arange(n) // 2 + 1_700_000_000) * NS).cast(schema.TS_TYPE),
        "host": ["h1"] * n, "gpu_uuid": ["GPU-a", "GPU-b"] * (n // 2),
        "util_gpu_pct": [float(i % 100) for i in range(n)]})
    path = tmp_path / "r.parquet"
    write_recording(Recording(table=table, source="t", origin="t", interval_s=1.0), path,
                    row_group_rows=64)
    for lean in (True, False):  # (a batch ends at a row group's end)
        assert [b.num_rows for b in open_samples(path).batches(lean=lean)] == [32, 32, 32, 4]
    assert max(b.num_rows for b in open_samples(path, batch_rows=5).batches(lean=True)) == 5
