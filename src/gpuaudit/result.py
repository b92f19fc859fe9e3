"""The composed value of one audit: usage, cost, plan, diagnoses and health.

The last arrow of the pipeline before rendering. ``render`` hands it to a renderer in
:mod:`gpuaudit.report`; nothing here computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuaudit.classify.diagnose import Diagnosis
from gpuaudit.classify.health import HealthIssue
from gpuaudit.classify.usage import Usage
from gpuaudit.price.cost import CostReport
from gpuaudit.recommend.plan import Plan

__all__ = ["AuditResult"]

FORMATS = ("terminal", "json", "markdown", "html")


@dataclass(frozen=True)
class AuditResult:
    usage: Usage
    cost: CostReport
    plan: Plan
    diagnoses: tuple[Diagnosis, ...]
    health: tuple[HealthIssue, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report as a dict (schema: docs/json-schema.md)."""
        from gpuaudit.report.json import to_dict

        return to_dict(self)

    def render(self, fmt: str = "terminal", *, width: int = 100, color: bool = False) -> str:
        """The report as text in ``fmt``: terminal, json, markdown or html."""
        from gpuaudit.report import render

        return render(self, fmt, width=width, color=color)

    def __str__(self) -> str:
        return self.render("terminal")
