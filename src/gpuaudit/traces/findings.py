"""Trace-only findings: evidence from a profiler trace for the recommender, each a signal
(a ratio 0..1) with a sentence a person can read. Plain data: no Arrow, no recommend import
(the composition, :mod:`gpuaudit.api.trace`, turns them into recommend Findings)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuaudit.traces.analysis import RankAnalysis, TraceAnalysis

__all__ = ["TraceFinding", "findings", "rank_findings"]


@dataclass(frozen=True)
class TraceFinding:
    """Evidence from a trace for the recommender: ``signal`` (e.g. ``input_stall_share``),
    its ``value`` (a ratio 0..1) and a sentence a person can read."""

    signal: str
    value: float
    sentence: str
    rank: int | None = None


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def rank_findings(a: RankAnalysis) -> list[TraceFinding]:
    """Trace evidence for one rank, as signals the recommender reads."""
    out: list[TraceFinding] = []
    if a.window_ns <= 0:
        return out
    idle = a.idle_ns
    if idle > 0 and a.dataloader_ns > 0:
        share = a.input_stall_ns / idle
        out.append(TraceFinding(
            "input_stall_share", share,
            f"rank {a.rank}: {_pct(share)} of GPU idle time falls inside DataLoader "
            f"iterations ({a.input_stall_ns / 1e6:.1f} ms of {idle / 1e6:.1f} ms): the GPU "
            "waits for input (raise num_workers, pin_memory, prefetch, or move decoding to "
            "the GPU with DALI)", a.rank))
    if idle > 0:
        host = a.idle_host_wait_ns / idle
        out.append(TraceFinding(
            "host_wait_share", host,
            f"rank {a.rank}: {_pct(host)} of GPU idle time is host wait (the next kernel was "
            "launched only after the GPU had gone idle)", a.rank))
    if a.matmul_ns > 0:
        tc = a.tensor_core_ns / a.matmul_ns
        out.append(TraceFinding(
            "tensor_core_share", tc,
            f"rank {a.rank}: {_pct(tc)} of matmul/convolution/attention kernel time runs on "
            "tensor cores" + ("; the rest is plain FP32 (sgemm): AMP/bf16 or TF32 would "
                              "use them" if tc < 0.5 else ""), a.rank))
    if a.kernel_count:
        small = a.small_kernel_count / a.kernel_count
        out.append(TraceFinding(
            "small_kernel_share", small,
            f"rank {a.rank}: {_pct(small)} of {a.kernel_count} GPU kernels run under 10 us; "
            f"{a.idle_kernel_wait_ns / 1e6:.1f} ms of idle is launch latency between queued "
            "kernels" + (" (CUDA graphs or torch.compile fuse them)" if small > 0.5 else ""),
            a.rank))
    if a.comm_ns > 0:
        exposed = a.comm_exposed_ns / a.window_ns
        out.append(TraceFinding(
            "comm_exposed_share", exposed,
            f"rank {a.rank}: communication not hidden behind computation takes "
            f"{_pct(exposed)} of the GPU window ({a.comm_exposed_ns / 1e6:.1f} ms; overlap "
            f"{(a.comm_comp_overlap_pct or 0):.1f}% of communication)", a.rank))
    return out


def findings(analysis: TraceAnalysis) -> list[TraceFinding]:
    """Findings of every rank, plus job-wide ones weighted by each rank's window."""
    out: list[TraceFinding] = []
    for a in analysis.ranks:
        out.extend(rank_findings(a))
    if len(analysis.ranks) > 1:
        by: dict[str, list[TraceFinding]] = {}
        for f in out:
            by.setdefault(f.signal, []).append(f)
        for signal, fs in by.items():
            # worst rank: most stall/exposure, but least tensor-core use
            pick = min if signal == "tensor_core_share" else max
            worst = pick(fs, key=lambda f: f.value)
            out.append(TraceFinding(signal, worst.value, f"job-wide worst rank: {worst.sentence}"))
    return out
