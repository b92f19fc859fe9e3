"""The JSON report's text: encoded in C and re-indented (issue 27), byte for byte what
``json.dumps(doc, indent=2, default=str)`` writes, for any document."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.report.json import indented

scalars = (st.none() | st.booleans() | st.integers() | st.floats()
           | st.text() | st.decimals(allow_nan=False, places=4)
           | st.datetimes(timezones=st.just(timezone.utc)))
docs = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(docs)
def test_same_bytes_as_the_standard_library(doc: object) -> None:
    assert indented(doc) == json.dumps(doc, indent=2, default=str) + "\n"


def test_values_the_fast_path_cannot_read_fall_back() -> None:
    doc = {"a": float("nan"), "b": [float("inf"), Decimal("1.50")],
           "c": datetime(2026, 1, 1, tzinfo=timezone.utc), "d": "\u00e9\n", "e": {}, "f": []}
    assert indented(doc) == json.dumps(doc, indent=2, default=str) + "\n"
