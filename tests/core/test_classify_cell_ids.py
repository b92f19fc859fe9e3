"""Cell ids from each key's codes (a dictionary column's indices, a period's offset from the
batch's first, Arrow's hash of the distinct combinations: issue 27, the bill's hourly cells)
equal the ids of the text encoding they replace: every row's value of every ``--by`` key as
text, dictionary-encoded, the combinations sorted (``numpy.unique``). Same ids, in the same
order, batch after batch, with nulls, unused and repeated dictionary entries, rows out of
time order across series, and label keys."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.classify.coding import Coding
from gpuaudit.classify.rows import NS

HOSTS = ["h-a", "h-b", "h-c", "h-b"]  # a repeated entry, and entries no row uses


def _text_cell_ids(coding: Coding, codes: np.ndarray, batch: pa.RecordBatch) -> np.ndarray:
    """The encoding before issue 27: each key's values as text per row."""
    vals = []
    for key in coding.by:
        if key.startswith("label:"):
            arr = pc.map_lookup(batch.column("labels"), key[6:], "first")
        elif key.startswith("period:"):
            secs = int(key[7:])
            arr = pc.multiply(pc.divide(pc.cast(batch.column("ts"), pa.int64()), secs * NS),
                              secs)
        else:
            arr = batch.column(key)
        vals.append(arr.cast(pa.string()))
    combo = np.zeros(codes.shape[0], dtype=np.int64)
    tables, inds = [], []
    for v in vals:
        enc = pc.dictionary_encode(v)
        tables.append([*enc.dictionary.to_pylist(), None])
        ind = enc.indices.fill_null(len(tables[-1]) - 1).to_numpy(
            zero_copy_only=False).astype(np.int64)
        inds.append(ind)
        combo = combo * len(tables[-1]) + ind
    combined = codes.astype(np.int64) * int(combo.max() + 1 if combo.size else 1) + combo
    uniq, inverse = np.unique(combined, return_inverse=True)
    first = np.zeros(uniq.shape[0], dtype=np.int64)
    first[inverse[::-1]] = np.arange(codes.shape[0])[::-1]
    out = [coding.cell(int(codes[r]), tuple(t[int(i[r])] for t, i in zip(tables, inds)))
           for r in first.tolist()]
    return np.asarray(np.array(out, dtype=np.int64)[inverse])


@st.composite
def batches(draw: Any) -> list[pa.RecordBatch]:
    out = []
    t0 = draw(st.integers(0, 10)) * 3600
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 60))
        gpu = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
        # time advances by the minute with jumps back: rows of another series earlier
        ts = [(t0 + 60 * draw(st.integers(0, 300))) * NS for _ in range(n)]
        host = draw(st.lists(st.sampled_from([0, 1, 3, None]), min_size=n, max_size=n))
        ns = draw(st.lists(st.sampled_from(["t1", "t2", None]), min_size=n, max_size=n))
        team = draw(st.lists(st.sampled_from(["a", "b", None]), min_size=n, max_size=n))
        out.append(pa.record_batch({
            "ts": pa.array(ts, pa.timestamp("ns", "UTC")),
            "gpu_uuid": pa.DictionaryArray.from_arrays(
                pa.array(gpu, pa.int32()), pa.array([f"GPU-{i}" for i in range(5)])),
            "host": pa.DictionaryArray.from_arrays(pa.array(host, pa.int32()),
                                                   pa.array(HOSTS)),
            "gpu_model": pa.array(["H100"] * n),
            "mig_profile": pa.array([None] * n, pa.string()),
            "namespace": pa.array(ns, pa.string()),
            "labels": pa.array([[("team", t)] if t else [] for t in team],
                               pa.map_(pa.string(), pa.string())),
        }))
        t0 += 60 * draw(st.integers(0, 400))
    return out


@settings(max_examples=80, deadline=None)
@given(parts=batches(), by=st.sampled_from([
    ("namespace", "period:3600"), ("host",), ("period:3600", "host", "label:team"),
    ("label:team",), ("namespace", "host", "period:60")]))
