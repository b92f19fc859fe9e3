"""Right-sizing: the cheapest GPU, provider and purchase option that still does the job.

Requirements come from the run's profile: memory = the highest p99 memory of its GPUs plus
headroom; compute = the p99 busy share (or ``throughput``) on the GPU it ran on. A candidate's
compute is scaled by the ratio of dense tensor peaks (``peak_now / peak_candidate``): an
*estimate*, said so in every row, unless a benchmark table (``--bench table.csv``: measured
throughput and p99 latency per GPU model) is given. A slower candidate may need more GPUs
(``ceil(gpus x busy x ratio / max busy)``), each still holding the job's memory.

Latency (``sla_p99_ms``) is checked against the benchmark's p99, or the p99 measured now
(``p99_ms_now``) scaled by the peak ratio; with neither, the SLA cannot be checked and the
report says so rather than guess.

Owned hardware (``[[owned]]`` in ``--catalog``) joins as candidates priced by total cost of
ownership, with the break-even duty against renting the same GPU.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import numpy as np

from gpuaudit.capacity.achieved import Achieved, achieved_vs_peak
from gpuaudit.capacity.profiles import Profiles, WorkloadStats, profile_stats
from gpuaudit.capacity.simulate import HOURS_PER_MONTH, MIB_PER_GB, peak_tflops
from gpuaudit.errors import InputError, PricingError
from gpuaudit.hardware import GpuSpec, spec_for
from gpuaudit.price.catalog import (
    PURCHASE_OPTIONS,
    CatalogEntry,
    Rate,
    embedded_catalog,
    resolve_rate,
)
from gpuaudit.price.owned import OwnedGpu, break_even_duty
from gpuaudit.validate import BUSY_PCT, DUTY, HEADROOM, LATENCY_MS, THROUGHPUT_PER_S

__all__ = ["BenchRow", "Candidate", "Rightsize", "load_bench", "parse_throughput", "rightsize"]

UNIT_SCALE = {"inferences": Decimal(1000), "tokens": Decimal(1_000_000),
              "samples": Decimal(1)}
UNIT_LABEL = {"inferences": "per 1k inferences", "tokens": "per 1M tokens",
              "samples": "per sample"}
_PER = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hr": 3600.0}


def parse_throughput(text: str) -> float:
    """``1200/s``, ``72000/min``, ``5e6/h`` or a plain number (per second), as units/s."""
    t = text.strip().lower().replace(" ", "")
    num, _, per = t.partition("/")
    mult = 1.0
    if num.endswith("k"):
        num, mult = num[:-1], 1e3
    elif num.endswith("m") and per:
        num, mult = num[:-1], 1e6
    try:
        value = float(num) * mult
    except ValueError:
        raise InputError(f"cannot read throughput {text!r}",
                         fix="write e.g. 1200/s, 72000/min or 5e6/h") from None
    if per and per not in _PER:
        raise InputError(f"unknown time unit in throughput {text!r}", fix="use /s, /min or /h")
    return THROUGHPUT_PER_S.check(value / _PER.get(per or "s", 1.0), "throughput")


@dataclass(frozen=True)
class BenchRow:
    gpu_model: str
    throughput_per_s: float
    p99_ms: float | None
    line: int


def load_bench(path: str | Path) -> tuple[BenchRow, ...]:
    """A CSV of measured per-GPU results: ``gpu_model,throughput_per_s,p99_ms`` (p99 may be
    empty). Throughput is per GPU."""
    p = Path(path)
    try:
        text = p.read_text("utf-8")
    except FileNotFoundError:
        raise InputError("benchmark table not found", where=str(p),
                         fix="pass a CSV with gpu_model,throughput_per_s,p99_ms") from None
    reader = csv.DictReader(text.splitlines())
    need = {"gpu_model", "throughput_per_s"}
    if not reader.fieldnames or not need <= set(reader.fieldnames):
        raise InputError(f"header {reader.fieldnames} lacks {sorted(need)}", where=f"{p}:1",
                         fix="columns: gpu_model,throughput_per_s,p99_ms")
    out = []
    for line, row in enumerate(reader, start=2):
        where = f"{p}:{line}"
        if spec_for(row["gpu_model"]) is None:
            raise InputError(f"unknown GPU model {row['gpu_model']!r}", where=where,
                             fix="use a model gpuaudit knows (H100, A100 80GB, L4, ...)")
        try:
            tp = float(row["throughput_per_s"])
            p99 = float(row["p99_ms"]) if (row.get("p99_ms") or "").strip() else None
        except ValueError:
            raise InputError("throughput_per_s / p99_ms is not a number", where=where,
                             fix="write plain numbers") from None
        if not math.isfinite(tp) or (p99 is not None and not math.isfinite(p99)):
            raise InputError(f"throughput_per_s {row['throughput_per_s']!r} / p99_ms "
                             f"{row.get('p99_ms')!r} must be finite numbers", where=where,
                             fix="write the measured values; leave p99_ms empty if unknown")
        if tp <= 0:
            raise InputError(f"throughput_per_s {tp} must be above 0", where=where,
                             fix="write the measured throughput of one GPU")
        if p99 is not None and p99 <= 0:
            raise InputError(f"p99_ms {p99} must be above 0", where=where,
                             fix="write the measured p99 latency in milliseconds, or leave it "
                             "empty")
        out.append(BenchRow(row["gpu_model"].strip(), tp, p99, line))
    if not out:
        raise InputError("benchmark table has no rows", where=str(p), fix="add one row per GPU")
    return tuple(out)


@dataclass(frozen=True)
class Candidate:
    """One GPU / provider / purchase option, priced and checked against the requirements."""

    gpu_model: str
    provider: str
    purchase: str
    usd_per_gpu_hour: Decimal
    gpus: int
    est_busy_pct: float
    meets_memory: bool
    meets_compute: bool
    meets_sla: bool | None  # None: not checked
    p99_ms: float | None
    basis: str  # "estimate (peak ratio)" or "benchmark <file>" or "TCO"
    source: str
    cost_per_unit_usd: Decimal | None = None
    break_even_duty: Decimal | None = None
    why_not: str = ""
    #: with an SLA but no measured p99 (estimate rows): the p99 measured on today's GPU under
    #: which this candidate keeps the SLA (SLA / the peak ratio); None where p99 is known
    sla_holds_if_p99_now_ms: float | None = None

    @property
    def usd_per_hour(self) -> Decimal:
        return self.usd_per_gpu_hour * self.gpus

    @property
    def monthly_usd(self) -> Decimal:
        return self.usd_per_hour * HOURS_PER_MONTH

    @property
    def fits(self) -> bool:
        return self.meets_memory and self.meets_compute and self.meets_sla is not False


@dataclass(frozen=True)
class Rightsize:
    current_model: str
    current_rate: Rate
    gpus_now: int
    mem_need_mib: float | None
    busy_p99_pct: float
    busy_mean_pct: float
    throughput_per_s: float | None
    unit: str
    sla_p99_ms: float | None
    headroom: float
    max_busy_pct: float
    candidates: tuple[Candidate, ...]
    stats: tuple[WorkloadStats, ...]
    achieved: tuple[Achieved, ...]
    #: from a known FLOP count per unit (``--flops-per-unit``) x ``--throughput``: the FLOP/s
    #: the run achieved and its share of the current GPUs' dense peak (model FLOP utilization)
    achieved_tflops: float | None = None
    mfu: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def current_usd_per_hour(self) -> Decimal:
        return self.current_rate.usd_per_gpu_hour * self.gpus_now

    @property
    def best(self) -> Candidate | None:
        fit = [c for c in self.candidates if c.fits and c.purchase != "owned"]
        return min(fit, key=lambda c: (c.usd_per_hour, c.gpu_model), default=None)

    def best_for(self, purchase: str, provider: str | None) -> Candidate | None:
        """The cheapest fit at the same provider bought the same way (on-demand vs on-demand):
        what the recommender counts, so that spot, commitments and a move of provider stay
        levers of their own rather than being counted twice."""
        fit = [c for c in self.candidates if c.fits and c.purchase == purchase
               and (provider is None or c.provider == provider)]
        return min(fit, key=lambda c: (c.usd_per_hour, c.gpu_model), default=None)

    @property
    def best_owned(self) -> Candidate | None:
        fit = [c for c in self.candidates if c.fits and c.purchase == "owned"]
        return min(fit, key=lambda c: (c.usd_per_hour, c.gpu_model), default=None)

    def saving(self) -> tuple[float, str] | None:
        """(share of today's hourly cost saved, the sentence saying it) for the recommender's
        ``capacity_right_size_share`` finding: the cheapest fit bought the same way at the same
        provider (:meth:`best_for`), or None when nothing fits for less."""
        rate = self.current_rate
        best = self.best_for(rate.purchase, rate.provider)
        now = self.current_usd_per_hour
        if best is None or now <= 0 or best.usd_per_hour >= now:
            return None
        share = float(Decimal(1) - best.usd_per_hour / now)
        return share, (
            f"rightsize: {best.gpus} x {best.gpu_model} ({best.provider} {best.purchase}, "
            f"${best.usd_per_gpu_hour:.2f}/GPU-h, {best.basis}) meets the measured need for "
            f"${best.usd_per_hour:.2f}/h vs ${now:.2f}/h now"
            + ("" if best.sla_holds_if_p99_now_ms is None else
               f"; the p99 SLA holds if today's p99 is <= {best.sla_holds_if_p99_now_ms:.0f} ms "
               "(not measured)"))


def _offers(user: Sequence[CatalogEntry], purchases: Sequence[str]
            ) -> list[tuple[GpuSpec, Rate]]:
    seen: set[tuple[str, str, str]] = set()
    out = []
    for e in [*user, *embedded_catalog()]:
        spec = spec_for(e.gpu_model)
        if spec is None:
            continue
        for purchase in purchases:
            key = (e.provider, spec.gpu_model, purchase)
            if key in seen:
                continue
            try:
                rate = resolve_rate(e.gpu_model, provider=e.provider, purchase=purchase,
                                    user_catalog=user)
            except PricingError:
                continue
            seen.add(key)
            out.append((spec, rate))
    return out


def rightsize(
    p: Profiles,
    *,
    current_rate: Rate,
    current_model: str | None = None,
    throughput_per_s: float | None = None,
    unit: str = "inferences",
    sla_p99_ms: float | None = None,
    p99_ms_now: float | None = None,
    bench: Sequence[BenchRow] = (),
    bench_name: str = "benchmark",
    user_catalog: Sequence[CatalogEntry] = (),
    owned: Sequence[OwnedGpu] = (),
    duty: float = 1.0,
    flops_per_unit: float | None = None,
    trace_tflops: tuple[float, int, str] | None = None,
    headroom: float = 0.10,
    max_busy_pct: float = 90.0,
    purchases: Sequence[str] = PURCHASE_OPTIONS,
) -> Rightsize:
    """Every candidate GPU priced and checked (module doc); ``best`` is the cheapest fit.

    ``trace_tflops``: (achieved TFLOP/s summed over the ranks of a profiler trace of the same
    job, number of ranks, where from), the alternative to ``flops_per_unit``."""
    if unit not in UNIT_SCALE:
        raise InputError(f"unknown unit {unit!r}", fix=f"use one of {', '.join(UNIT_SCALE)}")
    duty = DUTY.check(duty, "duty")
    headroom = HEADROOM.check(headroom, "headroom")
    max_busy_pct = BUSY_PCT.check(max_busy_pct, "max_busy_pct")
    for name, ms in (("sla_p99_ms", sla_p99_ms), ("p99_ms_now", p99_ms_now)):
        if ms is not None:
            LATENCY_MS.check(ms, name)
    if throughput_per_s is not None:
        throughput_per_s = THROUGHPUT_PER_S.check(throughput_per_s, "throughput_per_s")
    if bench and throughput_per_s is None:
        raise InputError("--bench needs --throughput (the rate to serve)",
                         fix="add --throughput 1200/s")
    model = current_model or p.main_model
    cur = spec_for(model)
    if cur is None:
        raise InputError(f"no datasheet figures for GPU model {model!r}",
                         fix="pass --gpu-model (H100, A100 80GB, L4, ...)")
    stats = profile_stats(p)
    notes: list[str] = []
    n_now = len({s.gpu_uuid for s in stats}) if len(p) else 1
    p99s = [s.util_p99_pct for s in stats if s.util_p99_pct is not None]
    means = [s.util_mean_pct for s in stats if s.util_mean_pct is not None]
    if not p99s:
        raise InputError("the samples carry no utilization reading", where=p.origin or None,
                         fix="record util_gpu_pct (nvidia-smi utilization.gpu)")
    busy_p99 = max(p99s)
    busy_mean = float(np.mean(means))
    mems = [s.mem_p99_mib for s in stats if s.mem_p99_mib is not None]
    mem_need = max(mems) * (1 + headroom) if mems else None
    if mem_need is None:
        notes.append("memory use not measured: candidates must hold the current GPU's "
                     f"{cur.memory_gb:g} GB")
    if throughput_per_s is not None and busy_mean <= 0:
        raise InputError("the run was never busy: no throughput per busy share to scale",
                         fix="profile a run that served the given --throughput")
    if sla_p99_ms is not None and not bench and p99_ms_now is None:
        notes.append("the p99 latency SLA was not checked (no p99 was measured): each "
                     "candidate shows the p99 on today's GPU under which it would hold the "
                     "SLA (SLA / peak ratio, an estimate); give --p99-ms-now (measured on the "
                     "current GPU) or --bench table.csv (measured p99 per GPU) to check it")
    achieved = achieved_vs_peak(p)
    achieved_tflops = mfu = None
    if flops_per_unit is not None:
        if throughput_per_s is None or flops_per_unit <= 0:
            raise InputError("--flops-per-unit needs --throughput and a positive FLOP count",
                             fix="e.g. --throughput 1200/s --unit tokens --flops-per-unit 1.4e10 "
                             "(2 x parameters per token)")
        achieved_tflops = throughput_per_s * flops_per_unit / 1e12
    if trace_tflops is not None:
        if flops_per_unit is not None:
            raise InputError("--trace and --flops-per-unit both give the achieved FLOP/s",
                             fix="give one of them")
        achieved_tflops, n_ranks, origin = trace_tflops
        notes.append(f"achieved FLOP/s from {origin} ({n_ranks} rank(s); the profiler's "
                     "operator FLOP counts over the trace window, a lower bound: operators "
                     "without a FLOP formula count zero)"
                     + (f"; the trace has {n_ranks} rank(s) but the run {n_now} GPU(s)"
                        if n_ranks != n_now else ""))
    if achieved_tflops is not None:
        mfu = achieved_tflops / (peak_tflops(cur) * n_now)
        notes.append(f"achieved {achieved_tflops:.3g} TFLOP/s = {mfu:.1%} of {n_now} x "
                     f"{cur.gpu_model}'s dense peak ({peak_tflops(cur):g} TFLOP/s each)"
                     + ("; below 10 %: the GPUs' FLOP/s are mostly unused, a smaller GPU or "
                        "fewer of them is worth testing with --bench" if mfu < 0.10 else ""))
    memory_bound = bool(achieved) and all(a.memory_bound for a in achieved)
    if memory_bound:
        bw = max(a.bandwidth_gb_per_s or 0.0 for a in achieved)
        notes.append(f"memory-bound on {cur.gpu_model}: DRAM busy, tensor pipes idle (achieved "
                     f"~{bw:.0f} GB/s of {cur.memory_bandwidth_gb_per_s:g}); candidates are "
                     "scaled by memory bandwidth, not FLOP/s, so a GPU with fewer FLOP/s but "
                     "enough bandwidth can do the same work for less")
    bench_by: dict[str, BenchRow] = {}
    for brow in bench:
        spec_b = spec_for(brow.gpu_model)
        assert spec_b is not None
        bench_by[spec_b.gpu_model] = brow
    cands: list[Candidate] = []
    for spec, rate in _offers(user_catalog, purchases):
        row = bench_by.get(spec.gpu_model)
        if bench and row is None:
            continue
        cands.append(_candidate(spec, rate.provider or "custom", rate.purchase,
                                rate.usd_per_gpu_hour, rate.source, cur, n_now, busy_p99,
                                busy_mean, mem_need, throughput_per_s, unit, sla_p99_ms,
                                p99_ms_now, row, bench_name, max_busy_pct,
                                memory_bound))
    if bench:
        missing = sorted({s.gpu_model for s, _ in _offers(user_catalog, ("on-demand",))}
                         - set(bench_by))
        if missing:
            notes.append(f"{len(missing)} priced GPU model(s) are not in {bench_name} and were "
                         "left out")
    for o in owned:
        ospec = spec_for(o.gpu_model)
        if ospec is None:
            raise InputError(f"owned GPU model {o.gpu_model!r} has no datasheet figures",
                             fix="name a known model in [[owned]] gpu_model")
        power = o.power_w
        if power is None:
            pw = [float(x) for x in p.power_w_mean if not np.isnan(x)]
            if pw and ospec.family == cur.family:
                power = Decimal(str(round(float(np.mean(pw)), 1)))
            elif ospec.tdp_w is not None:
                power = Decimal(str(ospec.tdp_w))
            else:
                power = Decimal(0)
        hourly = o.usd_per_used_hour(power, Decimal(str(duty)))
        orow = bench_by.get(ospec.gpu_model)
        if bench and orow is None:
            continue
        rented = [c for c in cands if c.gpu_model == ospec.gpu_model and c.purchase == "on-demand"]
        cheapest = min((c.usd_per_gpu_hour for c in rented), default=None)
        c = _candidate(ospec, "owned", "owned", hourly,
                       f"TCO: {o.source} (as of {o.as_of}); {power} W x PUE {o.pue} at "
                       f"${o.usd_per_kwh}/kWh; duty {duty:.0%}", cur, n_now, busy_p99,
                       busy_mean, mem_need, throughput_per_s, unit, sla_p99_ms, p99_ms_now, orow,
                       bench_name, max_busy_pct, memory_bound)
        be = break_even_duty(o, power, cheapest) if cheapest is not None else None
        from dataclasses import replace

        cands.append(replace(c, break_even_duty=be))
    cands.sort(key=lambda c: (not c.fits, c.usd_per_hour, c.gpu_model, c.provider, c.purchase))
    return Rightsize(
        current_model=cur.gpu_model, current_rate=current_rate, gpus_now=n_now,
        mem_need_mib=mem_need, busy_p99_pct=busy_p99, busy_mean_pct=busy_mean,
        throughput_per_s=throughput_per_s, unit=unit, sla_p99_ms=sla_p99_ms,
        headroom=headroom, max_busy_pct=max_busy_pct, candidates=tuple(cands), stats=stats,
        achieved=achieved, achieved_tflops=achieved_tflops, mfu=mfu, notes=tuple(notes))


def _candidate(spec: GpuSpec, provider: str, purchase: str, usd: Decimal, source: str,
               cur: GpuSpec, n_now: int, busy_p99: float, busy_mean: float,
               mem_need: float | None, throughput: float | None, unit: str,
               sla: float | None, p99_now: float | None, b: BenchRow | None,
               bench_name: str, max_busy: float, memory_bound: bool = False) -> Candidate:
    mem_ok = (spec.memory_gb * MIB_PER_GB >= mem_need) if mem_need is not None else \
        spec.memory_gb >= cur.memory_gb
    ratio = (cur.memory_bandwidth_gb_per_s / spec.memory_bandwidth_gb_per_s if memory_bound
             else peak_tflops(cur) / peak_tflops(spec))
    why = []
    sla_limit = None
    if b is not None:
        assert throughput is not None
        gpus = max(1, math.ceil(throughput / (b.throughput_per_s * max_busy / 100.0)))
        busy = throughput / (b.throughput_per_s * gpus) * 100.0
        p99 = b.p99_ms
        basis = f"{bench_name}:{b.line}"
    else:
        if throughput is not None:
            per_gpu_now = throughput / n_now / (busy_mean / 100.0)  # units/s at 100 % busy
            per_gpu = per_gpu_now / ratio
            gpus = max(1, math.ceil(throughput / (per_gpu * max_busy / 100.0)))
            busy = throughput / (per_gpu * gpus) * 100.0
        else:
            gpus = max(1, math.ceil(n_now * busy_p99 * ratio / max_busy - 1e-9))
            busy = n_now * busy_p99 * ratio / gpus
        p99 = None if p99_now is None else p99_now * ratio
        if sla is not None and p99_now is None:
            sla_limit = sla / ratio
        basis = "estimate (bandwidth ratio)" if memory_bound else "estimate (peak ratio)"
    compute_ok = busy <= max_busy + 1e-9
    sla_ok = None if sla is None or p99 is None else p99 <= sla
    if not mem_ok:
        why.append(f"{spec.memory_gb:g} GB < the memory needed")
    if sla_ok is False:
        why.append(f"p99 {p99:.0f} ms > SLA {sla:g} ms")
    unit_cost = None
    if throughput is not None:
        per_hour = usd * gpus
        unit_cost = per_hour / Decimal(str(throughput * 3600.0)) * UNIT_SCALE[unit]
    return Candidate(
        gpu_model=spec.gpu_model, provider=provider, purchase=purchase, usd_per_gpu_hour=usd,
        gpus=gpus, est_busy_pct=busy, meets_memory=mem_ok, meets_compute=compute_ok,
        meets_sla=sla_ok, p99_ms=p99, basis=basis, source=source, cost_per_unit_usd=unit_cost,
        why_not="; ".join(why), sla_holds_if_p99_now_ms=sla_limit)
