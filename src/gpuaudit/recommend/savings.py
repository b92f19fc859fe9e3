"""Combine savings honestly.

Efficiency fixes act on what earlier fixes left: within a group that shares a bottleneck,
``F_g = min(1 - prod(1 - f_i), cap_g)``; across groups ``F = 1 - prod(1 - F_g)``; and
``F <= W``, the measured waste share. Rate levers multiply with efficiency:
``total = 1 - (1 - F)(1 - D)``, where alternatives for the same hour (spot or a commitment)
contribute the better one, not a product. Adding the fractions is the wrong answer; it is
kept only to be shown, labelled, beside the right one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import Decimal

from gpuaudit.recommend.plan import Plan, Recommendation

__all__ = ["combine", "combine_efficiency", "combine_rate"]

ZERO = Decimal(0)
ONE = Decimal(1)
Q = Decimal("0.000001")

#: Rate-lever groups whose members are alternatives for one hour (take the best).
ALTERNATIVE_GROUPS = frozenset({"purchase"})


def _product_complement(fractions: Iterable[Decimal]) -> Decimal:
    keep = ONE
    for f in fractions:
        keep *= ONE - f
    return ONE - keep


def _by_group(recs: Sequence[Recommendation]) -> dict[str, list[Recommendation]]:
    groups: dict[str, list[Recommendation]] = {}
    for r in recs:
        groups.setdefault(r.remediation.group, []).append(r)
    return groups


def combine_efficiency(recs: Sequence[Recommendation], waste_fraction: Decimal
                       ) -> tuple[Decimal, Decimal]:
    """(uncapped F, F capped by the measured waste share) over the counted efficiency fixes."""
    eff = [r for r in recs if r.counted and r.remediation.lever == "efficiency"]
    per_group = []
    for members in _by_group(eff).values():
        cap = max(r.cap for r in members)
        per_group.append(min(_product_complement(r.fraction for r in members), cap))
    uncapped = _product_complement(per_group)
    return uncapped.quantize(Q), min(uncapped, max(waste_fraction, ZERO)).quantize(Q)


def combine_rate(recs: Sequence[Recommendation]) -> Decimal:
    """D over the counted rate levers: alternatives take the best, groups multiply."""
    rate = [r for r in recs if r.counted and r.remediation.lever == "rate"]
    per_group = []
    for group, members in _by_group(rate).items():
        if group in ALTERNATIVE_GROUPS:
            per_group.append(max(r.fraction for r in members))
        else:
            per_group.append(_product_complement(r.fraction for r in members))
    return _product_complement(per_group).quantize(Q)


def combine(recs: Sequence[Recommendation], *, waste_fraction: Decimal,
            monthly_cost_usd: Decimal, monthly_waste_usd: Decimal | None = None,
            notes: Sequence[str] = ()) -> Plan:
    """The plan. Dollars come from dollars: ``monthly_waste_usd`` (the cost report's waste
    projection; default ``monthly_cost_usd x waste_fraction``) caps the efficiency savings in
    dollars, so a capped saving is the very figure shown as the measured waste, never a
    rounding of the fraction times the cost; the rate levers act on what is left."""
    waste = max(ZERO, min(ONE, waste_fraction)).quantize(Q)
    uncapped, eff = combine_efficiency(recs, waste)
    rate = combine_rate(recs)
    total = (ONE - (ONE - eff) * (ONE - rate)).quantize(Q)
    naive = sum((r.fraction for r in recs if r.counted), ZERO).quantize(Q)
    monthly_waste = (monthly_cost_usd * waste if monthly_waste_usd is None
                     else max(ZERO, min(monthly_waste_usd, monthly_cost_usd)))
    eff_usd = min(monthly_cost_usd * uncapped, monthly_waste)
    total_usd = eff_usd + (monthly_cost_usd - eff_usd) * rate
    return Plan(
        recommendations=tuple(sorted(
            recs, key=lambda r: (not r.counted, -r.monthly_usd, r.remediation.id))),
        waste_fraction=waste,
        efficiency_uncapped_fraction=uncapped,
        efficiency_fraction=eff,
        rate_fraction=rate,
        total_fraction=total,
        naive_sum_fraction=naive,
        monthly_cost_usd=monthly_cost_usd,
        monthly_savings_usd=total_usd,
        efficiency_monthly_usd=eff_usd,
        rate_monthly_usd=total_usd - eff_usd,
        notes=tuple(notes),
        monthly_waste_usd=monthly_waste,
    )
