"""Price a :class:`~gpuaudit.classify.Usage`: what the GPU time cost and how much was waste.

Rules (docs/money.md walks through each with numbers):
- cost of a phase = its GPU-seconds x the GPU's rate / 3600, in Decimal;
- observed cost = the four phase costs + the unobserved cost, exactly;
- waste = idle cost + the unused share of underutilized cost; productive and compute-bound
  time are not waste (their unused share is reported as headroom); unobserved time is billed,
  never waste;
- one hourly figure (cost per wall-clock hour of the window, to 1/100 cent) feeds the daily,
  monthly (x 720) and yearly (x 8,760) projections;
- effective GPU-hours = GPU-hours x utilization; unit costs when the user gives counts;
  energy from the GPU's energy counter (else power x time) at a given $/kWh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np

from gpuaudit.classify.usage import (
    CELL_VALUE_COLUMNS,
    PHASES,
    CellColumns,
    Cells,
    PhaseTime,
    Usage,
)
from gpuaudit.errors import PricingError
from gpuaudit.price.catalog import Rate
from gpuaudit.price.money import (
    HOURS_PER_MONTH,
    J_PER_KWH,
    SECONDS_PER_HOUR,
    allocate_cents,
    cents,
    dec,
    hourly,
    projections,
)
from gpuaudit.validate import ENERGY_USD_PER_KWH, check_counts

__all__ = ["CentLine", "CostLine", "CostReport", "Energy", "cost_lines", "price_usage"]

ZERO = Decimal(0)
UNIT_COST_QUANTUM = Decimal("0.000001")


@dataclass(frozen=True)
class CentLine:
    """A :class:`CostLine` as every report shows it, to the cent, rounded in one place.

    The four phase costs and the unobserved cost are rounded by largest remainder so they
    sum to ``observed`` exactly; ``waste`` is the waste to the cent (never below the idle
    cost), ``idle`` is the rounded idle cost the phase table shows, and
    ``underutilized_waste`` is the rest, so ``idle + underutilized_waste == waste`` exactly
    (a reader adding the parts gets the whole); every renderer (terminal, Markdown, HTML,
    JSON) prints these values and no other rounding of the same figure.
    """

    observed: Decimal
    phase: Mapping[str, Decimal]
    unobserved: Decimal
    idle: Decimal
    underutilized_waste: Decimal
    waste: Decimal
    headroom: Decimal


@dataclass(frozen=True)
class CostLine:
    """Cost of one slice of GPU time (a GPU, a group, or everything), unrounded Decimal USD."""

    key: tuple[str | None, ...]
    time: PhaseTime
    phase_cost: Mapping[str, Decimal]
    unobserved_cost: Decimal
    underutilized_waste: Decimal
    headroom_cost: Decimal

    @classmethod
    def empty(cls, key: tuple[str | None, ...] = ()) -> CostLine:
        """A line with no time and no cost."""
        return cls(key=key, time=PhaseTime(), phase_cost={p: ZERO for p in PHASES},
                   unobserved_cost=ZERO, underutilized_waste=ZERO, headroom_cost=ZERO)

    @property
    def observed_cost(self) -> Decimal:
        """Everything billed for this slice: phases plus unobserved."""
        return sum(self.phase_cost.values(), ZERO) + self.unobserved_cost

    @property
    def waste(self) -> Decimal:
        return self.phase_cost["idle"] + self.underutilized_waste

    @property
    def gpu_hours(self) -> Decimal:
        return dec(self.time.total_s) / SECONDS_PER_HOUR

    @property
    def effective_gpu_hours(self) -> Decimal:
        return dec(self.time.busy_s) / SECONDS_PER_HOUR

    @property
    def waste_share(self) -> float:
        c = self.observed_cost
        return float(self.waste / c) if c > 0 else 0.0

    def in_cents(self) -> CentLine:
        """This line to the cent: the one rounding every report shows (see :class:`CentLine`)."""
        parts = allocate_cents([self.phase_cost[p] for p in PHASES] + [self.unobserved_cost])
        phase = dict(zip(PHASES, parts[:4]))
        # waste to the cent, split into the idle cost the phase table shows and the rest
        waste = max(cents(self.waste), phase["idle"])
        return CentLine(
            observed=sum(parts, ZERO), phase=phase, unobserved=parts[4], idle=phase["idle"],
            underutilized_waste=waste - phase["idle"], waste=waste,
            headroom=cents(self.headroom_cost),
        )


@dataclass(frozen=True)
class Energy:
    kwh: Decimal
    method: str  # "energy counter" or "power x time"
    usd_per_kwh: Decimal | None
    cost: Decimal | None


@dataclass(frozen=True)
class CostReport:
    """The price stage's output. Figures are unrounded; render rounds (money.allocate_cents)."""

    currency: str
    rates: Mapping[str | None, Rate]
    total: CostLine
    per_gpu: tuple[CostLine, ...]
    per_group: tuple[CostLine, ...]
    group_keys: tuple[str, ...]
    wall_hours: Decimal
    hourly_cost: Decimal
    hourly_waste: Decimal
    unit_costs: Mapping[str, Decimal] = field(default_factory=dict)
    counts: Mapping[str, Decimal] = field(default_factory=dict)
    energy: Energy | None = None

    @property
    def cost_projection(self) -> dict[str, Decimal]:
        return projections(self.hourly_cost)

    @property
    def waste_projection(self) -> dict[str, Decimal]:
        return projections(self.hourly_waste)

    @property
    def cost_per_effective_gpu_hour(self) -> Decimal | None:
        """A rate, to a hundredth of a cent like every per-hour figure."""
        eff = self.total.effective_gpu_hours
        return hourly(self.total.observed_cost / eff) if eff > 0 else None

    @property
    def unit_costs_shown(self) -> dict[str, Decimal]:
        """Cost per unit of work (a rate), to a millionth of a dollar: the figure every
        report shows."""
        return {k: v.quantize(UNIT_COST_QUANTUM) for k, v in self.unit_costs.items()}

    @property
    def monthly_cost(self) -> Decimal:
        return self.hourly_cost * HOURS_PER_MONTH


