"""``gpuaudit rightsize``, ``simulate`` and ``queue``: capacity planning on history.

The compositions are :func:`gpuaudit.api.rightsize.rightsize`,
:func:`gpuaudit.api.simulate.simulate` and :func:`gpuaudit.api.queue.audit_queue`; these
commands parse the options and render the ``gpuaudit.capacity`` document they return
(docs/planning.md, docs/json-schema.md).
"""

from __future__ import annotations

import time
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


def _pricing(kw: dict[str, Any]) -> dict[str, Any]:
    return {k: kw[k] for k in ("price", "provider", "purchase", "catalog", "gpu_model")}


def _emit(report: Any, fmt: str, output: Path | None) -> None:
    write_output(report.render(fmt), output, f"{fmt} report")


@click.command("rightsize")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--sla-p99-ms", type=Number(LATENCY_MS), default=None,
              help="p99 latency the job must keep.")
@click.option("--throughput", type=Parsed("gpuaudit.api.rightsize:parse_throughput", "RATE"),
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
    from gpuaudit.api.rightsize import rightsize
    from gpuaudit.report.progress import progress

    with progress(f"sizing {path.name}"):
        report = rightsize(path, sla_p99_ms=sla_p99_ms, throughput=throughput, unit=unit,
                           p99_ms_now=p99_ms_now, bench=bench, headroom=headroom,
                           max_busy_pct=max_busy, duty=duty, flops_per_unit=flops_per_unit,
                           trace=trace_path, step_s=step_s, plan=not no_plan, **_pricing(kw))
    _emit(report, fmt, output)


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
    from gpuaudit.api.simulate import simulate

    if (path is None) == (prometheus is None):
        raise InputError("give either a recording PATH or --prometheus URL",
                         fix="gpuaudit simulate fleet.parquet --policy mig --gpu-model H100")
    s = e = None
    if prometheus is not None:
        s, e = _range(since_s, start_s, end_s, 7 * 86400.0)
    from gpuaudit.report.progress import progress

    with progress(f"simulating {policy} on {path.name if path else prometheus}"):
        report = simulate(path, prometheus=prometheus, start_s=s, end_s=e,
                          client_kwargs={"timeout_s": timeout_s,
                                         "bearer_token_file": bearer_token_file},
                          policy=policy, by=by, step_s=step_s, headroom=headroom,
                          replicas=replicas, plan=not no_plan, **_pricing(kw))
    _emit(report, fmt, output)


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
    from gpuaudit.api.queue import audit_queue

    s, e = _range(since_s, start_s, end_s, 7 * 86400.0)
    qa = audit_queue(
        prometheus, start_s=s, end_s=e, step_s=step_s, namespaces=namespaces,
        client_kwargs={"timeout_s": timeout_s, "bearer_token_file": bearer_token_file},
        pricing=_pricing(kw), plan=not no_plan)
    _emit(qa, fmt, output)
