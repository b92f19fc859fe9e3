"""Rules: which remediations the measurements call for, and what each saves on its own.

Each rule reads phases and patterns per GPU (from :class:`~gpuaudit.classify.Usage`), the
diagnoses, any findings (profiler traces) and the cost lines, and yields a
:class:`~gpuaudit.recommend.plan.Recommendation` whose fraction is capped by the share of cost
it acts on. :mod:`gpuaudit.recommend.savings` combines them.

- idle-heavy (patterns ``idle``/``phased``): idle shutdown; consolidation by MPS, MIG,
  time-slicing;
- underutilized and bursty (input-starved): DataLoader workers/pinning/prefetch, DALI;
- underutilized and steady: larger batch, MPS/MIG, a smaller GPU;
- compute-bound: AMP/bf16, FP8 (Hopper+), torch.compile; NCCL when communication-bound;
- rates: spot, commitments (alternatives for an hour);
- low achieved FLOP/s (trace operator counts) with memory-bound evidence: a cheaper GPU whose
  peak and bandwidth still carry the job (right-size, a rate lever);
- every top diagnosis (classify/diagnose.py) feeds its own fixes, in the order the diagnosis
  lists them, each with its catalog efficiency fraction, acting on the diagnosed GPUs: fixes
  for a waiting GPU (host-fed, input-starved, straggler, idle) are capped by those GPUs'
  waste, compute-side fixes by their busy share. A GPU whose top diagnosis names a cause
  (host-fed, straggler) gets that cause's fixes instead of the shape-only rules above.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from decimal import Decimal

from gpuaudit.classify.diagnose import TENSOR_IDLE, Diagnosis
from gpuaudit.classify.usage import Pattern, SeriesSignals, Usage
from gpuaudit.hardware import MIG_COMPUTE_SLICES, gpu_family, mig_profiles, spec_for
from gpuaudit.price.catalog import Rate, embedded_catalog
from gpuaudit.price.cost import CostLine, CostReport
from gpuaudit.recommend.plan import Finding, Recommendation, Remediation, remediation_catalog
from gpuaudit.recommend.premises import PREMISES, judge
from gpuaudit.units import duration

__all__ = ["candidate_recommendations"]

ZERO = Decimal(0)
ONE = Decimal(1)
Q = Decimal("0.000001")
#: A commitment is counted only when the audit spans at least this many hours of data.
MIN_COMMITMENT_EVIDENCE_HOURS = 24

#: Dense BF16/FP16 tensor TFLOP/s (vendor datasheets), to check a smaller GPU keeps up.
TENSOR_TFLOPS: dict[str, float] = {
    "B200": 2250, "H200": 989, "H100": 989, "GH200": 989, "A100": 312, "L40S": 362,
    "L40": 181, "A10G": 70, "A10": 125, "L4": 121, "V100": 125, "T4": 65,
}
#: Framebuffer GiB per family in the catalog (smallest variant), for the right-size check.
_FAMILY_MEM_GIB = {"L4": 24, "A10G": 24, "A10": 24, "L40S": 48, "L40": 48, "T4": 16}


def _frac(x: Decimal) -> Decimal:
    return max(ZERO, min(ONE, x)).quantize(Q)


def _speedup_fraction(speedup: float) -> Decimal:
    """A throughput speedup s on the time it acts on saves f = 1 - 1/s of that time."""
    return Decimal(str(1.0 - 1.0 / speedup))


def _names(uuids: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(uuids[:limit])
    return shown + (f" and {len(uuids) - limit} more" if len(uuids) > limit else "")


class _Context:
    def __init__(self, usage: Usage, cost: CostReport, diagnoses: Sequence[Diagnosis],
                 findings: Sequence[Finding]):
        self.usage = usage
        self.cost = cost
        self.total = cost.total.observed_cost
        self.lines: dict[str, CostLine] = {str(ln.key[0]): ln for ln in cost.per_gpu}
        self.patterns: dict[str, Pattern] = {p.gpu_uuid: p for p in usage.patterns}
        self.series: dict[str, SeriesSignals] = usage.series_by_uuid()
        self.diagnoses = diagnoses
        self.top: dict[str, Diagnosis] = {d.gpu_uuid: d for d in diagnoses if d.top}
        self.findings = {f.signal: f for f in findings}
        self.monthly = cost.monthly_cost

    def share(self, amount: Decimal) -> Decimal:
        return _frac(amount / self.total) if self.total > 0 else ZERO

    def gpus(self, pred: Callable[[str], bool]) -> list[str]:
        return [u for u in self.lines if pred(u)]

    def kind(self, uuid: str) -> str:
        p = self.patterns.get(uuid)
        return p.kind if p else "unknown"

    def top_kind(self, uuid: str) -> str | None:
        d = self.top.get(uuid)
        return d.kind if d else None

    def diagnosed(self, kind: str) -> list[Diagnosis]:
        return [d for d in self.diagnoses if d.kind == kind]

    def finding(self, signal: str) -> Finding | None:
        return self.findings.get(signal)

    def rec(self, rem: Remediation, fraction: Decimal, cap: Decimal, evidence: str,
            scope: Sequence[str], counted: bool = True, why_not: str | None = None
            ) -> Recommendation:
        f = min(_frac(fraction), _frac(cap))
        return Recommendation(
            remediation=rem, fraction=f, cap=_frac(cap), counted=counted, evidence=evidence,
            scope=tuple(scope), monthly_usd=self.monthly * f, why_not_counted=why_not,
        )


def candidate_recommendations(
    usage: Usage,
    cost: CostReport,
    diagnoses: Sequence[Diagnosis],
    findings: Iterable[Finding] = (),
) -> list[Recommendation]:
    """Every remediation the measurements trigger, each with its standalone fraction."""
    ctx = _Context(usage, cost, diagnoses, list(findings))
    if ctx.total <= 0:
        return []
    cat = remediation_catalog()
    out: list[Recommendation] = []
    out += _idle(ctx, cat)
    out += _input(ctx, cat)
    out += _steady(ctx, cat)
    out += _compute(ctx, cat)
    out = _merge(out, _diagnosed(ctx, cat))
    mig_mps, sku = _small_work(ctx, cat)
    out = _merge(out, mig_mps)
    out += _rates(ctx, cat)
    out = _one_sku_move(out, _achieved_flops(ctx, cat))
    out = _one_sku_move(out, sku)
    out = _capacity(ctx, cat, out)
    out += _scheduling(ctx, cat)
    out = _check_premises(ctx, out)
    return [r for r in out if r.fraction > 0 or not r.counted]


def _check_premises(ctx: _Context, recs: list[Recommendation]) -> list[Recommendation]:
    """Every recommendation against its remediation's premise (recommend/premises.py) on
    the GPUs it acts on: refuted -> ruled out (listed with the numbers, never counted);
    not decidable from the fields present -> unverified with the field named, not counted;
    held -> kept, with the numbers that showed it."""
    out = []
    for r in recs:
        premise = r.remediation.premise
        if premise is None:
            out.append(r)
            continue
        uuids = list(ctx.series) if "all" in r.scope else [u for u in r.scope
                                                            if u in ctx.series]
        status, reason, field = judge(premise, [ctx.series[u] for u in uuids], ctx.findings)
        if status == "holds":
            out.append(replace(r, premise_held=reason))
        elif status == "refuted":
            out.append(replace(r, counted=False, ruled_out=True,
                               why_not_counted=f"ruled out: {reason}"))
        elif r.counted:
            out.append(replace(r, counted=False, decided_by=field,
                               why_not_counted=f"unverified: {reason}"
                               + (f"; {field} would decide" if field else "")))
        else:
            out.append(replace(r, decided_by=field))
    return out


#: Top diagnoses whose idle time is waiting on something (not shut-down-able idle).
_WAITING = frozenset({"host_bound", "host_compute", "input_bound", "straggler",
                      "communication_bound"})
#: Diagnoses whose fixes act on the GPU's waiting time (capped by its waste); the others act
#: on busy time (capped by the busy share, as the compute rules are).
_WAIT_SIDE = frozenset({"host_bound", "host_compute", "input_bound", "straggler", "idle",
                        "held_idle", "small_kernels"})
#: host_bound: only the fixes that remove the host transfers are counted; the others act on
#: the same stall and are listed with their standalone effect.
_HOST_COUNTED = frozenset({"offload_less", "overlap_transfers"})


def _merge(out: list[Recommendation], extra: list[Recommendation]) -> list[Recommendation]:
    """``extra`` added to ``out``: a fix already recommended and counted stays as it is; a
    counted diagnosis-driven fix replaces an uncounted (unverified) one of the same id."""
    by_id = {r.id: i for i, r in enumerate(out)}
    merged = list(out)
    for r in extra:
        i = by_id.get(r.id)
        if i is None:
            by_id[r.id] = len(merged)
            merged.append(r)
        elif r.counted and not merged[i].counted:
            merged[i] = r
    return merged


def _diagnosed(ctx: _Context, cat: dict[str, Remediation]) -> list[Recommendation]:
    """Each top diagnosis's fixes on the GPUs it names, with the catalog's fraction."""
    by_kind: dict[str, list[Diagnosis]] = {}
    for d in ctx.top.values():
        if d.gpu_uuid in ctx.lines and d.fixes:
            by_kind.setdefault(d.kind, []).append(d)
    out: list[Recommendation] = []
    for kind, ds in by_kind.items():
        uuids = [d.gpu_uuid for d in ds]
        cost = sum((ctx.lines[u].observed_cost for u in uuids), ZERO)
        waste = sum((ctx.lines[u].waste for u in uuids), ZERO)
        idle = sum((ctx.lines[u].phase_cost["idle"] for u in uuids), ZERO)
        busy = sum((ctx.lines[u].observed_cost * Decimal(str(
            (ctx.series[u].mean_util_pct or 0) / 100)) for u in uuids), ZERO)
        cap = ctx.share(waste) if kind in _WAIT_SIDE else ctx.share(busy)
        ev = (f"{kind.replace('_', ' ')} on {len(uuids)} GPU(s) ({_names(uuids)}): "
              f"{ds[0].evidence}; waste ${waste:.2f} of ${cost:.2f}")
        fixes: list[str] = []
        for d in ds:
            fixes += [f for f in d.fixes if f not in fixes and f in cat]
        for fid in fixes:
            rem = cat[fid]
            counted, why_not = True, None
            if fid == "idle_shutdown":
                f = ctx.share(idle)
                rec_cap = f
            elif "default_speedup" in rem.params:
                f = ctx.share(cost) * _speedup_fraction(rem.params["default_speedup"])
                rec_cap = cap
            else:
                f = cap * Decimal(str(rem.params.get("default_fraction", 0.0)))
                rec_cap = cap
            if kind in ("host_bound", "host_compute") and fid not in _HOST_COUNTED:
                counted = False
                why_not = ("acts on the same wait on the host as offload_less"
                           + (" and overlap_transfers" if kind == "host_bound" else "")
                           + ": listed with its own effect, not counted again")
            if fid == "fp8":
                counted = False
                why_not = "compute-bound: a precision change needs the job's convergence checked"
            out.append(ctx.rec(rem, f, rec_cap, ev, uuids, counted=counted, why_not=why_not))
    return out


#: Finding signals from capacity planning (gpuaudit.capacity, converted in the composition
#: layer): the share of observed cost a simulated consolidation / right-size saves.
CAPACITY_SIGNALS = {"capacity_consolidation_share": ("consolidation_simulated",
                                                      ("mig", "mps", "time_slicing")),
                    "capacity_right_size_share": ("right_size_simulated", ("right_size",))}


def _capacity(ctx: _Context, cat: dict[str, Remediation], recs: list[Recommendation]
              ) -> list[Recommendation]:
    """Capacity planning's simulated savings replace the heuristic estimates of the same
    levers: counted (efficiency capped by the measured waste, as every efficiency fix), the
    heuristics kept in the list but not counted."""
    out = list(recs)
    for signal, (rid, replaces) in CAPACITY_SIGNALS.items():
        f = ctx.finding(signal)
        if f is None or not isinstance(f.value, float) or f.value <= 0:
            continue
        rem = cat[rid]
        value = _frac(Decimal(str(f.value)))
        cap = ctx.share(ctx.cost.total.waste) if rem.lever == "efficiency" else ONE
        out = [r if r.id not in replaces or not r.counted else Recommendation(
            remediation=r.remediation, fraction=r.fraction, cap=r.cap, counted=False,
            evidence=r.evidence, scope=r.scope, monthly_usd=r.monthly_usd,
            why_not_counted=f"{rid} (simulated on this history) is counted instead")
            for r in out]
        out.append(ctx.rec(rem, value, cap, f.text, ["all"]))
    return out


#: Finding signal from ``gpuaudit queue``: the share of observed cost spent on GPUs idle and held
#: by no pod while GPU pods waited (priced per model in the composition layer).
QUEUE_SIGNAL = "queue_idle_while_waiting_share"


def _scheduling(ctx: _Context, cat: dict[str, Remediation]) -> list[Recommendation]:
    """Idle capacity while jobs wait: counted in the idle group, capped by the idle cost the
    audit measured over the same range (the queue's figure comes from another query and is
    never trusted above it)."""
    f = ctx.finding(QUEUE_SIGNAL)
    if f is None or not isinstance(f.value, float) or f.value <= 0:
        return []
    idle = ctx.share(ctx.cost.total.phase_cost["idle"])
    return [ctx.rec(cat["schedule_waiting_pods"], _frac(Decimal(str(f.value))), idle, f.text,
                    ["all"])]


#: achieved FLOP/s (trace operator counts, over GPU busy time) under this share of the dense
#: peak is low; with memory-bound evidence the GPU's FLOP/s are paid for and unused
LOW_FLOPS_PEAK_SHARE = 0.25
#: memory-bound evidence from a trace: at least this share of (non-communication) kernel time
#: in memory-bound kernels (elementwise, reduction, normalization, copies)
MEMORY_BOUND_KERNEL_SHARE = 0.5
#: the job's achieved FLOP/s and busy share, rescaled to a candidate GPU, must stay under this
_FLOPS_HEADROOM = 0.7


def _one_sku_move(out: list[Recommendation], extra: list[Recommendation]
                  ) -> list[Recommendation]:
    """Add ``extra`` (right-size picks from achieved FLOP/s) so that at most one right-size
    pick is counted: an hour moves to one GPU, so two picks never multiply. The larger counted
    one stays counted; the other is listed with its standalone saving."""
    res = list(out)
    for new in extra:
        old = [r for r in res if r.id == new.id and r.counted]
        if not new.counted or not old:
            res.append(new)
            continue
        best = max([*old, new], key=lambda r: r.fraction)
        res = [r for r in res if not (r.id == new.id and r.counted)] + [
            r if r is best else Recommendation(
                remediation=r.remediation, fraction=r.fraction, cap=r.cap, counted=False,
                evidence=r.evidence, scope=r.scope, monthly_usd=r.monthly_usd,
                why_not_counted="another right-size pick saves more and is counted instead "
                "(an hour moves to one GPU)")
            for r in [*old, new]]
    return res


def _achieved_flops(ctx: _Context, cat: dict[str, Remediation]) -> list[Recommendation]:
    """Low achieved FLOP/s on a compute-rich GPU with memory-bound evidence (a trace's kernel
    mix, or a ``memory_bound`` diagnosis from DCGM DRAM activity): the cheapest GPU at the
    same provider whose dense peak keeps the achieved FLOP/s under 70 % of it and whose memory
    bandwidth keeps the busy share under 70 % (memory-bound time scales with bandwidth).

    A rate lever (the right-size remediation, group ``sku``): the fraction is 1 - candidate
    rate / current rate, bounded by the cost. Counted only where the peak memory is measured
    and fits the candidate (a trace records no memory use); listed otherwise.
    """
    share = ctx.finding("achieved_flops_peak_share")
    tflops = ctx.finding("achieved_tflops_per_s")
    prec = ctx.finding("flops_peak_precision")
    if share is None or tflops is None or not isinstance(share.value, float) \
            or not isinstance(tflops.value, float) or share.value >= LOW_FLOPS_PEAK_SHARE:
        return []
    mbk = ctx.finding("memory_bound_kernel_share")
    diag = ctx.diagnosed("memory_bound")
    if diag:
        mb_ev = f"DCGM memory-bound diagnosis on {_names([d.gpu_uuid for d in diag])}"
    elif mbk is not None and isinstance(mbk.value, float) \
            and mbk.value >= MEMORY_BOUND_KERNEL_SHARE:
        mb_ev = f"{mbk.value:.0%} of kernel time in memory-bound kernels"
    else:
        return []
    attr = "fp32_tflops" if prec is not None and prec.value == "fp32" else "bf16_dense_tflops"
    saved = ZERO
    picks: list[str] = []
    scope: list[str] = []
    unverified = False
    for u in ctx.lines:
        s = ctx.series.get(u)
        rate = ctx.cost.rates.get(s.gpu_model if s else None) or ctx.cost.rates.get(None)
        cur = spec_for(rate.gpu_model) if rate is not None else None
        if rate is None or rate.provider is None or cur is None:
            continue
        busy = (s.mean_util_pct or 0.0) / 100 if s else 0.0
        best: tuple[Decimal, str, float] | None = None
        for e in embedded_catalog():
            cand = spec_for(e.gpu_model)
            if e.provider != rate.provider or cand is None or cand.family == cur.family:
                continue
            peak = getattr(cand, attr) or cand.fp16_dense_tflops
            if not peak or tflops.value > _FLOPS_HEADROOM * peak:
                continue
            if busy * cur.memory_bandwidth_gb_per_s / cand.memory_bandwidth_gb_per_s \
                    > _FLOPS_HEADROOM:
                continue
            if s is not None and s.mem_used_max_mib is not None \
                    and s.mem_used_max_mib * 1.2 / 1024 > cand.memory_gb:
                continue
            if e.on_demand_usd_per_gpu_hour < rate.usd_per_gpu_hour and (
                    best is None or e.on_demand_usd_per_gpu_hour < best[0]):
                best = (e.on_demand_usd_per_gpu_hour, f"{e.instance} ({e.gpu_model})",
                        tflops.value / peak)
        if best is None:
            continue
        unverified |= s is None or s.mem_used_max_mib is None
        saved += ctx.lines[u].observed_cost * (ONE - best[0] / rate.usd_per_gpu_hour)
        picks.append(f"{u} -> {best[1]} at ${best[0]:.2f}/GPU-h ({best[2]:.0%} of its peak)")
        scope.append(u)
    if not scope:
        return []
    ev = (f"achieved {tflops.value:.3g} TFLOP/s over busy time is {share.value:.1%} of the "
          f"GPU's peak, with {mb_ev}: the job pays for FLOP/s it does not use; "
          + "; ".join(picks[:3]) + (f" and {len(picks) - 3} more" if len(picks) > 3 else "")
          + f"; {share.text}")
    why = ("no memory use was recorded (a trace has none): check the job's peak memory fits "
           "the smaller GPU "
           "(gpuaudit rightsize on a recording)") if unverified else None
    return [ctx.rec(cat["right_size"], ctx.share(saved), ONE, ev, scope,
                    counted=not unverified, why_not=why)]


def _idle(ctx: _Context, cat: dict[str, Remediation]) -> list[Recommendation]:
    out: list[Recommendation] = []
    idle_gpus = ctx.gpus(lambda u: ctx.kind(u) in ("idle", "phased")
                         and ctx.top_kind(u) not in _WAITING)
    if idle_gpus:
        idle_cost = sum((ctx.lines[u].phase_cost["idle"] for u in idle_gpus), ZERO)
        longest = max(ctx.patterns[u].max_idle_run_s for u in idle_gpus)
        ev = (f"{len(idle_gpus)} GPU(s) idle in long stretches ({_names(idle_gpus)}): "
              f"${idle_cost:.2f} of ${ctx.total:.2f} observed cost is idle time; the longest "
              f"idle stretch lasted {duration(longest)}")
        share = ctx.share(idle_cost)
        out.append(ctx.rec(cat["idle_shutdown"], share, share, ev, idle_gpus))
    # Consolidation: GPUs that are mostly idle or steadily low could share one GPU.
    low = ctx.gpus(lambda u: ctx.kind(u) in ("idle", "steady") and
                   (ctx.series[u].mean_util_pct or 0) < 35)
    if low:
        waste = sum((ctx.lines[u].waste for u in low), ZERO)
        cap = ctx.share(waste)

        def packed(n_max: int, uuids: Sequence[str]) -> Decimal:
            saved = ZERO
            for u in uuids:
                mean = max(ctx.series[u].mean_util_pct or 0.0, 1.0)
                n = max(1, min(n_max, int(70.0 // mean)))
                saved += ctx.lines[u].observed_cost * (ONE - ONE / n)
            return ctx.share(saved)

        mean_low = sum((ctx.series[u].mean_util_pct or 0) for u in low) / len(low)
        ev = (f"{len(low)} GPU(s) average {mean_low:.0f}% busy ({_names(low)}); their waste is "
              f"${waste:.2f}")
        mig_fams = set(cat["mig"].params.get("mig_capable", []))
        mig_ok = [u for u in low if gpu_family(ctx.series[u].gpu_model or
                                               _rate_model(ctx, u) or "") in mig_fams]
        if mig_ok:
            out.append(ctx.rec(cat["mig"], packed(7, mig_ok), cap, ev + "; MIG-capable", mig_ok))
        steady = [u for u in low if ctx.kind(u) == "steady"]
        if steady:
            out.append(ctx.rec(cat["mps"], packed(4, steady), cap, ev, steady))
        idle_only = [u for u in low if ctx.kind(u) == "idle"]
        if idle_only:
            out.append(ctx.rec(cat["time_slicing"], packed(4, idle_only), cap, ev, idle_only))
    return out


def _rate_model(ctx: _Context, uuid: str) -> str | None:
    s = ctx.series.get(uuid)
    rate = ctx.cost.rates.get(s.gpu_model if s else None) or ctx.cost.rates.get(None)
    return rate.gpu_model if rate else None


def _input(ctx: _Context, cat: dict[str, Remediation]) -> list[Recommendation]:
    bursty = ctx.gpus(lambda u: ctx.kind(u) == "bursty"
                      and ctx.top_kind(u) not in ("host_bound", "straggler"))
    stall_cost = sum((ctx.lines[u].phase_cost["idle"] for u in bursty), ZERO)
    stall = ctx.share(stall_cost)
    evidence = ""
    scope: list[str] = list(bursty)
    if bursty:
        runs = [ctx.patterns[u].mean_idle_run_s or 0.0 for u in bursty]
        evidence = (f"{len(bursty)} GPU(s) bounce between idle and busy ({_names(bursty)}), "
                    f"mean idle gap {sum(runs) / len(runs):.1f} s: the input pipeline starves "
                    f"them; stall time costs ${stall_cost:.2f} ({stall:.0%} of cost)")
    f = ctx.finding("input_stall_share")
    if f is not None and isinstance(f.value, float) and Decimal(str(f.value)) > stall:
        stall = _frac(Decimal(str(f.value)))
        evidence = f.text
        scope = scope or ["all"]
    if stall <= 0:
        return []
    return [
        ctx.rec(cat["dataloader"], _speedup_fraction(cat["dataloader"].params["default_speedup"]),
                stall, evidence, scope),
        ctx.rec(cat["dali"], _speedup_fraction(cat["dali"].params["default_speedup"]), stall,
                evidence + "; if decoding images/video/audio on the CPU", scope),
    ]


def _steady(ctx: _Context, cat: dict[str, Remediation]) -> list[Recommendation]:
    out: list[Recommendation] = []
    steady = ctx.gpus(lambda u: ctx.kind(u) == "steady")
    if not steady:
        return out
    unused = sum((ctx.lines[u].underutilized_waste for u in steady), ZERO)
    cost = sum((ctx.lines[u].observed_cost for u in steady), ZERO)
    mean = sum((ctx.series[u].mean_util_pct or 0) for u in steady) / len(steady)
    ev = (f"{len(steady)} GPU(s) steadily {mean:.0f}% busy ({_names(steady)}): "
          f"${unused:.2f} of unused capacity while underutilized")
    f = ctx.share(cost) * _speedup_fraction(cat["larger_batch"].params["default_speedup"])
    out.append(ctx.rec(cat["larger_batch"], f, ctx.share(unused), ev, steady))
    out += _right_size(ctx, cat, steady)
    return out


def _right_size(ctx: _Context, cat: dict[str, Remediation], uuids: Sequence[str]
                ) -> list[Recommendation]:
    """A cheaper GPU at the same provider whose memory fits the peak and whose tensor
    throughput keeps the job under 70 % busy."""
    saved = ZERO
    picks: list[str] = []
    scope: list[str] = []
    for u in uuids:
        s = ctx.series[u]
        rate = ctx.cost.rates.get(s.gpu_model) or ctx.cost.rates.get(None)
        if rate is None or rate.provider is None or s.mem_used_max_mib is None:
            continue
        fam = gpu_family(rate.gpu_model or "")
        if fam is None or fam not in TENSOR_TFLOPS:
            continue
        need_gib = s.mem_used_max_mib * 1.2 / 1024
        best: tuple[Decimal, str] | None = None
        for e in embedded_catalog():
            f2 = gpu_family(e.gpu_model)
            if e.provider != rate.provider or f2 is None or f2 == fam:
                continue
            if f2 not in TENSOR_TFLOPS or _FAMILY_MEM_GIB.get(f2, 0) < need_gib:
                continue
            if (s.mean_util_pct or 0) * TENSOR_TFLOPS[fam] / TENSOR_TFLOPS[f2] > 70:
                continue
            if e.on_demand_usd_per_gpu_hour < rate.usd_per_gpu_hour and (
                    best is None or e.on_demand_usd_per_gpu_hour < best[0]):
                best = (e.on_demand_usd_per_gpu_hour, f"{e.instance} ({e.gpu_model})")
        if best is None:
            continue
        saved += ctx.lines[u].observed_cost * (ONE - best[0] / rate.usd_per_gpu_hour)
        picks.append(f"{u} -> {best[1]} at ${best[0]:.2f}/GPU-h")
        scope.append(u)
    if not scope:
        return []
    ev = ("peak memory and busy share fit a smaller GPU: " + "; ".join(picks[:3])
          + (f" and {len(picks) - 3} more" if len(picks) > 3 else ""))
    return [ctx.rec(cat["right_size"], ctx.share(saved), ctx.share(saved), ev, scope)]


def _compute(ctx: _Context, cat: dict[str, Remediation]) -> list[Recommendation]:
    out: list[Recommendation] = []
    busy = ctx.gpus(lambda u: (ctx.series[u].mean_util_pct or 0) >= 70)
    if not busy:
        return out
    busy_cost = sum((ctx.lines[u].observed_cost * Decimal(str(
        (ctx.series[u].mean_util_pct or 0) / 100)) for u in busy), ZERO)
    busy_share = ctx.share(busy_cost)
    mean = sum((ctx.series[u].mean_util_pct or 0) for u in busy) / len(busy)
    base_ev = f"{len(busy)} GPU(s) compute-bound, {mean:.0f}% busy on average ({_names(busy)})"
    # AMP: counted when the data show math off the tensor cores
    out.append(_evidence_or_unverified(
        ctx, cat["amp_bf16"], busy_share, base_ev, busy, "no_tensor_cores",
        "tensor_core_share", lambda v: v < 0.2,
        why_not="the data cannot show whether the job already runs in bf16/fp16 (no "
        "tensor-activity field or trace)"))
    fp8_fams = set(cat["fp8"].params.get("fp8_capable", []))
    hopper = [u for u in busy if gpu_family(ctx.series[u].gpu_model or _rate_model(ctx, u) or "")
              in fp8_fams]
    if hopper:
        tensors = [ctx.series[u].mean_tensor_active for u in hopper]
        # on tensor cores already (bf16/fp16): the same bound the premises use
        on_tc = all(t is not None and t >= TENSOR_IDLE for t in tensors)
        ev = base_ev + "; FP8-capable GPU"
        fp8_f = busy_share * _speedup_fraction(cat["fp8"].params["default_speedup"])
        if on_tc:
            out.append(ctx.rec(cat["fp8"], fp8_f, busy_share,
                               ev + "; tensor cores already busy (bf16), FP8 is the next step",
                               hopper))
        else:
            out.append(ctx.rec(cat["fp8"], fp8_f, busy_share, ev, hopper, counted=False,
                               why_not="needs the job on bf16 first; tensor activity not "
                               "measured or low"))
    out.append(_evidence_or_unverified(
        ctx, cat["torch_compile"], busy_share, base_ev, busy, "small_kernels",
        "small_kernel_share", lambda v: v >= 0.3,
        why_not="the data cannot show whether the model is already compiled"))
    comm = ctx.diagnosed("communication_bound")
    ce = ctx.finding("comm_exposed_share")
    nccl_speedup = _speedup_fraction(cat["nccl_tuning"].params["default_speedup"])
    if ce is not None and isinstance(ce.value, float) and ce.value > 0.05:
        cap = _frac(Decimal(str(ce.value)))
        out.append(ctx.rec(cat["nccl_tuning"], cap * nccl_speedup, cap, ce.text, busy))
    elif comm:
        cap = busy_share
        out.append(ctx.rec(cat["nccl_tuning"], cap * nccl_speedup, cap, comm[0].evidence,
                           [d.gpu_uuid for d in comm]))
    return out


def _evidence_or_unverified(
    ctx: _Context, rem: Remediation, busy_share: Decimal, base_ev: str, busy: Sequence[str],
    diagnosis: str, signal: str, signal_calls_for_it: Callable[[float], bool], *, why_not: str,
) -> Recommendation:
    """A compute-side fix acting on busy time at its catalog speedup: counted on the GPUs a
    ``diagnosis`` names, else on a trace finding whose ``signal`` calls for it, else listed
    as unverified (not counted)."""
    f = busy_share * _speedup_fraction(rem.params["default_speedup"])
    named = [d for d in ctx.diagnosed(diagnosis) if d.gpu_uuid in busy]
    if named:
        return ctx.rec(rem, f, busy_share, base_ev + "; " + named[0].evidence,
                       [d.gpu_uuid for d in named])
    found = ctx.finding(signal)
    if found is not None and isinstance(found.value, float) and signal_calls_for_it(found.value):
        return ctx.rec(rem, f, busy_share, base_ev + "; " + found.text, busy)
    return ctx.rec(rem, f, busy_share, base_ev, busy, counted=False, why_not=why_not)


def _rates(ctx: _Context, cat: dict[str, Remediation]) -> list[Recommendation]:
    """Spot and commitment, per GPU model and purchase kind: each lever reaches only the
    cost of the models bought on demand that have a cheaper spot (committed) price, so its
    fraction is the cost-weighted discount over those models and its cap their share of the
    cost. A model already on spot or committed gets neither."""
    out: list[Recommendation] = []
    rates = ctx.cost.rates
    if not any(r.provider is not None for r in rates.values()):
        return out
    cost: dict[str | None, Decimal] = {}
    uuids: dict[str | None, list[str]] = {}
    for u, ln in ctx.lines.items():
        sig = ctx.series.get(u)
        m = sig.gpu_model if sig is not None and sig.gpu_model in rates else None
        if m not in rates:
            continue
        cost[m] = cost.get(m, ZERO) + ln.observed_cost
        uuids.setdefault(m, []).append(u)

    def lever(alt: str) -> list[tuple[str | None, Rate, Decimal]]:
        got = []
        for m in sorted(cost, key=lambda x: -cost[x]):
            r = rates[m]
            od = r.on_demand_usd_per_gpu_hour
            price = r.spot_usd_per_gpu_hour if alt == "spot" else r.committed_usd_per_gpu_hour
            if r.provider is None or r.purchase != "on-demand" or not od or price is None:
                continue
            if alt == "spot":
                rho = Decimal(str(cat["spot"].params.get("rework_overhead", 0.1)))
                d = ONE - (price / od) * (ONE + rho)
            else:
                d = ONE - price / od
            if d > 0 and cost[m] > 0:
                got.append((m, r, d))
        return got

    def combine(got: list[tuple[str | None, Rate, Decimal]]) -> tuple[Decimal, Decimal,
                                                                          list[str]]:
        reach = sum((cost[m] for m, _r, _d in got), ZERO)
        saved = sum((cost[m] * d for m, _r, d in got), ZERO)
        scope = [u for m, _r, _d in got for u in uuids[m]]
        return ctx.share(saved), ctx.share(reach), scope

    spot = lever("spot")
    if spot:
        f, cap, scope = combine(spot)
        rho = Decimal(str(cat["spot"].params.get("rework_overhead", 0.1)))
        ev = "; ".join(
            f"{r.provider} spot ${r.spot_usd_per_gpu_hour:.2f} vs on-demand "
            f"${r.on_demand_usd_per_gpu_hour:.2f}/GPU-h for {r.gpu_model}"
            for _m, r, _d in spot) + (f"; {rho:.0%} allowed for rework after interruptions; "
                                      f"reaches the {cap:.0%} of cost bought on demand")
        out.append(ctx.rec(cat["spot"], f, cap, ev, scope))
    com = lever("commitment")
    if com:
        f, cap, scope = combine(com)
        d = f / cap if cap > 0 else ZERO
        busy = ONE - ctx.share(ctx.cost.total.phase_cost["idle"])
        hours = ctx.cost.wall_hours
        srcs = "; ".join(dict.fromkeys(r.committed_source or "" for _m, r, _d in com))
        ev = (f"{srcs}; the GPUs were in use {busy:.0%} of "
              f"{duration(float(hours) * 3600)} observed (breakeven {ONE - d:.0%}); reaches "
              f"the {cap:.0%} of cost bought on demand")
        why_not = None
        if hours < MIN_COMMITMENT_EVIDENCE_HOURS:
            why_not = (f"{duration(float(hours) * 3600)} of data cannot show a steady "
                       "baseline; audit at least "
                       f"{MIN_COMMITMENT_EVIDENCE_HOURS} h before committing")
        elif busy < ONE - d:
            why_not = "use below the breakeven: commit only to the steady baseline"
        out.append(ctx.rec(cat["commitment"], f, cap, ev, scope, counted=why_not is None,
                           why_not=why_not))
    return out
    rate: Rate = max(rates, key=lambda r: r.usd_per_gpu_hour)
    od = rate.on_demand_usd_per_gpu_hour
    if rate.purchase == "on-demand" and od and rate.spot_usd_per_gpu_hour is not None:
        rho = Decimal(str(cat["spot"].params.get("rework_overhead", 0.1)))
        d = ONE - (rate.spot_usd_per_gpu_hour / od) * (ONE + rho)
        if d > 0:
            ev = (f"{rate.provider} spot ${rate.spot_usd_per_gpu_hour:.2f} vs on-demand "
                  f"${od:.2f}/GPU-h for {rate.gpu_model}; {rho:.0%} allowed for rework after "
                  "interruptions")
            out.append(ctx.rec(cat["spot"], d, ONE, ev, ["all"]))
    if rate.purchase == "on-demand" and od and rate.committed_usd_per_gpu_hour is not None:
        d = ONE - rate.committed_usd_per_gpu_hour / od
        busy = ONE - ctx.share(ctx.cost.total.phase_cost["idle"])
        hours = ctx.cost.wall_hours
        ev = (f"{rate.committed_source}; the GPUs were in use {busy:.0%} of "
              f"{duration(float(hours) * 3600)} observed (breakeven {ONE - d:.0%})")
        why_not = None
        if hours < MIN_COMMITMENT_EVIDENCE_HOURS:
            why_not = (f"{duration(float(hours) * 3600)} of data cannot show a steady "
                       "baseline; audit at least "
                       f"{MIN_COMMITMENT_EVIDENCE_HOURS} h before committing")
        elif busy < ONE - d:
            why_not = "use below the breakeven: commit only to the steady baseline"
        out.append(ctx.rec(cat["commitment"], d, ONE, ev, ["all"], counted=why_not is None,
                           why_not=why_not))
    return out


#: Top diagnoses whose GPUs are not "small work": idle (its own fixes) or waiting on the
#: host, the input or peers (small only until the wait is removed).
_NOT_SMALL = frozenset({"idle", "held_idle", "host_bound", "host_compute", "input_bound",
                        "straggler", "communication_bound"})
#: Headroom over the measured peak memory a slice or a smaller GPU must hold (as rightsize).
SMALL_MEM_HEADROOM = 1.2
#: Packing small jobs by MPS: their SM activity summed up to this share of one GPU.
PACK_SM_TARGET = 0.9
_MIB_PER_GB = 1e9 / 2**20


def _small_work(ctx: _Context, cat: dict[str, Remediation]
                ) -> tuple[list[Recommendation], list[Recommendation]]:
    """Small work on a big GPU (premise ``small_work``: peak memory at most half the GPU's,
    SM activity under 70%): the MIG profile that holds the measured peak memory (plus 20%)
    and the job's SM share, packing by MPS, and the cheapest smaller GPU at the same
    provider for the same work. Returns (consolidation fixes, right-size picks).

    MIG and MPS are efficiency levers (capped by the measured waste, as every one); a
    smaller GPU is a rate lever priced for the same work: a GPU with a fraction r of the
    dense tensor peak (or memory bandwidth) runs a job that keeps SM share s busy about
    max(1, s / r) times as long, so it costs its rate times that, an estimate said so."""
    check = PREMISES["small_work"]
    mig_saved = mps_saved = sku_saved = ZERO
    mig_notes: list[str] = []
    mps_notes: list[str] = []
    sku_notes: list[str] = []
    mig_scope: list[str] = []
    mps_scope: list[str] = []
    sku_scope: list[str] = []
    no_fit: list[str] = []
    no_fit_scope: list[str] = []
    for u, line in ctx.lines.items():
        s = ctx.series.get(u)
        # an idle GPU has its own fixes; a GPU that waits on its host, input or peers is
        # small only until the wait is removed: its fix is the wait, not a smaller GPU
        if s is None or ctx.top_kind(u) in _NOT_SMALL \
                or check(s, ctx.findings).status != "holds":
            continue
        assert s.mem_used_max_mib is not None
        load = s.mean_sm_active if s.mean_sm_active is not None \
            else (s.mean_util_pct or 0.0) / 100
        need_mib = s.mem_used_max_mib * SMALL_MEM_HEADROOM
        model = s.gpu_model or _rate_model(ctx, u)
        profiles = mig_profiles(model) if model and gpu_family(model) else ()
        by_mem = [p for p in profiles if p.memory_gb * _MIB_PER_GB >= need_mib]
        fit = next((p for p in by_mem if p.compute_fraction >= load), None)
        if fit is not None and fit.compute_slices < MIG_COMPUTE_SLICES:
            mig_saved += line.observed_cost * (ONE - Decimal(fit.compute_slices)
                                               / Decimal(MIG_COMPUTE_SLICES))
            mig_scope.append(u)
            mig_notes.append(f"{u}: {fit.name} holds its {s.mem_used_max_mib / 1024:.1f} GiB "
                             f"peak (+20%) and {load:.0%} SM with {fit.compute_slices}/7 of "
                             "the SMs")
        elif by_mem and by_mem[0].compute_slices >= MIG_COMPUTE_SLICES:
            no_fit_scope.append(u)
            no_fit.append(f"{u}: no slice smaller than the whole GPU holds its "
                          f"{s.mem_used_max_mib / 1024:.1f} GiB peak (+20%)")
        elif by_mem:
            no_fit_scope.append(u)
            no_fit.append(f"{u}: {by_mem[0].name} holds its memory but {load:.0%} SM needs "
                          "more than a slice smaller than the whole GPU gives")
        total = s.mem_total_mib or 0.0
        n = min(int(PACK_SM_TARGET // max(load, 0.01)),
                int(total // need_mib) if total else 1)
        if n >= 2:
            mps_saved += line.observed_cost * (ONE - ONE / n)
            mps_scope.append(u)
            mps_notes.append(f"{u}: {n} jobs like it fit one GPU ({load:.0%} SM, "
                             f"{s.mem_used_max_mib / 1024:.1f} GiB each)")
        pick = _cheaper_for_same_work(ctx, u, s, load, need_mib)
        if pick is not None:
            sku_saved += line.observed_cost * pick[0]
            sku_scope.append(u)
            sku_notes.append(pick[1])
    sim = ("; replay it on your own history before moving: gpuaudit simulate <recording> "
           "(packing) and gpuaudit rightsize <recording> (smaller GPUs)")
    waste_cap = ctx.share(sum((ctx.lines[u].waste for u in {*mig_scope, *mps_scope}), ZERO))
    cons: list[Recommendation] = []
    if mig_scope:
        ev = ("small work on a big GPU: " + "; ".join(mig_notes[:3])
              + (f" and {len(mig_notes) - 3} more" if len(mig_notes) > 3 else "") + sim)
        cons.append(ctx.rec(cat["mig"], ctx.share(mig_saved), waste_cap, ev, mig_scope))
    elif no_fit:
        cons.append(replace(ctx.rec(
            cat["mig"], ZERO, ZERO, "small work on a big GPU: " + "; ".join(no_fit[:3]) + sim,
            no_fit_scope, counted=False, why_not="ruled out: no MIG slice smaller than the "
            "whole GPU carries the job's memory and SM share without slowing it"),
            ruled_out=True))
    if mps_scope:
        ev = "small work on a big GPU: " + "; ".join(mps_notes[:3]) + sim
        cons.append(ctx.rec(cat["mps"], ctx.share(mps_saved), waste_cap, ev, mps_scope))
    sku: list[Recommendation] = []
    if sku_scope:
        ev = ("small work on a big GPU, priced for the same work: " + "; ".join(sku_notes[:3])
              + (f" and {len(sku_notes) - 3} more" if len(sku_notes) > 3 else "") + sim)
        f = ctx.share(sku_saved)
        sku.append(ctx.rec(cat["right_size"], f, f, ev, sku_scope))
    return cons, sku


def _cheaper_for_same_work(ctx: _Context, u: str, s: SeriesSignals, load: float,
                           need_mib: float) -> tuple[Decimal, str] | None:
    """The cheapest GPU at this GPU's provider that holds ``need_mib`` and costs less for the
    same work (its rate times the estimated slowdown), and the share of cost it saves."""
    rate = ctx.cost.rates.get(s.gpu_model) or ctx.cost.rates.get(None)
    cur = spec_for(rate.gpu_model) if rate is not None and rate.gpu_model else None
    if rate is None or rate.provider is None or cur is None or not cur.bf16_dense_tflops:
        return None
    dram = s.mean_dram_active or 0.0
    best: tuple[Decimal, str] | None = None
    for e in embedded_catalog():
        cand = spec_for(e.gpu_model)
        if e.provider != rate.provider or cand is None or cand.family == cur.family:
            continue
        if cand.memory_gb * _MIB_PER_GB < need_mib or not cand.bf16_dense_tflops:
            continue
        slow = max(1.0, load * cur.bf16_dense_tflops / cand.bf16_dense_tflops,
                   dram * cur.memory_bandwidth_gb_per_s / cand.memory_bandwidth_gb_per_s)
        per_work = e.on_demand_usd_per_gpu_hour * Decimal(str(round(slow, 4)))
        if per_work >= rate.usd_per_gpu_hour:
            continue
        saved = ONE - per_work / rate.usd_per_gpu_hour
        if best is None or saved > best[0]:
            best = (saved, f"{u} -> {e.instance} ({e.gpu_model}, {cand.memory_gb:.0f} GB) at "
                    f"${e.on_demand_usd_per_gpu_hour:.2f}/GPU-h, ~{slow:.2f}x as long for the "
                    f"same work (estimate from dense bf16 peaks and memory bandwidth): "
                    f"${per_work:.2f} vs ${rate.usd_per_gpu_hour:.2f} per hour of today's work")
    return best
