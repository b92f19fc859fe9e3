"""Series and group coding: which GPU and which cell each row belongs to, as small integers.

The phase engine (:mod:`gpuaudit.classify.phases`) accumulates with ``numpy.bincount``, so
every row needs two integer ids:

- its **series** code: one per ``gpu_uuid``, given in order of first appearance and never
  changed (with the series' host, model and MIG profile, and its first timestamp);
- its **cell** id: one per (series, values of the ``--by`` keys) combination; without keys each
  series is one cell.

Per batch the Python work is over distinct values only (the uuid dictionary, the distinct
(series, group values) combinations), never per row. :meth:`Coding.absorb` takes in the codes
of an engine that read a later range of the same stream (see ``_Engine.absorb``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuaudit.classify.rows import NS
from gpuaudit.series import LEAN_LABEL_KEYS

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["CellKey", "Coding", "first_seen_groups"]

#: A cell: (series code, the row's value of each ``--by`` key, None where it has none).
CellKey = tuple[int, tuple[str | None, ...]]


def _first_seen(ind: np.ndarray, size: int, last: int | None = None
                ) -> tuple[list[int], np.ndarray]:
    """Indices in ``[0, size)`` renumbered in the order the rows first use them (the order
    a dictionary encoding of the values gives; ``last``, the null, is put last whatever its
    place), so cells are numbered as by the encoding of the values' text. Returns the old
    index of each new one and the rows' new indices."""
    n = ind.shape[0]
    rows = _first_use_candidates(ind, size)
    first = np.full(size, n, dtype=np.int64)
    if rows is None:
        first[ind[::-1]] = np.arange(n - 1, -1, -1)
    else:  # (scattered last to first: each index keeps its earliest row)
        first[ind[rows][::-1]] = rows[::-1]
    if last is not None:
        first[last] = n + 1
    order = np.argsort(first, kind="stable")
    rank = np.empty(size, dtype=np.int64)
    rank[order] = np.arange(size)
    return order.tolist(), np.take(rank, ind)


def _first_use_candidates(ind: np.ndarray, size: int) -> np.ndarray | None:
    """Rows among which every index's first use lies, far fewer than all where possible:
    the rows where the index changes from the row before (an hour's offset, runs of one
    value), else the batch's first rows when they already use every index the batch uses
    (a pod per GPU, every GPU in each tick). None: every row."""
    n = ind.shape[0]
    if n < 4096:
        return None
    change = np.flatnonzero(ind[1:] != ind[:-1])
    if change.shape[0] < n // 8:
        return np.concatenate(([0], change + 1))
    used = np.bincount(ind, minlength=size) > 0
    head = 4096
    while head < n // 2:
        seen = np.zeros(size, dtype=bool)
        seen[ind[:head]] = True
        if not (used & ~seen).any():
            return np.arange(head)
        head *= 8
    return None


def _renumber(x: np.ndarray) -> np.ndarray:
    """``x``'s values as 0..k-1, in their sorted order."""
    return _unique_inverse(x)[1]


