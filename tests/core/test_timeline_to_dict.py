"""``Timeline.to_dict``'s lists are built without a call per value (``rint(10 v) / 10`` where
that is Python's ``round(v, 1)``, ``round`` itself near a half): the same values, float for
float, as the plain comprehension gave."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gpuaudit.classify.usage import Timeline


def plain(util: np.ndarray, phase: np.ndarray) -> list[dict[str, object]]:
    return [{"util_pct": [None if math.isnan(x) else round(float(x), 1) for x in u.tolist()],
             "phase": [None if p < 0 else int(p) for p in ph.tolist()]}
            for u, ph in zip(util, phase)]


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (a == b and math.copysign(1, a) == math.copysign(1, b)) or (a != a and b != b)
    return type(a) is type(b) and a == b


# the halves on purpose: k / 10 + 0.05 sits on a rounding edge of round(v, 1)
_values = st.one_of(st.floats(-1e3, 1e3), st.floats(allow_nan=True, allow_infinity=True),
                    st.integers(-2000, 2000).map(lambda k: k / 10 + 0.05),
                    st.integers(-2000, 2000).map(lambda k: k / 100), st.just(-0.0),
                    st.floats(0, 100).map(lambda v: np.nextafter(v, 200.0)))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5).flatmap(lambda g: st.integers(1, 8).flatmap(lambda b: st.tuples(
    arrays(np.float64, (g, b), elements=_values),
    arrays(np.int8, (g, b), elements=st.integers(-1, 3)))))
)
def test_the_lists_are_the_plain_comprehension(arrs):
    util, phase = arrs
    g, b = util.shape
    tl = Timeline(start=datetime(2026, 1, 1, tzinfo=timezone.utc), bucket_s=60.0,
                  gpu_uuids=tuple(f"g{i}" for i in range(g)), hosts=("h",) * g,
                  util_pct=util, phase=phase, observed_s=np.ones((g, b)), hist_s=np.zeros(20))
    got = tl.to_dict()["gpus"]
    want = plain(util, phase)
    for row, ref in zip(got, want):
        assert len(row["util_pct"]) == len(ref["util_pct"])
        assert all(same(x, y) for x, y in zip(row["util_pct"], ref["util_pct"]))
        assert row["phase"] == ref["phase"]
        assert all(type(x) is type(y) for x, y in zip(row["phase"], ref["phase"]))
