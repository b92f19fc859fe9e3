"""Recommend: the remediations the measurements call for, and their combined savings."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import Decimal

from gpuaudit.classify.diagnose import Diagnosis
from gpuaudit.classify.usage import Usage
from gpuaudit.price.cost import CostReport
from gpuaudit.recommend.plan import Finding, Plan, Recommendation, Remediation, remediation_catalog
from gpuaudit.recommend.rules import candidate_recommendations
from gpuaudit.recommend.savings import combine

__all__ = ["Finding", "Plan", "Recommendation", "Remediation", "recommend",
           "remediation_catalog"]


def recommend(usage: Usage, cost: CostReport, diagnoses: Sequence[Diagnosis] = (),
              findings: Iterable[Finding] = ()) -> Plan:
    """The plan for this audit: every triggered remediation, combined as in savings.py."""
    recs = candidate_recommendations(usage, cost, diagnoses, findings)
    total = cost.total.observed_cost
    waste = cost.total.waste / total if total > 0 else Decimal(0)
    notes = []
    if not any(r.remediation.lever == "rate" for r in recs) and all(
            r.provider is None for r in cost.rates.values()):
        notes.append("rate levers (spot, commitments) need a catalog price: pass --provider "
                     "instead of --price to see them")
    open_ = [d for d in diagnoses if d.top and d.kind == "undetermined" and d.decides]
    if open_:
        notes.append(f"no cause could be decided for {len(open_)} GPU(s) from the fields "
                     f"present ({open_[0].gpu_uuid}{' and others' if len(open_) > 1 else ''}): "
                     f"{open_[0].decides}")
    return combine(recs, waste_fraction=waste, monthly_cost_usd=cost.cost_projection["monthly"],
                   monthly_waste_usd=cost.waste_projection["monthly"], notes=notes)
