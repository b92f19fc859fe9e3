"""The cells kept as columns (classify.coding._Cells, issue 27's bill row): the ids a packed
integer key finds equal those of a dictionary of (series code, values) tuples, as the key's
fields outgrow their bits (the lookup built again), past 63 bits (tuple keys), with keys
repeated in one call, across a pickle (the lookup dropped and built again on the other side),
and stitched into another coding (``Coding.absorb``)."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.classify.coding import Coding, _Cells


class _DictCells:
    """The reference: one dictionary of (code, value, ...) tuples, ids in order of arrival."""

    def __init__(self) -> None:
        self.index: dict[tuple[Any, ...], int] = {}

    def ids(self, keys: list[tuple[Any, ...]]) -> list[int]:
        return [self.index.setdefault(k, len(self.index)) for k in keys]


_VALUES = st.one_of(st.none(), st.sampled_from(["a", "b", "c"]),
                    st.integers(0, 5000).map(str))


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(st.lists(st.tuples(st.integers(0, 3000), _VALUES, _VALUES),
                               min_size=0, max_size=40), min_size=1, max_size=8),
       pickle_after=st.integers(0, 8))
def test_ids_equal_a_dictionary_of_tuples(calls: list[list[tuple[Any, ...]]],
                                          pickle_after: int) -> None:
    cells, ref = _Cells(2), _DictCells()
    for i, keys in enumerate(calls):
        if i == pickle_after:
            cells.detach()
            cells = pickle.loads(pickle.dumps(cells))
        code = np.array([k[0] for k in keys], dtype=np.int64)
        value_ids = [cells.value_ids(j, [k[j + 1] for k in keys]) for j in range(2)]
        got = cells.ids(code, value_ids)
        assert got.tolist() == ref.ids(keys)
        # the columns hold each cell's key, by id
        for key, cid in ref.index.items():
            assert (int(cells.code[cid]), *(cells.values[j][int(cells.value[j][cid])]
                                            for j in range(2))) == key
        assert cells.n == len(ref.index)


def test_keys_past_63_bits_are_tuples() -> None:
    cells = _Cells(1)
    big = np.array([1 << 61, 5, 1 << 61], dtype=np.int64)  # the code alone takes 62 bits
    v = cells.value_ids(0, ["x", "y", "x"])
    assert cells.ids(big, [v]).tolist() == [0, 1, 0]
    assert cells.ids(np.array([5], dtype=np.int64), [cells.value_ids(0, ["y"])]).tolist() == [1]
    assert sum(cells._bits) > 63


def test_fields_that_outgrow_their_bits_keep_the_ids() -> None:
    cells, ref = _Cells(1), _DictCells()
    for width in (1, 2, 3, 100, 1000, 70000):  # each call widens the fields
        keys = [(c, str(c % 7)) for c in range(width - 1, -1, -1)]
        got = cells.ids(np.array([k[0] for k in keys], dtype=np.int64),
                        [cells.value_ids(0, [k[1] for k in keys])])
        assert got.tolist() == ref.ids(keys)


def _batch(uuids: list[str], ns: list[str | None], hours: list[int]) -> pa.RecordBatch:
    n = len(uuids)
    return pa.record_batch({
        "ts": pa.array([h * 3600 * 10**9 for h in hours], pa.timestamp("ns", "UTC")),
        "gpu_uuid": pa.array(uuids).dictionary_encode(),
        "host": pa.array(["h"] * n).dictionary_encode(),
        "gpu_model": pa.array(["H100"] * n),
        "mig_profile": pa.array([None] * n, pa.string()),
        "namespace": pa.array(ns, pa.string()),
        "labels": pa.array([[] for _ in range(n)], pa.map_(pa.string(), pa.string())),
    })


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["G0", "G1", "G2"]),
                               st.sampled_from(["t1", "t2", None]), st.integers(0, 40)),
                     min_size=2, max_size=60), cut=st.integers(1, 59))
def test_absorb_gives_the_cells_one_coding_would(rows: list[tuple[str, str | None, int]],
                                                cut: int) -> None:
    by = ("namespace", "period:3600")
    cut = min(cut, len(rows) - 1)
    whole, first, second = Coding(by), Coding(by), Coding(by)

    def feed(coding: Coding, part: list[tuple[str, str | None, int]]) -> None:
        b = _batch([r[0] for r in part], [r[1] for r in part], [r[2] for r in part])
        ts = b.column("ts").cast(pa.int64()).to_numpy()
        coding.cell_ids(coding.series_codes(b, ts), b)

    feed(whole, rows[:cut])
    feed(whole, rows[cut:])
    feed(first, rows[:cut])
    feed(second, rows[cut:])
    second.detach()
    second = pickle.loads(pickle.dumps(second))  # as a worker's coding comes back
    # the reference: this side's cells keep their ids, the other's new ones follow in the
    # other's id order (series renumbered by first appearance)
    uuids = list(first.series_index) + [u for u in second.series_index
                                        if u not in first.series_index]
    code_of = {u: uuids.index(u) for u in uuids}
    second_uuid = list(second.series_index)
    ref = dict(first.cell_index)
    for (code, key), _cid in sorted(second.cell_index.items(), key=lambda kv: kv[1]):
        ref.setdefault((code_of[second_uuid[code]], key), len(ref))
    m, cmap = first.absorb(second)
    assert first.cell_index == ref
    assert set(first.cell_index) == set(whole.cell_index)
    # cmap sends each of the second's cells to the one with the same key here
    inv = {cid: key for key, cid in first.cell_index.items()}
    for (code, key), cid in second.cell_index.items():
        assert inv[int(cmap[cid])] == (int(m[code]), key)
    cols = first.cell_columns()
    want = first.cell_values()
    assert {k: v.to_pylist() for k, v in cols.items()} == want
    assert all(v.type == pa.string() for v in cols.values())


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 6), st.sampled_from(["p1", "p2", "p3", None])),
                     min_size=1, max_size=80),
       dictionary=st.permutations(["p1", "p2", "p3", "p2", "unused"]))
def test_pods_per_gpu_from_a_dictionary_equal_the_text_grouping(
        rows: list[tuple[int, str | None]], dictionary: list[str]) -> None:
    from gpuaudit.classify.signals import _code_pods

    codes = np.array([r[0] for r in rows], dtype=np.int64)
    text = pa.array([r[1] for r in rows], pa.string())
    # a dictionary with a repeated entry and one no row uses, as a file's may hold
    idx = pa.array([None if r[1] is None else dictionary.index(r[1]) for r in rows], pa.int32())
    enc = pa.DictionaryArray.from_arrays(idx, pa.array(dictionary))
    want = {(c, p) for c, p in rows if p is not None}
    assert set(_code_pods(codes, text)) == want
    got = _code_pods(codes, enc)
    assert set(got) == want and len(got) == len(want)
    assert set(_code_pods(codes, pc.dictionary_encode(text))) == want


def test_encode_keys_dictionary_encodes_text_keys_only() -> None:
    b = _batch(["G0", "G1"], ["t1", None], [0, 1])
    coding = Coding(("namespace", "period:3600", "label:team"))
    out = coding.encode_keys(b)
    assert pa.types.is_dictionary(out.column("namespace").type)
    assert out.column("namespace").cast(pa.string()).to_pylist() == ["t1", None]
    assert out.column("gpu_model").type == pa.string()  # not a key: left as it is
    assert Coding(()).encode_keys(b).equals(b)


def _first_seen_by_every_row(ind: np.ndarray, size: int, last: int | None
                             ) -> tuple[list[int], list[int]]:
    first = np.full(size, ind.shape[0], dtype=np.int64)
    first[ind[::-1]] = np.arange(ind.shape[0] - 1, -1, -1)
    if last is not None:
        first[last] = ind.shape[0] + 1
    order = np.argsort(first, kind="stable")
    rank = np.empty(size, dtype=np.int64)
    rank[order] = np.arange(size)
    return order.tolist(), rank[ind].tolist()


@pytest.mark.parametrize("kind", ["runs", "ticks", "late", "random"])
@pytest.mark.parametrize("size", [2, 7, 300, 5000])
@pytest.mark.parametrize("seed", range(4))
def test_first_seen_from_fewer_rows_equals_every_row(kind: str, size: int, seed: int) -> None:
    """Large batches take the shortcuts (the rows where the index changes; the first rows
    when they use every index): the same order and indices as scanning every row."""
    from gpuaudit.classify.coding import _first_seen

    rng = np.random.default_rng(seed)
    n = int(rng.integers(4096, 40000))
    if kind == "runs":  # an hour's offset: long runs, not sorted
        ind = np.repeat(rng.integers(0, size, max(1, n // 1000)), 1000)[:n]
    elif kind == "ticks":  # a value per GPU, every GPU in each tick, GPUs shuffled
        ind = np.tile(rng.permutation(size), n // size + 1)[:n]
    elif kind == "late":  # two values first used near the end, the higher index first
        ind = np.tile(np.arange(2, size + 2), n // size + 1)[:n] % size
        ind[ind < 2] = 2 % size
        ind[-3], ind[-2] = 1, 0
    else:
        ind = rng.integers(0, size, n)
    ind = ind.astype(np.int64)
    for last in (None, size - 1):
        order, got = _first_seen(ind, size, last)
        want_order, want = _first_seen_by_every_row(ind, size, last)
        assert order == want_order
        assert got.tolist() == want
