"""``gpuaudit trace``: profiler traces (Kineto JSON, nsys kernel summary CSV) through the
priced report. The composition is :func:`gpuaudit.api.trace.trace` (and
:func:`~gpuaudit.api.trace.kernel_summary` for an nsys ``cuda_gpu_kern_sum`` CSV); this
command parses the options and renders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuaudit.cli.options import emit, output_options, pricing_kwargs, pricing_options
from gpuaudit.cli.output import write_output
from gpuaudit.cli.params import Number
from gpuaudit.validate import WINDOW_MS


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
    plist = list(paths)
    from gpuaudit._workers import prestart_trace

    prestart_trace(plist)  # a large trace's decoding helper imports beside this process
    pricing = pricing_kwargs(kw)
    if len(plist) == 1 and plist[0].suffix.lower() == ".csv":
        from gpuaudit.api.trace import kernel_summary

        summary = kernel_summary(plist[0], gpu_model=pricing["gpu_model"],
                                 price=pricing["price"], provider=pricing["provider"],
                                 purchase=pricing["purchase"], catalog=pricing["catalog"])
        write_output(summary.render(fmt), output, f"{fmt} report")
        return
    from gpuaudit.api.trace import trace
    from gpuaudit.report.progress import progress

    with progress(f"analysing {len(plist)} trace path(s)"):
        report = trace(plist, window_ms=window_ms, hta_compat=hta_compat,
                       include_last_step=include_last_step, **pricing)
    emit(report, fmt, output)
