"""Each remediation's premise, checked against what was measured: a fix the data refute is
never counted; a fix whose deciding field is missing is listed as unverified, with the field.

A premise is named in ``remediations.toml`` (``premise = "tensor_idle"``) and defined here as
a check over one GPU's signals (:class:`~gpuaudit.classify.usage.SeriesSignals`) and the
findings of a trace. It answers per GPU:

- ``holds`` (with the numbers): the measurements show the bottleneck the fix removes;
- ``refuted`` (with the numbers): they show it is not there (AMP beside tensor pipes already
  58% busy; DataLoader workers for gaps that come at a host step's steady cadence; NCCL
  tuning for GPUs idle most of the time, when collectives run as kernels and show as busy);
- ``unknown`` (with the field that would decide).

A recommendation's scope is several GPUs: it keeps its count where the premise holds on one
of them, is ruled out where every GPU with data refutes it, and is unverified otherwise
(docs/diagnosis.md lists each premise with its threshold and reason).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuaudit.classify.diagnose import (
    COMM_MAX_IDLE_SHARE,
    HOST_CPU_BUSY_PCT,
    HOST_CPU_TURN_PTS,
    HOST_LINK_BUSY_SHARE,
    MIN_GAP_INTERVALS,
    MIN_GAPS,
    NVLINK_BUSY_SHARE,
    REGULAR_GAP_DISPERSION,
    SM_BUSY,
    SMALL_MEM_SHARE,
    SMALL_SM_ACTIVE,
    TENSOR_IDLE,
    cpu_signal,
)
from gpuaudit.classify.usage import SeriesSignals
from gpuaudit.errors import InputError
from gpuaudit.hardware import GpuSpec, gpu_family, spec_for
from gpuaudit.recommend.plan import Finding

__all__ = ["PREMISES", "Verdict", "judge"]

#: FP8 tensor cores (Hopper and newer).
_FP8_FAMILIES = frozenset({"H100", "H200", "GH200", "B200", "L40S", "L4"})
_TENSOR_FIELD = "tensor activity (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, NVML GPM)"
_NVLINK_FIELD = "NVLink bytes (DCGM_FI_PROF_NVLINK_TX_BYTES / _RX_BYTES, NVML NVLink)"


@dataclass(frozen=True)
class Verdict:
    """One GPU's answer: ``status`` is ``holds``, ``refuted`` or ``unknown``; ``reason`` says
    why in numbers; ``field`` names what would decide an ``unknown``."""

    status: str
    reason: str
    field: str | None = None


def _spec(s: SeriesSignals) -> GpuSpec | None:
    if not s.gpu_model or gpu_family(s.gpu_model) is None:
        return None
    try:
        return spec_for(s.gpu_model)
    except InputError:
        return None


def _tensor_idle(s: SeriesSignals, f: Mapping[str, Finding]) -> Verdict:
    """AMP / bf16: the math must run off the tensor cores, on a GPU that has them."""
    spec = _spec(s)
    if spec is not None and spec.fp16_dense_tflops is None:
        return Verdict("refuted", f"{s.gpu_model} has no tensor cores")
    t = s.mean_tensor_active
    if t is None:
        tc = f.get("tensor_core_share")
        if tc is not None and isinstance(tc.value, float):
            return (Verdict("holds", f"trace: {tc.value:.0%} of kernel time on tensor cores")
                    if tc.value < 0.2 else
                    Verdict("refuted", f"trace: {tc.value:.0%} of kernel time already on "
                            "tensor cores"))
        return Verdict("unknown", "tensor activity not measured", _TENSOR_FIELD)
    if t < TENSOR_IDLE:
        return Verdict("holds", f"tensor pipes {t:.1%} active")
    return Verdict("refuted", f"tensor pipes already {t:.0%} active: the math runs on tensor "
                   "cores (bf16/fp16/tf32) already")


def _fp8_next(s: SeriesSignals, f: Mapping[str, Finding]) -> Verdict:
    """FP8: an FP8-capable GPU whose math already runs on tensor cores (bf16 first)."""
    fam = gpu_family(s.gpu_model or "")
    if fam is not None and fam not in _FP8_FAMILIES:
        return Verdict("refuted", f"{fam} has no FP8 tensor cores")
    t = s.mean_tensor_active
    if t is None:
        return Verdict("unknown", "tensor activity not measured", _TENSOR_FIELD)
    if t < TENSOR_IDLE:
        return Verdict("refuted", f"tensor pipes {t:.1%} active: move to bf16 first")
    return Verdict("holds", f"tensor pipes {t:.0%} active on an FP8-capable GPU")


def _input_gaps(s: SeriesSignals, f: Mapping[str, Finding]) -> Verdict:
    """DataLoader workers / DALI: idle gaps that scatter, as an input pipeline's waits do."""
    stall = f.get("input_stall_share")
    if stall is not None and isinstance(stall.value, float) and stall.value > 0.05:
        return Verdict("holds", f"trace: {stall.value:.0%} of GPU time waiting on input")
    obs = s.observed_s or 1.0
    if s.idle_s / obs < 0.05:
        return Verdict("refuted", f"idle only {s.idle_s / obs:.0%} of the time: no input "
                       "stall to remove")
    interval = s.observed_s / s.samples if s.samples else 1.0
    med, disp = s.idle_gap_median_s, s.idle_gap_dispersion
    spec = _spec(s)
    h2d = s.mean_pcie_idle_bytes_per_s
    if h2d is not None and spec is not None and h2d / spec.host_link_bytes_per_s >= 0.005 \
            and (disp is None or disp > REGULAR_GAP_DISPERSION):
        return Verdict("holds", f"the host copies {h2d / 1e9:.2f} GB/s to the GPU while it "
                       "waits: batches in flight")
    if s.idle_gaps < MIN_GAPS or med is None or disp is None:
        return Verdict("unknown", f"{s.idle_gaps} idle gaps: too few to show their cadence",
                       "a longer recording, or samples at 10 Hz (gpuaudit run --hz 10)")
    if med < MIN_GAP_INTERVALS * interval:
        return Verdict("unknown", f"median gap {med:.1f} s is under {MIN_GAP_INTERVALS:g} "
                       f"sample intervals ({interval:g} s): the sampling cannot show how the "
                       "waits spread", "samples at 10 Hz or faster (gpuaudit run --hz 10)")
    if disp <= REGULAR_GAP_DISPERSION:
        cpu = cpu_signal(s, "host_cpu_util_pct_while_idle")
        busy_cpu = (f"; the host's CPUs {cpu:.0f}% busy in the same seconds"
                    if cpu is not None and cpu >= HOST_CPU_BUSY_PCT else "")
        return Verdict("refuted", f"{s.idle_gaps} gaps of {med:.1f} s at a steady cadence "
                       f"(dispersion {disp:.2f}){busy_cpu}: a host step of fixed length, not "
                       "an input pipeline")
    return Verdict("holds", f"{s.idle_gaps} gaps, median {med:.1f} s, scattered "
                   f"(dispersion {disp:.2f})")


