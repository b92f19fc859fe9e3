"""Consolidation simulation: pack the measured workloads onto fewer GPUs, then replay history.

Three policies, each a static placement (a pod does not move every minute) chosen by
first-fit-decreasing and then replayed over the history step by step, vectorised over
workloads and steps (``numpy.add.reduceat`` per GPU; no per-step Python):

- ``mig``: each workload gets the smallest MIG profile of the target GPU whose memory holds its
  peak memory plus headroom and whose compute slices cover its p95 demand; instances are placed
  at the memory slices NVIDIA allows (:func:`gpuaudit.hardware.mig_layout_problem`). Risk: the
  share of steps where a workload wants more than its slice (it would run slower, not fail).
- ``mps``: workloads share a GPU under CUDA MPS (at most
  :data:`~gpuaudit.hardware.MPS_MAX_CLIENTS` per GPU); memory peaks plus headroom must fit
  (MPS does not page), compute is sized by p95 demand in SM activity where measured, else
  utilization. Risk: the share of GPU-steps whose co-located demand exceeds one GPU.
- ``timeslice``: up to ``replicas`` workloads per GPU taking turns; memory as for MPS (no
  isolation); demand in utilization (time share). Risk as for MPS.

Demand moves between GPU models by the ratio of their dense tensor peaks (an estimate).
Every packing is compared with a lower bound (total memory / GPU memory, peak total demand /
one GPU, MIG slices / 7 or 8): the first-fit answer can be above it, never below.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np

from gpuaudit.capacity.profiles import Profiles
from gpuaudit.errors import InputError
from gpuaudit.hardware import (
    MIG_COMPUTE_SLICES,
    MIG_MEMORY_SLICES,
    MPS_MAX_CLIENTS,
    TIME_SLICING_DEFAULT_REPLICAS,
    GpuSpec,
    MigProfile,
    mig_profiles,
    spec_for,
)
from gpuaudit.price.catalog import Rate
from gpuaudit.validate import HEADROOM, REPLICAS

__all__ = [
    "POLICIES",
    "PolicyResult",
    "Simulation",
    "peak_tflops",
    "simulate",
]

POLICIES = ("mig", "mps", "timeslice")
HOURS_PER_MONTH = Decimal(720)
MIB_PER_GB = 1e9 / 2**20
#: capacity overshoot tolerated as float noise when replaying demand
_EPS = 1e-6


def peak_tflops(spec: GpuSpec) -> float:
    """Dense bf16 (else fp16, else fp32) TFLOP/s: the peak demand is scaled by."""
    return spec.bf16_dense_tflops or spec.fp16_dense_tflops or spec.fp32_tflops


@dataclass(frozen=True)
class PolicyResult:
    """One policy's packing and replay for one group of workloads."""

    policy: str
    group: tuple[str | None, ...]
    gpus_today: int
    gpus_needed: int
    lower_bound: int
    projected_util_pct: float
    contention_step_share: float
    throttled_workload_step_share: float
    monthly_today_usd: Decimal
    monthly_needed_usd: Decimal
    placement: tuple[tuple[str, int, str], ...]  # (workload, gpu index, slot: profile / share)
    layouts: tuple[tuple[tuple[str, int], ...], ...] = ()  # MIG: per GPU (profile, start)
    notes: tuple[str, ...] = ()

    @property
    def monthly_saved_usd(self) -> Decimal:
        return self.monthly_today_usd - self.monthly_needed_usd


