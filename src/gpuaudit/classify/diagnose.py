"""Why a GPU is not busy: the multi-signal decision tree, judged on the run's steady state.

Reads, per GPU, the time-weighted means of utilization and of the DCGM profiling fields /
NVML GPM metrics (``sm_active``, ``sm_occupancy``, ``tensor_active``, ``dram_active``, PCIe
and NVLink throughput, framebuffer memory used) over the *steady* stretch of the run
(:func:`gpuaudit.classify.patterns.split_run`; the whole run where there is no timeline), so a
long steady state decides, not a mean diluted by a warm-up. The warm-up and cool-down are
judged apart and reported beside (``phase``), never as the top diagnosis.

Thresholds are relative to the GPU (:func:`gpuaudit.hardware.spec_for`): PCIe and NVLink
traffic as a share of the link's bandwidth per direction, DRAM activity (already a share of
peak bandwidth) against the tensor pipes' share of peak. Each threshold below says why.
Every diagnosis names the numbers that decided it, the fixes (remediation ids in
``recommend/remediations.toml``) and, where the fields present cannot decide the cause, the
field that would (``undetermined``).

The tree, first match is the GPU's top diagnosis (docs/diagnosis.md draws it):

1. idle nearly all the judged time: ``host_bound`` if PCIe is busy (loading / offload),
   else ``held_idle`` if memory is held (notebook, stuck job), else ``idle``;
2. ``communication_bound``: a multi-GPU job, NVLink busy while the SMs wait *while busy*
   (on GPUs without NVLink: PCIe busy during busy time while SMs wait and utilization is at
   least 50%), on a GPU that is busy most of the time: collectives run as kernels, so they
   show as busy time with idle SMs, never as idle time;
3. ``host_bound`` (host transfer): PCIe busy while SMs wait (CPU / NVMe offload traffic,
   unpinned copies);
4. ``host_compute``: idle gaps at a steady cadence with a quiet link, or (gaps too few to
   show a cadence) the host's CPUs busy in the GPU's idle seconds: the host computes between
   steps (a CPU optimizer step, offloaded parameters updated on the CPU);
5. ``input_bound``: bursty (short idle gaps between busy runs) or a power sawtooth, with
   gaps that scatter (an input pipeline's waits vary batch to batch);
5. with SM activity: ``small_kernels`` (busy but SMs mostly empty), ``memory_bound`` (DRAM
   the busier pipe), ``no_tensor_cores`` (SMs busy, tensor pipes idle on a tensor-core GPU),
   ``compute_bound``, else part-busy with nothing feeding it: ``small_kernels`` (launch-bound
   or small batches);
6. without SM activity: ``compute_bound`` when utilization is high, else ``undetermined``.

``straggler`` (a job whose GPUs wait for one peer: far busier than them, or starting its
steps after theirs, :mod:`gpuaudit.classify.lag`) overrides the top diagnosis of every GPU
of that job: the cause is the straggler, not each GPU's own shape. The host's CPU
(``host_cpu_util_pct``, over the GPU's idle seconds) is named in the evidence where recorded.
:func:`group_diagnoses` gives each ``--by`` group the cause holding most of its GPU time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import median

from gpuaudit.classify.patterns import job_key
from gpuaudit.classify.usage import (
    OnsetLag,
    Pattern,
    RunPhase,
    SeriesSignals,
    Usage,
    arrow_cells,
)
from gpuaudit.errors import InputError
from gpuaudit.hardware import GpuSpec, gpu_family, spec_for

__all__ = ["FIXES", "KINDS", "Diagnosis", "GroupDiagnosis", "JobDiagnosis", "cpu_signal",
           "diagnose", "group_diagnoses", "job_diagnoses"]

#: PCIe traffic (TX + RX mean over the stretch's idle time where it idles at least 10% of it,
#: else over the whole stretch) at or above this share of the link's per-direction bandwidth,
#: while the SMs wait, means the host is feeding the GPU. A GPU fed tokens or
#: compressed images moves well under 1% of its link (3,000 JPEGs/s x 150 kB = 0.45 GB/s,
#: 0.7% of PCIe 5 x16); CPU offload moves optimizer state every step (12 bytes a parameter)
#: and stays above it: the real 8-GPU offload run in issue 16 sustained ~2 GB/s, 3% of H100's
#: 63 GB/s. The old absolute 6 GB/s never fired there.
HOST_LINK_BUSY_SHARE = 0.02
#: NVLink traffic (over busy time: collectives run as kernels) at or above this share of the
#: per-direction NVLink bandwidth while SMs wait means exposed collectives: an overlapped ring all-reduce of 1B bf16 parameters every 0.5 s
#: averages ~1.5% of an H100's 450 GB/s; ten percent is several times what overlap leaves.
NVLINK_BUSY_SHARE = 0.10
#: SMs "wait" below this mean SM activity: under a third of the SMs busy on average.
SM_WAITING = 0.3
#: Without SM activity, utilization (percent) below this stands for "the SMs wait".
UTIL_WAITING_PCT = 50.0
#: DRAM_ACTIVE is already a share of peak memory bandwidth: at or above one half, and above
#: the tensor pipes' share of their peak, the kernels sit left of the roofline's ridge point
#: (achieved FLOP per byte below the GPU's peak FLOP/s over its bandwidth).
DRAM_BOUND_SHARE = 0.5
#: SMs busy (mean SM activity) from this share on: the GPU is computing, not waiting.
SM_BUSY = 0.5
#: Tensor pipes below this share while SMs are busy: the math runs on CUDA cores (FP32).
TENSOR_IDLE = 0.05
#: The judged stretch is "idle" when at least this share of it is idle time (u < 10%).
IDLE_SHARE = 0.9
#: Memory is "held" from this much (MiB) or this share of the framebuffer, whichever is
#: larger: a CUDA context alone takes ~300-600 MiB, so less is nobody's data.
HELD_MIN_MIB = 1024.0
HELD_MIN_SHARE = 0.05
#: A power sawtooth: power's coefficient of variation at or above this while utilization is
#: two-sided (idle >= 10% and busy >= 10% of the time) marks a starve-then-race loop.
POWER_SAWTOOTH_CV = 0.3
#: Straggler: in a job of at least 3 GPUs, a GPU this many points busier than the median of
#: its peers (whose median is at least 20%) holds them up at every synchronisation.
STRAGGLER_GAP_PCT = 25.0
#: Collectives are kernels: waiting on them is busy time with idle SMs. A GPU idle at least
#: this share of the time waits on something else (the host, the input), whatever its link
#: carries while busy (FSDP's all-gathers overlap its compute at ~50 GB/s).
COMM_MAX_IDLE_SHARE = 0.5
#: Idle gaps "at a steady cadence": their quartile coefficient of dispersion,
#: (Q3 - Q1) / (Q3 + Q1), at or below this. A host step (optimizer on the CPU, offloaded
#: parameters) takes the same time every step (dispersion ~0.05-0.15); an input pipeline's
#: waits vary with each batch's decode and the workers' scheduling (0.3 and up).
REGULAR_GAP_DISPERSION = 0.2
#: At least this many closed gaps before their cadence is trusted.
MIN_GAPS = 8
#: ... and a median gap of at least this many sample intervals: a gap of one or two samples
#: cannot show its spread (1 Hz sampling quantises a 0.5-1.5 s wait to one sample).
MIN_GAP_INTERVALS = 3.0

#: The host's CPUs (all cores, percent) at or above this in the seconds the GPU idles: the
#: host is computing while the GPU waits (a CPU optimizer step, offloaded updates, or a
#: CPU-bound input pipeline). A training host's CPUs idle between steps sit well under half
#: busy (the DataLoader workers and the launch thread); 80% means most cores are at work.
HOST_CPU_BUSY_PCT = 80.0
#: ... and at least this many points less busy while the GPU computes: the host and the GPU
#: take turns (a synchronous host step). A CPU-bound input pipeline's workers prefetch the
#: whole time, so its CPUs stay busy while the GPU computes too.
HOST_CPU_TURN_PTS = 30.0
#: Small work (MIG, MPS, time-slicing, a smaller GPU): peak memory at most this share of the
#: framebuffer: half leaves room for a second job of the same size on the GPU, and at least
#: one MIG profile (the 3g/4g slices of half the memory) holds it.
SMALL_MEM_SHARE = 0.5
#: ... and SM activity under this: a job that keeps 70% or more of the SMs busy leaves under
#: 30% of the GPU to share, less than contention costs (time-slicing runs ~24% slower than
#: MIG under load: NVIDIA's MIG vs time-slicing benchmark, remediations.toml).
SMALL_SM_ACTIVE = 0.7

#: Straggler by time lag: a GPU whose busy onsets come at least this many sample intervals
#: and this share of its step period after its peers' (median over steps), ...
LAG_MIN_INTERVALS = 2.0
LAG_MIN_PERIOD_SHARE = 0.05
#: ... late at this share of the steps at least, over at least this many steps, while its
#: peers' own median lag stays under half of its: one GPU starts late, step after step.
LAG_LATE_SHARE = 0.7
LAG_MIN_STEPS = 8

#: The causes, in the order the tree tries them.
KINDS: tuple[str, ...] = (
    "straggler", "idle", "held_idle", "communication_bound", "host_bound", "host_compute",
    "input_bound", "small_kernels", "memory_bound", "no_tensor_cores", "compute_bound",
    "undetermined",
)

#: Each cause's fixes, best first: remediation ids in recommend/remediations.toml.
FIXES: dict[str, tuple[str, ...]] = {
    "idle": ("idle_shutdown",),
    "held_idle": ("idle_shutdown",),
    "host_bound": ("offload_less", "overlap_transfers", "larger_batch"),
    "host_compute": ("offload_less", "larger_batch"),
    "input_bound": ("dataloader", "dali"),
    "communication_bound": ("nccl_tuning",),
    "small_kernels": ("torch_compile", "larger_batch"),
    "memory_bound": ("torch_compile", "amp_bf16"),
    "no_tensor_cores": ("amp_bf16",),
    "compute_bound": ("fp8",),
    "straggler": ("straggler",),
    "undetermined": (),
}


@dataclass(frozen=True)
class Diagnosis:
    """A finding about one GPU: ``kind`` is one of :data:`KINDS`.

    ``phase`` is the stretch of the run it judges (``steady``, ``warm-up``, ``cool-down``,
    or ``whole run`` where no timeline split it); ``top`` marks the GPU's main cause (one per
    GPU); ``fixes`` are remediation ids; ``numbers`` the values that decided it;
    ``decides`` names the field that would settle an ``undetermined`` GPU.
    """

    gpu_uuid: str
    kind: str
    evidence: str
    phase: str = "whole run"
    top: bool = False
    fixes: tuple[str, ...] = ()
    numbers: tuple[tuple[str, float], ...] = ()
    decides: str | None = None


@dataclass(frozen=True)
class _View:
    """What the tree reads for one stretch of one GPU."""

    phase: str
    util_pct: float
    idle_share: float
    busy_share: float
    sm: float | None
    tensor: float | None
    dram: float | None
    pcie: float | None
    nvlink: float | None
    pcie_idle: float | None
    nvlink_busy: float | None
    mem_mib: float | None
    power_cv: float | None
    gaps: int = 0
    gap_median_s: float | None = None
    gap_dispersion: float | None = None
    interval_s: float = 1.0
    #: the host's CPUs over the GPU's idle seconds, and over all its seconds (percent)
    cpu_idle_pct: float | None = None
    cpu_pct: float | None = None
    cpu_busy_pct: float | None = None


def cpu_signal(s: SeriesSignals, name: str) -> float | None:
    """A host-CPU signal of a GPU (``host_cpu_util_pct``, ``proc_cpu_util_pct``,
    ``host_cpu_util_pct_while_idle``: percent of all cores, time-weighted), None where the
    recording has no CPU columns (a source that cannot measure the host: never a fake 0)."""
    for attr in (f"mean_{name}", name):
        v = getattr(s, attr, None)
        if isinstance(v, (int, float)):
            return float(v)
    return None


def _spec(model: str | None) -> GpuSpec | None:
    if not model or gpu_family(model) is None:
        return None
    try:
        return spec_for(model)
    except InputError:
        return None


def _whole_view(s: SeriesSignals) -> _View:
    obs = s.observed_s or 1.0
    cv = None
    if s.mean_power_w and s.std_power_w is not None:
        cv = s.std_power_w / s.mean_power_w
    return _View(
        phase="whole run", util_pct=s.mean_util_pct or 0.0, idle_share=s.idle_s / obs,
        busy_share=s.busy_high_s / obs, sm=s.mean_sm_active, tensor=s.mean_tensor_active,
        dram=s.mean_dram_active, pcie=s.mean_pcie_bytes_per_s,
        nvlink=s.mean_nvlink_bytes_per_s, pcie_idle=s.mean_pcie_idle_bytes_per_s,
        nvlink_busy=s.mean_nvlink_busy_bytes_per_s, mem_mib=s.mem_used_max_mib, power_cv=cv,
        gaps=s.idle_gaps, gap_median_s=s.idle_gap_median_s,
        gap_dispersion=s.idle_gap_dispersion,
        interval_s=s.observed_s / s.samples if s.samples else 1.0,
        cpu_idle_pct=cpu_signal(s, "host_cpu_util_pct_while_idle"),
        cpu_pct=cpu_signal(s, "host_cpu_util_pct"),
        cpu_busy_pct=cpu_signal(s, "host_cpu_util_pct_while_busy"))


def _phase_view(p: RunPhase, whole: _View) -> _View:
    """A stretch's own means; the power spread (not bucketed) is the whole run's."""
    return _View(
        phase=p.name, util_pct=p.mean_util_pct or 0.0, idle_share=p.idle_share,
        busy_share=p.busy_share, sm=p.signal("sm_active"), tensor=p.signal("tensor_active"),
        dram=p.signal("dram_active"), pcie=p.signal("pcie_bytes_per_s"),
        nvlink=p.signal("nvlink_bytes_per_s"), pcie_idle=p.signal("pcie_idle_bytes_per_s"),
        nvlink_busy=p.signal("nvlink_busy_bytes_per_s"),
        mem_mib=p.signal("mem_used_mib") if p.signal("mem_used_mib") is not None
        else whole.mem_mib, power_cv=whole.power_cv, gaps=whole.gaps,
        gap_median_s=whole.gap_median_s, gap_dispersion=whole.gap_dispersion,
        interval_s=whole.interval_s, cpu_idle_pct=whole.cpu_idle_pct, cpu_pct=whole.cpu_pct,
        cpu_busy_pct=whole.cpu_busy_pct)


def _pct(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 or x == 0 else f"{x:.1%}"


def _link(bps: float, link_bps: float | None, name: str) -> str:
    share = f" = {_pct(bps / link_bps)} of its {link_bps / 1e9:.0f} GB/s per direction" \
        if link_bps else ""
    return f"{name} {bps / 1e9:.1f} GB/s{share}"


def _judge(uuid: str, v: _View, spec: GpuSpec | None, pattern: Pattern | None,
           multi: bool) -> Diagnosis:
    """The tree on one stretch: the first cause that fits."""
    host_bps = spec.host_link_bytes_per_s if spec else None
    nv_bps = spec.nvlink_bytes_per_s if spec else None
    # PCIe is judged over the time the GPU waits (idle) where it waits at all, NVLink over
    # the time it is busy (collectives are kernels); else over the whole stretch
    pcie, pcie_when = v.pcie, ""
    if v.pcie_idle is not None and v.idle_share >= 0.1:
        pcie, pcie_when = v.pcie_idle, " during idle time"
    nvlink, nv_when = v.nvlink, ""
    if v.nvlink_busy is not None and v.idle_share <= 0.9:
        nvlink, nv_when = v.nvlink_busy, " during busy time"
    pcie_share = pcie / host_bps if pcie is not None and host_bps else None
    nv_share = nvlink / nv_bps if nvlink is not None and nv_bps else None
    total_mib = spec.memory_gb * 1024 if spec else None
    held = None
    if v.mem_mib is not None:
        held = v.mem_mib >= max(HELD_MIN_MIB, HELD_MIN_SHARE * (total_mib or 0.0))
    waiting = v.sm < SM_WAITING if v.sm is not None else v.util_pct < UTIL_WAITING_PCT
    nums: list[tuple[str, float]] = [("util_pct", round(v.util_pct, 1)),
                                     ("idle_share", round(v.idle_share, 3))]
    for name, val in (("sm_active", v.sm), ("tensor_active", v.tensor),
                      ("dram_active", v.dram), ("pcie_bytes_per_s", v.pcie),
                      ("pcie_idle_bytes_per_s", v.pcie_idle),
                      ("pcie_link_share", pcie_share), ("nvlink_bytes_per_s", v.nvlink),
                      ("nvlink_busy_bytes_per_s", v.nvlink_busy),
                      ("nvlink_link_share", nv_share), ("mem_used_mib", v.mem_mib),
                      ("host_cpu_util_pct_while_idle", v.cpu_idle_pct),
                      ("host_cpu_util_pct_while_busy", v.cpu_busy_pct),
                      ("host_cpu_util_pct", v.cpu_pct)):
        if val is not None:
            nums.append((name, round(val, 4)))
    numbers = tuple(nums)
    sm_txt = f"SM active {_pct(v.sm)}" if v.sm is not None else f"utilization {v.util_pct:.0f}%"
    held_txt = ""
    if held and v.mem_mib is not None and v.idle_share >= 0.5:
        held_txt = (f"held but idle: {v.mem_mib / 1024:.0f} GiB allocated while the GPU is idle "
                    f"{v.idle_share:.0%} of the time; ")
    host_busy = pcie_share is not None and pcie_share >= HOST_LINK_BUSY_SHARE

    def d(kind: str, evidence: str, decides: str | None = None) -> Diagnosis:
        fixes = FIXES[kind]
        if kind == "compute_bound" and (spec is None or spec.fp8_dense_tflops is None):
            fixes = ()  # leave it, or a faster GPU: no cheaper precision left on this one
        return Diagnosis(uuid, kind, evidence, phase=v.phase, fixes=fixes, numbers=numbers,
                         decides=decides)

    cpu_busy = v.cpu_idle_pct is not None and v.cpu_idle_pct >= HOST_CPU_BUSY_PCT
    # the host computes in turns with the GPU: busy while it idles, resting while it computes
    cpu_turns = (cpu_busy and v.cpu_busy_pct is not None and v.cpu_idle_pct is not None
                 and v.cpu_idle_pct - v.cpu_busy_pct >= HOST_CPU_TURN_PTS)
    cpu_txt = (f"; GPU idle {v.idle_share:.0%} while the host's CPUs are "
               f"{v.cpu_idle_pct:.0f}% busy in the same seconds"
               + (f" ({v.cpu_busy_pct:.0f}% while it computes)"
                  if v.cpu_busy_pct is not None else "")
               if v.cpu_idle_pct is not None else "")
    host_txt = ("the host is feeding it (PCIe busy while SMs wait): CPU / NVMe offload or "
                "input pipeline")
    if v.idle_share >= IDLE_SHARE:
        if host_busy and pcie is not None:
            return d("host_bound", f"{held_txt}{_link(pcie, host_bps, 'PCIe')}{pcie_when} while idle "
                     f"{v.idle_share:.0%}: {host_txt}")
        if held is None:
            return d("idle", f"idle {v.idle_share:.0%} of the time; memory used not measured, "
                     "so a forgotten process cannot be told from a free GPU",
                     decides="mem_used_mib (nvidia-smi memory.used, DCGM_FI_DEV_FB_USED)")
        if held:
            assert v.mem_mib is not None
            return d("held_idle", f"held but idle: {v.mem_mib / 1024:.1f} GiB allocated while "
                     f"the GPU is idle {v.idle_share:.0%} of the time and no host traffic: a "
                     "forgotten notebook or a stuck job")
        return d("idle", f"idle {v.idle_share:.0%} of the time with nothing held "
                 f"({(v.mem_mib or 0):.0f} MiB): shut it down or give it back")
    # SM activity while busy: the stretch's mean counts idle time as SMs at rest
    sm_busy = v.sm / max(1.0 - v.idle_share, 1e-9) if v.sm is not None else None
    mostly_busy = v.idle_share < COMM_MAX_IDLE_SHARE
    if multi and mostly_busy and nv_share is not None and nv_share >= NVLINK_BUSY_SHARE and (
            sm_busy is None or sm_busy < SM_BUSY):
        assert nvlink is not None
        return d("communication_bound", f"{_link(nvlink, nv_bps, 'NVLink')}{nv_when} while "
                 f"{sm_txt}: waiting on collectives")
    # no NVLink: peers exchange over PCIe, during the busy time (collectives are kernels)
    pcie_busy = None
    if v.pcie is not None and v.pcie_idle is not None and v.idle_share < 0.9:
        pcie_busy = max(0.0, (v.pcie - v.pcie_idle * v.idle_share) / (1.0 - v.idle_share))
    elif v.pcie is not None and v.idle_share < 0.1:
        pcie_busy = v.pcie
    if (multi and mostly_busy and spec is not None
            and spec.nvlink_gb_per_s_per_direction is None
            and pcie_busy is not None and host_bps
            and pcie_busy / host_bps >= HOST_LINK_BUSY_SHARE
            and v.sm is not None and v.sm < SM_BUSY and v.util_pct >= 50):
        return d("communication_bound", f"{_link(pcie_busy, host_bps, 'PCIe')} during busy "
                 f"time while {sm_txt} in a multi-GPU job on GPUs without NVLink: collectives "
                 "cross PCIe")
    if host_busy and waiting and pcie is not None:
        return d("host_bound", f"{held_txt}{_link(pcie, host_bps, 'PCIe')}{pcie_when or ' sustained'} while "
                 f"{sm_txt}{cpu_txt}: {host_txt}")
    gaps_txt = ""
    resolved = (v.gaps >= MIN_GAPS and v.gap_median_s is not None
                and v.gap_dispersion is not None
                and v.gap_median_s >= MIN_GAP_INTERVALS * v.interval_s)
    if resolved:
        assert v.gap_median_s is not None and v.gap_dispersion is not None
        gaps_txt = (f"{v.gaps} idle gaps, median {v.gap_median_s:.1f} s, dispersion "
                    f"{v.gap_dispersion:.2f}")
    regular = resolved and v.gap_dispersion is not None \
        and v.gap_dispersion <= REGULAR_GAP_DISPERSION
    scattered = resolved and not regular
    if v.idle_share >= 0.1 and (regular or (cpu_turns and not scattered)):
        link = (f"{_link(pcie, host_bps, 'PCIe')}{pcie_when}: the link is quiet"
                if pcie is not None else "PCIe not measured")
        cadence = f"in {gaps_txt} (a steady cadence)" if regular else \
            ("(gaps too few or too short to show their cadence; the host's CPUs busy while "
             "it idles and resting while it computes: the two take turns)")
        return d("host_compute", f"idle {v.idle_share:.0%} {cadence} while {sm_txt}; "
                 f"{link}{cpu_txt}: the host computes between steps (a CPU optimizer "
                 "step, offloaded parameters updated on the CPU), not an input pipeline, "
                 "whose waits vary",
                 decides=None if pcie is not None else
                 "PCIe bytes (DCGM_FI_PROF_PCIE_TX_BYTES / _RX_BYTES, NVML PCIe throughput) "
                 "to tell a host step from host transfers")
    bursty = pattern is not None and pattern.kind == "bursty"
    sawtooth = (v.power_cv is not None and v.power_cv >= POWER_SAWTOOTH_CV
                and v.idle_share >= 0.1 and v.busy_share >= 0.1)
    if bursty or sawtooth:
        why = f"utilization bounces idle/busy ({pattern.evidence})" if bursty and pattern \
            else f"power sawtooth (spread {v.power_cv:.0%} of its mean)"
        if gaps_txt:
            why += f"; {gaps_txt}: the waits scatter"
        if cpu_txt:
            why += cpu_txt + (" (CPU-bound workers: more workers will not help, DALI moves "
                              "the decode to the GPU)" if cpu_busy and not cpu_turns else "")
        if pcie is not None:
            why += f"; {_link(pcie, host_bps, 'PCIe')}{pcie_when}"
        return d("input_bound", f"{why}: the input pipeline starves it between batches")
    if v.sm is not None:
        if v.util_pct >= 70 and v.sm < SM_BUSY:
            return d("small_kernels", f"utilization {v.util_pct:.0f}% but SM active only "
                     f"{_pct(v.sm)}: kernels too small to fill the GPU (launch-bound or tiny "
                     "batches)")
        if v.dram is not None and v.dram >= DRAM_BOUND_SHARE and v.dram > (v.tensor or 0.0):
            bw = f" of {spec.memory_bandwidth_gb_per_s:.0f} GB/s peak" if spec else " of peak"
            return d("memory_bound", f"DRAM active {_pct(v.dram)}{bw} with tensor active "
                     f"{'n/a' if v.tensor is None else _pct(v.tensor)}, SM active "
                     f"{_pct(v.sm)}: bandwidth-bound kernels")
        has_tc = spec is None or spec.fp16_dense_tflops is not None
        if v.sm >= SM_BUSY and v.tensor is not None and v.tensor < TENSOR_IDLE and has_tc:
            return d("no_tensor_cores", f"SM active {_pct(v.sm)} but tensor pipes active "
                     f"{_pct(v.tensor)} on a tensor-core GPU: math runs on CUDA cores (FP32?)")
        if v.sm >= SM_BUSY:
            return d("compute_bound", f"SM active {_pct(v.sm)}, utilization "
                     f"{v.util_pct:.0f}%" + (f", tensor active {_pct(v.tensor)}"
                                              if v.tensor is not None else "")
                     + ": compute-bound; leave it, or a faster GPU / lower precision")
        return d("small_kernels", f"steadily part-busy ({v.util_pct:.0f}%), SM active "
                 f"{_pct(v.sm)}, no host or peer traffic to wait on: launch-bound or batches "
                 "too small to fill the GPU")
    if v.util_pct >= 80:
        return d("compute_bound", f"utilization {v.util_pct:.0f}%; tensor activity not "
                 "measured: compute-bound as far as utilization can tell")
    return d("undetermined", f"utilization {v.util_pct:.0f}%, idle {v.idle_share:.0%}, not "
             "bursty: the fields present cannot tell input-bound from launch-bound",
             decides="enable DCGM profiling fields (DCGM_FI_PROF_SM_ACTIVE, "
             "DCGM_FI_PROF_PCIE_TX_BYTES / _RX_BYTES) or NVML GPM to tell input-bound "
             "from launch-bound")


def _job(s: SeriesSignals) -> tuple[str, tuple[str, ...]]:
    return (s.host, s.pods)


def diagnose(series: Sequence[SeriesSignals], patterns: Sequence[Pattern],
             lags: Sequence[OnsetLag] = ()) -> tuple[Diagnosis, ...]:
    """The top diagnosis of each GPU (on its steady stretch), then its warm-up and cool-down
    judged apart where they differ, then the stragglers' effect on their jobs: by busyness,
    and by time lag where ``lags`` (:mod:`gpuaudit.classify.lag`) are known."""
    by_uuid = {p.gpu_uuid: p for p in patterns}
    sizes: dict[tuple[str, tuple[str, ...]], int] = {}
    for s in series:
        sizes[_job(s)] = sizes.get(_job(s), 0) + 1
    tops: dict[str, Diagnosis] = {}
    extra: list[Diagnosis] = []
    for s in series:
        if s.mean_util_pct is None:
            continue
        pat = by_uuid.get(s.gpu_uuid)
        spec = _spec(s.gpu_model)
        whole = _whole_view(s)
        multi = sizes[_job(s)] >= 2
        steady = pat.steady if pat is not None else None
        split = pat is not None and len(pat.run_phases) > 1 and steady is not None
        view = _phase_view(steady, whole) if split and steady is not None else whole
        tops[s.gpu_uuid] = replace(_judge(s.gpu_uuid, view, spec, pat, multi), top=True)
        if split and pat is not None:
            for p in pat.run_phases:
                if p.name == "steady" or p.observed_s <= 0:
                    continue
                e = _judge(s.gpu_uuid, _phase_view(p, whole), spec, None, multi)
                if e.kind != tops[s.gpu_uuid].kind:
                    extra.append(e)
    found = _stragglers(series, tops)
    named = {d.gpu_uuid for d in found}
    found += [d for d in _lag_stragglers(series, lags) if d.gpu_uuid not in named]
    for st in found:
        tops[st.gpu_uuid] = replace(st, top=True, phase=tops[st.gpu_uuid].phase)
    return (*(tops[s.gpu_uuid] for s in series if s.gpu_uuid in tops), *extra)


def _stragglers(series: Sequence[SeriesSignals], tops: dict[str, Diagnosis]
                ) -> list[Diagnosis]:
    """In a multi-GPU job (same host and pod set), the GPU far busier than its peers holds
    them up: the others idle at each synchronisation waiting for it. Both it and the peers
    get ``straggler``: the fix is on the straggler."""
    groups: dict[tuple[str, tuple[str, ...]], list[tuple[SeriesSignals, float]]] = {}
    for s in series:
        top = tops.get(s.gpu_uuid)
        if top is None:
            continue
        u = dict(top.numbers).get("util_pct", s.mean_util_pct or 0.0)
        groups.setdefault(_job(s), []).append((s, u))
    out: list[Diagnosis] = []
    for members in groups.values():
        if len(members) < 3:
            continue
        for m, u in members:
            peers = [pu for p, pu in members if p.gpu_uuid != m.gpu_uuid]
            mid = median(peers)
            if mid < 20 or u - mid < STRAGGLER_GAP_PCT:
                continue
            nums = (("util_pct", round(u, 1)), ("peer_median_util_pct", round(mid, 1)))
            out.append(Diagnosis(
                m.gpu_uuid, "straggler",
                f"{u:.0f}% busy while its {len(peers)} peers on {m.host} median {mid:.0f}%: "
                "peers wait for it at each step (check its clocks and throttling, its data "
                "shard, its node)", fixes=FIXES["straggler"], numbers=nums))
            for p, pu in members:
                if p.gpu_uuid != m.gpu_uuid:
                    out.append(Diagnosis(
                        p.gpu_uuid, "straggler",
                        f"{pu:.0f}% busy, waiting for straggler {m.gpu_uuid} ({u:.0f}% busy) "
                        "at each step", fixes=FIXES["straggler"],
                        numbers=(("util_pct", round(pu, 1)), ("straggler_util_pct", round(u, 1)))))
            break
    return out


def _lag_stragglers(series: Sequence[SeriesSignals], lags: Sequence[OnsetLag]
                    ) -> list[Diagnosis]:
    """A GPU whose busy onsets come after its peers' step after step holds them up: it and
    its peers get ``straggler`` (the fix is on the late one)."""
    interval = {s.gpu_uuid: s.observed_s / s.samples if s.samples else 1.0 for s in series}
    by_job: dict[str, list[OnsetLag]] = {}
    for lg in lags:
        by_job.setdefault(lg.job, []).append(lg)
    out: list[Diagnosis] = []
    for members in by_job.values():
        for m in sorted(members, key=lambda x: -x.median_lag_s):
            bound = max(LAG_MIN_INTERVALS * interval.get(m.gpu_uuid, 1.0),
                        LAG_MIN_PERIOD_SHARE * m.period_s)
            peers = [p for p in members if p.gpu_uuid != m.gpu_uuid]
            if (m.steps < LAG_MIN_STEPS or m.median_lag_s < bound
                    or m.late_share < LAG_LATE_SHARE
                    or any(p.median_lag_s >= m.median_lag_s / 2 for p in peers)):
                continue
            nums = (("median_lag_s", round(m.median_lag_s, 3)), ("steps", float(m.steps)),
                    ("late_share", round(m.late_share, 3)), ("period_s", round(m.period_s, 3)))
            out.append(Diagnosis(
                m.gpu_uuid, "straggler",
                f"its busy onsets come {m.median_lag_s:.2f} s after its {len(peers)} peers' "
                f"(median over {m.steps} steps of {m.period_s:.2f} s; late at "
                f"{m.late_share:.0%} of them): the job waits for it at every synchronisation "
                "(check its input shard and loader, its clocks and throttling, its node)",
                fixes=FIXES["straggler"], numbers=nums))
            for p in peers:
                out.append(Diagnosis(
                    p.gpu_uuid, "straggler",
                    f"starts its steps {m.median_lag_s:.2f} s before straggler {m.gpu_uuid} "
                    f"(median over {m.steps} steps) and waits for it at each synchronisation",
                    fixes=FIXES["straggler"],
                    numbers=(("median_lag_s", round(p.median_lag_s, 3)),
                             ("straggler_lag_s", round(m.median_lag_s, 3)))))
            break
    return out


@dataclass(frozen=True)
class GroupDiagnosis:
    """A ``--by`` group's cause: the top diagnosis holding most of the group's GPU time,
    its share of that time, the GPUs the group ran on, and its fixes."""

    key: tuple[str | None, ...]
    kind: str
    share: float
    gpu_uuids: tuple[str, ...]
    evidence: str
    fixes: tuple[str, ...]


def group_diagnoses(usage: Usage, diagnoses: Sequence[Diagnosis]
                    ) -> tuple[GroupDiagnosis, ...]:
    """Per ``--by`` group (``usage.by``): each GPU's top diagnosis weighted by the seconds
    the group held it; the kind with the most seconds is the group's (ties: the earlier in
    :data:`KINDS`). A group's GPUs are listed in the usage's series order (as the report
    lists its GPUs), the example is the first of them with that kind: neither depends on
    how the cells were numbered, which follows where the read cut its batches."""
    if not usage.by or usage.cells.num_rows == 0:
        return ()
    tops = {d.gpu_uuid: d for d in diagnoses if d.top}
    rank = {s.gpu_uuid: i for i, s in enumerate(usage.series)}
    out = []
    for key, seconds in _group_seconds(usage).items():
        per_gpu = {u: seconds[u] for u in sorted(seconds, key=lambda u: rank.get(u, len(rank)))}
        weights: dict[str, float] = {}
        for uuid, secs in per_gpu.items():
            d = tops.get(uuid)
            if d is not None:
                weights[d.kind] = weights.get(d.kind, 0.0) + secs
        total = sum(weights.values())
        if total <= 0:
            continue
        best = max(KINDS, key=lambda k: (weights.get(k, 0.0), -KINDS.index(k)))
        share = weights[best] / total
        ex = next(tops[u] for u in per_gpu if u in tops and tops[u].kind == best)
        others = sorted(k for k in weights if k != best)
        ev = (f"{share:.0%} of the group's GPU time on GPUs {best.replace('_', ' ')}"
              + (f" (also: {', '.join(others)})" if others else "")
              + f"; e.g. {ex.gpu_uuid}: {ex.evidence}")
        out.append(GroupDiagnosis(key=key, kind=best, share=round(share, 4),
                                  gpu_uuids=tuple(per_gpu), evidence=ev, fixes=ex.fixes))
    return tuple(out)


def _group_seconds(usage: Usage) -> dict[tuple[str | None, ...], dict[str, float]]:
    """Observed seconds per group and GPU, from the usage cells."""
    keys = [*usage.by, "gpu_uuid"]
    phases = ("idle_s", "underutilized_s", "productive_s", "compute_bound_s")
    agg = arrow_cells(usage.cells).group_by(keys, use_threads=False).aggregate(
        [(p, "sum") for p in phases])
    cols = [agg.column(k).to_pylist() for k in usage.by]
    uuids = agg.column("gpu_uuid").to_pylist()
    secs = [sum(v or 0.0 for v in row) for row in zip(
        *(agg.column(f"{p}_sum").to_pylist() for p in phases))]
    out: dict[tuple[str | None, ...], dict[str, float]] = {}
    for i, uuid in enumerate(uuids):
        key = tuple(None if c[i] is None else str(c[i]) for c in cols)
        out.setdefault(key, {})[str(uuid)] = float(secs[i] or 0.0)
    return dict(sorted(out.items(), key=lambda kv: tuple(x or "" for x in kv[0])))


@dataclass(frozen=True)
class JobDiagnosis:
    """A job's cause (its GPUs: one host and pod set, :func:`gpuaudit.classify.patterns.
    job_key`): the top diagnosis most of its GPUs share, how many do, and its fixes."""

    job: str
    kind: str
    gpu_uuids: tuple[str, ...]
    with_kind: int
    evidence: str
    fixes: tuple[str, ...]


def job_diagnoses(series: Sequence[SeriesSignals], diagnoses: Sequence[Diagnosis]
                  ) -> tuple[JobDiagnosis, ...]:
    """Per job: the most common top diagnosis of its GPUs (ties: the earlier in
    :data:`KINDS`), with one of its GPUs' evidence."""
    tops = {d.gpu_uuid: d for d in diagnoses if d.top}
    jobs: dict[str, list[Diagnosis]] = {}
    for s in series:
        if s.gpu_uuid in tops:
            jobs.setdefault(job_key(s), []).append(tops[s.gpu_uuid])
    out = []
    for job, ds in jobs.items():
        kinds = [d.kind for d in ds]
        best = max(KINDS, key=lambda k: (kinds.count(k), -KINDS.index(k)))
        ex = next(d for d in ds if d.kind == best)
        n = kinds.count(best)
        others = sorted({k for k in kinds if k != best})
        ev = (f"{n} of {len(ds)} GPU(s) {best.replace('_', ' ')}"
              + (f" (others: {', '.join(others)})" if others else "")
              + f"; e.g. {ex.gpu_uuid}: {ex.evidence}")
        out.append(JobDiagnosis(job=job, kind=best, gpu_uuids=tuple(d.gpu_uuid for d in ds),
                                with_kind=n, evidence=ev, fixes=ex.fixes))
    return tuple(out)