def _link_busy_while_sm_wait(s: SeriesSignals, f: Mapping[str, Finding]) -> Verdict:
    """NCCL tuning: the peer link busy while the SMs wait, on a GPU busy most of the time."""
    ce = f.get("comm_exposed_share")
    if ce is not None and isinstance(ce.value, float) and ce.value > 0.05:
        return Verdict("holds", f"trace: {ce.value:.0%} of time in exposed collectives")
    obs = s.observed_s or 1.0
    idle = s.idle_s / obs
    if idle >= COMM_MAX_IDLE_SHARE:
        return Verdict("refuted", f"idle {idle:.0%} of the time: collectives run as kernels "
                       "(busy time), so they cannot be what the GPU waits on")
    spec = _spec(s)
    link_bps = spec.nvlink_bytes_per_s if spec else None
    bps = s.mean_nvlink_busy_bytes_per_s or s.mean_nvlink_bytes_per_s
    if link_bps is None:
        link_bps = spec.host_link_bytes_per_s if spec else None
        bps = s.mean_pcie_bytes_per_s
    if bps is None or not link_bps:
        return Verdict("unknown", "peer link traffic not measured", _NVLINK_FIELD)
    sm = s.mean_sm_active
    sm_busy = sm / max(1.0 - idle, 1e-9) if sm is not None else None
    if bps / link_bps < NVLINK_BUSY_SHARE / 5:
        return Verdict("refuted", f"the peer link carries {bps / link_bps:.1%} of its bandwidth"
                       ": no collective traffic to wait on")
    if sm_busy is not None and sm_busy >= SM_BUSY:
        return Verdict("refuted", f"SMs {sm_busy:.0%} active while busy: computing, not "
                       "waiting on peers")
    return Verdict("holds", f"peer link {bps / link_bps:.0%} of its bandwidth while SMs "
                   + (f"{sm_busy:.0%} active" if sm_busy is not None else "wait"))


