"""The profiler-trace section of the terminal and Markdown reports.

Reads ``result.extra["trace"]``, the plain dict ``gpuaudit trace`` builds (Kineto: per-rank
temporal/idle/kernel breakdowns, top kernels, categories, tensor-core share, overlap, input
stalls, findings, notes; nsys: the kernel summary). Every figure is computed by
:mod:`gpuaudit.traces`; this module only formats.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuaudit.units import duration

__all__ = ["render_trace_markdown", "render_trace_terminal"]

_TOP = 5
_NAME_CHARS = 90


def _ms(ns: float | int | None) -> str:
    """A trace duration at its scale (us, ms, s): :func:`gpuaudit.units.duration`."""
    return "-" if ns is None else duration(ns / 1e9)


def _pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _short(name: str, n: int = _NAME_CHARS) -> str:
    return name if len(name) <= n else name[: n - 3] + "..."


def _esc(text: object) -> str:
    s = str(text)
    for ch in ("\\", "|", "<", ">", "*", "_", "`", "[", "]"):
        s = s.replace(ch, "\\" + ch)
    return s.replace("\n", " ")


def _files(t: Mapping[str, Any]) -> str:
    return ", ".join(Path(f).name for f in t.get("files", []))


def _rank_findings(t: Mapping[str, Any]) -> list[str]:
    many = len(t.get("ranks", [])) > 1
    return [f["sentence"] for f in t.get("findings", [])
            if f.get("rank") is not None or not many]


def _notes(t: Mapping[str, Any]) -> list[str]:
    out = [str(n["reason"]) + (f" ({n['where']})" if n.get("where") else "")
           for n in t.get("import_notes", [])]
    return out + [str(n) for n in t.get("notes", [])]


def render_trace_terminal(t: Mapping[str, Any]) -> str:
    """The trace section as plain text lines (no markup: kernel names hold brackets)."""
    if t.get("kind") == "nsys_kern_sum":
        return _nsys_terminal(t)
    out = ["Profiler trace", ""]
    models = t.get("gpu_models") or []
    out.append(f"  {len(t['ranks'])} rank(s) from {_files(t)}"
               + (f" ({', '.join(models)})" if models else ""))
    for r in t["ranks"]:
        out.append(
            f"  rank {r['rank']}: window {_ms(r['window_ns'])}, busy {_pct(r['busy_share'])} "
            f"(compute {_pct(r['compute_share'])}, non-compute {_pct(r['non_compute_share'])}), "
            f"idle {_pct(r['idle_share'])} = host wait {_ms(r['idle_host_wait_ns'])} + kernel "
            f"wait {_ms(r['idle_kernel_wait_ns'])} + other {_ms(r['idle_other_ns'])}")
        out.append(
            f"    {r['kernel_count']:,} GPU events; small (<10 us) {_pct(r['small_kernel_share'], 0)}"
            f"; tensor cores {_pct(r['tensor_core_share'], 0)} of matmul time; communication "
            f"{_ms(r['comm_ns'])}, overlapped {_pct(r['comm_comp_overlap_share'])}; input stall "
            f"{_ms(r['input_stall_ns'])} ({_pct(r['input_stall_share_of_idle'], 0)} of idle)")
        cats = sorted(r["category_share"].items(), key=lambda kv: -kv[1])[:6]
        out.append("    kernel time: " + ", ".join(f"{c} {100 * v:.0f}%" for c, v in cats))
        for k in r["top_kernels"][:_TOP]:
            out.append(f"      {100 * k['share_of_kernel_time']:5.1f}%  {k['count']:>6}x  "
                       f"{k['category']:<13} {_short(k['name'], 70)}")
    out.append("  kernel types (all ranks): " + ", ".join(
        f"{row['kernel_type']} {row['pct']:.1f}%" for row in t["kernel_type_breakdown"]))
    fl = t.get("flops")
    if fl:
        out.append(f"  achieved FLOP/s (from {fl['source']}):")
        out += [f"    - {s}" for s in fl["sentences"]]
        out += [f"      peak: {r['peak_reason']}" for r in fl["ranks"]]
    found = _rank_findings(t)
    if found:
        out.append("  trace findings:")
        out += [f"    - {s}" for s in found]
    out += [f"  note: {n}" for n in _notes(t)]
    return "\n".join(out) + "\n\n"


def _nsys_terminal(t: Mapping[str, Any]) -> str:
    total = t["kernel_time_ns"] or 1
    out = [f"nsys kernel summary {t['source']}: {_ms(t['kernel_time_ns'])} of kernel time"]
    for cat, ns in sorted(t["category_ns"].items(), key=lambda kv: -kv[1]):
        out.append(f"  {cat:<14} {_ms(ns):>14}  {100 * ns / total:5.1f}%")
    out.append(f"tensor-core share of matmul time: {_pct(t['tensor_core_share'], 0)}; kernels "
               f"under 10 us: {_pct(t['small_kernel_share'], 0)} of launches")
    out.append("top kernels:")
    for k in t["top_kernels"][:10]:
        out.append(f"  {100 * k['share_of_kernel_time']:5.1f}%  {k['count']:>7}x  "
                   f"{k['category']:<13} {_short(k['name'], 80)}")
    cost = t.get("cost")
    if cost:
        out.append(f"cost of kernel time: ${cost['kernel_time_usd']} "
                   f"({cost['kernel_gpu_hours']} GPU-h at {cost['rate']})")
    out.append(t.get("cost_statement", ""))
    out.append("a summary has no timeline; it cannot show: " + "; ".join(t["cannot_show"]))
    return "\n".join(out) + "\n"


def render_trace_markdown(t: Mapping[str, Any]) -> str:
    """The trace section as Markdown (headings, tables, lists)."""
    if t.get("kind") == "nsys_kern_sum":
        return _nsys_markdown(t)
    models = t.get("gpu_models") or []
    out = ["## Profiler trace", "",
           f"{len(t['ranks'])} rank(s) from {_esc(_files(t))}"
           + (f" ({_esc(', '.join(models))})" if models else "") + ".", "",
           "| rank | window | busy | compute | non-compute | idle | host wait | kernel wait "
           "| other idle | comm overlap | input stall (of idle) | tensor cores (of matmul) "
           "| small kernels |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in t["ranks"]:
        out.append(
            f"| {r['rank']} | {_ms(r['window_ns'])} | {_pct(r['busy_share'])} | "
            f"{_pct(r['compute_share'])} | {_pct(r['non_compute_share'])} | "
            f"{_pct(r['idle_share'])} | {_ms(r['idle_host_wait_ns'])} | "
            f"{_ms(r['idle_kernel_wait_ns'])} | {_ms(r['idle_other_ns'])} | "
            f"{_pct(r['comm_comp_overlap_share'])} | {_pct(r['input_stall_share_of_idle'])} | "
            f"{_pct(r['tensor_core_share'])} | {_pct(r['small_kernel_share'])} |")
    out += ["", "### Kernel types (all ranks)", "", "| kernel type | time | share |",
            "|---|---:|---:|"]
    out += [f"| {_esc(row['kernel_type'])} | {_ms(row['sum_ns'])} | {row['pct']:.1f}% |"
            for row in t["kernel_type_breakdown"]]
    for r in t["ranks"]:
        out += ["", f"### Rank {r['rank']}: kernel categories and top kernels", "",
                "| category | time | share |", "|---|---:|---:|"]
        for c, v in sorted(r["category_ns"].items(), key=lambda kv: -kv[1]):
            out.append(f"| {c} | {_ms(v)} | {_pct(r['category_share'][c])} |")
        out += ["", "| kernel | category | tensor cores | count | total | share |",
                "|---|---|---|---:|---:|---:|"]
        for k in r["top_kernels"][:_TOP]:
            out.append(f"| {_esc(_short(k['name']))} | {k['category']} | "
                       f"{'yes' if k['tensor_core'] else 'no'} | {k['count']:,} | "
                       f"{_ms(k['total_ns'])} | {_pct(k['share_of_kernel_time'])} |")
    out += _flops_markdown(t.get("flops"))
    found = _rank_findings(t)
    if found:
        out += ["", "### Trace findings", ""] + [f"- {_esc(s)}" for s in found]
    notes = _notes(t)
    if notes:
        out += ["", "### Trace notes", ""] + [f"- {_esc(n)}" for n in notes]
    return "\n".join(out) + "\n"


def _tf(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _flops_markdown(fl: Mapping[str, Any] | None) -> list[str]:
    if not fl:
        return []
    out = ["", "### Achieved FLOP/s vs peak", "", f"FLOPs from {_esc(fl['source'])}; a lower "
           "bound (operators without a FLOP formula count zero).", "",
           "| rank | GFLOP | operators | window | TFLOP/s (window) | TFLOP/s (GPU busy) "
           "| peak | share of peak (busy) | memory-bound kernel time |",
           "|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in fl["ranks"]:
        peak = (f"{_esc(r['gpu_model'])} {r['peak_precision']} {r['peak_tflops']:g} TFLOP/s"
                if r["peak_tflops"] else "n/a")
        out.append(
            f"| {r['rank']} | {r['flops'] / 1e9:,.3f} | {r['op_count']:,} | "
            f"{_ms(r['window_ns'])} ({r['window_source']}) | {_tf(r['tflops_per_s_window'])} "
            f"| {_tf(r['tflops_per_s_busy'])} | {peak} | {_pct(r['share_of_peak_busy'], 2)} | "
            f"{_pct(r['memory_bound_kernel_share'], 0)} |")
    out += [""] + [f"- rank {r['rank']} peak: {_esc(r['peak_reason'])}" for r in fl["ranks"]]
    return out


def _nsys_markdown(t: Mapping[str, Any]) -> str:
    total = t["kernel_time_ns"] or 1
    out = ["## nsys kernel summary", "",
           f"`{_esc(Path(str(t['source'])).name)}`: {_ms(t['kernel_time_ns'])} of kernel time; "
           f"tensor cores {_pct(t['tensor_core_share'], 0)} of matmul time; kernels under "
           f"10 us {_pct(t['small_kernel_share'], 0)} of launches.", "",
           "| category | time | share |", "|---|---:|---:|"]
    for cat, ns in sorted(t["category_ns"].items(), key=lambda kv: -kv[1]):
        out.append(f"| {cat} | {_ms(ns)} | {100 * ns / total:.1f}% |")
    out += ["", "| kernel | category | count | total | share |", "|---|---|---:|---:|---:|"]
    for k in t["top_kernels"][:10]:
        out.append(f"| {_esc(_short(k['name']))} | {k['category']} | {k['count']:,} | "
                   f"{_ms(k['total_ns'])} | {_pct(k['share_of_kernel_time'])} |")
    cost = t.get("cost")
    out.append("")
    if cost:
        out.append(f"- **cost of kernel time**: ${cost['kernel_time_usd']} "
                   f"({cost['kernel_gpu_hours']} GPU-h at {_esc(cost['rate'])})")
    out.append(f"- {_esc(t.get('cost_statement', ''))}")
    out.append("- a summary has no timeline; it cannot show: "
               + "; ".join(_esc(c) for c in t["cannot_show"]))
    return "\n".join(out) + "\n"
