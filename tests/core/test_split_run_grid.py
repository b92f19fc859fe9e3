"""split_run searches only the pairs of cuts where the steady stretch can be the longest
(a <= n/2 <= b): the cuts are those of the exhaustive search over every pair, ties and all."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.classify import patterns
from gpuaudit.classify.patterns import split_run


def split_run_every_pair(util_pct: np.ndarray) -> tuple[int, int]:
    """The search over the whole (n + 1) x (n + 1) grid of cuts, as split_run made it."""
    n_all = int(util_pct.shape[0])
    valid = np.flatnonzero(~np.isnan(util_pct))
    n = int(valid.shape[0])
    if n < 8:
        return 0, n_all
    raw = util_pct[valid].astype(np.float64)
    k = min(patterns.SMOOTH_BUCKETS, n)
    pad = np.concatenate([np.full(k // 2, raw[0]), raw, np.full(k - 1 - k // 2, raw[-1])])
    x = np.convolve(pad, np.ones(k) / k, mode="valid")
    s1 = np.concatenate([[0.0], np.cumsum(x)])
    s2 = np.concatenate([[0.0], np.cumsum(x * x)])

    def sse(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        m = np.maximum(j - i, 1)
        tot = s1[j] - s1[i]
        return np.asarray((s2[j] - s2[i]) - tot * tot / m)

    def mean(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        return np.asarray((s1[j] - s1[i]) / np.maximum(j - i, 1))

    noise = float(np.mean(np.diff(x) ** 2) / 2.0) if n > 1 else 0.0
    penalty = 3.0 * math.log(n) * max(noise, 1.0)
    min_steady = max(2, math.ceil(patterns.STEADY_MIN_SHARE * n))
    a = np.arange(0, n + 1)[:, None]
    b = np.arange(0, n + 1)[None, :]
    ok = (b - a >= min_steady) & (b - a >= a) & (b - a >= n - b)
    ok &= ((a == 0) | (a >= 2)) & ((b == n) | (n - b >= 2))
    zero, end = np.zeros_like(a), np.full_like(b, n)
    cost = sse(zero, a) + sse(a, b) + sse(b, end)
    steady_mean = mean(a, b)
    ok &= (a == 0) | (np.abs(mean(zero, a) - steady_mean) >= patterns.EDGE_MIN_DIFF_PCT)
    ok &= (b == n) | (np.abs(mean(b, end) - steady_mean) >= patterns.EDGE_MIN_DIFF_PCT)
    cost = cost + penalty * ((a > 0).astype(float) + (b < n).astype(float))
    cost = np.where(ok, cost, np.inf)
    i, j = np.unravel_index(int(np.argmin(cost)), cost.shape)
    if not np.isfinite(cost[i, j]):
        return 0, n_all
    cut_a = 0 if i == 0 else int(valid[i])
    cut_b = n_all if j == n else int(valid[j])
    return cut_a, cut_b


LEVELS = [0.0, 5.0, 30.0, 50.0, 95.0, 100.0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(LEVELS)), st.integers(1, 80)),
                min_size=1, max_size=6),
       st.floats(0.0, 20.0), st.integers(0, 2**32 - 1))
def test_property_split_run_equals_the_search_over_every_pair(runs, noise, seed):
    """Stretches at a few levels (warm-ups, cool-downs, flat runs, buckets without a
    reading) with noise: the same cuts as the exhaustive search."""
    vals = np.array([np.nan if v is None else v for v, k in runs for _ in range(k)][:240])
    vals = vals + np.random.default_rng(seed).normal(0, noise, vals.shape[0])
    assert split_run(vals) == split_run_every_pair(vals)