def _idle_time(s: SeriesSignals, f: Mapping[str, Finding]) -> Verdict:
    """Idle shutdown: the GPU must idle (u < 10%) for a share of the time worth giving back."""
    obs = s.observed_s or 1.0
    idle = s.idle_s / obs
    if idle < IDLE_TIME_MIN_SHARE:
        return Verdict("refuted", f"idle only {idle:.1%} of the time")
    return Verdict("holds", f"idle {idle:.0%} of the time ({s.idle_s / 3600:.2f} GPU-h), the "
                   f"longest stretch {s.max_idle_run_s:.0f} s")


def _host_wait(s: SeriesSignals, f: Mapping[str, Finding]) -> Verdict:
    """Offload less: the SMs wait on the host, a step of fixed length between busy runs
    (the CPU optimizer step) or transfers over the host link while the GPU idles; the host's
    CPUs busy in those seconds confirm it where measured."""
    obs = s.observed_s or 1.0
    idle = s.idle_s / obs
    if idle < 0.05:
        return Verdict("refuted", f"idle only {idle:.0%} of the time: the SMs do not wait on "
                       "the host")
    spec = _spec(s)
    h2d = s.mean_pcie_idle_bytes_per_s
    cpu = cpu_signal(s, "host_cpu_util_pct_while_idle")
    cpu_txt = (f"; the host's CPUs {cpu:.0f}% busy in the same seconds"
               if cpu is not None else "")
    if h2d is not None and spec is not None \
            and h2d / spec.host_link_bytes_per_s >= HOST_LINK_BUSY_SHARE:
        return Verdict("holds", f"idle {idle:.0%} while the host link carries "
                       f"{h2d / 1e9:.1f} GB/s ({h2d / spec.host_link_bytes_per_s:.0%} of it)"
                       + cpu_txt)
    disp, med = s.idle_gap_dispersion, s.idle_gap_median_s
    interval = s.observed_s / s.samples if s.samples else 1.0
    regular = (s.idle_gaps >= MIN_GAPS and disp is not None and med is not None
               and med >= MIN_GAP_INTERVALS * interval and disp <= REGULAR_GAP_DISPERSION)
    if regular:
        assert med is not None and disp is not None
        return Verdict("holds", f"idle {idle:.0%} in {s.idle_gaps} gaps of {med:.1f} s at a "
                       f"steady cadence (dispersion {disp:.2f}): a host step" + cpu_txt)
    cpu_b = cpu_signal(s, "host_cpu_util_pct_while_busy")
    if cpu is not None and cpu >= HOST_CPU_BUSY_PCT and cpu_b is not None \
            and cpu - cpu_b >= HOST_CPU_TURN_PTS:
        return Verdict("holds", f"GPU idle {idle:.0%} while the host's CPUs are {cpu:.0f}% "
                       f"busy in the same seconds and {cpu_b:.0f}% while it computes: the "
                       "host and the GPU take turns")
    if cpu is not None and cpu < HOST_CPU_QUIET_PCT and h2d is not None:
        return Verdict("refuted", f"the host's CPUs {cpu:.0f}% busy and the link quiet while "
                       "the GPU idles: the host is not what it waits on")
    return Verdict("unknown", "neither a steady cadence of idle gaps, host-link traffic nor "
                   "the host's CPU shows a host step",
                   "host CPU utilization (gpuaudit run records it; node_exporter "
                   "node_cpu_seconds_total; --map cpu_util_pct) or PCIe bytes")


def _host_transfer(s: SeriesSignals, f: Mapping[str, Finding]) -> Verdict:
    """Pinned memory and overlap: bytes cross the host link while the SMs wait."""
    spec = _spec(s)
    h2d = s.mean_pcie_idle_bytes_per_s if s.idle_s / (s.observed_s or 1.0) >= 0.1 \
        else s.mean_pcie_bytes_per_s
    if h2d is None or spec is None:
        return Verdict("unknown", "host-link traffic not measured",
                       "PCIe bytes (DCGM_FI_PROF_PCIE_TX_BYTES / _RX_BYTES, NVML PCIe "
                       "throughput)")
    share = h2d / spec.host_link_bytes_per_s
    if share >= HOST_LINK_BUSY_SHARE:
        return Verdict("holds", f"the host link carries {h2d / 1e9:.1f} GB/s ({share:.0%} of "
                       "it) while the SMs wait")
    return Verdict("refuted", f"the host link carries {h2d / 1e9:.2f} GB/s ({share:.1%} of it)"
                   ": no transfer to overlap; the host computes, it does not copy")


