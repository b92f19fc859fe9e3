"""The recommend stage's values: remediations from the catalog, and the combined plan."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["Finding", "Plan", "Recommendation", "Remediation", "remediation_catalog"]


@dataclass(frozen=True)
class Remediation:
    """One entry of ``remediations.toml``: what a fix is, where its numbers come from."""

    id: str
    title: str
    vocabulary: tuple[str, ...]
    lever: str
    group: str
    acts_on: str
    savings_range: str
    source: str
    preconditions: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)
    #: the premise the data must show for the fix to count (recommend/premises.py), or None
    premise: str | None = None


@lru_cache(maxsize=1)
def remediation_catalog() -> dict[str, Remediation]:
    text = resources.files("gpuaudit.recommend").joinpath("remediations.toml").read_text("utf-8")
    data = tomllib.loads(text)
    out = {}
    known = {"title", "vocabulary", "lever", "group", "acts_on", "savings_range", "source",
             "preconditions", "premise"}
    for rid, row in data.items():
        out[rid] = Remediation(
            id=rid, title=row["title"], vocabulary=tuple(row["vocabulary"]), lever=row["lever"],
            group=row["group"], acts_on=row["acts_on"], savings_range=row["savings_range"],
            source=row["source"], preconditions=tuple(row["preconditions"]),
            params={k: v for k, v in row.items() if k not in known},
            premise=row.get("premise"),
        )
    return out


@dataclass(frozen=True)
class Finding:
    """Evidence from outside the sample table (a profiler trace, the user) for the rules.

    Signals the rules read: ``input_stall_share`` (share of GPU time idle waiting on input),
    ``tensor_core_share`` (share of kernel time on tensor cores), ``small_kernel_share``
    (share of kernel time in kernels too short to fill the GPU), ``comm_exposed_share``
    (share of time in collectives not hidden by compute), ``precision`` ("fp32", "bf16");
    from capacity planning ``capacity_consolidation_share`` and ``capacity_right_size_share``
    (share of observed cost the simulated packing / right-size saves), and from ``gpuaudit
    queue`` ``queue_idle_while_waiting_share`` (share of observed cost on GPUs idle and held
    by no pod while GPU pods waited); from a trace's operator
    FLOP counts ``achieved_flops_peak_share``, ``achieved_tflops_per_s``,
    ``flops_peak_precision`` (a string) and ``memory_bound_kernel_share``.
    """

    signal: str
    value: float | str
    text: str
    source: str = "trace"


@dataclass(frozen=True)
class Recommendation:
    """A remediation applied to this audit: its measured trigger and its dollar effect.

    ``fraction`` is the share of observed cost it saves on its own (already capped by
    ``cap``, the share of cost it acts on). ``counted`` is False when a precondition could
    not be checked from the data: the fix is listed with its standalone effect but kept out
    of the combined total.
    """

    remediation: Remediation
    fraction: Decimal
    cap: Decimal
    counted: bool
    evidence: str
    scope: tuple[str, ...]
    monthly_usd: Decimal
    why_not_counted: str | None = None
    #: the premise's verdict: the numbers that showed it held (counted fixes with a premise),
    #: or, where it could not be checked, the field that would decide
    premise_held: str | None = None
    decided_by: str | None = None
    ruled_out: bool = False

    @property
    def id(self) -> str:
        return self.remediation.id

    @property
    def status(self) -> str:
        """``counted``; ``ruled_out`` (the data refute its premise); ``unverified`` (a
        precondition the data cannot show)."""
        if self.counted:
            return "counted"
        return "ruled_out" if self.ruled_out else "unverified"


@dataclass(frozen=True)
class Plan:
    """The recommendations and their honest combination (see docs/savings.md).

    efficiency = 1 - prod(1 - F_group), each group's F capped by the share it acts on, the
    whole capped by the measured waste share; rate = 1 - prod(1 - D_group) with alternatives
    (spot or commitment) taking the best one, not a product; total = 1 - (1 - efficiency) x
    (1 - rate). ``naive_sum_fraction`` is the wrong answer (adding every fraction), shown only
    labelled as such.
    """

    recommendations: tuple[Recommendation, ...]
    waste_fraction: Decimal
    efficiency_uncapped_fraction: Decimal
    efficiency_fraction: Decimal
    rate_fraction: Decimal
    total_fraction: Decimal
    naive_sum_fraction: Decimal
    monthly_cost_usd: Decimal
    monthly_savings_usd: Decimal
    efficiency_monthly_usd: Decimal
    rate_monthly_usd: Decimal
    notes: tuple[str, ...] = ()
    #: The measured waste per month: the cost report's waste projection (hourly waste x
    #: 720), the same figure the cost table shows, and the dollar cap on efficiency savings.
    monthly_waste_usd: Decimal = Decimal(0)

    @property
    def monthly_after_usd(self) -> Decimal:
        """The cost after the counted fixes, as shown: the shown cost minus the shown
        savings, each to the cent, so the three figures add up on the page (rounding the
        exact difference could leave them a cent apart)."""
        from gpuaudit.price.money import cents

        return cents(self.monthly_cost_usd) - cents(self.monthly_savings_usd)
