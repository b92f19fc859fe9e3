"""``gpuaudit rightsize``, ``simulate`` and ``queue``: capacity planning on history.

Thin compositions: open the history with the readers gpuaudit already has (files through
:func:`gpuaudit.api.open_source`, Prometheus through
:class:`~gpuaudit.measure.fleet.prometheus.PrometheusSource`), build profiles, run the capacity
stage, hand its answer to the recommender as a finding (through :func:`gpuaudit.api.audit`),
render the ``gpuaudit.capacity`` document (docs/planning.md, docs/json-schema.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import click

from gpuaudit.cli.options import output_options, pricing_options
from gpuaudit.cli.output import write_output
from gpuaudit.cli.params import Duration, Number, Parsed, Time
from gpuaudit.errors import InputError
from gpuaudit.validate import (
    BUSY_PCT,
    DUTY,
    FLEET_SINCE_S,
    HEADROOM,
    LATENCY_MS,
    REPLICAS,
    STEP_S,
    TIMEOUT_S,
    Quantity,
)

#: FLOPs one unit of --throughput costs (2 x parameters per token for a transformer's forward)
FLOPS_PER_UNIT = Quantity("the FLOPs per unit of throughput", "FLOP", 0.0, 1e18, low_open=True,
                          example="1.4e10")

__all__ = ["queue_cmd", "rightsize_cmd", "simulate_cmd"]

#: the dcgm-exporter fields profiles read (utilization, SM, memory, power, DRAM and tensor
#: activity): a raw pull of only these, not every field the fleet audit reads
PROFILE_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                   "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
                   "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")


def _prom_options(f: Any) -> Any:
    for opt in reversed([
        click.option("--since", "since_s", type=Duration(FLEET_SINCE_S), default=None,
                     help="Range ending now (or --end), e.g. 14d."),
        click.option("--start", "start_s", type=Time(), default=None,
                     help="Range start (ISO 8601 or epoch seconds)."),
        click.option("--end", "end_s", type=Time(), default=None,
                     help="Range end (ISO 8601, epoch seconds, now)."),
        click.option("--bearer-token-file", type=click.Path(path_type=Path), default=None,
                     help="Bearer token file (re-read per request)."),
        click.option("--timeout", "timeout_s", type=Number(TIMEOUT_S), default=60.0,
                     show_default=True, help="Seconds per Prometheus request."),
    ]):
        f = opt(f)
    return f


def _range(since_s: float | None, start_s: float | None, end_s: float | None,
           default_s: float) -> tuple[float, float]:
    e = end_s if end_s is not None else time.time()
    s = start_s if start_s is not None else e - (since_s or default_s)
    if e <= s:
        raise InputError("the range is empty (--end is not after --start)",
                         fix="give --since, or --start before --end")
    return s, e


def _emit(doc: dict[str, Any], fmt: str, output: Path | None) -> None:
    from gpuaudit.report.capacity import render_capacity

    write_output(render_capacity(doc, fmt), output, f"{fmt} report")


def _plan(samples: Any, findings: Sequence[Any], pricing: dict[str, Any]) -> dict[str, Any]:
    """The audit's recommendations and combined savings with the capacity findings in."""
    from gpuaudit.api import audit

    return _plan_of(audit(samples, findings=findings, **pricing), findings)


def _plan_of(report: Any, findings: Sequence[Any]) -> dict[str, Any]:
    d = report.to_dict()
    return {"recommendations": d["recommendations"], "savings": d["savings"],
            "findings": [{"signal": f.signal, "value": f.value, "text": f.text}
                         for f in findings]}


def _pricing(price: str | None, provider: str | None, purchase: str,
             catalog: Path | None, gpu_model: str | None) -> dict[str, Any]:
    return {"price": price, "provider": provider, "purchase": purchase, "catalog": catalog,
            "gpu_model": gpu_model}


def _trace_tflops(path: Path, model: str | None) -> tuple[float, int, str]:
    """(achieved TFLOP/s over each rank's trace window, summed over ranks; ranks; origin)."""
    from gpuaudit.traces.analysis import analyze
    from gpuaudit.traces.flops import achieved_flops
    from gpuaudit.traces.loader import load_traces

    trace = load_traces([path])
    rows = achieved_flops(trace, analyze(trace), gpu_model=model)
    if not rows:
        raise InputError("the trace carries no operator FLOP counts (args.flops)",
                         where=str(path),
                         fix="record with torch.profiler.profile(..., with_flops=True), or give "
                         "--flops-per-unit with --throughput")
    total = sum(r.tflops_per_s_window or 0.0 for r in rows)
    return total, len(trace.ranks), f"trace {path.name}"