def _unique_inverse(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.unique(x, return_inverse=True)`` of an int64 array, by Arrow's hash table
    (~10 ns a value) rather than a sort of every value: only the distinct values are sorted."""
    import pyarrow as pa
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(pa.array(x, pa.int64()))
    distinct = enc.dictionary.to_numpy(zero_copy_only=False)
    order = np.argsort(distinct, kind="stable")
    rank = np.empty(order.shape[0], dtype=np.int64)
    rank[order] = np.arange(order.shape[0])
    return distinct[order], rank[enc.indices.to_numpy(zero_copy_only=False)]


def first_seen_groups(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's group (its distinct value of the int64 array ``key``, numbered in order of
    first appearance) and each group's first row. Non-negative keys of a small range by
    direct address; a large array, where the classify loop's numba is loaded already, in
    one compiled pass through a hash table (:mod:`gpuaudit.classify._coding_kernel`, ~10 ns
    a row); else by Arrow's hash encoding, its rank and a scatter of first rows (~30 ns)."""
    from gpuaudit.classify import fused

    n = key.shape[0]
    span = int(key.max()) + 1 if n else 0
    if n and int(key.min()) >= 0 and span <= 8 * n + 1024:
        first_at = np.full(span, n, dtype=np.int64)
        first_at[key[::-1]] = np.arange(n - 1, -1, -1)
        used = np.flatnonzero(first_at < n)
        first = first_at[used]
        order = np.argsort(first, kind="stable")
        rank = np.empty(span, dtype=np.int64)
        rank[used[order]] = np.arange(used.shape[0])
        return np.take(rank, key), first[order]
    if n >= fused.MIN_ROWS and fused.loaded():
        from gpuaudit.classify._coding_kernel import first_seen

        group, first = first_seen(key)
        return group, first
    _, inverse = _unique_inverse(key)
    at = np.zeros(int(inverse.max()) + 1 if n else 0, dtype=np.int64)
    at[inverse[::-1]] = np.arange(n - 1, -1, -1)
    order = np.argsort(at, kind="stable")
    rank = np.empty(order.shape[0], dtype=np.int64)
    rank[order] = np.arange(order.shape[0])
    return np.take(rank, inverse), at[order]


class _Cells:
    """The cells of one coding as columns, by cell id: ``code`` (the series code) and, per
    ``--by`` key ``j``, ``value[j]`` (the id of the cell's value in ``values[j]``, that key's
    table of distinct values, None included).

    A cell is found by its key packed into one integer: the series code and each value id in
    a field of bits wide enough for the ids handed out so far (with room to double); a
    dictionary from the packed integer to the cell id finds the known ones, about 0.1 us a
    combination, with no Python object per cell but that integer. Where the ids outgrow their
    fields the dictionary is built again over the columns (a few times over a run: each
    field doubles); beyond 63 bits the key is a tuple of the ids. The dictionary is not
    pickled (:meth:`detach`): a worker's cells go back as the columns alone."""

    def __init__(self, n_keys: int) -> None:
        self.n = 0
        self.code = np.zeros(0, dtype=np.int64)
        self.value: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in range(n_keys)]
        self.values: list[list[str | None]] = [[] for _ in range(n_keys)]
        self._value_id: list[dict[str | None, int]] = [{} for _ in range(n_keys)]
        #: bits of each field (the series code's first), and the packed key -> cell id
        self._bits: list[int] = [0] * (n_keys + 1)
        self._index: dict[Any, int] | None = None

    def value_ids(self, j: int, table: Sequence[str | None]) -> np.ndarray:
        """The ids of ``table``'s values among key ``j``'s values (new ones get the next)."""
        ids = self._value_id[j]
        get = ids.setdefault
        out = [get(v, len(ids)) for v in table]
        known = self.values[j]
        if len(ids) > len(known):
            known.extend(list(ids)[len(known):])
        return np.array(out, dtype=np.int64)

    def ids(self, code: np.ndarray, value_ids: Sequence[np.ndarray]) -> np.ndarray:
        """The cell ids of the keys (``code[i]``, ``value_ids[0][i]``, ...); keys not known
        get the next ids in the order they come (a key repeated gets one)."""
        fields = [code, *value_ids]
        need = [max(int(f.max()) + 1, len(self.values[j - 1]) if j else 0).bit_length()
                if f.size else 0 for j, f in enumerate(fields)]
        if self._index is None or any(nb > b for nb, b in zip(need, self._bits)):
            # room to double before the next rebuild
            self._bits = [max(b, nb + 1) for b, nb in zip(self._bits, need)]
            self._index = None
        index = self._index
        if index is None:
            index = self._index = dict(zip(self._pack([self.code[:self.n], *(
                v[:self.n] for v in self.value)]), range(self.n)))
        n0 = len(index)
        get = index.setdefault
        # (a new key gets the next id: setdefault's default is the size before)
        out = np.array([get(k, len(index)) for k in self._pack(fields)], dtype=np.int64)
        if len(index) > n0:
            new = out >= n0
            _, at = np.unique(out[new], return_index=True)  # each new id's first place
            rows = np.flatnonzero(new)[at]
            self._append([f[rows] for f in fields])
        return out

    def _pack(self, fields: Sequence[np.ndarray]) -> list[Any]:
        """The keys as one integer each (or tuples, past 63 bits), as a list."""
        if sum(self._bits) > 63:
            return list(zip(*(f.tolist() for f in fields)))
        key = np.zeros(fields[0].shape[0], dtype=np.int64)
        for f, b in zip(fields, self._bits):
            key <<= b
            key |= f
        return key.tolist()  # type: ignore[no-any-return]

    def _append(self, fields: Sequence[np.ndarray]) -> None:
        n, k = self.n, fields[0].shape[0]
        if n + k > self.code.shape[0]:
            size = max(n + k, 2 * self.code.shape[0], 64)
            self.code = _grown(self.code, size)
            self.value = [_grown(v, size) for v in self.value]
        self.code[n:n + k] = fields[0]
        for v, f in zip(self.value, fields[1:]):
            v[n:n + k] = f
        self.n = n + k

    def detach(self) -> None:
        """Drop the lookup dictionary and the unused room (before pickling)."""
        self._index = None
        self.code = self.code[:self.n].copy()
        self.value = [v[:self.n].copy() for v in self.value]


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, dtype=a.dtype)
    out[:a.shape[0]] = a
    return out


