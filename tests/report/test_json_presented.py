"""``report.json.presented`` (floats to 15 significant digits, the JSON report's one rounding)
gives, value for value, what the plain recursive form gives: it passes scalars without a call
and formats each distinct float once, which must change nothing (zeros keep their sign, NaN
and the infinities pass as they are, numpy's floats are floats)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.report.json import presented


def plain(value: Any) -> Any:
    """The form the report had: one call per value."""
    if isinstance(value, float):
        return float(f"{value:.15g}") if value == value and value not in (
            float("inf"), float("-inf")) else value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def same(a: Any, b: Any) -> bool:
    """Equal, type for type, with NaN equal to NaN and 0.0 apart from -0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


# repeated values on purpose: the memo must hand back what a fresh formatting gives
_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.0, -0.0, 0.1 * 3, 0.331 * 3, 1e-300, 123456789.123456789,
                                     float("nan"), float("inf"), -float("inf")]),
                    st.floats(0, 100).map(lambda x: round(x, 1)))
_scalars = st.one_of(_floats, _floats.map(np.float64), st.integers(), st.booleans(),
                     st.none(), st.text(max_size=3))
_docs = st.recursive(_scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=6), st.lists(kids, max_size=6).map(tuple),
    st.dictionaries(st.text(max_size=3), kids, max_size=5)), max_leaves=60)


@settings(max_examples=300, deadline=None)
@given(_docs)
def test_presented_is_the_plain_recursive_form(doc):
    out = presented(doc)
    assert same(out, plain(doc))
    assert json.dumps(out, default=str) == json.dumps(plain(doc), default=str)


def test_presented_keeps_the_sign_of_zero_after_a_plain_zero():
    out = presented([0.0, -0.0, 0.0, -0.0, np.float64(-0.0)])
    assert [math.copysign(1.0, x) for x in out] == [1.0, -1.0, 1.0, -1.0, -1.0]
    assert presented([0.9930000000000001, 0.9930000000000001]) == [0.993, 0.993]
