"""The packed subqueries: ``sum_over_time((U + K)[...])`` decodes into an exact count and the
sum of U (what Prometheus computes is a plain float64 running sum, replayed here); the
two-step window answers decode into idle runs, step change and first/last point."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.classify.pushdown_queries import NARROWED, decode, pack_base, straddles, unpack
from gpuaudit.errors import InputError
from gpuaudit.promql import alternation as _regex


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


def _answers(u: list[float | None]) -> dict[str, float]:
    """What the pushdown queries of one chunk answer for one series, computed the way
    Prometheus evaluates them. ``u[0]`` is the step before the chunk (its window reaches
    back there), ``u[1:]`` the chunk's steps; None: no sample at that step. Samples sit
    on the steps, so a two-step window ``[2s-1ms]`` holds this step's and the previous."""
    pts = [x for x in u[1:] if x is not None]
    base = pack_base(len(u) - 1)
    a = {"n": float(len(pts)), "sum": float(sum(pts)),
         "lo": _running_sum(np.array([x for x in pts if x < 10]), base),
         "hi": _running_sum(np.array([x for x in pts if x >= 70]), base),
         "top": float(sum(x >= 90 for x in pts)), "std": float(np.std(pts)) if pts else 0.0,
         "idle_pairs": 0.0, "edges": 0.0, "absstep": 0.0}
    flagged = []
    for i in range(1, len(u)):
        w = [x for x in (u[i - 1], u[i]) if x is not None]
        if not w:
            continue
        a["idle_pairs"] += max(w) < 10
        a["absstep"] += max(w) - min(w)
        if len(w) == 1:
            a["edges"] += 1
            flagged.append(i)
    if u[1] is not None:
        a["first"] = 1.0
    elif [i for i in flagged if i > 1]:
        a["first"] = float(min(i for i in flagged if i > 1))
    if u[-1] is not None:
        a["last"] = float(len(u) - 1)
    elif flagged:
        a["last"] = float(max(flagged) - 1)
    raw = [x for x in u if x is not None]  # the chunk and the step before it
    if pts:
        a["umin"], a["umax"] = float(min(raw)), float(max(raw))
    return {k: v for k, v in a.items()
            if not (k in ("lo", "hi", "top", "idle_pairs") and v == 0.0)}


def test_decode_phases_from_thresholds():
    step = 15.0
    u = [None, 0, 5, 10, 69, 70, 89, 90, 100]
    v = _answers(u)
    decode(v, 8 * step, step, where="test")
    assert (v["idle"], v["under"], v["prod"], v["cb"], v["n"]) == (2, 2, 2, 2, 8)
    x = np.array(u[1:], float)
    assert v["busy"] == x.sum()
    assert v["unused"] == (100 - 10) + (100 - 69)
    assert v["headroom"] == (100 - 70) + (100 - 89) + (100 - 90) + 0
    assert v["u2"] == pytest.approx(float((x**2).sum()))
    assert v["runs"] == 1
    assert v["absstep"] == np.abs(np.diff(x)).sum()


def _true_runs(u: list[float | None]) -> int:
    """Idle runs of the chunk's points as the local engine counts them (an idle point after
    a non-idle or missing one starts a run; the step before the chunk continues one)."""
    runs = 0
    for i in range(1, len(u)):
        if u[i] is not None and u[i] < 10 and (u[i - 1] is None or u[i - 1] >= 10):
            runs += 1
    return runs


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 100).map(float),
                          st.sampled_from([0.0, 3.0, 100.0])), min_size=2, max_size=60))
def test_window_answers_decode_to_the_series_truth(u):
    """Idle runs are never undercounted (exact when the series is present at every step and
    the one before), the step change is the sum of |u - previous u| over consecutive steps,
    and first/last are the first and last steps with a point."""
    v = _answers(u)
    first, last = v.pop("first", None), v.pop("last", None)
    if "n" in v and v["n"] == 0:
        v.pop("n")
    decode(v, (len(u) - 1) * 15.0, 15.0, where="test")
    pts = [i for i in range(1, len(u)) if u[i] is not None]
    if not pts:
        return
    assert (first, last) == (pts[0], pts[-1])
    truth = _true_runs(u)
    assert truth <= v["runs"] <= v["idle"]
    if all(x is not None for x in u):
        assert v["runs"] == truth
    pairs = [abs(u[i] - u[i - 1]) for i in range(1, len(u))
             if u[i] is not None and u[i - 1] is not None]
    assert v["absstep"] == sum(pairs)
    assert v["idle"] + v["under"] + v["prod"] + v["cb"] == v["n"] == len(pts)