@dataclass(frozen=True)
class Simulation:
    """The side-by-side answer: per policy (and per group with ``--by``), plus what it rests on."""

    target_model: str
    target_rate: Rate
    step_s: float
    steps: int
    workloads: int
    results: tuple[PolicyResult, ...]
    totals: tuple[PolicyResult, ...]
    headroom: float
    replicas: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    def best(self, max_contention: float = 0.05) -> PolicyResult | None:
        """The policy saving most whose contention stays within ``max_contention``."""
        ok = [r for r in self.totals if r.contention_step_share <= max_contention
              and r.monthly_saved_usd > 0]
        return max(ok, key=lambda r: r.monthly_saved_usd, default=None)

    def saving(self) -> tuple[float, str] | None:
        """(share of today's monthly cost saved, the sentence saying it) for the recommender's
        ``capacity_consolidation_share`` finding, from :meth:`best`; None when no policy saves."""
        best = self.best()
        if best is None or best.monthly_today_usd <= 0:
            return None
        share = float(best.monthly_saved_usd / best.monthly_today_usd)
        return share, (
            f"simulate ({best.policy}): {best.gpus_today} GPUs -> {best.gpus_needed} "
            f"{self.target_model} (lower bound {best.lower_bound}), contention "
            f"{best.contention_step_share:.1%} of GPU-steps, replayed over "
            f"{self.steps} steps of {self.step_s:g} s")


def _demand(p: Profiles, rows: np.ndarray, use_sm: bool, scale: np.ndarray) -> np.ndarray:
    """(len(rows), T) demand as a fraction of one target GPU; unobserved steps are 0."""
    src = p.sm_pct if use_sm and p.sm_pct is not None else p.util_pct
    d = np.nan_to_num(src[rows], nan=0.0) * (scale[rows, None] / 100.0)
    if use_sm and p.sm_pct is not None:  # steps with utilization but no SM reading
        u = np.nan_to_num(p.util_pct[rows], nan=0.0) * (scale[rows, None] / 100.0)
        d = np.where(np.isnan(src[rows]), u, d)
    out: np.ndarray = d.astype(np.float32)
    return out


def _replay(d: np.ndarray, gpu_of: np.ndarray, gpus: int, cap: np.ndarray | None = None
            ) -> tuple[float, float, float]:
    """(projected utilization %, contention share of GPU-steps, throttled workload-step share).

    ``cap`` (per workload) is a MIG slice's compute share: a workload is throttled where its
    demand exceeds it; otherwise the co-located demand per GPU and step is summed."""
    if gpus == 0 or d.shape[1] == 0:
        return 0.0, 0.0, 0.0
    # one row of load per GPU with workloads (ascending GPU number), each workload's demand
    # added to its GPU's row in workload order: the sums np.add.reduceat over the rows
    # sorted by GPU gives, bit for bit, without gathering the whole (workloads x steps)
    # matrix in that order (172-345 MB for 1,000 workloads x 30 days, faulted in fresh)
    present, row = np.unique(gpu_of, return_inverse=True)
    first = np.zeros(present.shape[0], dtype=bool)
    if cap is not None:
        load = np.empty((present.shape[0], d.shape[1]), dtype=np.result_type(d, cap))
        per_gpu_over = np.zeros((present.shape[0], d.shape[1]), dtype=bool)
        n_over = 0
        for w in range(d.shape[0]):
            g = row[w]
            served = np.minimum(d[w], cap[w])
            over = d[w] > cap[w] + _EPS
            if first[g]:
                load[g] += served
            else:
                load[g] = served
                first[g] = True
            per_gpu_over[g] |= over
            n_over += int(np.count_nonzero(over))
        util = float(load.sum()) / (gpus * d.shape[1]) * 100.0
        return (util, float(per_gpu_over.sum()) / (gpus * d.shape[1]),
                float(np.float64(n_over) / d.size))
    load = np.empty((present.shape[0], d.shape[1]), dtype=d.dtype)
    for w in range(d.shape[0]):
        g = row[w]
        if first[g]:
            load[g] += d[w]
        else:
            load[g] = d[w]
            first[g] = True
    over_gpu = load > 1.0 + _EPS
    util = float(np.minimum(load, 1.0).sum()) / (gpus * d.shape[1]) * 100.0
    # a workload is throttled where its GPU is over
    throttled = sum(int(np.count_nonzero(over_gpu[row[w]] & (d[w] > 0)))
                    for w in range(d.shape[0]))
    return util, float(over_gpu.sum()) / (gpus * d.shape[1]), throttled / max(1, d.size)


def _mig_choose(profiles: Sequence[MigProfile], mem_mib: float, p95: float
                ) -> MigProfile:
    for prof in profiles:
        if prof.memory_gb * MIB_PER_GB >= mem_mib and prof.compute_fraction >= p95 - _EPS:
            return prof
    return profiles[-1]