def test_cell_ids_equal_the_text_encoding(parts: list[pa.RecordBatch],
                                          by: tuple[str, ...]) -> None:
    new, old = Coding(by), Coding(by)
    for batch in parts:
        ts = batch.column("ts").cast(pa.int64()).to_numpy()
        codes = new.series_codes(batch, ts)
        assert np.array_equal(codes, old.series_codes(batch, ts))
        got = new.cell_ids(codes, batch)
        want = _text_cell_ids(old, codes, batch)
        assert got.tolist() == want.tolist()
        assert new.cell_index == old.cell_index


@pytest.fixture
def compiled() -> None:
    """The compiled pass of ``first_seen_groups`` in use (numba loaded, as after a large
    source's first batch)."""
    from gpuaudit.classify import fused

    if not fused.available():
        pytest.skip("numba is not installed")


def _first_seen_by_dict(key: np.ndarray) -> tuple[list[int], list[int]]:
    order: dict[int, int] = {}
    first: list[int] = []
    group = []
    for i, k in enumerate(key.tolist()):
        if k not in order:
            order[k] = len(order)
            first.append(i)
        group.append(order[k])
    return group, first


@pytest.mark.parametrize("distinct, scale", [(7, 10**15), (5000, 10**12), (40_000, -3)])
def test_first_seen_groups_compiled_equal_the_dictionary(compiled: None, distinct: int,
                                                         scale: int) -> None:
    """The compiled hash pass (keys spread far wider than the rows: no direct address;
    past 2,048 distinct values its table and arrays grow; negative keys) numbers the groups
    as a dictionary of first appearances does, and so does the Arrow path it replaces."""
    from gpuaudit.classify import fused
    from gpuaudit.classify.coding import first_seen_groups

    rng = np.random.default_rng(distinct)
    key = rng.integers(0, distinct, 100_000).astype(np.int64) * scale + 12_345
    want_group, want_first = _first_seen_by_dict(key)
    for min_rows in (fused.MIN_ROWS, 10**9):  # compiled, then the Arrow path
        old = fused.MIN_ROWS
        fused.MIN_ROWS = min_rows
        try:
            group, first = first_seen_groups(key)
        finally:
            fused.MIN_ROWS = old
        assert group.tolist() == want_group
        assert first.tolist() == want_first


def test_cell_ids_of_a_large_batch_equal_the_text_encoding(compiled: None) -> None:
    """A batch of 1,000 GPUs over 100 minutes (combinations spread wider than direct
    address takes: the compiled pass), batch after batch: the ids of the text encoding."""
    rng = np.random.default_rng(7)
    by = ("namespace", "pod", "period:60")
    new, old = Coding(by), Coding(by)
    for part in range(2):
        n_gpu, n_min = 1000, 100
        n = n_gpu * n_min
        gpu = np.tile(np.arange(n_gpu), n_min)
        ts = (part * n_min + np.repeat(np.arange(n_min), n_gpu)) * 60 * NS
        ns = rng.choice(np.array(["t1", "t2", "t3", None], dtype=object), n)
        pod = [f"p{(g * 7 + m // 50) % 900}" for g, m in zip(gpu.tolist(),
                                                             (ts // (60 * NS)).tolist())]
        batch = pa.record_batch({
            "ts": pa.array(ts, pa.timestamp("ns", "UTC")),
            "gpu_uuid": pa.DictionaryArray.from_arrays(
                pa.array(gpu, pa.int32()), pa.array([f"GPU-{i}" for i in range(n_gpu)])),
            "host": pa.array([f"h{g // 8}" for g in gpu.tolist()]),
            "gpu_model": pa.array(["H100"] * n),
            "mig_profile": pa.array([None] * n, pa.string()),
            "namespace": pa.array(ns.tolist(), pa.string()),
            "pod": pa.array(pod).dictionary_encode(),
            "labels": pa.array([[]] * n, pa.map_(pa.string(), pa.string())),
        })
        tsn = batch.column("ts").cast(pa.int64()).to_numpy()
        codes = new.series_codes(batch, tsn)
        assert np.array_equal(codes, old.series_codes(batch, tsn))
        got = new.cell_ids(codes, new.encode_keys(batch))
        want = _text_cell_ids(old, codes, batch)
        assert got.tolist() == want.tolist()
        assert new.cell_index == old.cell_index