@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=5, unique=True))
def test_uuid_regex_matches_exactly_the_values(values):
    import re

    pat = re.compile(_regex(values), re.DOTALL)
    for v in values:
        assert pat.fullmatch(v)
    assert not pat.fullmatch("".join(values) + "x")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 100).map(float),
                          st.sampled_from([0.0, 5.0, 50.0, 95.0])), min_size=2, max_size=40))
def test_skipped_threshold_queries_decode_the_same(u):
    """A threshold query left out because the series' extremes are on one side of it gives
    the same figures as asking it."""
    full = _answers(u)
    full.pop("first", None)
    full.pop("last", None)
    if not full.get("n"):
        return
    narrowed = {k: x for k, x in full.items() if k not in NARROWED or straddles(full, k)}
    decode(full, (len(u) - 1) * 15.0, 15.0, where="test")
    decode(narrowed, (len(u) - 1) * 15.0, 15.0, where="test")
    assert narrowed == full


@st.composite
def _rows(draw: st.DrawFn) -> list[dict[str, float]]:
    """Answer rows of several series and chunk lengths: some with threshold queries left
    out (narrowed), some with an SM view, the several-samples forms, signals, or no
    utilization reading at all."""
    out = []
    for _ in range(draw(st.integers(1, 8))):
        u = draw(st.lists(st.one_of(st.none(), st.integers(0, 100).map(float),
                                    st.sampled_from([0.0, 5.0, 95.0])), min_size=2,
                          max_size=30))
        v = _answers(u)
        if draw(st.booleans()):  # second pass by need
            v = {k: x for k, x in v.items() if k not in NARROWED or straddles(v, k)}
        if draw(st.booleans()) and "n" in v:  # an SM view: the same points as ratios
            for name in ("n", "sum", "umin", "umax"):
                if name in v:
                    v[f"sm_{name}"] = v[name] / (1.0 if name == "n" else 100.0)
        if draw(st.booleans()):
            v["changes"] = float(draw(st.integers(0, 9)))
        if draw(st.booleans()):
            v["sum_power"], v["cnt_power"] = 40.0 * len(u), float(len(u))
        if draw(st.booleans()):  # signals only: no utilization view, so no threshold answer
            v = {k: x for k, x in v.items()
                 if k not in ("n", "sum", "umin", "umax", *NARROWED) and not k.startswith("sm_")}
        v["_points"] = float(len(u) - 1)
        out.append(v)
    return out


@settings(max_examples=200, deadline=None)
@given(_rows())
def test_columnar_decode_is_the_per_row_decode(rows):
    """decode_columns over all rows at once gives every row what decode gives it alone."""
    from gpuaudit.classify.pushdown_columns import Answers, decode_columns

    step = 15.0
    lengths = np.array([r.pop("_points") * step for r in rows])
    ans = Answers.from_rows(len(rows), {(0, i): r for i, r in enumerate(rows)})
    decode_columns(ans, lengths[ans.chunk], step, where=lambda r: f"row {r}")
    want = []
    for r, length in zip(rows, lengths):
        v = dict(r)
        decode(v, float(length), step, where="test")
        want.append(v)
    got = [ans.row_dict(i) for i in range(ans.rows)]
    assert got == want


def test_columnar_decode_names_the_row_with_a_reading_over_100_pct():
    from gpuaudit.classify.pushdown_columns import Answers, decode_columns

    base = pack_base(10)
    good = {"n": 2.0, "sum": 20.0, "umin": 5.0, "umax": 15.0, "lo": base + 5.0}
    bad = {"n": 2.0, "sum": 300.0, "umin": 5.0, "umax": 150.0,
           "lo": _running_sum(np.array([150.0, 150.0]), base)}
    ans = Answers.from_rows(2, {(0, 0): good, (0, 1): bad})
    with pytest.raises(InputError, match=r"outside 0\.\.100") as err:
        decode_columns(ans, np.full(2, 10 * 15.0), 15.0, where=lambda r: f"row {r}")
    assert err.value.where == "row 1"