def _mig_pack(items: list[tuple[int, MigProfile]]) -> tuple[list[int], list[list[tuple[
        MigProfile, int]]]]:
    """First-fit-decreasing onto MIG GPUs at allowed placements. Returns the GPU of each item
    (in ``items`` order) and each GPU's layout."""
    order = sorted(range(len(items)), key=lambda i: (-items[i][1].memory_slices,
                                                     -items[i][1].compute_slices, i))
    layouts: list[list[tuple[MigProfile, int]]] = []
    used: list[int] = []  # memory-slice bitmask per GPU
    compute: list[int] = []
    counts: list[dict[str, int]] = []
    open_gpus: list[int] = []
    gpu_of = [0] * len(items)
    for i in order:
        prof = items[i][1]
        placed = False
        for g in open_gpus:
            if compute[g] + prof.compute_slices > MIG_COMPUTE_SLICES:
                continue
            if counts[g].get(prof.name, 0) >= prof.max_instances:
                continue
            for start in prof.placements:
                mask = ((1 << prof.memory_slices) - 1) << start
                if used[g] & mask == 0:
                    used[g] |= mask
                    compute[g] += prof.compute_slices
                    counts[g][prof.name] = counts[g].get(prof.name, 0) + 1
                    layouts[g].append((prof, start))
                    gpu_of[i] = g
                    placed = True
                    break
            if placed:
                break
        if not placed:
            g = len(layouts)
            layouts.append([(prof, prof.placements[0])])
            used.append(((1 << prof.memory_slices) - 1) << prof.placements[0])
            compute.append(prof.compute_slices)
            counts.append({prof.name: 1})
            open_gpus.append(g)
            gpu_of[i] = g
        open_gpus = [g for g in open_gpus if used[g] != (1 << MIG_MEMORY_SLICES) - 1
                     and compute[g] < MIG_COMPUTE_SLICES]
    return gpu_of, layouts


def _vector_pack(mem: np.ndarray, size: np.ndarray, mem_cap: float, limit: int) -> np.ndarray:
    """First-fit-decreasing of (memory, compute) items onto GPUs of (mem_cap, 1.0) holding at
    most ``limit`` items each. Items larger than a GPU get one alone. One numpy scan of the
    open GPUs per item."""
    n = len(mem)
    order = np.argsort(-np.maximum(mem / mem_cap, size), kind="stable")
    free_mem = np.empty(n)
    free_c = np.empty(n)
    count = np.zeros(n, dtype=np.int64)
    gpus = 0
    gpu_of = np.empty(n, dtype=np.int64)
    for i in order:
        m, c = mem[i], min(size[i], 1.0)
        fits = np.flatnonzero((free_mem[:gpus] >= m - _EPS) & (free_c[:gpus] >= c - _EPS)
                              & (count[:gpus] < limit))
        g = int(fits[0]) if fits.size else gpus
        if g == gpus:
            free_mem[g], free_c[g] = mem_cap, 1.0
            gpus += 1
        free_mem[g] -= m
        free_c[g] -= c
        count[g] += 1
        gpu_of[i] = g
    return gpu_of


def _today(p: Profiles, rows: np.ndarray) -> int:
    return len({p.gpu_uuid[i] for i in rows})


