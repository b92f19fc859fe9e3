"""The customer's real rates, from the bill, for pricing and the recommender's rate levers.

One rate rule. A measured GPU-hour of model M is priced at:

1. M's own bill lines: the usage lines of M's catalog model (exactly that model, never
   another of its family), net of their corrections (``ChargeClass`` Correction, a negative
   ``ConsumedQuantity`` with its negative cost) over the bill's period: ``EffectiveCost``
   per GPU-hour (commitments, savings plans and spot included). Credits, refunds, taxes and
   purchases are never a rate: they are split like the lines they correct
   (``allocate.py``), or shown in their own bucket;
2. where M has no usage lines, or they net to no hours or to a negative cost: the catalog
   price of M, labelled so (``catalog price for M: no bill line for this model``).

A rate is never negative. It is zero only where M's lines bill their hours at zero (then the
source says ``free``). A MIG slice or a vGPU profile is its share of the board
(:func:`gpu_share`): a ``GRID A100-10C`` is 10/40 of an A100 40GB, a ``1g.5gb`` slice the
larger of its compute (1/7) and memory (1/8) share.

The rate's ``on_demand_usd_per_gpu_hour`` is the effective rate, so a lever's discount is
measured from what the customer pays; ``purchase`` is the pricing category of most of M's
billed hours, and a GPU already on spot or committed gets no spot or commitment lever.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

from gpuaudit.classify.usage import Usage, arrow_cells
from gpuaudit.price.catalog import Rate, load_user_catalog, resolve_rate
from gpuaudit.price.money import hourly

__all__ = ["bill_rates", "gpu_share", "with_mig_models"]

_PURCHASE = {"Standard": "on-demand", "Dynamic": "spot", "Committed": "committed"}
_VGPU = re.compile(r"^(?:GRID\s+|NVIDIA\s+)?([A-Z]+\d+[A-Z]*?)(D?)-(\d+)([ABCQ])$", re.I)
_MIG = re.compile(r"^(.*?)\s+MIG\s+(\d+g\.\d+gb)$", re.I)


def gpu_share(model: str | None) -> tuple[str | None, Fraction, str | None]:
    """``(board model, share of the board, label)`` of a MIG slice or vGPU profile name;
    ``(model, 1, None)`` for a whole GPU.

    vGPU (``GRID A100-10C``): the profile's frame buffer over the board's (A100 boards:
    ``A100-`` profiles are the 40 GB board's, ``A100D-`` the 80 GB one's). MIG
    (``NVIDIA A100-SXM4-40GB MIG 1g.5gb``): the larger of the profile's compute slices of 7
    and memory slices of 8 (``data/mig_profiles.csv``)."""
    if not model:
        return model, Fraction(1), None
    text = model.strip()
    m = _MIG.match(text)
    if m:
        from gpuaudit.hardware import mig_profiles

        board, prof = m.group(1), m.group(2).lower()
        for p in mig_profiles(board):
            if p.name.lower() == prof:
                share = max(Fraction(p.compute_slices, 7), Fraction(p.memory_slices, 8))
                return board, share, (f"MIG {p.name}: {share} of the {board} (compute "
                                      f"{p.compute_slices}/7, memory {p.memory_slices}/8)")
        return board, Fraction(1), None
    m = _VGPU.match(text)
    if m:
        fam, dual, fb = m.group(1).upper(), m.group(2).upper(), int(m.group(3))
        if fam == "A100":
            board, board_gb = ("NVIDIA A100 80GB", 80) if dual else ("NVIDIA A100 40GB", 40)
        else:
            from gpuaudit.hardware import spec_for

            spec = spec_for(fam)
            if spec is None:
                return model, Fraction(1), None
            board, board_gb = spec.gpu_model, round(spec.memory_gb)
        if 0 < fb <= board_gb:
            share = Fraction(fb, board_gb)
            return board, share, f"vGPU {text}: {fb}/{board_gb} GB of the {board}"
    return model, Fraction(1), None


def with_mig_models(usage: Usage) -> Usage:
    """``usage`` with each MIG instance's model named as NVML names it, ``<board> MIG
    <profile>`` (dcgm-exporter and Prometheus carry the profile in ``mig_profile`` and the
    board in ``gpu_model``), so the rate rule prices the slice as its share of the board, not
    as the whole GPU."""
    import pyarrow as pa

    names = {s.gpu_uuid: f"{s.gpu_model} MIG {s.mig_profile}" for s in usage.series
             if s.mig_profile and s.gpu_model and " MIG " not in s.gpu_model}
    if not names:
        return usage
    cells = arrow_cells(usage.cells)
    if "gpu_model" in cells.column_names and "gpu_uuid" in cells.column_names:
        col = [names.get(u, m) for u, m in zip(cells.column("gpu_uuid").to_pylist(),
                                               cells.column("gpu_model").to_pylist())]
        i = cells.column_names.index("gpu_model")
        cells = cells.set_column(i, "gpu_model", pa.array(col, pa.string()))
    series = tuple(replace(s, gpu_model=names.get(s.gpu_uuid, s.gpu_model))
                   for s in usage.series)
    return replace(usage, cells=cells, series=series)


def _scaled(rate: Rate, share: Fraction, label: str) -> Rate:
    f = Decimal(share.numerator) / Decimal(share.denominator)

    def s(x: Decimal | None) -> Decimal | None:
        return None if x is None else hourly(x * f)

    return replace(rate, usd_per_gpu_hour=hourly(rate.usd_per_gpu_hour * f),
                   on_demand_usd_per_gpu_hour=s(rate.on_demand_usd_per_gpu_hour),
                   spot_usd_per_gpu_hour=s(rate.spot_usd_per_gpu_hour),
                   committed_usd_per_gpu_hour=s(rate.committed_usd_per_gpu_hour),
                   source=f"{label}; {rate.source}")


def bill_rates(usage: Usage, summary: Mapping[str, Any],
               catalog: str | Path | None = None) -> dict[str | None, Rate]:
    """A :class:`Rate` per GPU model in ``usage`` by the rule of the module doc."""
    usd = summary.get("currencies", {}).get("USD")
    rows = (usd.get("model_rates") or []) if usd else []
    user = load_user_catalog(catalog) if catalog is not None else ()
    period = ""
    if usd and usd["periods"]:
        period = f"{usd['periods'][0]['start'][:10]}..{usd['periods'][-1]['end'][:10]}"
    out: dict[str | None, Rate] = {}
    models = {s.gpu_model for s in usage.series} or {None}
    for model in sorted(models, key=lambda m: m or ""):
        board, share, label = gpu_share(model)
        base = resolve_rate(board, user_catalog=user)  # PricingError: no price at all
        rate = _from_bill(model, base, [r for r in rows if r["gpu_model"] == base.gpu_model],
                          period)
        out[model] = _scaled(rate, share, label) if label else rate
    return out


def _from_bill(model: str | None, base: Rate, mine: list[Mapping[str, Any]],
               period: str) -> Rate:
    name = model or base.gpu_model or "this GPU"
    if not mine:
        return replace(base, source=f"catalog price for {name}: no bill line for this model; "
                       f"{base.source}")
    hours = sum((Decimal(str(r["gpu_hours"])) for r in mine), Decimal(0))
    eff = sum((Decimal(r["effective"]) for r in mine), Decimal(0))
    billed = sum((Decimal(r["billed"]) for r in mine), Decimal(0))
    lst = sum((Decimal(r["list"]) for r in mine), Decimal(0))
    instances = ", ".join(sorted({r["instance"] for r in mine}))
    if hours <= 0 or eff < 0 or (eff == 0 and billed != 0):
        return replace(base, source=(
            f"catalog price for {name}: its bill lines net to {hours:.2f} GPU-hours and "
            f"{eff:.2f} effective cost after corrections, no rate; {base.source}"))
    by_cat: dict[str, Decimal] = {}
    for r in mine:
        by_cat[r["pricing_category"]] = by_cat.get(r["pricing_category"], Decimal(0)) \
            + Decimal(str(r["gpu_hours"]))
    main_cat = max(sorted(by_cat), key=lambda c: by_cat[c]) if by_cat else "Standard"
    purchase = _PURCHASE.get(main_cat, "on-demand")
    eff_rate = hourly(eff / hours)
    list_rate = hourly(lst / hours)
    corrections = sum(int(r.get("corrections", 0)) for r in mine)
    free = "FREE: your bill charges these hours nothing; " if eff_rate == 0 else ""
    spot, committed = base.spot_usd_per_gpu_hour, base.committed_usd_per_gpu_hour
    rate = Rate(
        usd_per_gpu_hour=eff_rate, purchase=purchase,
        source=(f"{free}your bill: EffectiveCost per billed GPU-hour, {hours:.1f} GPU-hours "
                f"of {instances}" + (f" net of {corrections} correction(s)" if corrections
                                     else "") + f"; list ${list_rate:.4f}/GPU-h"),
        as_of=period or "bill", gpu_model=base.gpu_model,
        provider=base.provider or "bill", instance=instances,
        on_demand_usd_per_gpu_hour=eff_rate,
        spot_usd_per_gpu_hour=spot if spot is not None and spot < eff_rate else None,
        committed_usd_per_gpu_hour=committed if committed is not None
        and committed < eff_rate else None,
        committed_source=base.committed_source,
    )
    return rate
