"""What every entry point shares: the report object, the source a path opens as, the
rates for a usage, and the one assembly of the stages after classification
(price -> diagnose -> recommend -> health)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gpuaudit.classify import Usage, check_health, diagnose
from gpuaudit.classify.diagnose import group_diagnoses, job_diagnoses
from gpuaudit.price import price_usage, resolve_rates
from gpuaudit.price.catalog import Rate
from gpuaudit.recommend import Finding, recommend
from gpuaudit.result import AuditResult
from gpuaudit.schema import Recording, SampleSource

if TYPE_CHECKING:
    pass


__all__ = ["Report", "assemble", "open_source", "rates_for"]


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


