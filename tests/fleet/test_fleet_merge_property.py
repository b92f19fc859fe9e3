"""merge_pushdown, property-tested: however a fleet's answers are split by store (GPU) and
by time shard (chunk), the merge is the one-store answer, and the Usage built from it is the
same to the bit; a GPU two stores answer for is refused, or kept once with --dedupe."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.classify.pushdown import PushdownData, merge_pushdown, usage_from_pushdown
from gpuaudit.errors import InputError
from gpuaudit.schema import SeriesId

STEP = 15.0
T0 = 1_704_067_200.0


def _sid(g: int, pod: int | None) -> SeriesId:
    return SeriesId(host=f"h{g % 3}", gpu_uuid=f"GPU-{g:04d}", gpu_model="NVIDIA L4",
                    gpu_index=g % 4, mig_profile=None, namespace=None if pod is None else "ns",
                    pod=None if pod is None else f"p{pod}", container=None, labels=())


@st.composite
def fleets(draw: st.DrawFn) -> tuple[PushdownData, list[int], list[int]]:
    """One store's decoded answers, a store for each GPU and a time shard for each chunk."""
    gpus = draw(st.integers(1, 6))
    nchunks = draw(st.integers(1, 4))
    chunk = 240 * STEP
    chunks = [(T0 + i * chunk, T0 + (i + 1) * chunk - STEP) for i in range(nchunks)]
    ids = [_sid(g, p) for g in range(gpus) for p in draw(
        st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=1, max_size=2, unique=True))]
    values: dict[tuple[int, int], dict[str, float]] = {}
    for code in draw(st.permutations(range(len(ids)))):
        for i in range(nchunks):
            if not draw(st.booleans()):
                continue
            n = float(draw(st.integers(1, 240)))
            idle = float(draw(st.integers(0, int(n))))
            cb = n - idle
            first = chunks[i][0] + STEP * draw(st.integers(0, 240 - int(n)))
            values[(code, i)] = {
                "n": n, "idle": idle, "under": 0.0, "prod": 0.0, "cb": cb,
                "busy": cb * 95.0 + idle * 3.0, "unused": 0.0, "headroom": cb * 5.0,
                "runs": min(idle, 1.0), "u2": cb * 9025.0, "first": first,
                "last": first + (n - 1) * STEP,
                "sum_power": n * draw(st.floats(20, 70)), "cnt_power": n}
    data = PushdownData.from_rows(ids=ids, chunks=chunks, step_s=STEP, values=values,
                                  origin="one")
    data.fleet_util_sums = {"1h": (1234.0, 20.0)}
    stores = [draw(st.integers(0, 2)) for _ in range(gpus)]
    shards = [draw(st.integers(0, 1)) for _ in range(nchunks)]
    return data, stores, sorted(shards)


def _split(data: PushdownData, stores: list[int], shards: list[int]
           ) -> list[tuple[str, PushdownData]]:
    parts = []
    for s in sorted(set(stores)):
        for t in sorted(set(shards)):
            keep = [i for i, x in enumerate(shards) if x == t]
            vals = {(code, keep.index(i)): dict(v) for (code, i), v in data.rows().items()
                    if i in keep and stores[int(data.ids[code].gpu_uuid[4:])] == s}
            part = PushdownData.from_rows(ids=list(data.ids), chunks=[data.chunks[i] for i in keep],
                                          step_s=STEP, values=vals, origin=f"store {s}")
            if t == max(shards):
                first = s == min(stores)  # the fleet sums of one store, zero in the others
                part.fleet_util_sums = {"1h": (1234.0 if first else 0.0,
                                               20.0 if first else 0.0)}
            parts.append((f"s{s}", part))
    return parts


@settings(max_examples=60, deadline=None)
@given(fleets())
def test_any_split_merges_to_the_one_store_answer(case) -> None:  # type: ignore[no-untyped-def]
    data, stores, shards = case
    one = merge_pushdown([("one", data)])
    many = merge_pushdown(_split(data, stores, shards))
    assert many.chunks == one.chunks
    used = {data.ids[c] for c, _ in data.rows()}
    assert [s for s in many.ids if s in used] == [s for s in one.ids if s in used]
    code_one = {s: c for c, s in enumerate(one.ids)}
    code_many = {s: c for c, s in enumerate(many.ids)}
    assert {(one.ids[c], i): v for (c, i), v in one.rows().items()} == \
        {(many.ids[c], i): v for (c, i), v in many.rows().items()}
    assert many.fleet_util_pct == one.fleet_util_pct
    u1, d1 = usage_from_pushdown(one, by=("pod",))
    u2, d2 = usage_from_pushdown(many, by=("pod",))
    assert u1.cells.equals(u2.cells)
    assert d1.equals(d2)
    assert u1.series == u2.series
    assert code_one.keys() >= used and code_many.keys() >= used


def test_a_gpu_two_stores_answer_for_is_refused_or_kept_once() -> None:
    sid = _sid(1, None)
    chunk = [(T0, T0 + 100 * STEP)]

    def part(n: float) -> PushdownData:
        return PushdownData.from_rows(ids=[sid], chunks=chunk, step_s=STEP, origin="x", values={
            (0, 0): {"n": n, "idle": n, "under": 0.0, "prod": 0.0, "cb": 0.0, "busy": 0.0,
                     "first": T0, "last": T0 + (n - 1) * STEP}})

    with pytest.raises(InputError, match=r"GPU-0001 is in 2 stores \(a, b\)"):
        merge_pushdown([("a", part(50.0)), ("b", part(80.0))])
    kept = merge_pushdown([("a", part(50.0)), ("b", part(80.0))], dedupe=True)
    assert kept.rows()[(0, 0)]["n"] == 80.0
    assert [n.count for n in kept.notes if n.where == "--dedupe"] == [1]
    with pytest.raises(InputError, match="different steps"):
        other = part(10.0)
        other.step_s = 60.0
        merge_pushdown([("a", part(50.0)), ("b", other)])
