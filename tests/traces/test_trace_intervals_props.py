"""Property tests for the interval arithmetic under every breakdown."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.traces.intervals import busy_in_windows, intersect_len, merge, sweep

ivals = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 60)), max_size=40)


def _arrays(xs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    s = np.array([a for a, _ in xs], dtype=np.int64)
    e = np.array([a + d for a, d in xs], dtype=np.int64)
    return s, e


def _grid(xs: list[tuple[int, int]]) -> np.ndarray:
    g = np.zeros(400, dtype=bool)
    for a, d in xs:
        g[a:a + d] = True
    return g


@settings(max_examples=200, deadline=None)
@given(ivals)
def test_merge_is_the_union(xs: list[tuple[int, int]]) -> None:
    ms, me = merge(*_arrays(xs))
    assert int((me - ms).sum()) == int(_grid(xs).sum())
    assert np.all(ms[1:] > me[:-1])  # disjoint, sorted


@settings(max_examples=200, deadline=None)
@given(ivals, ivals)
def test_intersection_and_sweep(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
    A, B = merge(*_arrays(a)), merge(*_arrays(b))
    ga, gb = _grid(a), _grid(b)
    assert intersect_len(A, B) == int((ga & gb).sum())
    parts = sweep([A, B])
    assert sum(parts.values()) == int((ga | gb).sum())
    assert parts.get(1, 0) == int((ga & ~gb).sum())


@settings(max_examples=200, deadline=None)
@given(ivals, st.integers(1, 97))
def test_windows_partition_busy_time(xs: list[tuple[int, int]], width: int) -> None:
    ms, me = merge(*_arrays(xs))
    edges = np.append(np.arange(0, 400, width, dtype=np.int64), 400)
    busy = busy_in_windows(ms, me, edges)
    g = _grid(xs)
    expect = [int(g[lo:hi].sum()) for lo, hi in itertools.pairwise(edges)]
    assert busy.tolist() == expect
    assert np.all(busy <= np.diff(edges))
