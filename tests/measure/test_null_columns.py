"""All-null columns over one zeroed buffer (measure.files.nulls): equal to Arrow's own
``pa.nulls`` for every column type of the sample table, and no memory of their own."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit import schema
from gpuaudit.measure.files import nulls as nulls_module
from gpuaudit.measure.files import open_samples
from gpuaudit.measure.files.nulls import nulls

_TYPES = [f.type for f in schema.SAMPLE_SCHEMA]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_TYPES), st.integers(0, 5_000)), min_size=1,
                max_size=8))
def test_property_nulls_equal_arrows_own_whatever_the_order_of_lengths(asks):
    # (each type's array is built at the longest length asked so far and sliced: a shorter
    # ask after a longer one, and a longer one after, both stay equal)
    for typ, n in asks:
        got = nulls(typ, n)
        got.validate(full=True)
        want = pa.nulls(n, typ)
        assert got.type == want.type and len(got) == n and got.null_count == n
        assert got.equals(want)
        assert got.to_pylist() == [None] * n


def test_the_sample_tables_nulls_share_one_buffer_and_allocate_nothing_from_arrow():
    n = 300_000 + int(np.random.default_rng().integers(1, 1000))  # longer than any before
    before = pa.total_allocated_bytes()
    made = [nulls(typ, n) for typ in _TYPES]
    # Arrow's own nulls would allocate ~2.5 MB for each of these 34 columns
    assert pa.total_allocated_bytes() - before < n
    zeros = nulls_module._zeros
    assert zeros is not None and not zeros.is_mutable
    for arr in made:
        assert arr.null_count == n
        first = next(b for b in arr.buffers() if b is not None and b.size)
        assert first.address == zeros.address  # the same zeros under every column


def test_a_lean_read_fills_the_unread_columns_with_nulls_of_the_schemas_types(tmp_path):
    # a recording with three columns of data: the others come back null, typed as the table
    n = 5_000
    table = schema.build_table({
        "ts": pa.array((np.arange(n) + 1_700_000_000) * 1_000_000_000).cast(schema.TS_TYPE),
        "host": ["h"] * n, "gpu_uuid": [f"GPU-{i % 7}" for i in range(n)],
        "util_gpu_pct": np.linspace(0, 100, n).astype(np.float32)})
    path = tmp_path / "rec.parquet"
    pq.write_table(table, path)
    batches = list(open_samples(path).batches())
    got = pa.Table.from_batches(batches)
    assert got.num_rows == n
    for field in schema.SAMPLE_SCHEMA:
        col = got.column(field.name)
        if field.name in ("ts", "host", "gpu_uuid", "util_gpu_pct"):
            assert col.null_count == 0, field.name
        else:
            assert col.null_count == n, field.name
            assert col.type == got.schema.field(field.name).type
            assert col.combine_chunks().equals(pa.nulls(n, col.type)), field.name