def simulate(
    p: Profiles,
    *,
    policies: Sequence[str] = POLICIES,
    target_model: str | None = None,
    target_rate: Rate,
    today_rates: Mapping[str | None, Rate],
    headroom: float = 0.10,
    replicas: int = TIME_SLICING_DEFAULT_REPLICAS,
    by_group: bool = False,
) -> Simulation:
    """Pack and replay ``p`` under each policy (module doc).

    ``target_model``: the GPU to consolidate onto (default: the model most workloads ran
    on); ``target_rate`` its price; ``today_rates`` the price of each model seen today.
    ``by_group``: workloads of different groups never share a GPU (one packing per group).
    """
    headroom = HEADROOM.check(headroom, "headroom")
    replicas = int(REPLICAS.check(replicas, "replicas"))
    for pol in policies:
        if pol not in POLICIES:
            raise InputError(f"unknown policy {pol!r}", fix=f"use one of {', '.join(POLICIES)} or all")
    target = target_model or p.main_model
    tspec = spec_for(target)
    if tspec is None:
        raise InputError(f"no datasheet figures for GPU model {target!r}",
                         fix="pass --gpu-model (A100, H100, H200, B200, L4, ...)")
    notes: list[str] = []
    # per-workload scale: demand in units of the target GPU
    scale = np.ones(len(p))
    for i, m in enumerate(p.gpu_model):
        s = spec_for(m)
        if s is not None and s.family != tspec.family:
            scale[i] = peak_tflops(s) / peak_tflops(tspec)
    if np.any(scale != 1.0):
        notes.append(f"demand moved to {tspec.gpu_model} by the ratio of dense tensor peaks: "
                     "an estimate, not a benchmark")
    mem_cap = tspec.memory_gb * MIB_PER_GB
    peak_mem = np.nanmax(np.where(np.isnan(p.mem_mib), -1.0, p.mem_mib), axis=1) \
        if p.steps else np.full(len(p), -1.0)
    unknown_mem = peak_mem < 0
    need_mem = np.where(unknown_mem, mem_cap, peak_mem * (1.0 + headroom))
    if unknown_mem.any():
        notes.append(f"{int(unknown_mem.sum())} workload(s) have no memory reading: each keeps "
                     "a whole GPU's memory (nothing packed beside it)")
    groups: dict[tuple[str | None, ...], list[int]] = {}
    for i, g in enumerate(p.group):
        groups.setdefault(g if by_group else (), []).append(i)
    migs = mig_profiles(tspec.gpu_model)
    results: list[PolicyResult] = []
    totals: list[PolicyResult] = []
    all_rows = np.arange(len(p))
    today_all = _today(p, all_rows)
    monthly_today_all = _monthly_today(p, all_rows, today_rates)
    demand_cache: dict[tuple[bool, tuple[str | None, ...]], tuple[np.ndarray, np.ndarray]] = {}
    for pol in policies:
        if pol == "mig" and not migs:
            notes.append(f"{tspec.gpu_model} has no MIG: the mig policy was not simulated "
                         "(pass --gpu-model A100, H100, H200 or B200)")
            continue
        use_sm = pol == "mps" and p.sm_pct is not None
        group_results: list[PolicyResult] = []
        for gkey, rows_list in groups.items():
            rows = np.asarray(rows_list, dtype=np.int64)
            key = (use_sm, gkey)
            if key not in demand_cache:  # mig and timeslice (and mps without SM) share it
                demand_cache.clear()
                d = _demand(p, rows, use_sm, scale)
                # unobserved steps are 0 here, so a partition per row (no NaN) suffices
                p95 = np.percentile(d, 95, axis=1) if d.shape[1] else np.zeros(len(rows))
                demand_cache[key] = (d, p95)
            d, p95 = demand_cache[key]
            r = _policy(pol, p, rows, d, p95, need_mem[rows], mem_cap, migs, replicas,
                        target_rate, today_rates, gkey)
            group_results.append(r)
        results += group_results
        totals.append(_total(pol, group_results, today_all, monthly_today_all, p.steps))
    if not totals:
        raise InputError(f"{tspec.gpu_model} has no MIG, and MIG was the only policy asked for",
                         fix="pass --gpu-model A100, H100, H200 or B200, or --policy all")
    return Simulation(target_model=tspec.gpu_model, target_rate=target_rate, step_s=p.step_s,
                      steps=p.steps, workloads=len(p), results=tuple(results),
                      totals=tuple(totals), headroom=headroom, replicas=replicas,
                      notes=tuple(notes))


def _monthly_today(p: Profiles, rows: np.ndarray, rates: Mapping[str | None, Rate]
                   ) -> Decimal:
    seen: dict[str, str | None] = {}
    for i in rows:
        seen.setdefault(p.gpu_uuid[i], p.gpu_model[i])
    total = Decimal(0)
    for model in seen.values():
        rate = rates.get(model) or rates.get(None)
        if rate is None:
            raise InputError(f"no price for GPU model {model!r}",
                             fix="pass --gpu-model/--price or a --catalog with this model")
        total += rate.usd_per_gpu_hour * HOURS_PER_MONTH
    return total


