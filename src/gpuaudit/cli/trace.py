"""``gpuaudit trace``: profiler traces (Kineto JSON, nsys kernel summary CSV) through the
priced report.

A Kineto trace becomes a :class:`~gpuaudit.schema.Recording` (one GPU series per rank, busy
share per window, :func:`gpuaudit.traces.recording.trace_to_recording`); its findings become
:class:`gpuaudit.recommend.plan.Finding` evidence for the recommender, and the analyses travel
in ``extra["trace"]`` (JSON as is, terminal and Markdown through
:mod:`gpuaudit.report.trace`). The traces package never imports recommend: the conversion
happens here, in the composition layer.

An nsys ``cuda_gpu_kern_sum`` CSV has no timeline, so it cannot be classified or have its idle
time priced: the command prints the kernel breakdown and, given a rate, the cost of the kernel
time alone, saying so.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import click

from gpuaudit.cli.options import emit, output_options, pricing_kwargs, pricing_options
from gpuaudit.cli.output import write_output
from gpuaudit.cli.params import Number
from gpuaudit.errors import InputError
from gpuaudit.validate import WINDOW_MS

_NS_PER_HOUR = Decimal(3_600_000_000_000)


def trace_extra(paths: list[Path], *, hta_compat: bool, include_last_step: bool,
                window_ms: float, gpu_model: str | None = None
                ) -> tuple[Any, dict[str, Any], list[Any]]:
    """(Recording, ``extra["trace"]`` dict, findings as recommend Findings) for Kineto traces.

    ``gpu_model`` (``--gpu-model``) names the GPU whose peak the achieved FLOP/s is compared
    with where the trace's ``deviceProperties`` do not."""
    from gpuaudit.recommend.plan import Finding
    from gpuaudit.traces.analysis import AnalysisOptions, analyze
    from gpuaudit.traces.flops import SOURCE, achieved_flops, flop_evidence, sentence
    from gpuaudit.traces.loader import load_traces
    from gpuaudit.traces.recording import findings, trace_to_recording

    trace = load_traces(paths)
    opt = AnalysisOptions(hta_compat=hta_compat, include_last_step=include_last_step)
    analysis = analyze(trace, opt)
    rec = trace_to_recording(trace, window_s=window_ms / 1000.0, options=opt)
    window = sum(r.window_ns for r in analysis.ranks)
    idle = sum(r.idle_ns for r in analysis.ranks)
    tfs = findings(analysis)
    # one Finding per signal for the rules: the job-wide (worst rank) one where there are
    # several ranks, it comes last
    last: dict[str, Any] = {}
    for f in tfs:
        last[f.signal] = f
    evidence = [Finding(signal=f.signal, value=float(f.value), text=f.sentence, source="trace")
                for f in last.values()]
    flops = achieved_flops(trace, analysis, gpu_model=gpu_model)
    signals = flop_evidence(flops)
    if signals:
        top = max((r for r in flops if r.share_of_peak_busy is not None),
                  key=lambda r: r.share_of_peak_busy or 0.0)
        evidence += [Finding(signal=k, value=v, text=sentence(top), source="trace")
                     for k, v in signals.items()]
    extra = {
        "kind": "kineto",
        "files": [str(r.path) for r in trace.ranks],
        "gpu_models": sorted({m for r in trace.ranks if (m := r.device_name(None))}),
        "window_ns": window,
        "busy_share": (window - idle) / window if window else None,
        "idle_share": idle / window if window else None,
        **analysis.as_dict(),
        "findings": [dict(f.__dict__) for f in tfs],
        "flops": {"source": SOURCE, "ranks": [r.as_dict() for r in flops],
                  "sentences": [sentence(r) for r in flops]} if flops else None,
        "recording": {"rows": rec.table.num_rows, "interval_s": rec.interval_s,
                      "origin": rec.origin},
        "import_notes": [dict(n.__dict__) for n in trace.all_notes()],
    }
    return rec, extra, evidence


