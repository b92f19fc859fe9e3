"""Owned hardware as a price source: total cost of ownership per GPU-hour.

Read from the same ``--catalog`` TOML as rented prices (docs/pricing.md), one ``[[owned]]``
table per GPU model::

    [[owned]]
    gpu_model = "H100 80GB SXM"
    purchase_usd_per_gpu = "30000"        # server share per GPU included, a string keeps it exact
    life_years = "4"                      # straight-line amortisation
    usd_per_kwh = "0.12"
    pue = "1.4"                           # facility overhead on the GPU's watts
    hosting_usd_per_gpu_hour = "0.15"     # rack, network, staff per GPU-hour
    support_usd_per_gpu_hour = "0.05"     # support contract per GPU-hour
    power_w = "700"                       # optional: else the measured watts, else the TDP
    source = "FY26 purchase order"
    as_of = "2026-10-01"

Owned GPUs cost their amortisation, hosting and support every hour whether used or not, and
energy only while running; a rented GPU costs its rate only for the hours used. So owning is
cheaper from a duty (share of the month's hours the work needs the GPU) of
``fixed / (rent - energy)``: the break-even utilization.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from gpuaudit.errors import InputError
from gpuaudit.price.catalog import read_catalog_toml

__all__ = ["HOURS_PER_YEAR", "OwnedGpu", "break_even_duty", "load_owned"]

HOURS_PER_YEAR = Decimal(8760)
W_PER_KW = Decimal(1000)


@dataclass(frozen=True)
class OwnedGpu:
    """One ``[[owned]]`` row: what an owned GPU costs, with its source."""

    gpu_model: str
    purchase_usd_per_gpu: Decimal
    life_years: Decimal
    usd_per_kwh: Decimal
    pue: Decimal
    hosting_usd_per_gpu_hour: Decimal
    support_usd_per_gpu_hour: Decimal
    power_w: Decimal | None
    source: str
    as_of: str

    @property
    def amortized_usd_per_gpu_hour(self) -> Decimal:
        return self.purchase_usd_per_gpu / (self.life_years * HOURS_PER_YEAR)

    @property
    def fixed_usd_per_gpu_hour(self) -> Decimal:
        """What every hour costs, used or not: amortisation + hosting + support."""
        return (self.amortized_usd_per_gpu_hour + self.hosting_usd_per_gpu_hour
                + self.support_usd_per_gpu_hour)

    def energy_usd_per_gpu_hour(self, power_w: Decimal) -> Decimal:
        """Energy of one running hour at ``power_w`` (W x PUE / 1000 x $/kWh)."""
        return power_w * self.pue / W_PER_KW * self.usd_per_kwh

    def usd_per_used_hour(self, power_w: Decimal, duty: Decimal) -> Decimal:
        """Cost per hour of work when the work needs the GPU ``duty`` of all hours (0..1]."""
        if duty <= 0:
            raise InputError(f"duty {duty} must be above 0", fix="pass a share in (0, 1]")
        return self.fixed_usd_per_gpu_hour / duty + self.energy_usd_per_gpu_hour(power_w)


def break_even_duty(owned: OwnedGpu, power_w: Decimal, rent_usd_per_gpu_hour: Decimal
                    ) -> Decimal | None:
    """The share of hours above which owning is cheaper than renting at that rate; None when
    renting is cheaper even at full use (the running cost alone reaches the rent)."""
    margin = rent_usd_per_gpu_hour - owned.energy_usd_per_gpu_hour(power_w)
    if margin <= 0:
        return None
    duty = owned.fixed_usd_per_gpu_hour / margin
    return duty if duty <= 1 else None


def _dec(row: dict[str, Any], key: str, where: str, *, required: bool = True,
         positive: bool = False) -> Decimal | None:
    if key not in row:
        if required:
            raise InputError(f"missing {key}", where=where,
                             fix="see docs/pricing.md, 'Owned hardware'")
        return None
    try:
        value = Decimal(str(row[key]))
    except InvalidOperation:
        raise InputError(f"{key} {row[key]!r} is not a number", where=where,
                         fix="write plain decimals, e.g. \"0.12\"") from None
    if value < 0 or (positive and value == 0):
        raise InputError(f"{key} {value} must be {'above' if positive else 'at least'} 0",
                         where=where, fix="correct the figure")
    return value


def load_owned(path: str | Path) -> tuple[OwnedGpu, ...]:
    """The ``[[owned]]`` rows of a catalog TOML file (none: an empty tuple)."""
    p = Path(path)
    data = read_catalog_toml(p)
    rows = data.get("owned", [])
    if not isinstance(rows, list):
        raise InputError("owned must be an array of tables", where=str(p),
                         fix="write [[owned]] (double brackets) per GPU model")
    out = []
    for i, row in enumerate(rows, start=1):
        where = f"{p} [[owned]] #{i}"
        if "gpu_model" not in row:
            raise InputError("missing gpu_model", where=where, fix="name the GPU model owned")

        def need(key: str, positive: bool = False, _row: dict[str, Any] = row,
                 _where: str = where) -> Decimal:
            v = _dec(_row, key, _where, positive=positive)
            assert v is not None
            return v

        out.append(OwnedGpu(
            gpu_model=str(row["gpu_model"]),
            purchase_usd_per_gpu=need("purchase_usd_per_gpu"),
            life_years=need("life_years", positive=True),
            usd_per_kwh=need("usd_per_kwh"),
            pue=_dec(row, "pue", where, required=False, positive=True) or Decimal(1),
            hosting_usd_per_gpu_hour=_dec(row, "hosting_usd_per_gpu_hour", where,
                                          required=False) or Decimal(0),
            support_usd_per_gpu_hour=_dec(row, "support_usd_per_gpu_hour", where,
                                          required=False) or Decimal(0),
            power_w=_dec(row, "power_w", where, required=False),
            source=str(row.get("source", f"user catalog {p.name}")),
            as_of=str(row.get("as_of", "unknown")),
        ))
    return tuple(out)