#: the per-cell seconds that are priced: each phase, unobserved time (gap + no reading, added
#: per cell as :attr:`PhaseTime.unobserved_s` adds them), and the two unused shares
_MONEY = (*PHASES, "unobserved", "underutilized_unused", "headroom")
_NS = 10**9


@dataclass(frozen=True)
class _PricedCells:
    """Cells ready to roll up, columnar: per cell its key values, its rate (an index into
    ``per_s``), its :data:`CELL_VALUE_COLUMNS` as floats and its priced seconds as whole
    seconds + nanoseconds (integers: sums of them are exact)."""

    keys: dict[str, list[Any]]
    rate: np.ndarray
    per_s: list[Decimal]
    time: dict[str, np.ndarray]
    whole_s: dict[str, np.ndarray]
    frac_ns: dict[str, np.ndarray]

    @property
    def n(self) -> int:
        return int(self.rate.shape[0])


def _columns_of(table: Cells, names: Sequence[str]) -> dict[str, list[Any] | np.ndarray]:
    """The ``names`` columns present: value columns as float64 arrays, the others as lists."""
    out: dict[str, list[Any] | np.ndarray] = {}
    if isinstance(table, CellColumns):
        for name in dict.fromkeys(names):
            if name in table.columns:
                col = table.columns[name]
                out[name] = np.asarray(col, dtype=np.float64) if name in CELL_VALUE_COLUMNS \
                    else list(col)
        return out
    for name in dict.fromkeys(names):
        if name not in table.column_names:
            continue
        col = table.column(name)
        if name in CELL_VALUE_COLUMNS:
            out[name] = np.asarray(col.to_numpy(), dtype=np.float64)
        else:
            out[name] = col.to_pylist()
    return out


