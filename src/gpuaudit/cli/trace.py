"""``gpuaudit trace``: profiler traces (Kineto JSON, nsys kernel summary CSV), kernel by kernel,
in dollars."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import click

from gpuaudit.errors import InputError

_HOURS_PER_MONTH = Decimal(720)


def _rate(gpu_model: str | None, provider: str | None, price: str | None,
          purchase: str) -> Any:
    if gpu_model is None and price is None:
        return None
    from gpuaudit.price.catalog import resolve_rate

    return resolve_rate(gpu_model, price=price, provider=provider, purchase=purchase)


def _money(rate: Any, gpus: int, idle_share: float) -> dict[str, Any] | None:
    """Idle share of the profiled window, priced per GPU-hour (Decimal, to the cent)."""
    if rate is None:
        return None
    per_hour = Decimal(rate.usd_per_gpu_hour)
    share = Decimal(str(round(idle_share, 6)))
    idle_h = per_hour * share
    return {
        "rate": rate.describe(),
        "gpus": gpus,
        "usd_per_gpu_hour": str(per_hour),
        "idle_usd_per_gpu_hour": str(idle_h.quantize(Decimal("0.0001"))),
        "idle_usd_per_month_all_gpus": str((idle_h * _HOURS_PER_MONTH * gpus)
                                           .quantize(Decimal("0.01"))),
        "assumption": "the profiled window is representative of the job's whole run; "
                      "a month is 720 h",
    }


def build_report(paths: list[Path], *, hta_compat: bool, include_last_step: bool,
                 window_ms: float, gpu_model: str | None, provider: str | None,
                 price: str | None, purchase: str) -> dict[str, Any]:
    """Everything ``gpuaudit trace`` prints, as plain data (JSON-ready)."""
    if len(paths) == 1 and paths[0].suffix.lower() == ".csv":
        from gpuaudit.traces.nsys import read_nsys_kern_sum

        summary = read_nsys_kern_sum(paths[0])
        return {"kind": "nsys_kern_sum", **summary.as_dict()}
    from gpuaudit.traces.analysis import AnalysisOptions, analyze
    from gpuaudit.traces.loader import load_traces
    from gpuaudit.traces.recording import findings, trace_to_recording

    trace = load_traces(paths)
    opt = AnalysisOptions(hta_compat=hta_compat, include_last_step=include_last_step)
    analysis = analyze(trace, opt)
    rec = trace_to_recording(trace, window_s=window_ms / 1000.0, options=opt)
    window = sum(r.window_ns for r in analysis.ranks)
    idle = sum(r.idle_ns for r in analysis.ranks)
    model = gpu_model or next((m for r in trace.ranks if (m := r.device_name(None))), None)
    rate = _rate(model, provider, price, purchase) if (gpu_model or price or provider) else None
    return {
        "kind": "kineto",
        "files": [str(r.path) for r in trace.ranks],
        "gpu_models": sorted({m for r in trace.ranks if (m := r.device_name(None))}),
        "busy_share": (window - idle) / window if window else None,
        "idle_share": idle / window if window else None,
        "cost": _money(rate, len(trace.ranks), idle / window if window else 0.0),
        **analysis.as_dict(),
        "findings": [f.__dict__ for f in findings(analysis)],
        "recording": {"rows": rec.table.num_rows, "interval_s": rec.interval_s,
                      "origin": rec.origin},
        "import_notes": [n.__dict__ for n in trace.all_notes()],
    }


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.1f} ms"


def render_text(rep: dict[str, Any]) -> str:
    """A short human report (terminal or Markdown-ish plain text)."""
    out: list[str] = []
    if rep["kind"] == "nsys_kern_sum":
        out.append(f"nsys kernel summary {rep['source']}: {_ms(rep['kernel_time_ns'])} of "
                   "kernel time")
        for cat, ns in sorted(rep["category_ns"].items(), key=lambda kv: -kv[1]):
            out.append(f"  {cat:<14} {_ms(ns):>14}  {100 * ns / rep['kernel_time_ns']:5.1f}%")
        if rep["tensor_core_share"] is not None:
            out.append(f"tensor-core share of matmul time: {100 * rep['tensor_core_share']:.0f}%")
        out.append("top kernels:")
        for k in rep["top_kernels"]:
            out.append(f"  {100 * k['share_of_kernel_time']:5.1f}%  {k['count']:>7}x  "
                       f"{k['category']:<12} {k['name'][:80]}")
        out.append("a summary has no timeline; it cannot show: " + "; ".join(rep["cannot_show"]))
        return "\n".join(out)
    out.append(f"{len(rep['ranks'])} rank(s) from {', '.join(Path(f).name for f in rep['files'])}"
               + (f" ({', '.join(rep['gpu_models'])})" if rep["gpu_models"] else ""))
    for r in rep["ranks"]:
        w = r["window_ns"] or 1
        out.append(
            f"rank {r['rank']}: window {_ms(r['window_ns'])}, busy {100 * r['busy_ns'] / w:.1f}%"
            f" (compute {100 * r['compute_ns'] / w:.1f}%, non-compute "
            f"{100 * r['non_compute_ns'] / w:.1f}%), idle {100 * r['idle_ns'] / w:.1f}% = host "
            f"wait {_ms(r['idle_host_wait_ns'])} + kernel wait {_ms(r['idle_kernel_wait_ns'])}"
            f" + other {_ms(r['idle_other_ns'])}")
        cats = sorted(r["category_ns"].items(), key=lambda kv: -kv[1])[:6]
        total = sum(r["category_ns"].values()) or 1
        out.append("  kernels: " + ", ".join(f"{c} {100 * v / total:.0f}%" for c, v in cats))
        for k in r["top_kernels"][:5]:
            out.append(f"    {100 * k['share_of_kernel_time']:5.1f}%  {k['count']:>6}x  "
                       f"{k['category']:<12} {k['name'][:70]}")
    out.append("kernel types (all ranks): " + ", ".join(
        f"{row['kernel_type']} {row['pct']:.1f}%" for row in rep["kernel_type_breakdown"]))
    if rep.get("cost"):
        c = rep["cost"]
        out.append(f"cost: {c['rate']}; idle costs ${c['idle_usd_per_gpu_hour']} per GPU-hour, "
                   f"${c['idle_usd_per_month_all_gpus']}/month for {c['gpus']} GPU(s) "
                   f"({c['assumption']})")
    out.append("findings:")
    for f in rep["findings"]:
        if f.get("rank") is not None or len(rep["ranks"]) == 1:
            out.append(f"  - {f['sentence']}")
    for n in rep["import_notes"]:
        out.append(f"note: {n['reason']}" + (f" ({n['where']})" if n.get("where") else ""))
    for n in rep["notes"]:
        out.append(f"note: {n}")
    return "\n".join(out)


@click.command("trace")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--gpu-model", default=None, help="GPU model to price (default: from the trace).")
@click.option("--provider", default=None, help="Cloud provider for the price (aws, gcp, ...).")
@click.option("--price", default=None, help="Price per GPU-hour (overrides the catalog).")
@click.option("--purchase", default="on-demand", show_default=True,
              help="Purchase option: on-demand, spot, committed.")
@click.option("--format", "fmt", type=click.Choice(["terminal", "json", "markdown"]),
              default="terminal", show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write the report here instead of stdout.")
@click.option("--window-ms", default=100.0, show_default=True,
              help="Window of the per-rank busy series (the recording).")
@click.option("--hta-compat", is_flag=True,
              help="Reproduce HolisticTraceAnalysis 0.5.0 exactly (us rounding, its NCCL regex).")
@click.option("--include-last-step", is_flag=True,
              help="Keep the last ProfilerStep (HTA drops it).")
def trace_cmd(paths: tuple[Path, ...], gpu_model: str | None, provider: str | None,
              price: str | None, purchase: str, fmt: str, output: Path | None,
              window_ms: float, hta_compat: bool, include_last_step: bool) -> None:
    """Analyse PyTorch profiler traces (a directory of rank traces, .json/.json.gz) or an
    nsys cuda_gpu_kern_sum CSV: busy/idle, idle causes, kernel classes, overlap, input
    stalls, tensor-core use, and what the idle time costs."""
    if window_ms <= 0:
        raise InputError(f"--window-ms {window_ms} must be positive", where="--window-ms",
                         fix="e.g. --window-ms 100")
    rep = build_report(list(paths), hta_compat=hta_compat, include_last_step=include_last_step,
                       window_ms=window_ms, gpu_model=gpu_model, provider=provider,
                       price=price, purchase=purchase)
    text = json.dumps(rep, indent=2, default=str) if fmt == "json" else render_text(rep)
    if output is not None:
        output.write_text(text + "\n")
    else:
        click.echo(text)
