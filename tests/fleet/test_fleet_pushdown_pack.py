"""The packed subqueries: ``sum_over_time((U + K)[...])`` decodes into an exact count and the
sum of U (what Prometheus computes is a plain float64 running sum, replayed here)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.errors import InputError
from gpuaudit.measure.pushdown import _regex, decode, pack_base, unpack


def _running_sum(values: np.ndarray, base: float) -> float:
    total = 0.0
    for x in values:  # Prometheus sums in order, one float64 addition per point
        total += float(x) + base
    return total


@settings(max_examples=200, deadline=None)
@given(points=st.integers(1, 11_000), data=st.data())
def test_integer_utilization_unpacks_exactly(points, data):
    n = data.draw(st.integers(0, points))
    # up to 11,000 values: drawn from a seed (a hypothesis list that long cannot be generated)
    seed = data.draw(st.integers(0, 2**32 - 1))
    u = np.random.default_rng(seed).integers(0, 101, n).astype(float)
    u[: n // 4] = data.draw(st.sampled_from([0.0, 100.0]))  # runs at the extremes
    base = pack_base(points)
    count, total = unpack(_running_sum(u, base), base, where="test")
    assert count == n
    assert total == u.sum()


@settings(max_examples=200, deadline=None)
@given(points=st.integers(1, 11_000), data=st.data())
def test_fractional_utilization_count_exact_sum_close(points, data):
    n = data.draw(st.integers(1, points))
    seed = data.draw(st.integers(0, 2**32 - 1))
    u = np.random.default_rng(seed).uniform(0.0, 100.0, n)
    u[: n // 3] = 0.0  # idle points: the sum may be tiny next to count * K
    base = pack_base(points)
    count, total = unpack(_running_sum(u, base), base, where="test")
    assert count == n
    assert total == pytest.approx(u.sum(), rel=1e-9, abs=1e-3)


def test_readings_above_100_pct_are_an_error_not_a_wrong_count():
    base = pack_base(10)
    with pytest.raises(InputError, match=r"outside 0\.\.100"):
        unpack(_running_sum(np.array([150.0, 150.0]), base), base, where="series x")


def test_decode_phases_from_thresholds():
    step, points = 15.0, 8
    u = np.array([0, 5, 10, 69, 70, 89, 90, 100], float)
    base = pack_base(points)
    v = {"p_all": _running_sum(u, base), "std": float(u.std()),
         "p10": _running_sum(u[u < 10], base), "p70": _running_sum(u[u < 70], base),
         "p90": _running_sum(u[u < 90], base)}
    decode(v, points * step, step, where="test")
    assert (v["idle"], v["under"], v["prod"], v["cb"], v["n"]) == (2, 2, 2, 2, 8)
    assert v["busy"] == u.sum()
    assert v["unused"] == (100 - 10) + (100 - 69)
    assert v["headroom"] == (100 - 70) + (100 - 89) + (100 - 90) + 0
    assert v["u2"] == pytest.approx(float((u**2).sum()))


@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=5, unique=True))
def test_uuid_regex_matches_exactly_the_values(values):
    import re

    pat = re.compile(_regex(values), re.DOTALL)
    for v in values:
        assert pat.fullmatch(v)
    assert not pat.fullmatch("".join(values) + "x")
