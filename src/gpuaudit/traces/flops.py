"""Achieved FLOP/s from a trace's operator FLOP counts, as a share of the GPU's dense peak.

``torch.profiler.profile(with_flops=True)`` counts the FLOPs of the operators it has a formula
for (aten::mm, addmm, bmm, conv2d, mul, add ...) from their input shapes; the loader reads them
from ``args.flops`` on CPU operator events (:class:`gpuaudit.traces.loader.FlopOps`), or, where
the export left them out (torch 2.x), computes them from the operators' ``Input Dims`` with the
profiler's own formulas (:mod:`gpuaudit.traces.op_flops`; the trace's notes say so). The
counts are the profiler's, not gpuaudit's: operators without a formula (attention kernels
called through custom ops, fused Triton kernels) count zero, so the achieved figure is a lower
bound on the work done.

Achieved TFLOP/s is the total over the rank's analysed window (the GPU kernel window, or where
the trace has no GPU events the profiler's own span) and over its GPU busy time. The peak it
is compared with is the dense one of the precision the trace's matmul kernels use: bf16 (fp16
where a chip has no bf16) when tensor-core kernels carry at least half of the
gemm/convolution/attention kernel time, else fp32; the report says which and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuaudit.hardware import spec_for
from gpuaudit.traces.analysis import AnalysisOptions, RankAnalysis, TraceAnalysis
from gpuaudit.traces.loader import RankTrace, Trace

__all__ = ["LOW_PEAK_SHARE", "MEMORY_BOUND_KERNELS", "SOURCE", "AchievedFlops",
           "achieved_flops", "flop_evidence", "sentence"]

SOURCE = ("the profiler's operator FLOP counts (torch.profiler with_flops=True: args.flops "
          "on CPU operator events, or the profiler's formulas on their Input Dims)")
#: achieved FLOP/s under this share of the dense peak (over GPU busy time) is low
LOW_PEAK_SHARE = 0.25
#: kernel categories whose time is bounded by memory bandwidth, not by FLOP/s (their share is
#: of all kernel time but communication)
MEMORY_BOUND_KERNELS = ("memory", "elementwise", "reduction", "normalization")
_TENSOR_CORE_MAJORITY = 0.5


@dataclass(frozen=True)
class AchievedFlops:
    """One rank's achieved FLOP/s. ``tflops_per_s_*`` and ``share_of_peak_*`` are None
    where their denominator is unknown (no GPU busy time, no GPU model or spec row)."""

    rank: int
    flops: int
    op_count: int
    dropped_last_step_ops: int
    window_ns: int
    window_source: str
    gpu_busy_ns: int | None
    tflops_per_s_window: float | None
    tflops_per_s_busy: float | None
    gpu_model: str | None
    peak_precision: str | None
    peak_tflops: float | None
    peak_reason: str
    share_of_peak_window: float | None
    share_of_peak_busy: float | None
    memory_bound_kernel_share: float | None
    top_ops: list[dict[str, Any]]
    source: str = SOURCE

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _tflops(flops: int, ns: int | None) -> float | None:
    return flops / ns / 1e3 if ns else None  # FLOP per ns = GFLOP/s; / 1e3 = TFLOP/s


def _peak(model: str | None, ra: RankAnalysis | None) -> tuple[str | None, float | None, str]:
    spec = spec_for(model)
    if ra is None or ra.kernel_count == 0:
        return None, None, ("no GPU kernels in the trace: the operators ran on the CPU, so "
                            "there is no GPU peak to compare with")
    if spec is None:
        return None, None, (f"GPU model {model!r} has no row in the hardware table" if model
                            else "the trace names no GPU model (pass --gpu-model)")
    tc = ra.tensor_core_ns / ra.matmul_ns if ra.matmul_ns else None
    half = spec.bf16_dense_tflops or spec.fp16_dense_tflops
    if tc is not None and tc >= _TENSOR_CORE_MAJORITY and half is not None:
        prec = "bf16 dense" if spec.bf16_dense_tflops else "fp16 dense"
        return prec, half, (f"{spec.gpu_model} {prec} peak: tensor-core (half-precision) "
                            f"kernels carry {tc:.0%} of matmul/convolution/attention kernel "
                            "time")
    why = (f"tensor-core kernels carry only {tc:.0%} of matmul kernel time (mostly FP32)"
           if tc is not None else "the trace has no matmul/convolution/attention kernels")
    return "fp32", spec.fp32_tflops, f"{spec.gpu_model} fp32 peak: {why}"


def _rank(r: RankTrace, ra: RankAnalysis | None, opt: AnalysisOptions,
          gpu_model: str | None) -> AchievedFlops | None:
    ops = r.flop_ops
    if ops.size == 0:
        return None
    keep = np.ones(ops.size, dtype=bool)
    steps = [i for i, n in enumerate(r.spans.names) if n.startswith("ProfilerStep")]
    if not opt.include_last_step and len({r.spans.names[i] for i in steps}) >= 2:
        # the analysis leaves the last ProfilerStep's kernels out; its operators go too
        keep = ops.ts_ns < int(r.spans.ts_ns[steps].max())
    flops_kept = ops.flops[keep]
    total = int(flops_kept.sum())
    if ra is not None and ra.kernel_count:
        window, source = ra.window_ns, "GPU kernel window"
        busy: int | None = ra.busy_ns
    elif r.profiler_span is not None:
        window, source, busy = r.profiler_span[1] - r.profiler_span[0], "profiler span", None
    else:
        lo = int(ops.ts_ns.min())
        window, source, busy = int((ops.ts_ns + ops.dur_ns).max()) - lo, "operator span", None
    model = gpu_model or r.device_name(r.first_device())
    prec, peak, why = _peak(model, ra)
    per_s = _tflops(total, window)
    per_busy = _tflops(total, busy)
    by_name = np.bincount(ops.name_idx[keep], weights=flops_kept.astype(np.float64),
                          minlength=len(ops.names))
    count = np.bincount(ops.name_idx[keep], minlength=len(ops.names))
    order = np.argsort(-by_name, kind="stable")[:5]
    mb = None
    if ra is not None:
        kernel_ns = sum(v for c, v in ra.category_ns.items() if c != "communication")
        if kernel_ns:
            mb = sum(ra.category_ns.get(c, 0) for c in MEMORY_BOUND_KERNELS) / kernel_ns
    return AchievedFlops(
        rank=r.rank, flops=total, op_count=int(keep.sum()),
        dropped_last_step_ops=int((~keep).sum()), window_ns=window, window_source=source,
        gpu_busy_ns=busy, tflops_per_s_window=per_s, tflops_per_s_busy=per_busy,
        gpu_model=model, peak_precision=prec, peak_tflops=peak, peak_reason=why,
        share_of_peak_window=per_s / peak if per_s is not None and peak else None,
        share_of_peak_busy=per_busy / peak if per_busy is not None and peak else None,
        memory_bound_kernel_share=mb,
        top_ops=[{"name": ops.names[int(i)], "count": int(count[i]),
                  "flops": int(by_name[i]), "share": float(by_name[i] / total) if total else 0.0}
                 for i in order if count[i]])


def achieved_flops(trace: Trace, analysis: TraceAnalysis | None = None,
                   gpu_model: str | None = None) -> tuple[AchievedFlops, ...]:
    """One row per rank whose trace carries operator FLOP counts (none: an empty tuple).

    ``analysis`` gives each rank's GPU window, busy time and kernel mix (without it the rate
    is over the profiler's span and no peak is compared); ``gpu_model`` overrides the
    trace's ``deviceProperties`` name.
    """
    opt = analysis.options if analysis is not None else AnalysisOptions()
    by_rank = {a.rank: a for a in analysis.ranks} if analysis is not None else {}
    out = []
    for r in trace.ranks:
        row = _rank(r, by_rank.get(r.rank), opt, gpu_model)
        if row is not None:
            out.append(row)
    return tuple(out)


def flop_evidence(rows: tuple[AchievedFlops, ...]) -> dict[str, float | str] | None:
    """The recommender's signals from the most demanding rank (highest share of peak over
    busy time: the GPU a job moves to must carry its busiest rank): ``achieved_flops_peak_share``,
    ``achieved_tflops_per_s`` (over busy time), ``flops_peak_precision`` (``bf16 dense``,
    ``fp16 dense`` or ``fp32``) and ``memory_bound_kernel_share`` where known; None where no
    rank has a share of peak."""
    rated = [r for r in rows if r.share_of_peak_busy is not None]
    if not rated:
        return None
    top = max(rated, key=lambda r: r.share_of_peak_busy or 0.0)
    out: dict[str, float | str] = {
        "achieved_flops_peak_share": float(top.share_of_peak_busy or 0.0),
        "achieved_tflops_per_s": float(top.tflops_per_s_busy or 0.0),
        "flops_peak_precision": str(top.peak_precision),
    }
    if top.memory_bound_kernel_share is not None:
        out["memory_bound_kernel_share"] = float(top.memory_bound_kernel_share)
    return out


def sentence(r: AchievedFlops) -> str:
    """One line a person can read (the recommender's evidence text)."""
    busy = (f", {r.tflops_per_s_busy:.3g} TFLOP/s over GPU busy time"
            if r.tflops_per_s_busy is not None else "")
    share = (f": {r.share_of_peak_busy:.1%} of the {r.gpu_model} {r.peak_precision} peak "
             f"({r.peak_tflops:g} TFLOP/s)" if r.share_of_peak_busy is not None else
             f" (no share of peak: {r.peak_reason})")
    mb = (f"; {r.memory_bound_kernel_share:.0%} of kernel time in memory-bound kernels "
          "(elementwise, reduction, normalization, copies)"
          if r.memory_bound_kernel_share is not None else "")
    return (f"rank {r.rank}: {r.flops / 1e9:,.3f} GFLOP counted by the profiler's operators in "
            f"{r.window_ns / 1e6:.3f} ms ({r.window_source}) = {r.tflops_per_s_window or 0:.3g} "
            f"TFLOP/s{busy}{share}{mb}")
