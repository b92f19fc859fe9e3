"""The compiled loop of :mod:`gpuaudit.classify.coding` (numba; imported there only once
:mod:`gpuaudit.classify.fused` has loaded numba): the distinct values of an int64 array,
numbered in order of first appearance, in one pass through a small hash table, where
``numpy.unique`` sorts every value and Arrow's dictionary encoding, a rank gather and a
scatter of first rows make four passes."""

# mypy: ignore-errors

from __future__ import annotations

import numba
import numpy as np

# Fibonacci hashing: the key times 2^64 / phi (as a wrapping int64), its top bits the slot
_GOLDEN = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15


@numba.njit(cache=True, nogil=True)
def _insert(table_key, table_slot, bits, v, s):
    mask = (1 << bits) - 1
    h = ((v * _GOLDEN) >> (64 - bits)) & mask
    while table_slot[h] >= 0:
        h = (h + 1) & mask
    table_key[h] = v
    table_slot[h] = s


@numba.njit(cache=True, nogil=True)
def first_seen(x):
    """``(group, first)``: each row's group (its distinct value of ``x``, numbered in the
    order the rows first have them) and each group's first row."""
    n = x.shape[0]
    bits = 12
    table_key = np.empty(1 << bits, dtype=np.int64)
    table_slot = np.full(1 << bits, -1, dtype=np.int64)
    distinct = np.empty(1024, dtype=np.int64)
    first = np.empty(1024, dtype=np.int64)
    slot = np.empty(n, dtype=np.int64)
    k = 0
    for i in range(n):
        v = x[i]
        mask = (1 << bits) - 1
        h = ((v * _GOLDEN) >> (64 - bits)) & mask
        while True:
            s = table_slot[h]
            if s < 0 or table_key[h] == v:
                break
            h = (h + 1) & mask
        if s >= 0:
            slot[i] = s
            continue
        # a new value: the next slot; past half full, the table doubles
        if k == distinct.shape[0]:
            grown = np.empty(2 * k, dtype=np.int64)
            grown[:k] = distinct
            distinct = grown
            grown = np.empty(2 * k, dtype=np.int64)
            grown[:k] = first
            first = grown
        distinct[k] = v
        first[k] = i
        slot[i] = k
        table_key[h] = v
        table_slot[h] = k
        k += 1
        if 2 * k > (1 << bits):
            bits += 1
            table_key = np.empty(1 << bits, dtype=np.int64)
            table_slot = np.full(1 << bits, -1, dtype=np.int64)
            for j in range(k):
                _insert(table_key, table_slot, bits, distinct[j], j)
    return slot, first[:k].copy()
