"""``gpuaudit.simulate(samples, ...)``: the history replayed packed by MIG, MPS or
time-slicing: GPUs needed, contention risk, dollars (docs/planning.md).

The composition ``gpuaudit simulate`` renders: read the history (a file, a recording, or the
dcgm-exporter series in Prometheus attributed to team / project / user as the fleet audit
does), build profiles, resolve each model's rate, run
:func:`gpuaudit.capacity.simulate.simulate`, and hand its saving
(:meth:`~gpuaudit.capacity.simulate.Simulation.saving`) to the recommender as a finding.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuaudit.api.compose import CapacityReport, group_keys, open_source
from gpuaudit.errors import InputError

if TYPE_CHECKING:
    import pyarrow as pa

    from gpuaudit.capacity.simulate import Simulation
    from gpuaudit.price.catalog import Rate
    from gpuaudit.schema import Recording, SampleSource

__all__ = ["CONSOLIDATION_SIGNAL", "PROFILE_METRICS", "simulate"]

#: the recommender's signal for a consolidation (gpuaudit.recommend.rules.CAPACITY_SIGNALS)
CONSOLIDATION_SIGNAL = "capacity_consolidation_share"

#: the dcgm-exporter fields profiles read (utilization, SM, memory, power, DRAM and tensor
#: activity): a raw pull of only these, not every field the fleet audit reads
PROFILE_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                   "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
                   "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")

#: the range read from Prometheus when neither end is given
DEFAULT_RANGE_S = 7 * 86400.0


def _prometheus_history(url: str, *, start_s: float | None, end_s: float | None,
                        step_s: float, client_kwargs: Mapping[str, Any] | None
                        ) -> tuple[Recording, dict[str, Any]]:
    import pyarrow as pa

    from gpuaudit.measure.fleet.prometheus import PromClient, PrometheusSource, pod_labels
    from gpuaudit.price.attribution import Attributor, attribute_table
    from gpuaudit.schema import SAMPLE_SCHEMA, Recording

    e = end_s if end_s is not None else time.time()
    s = start_s if start_s is not None else e - DEFAULT_RANGE_S
    if e <= s:
        raise InputError("the range is empty (--end is not after --start)",
                         fix="give --since, or --start before --end")
    s = (s // step_s + 1) * step_s
    e = (e // step_s) * step_s
    with PromClient(url, **dict(client_kwargs or {})) as client:
        src = PrometheusSource(client, start_s=s, end_s=e, step_s=step_s,
                               metrics=PROFILE_METRICS)
        table = pa.Table.from_batches(list(src.batches()), schema=SAMPLE_SCHEMA)
        # team / project / user from kube_pod_labels, as the fleet audit attributes them
        kube = pod_labels(client, start_s=s, end_s=e)
        table = attribute_table(table, Attributor(None, kube))
    if table.num_rows == 0:
        raise InputError("no dcgm-exporter samples in the range", where=url,
                         fix="check --since/--start/--end")
    rec = Recording(table=table, source="prometheus", origin=src.origin, interval_s=step_s,
                    notes=src.notes)
    return rec, {"prometheus": url, "start": s, "end": e, "step_s": step_s}


def simulate(
    samples: SampleSource | Recording | pa.Table | str | Path | None = None,
    *,
    prometheus: str | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    client_kwargs: Mapping[str, Any] | None = None,
    policy: str | Sequence[str] = "all",
    by: str | Sequence[str] | None = None,
    step_s: float = 60.0,
    headroom: float = 0.10,
    replicas: int | None = None,
    plan: bool = True,
    gpu_model: str | None = None,
    price: Decimal | str | float | None = None,
    provider: str | None = None,
    purchase: str = "on-demand",
    catalog: str | Path | None = None,
) -> CapacityReport[Simulation]:
    """Replay the history packed by each ``policy`` (``mig``, ``mps``, ``timeslice`` or
    ``"all"``) onto ``gpu_model`` (default: the model most workloads ran on); ``value`` is a
    :class:`~gpuaudit.capacity.simulate.Simulation`.

    The history is ``samples`` (a path, a recording, a table) or ``prometheus`` (a URL; the
    range ``start_s``..``end_s`` defaults to the last 7 days; ``client_kwargs`` go to
    :class:`~gpuaudit.measure.fleet.prometheus.PromClient`). ``by`` keeps groups apart
    (``"team"``, ``"team,project"`` or a sequence). ``plan``: also run the audit with the
    consolidation finding in (``CapacityReport.audit``)."""
    from gpuaudit.api.audit import audit_usage
    from gpuaudit.api.shared_read import profiles_and_usage
    from gpuaudit.capacity.simulate import POLICIES
    from gpuaudit.capacity.simulate import simulate as replay
    from gpuaudit.classify.phases import group_key_names
    from gpuaudit.hardware import TIME_SLICING_DEFAULT_REPLICAS
    from gpuaudit.price.catalog import load_user_catalog, resolve_rate
    from gpuaudit.recommend import Finding

    if (samples is None) == (prometheus is None):
        raise InputError("give either a recording PATH or --prometheus URL",
                         fix="gpuaudit simulate fleet.parquet --policy mig --gpu-model H100")
    policies = _policies(policy, POLICIES)
    keys = group_key_names(group_keys(by))
    history: SampleSource | Recording
    source: dict[str, Any]
    if prometheus is not None:
        history, source = _prometheus_history(prometheus, start_s=start_s, end_s=end_s,
                                              step_s=step_s, client_kwargs=client_kwargs)
    else:
        assert samples is not None
        history = open_source(samples)
        source = {"path": str(samples), "step_s": step_s} if isinstance(samples, (str, Path)) \
            else {"origin": str(getattr(history, "origin", "")), "step_s": step_s}
    # the plan's audit classifies the same batches the profiles read, on the other core
    prof, usage = profiles_and_usage(history, step_s=step_s, by=keys, audit=plan)
    user = load_user_catalog(catalog) if catalog else ()

    def rate(model: str | None) -> Rate:
        return resolve_rate(model, price=price, provider=provider, purchase=purchase,
                            user_catalog=user)

    models = sorted({m for m in prof.gpu_model if m})
    today: dict[str | None, Rate] = {m: rate(m) for m in models} if models else \
        {None: rate(gpu_model)}
    target = gpu_model or prof.main_model
    sim = replay(prof, policies=policies, target_model=target, target_rate=rate(target),
                 today_rates=today, headroom=headroom,
                 replicas=replicas or TIME_SLICING_DEFAULT_REPLICAS, by_group=bool(keys))
    saving = sim.saving()
    findings = () if saving is None else (
        Finding(CONSOLIDATION_SIGNAL, saving[0], saving[1], source="capacity"),)
    report = None if usage is None else audit_usage(
        usage.result(), findings=findings, price=price, provider=provider, purchase=purchase,
        catalog=catalog)
    return CapacityReport(sim, source, report, findings,
                          tuple(k.removeprefix("label:") for k in keys))


def _policies(policy: str | Sequence[str], known: Sequence[str]) -> tuple[str, ...]:
    chosen = tuple(known) if policy == "all" else (policy,) if isinstance(policy, str) \
        else tuple(policy)
    unknown = [p for p in chosen if p not in known]
    if unknown or not chosen:
        raise InputError(f"unknown consolidation policy {unknown or chosen!r}",
                         fix=f"use one or more of {', '.join(known)}, or \"all\"")
    return chosen
