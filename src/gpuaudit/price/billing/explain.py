"""One table explaining the bill split against the audit's view of the same GPU time.

The bill split sums the bill's GPU lines (in the cost basis: billed, effective or list); the
audit prices the measured GPU-hours at one rate per model (``rates.py``). The two totals
differ, and this table says by how much for each GPU model and why: hours billed without
telemetry, hours measured without a bill line (priced at the catalog), the cost basis
(a committed line bills 0 but costs its amortised fee), credits and refunds (in the split,
never in a rate). Each column adds up to its total to the cent.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from gpuaudit.classify.usage import Usage
from gpuaudit.price.billing.reconcile import UNITS_PER_CENT, split_cents
from gpuaudit.price.cost import CostReport

__all__ = ["explain_audit"]


def _cents(x: Decimal) -> int:
    return int((x * 100).quantize(Decimal(1)))


def _s(c: int) -> str:
    return f"{'-' if c < 0 else ''}{abs(c) // 100}.{abs(c) % 100:02d}"


def explain_audit(summary: Mapping[str, Any], cost: CostReport, usage: Usage
                  ) -> dict[str, Any] | None:
    """``extra["bill"]["audit_reconciliation"]``: per GPU model, the bill's GPU-hours and
    cost beside the audit's, the rate used and its source, and why they differ (USD)."""
    usd = summary.get("currencies", {}).get("USD")
    if not usd:
        return None
    basis = summary.get("cost_basis", "billed")
    model_of = {s.gpu_uuid: s.gpu_model for s in usage.series}
    audit: dict[str, list[Decimal]] = {}
    for ln in cost.per_gpu:
        m = model_of.get(str(ln.key[0]))
        rate = cost.rates.get(m) or cost.rates.get(None)
        name = (rate.gpu_model if rate is not None else None) or (m or "unknown")
        t = ln.time
        h = Decimal(str((t.idle_s + t.underutilized_s + t.productive_s + t.compute_bound_s
                         + t.gap_s + t.no_reading_s) / 3600.0))
        a = audit.setdefault(name, [Decimal(0), Decimal(0)])
        a[0] += h
        a[1] += ln.observed_cost
    rates = {(r.gpu_model or ""): r for r in cost.rates.values()}
    billed: dict[str, list[Decimal]] = {}
    for r in usd["rates"]:
        b = billed.setdefault(r["gpu_model"], [Decimal(0), Decimal(0), Decimal(0), Decimal(0)])
        b[0] += Decimal(str(r["gpu_hours"]))
        b[1] += Decimal(r[basis])
        b[2] += Decimal(r["billed"])
        b[3] += Decimal(r["effective"])
    usage_cost: dict[str, Decimal] = {}
    for r in usd.get("model_rates", []):
        usage_cost[r["gpu_model"]] = usage_cost.get(r["gpu_model"], Decimal(0)) \
            + Decimal(r[basis])
    models = sorted(set(audit) | set(billed))
    gpu_total = _cents(Decimal(usd["gpu"][basis]))
    audit_total = _cents(cost.total.observed_cost.quantize(Decimal("0.01")))
    zero = [Decimal(0)] * 4
    b_cents = split_cents([_cents(billed.get(m, zero)[1]) * UNITS_PER_CENT for m in models],
                          gpu_total)
    a_cents = split_cents([int(audit.get(m, zero)[1] * 10**12) for m in models], audit_total)
    rows = []
    for m, bc, ac in zip(models, b_cents, a_cents):
        bh = billed.get(m, [Decimal(0)] * 4)
        ah = audit.get(m, [Decimal(0), Decimal(0)])
        rate = rates.get(m)
        src = "none" if rate is None else ("bill" if "your bill:" in rate.source
                                           else "catalog")
        why = []
        tiny = Decimal("0.05")
        if bh[0] - ah[0] >= tiny:
            why.append(f"{bh[0] - ah[0]:.1f} GPU-h billed without telemetry (unallocated)")
        if ah[0] - bh[0] >= tiny:
            why.append(f"{ah[0] - bh[0]:.1f} GPU-h measured "
                       + ("with no bill line for this model, priced at the catalog"
                          if bh[0] == 0 else "beyond the billed hours"))
        if bh[2] != bh[3] and basis == "billed":
            why.append(f"the split uses billed {bh[2]:.2f}, the rate effective {bh[3]:.2f} "
                       "(a commitment bills 0 and costs its fee)")
        other = bh[1] - usage_cost.get(m, Decimal(0))
        if m in billed and abs(other) >= Decimal("0.005"):
            why.append(f"{other:.2f} of credits, refunds and other non-usage lines in the "
                       "split, never in a rate")
        if src == "bill" and rate is not None and "correction" in rate.source:
            why.append("rate net of usage corrections")
        rows.append({
            "gpu_model": m, "rate_source": src,
            "rate_per_gpu_hour": None if rate is None else str(rate.usd_per_gpu_hour),
            "bill_gpu_hours": float(round(bh[0], 4)), "bill_cost": _s(bc),
            "audit_gpu_hours": float(round(ah[0], 4)), "audit_cost": _s(ac),
            "difference": _s(bc - ac), "why": "; ".join(why) or "same hours, same rate"})
    return {"cost_basis": basis, "currency": "USD", "bill_total": _s(gpu_total),
            "audit_total": _s(audit_total), "difference": _s(gpu_total - audit_total),
            "rows": rows,
            "note": ("bill split: the bill's GPU lines (credits and refunds included, split "
                     "like their lines); audit: measured GPU-hours x one rate per model "
                     "(its own bill lines' effective rate, else the catalog)")}