def nsys_extra(path: Path, pricing: dict[str, Any]) -> dict[str, Any]:
    """``extra["trace"]`` for an nsys kernel summary, with the kernel time priced if a rate
    can be resolved (``--price``, or ``--gpu-model``: the summary names no GPU)."""
    from gpuaudit.traces.nsys import read_nsys_kern_sum

    rep: dict[str, Any] = {"kind": "nsys_kern_sum", **read_nsys_kern_sum(path).as_dict()}
    if pricing.get("price") is None and pricing.get("gpu_model") is None:
        rep["cost"] = None
        rep["cost_statement"] = ("not priced: an nsys kernel summary names no GPU model; pass "
                                 "--gpu-model or --price to price its kernel time")
        return rep
    from gpuaudit.price.catalog import load_user_catalog, resolve_rate

    user = load_user_catalog(pricing["catalog"]) if pricing.get("catalog") else ()
    rate = resolve_rate(pricing.get("gpu_model"), price=pricing.get("price"),
                        provider=pricing.get("provider"),
                        purchase=pricing.get("purchase", "on-demand"), user_catalog=user)
    kernel_h = Decimal(int(rep["kernel_time_ns"])) / _NS_PER_HOUR
    rep["cost"] = {
        "rate": rate.describe(),
        "usd_per_gpu_hour": str(rate.usd_per_gpu_hour),
        "kernel_gpu_hours": str(kernel_h.quantize(Decimal("0.000001"))),
        "kernel_time_usd": str((kernel_h * rate.usd_per_gpu_hour).quantize(Decimal("0.01"))),
    }
    rep["cost_statement"] = ("priced: the GPU time spent in kernels only, a lower bound on "
                             "what the run cost; a summary has no timeline, so idle time (the "
                             "usual waste) is neither measured nor priced")
    return rep


@click.command("trace")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--window-ms", type=Number(WINDOW_MS), default=100.0, show_default=True,
              help="Window of the per-rank busy series (the recording that is priced).")
@click.option("--hta-compat", is_flag=True,
              help="Reproduce HolisticTraceAnalysis 0.5.0 exactly (us rounding, its NCCL regex).")
@click.option("--include-last-step", is_flag=True,
              help="Keep the last ProfilerStep (HTA drops it).")
@pricing_options
@output_options
def trace_cmd(paths: tuple[Path, ...], window_ms: float, hta_compat: bool,
              include_last_step: bool, fmt: str, output: Path | None, **kw: Any) -> None:
    """Audit PyTorch profiler traces (a directory of rank traces, .json/.json.gz) or an nsys
    cuda_gpu_kern_sum CSV: busy/idle and its causes, kernel classes, overlap, input stalls,
    tensor-core use, what it costs and what to change."""
    pricing = pricing_kwargs(kw)
    plist = list(paths)
    if len(plist) == 1 and plist[0].suffix.lower() == ".csv":
        _emit_nsys(nsys_extra(plist[0], pricing), fmt, output)
        return
    from gpuaudit.api import audit

    rec, extra, evidence = trace_extra(plist, hta_compat=hta_compat,
                                       include_last_step=include_last_step,
                                       window_ms=window_ms, gpu_model=pricing.get("gpu_model"))
    if rec.table.num_rows == 0:
        fl = extra.get("flops")
        counted = (" (its CPU operators count " + "; ".join(fl["sentences"]) + ", from "
                   + fl["source"] + ")") if fl else ""
        raise InputError(
            "the trace(s) hold no GPU kernel events, so there is no GPU time to audit"
            + counted,
            where=", ".join(str(p) for p in plist),
            fix="record with torch.profiler activities=[ProfilerActivity.CPU, "
            "ProfilerActivity.CUDA]",
        )
    result = audit(rec, findings=evidence, extra={"trace": extra}, **pricing)
    emit(result, fmt, output)


def _emit_nsys(rep: dict[str, Any], fmt: str, output: Path | None) -> None:
    from gpuaudit.report.trace import render_trace_markdown, render_trace_terminal

    if fmt == "json":
        text = json.dumps({"trace": rep}, indent=2, default=str) + "\n"
    elif fmt == "markdown":
        text = "# gpuaudit trace report\n\n" + render_trace_markdown(rep)
    elif fmt == "terminal":
        text = render_trace_terminal(rep)
    else:
        raise InputError(
            f"--format {fmt} needs a timeline; an nsys kernel summary has none",
            where=rep.get("source"),
            fix="use --format terminal, markdown or json for a kernel summary",
        )
    write_output(text, output, f"{fmt} report")
