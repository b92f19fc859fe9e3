"""Series codes and cell ids (classify.coding): codes in order of first appearance whatever
order the uuid dictionary lists the GPUs in, and the shortcuts taken when the dictionary's
order or the cells' is that order."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from gpuaudit import schema
from gpuaudit.classify.coding import Coding

NS = 1_000_000_000


def _batch(uuids: list[str], dictionary: list[str]) -> pa.RecordBatch:
    n = len(uuids)
    idx = pa.array([dictionary.index(u) for u in uuids], pa.int32())
    table = schema.build_table({
        "ts": pa.array((np.arange(n) + 1_700_000_000) * NS).cast(schema.TS_TYPE),
        "host": [f"h-{u}" for u in uuids], "gpu_uuid": uuids,
        "util_gpu_pct": [1.0] * n})
    table = table.set_column(table.schema.get_field_index("gpu_uuid"), "gpu_uuid",
                             pa.DictionaryArray.from_arrays(idx, pa.array(dictionary)))
    return table.to_batches()[0]


@given(st.lists(st.sampled_from(["GPU-a", "GPU-b", "GPU-c", "GPU-d"]), min_size=1,
                max_size=30), st.permutations(["GPU-a", "GPU-b", "GPU-c", "GPU-d"]),
       st.integers(1, 30))
def test_property_codes_are_first_appearance_order_whatever_the_dictionary(uuids, dictionary,
                                                                           cut):
    coding = Coding(())
    got = []
    for part in (uuids[:cut], uuids[cut:]):  # two batches: the second meets known series
        if part:
            b = _batch(part, list(dictionary))
            codes = coding.series_codes(b, np.zeros(len(part), dtype=np.int64))
            assert coding.cell_ids(codes, b).tolist() == [coding.cell_index[(c, ())]
                                                          for c in codes.tolist()]
            got += codes.tolist()
    first = list(dict.fromkeys(uuids))
    assert got == [first.index(u) for u in uuids]
    assert [coding.series_meta[c][0] for c in range(len(first))] == [f"h-{u}" for u in first]


def test_cell_ids_out_of_code_order_are_looked_up():
    coding = Coding(())
    b = _batch(["GPU-a", "GPU-b", "GPU-a"], ["GPU-a", "GPU-b"])
    coding.series_index.update({"GPU-a": 0, "GPU-b": 1})
    coding.series_meta += [("h", None, None)] * 2
    coding.cell(1, ())  # the second series' cell first: ids 1 -> 0, 0 -> 1
    coding.cell(0, ())
    assert coding.cell_ids(np.array([0, 1, 0]), b).tolist() == [1, 0, 1]