class Coding:
    """Series codes and cell ids of one engine, grown batch by batch."""

    def __init__(self, by: tuple[str, ...]):
        self.by = by
        self.series_index: dict[str, int] = {}
        #: per series code: (host, gpu_model, mig_profile) of its first row
        self.series_meta: list[tuple[str, str | None, str | None]] = []
        #: the label keys the samples carry, gathered only when grouping by a label (so a
        #: ``--by`` key no sample has can be reported with the keys that do exist)
        self.label_keys: set[str] = set()
        #: the cells as columns, by cell id: each cell's series code and, per ``--by`` key,
        #: the id of its value in that key's table of values (see :class:`_Cells`)
        self._cells = _Cells(len(by))
        #: per series code: the timestamp of its first row (where a later range's carried
        #: rows of that series end, see _Engine.absorb)
        self.first_ts = np.zeros(0, dtype=np.int64)
        # the last batch's uuid dictionary and its entries' series codes (-1: not yet a series)
        self._dictionary: pa.Array | None = None
        self._mapping = np.zeros(0, dtype=np.int64)
        #: without --by keys: each series' cell id, by series code (and whether they are
        #: the same numbers)
        self._cell_of_code = np.zeros(0, dtype=np.int64)
        self._cells_are_codes = True
        #: whether the cached mapping is the identity (None: not known yet)
        self._mapping_is_identity: bool | None = None

    @property
    def n_series(self) -> int:
        return len(self.series_index)

    @property
    def n_cells(self) -> int:
        return self._cells.n

    @property
    def cell_index(self) -> dict[CellKey, int]:
        """Every cell's id by its key, (series code, the values of the ``--by`` keys): a
        dictionary built on each call (for tests and small callers; the engine keeps the
        cells as columns)."""
        c = self._cells
        codes = c.code[:c.n].tolist()
        vals = [[tbl[i] for i in ids[:c.n].tolist()] for tbl, ids in zip(c.values, c.value)]
        return {(code, key): cid
                for cid, (code, key) in enumerate(zip(codes, zip(*vals) if vals else
                                                      [()] * c.n))}

    # -- series ---------------------------------------------------------------------------
    def series_codes(self, batch: pa.RecordBatch, ts: np.ndarray) -> np.ndarray:
        """Each row's series code; series seen for the first time get the next codes."""
        import pyarrow as pa
        import pyarrow.compute as pc

        col = batch.column("gpu_uuid")
        if not pa.types.is_dictionary(col.type):
            col = pc.dictionary_encode(col)
        idx = col.indices.to_numpy(zero_copy_only=False)
        if self._dictionary is None or not col.dictionary.equals(self._dictionary):
            self._dictionary = col.dictionary
            self._mapping = np.array([self.series_index.get(u, -1)
                                      for u in col.dictionary.to_pylist()], dtype=np.int64)
            self._mapping_is_identity = None
        mapping = self._mapping
        if (mapping < 0).any():
            # a sliced batch may carry dictionary entries none of its rows use: only the
            # entries some row uses become series, in order of first appearance
            present = np.flatnonzero(np.bincount(idx, minlength=mapping.shape[0]))
            new = present[mapping[present] < 0]
            if new.size:
                dictionary = col.dictionary.to_pylist()
                hosts = batch.column("host")
                models = batch.column("gpu_model")
                migs = batch.column("mig_profile")
                is_new = np.zeros(mapping.shape[0], dtype=bool)
                is_new[new] = True
                rows = np.flatnonzero(is_new[idx])
                _, at = np.unique(idx[rows], return_index=True)
                first_rows = np.sort(rows[at])
                start = len(self.series_index)
                for row in first_rows.tolist():
                    j = int(idx[row])
                    code = len(self.series_index)
                    self.series_index[dictionary[j]] = code
                    self.series_meta.append(
                        (str(hosts[row].as_py()), models[row].as_py(), migs[row].as_py())
                    )
                    mapping[j] = code
                self._grow_first_ts(len(self.series_index))
                self.first_ts[start:len(self.series_index)] = ts[first_rows]
                self._mapping_is_identity = None
        if self._mapping_is_identity is None:
            self._mapping_is_identity = bool(
                (mapping == np.arange(mapping.shape[0])).all())
        if self._mapping_is_identity:  # dictionary order is first-appearance order
            return np.asarray(idx, dtype=np.int64)
        return np.asarray(np.take(mapping, idx))  # (a gather: several times faster than mapping[idx])

    def add_series(self, uuid: str, host: str, gpu_model: str | None, mig_profile: str | None,
                   first_ts: int) -> int:
        """Register a series given by its identity rather than read off a batch (a source
        classified from plain columns); returns its code. Adding a known series is an
        error: its rows must come in one go per call of the engine."""
        if uuid in self.series_index:
            raise ValueError(f"series {uuid!r} is already known")
        code = len(self.series_index)
        self.series_index[uuid] = code
        self.series_meta.append((host, gpu_model, mig_profile))
        self._grow_first_ts(code + 1)
        self.first_ts[code] = first_ts
        return code

    def _grow_first_ts(self, n: int) -> None:
        if self.first_ts.shape[0] < n:
            grown = np.zeros(max(n, 2 * self.first_ts.shape[0], 64), dtype=np.int64)
            grown[: self.first_ts.shape[0]] = self.first_ts
            self.first_ts = grown

    def uuid_of(self, code: int) -> str:
        return next(k for k, v in self.series_index.items() if v == code)

    def detach(self) -> None:
        """Drop the per-file dictionary cache (before the engine is sent to another process)."""
        self._dictionary = None
        self._mapping = np.zeros(0, dtype=np.int64)
        self._mapping_is_identity = None
        self._cells.detach()

    # -- cells ----------------------------------------------------------------------------
    def encode_keys(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` with each ``--by`` column key held as plain text (namespace, pod,
        container; a lean or foreign reader's host) dictionary-encoded, once: the cells are
        coded by its indices, and the pods per GPU (``Signals.add_points``) paired by them,
        instead of hashing the same text twice. The values are unchanged."""
        import pyarrow as pa
        import pyarrow.compute as pc

        names = batch.schema.names
        for key in self.by:
            if key.startswith(("label:", "period:")) or key not in names:
                continue
            i = names.index(key)
            col = batch.column(i)
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                batch = batch.set_column(i, key, pc.dictionary_encode(col))
        return batch

    def cell_ids(self, codes: np.ndarray, batch: pa.RecordBatch) -> np.ndarray:
        """Each row's cell id; combinations seen for the first time get the next ids."""
        if not self.by:
            # each series is its one cell: the ids per code, extended as series are added
            known = self._cell_of_code.shape[0]
            if known < len(self.series_index):
                more = [self.cell(code, ()) for code in range(known, len(self.series_index))]
                self._cell_of_code = np.concatenate(
                    [self._cell_of_code, np.array(more, dtype=np.int64)])
                self._cells_are_codes = bool(
                    (self._cell_of_code == np.arange(self._cell_of_code.shape[0])).all())
            if self._cells_are_codes:  # cell ids given in code order: the same numbers
                return codes
            return np.take(self._cell_of_code, codes)
        # Each key's value per row as a small integer into a table of its values (the
        # batch's own numbering: a dictionary column by its indices, a period by its offset
        # from the batch's first, anything else dictionary-encoded); the combinations of
        # series and values numbered in one pass over the rows (first_seen_groups), and all
        # the rest over the distinct combinations (few), never per row.
        keys = self._group_codes(batch)
        combined = codes.astype(np.int64)
        bound = max(len(self.series_index), 1)  # (combined < bound)
        for table, ind, _ in keys:
            if bound >= (1 << 62) // max(len(table), 1):
                combined = _renumber(combined)  # keep the product in 64 bits
                bound = int(combined.max()) + 1 if combined.size else 1
            combined = combined * len(table) + ind
            bound *= max(len(table), 1)
        group, first = first_seen_groups(combined)
        # each key's values ordered by their first use (the order a dictionary encoding of
        # the text gives, the null last): the combinations come in order of first use, so
        # the first combination with a value holds its first row; then the combinations in
        # the order of (series, each key's value), new cells numbered in that order
        code = codes[first].astype(np.int64)
        tables: list[list[str | None]] = []
        ranks: list[np.ndarray] = []
        for table, ind, last in keys:
            order, rank = _first_seen(np.asarray(ind[first], dtype=np.int64), len(table), last)
            tables.append([table[i] for i in order])
            ranks.append(rank)
        by_key = np.lexsort([*ranks[::-1], code]) if code.size else code
        cells = self._cells
        value_ids = [cells.value_ids(j, tbl)[rank[by_key]]
                     for j, (tbl, rank) in enumerate(zip(tables, ranks))]
        cell_of_group = np.empty(by_key.shape[0], dtype=np.int64)
        cell_of_group[by_key] = cells.ids(code[by_key], value_ids)
        return np.asarray(np.take(cell_of_group, group))

    def _group_codes(self, batch: pa.RecordBatch
                     ) -> list[tuple[list[str | None], np.ndarray, int | None]]:
        """Per ``--by`` key: a table of its values as text (None: no value), each row's
        index into it (an integer array), and the null's index (put last when the table is
        ordered by first use). A table may list a value twice (a dictionary's repeats) or
        values no row has: the cells are told apart by the text, not by the index."""
        import pyarrow as pa
        import pyarrow.compute as pc

        arrays = iter(self._group_values(batch, text=False))
        out: list[tuple[list[str | None], np.ndarray, int | None]] = []
        for key in self.by:
            arr = next(arrays)
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            if key.startswith("period:"):
                secs = int(key[7:])
                ts = batch.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
                if ts.size and int(ts.min()) >= 0:
                    p = ts // (secs * NS)
                    lo, hi = int(p.min()), int(p.max())
                    if hi - lo < max(4 * p.shape[0], 1024):
                        vals = [str((lo + i) * secs) for i in range(hi - lo + 1)]
                        out.append(([*vals, None], p - lo, len(vals)))  # (no row's null)
                        continue
                arr = pc.multiply(pc.divide(pc.cast(batch.column("ts"), pa.int64()),
                                            secs * NS), secs)  # ts >= 0: floor
            if pa.types.is_dictionary(arr.type) and len(
                    vals := arr.dictionary.cast(pa.string()).to_pylist()) == len(set(vals)):
                # (a dictionary that repeats a value takes the text's encoding below)
                indices = arr.indices
                if indices.null_count:
                    indices = indices.fill_null(len(vals))
                out.append(([*vals, None], indices.to_numpy(zero_copy_only=False), len(vals)))
                continue
            enc = pc.dictionary_encode(arr.cast(pa.string()))
            table = [*enc.dictionary.to_pylist(), None]  # last: null
            # (the encoding's order is the rows' first use already, the null last)
            out.append((table, enc.indices.fill_null(len(table) - 1).to_numpy(
                zero_copy_only=False), len(table) - 1))
        return out

    def _group_values(self, batch: pa.RecordBatch, text: bool = True) -> list[pa.Array]:
        """The rows' value of each ``--by`` key, as strings (``text``; else a column key as
        the batch holds it, a period key as None: :meth:`_group_codes` reads the times)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        values: list[pa.Array] = []
        names = batch.schema.names
        if any(not k.startswith("period:") for k in self.by):
            labels = batch.column("labels")
            if isinstance(labels, pa.ChunkedArray):
                labels = labels.combine_chunks()
            if not pa.types.is_null(labels.type):  # (a lean batch holds no maps)
                self.label_keys.update(k for k in pc.unique(labels.keys).to_pylist() if k)
            keys = (batch.schema.metadata or {}).get(LEAN_LABEL_KEYS)
            if keys:  # a lean batch: its series' label keys, said once
                self.label_keys.update(keys.decode().split("\x1f"))
        for key in self.by:
            if key.startswith("label:") and key in names:
                arr = batch.column(key)  # a lean batch: the label's value per row, coded
            elif key.startswith("label:") and pa.types.is_null(batch.schema.field("labels").type):
                arr = pa.nulls(batch.num_rows, pa.string())
            elif key.startswith("label:"):
                arr = pc.map_lookup(batch.column("labels"), key[6:], "first")
            elif key.startswith("period:"):
                if not text:
                    values.append(pa.nulls(0))
                    continue
                secs = int(key[7:])
                ts = pc.cast(batch.column("ts"), pa.int64())
                arr = pc.multiply(pc.divide(ts, secs * NS), secs)  # ts >= 0: floor
            else:
                arr = batch.column(key)
            values.append(arr.cast(pa.string()) if text else arr)
        return values

    def cell(self, code: int, key: tuple[str | None, ...]) -> int:
        """The id of the cell (``code``, ``key``), a new one if it is not known yet."""
        cells = self._cells
        value_ids = [cells.value_ids(j, [v]) for j, v in enumerate(key)]
        return int(cells.ids(np.array([code], dtype=np.int64), value_ids)[0])

    def series_of_cells(self) -> np.ndarray:
        """Per cell id: its series code."""
        return np.array(self._cells.code[:self._cells.n])

    def cell_values(self) -> dict[str, list[str | None]]:
        """The cells' identity columns as lists (what :meth:`cell_columns` holds)."""
        c = self._cells
        codes = c.code[:c.n].tolist()
        uuids = list(self.series_index)
        cols: dict[str, list[str | None]] = {
            "gpu_uuid": [uuids[i] for i in codes],
            "host": [self.series_meta[i][0] for i in codes],
            "gpu_model": [self.series_meta[i][1] for i in codes],
        }
        for name, tbl, ids in zip(self.by, c.values, c.value):
            cols[name] = [tbl[i] for i in ids[:c.n].tolist()]
        return cols

    def cell_columns(self) -> dict[str, pa.Array]:
        """The cells' identity columns, in cell id order: gpu_uuid, host, gpu_model and one
        column per ``--by`` key (each a take from the table of its values, in C)."""
        import pyarrow as pa

        c = self._cells
        codes = pa.array(c.code[:c.n])
        meta = self.series_meta
        cols = {
            "gpu_uuid": pa.array(list(self.series_index), pa.string()).take(codes),
            "host": pa.array([m[0] for m in meta], pa.string()).take(codes),
            "gpu_model": pa.array([m[1] for m in meta], pa.string()).take(codes),
        }
        for name, tbl, ids in zip(self.by, c.values, c.value):
            cols[name] = pa.array(tbl, pa.string()).take(pa.array(ids[:c.n]))
        return cols

    # -- merging ranges -------------------------------------------------------------------
    def absorb(self, other: Coding) -> tuple[np.ndarray, np.ndarray]:
        """Take in the series and cells of ``other``, the coding of the next range of the same
        stream. Returns ``other``'s series codes and cell ids as this coding's: ``m[code]``
        and ``cmap[cell]``. Series and cells new here get the next codes and ids, in
        ``other``'s order."""
        self.label_keys |= other.label_keys
        m = np.empty(len(other.series_index), dtype=np.int64)
        new = []
        for uuid, code in other.series_index.items():
            mine = self.series_index.get(uuid)
            if mine is None:
                mine = len(self.series_index)
                self.series_index[uuid] = mine
                self.series_meta.append(other.series_meta[code])
                new.append((mine, code))
            m[code] = mine
        self._grow_first_ts(len(self.series_index))
        # a series first seen in ``other`` starts where ``other`` saw it first
        for mine, code in new:
            self.first_ts[mine] = other.first_ts[code]
        # the cached uuid -> code mapping of the last batch predates these series
        self._dictionary = None
        o = other._cells
        value_ids = [self._cells.value_ids(j, tbl)[ids[:o.n]]
                     for j, (tbl, ids) in enumerate(zip(o.values, o.value))]
        cmap = self._cells.ids(m[o.code[:o.n]], value_ids)
        return m, cmap
