"""The customer's real rates, from the bill, for pricing and the recommender's rate levers.

For each GPU model measured, the bill's GPU lines of the same family give the effective
cost per billed GPU-hour (``EffectiveCost``: commitments, savings plans and spot included)
and the list cost per GPU-hour (``ListCost``: the public on-demand price). The
:class:`~gpuaudit.price.catalog.Rate` that prices the measured time is the effective one,
with ``on_demand_usd_per_gpu_hour`` set to it too, so a lever's discount is measured from
what the customer really pays: spot and commitment alternatives come from the catalog and
are dropped where they are not cheaper than that. Where most of a model's billed hours
already run on commitments or spot, the rate says so (``purchase``) and those levers are
not proposed again. Models the bill does not price fall back to the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpuaudit.classify.usage import Usage
from gpuaudit.errors import PricingError
from gpuaudit.price.catalog import Rate, gpu_family, load_user_catalog, resolve_rate
from gpuaudit.price.money import hourly

__all__ = ["bill_rates"]

_PURCHASE = {"Standard": "on-demand", "Dynamic": "spot", "Committed": "committed"}


def bill_rates(usage: Usage, summary: Mapping[str, Any],
               catalog: str | Path | None = None) -> dict[str | None, Rate]:
    """A :class:`Rate` per GPU model in ``usage`` from the bill's USD GPU lines."""
    usd = summary.get("currencies", {}).get("USD")
    rows = usd["rates"] if usd else []
    user = load_user_catalog(catalog) if catalog is not None else ()
    period = ""
    if usd and usd["periods"]:
        period = f"{usd['periods'][0]['start'][:10]}..{usd['periods'][-1]['end'][:10]}"
    out: dict[str | None, Rate] = {}
    models = {s.gpu_model for s in usage.series} or {None}
    for model in models:
        fam = gpu_family(model or "")
        mine = [r for r in rows if fam is not None and gpu_family(r["gpu_model"]) == fam
                and r["effective_per_gpu_hour"] is not None]
        base: Rate | None = None
        try:
            base = resolve_rate(model or (mine[0]["gpu_model"] if mine else None),
                                user_catalog=user)
        except PricingError:
            if not mine:
                raise
        if not mine:
            assert base is not None
            out[model] = base
            continue
        hours = sum((Decimal(str(r["gpu_hours"])) for r in mine), Decimal(0))
        eff = sum((Decimal(r["effective"]) for r in mine), Decimal(0))
        lst = sum((Decimal(r["list"]) for r in mine), Decimal(0))
        by_cat: dict[str, Decimal] = {}
        for r in mine:
            by_cat[r["pricing_category"]] = by_cat.get(r["pricing_category"], Decimal(0)) \
                + Decimal(str(r["gpu_hours"]))
        main_cat = max(by_cat, key=lambda c: by_cat[c]) if by_cat else "Standard"
        purchase = _PURCHASE.get(main_cat, "on-demand")
        eff_rate = hourly(eff / hours) if hours > 0 else Decimal(0)
        list_rate = hourly(lst / hours) if hours > 0 else None
        spot = base.spot_usd_per_gpu_hour if base else None
        committed = base.committed_usd_per_gpu_hour if base else None
        instances = ", ".join(sorted({r["instance"] for r in mine}))
        out[model] = Rate(
            usd_per_gpu_hour=eff_rate, purchase=purchase,
            source=(f"your bill: EffectiveCost per billed GPU-hour, {hours:.1f} GPU-hours of "
                    f"{instances}; list ${(list_rate or Decimal(0)):.4f}/GPU-h"),
            as_of=period or "bill", gpu_model=mine[0]["gpu_model"],
            provider=(base.provider if base else None) or "bill", instance=instances,
            on_demand_usd_per_gpu_hour=eff_rate,
            spot_usd_per_gpu_hour=spot if spot is not None and spot < eff_rate else None,
            committed_usd_per_gpu_hour=committed if committed is not None
            and committed < eff_rate else None,
            committed_source=base.committed_source if base else None,
        )
        if base is not None and base.provider is None:
            out[model] = replace(out[model], provider="bill")
    return out
