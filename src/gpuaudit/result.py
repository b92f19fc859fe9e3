"""The composed value of one audit: usage, cost, plan, diagnoses and health.

The last arrow of the pipeline before rendering: plain data. Renderers in
:mod:`gpuaudit.report` take it; :class:`gpuaudit.api.Report` (what ``gpuaudit.audit`` returns)
adds ``render``/``to_dict`` on top, in the composition layer, so nothing here reaches right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # plain data: the stages' types, not their modules, at run time
    from gpuaudit.classify.diagnose import Diagnosis, GroupDiagnosis, JobDiagnosis
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
    #: one cause per job (host and pod set): see classify.diagnose.job_diagnoses
    job_diagnoses: tuple[JobDiagnosis, ...] = ()
    #: one cause per ``--by`` group: see classify.diagnose.group_diagnoses
    group_diagnoses: tuple[GroupDiagnosis, ...] = ()