def _priced_cells(cells: Cells, rates: Mapping[str | None, Rate],
                  key_names: Sequence[str]) -> _PricedCells:
    """Each cell (a :attr:`Usage.cells` row) with its GPU model's rate and its
    ``key_names`` values for rolling up. A priced second is the cell's float seconds to the
    nanosecond (as :func:`~gpuaudit.price.money.dec` takes them), kept as integers."""
    n = cells.num_rows
    cols = _columns_of(cells, [*key_names, "gpu_model", *CELL_VALUE_COLUMNS])
    models = cols.get("gpu_model")
    model_list: list[Any] = list(models) if models is not None else [None] * n
    per_s: list[Decimal] = []
    index: dict[Any, int] = {}
    rate_of = np.empty(n, dtype=np.int64)
    for i, model in enumerate(model_list):
        r = index.get(model)
        if r is None:
            rate = rates.get(model) or rates.get(None)
            if rate is None:
                raise PricingError(f"no rate for GPU model {model!r}",
                                   fix="pass --gpu-model or --price")
            r = index[model] = len(per_s)
            per_s.append(rate.usd_per_gpu_hour / SECONDS_PER_HOUR)
        rate_of[i] = r
    time = {c: np.asarray(cols[c], dtype=np.float64) if c in cols else np.zeros(n)
            for c in CELL_VALUE_COLUMNS}
    money = {p: time[f"{p}_s"] for p in PHASES}
    money["unobserved"] = time["gap_s"] + time["no_reading_s"]
    money["underutilized_unused"] = time["underutilized_unused_s"]
    money["headroom"] = time["headroom_s"]
    whole: dict[str, np.ndarray] = {}
    frac: dict[str, np.ndarray] = {}
    for name, x in money.items():
        if not np.isfinite(x).all():
            raise PricingError(f"a cell's {name} seconds are not finite",
                               fix="report this: classify gave a cell no finite time")
        w = np.floor(x)
        whole[name] = w.astype(np.int64)
        frac[name] = np.rint((x - w) * 1e9).astype(np.int64)
    keys = {k: list(cols[k]) if k in cols else [None] * n for k in key_names}
    return _PricedCells(keys, rate_of, per_s, time, whole, frac)


def _bucket_ids(priced: _PricedCells, names: Sequence[str],
                ) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    """Each cell's bucket (its ``names`` values), buckets numbered by first appearance."""
    if not names:
        return np.zeros(priced.n, dtype=np.int64), [()]
    index: dict[tuple[Any, ...], int] = {}
    ids = np.empty(priced.n, dtype=np.int64)
    for i, key in enumerate(zip(*(priced.keys[k] for k in names))):
        b = index.get(key)
        if b is None:
            b = index[key] = len(index)
        ids[i] = b
    return ids, list(index)


def _rollup(priced: _PricedCells, names: Sequence[str], *, label: tuple[str, ...] | None = None,
            ) -> tuple[CostLine, ...]:
    """The cells summed by ``names`` (``label``: the key of the one line when ``names`` is
    empty), most costly first. Seconds add as floats in cell order (as
    :meth:`PhaseTime.total` adds them); dollars are the exact sum of the priced seconds of
    each rate x its per-second price."""
    if priced.n == 0:
        return ()
    ids, keys = _bucket_ids(priced, names)
    nb = len(keys)
    cols = [np.bincount(ids, weights=priced.time[c], minlength=nb).tolist()
            for c in CELL_VALUE_COLUMNS]
    i_samples = CELL_VALUE_COLUMNS.index("samples")
    cols[i_samples] = [round(x) for x in cols[i_samples]]
    times = [PhaseTime(*row) for row in zip(*cols)]
    nr = len(priced.per_s)
    pair = ids * nr + priced.rate
    present = (np.bincount(pair, minlength=nb * nr) > 0).tolist()
    costs: dict[str, list[Decimal]] = {}
    for name in _MONEY:
        whole = _int_sums(pair, priced.whole_s[name], nb * nr)
        frac = _int_sums(pair, priced.frac_ns[name], nb * nr)
        # seconds of each (line, rate) exactly (integers), x the rate's price per second
        per_pair = [Decimal(w * _NS + f).scaleb(-9) * priced.per_s[j % nr] if ok else ZERO
                    for j, (w, f, ok) in enumerate(zip(whole, frac, present))]
        costs[name] = per_pair if nr == 1 else [
            sum(per_pair[k * nr:(k + 1) * nr], ZERO) for k in range(nb)]
    one = label if label is not None and not names else None
    lines = [CostLine(key=one if one is not None else tuple(keys[k]), time=times[k],
                      phase_cost={p: costs[p][k] for p in PHASES},
                      unobserved_cost=costs["unobserved"][k],
                      underutilized_waste=costs["underutilized_unused"][k],
                      headroom_cost=costs["headroom"][k]) for k in range(nb)]
    return tuple(sorted(lines, key=lambda ln: (-ln.observed_cost, [str(x) for x in ln.key])))