def _small_work(s: SeriesSignals, f: Mapping[str, Finding]) -> Verdict:
    """MIG, MPS, time-slicing, a smaller GPU: the work uses a small part of the GPU, its peak
    memory well under the framebuffer and its SMs under :data:`SMALL_SM_ACTIVE`."""
    spec = _spec(s)
    total = s.mem_total_mib or (spec.memory_gb * 1024 if spec else None)
    if s.mem_used_max_mib is None or not total:
        return Verdict("unknown", "peak memory used not measured",
                       "mem_used_mib (nvidia-smi memory.used, DCGM_FI_DEV_FB_USED)")
    mem = s.mem_used_max_mib / total
    if mem > SMALL_MEM_SHARE:
        return Verdict("refuted", f"peak memory {s.mem_used_max_mib / 1024:.0f} of "
                       f"{total / 1024:.0f} GiB ({mem:.0%}): the job needs most of the GPU's "
                       "memory")
    sm = s.mean_sm_active
    util = (s.mean_util_pct or 0.0) / 100
    if sm is None and util >= SMALL_SM_ACTIVE:
        return Verdict("unknown", f"utilization {util:.0%} cannot tell how much of the SMs "
                       "the work fills", "SM activity (DCGM_FI_PROF_SM_ACTIVE, NVML GPM)")
    load = sm if sm is not None else util
    name = "SM active" if sm is not None else "utilization"
    if load >= SMALL_SM_ACTIVE:
        return Verdict("refuted", f"{name} {load:.0%}: the work fills most of the SMs")
    return Verdict("holds", f"peak memory {s.mem_used_max_mib / 1024:.1f} of "
                   f"{total / 1024:.0f} GiB ({mem:.0%}), {name} {load:.0%}")


def _memory_headroom(s: SeriesSignals, f: Mapping[str, Finding]) -> Verdict:
    """A larger batch needs memory to put it in: the peak must leave room."""
    spec = _spec(s)
    total = s.mem_total_mib or (spec.memory_gb * 1024 if spec else None)
    if s.mem_used_max_mib is None or not total:
        return Verdict("unknown", "peak memory used not measured",
                       "mem_used_mib (nvidia-smi memory.used, DCGM_FI_DEV_FB_USED)")
    share = s.mem_used_max_mib / total
    if share >= BATCH_MEM_FULL_SHARE:
        return Verdict("refuted", f"peak memory {share:.0%} of the GPU's: no room for a larger "
                       "batch (gradient accumulation keeps the batch, not the speed)")
    return Verdict("holds", f"peak memory {share:.0%} of the GPU's leaves room")


#: A larger batch is refuted from this share of the framebuffer at peak (allocators cache,
#: activations grow with the batch: the last 10% is not room for another batch).
BATCH_MEM_FULL_SHARE = 0.9
#: Idle shutdown needs idle time: at least this share of the GPU's observed time.
IDLE_TIME_MIN_SHARE = 0.02
#: The host's CPUs under this (percent) while the GPU idles: the host is not busy computing.
HOST_CPU_QUIET_PCT = 30.0

#: premise name (``remediations.toml``) -> check
PREMISES: dict[str, Callable[[SeriesSignals, Mapping[str, Finding]], Verdict]] = {
    "tensor_idle": _tensor_idle,
    "fp8_next": _fp8_next,
    "input_gaps": _input_gaps,
    "link_busy_while_sm_wait": _link_busy_while_sm_wait,
    "idle_time": _idle_time,
    "host_wait": _host_wait,
    "host_transfer": _host_transfer,
    "small_work": _small_work,
    "memory_headroom": _memory_headroom,
}


def judge(premise: str, series: Sequence[SeriesSignals], findings: Mapping[str, Finding]
          ) -> tuple[str, str, str | None]:
    """The premise over a recommendation's GPUs: (``holds`` | ``refuted`` | ``unknown``,
    the reason, the field that would decide). Holds if it holds on one GPU; refuted if every
    GPU with data refutes it and none is unknown; else unknown."""
    check = PREMISES[premise]
    verdicts = [check(s, findings) for s in series]
    if not verdicts:
        return "unknown", "no GPU measured", None
    held = [v for v in verdicts if v.status == "holds"]
    if held:
        return "holds", held[0].reason, None
    unknown = [v for v in verdicts if v.status == "unknown"]
    if unknown:
        return "unknown", unknown[0].reason, unknown[0].field
    return "refuted", verdicts[0].reason, None
