"""The columnar pricing (price/cost.py: priced seconds summed as integers per rate, one
Decimal product per line) against the per-cell Decimal pricing it replaced (a line per cell,
``dec(seconds) x rate / 3600``, summed): the same dollars to 1e-18 and the same cents, the
same seconds (added in the same order), on random cells with several GPU models."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.classify.usage import CELL_VALUE_COLUMNS, PHASES, CellColumns, PhaseTime
from gpuaudit.price.catalog import Rate
from gpuaudit.price.cost import cost_lines
from gpuaudit.price.money import SECONDS_PER_HOUR, dec

RATES = {"L4": Rate(usd_per_gpu_hour=Decimal("0.71"), purchase="on-demand", source="test", as_of="2026-01-01"),
         "H100": Rate(usd_per_gpu_hour=Decimal("3.933"), purchase="on-demand", source="test", as_of="2026-01-01"),
         None: Rate(usd_per_gpu_hour=Decimal("1.37"), purchase="on-demand", source="test", as_of="2026-01-01")}


def _reference(rows: list[dict[str, object]], keys: list[str]) -> dict[tuple[object, ...], dict[str, object]]:
    """The per-cell pricing as price/cost.py did it before (commit e1dfd44)."""
    out: dict[tuple[object, ...], dict[str, object]] = {}
    for row in rows:
        t = PhaseTime(**{c: row[c] for c in CELL_VALUE_COLUMNS})  # type: ignore[arg-type]
        rate = RATES.get(row["gpu_model"]) or RATES[None]  # type: ignore[call-overload]
        per_s = rate.usd_per_gpu_hour / SECONDS_PER_HOUR
        key = tuple(row[k] for k in keys)
        acc = out.setdefault(key, {"times": [], **{p: Decimal(0) for p in (*PHASES, "unobs", "uu", "head")}})
        acc["times"].append(t)  # type: ignore[attr-defined]
        for p in PHASES:
            acc[p] += dec(getattr(t, f"{p}_s")) * per_s  # type: ignore[operator]
        acc["unobs"] += dec(t.unobserved_s) * per_s  # type: ignore[operator]
        acc["uu"] += dec(t.underutilized_unused_s) * per_s  # type: ignore[operator]
        acc["head"] += dec(t.headroom_s) * per_s  # type: ignore[operator]
    return out


_secs = st.one_of(st.integers(0, 604_800).map(float),
                  st.floats(0.0, 604_800.0, allow_nan=False),
                  st.integers(0, 40_320).map(lambda k: k * 15.0))


@st.composite
def _cells(draw: st.DrawFn) -> list[dict[str, object]]:
    n = draw(st.integers(1, 40))
    rows = []
    for _ in range(n):
        row: dict[str, object] = {c: draw(_secs) for c in CELL_VALUE_COLUMNS}
        row["samples"] = draw(st.integers(0, 50_000))
        row["gpu_model"] = draw(st.sampled_from(["L4", "H100", None, "A10G"]))
        row["team"] = draw(st.sampled_from(["a", "b", None]))
        row["gpu_uuid"] = draw(st.sampled_from(["g1", "g2", "g3"]))
        rows.append(row)
    return rows


@settings(max_examples=150, deadline=None)
@given(_cells(), st.sampled_from([[], ["team"], ["gpu_uuid"], ["team", "gpu_uuid"]]),
       st.booleans())
def test_columnar_pricing_equals_the_per_cell_pricing(rows: list[dict[str, object]],
                                                      keys: list[str], plain: bool) -> None:
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    cells: object = CellColumns(cols) if plain else pa.table(
        {k: pa.array(v, type=pa.int64() if k == "samples" else pa.float64()
                     if k in CELL_VALUE_COLUMNS else pa.string()) for k, v in cols.items()})
    lines = cost_lines(cells, RATES, keys)  # type: ignore[arg-type]
    ref = _reference(rows, keys)
    assert {ln.key for ln in lines} == set(ref)
    tiny = Decimal("1e-18")
    for ln in lines:
        r = ref[ln.key]
        assert ln.time == PhaseTime.total(r["times"])  # type: ignore[arg-type]
        for p in PHASES:
            assert abs(ln.phase_cost[p] - r[p]) < tiny  # type: ignore[operator]
        assert abs(ln.unobserved_cost - r["unobs"]) < tiny  # type: ignore[operator]
        assert abs(ln.underutilized_waste - r["uu"]) < tiny  # type: ignore[operator]
        assert abs(ln.headroom_cost - r["head"]) < tiny  # type: ignore[operator]
    costs = [ln.observed_cost for ln in lines]
    assert costs == sorted(costs, reverse=True)
