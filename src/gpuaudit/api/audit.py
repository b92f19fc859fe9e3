"""``gpuaudit.audit(samples, ...)``: a file, a recording or a table, through every stage."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuaudit.api.compose import Report, assemble, group_keys, open_source, rates_for
from gpuaudit.classify import Usage, classify
from gpuaudit.recommend import Finding

if TYPE_CHECKING:
    import pyarrow as pa

    from gpuaudit.schema import Recording, SampleSource

__all__ = ["audit", "audit_usage"]


def audit(
    samples: SampleSource | Recording | pa.Table | str | Path,
    *,
    by: str | Sequence[str] | None = (),
    gpu_model: str | None = None,
    price: Decimal | str | float | None = None,
    provider: str | None = None,
    purchase: str = "on-demand",
    catalog: str | Path | None = None,
    counts: Mapping[str, int | float | Decimal] | None = None,
    energy_usd_per_kwh: Decimal | str | float | None = None,
    findings: Iterable[Finding] = (),
    interval_s: float | None = None,
    cap_intervals: float | None = None,
    mapping: Mapping[str, str] | None = None,
    fields: Sequence[str] | None = None,
    host: str | None = None,
    tz: str = "UTC",
    extra: Mapping[str, Any] | None = None,
    workers: int | None = None,
) -> Report:
    """Classify, price and recommend in one call.

    ``samples``: a path, a :class:`~gpuaudit.schema.Recording`, a sample source or a sample
    table. Pricing: ``price`` (USD per GPU-hour) > ``catalog`` (TOML) > the embedded catalog
    for ``gpu_model`` (or the model the samples name) at ``provider`` (default aws) and
    ``purchase`` (on-demand, spot, committed). ``by``: group keys (pod, namespace, team, ...): ``"team"``, ``"team,project"`` or a
    sequence; None or ``()``: per GPU, no grouping.
    ``counts``: units of work for unit costs (``{"tokens": 2e9}``). ``workers``: processes
    for a large gpuaudit recording (None: one per core; see :func:`gpuaudit.classify.classify`).
    """
    source = open_source(samples, mapping=mapping, fields=fields, host=host,
                         gpu_model=gpu_model, tz=tz)
    finding_list = tuple(findings)
    kwargs: dict[str, Any] = {}
    if cap_intervals is not None:
        kwargs["cap_intervals"] = cap_intervals
    extras = dict(extra or {})
    want_timeline = "timeline" not in extras  # the exporter passes {"timeline": None}: none
    usage = classify(source, by=group_keys(by), interval_s=interval_s, findings=finding_list,
                     workers=workers, timeline=want_timeline, **kwargs)
    return audit_usage(usage, gpu_model=gpu_model, price=price, provider=provider,
                       purchase=purchase, catalog=catalog, counts=counts,
                       energy_usd_per_kwh=energy_usd_per_kwh, findings=finding_list,
                       extra=extras)


def audit_usage(
    usage: Usage,
    *,
    gpu_model: str | None = None,
    price: Decimal | str | float | None = None,
    provider: str | None = None,
    purchase: str = "on-demand",
    catalog: str | Path | None = None,
    counts: Mapping[str, int | float | Decimal] | None = None,
    energy_usd_per_kwh: Decimal | str | float | None = None,
    findings: Iterable[Finding] = (),
    extra: Mapping[str, Any] | None = None,
) -> Report:
    """:func:`audit` after classify: price, recommend and assemble a usage already
    classified (the capacity commands classify while they build their profiles, from the
    same read, and know their findings only after)."""
    finding_list = tuple(findings)
    if usage.findings != finding_list:
        usage = replace(usage, findings=finding_list)
    extras = dict(extra or {})
    rates = rates_for(usage, gpu_model=gpu_model, price=price, provider=provider,
                      purchase=purchase, catalog=catalog)
    if "timeline" not in extras and usage.timeline is not None:
        extras["timeline"] = usage.timeline.to_dict()
    return assemble(usage, rates, counts=counts, energy_usd_per_kwh=energy_usd_per_kwh,
                    findings=finding_list, extra=extras)


