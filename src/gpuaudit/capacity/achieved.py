"""Achieved vs peak: memory bandwidth and tensor FLOP/s as a share of the GPU's datasheet peak.

Where DCGM profiling fields or NVML GPM are recorded, ``dram_active`` (DCGM_FI_PROF_DRAM_ACTIVE:
the share of cycles the memory interface is busy) times the datasheet bandwidth estimates the
achieved bandwidth, and ``tensor_active`` (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE) times the dense
bf16 peak the achieved tensor FLOP/s (an upper estimate: an active pipe is not a full one).
A job that keeps the memory busy while its tensor cores idle is memory-bound: on a
compute-rich GPU it pays for FLOP/s it cannot use, and a GPU with enough bandwidth but fewer
FLOP/s is cheaper for the same work (the recommender's right-size finding reads this).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuaudit.capacity.profiles import Profiles
from gpuaudit.hardware import spec_for

__all__ = ["MEMORY_BOUND_DRAM", "MEMORY_BOUND_TENSOR", "Achieved", "achieved_vs_peak"]

#: memory-bound: DRAM busy at least this share of the time ...
MEMORY_BOUND_DRAM = 0.5
#: ... while the tensor pipes are active at most this share
MEMORY_BOUND_TENSOR = 0.2


@dataclass(frozen=True)
class Achieved:
    workload: str
    gpu_model: str
    dram_active: float | None
    tensor_active: float | None
    bandwidth_gb_per_s: float | None
    bandwidth_share: float | None
    tensor_tflops: float | None
    tensor_share: float | None
    memory_bound: bool


def achieved_vs_peak(p: Profiles) -> tuple[Achieved, ...]:
    """One row per workload that recorded DRAM or tensor activity on a GPU with a spec row."""
    out = []
    for w in range(len(p)):
        spec = spec_for(p.gpu_model[w])
        dram = float(p.dram_active_mean[w])
        tens = float(p.tensor_active_mean[w])
        if spec is None or (np.isnan(dram) and np.isnan(tens)):
            continue
        d = None if np.isnan(dram) else dram
        t = None if np.isnan(tens) else tens
        peak = spec.bf16_dense_tflops or spec.fp16_dense_tflops
        out.append(Achieved(
            workload=p.workload[w], gpu_model=spec.gpu_model, dram_active=d, tensor_active=t,
            bandwidth_gb_per_s=None if d is None else d * spec.memory_bandwidth_gb_per_s,
            bandwidth_share=d,
            tensor_tflops=None if t is None or peak is None else t * peak,
            tensor_share=t,
            memory_bound=d is not None and t is not None and d >= MEMORY_BOUND_DRAM
            and t <= MEMORY_BOUND_TENSOR))
    return tuple(out)