def _policy(pol: str, p: Profiles, rows: np.ndarray, d: np.ndarray, p95: np.ndarray,
            mem: np.ndarray, mem_cap: float, migs: Sequence[MigProfile], replicas: int,
            rate: Rate, today_rates: Mapping[str | None, Rate],
            gkey: tuple[str | None, ...]) -> PolicyResult:
    notes: list[str] = []
    layouts: tuple[tuple[tuple[str, int], ...], ...] = ()
    if pol == "mig":
        chosen = [_mig_choose(migs, float(mem[k]), float(p95[k])) for k in range(len(rows))]
        too_big = sum(1 for k, c in enumerate(chosen) if c.memory_gb * MIB_PER_GB < mem[k])
        if too_big:
            notes.append(f"{too_big} workload(s) need more memory than a whole GPU")
        gpu_list, lay = _mig_pack(list(enumerate(chosen)))
        gpu_of = np.asarray(gpu_list, dtype=np.int64)
        gpus = len(lay)
        cap = np.asarray([c.compute_fraction for c in chosen])
        util, contention, throttled = _replay(d, gpu_of, gpus, cap)
        lb = max(math.ceil(sum(c.memory_slices for c in chosen) / MIG_MEMORY_SLICES),
                 math.ceil(sum(c.compute_slices for c in chosen) / MIG_COMPUTE_SLICES))
        slots = [c.name for c in chosen]
        layouts = tuple(tuple((pr.name, st) for pr, st in g) for g in lay)
    else:
        limit = MPS_MAX_CLIENTS if pol == "mps" else replicas
        gpu_of = _vector_pack(mem, p95, mem_cap, limit)
        gpus = int(gpu_of.max()) + 1 if len(gpu_of) else 0
        util, contention, throttled = _replay(d, gpu_of, gpus)
        peak_total = float(d.sum(axis=0).max()) if d.size else 0.0
        lb = max(math.ceil(float(np.minimum(mem, mem_cap).sum()) / mem_cap - _EPS),
                 math.ceil(peak_total - _EPS), math.ceil(len(rows) / limit))
        slots = [f"{p95[k]:.0%} p95" for k in range(len(rows))]
    lb = min(max(lb, 1 if len(rows) else 0), gpus)
    return PolicyResult(
        policy=pol, group=gkey, gpus_today=_today(p, rows), gpus_needed=gpus,
        lower_bound=lb, projected_util_pct=util, contention_step_share=contention,
        throttled_workload_step_share=throttled,
        monthly_today_usd=_monthly_today(p, rows, today_rates),
        monthly_needed_usd=rate.usd_per_gpu_hour * HOURS_PER_MONTH * gpus,
        placement=tuple((p.workload[int(rows[k])], int(gpu_of[k]), slots[k])
                        for k in range(len(rows))),
        layouts=layouts, notes=tuple(notes))


def _total(pol: str, parts: Sequence[PolicyResult], today: int, monthly_today: Decimal,
           steps: int) -> PolicyResult:
    gpus = sum(r.gpus_needed for r in parts)
    weight = max(gpus, 1)
    return PolicyResult(
        policy=pol, group=(), gpus_today=today, gpus_needed=gpus,
        lower_bound=sum(r.lower_bound for r in parts),
        projected_util_pct=sum(r.projected_util_pct * r.gpus_needed for r in parts) / weight,
        contention_step_share=sum(r.contention_step_share * r.gpus_needed for r in parts)
        / weight,
        throttled_workload_step_share=sum(
            r.throttled_workload_step_share * len(r.placement) for r in parts)
        / max(1, sum(len(r.placement) for r in parts)),
        monthly_today_usd=monthly_today,
        monthly_needed_usd=sum((r.monthly_needed_usd for r in parts), Decimal(0)),
        placement=(), notes=tuple(n for r in parts for n in r.notes))