@click.command("rightsize")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--sla-p99-ms", type=Number(LATENCY_MS), default=None,
              help="p99 latency the job must keep.")
@click.option("--throughput", type=Parsed("gpuaudit.capacity.rightsize:parse_throughput", "RATE"),
              default=None,
              help="Rate the run served and must keep, e.g. 1200/s (per second by default).")
@click.option("--unit", type=click.Choice(["inferences", "tokens", "samples"]),
              default="inferences", show_default=True, help="What --throughput counts.")
@click.option("--p99-ms-now", type=Number(LATENCY_MS), default=None,
              help="p99 latency measured on the current GPU (scaled to candidates).")
@click.option("--bench", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="CSV of measured gpu_model,throughput_per_s,p99_ms.")
@click.option("--headroom", type=Number(HEADROOM), default=0.10, show_default=True,
              help="Memory headroom over the p99 memory used.")
@click.option("--max-busy", type=Number(BUSY_PCT), default=90.0, show_default=True,
              help="Highest busy share (%) a candidate may run at.")
@click.option("--duty", type=Number(DUTY), default=1.0, show_default=True,
              help="Share of the month's hours the work runs (owned-hardware TCO).")
@click.option("--flops-per-unit", type=Number(FLOPS_PER_UNIT), default=None,
              help="FLOPs one unit of --throughput costs (e.g. 2 x parameters per token): "
              "achieved FLOP/s and its share of peak.")
@click.option("--trace", "trace_path", type=click.Path(exists=True, path_type=Path),
              default=None, help="A PyTorch profiler trace of the same job recorded with "
              "with_flops=True (file or folder of rank traces): achieved FLOP/s from its "
              "operator FLOP counts, instead of --flops-per-unit.")
@click.option("--step", "step_s", type=Duration(STEP_S), default="10s", show_default=True,
              help="Profile time step.")
@click.option("--no-plan", is_flag=True, help="Skip the audit's recommendations.")
@pricing_options
@output_options
def rightsize_cmd(path: Path, sla_p99_ms: float | None, throughput: float | None, unit: str,
                  p99_ms_now: float | None, bench: Path | None, headroom: float,
                  max_busy: float, duty: float, flops_per_unit: float | None,
                  trace_path: Path | None, step_s: float, no_plan: bool, fmt: str,
                  output: Path | None, **kw: Any) -> None:
    """The cheapest GPU, provider and purchase option that meets the measured need."""
    from gpuaudit.api import open_source
    from gpuaudit.capacity.profiles import build_profiles
    from gpuaudit.capacity.rightsize import load_bench, rightsize
    from gpuaudit.price.catalog import load_user_catalog, resolve_rate
    from gpuaudit.price.owned import load_owned
    from gpuaudit.recommend import Finding
    from gpuaudit.report.capacity import capacity_dict

    pricing = _pricing(kw["price"], kw["provider"], kw["purchase"], kw["catalog"],
                       kw["gpu_model"])
    user = load_user_catalog(kw["catalog"]) if kw["catalog"] else ()
    owned = load_owned(kw["catalog"]) if kw["catalog"] else ()
    src = open_source(path, gpu_model=kw["gpu_model"])
    prof = build_profiles(src, step_s=step_s)
    model = kw["gpu_model"] or prof.main_model
    rate = resolve_rate(model, price=kw["price"], provider=kw["provider"],
                        purchase=kw["purchase"], user_catalog=user)
    rs = rightsize(prof, current_rate=rate, current_model=model,
                   throughput_per_s=throughput,
                   unit=unit, sla_p99_ms=sla_p99_ms, p99_ms_now=p99_ms_now,
                   bench=load_bench(bench) if bench else (),
                   bench_name=bench.name if bench else "benchmark", user_catalog=user,
                   owned=owned, duty=duty, flops_per_unit=flops_per_unit,
                   trace_tflops=_trace_tflops(trace_path, model) if trace_path else None,
                   headroom=headroom,
                   max_busy_pct=max_busy)
    findings = []
    best = rs.best_for(rate.purchase, rate.provider)
    now = rs.current_usd_per_hour
    if best is not None and now > 0 and best.usd_per_hour < now:
        share = float(Decimal(1) - best.usd_per_hour / now)
        findings.append(Finding(
            "capacity_right_size_share", share,
            f"rightsize: {best.gpus} x {best.gpu_model} ({best.provider} {best.purchase}, "
            f"${best.usd_per_gpu_hour:.2f}/GPU-h, {best.basis}) meets the measured need for "
            f"${best.usd_per_hour:.2f}/h vs ${now:.2f}/h now"
            + ("" if best.sla_holds_if_p99_now_ms is None else
               f"; the p99 SLA holds if today's p99 is <= {best.sla_holds_if_p99_now_ms:.0f} ms "
               "(not measured)"), source="capacity"))
    plan = None if no_plan else _plan(path, findings, pricing)
    doc = capacity_dict(rs, plan=plan, source={"path": str(path), "step_s": prof.step_s})
    _emit(doc, fmt, output)


