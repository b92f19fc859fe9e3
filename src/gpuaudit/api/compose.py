"""What every entry point shares: the report object, the source a path opens as, the
rates for a usage, and the one assembly of the stages after classification
(price -> diagnose -> recommend -> health)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gpuaudit.classify import Usage, check_health, diagnose
from gpuaudit.classify.diagnose import group_diagnoses, job_diagnoses
from gpuaudit.price import price_usage, resolve_rates
from gpuaudit.price.catalog import Rate
from gpuaudit.recommend import Finding, recommend
from gpuaudit.result import AuditResult

if TYPE_CHECKING:
    import pyarrow as pa

    from gpuaudit.capacity.queue import QueueReport
    from gpuaudit.capacity.rightsize import Rightsize
    from gpuaudit.capacity.simulate import Simulation
    from gpuaudit.schema import Recording, SampleSource


#: what a :class:`CapacityReport` holds: the capacity stage's answer
V = TypeVar("V", "Rightsize", "Simulation", "QueueReport")

__all__ = ["CapacityReport", "Report", "assemble", "group_keys", "open_source", "rates_for"]


class Report(AuditResult):
    """What :func:`audit` returns: the :class:`~gpuaudit.result.AuditResult` plus rendering."""

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


def open_source(
    samples: SampleSource | Recording | pa.Table | str | Path,
    *,
    mapping: Mapping[str, str] | None = None,
    fields: Sequence[str] | None = None,
    host: str | None = None,
    gpu_model: str | None = None,
    tz: str = "UTC",
) -> SampleSource | Recording:
    """Turn a path (Parquet, CSV, JSONL, nvidia-smi log) or a table into a sample source."""
    if isinstance(samples, (str, Path)):
        from gpuaudit.measure.files import open_samples

        return open_samples(samples, mapping=mapping, fields=fields, host=host,
                            gpu_model=gpu_model, tz=tz)
    import pyarrow as pa

    from gpuaudit.schema import Recording

    if isinstance(samples, pa.Table):
        return Recording(table=samples, source="table", origin="an in-memory sample table")
    return samples


def rates_for(
    usage: Usage,
    *,
    gpu_model: str | None = None,
    price: Decimal | str | float | None = None,
    provider: str | None = None,
    purchase: str = "on-demand",
    catalog: str | Path | None = None,
) -> Mapping[str | None, Rate]:
    """The rate of every GPU model in ``usage`` (see :func:`gpuaudit.price.resolve_rates`)."""
    models = {s.gpu_model for s in usage.series} or {None}
    return resolve_rates(models, gpu_model=gpu_model, price=price, provider=provider,
                         purchase=purchase, catalog=catalog)


def assemble(
    usage: Usage,
    rates: Mapping[str | None, Rate],
    *,
    counts: Mapping[str, int | float | Decimal] | None = None,
    energy_usd_per_kwh: Decimal | str | float | None = None,
    findings: Iterable[Finding] = (),
    extra: Mapping[str, Any] | None = None,
) -> Report:
    """The pipeline after classification, composed once: price -> diagnose -> recommend.

    Every entry point ends here, whatever measured the usage: a file or live recording
    (:func:`audit`), a Prometheus pushdown or raw pull (the fleet audit and its per-group
    advice), a profiler trace (``gpuaudit trace``), the live exporter. A new capability that
    needs "the report for this usage" calls this rather than writing the stages out again.
    """
    finding_list = tuple(findings)
    cost = price_usage(usage, rates, counts=counts, energy_usd_per_kwh=energy_usd_per_kwh)
    diagnoses = diagnose(usage.series, usage.patterns, usage.onset_lags)
    plan = recommend(usage, cost, diagnoses, finding_list)
    return Report(usage=usage, cost=cost, plan=plan, diagnoses=diagnoses,
                  health=check_health(usage.series), extra=dict(extra or {}),
                  job_diagnoses=job_diagnoses(usage.series, diagnoses),
                  group_diagnoses=group_diagnoses(usage, diagnoses))


def group_keys(by: str | Sequence[str] | None) -> tuple[str, ...]:
    """``by`` as group keys: ``None`` or ``()`` is no grouping, ``"team"`` one key,
    ``"team,project"`` or ``("team", "project")`` two (each item may itself list keys with
    commas, as ``--by`` does); blanks are dropped."""
    if by is None:
        return ()
    items = [by] if isinstance(by, str) else list(by)
    for item in items:
        if not isinstance(item, str):
            from gpuaudit.errors import InputError

            raise InputError(f"by: {item!r} is not a group key name",
                             fix='pass by="team", by="team,project" or by=("team", "project")')
    return tuple(k.strip() for item in items for k in item.split(",") if k.strip())


def plan_dict(report: Report, findings: Sequence[Finding]) -> dict[str, Any]:
    """The ``plan`` of a capacity document: the audit's recommendations and combined savings
    with the capacity findings in, and those findings."""
    from gpuaudit.report.json import plan_fields, presented

    # the two fields alone: the whole report's dict (every GPU, the timeline) is not needed
    d = presented(plan_fields(report.plan))
    return {"recommendations": d["recommendations"], "savings": d["savings"],
            "findings": [{"signal": f.signal, "value": f.value, "text": f.text}
                         for f in findings]}


@dataclass(frozen=True)
class CapacityReport(Generic[V]):
    """What :func:`gpuaudit.rightsize`, :func:`gpuaudit.simulate` (and
    :meth:`gpuaudit.api.QueueAudit.capacity`) return: the capacity stage's answer
    (``value``), where the history came from (``source``), the audit with the capacity
    findings in (``audit``; None with ``plan=False``) and those findings. :meth:`to_dict` is
    the ``gpuaudit.capacity`` JSON document (docs/json-schema.md)."""

    value: V
    source: Mapping[str, Any]
    audit: Report | None = None
    findings: tuple[Finding, ...] = ()
    group_keys: tuple[str, ...] = field(default_factory=tuple)

    @property
    def plan(self) -> dict[str, Any] | None:
        return None if self.audit is None else plan_dict(self.audit, self.findings)

    def to_dict(self) -> dict[str, Any]:
        """The ``gpuaudit.capacity`` JSON document as a dict."""
        from gpuaudit.report.capacity import capacity_dict

        return capacity_dict(self.value, plan=self.plan, source=self.source,
                             group_keys=self.group_keys)

    def render(self, fmt: str = "terminal") -> str:
        """The document as ``terminal``, ``markdown``, ``html`` or ``json`` text."""
        from gpuaudit.report.capacity import render_capacity

        return render_capacity(self.to_dict(), fmt)

    def __str__(self) -> str:
        return self.render("terminal")