def _int_sums(ids: np.ndarray, x: np.ndarray, n: int) -> list[int]:
    """Exact integer sums of ``x`` per id (int64 throughout: no float in between)."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, ids, x)
    return out.tolist()  # type: ignore[no-any-return]


def cost_lines(cells: Cells, rates: Mapping[str | None, Rate], keys: Sequence[str]
               ) -> tuple[CostLine, ...]:
    """Cells (:attr:`Usage.cells` rows) priced at their GPU model's rate and summed by
    ``keys`` (cell columns), most costly first; ``keys=()`` gives one total line, or none for
    no cells."""
    return _rollup(_priced_cells(cells, rates, keys), keys)


def price_usage(
    usage: Usage,
    rates: Mapping[str | None, Rate],
    *,
    counts: Mapping[str, int | float | Decimal] | None = None,
    energy_usd_per_kwh: Decimal | str | float | None = None,
) -> CostReport:
    """Cost every cell of ``usage`` at its GPU model's rate and roll the lines up.

    ``rates`` maps each ``gpu_model`` value in the usage (None included) to a rate.
    ``counts`` (e.g. ``{"tokens": 1.2e9, "epochs": 3}``) gives unit costs.
    """
    priced = _priced_cells(usage.cells, rates, ("gpu_uuid", *usage.by))
    total = (_rollup(priced, (), label=("total",)) or (CostLine.empty(("total",)),))[0]
    wall_hours = dec(usage.wall_s) / SECONDS_PER_HOUR
    if wall_hours > 0:
        hourly_cost = hourly(total.observed_cost / wall_hours)
        hourly_waste = min(hourly(total.waste / wall_hours), hourly_cost)
    else:
        hourly_cost = hourly_waste = ZERO
    count_map = check_counts(counts)
    energy_price = (ENERGY_USD_PER_KWH.check_decimal(energy_usd_per_kwh, "energy_usd_per_kwh")
                    if energy_usd_per_kwh is not None else None)
    unit_costs = {k: total.observed_cost / v for k, v in count_map.items()}
    return CostReport(
        currency="USD",
        rates=dict(rates),
        total=total,
        per_gpu=_rollup(priced, ("gpu_uuid",)),
        per_group=_rollup(priced, usage.by) if usage.by else (),
        group_keys=usage.by,
        wall_hours=wall_hours,
        hourly_cost=hourly_cost,
        hourly_waste=hourly_waste,
        unit_costs=unit_costs,
        counts=count_map,
        energy=_energy(usage, energy_price),
    )


def _energy(usage: Usage, usd_per_kwh: Decimal | None) -> Energy | None:
    joules = ZERO
    counter = power = False
    for s in usage.series:
        if s.energy_j is not None and s.energy_j > 0:
            joules += dec(s.energy_j)
            counter = True
        elif s.mean_power_w is not None:
            joules += dec(s.mean_power_w) * dec(s.observed_s)
            power = True
    if not (counter or power):
        return None
    method = "energy counter" if counter and not power else (
        "power x time" if power and not counter else "energy counter + power x time")
    kwh = joules / J_PER_KWH
    price = usd_per_kwh
    return Energy(kwh=kwh, method=method, usd_per_kwh=price,
                  cost=kwh * price if price is not None else None)