@click.command("simulate")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                required=False)
@click.option("--prometheus", default=None, metavar="URL",
              help="Read the history from Prometheus (dcgm-exporter series).")
@_prom_options
@click.option("--policy", type=click.Choice(["mig", "mps", "timeslice", "all"]), default="all",
              show_default=True, help="Consolidation policy to simulate.")
@click.option("--by", "by", multiple=True, metavar="KEY",
              help="Keep groups apart (namespace, pod, a label such as team).")
@click.option("--step", "step_s", type=Duration(STEP_S), default="1m", show_default=True,
              help="Simulation time step.")
@click.option("--headroom", type=Number(HEADROOM), default=0.10, show_default=True,
              help="Memory headroom over each workload's peak.")
@click.option("--replicas", type=Number(REPLICAS), default=None,
              help="Time-slicing replicas per GPU (default 4, NVIDIA's example).")
@click.option("--no-plan", is_flag=True, help="Skip the audit's recommendations.")
@pricing_options
@output_options
def simulate_cmd(path: Path | None, prometheus: str | None, since_s: float | None,
                 start_s: float | None, end_s: float | None, bearer_token_file: Path | None,
                 timeout_s: float, policy: str, by: tuple[str, ...], step_s: float,
                 headroom: float, replicas: int | None, no_plan: bool, fmt: str,
                 output: Path | None, **kw: Any) -> None:
    """Replay the history packed by MIG, MPS or time-slicing: GPUs needed, risk, dollars."""
    from gpuaudit.capacity.profiles import build_profiles
    from gpuaudit.capacity.simulate import POLICIES, simulate
    from gpuaudit.hardware import TIME_SLICING_DEFAULT_REPLICAS
    from gpuaudit.price.catalog import load_user_catalog, resolve_rate
    from gpuaudit.recommend import Finding
    from gpuaudit.report.capacity import capacity_dict

    if (path is None) == (prometheus is None):
        raise InputError("give either a recording PATH or --prometheus URL",
                         fix="gpuaudit simulate fleet.parquet --policy mig --gpu-model H100")
    keys = tuple(k.strip() for item in by for k in item.split(",") if k.strip())
    from gpuaudit.classify.phases import group_key_names

    keys = group_key_names(keys)
    samples: Any
    source: dict[str, Any]
    if prometheus is not None:
        from gpuaudit.measure.fleet.prometheus import PromClient, PrometheusSource
        from gpuaudit.schema import Recording

        s, e = _range(since_s, start_s, end_s, 7 * 86400.0)
        s = (s // step_s + 1) * step_s
        e = (e // step_s) * step_s
        import pyarrow as pa

        from gpuaudit.measure.fleet.prometheus import pod_labels
        from gpuaudit.price.attribution import Attributor, attribute_table
        from gpuaudit.schema import SAMPLE_SCHEMA

        with PromClient(prometheus, timeout_s=timeout_s,
                        bearer_token_file=bearer_token_file) as client:
            src = PrometheusSource(client, start_s=s, end_s=e, step_s=step_s,
                                   metrics=PROFILE_METRICS)
            table = pa.Table.from_batches(list(src.batches()), schema=SAMPLE_SCHEMA)
            # team / project / user from kube_pod_labels, as the fleet audit attributes them
            kube = pod_labels(client, start_s=s, end_s=e)
            table = attribute_table(table, Attributor(None, kube))
        if table.num_rows == 0:
            raise InputError("no dcgm-exporter samples in the range", where=prometheus,
                             fix="check --since/--start/--end")
        samples = Recording(table=table, source="prometheus", origin=src.origin,
                            interval_s=step_s, notes=src.notes)
        source = {"prometheus": prometheus, "start": s, "end": e, "step_s": step_s}
    else:
        from gpuaudit.api import open_source

        samples = path
        source = {"path": str(path), "step_s": step_s}
    prof = build_profiles(open_source(samples) if path is not None else samples,
                          step_s=step_s, by=keys)
    user = load_user_catalog(kw["catalog"]) if kw["catalog"] else ()

    def rate(model: str | None) -> Any:
        return resolve_rate(model, price=kw["price"], provider=kw["provider"],
                            purchase=kw["purchase"], user_catalog=user)

    models = sorted({m for m in prof.gpu_model if m})
    today: dict[str | None, Any] = {m: rate(m) for m in models} if models else \
        {None: rate(kw["gpu_model"])}
    target = kw["gpu_model"] or prof.main_model
    sim = simulate(prof, policies=POLICIES if policy == "all" else (policy,),
                   target_model=target, target_rate=rate(target), today_rates=today,
                   headroom=headroom, replicas=replicas or TIME_SLICING_DEFAULT_REPLICAS,
                   by_group=bool(keys))
    findings = []
    best = sim.best()
    if best is not None and best.monthly_today_usd > 0:
        share = float(best.monthly_saved_usd / best.monthly_today_usd)
        findings.append(Finding(
            "capacity_consolidation_share", share,
            f"simulate ({best.policy}): {best.gpus_today} GPUs -> {best.gpus_needed} "
            f"{sim.target_model} (lower bound {best.lower_bound}), contention "
            f"{best.contention_step_share:.1%} of GPU-steps, replayed over "
            f"{sim.steps} steps of {sim.step_s:g} s", source="capacity"))
    pricing = _pricing(kw["price"], kw["provider"], kw["purchase"], kw["catalog"], None)
    plan = None if no_plan else _plan(samples, findings, pricing)
    doc = capacity_dict(sim, plan=plan, source=source,
                        group_keys=[k.removeprefix("label:") for k in keys])
    _emit(doc, fmt, output)


@click.command("queue")
@click.option("--prometheus", required=True, metavar="URL",
              help="Prometheus with kube-state-metrics and dcgm-exporter series.")
@_prom_options
@click.option("--step", "step_s", type=Duration(STEP_S), default="1m", show_default=True,
              help="Resolution of the waits.")
@click.option("--namespace", "namespaces", multiple=True, help="Only these namespaces.")
@click.option("--no-plan", is_flag=True,
              help="Skip the fleet audit of the range and its recommendations.")
@pricing_options
@output_options
def queue_cmd(prometheus: str, since_s: float | None, start_s: float | None,
              end_s: float | None, bearer_token_file: Path | None, timeout_s: float,
              step_s: float, namespaces: tuple[str, ...], no_plan: bool, fmt: str,
              output: Path | None, **kw: Any) -> None:
    """Wait times of pods pending for nvidia.com/gpu, beside the GPU-hours idle meanwhile;
    the idle capacity while pods waited goes to the recommender as a scheduling finding."""
    from gpuaudit.api import audit_queue
    from gpuaudit.report.capacity import capacity_dict

    s, e = _range(since_s, start_s, end_s, 7 * 86400.0)
    qa = audit_queue(
        prometheus, start_s=s, end_s=e, step_s=step_s, namespaces=namespaces,
        client_kwargs={"timeout_s": timeout_s, "bearer_token_file": bearer_token_file},
        pricing=_pricing(kw["price"], kw["provider"], kw["purchase"], kw["catalog"],
                         kw["gpu_model"]), plan=not no_plan)
    plan = None if qa.report is None else _plan_of(qa.report, qa.findings)
    _emit(capacity_dict(qa.queue, plan=plan, source={"prometheus": prometheus}), fmt, output)
