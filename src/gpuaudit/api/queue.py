"""``gpuaudit.audit_queue(...)``: pods waiting for GPUs beside the GPU-hours idle meanwhile."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import TYPE_CHECKING, Any

from gpuaudit.api.compose import CapacityReport, Report, assemble
from gpuaudit.api.fleet import audit_fleet
from gpuaudit.recommend import Finding

if TYPE_CHECKING:
    from gpuaudit.capacity.queue import QueueReport

__all__ = ["QueueAudit", "audit_queue"]


@dataclass(frozen=True)
class QueueAudit:
    """What :func:`audit_queue` returns: the waits, the fleet audit of the same range with the
    scheduling finding in (None without ``plan``), and the findings given to it."""

    queue: QueueReport
    report: Report | None
    findings: tuple[Finding, ...]
    #: where the waits came from, as the capacity document's ``source`` names it
    source: Mapping[str, Any] = field(default_factory=dict)

    @property
    def capacity(self) -> CapacityReport[QueueReport]:
        """The waits as the ``gpuaudit.capacity`` document ``gpuaudit queue`` renders."""
        return CapacityReport(self.queue, self.source, self.report, self.findings)

    def to_dict(self) -> dict[str, Any]:
        return self.capacity.to_dict()

    def render(self, fmt: str = "terminal") -> str:
        return self.capacity.render(fmt)


def audit_queue(
    prometheus: str,
    *,
    start_s: float,
    end_s: float,
    step_s: float = 60.0,
    namespaces: Sequence[str] = (),
    client_kwargs: Mapping[str, Any] | None = None,
    pricing: Mapping[str, Any] | None = None,
    plan: bool = True,
) -> QueueAudit:
    """Queue waits of pods requesting GPUs (kube-state-metrics) beside the idle GPUs, and with
    ``plan`` the fleet audit of the same range (:func:`audit_fleet`) with the scheduling
    finding in: the GPU-hours idle and held by no pod while GPU pods waited, priced at each
    model's rate as a share of the audit's observed cost. The recommender counts it in the
    idle group, capped by the idle cost the audit measured."""
    from gpuaudit.capacity.queue import (
        idle_while_waiting_sentence,
        idle_while_waiting_usd,
        queue_waits,
    )
    from gpuaudit.measure.fleet.prometheus import PromClient
    from gpuaudit.recommend.rules import QUEUE_SIGNAL

    src = {"prometheus": prometheus}
    with PromClient(prometheus, **dict(client_kwargs or {})) as client:
        q = queue_waits(client, start_s=start_s, end_s=end_s, step_s=step_s,
                        namespaces=namespaces)
    if not plan:
        return QueueAudit(q, None, (), src)
    if not q.saw_dcgm:
        return QueueAudit(dc_replace(q, notes=(
            *q.notes, "no recommendations: no GPU was idle in the range (or no dcgm-exporter "
            "series), so there is no scheduling finding; gpuaudit fleet audits the rest")),
            None, (), src)
    base = audit_fleet(prometheus=prometheus, start_s=start_s, end_s=end_s, by=("namespace",),
                       client_kwargs=client_kwargs, pricing=pricing, advice_groups=0)
    usd = idle_while_waiting_usd(q, base.cost.rates)
    observed = base.cost.total.observed_cost
    if usd <= 0 or observed <= 0:
        return QueueAudit(q, base, (), src)
    finding = Finding(QUEUE_SIGNAL, float(usd / observed),
                      idle_while_waiting_sentence(q, usd, observed), source="capacity")
    pricing = dict(pricing or {})
    return QueueAudit(q, assemble(base.usage, base.cost.rates, counts=pricing.get("counts"),
                                  energy_usd_per_kwh=pricing.get("energy_usd_per_kwh"),
                                  findings=(finding,), extra=base.extra), (finding,), src)


