"""Why a GPU is not busy: the multi-signal decision tree.

Reads the per-GPU time-weighted means of the DCGM profiling fields / NVML GPM metrics
(``sm_active``, ``sm_occupancy``, ``tensor_active``, ``dram_active``, PCIe and NVLink
throughput) beside utilization. Each diagnosis names the numbers that decided it; a GPU
without profiling fields gets only the utilization-based ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from gpuaudit.classify.usage import Pattern, SeriesSignals

__all__ = ["Diagnosis", "diagnose"]

# PCIe Gen4 x16 moves ~25 GB/s each way in practice; a quarter of that sustained while the
# GPU waits means the host is feeding it.
_PCIE_BUSY_BYTES_PER_S = 6e9
_NVLINK_BUSY_BYTES_PER_S = 50e9


@dataclass(frozen=True)
class Diagnosis:
    """A finding about one GPU: ``kind`` is one of input_bound, memory_bound,
    no_tensor_cores, small_kernels, communication_bound, compute_bound, straggler."""

    gpu_uuid: str
    kind: str
    evidence: str


def diagnose(series: Sequence[SeriesSignals], patterns: Sequence[Pattern]) -> tuple[Diagnosis, ...]:
    """Apply the decision tree to each GPU; a GPU may get several diagnoses."""
    by_uuid = {p.gpu_uuid: p for p in patterns}
    out: list[Diagnosis] = []
    for s in series:
        u = s.mean_util_pct
        if u is None:
            continue
        pat = by_uuid.get(s.gpu_uuid)
        sm, tensor, dram = s.mean_sm_active, s.mean_tensor_active, s.mean_dram_active
        if pat is not None and pat.kind == "bursty":
            ev = f"utilization bounces idle/busy ({pat.evidence})"
            if s.mean_pcie_bytes_per_s is not None:
                ev += f"; PCIe {s.mean_pcie_bytes_per_s / 1e9:.1f} GB/s"
            out.append(Diagnosis(s.gpu_uuid, "input_bound", ev))
        if u >= 70 and sm is not None and sm < 0.5:
            out.append(Diagnosis(
                s.gpu_uuid, "small_kernels",
                f"utilization {u:.0f}% but SM active only {sm:.0%}: kernels too small to fill "
                "the GPU (launch-bound or tiny batches)"))
        if sm is not None and sm >= 0.5 and tensor is not None and tensor < 0.05:
            out.append(Diagnosis(
                s.gpu_uuid, "no_tensor_cores",
                f"SM active {sm:.0%} but tensor pipes active {tensor:.1%}: math runs on CUDA "
                "cores (FP32?)"))
        if dram is not None and dram >= 0.6 and (tensor is None or tensor < 0.2):
            out.append(Diagnosis(
                s.gpu_uuid, "memory_bound",
                f"DRAM active {dram:.0%} with tensor active "
                f"{'n/a' if tensor is None else f'{tensor:.0%}'}: bandwidth-bound kernels"))
        nv = s.mean_nvlink_bytes_per_s
        if nv is not None and nv >= _NVLINK_BUSY_BYTES_PER_S and (sm is None or sm < 0.5):
            out.append(Diagnosis(
                s.gpu_uuid, "communication_bound",
                f"NVLink {nv / 1e9:.0f} GB/s while SM active "
                f"{'n/a' if sm is None else f'{sm:.0%}'}: waiting on collectives"))
        pcie = s.mean_pcie_bytes_per_s
        if (pcie is not None and pcie >= _PCIE_BUSY_BYTES_PER_S and u < 70
                and not any(d.gpu_uuid == s.gpu_uuid and d.kind == "input_bound" for d in out)):
            out.append(Diagnosis(
                s.gpu_uuid, "input_bound",
                f"PCIe {pcie / 1e9:.1f} GB/s while utilization is {u:.0f}%: host-to-device "
                "copies gate the GPU"))
        if u >= 90 and (tensor is None or tensor >= 0.05):
            out.append(Diagnosis(
                s.gpu_uuid, "compute_bound",
                f"utilization {u:.0f}%"
                + (f", tensor active {tensor:.0%}" if tensor is not None else "")))
    out.extend(_stragglers(series))
    return tuple(out)


def _stragglers(series: Sequence[SeriesSignals]) -> list[Diagnosis]:
    """In a multi-GPU job (same host and pod), the GPU far busier than its peers holds them up:
    the others idle at each synchronisation waiting for it."""
    groups: dict[tuple[str, tuple[str, ...]], list[SeriesSignals]] = {}
    for s in series:
        if s.mean_util_pct is not None:
            groups.setdefault((s.host, s.pods), []).append(s)
    out: list[Diagnosis] = []
    for members in groups.values():
        if len(members) < 3:
            continue
        utils = [m.mean_util_pct for m in members if m.mean_util_pct is not None]
        mid = median(utils)
        if mid < 20:
            continue
        for m in members:
            assert m.mean_util_pct is not None
            if m.mean_util_pct - mid >= 25:
                out.append(Diagnosis(
                    m.gpu_uuid, "straggler",
                    f"{m.mean_util_pct:.0f}% busy while its {len(members) - 1} peers on "
                    f"{m.host} median {mid:.0f}%: peers wait for it at each step"))
    return out
