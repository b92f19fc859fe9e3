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


def _line(key: tuple[str | None, ...], t: PhaseTime, rate: Rate) -> CostLine:
    per_s = rate.usd_per_gpu_hour / SECONDS_PER_HOUR
    phase_cost = {p: dec(getattr(t, f"{p}_s")) * per_s for p in PHASES}
    return CostLine(
        key=key,
        time=t,
        phase_cost=phase_cost,
        unobserved_cost=dec(t.unobserved_s) * per_s,
        underutilized_waste=dec(t.underutilized_unused_s) * per_s,
        headroom_cost=dec(t.headroom_s) * per_s,
    )


def _merge(key: tuple[str | None, ...], lines: Sequence[CostLine]) -> CostLine:
    return CostLine(
        key=key, time=PhaseTime.total([ln.time for ln in lines]),
        phase_cost={p: sum((ln.phase_cost[p] for ln in lines), ZERO) for p in PHASES},
        unobserved_cost=sum((ln.unobserved_cost for ln in lines), ZERO),
        underutilized_waste=sum((ln.underutilized_waste for ln in lines), ZERO),
        headroom_cost=sum((ln.headroom_cost for ln in lines), ZERO),
    )


CellLines = list[tuple[dict[str, Any], CostLine]]


def _rows_of(table: Cells, names: Sequence[str]) -> list[dict[str, Any]]:
    """Rows as dicts over ``names`` (those present). Nanosecond timestamps become microsecond
    ``datetime``s: pyarrow converts ns timestamps to Python only through pandas, which is not
    a dependency. Plain cell columns (a trace's usage) are read without Arrow."""
    if isinstance(table, CellColumns):
        return table.rows(list(dict.fromkeys(names)))
    import pyarrow as pa

    cols = {}
    for name in dict.fromkeys(names):
        if name not in table.column_names:
            continue
        col = table.column(name)
        if pa.types.is_timestamp(col.type) and col.type.unit == "ns":
            col = col.cast(pa.timestamp("us", tz=col.type.tz), safe=False)
        cols[name] = col
    return pa.table(cols).to_pylist() if cols else [{} for _ in range(table.num_rows)]


def _priced_cells(cells: Cells, rates: Mapping[str | None, Rate],
                  key_names: Sequence[str]) -> CellLines:
    """Each cell (a :attr:`Usage.cells` row) priced at its GPU model's rate, with its
    ``key_names`` values for rolling up."""
    out: CellLines = []
    for row in _rows_of(cells, [*key_names, "gpu_model", *CELL_VALUE_COLUMNS]):
        t = PhaseTime(**{c: (int(row[c]) if c == "samples" else float(row[c]))  # type: ignore[arg-type]
                         for c in CELL_VALUE_COLUMNS})
        model = row.get("gpu_model")
        rate = rates.get(model) or rates.get(None)
        if rate is None:
            raise PricingError(f"no rate for GPU model {model!r}",
                               fix="pass --gpu-model or --price")
        keys = {k: row.get(k) for k in key_names}
        out.append((keys, _line(tuple(keys.values()), t, rate)))
    return out


def _rollup(cell_lines: CellLines, names: Sequence[str]) -> tuple[CostLine, ...]:
    buckets: dict[tuple[str | None, ...], list[CostLine]] = {}
    for keys, ln in cell_lines:
        buckets.setdefault(tuple(keys[n] for n in names), []).append(ln)
    merged = [_merge(k, v) for k, v in buckets.items()]
    return tuple(sorted(merged, key=lambda ln: (-ln.observed_cost, [str(x) for x in ln.key])))


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
    cell_lines = _priced_cells(usage.cells, rates, ("gpu_uuid", *usage.by))
    total = _merge(("total",), [ln for _, ln in cell_lines])
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
        per_gpu=_rollup(cell_lines, ("gpu_uuid",)),
        per_group=_rollup(cell_lines, usage.by) if usage.by else (),
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
