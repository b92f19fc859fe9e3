"""``usage_hours`` groups the hourly cells by integer codes and numpy (issue 27's bill row:
Acero's hash grouping of 720,000 cells was ~1 s on one core after classify): the same rows
as Acero's ``group_by(..., use_threads=False)`` (in order of first appearance, where Acero's
order is its hash table's: the join reads the relation as a set), and the same milliseconds
as Arrow's rounding (ties to even)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.price.billing.allocate import _ms, group_sums, usage_hours


def _acero(t: pa.Table, group: list[str], sums: list[str]) -> pa.Table:
    return t.group_by(group, use_threads=False).aggregate([(c, "sum") for c in sums])


def _sorted(t: pa.Table, keys: list[str]) -> pa.Table:
    return t.sort_by([(k, "ascending") for k in keys])


def _first_seen_order(t: pa.Table, keys: list[str], source: pa.Table) -> bool:
    """Whether ``t``'s groups come in the order their keys first appear in ``source``."""
    seen: dict[tuple[Any, ...], int] = {}
    for i, r in enumerate(source.select(keys).to_pylist()):
        seen.setdefault(tuple(r.values()), i)
    firsts = [seen[tuple(r.values())] for r in t.select(keys).to_pylist()]
    return firsts == sorted(firsts)


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["h1", "h2", "h3", None]),
                               st.integers(0, 5), st.booleans(),
                               st.sampled_from(["a", "b", None]),
                               st.integers(-10**6, 10**9), st.integers(0, 3600000)),
                     min_size=1, max_size=80))
def test_group_sums_equal_acero(rows: list[tuple[Any, ...]]) -> None:
    t = pa.table({
        "host": pa.array([r[0] for r in rows], pa.string()),
        "period_start": pa.array([1_790_812_800 + 3600 * r[1] for r in rows], pa.int64()).cast(
            pa.timestamp("s", "UTC")),
        "held": pa.array([r[2] for r in rows]),
        "g_0": pa.array([r[3] for r in rows], pa.string()),
        "x_ms": pa.array([r[4] for r in rows], pa.int64()),
        "y_ms": pa.array([r[5] for r in rows], pa.int64()),
    })
    group = ["host", "period_start", "held", "g_0"]
    got = group_sums(t, group, ["x_ms", "y_ms"])
    want = _acero(t, group, ["x_ms", "y_ms"])
    assert _sorted(got, group).equals(_sorted(want, group))
    assert _first_seen_order(got, group, t)


def test_group_sums_leave_nulls_and_floats_to_acero() -> None:
    t = pa.table({"k": ["a", "b", "a"], "x": pa.array([1, None, 2], pa.int64()),
                  "f": [0.1, 0.2, 0.3]})
    assert group_sums(t, ["k"], ["x"]).equals(_acero(t, ["k"], ["x"]))
    assert group_sums(t, ["k"], ["f"]).equals(_acero(t, ["k"], ["f"]))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 1e7, allow_nan=False),
                          st.integers(0, 10**7).map(lambda k: k / 1000 + 0.0005),
                          st.integers(0, 10**6).map(lambda k: k + 0.5)),
                min_size=1, max_size=50))
def test_ms_rounds_as_arrow(seconds: list[float]) -> None:
    arr = pa.array(seconds, pa.float64())
    want = pc.cast(pc.round(pc.multiply(arr, 1000.0)), pa.int64())
    assert _ms(arr).equals(want)
    assert _ms(pa.chunked_array([arr])).equals(want)


def test_usage_hours_equal_the_acero_grouping() -> None:
    rng = np.random.default_rng(3)
    n = 5000
    gpu = rng.integers(0, 40, n)
    cells = pa.table({
        "gpu_uuid": pa.array([f"GPU-{g}" for g in gpu]),
        "host": pa.array([f"node-{g // 8}" for g in gpu]),
        "gpu_model": pa.array(["H100"] * n),
        "namespace": pa.array([None if g % 10 == 9 else f"team-{g % 3}" for g in gpu],
                              pa.string()),
        "pod": pa.array([None if g % 10 == 9 else f"job-{g}" for g in gpu], pa.string()),
        "period:3600": pa.array([str(1_790_812_800 + 3600 * int(h))
                                 for h in rng.integers(0, 50, n)]),
        **{c: pa.array(rng.integers(0, 3600, n) * rng.random(n))
           for c in ("idle_s", "underutilized_s", "productive_s", "compute_bound_s", "gap_s",
                     "no_reading_s", "underutilized_unused_s", "headroom_s", "busy_s")},
    })
    got = usage_hours(cells, ["namespace"])
    # the relation as it was built before: Arrow's rounding, Acero's grouping
    import gpuaudit.price.billing.allocate as al

    t = pa.table({
        "host": cells.column("host"),
        "period_start": pc.cast(pc.cast(cells.column("period:3600"), pa.int64()),
                                pa.timestamp("s", tz="UTC")),
        "held": pc.is_valid(cells.column("pod")),
        "g_0": pc.if_else(pc.is_valid(cells.column("pod")),
                          pc.fill_null(cells.column("namespace"), al.UNATTRIBUTED),
                          pa.scalar(None, pa.string())),
        **{o: pc.cast(pc.round(pc.multiply(cells.column(s), 1000.0)), pa.int64())
           for o, s in al._VALUE.items()},
        "unobserved_ms": pc.cast(pc.round(pc.multiply(
            pc.add(cells.column("gap_s"), cells.column("no_reading_s")), 1000.0)), pa.int64()),
    })
    want = _acero(t, ["host", "period_start", "held", "g_0"], [*al._VALUE, "unobserved_ms"])
    want = want.rename_columns([c[:-4] if c.endswith("_sum") else c
                                for c in want.column_names])
    keys = ["host", "period_start", "held", "g_0"]
    assert got.schema == want.schema
    assert _sorted(got, keys).equals(_sorted(want, keys))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=200),
       st.sampled_from([1, 10**15]))
def test_first_seen_groups(values: list[int], scale: int) -> None:
    """Groups numbered in order of first appearance, by direct address (a small range) or by
    a sort (``scale``: keys spread over a range far larger than the rows)."""
    from gpuaudit.classify.coding import first_seen_groups

    key = np.array(values, dtype=np.int64) * scale
    gid, first = first_seen_groups(key)
    order = list(dict.fromkeys(key.tolist()))
    assert gid.tolist() == [order.index(k) for k in key.tolist()]
    assert first.tolist() == [key.tolist().index(k) for k in order]
