"""The phase classification written as PromQL: the queries of one chunk, and their answers
decoded into phase figures. :mod:`gpuaudit.classify.pushdown` runs them in the store, so only
per-series sums cross the wire, never raw samples.

For every chunk of the range (one day by default) and every dcgm-exporter series (one per GPU,
MIG instance, or GPU x pod when time-sliced), instant queries at the chunk's end compute,
over a subquery at the audit step ``s`` whose points are exactly the chunk's steps:

- ``U`` = ``last_over_time(DCGM_FI_DEV_GPU_UTIL{sel}[s-1ms])`` (MIG instances, which have no
  GPU_UTIL: ``100 * last_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{sel}[s-1ms])``), a sample
  seen once per step (see :func:`gpuaudit.promql.fresh`);
- phases: the points (``count_over_time``) and their sum, and three threshold filters,
  ``U < 10`` and ``U >= 70`` packed (``sum_over_time(((U < 10) + K)[R:s])`` answers
  ``count * K + sum``, :func:`unpack`) and ``U >= 90`` counted, give the phase seconds, busy,
  unused and headroom time (:func:`decode`); the SM view the same way on
  ``DCGM_FI_PROF_SM_ACTIVE``;
- for patterns, from two-step windows ``W = X[2s-1ms]`` whose range functions need no
  per-point operator: the step change ``sum(max_over_time(W)) - sum(min_over_time(W))``,
  idle runs (idle points whose window is not all idle), first/last point (the first/last
  step whose window holds one sample, or the chunk's edge); the spread (raw
  ``stddev_over_time``), and raw ``sum_over_time``/``count_over_time``/``max_over_time`` of
  power, temperature, framebuffer, tensor/DRAM/SM activity, PCIe, energy (max - min, mJ),
  ECC, XID;
- a second pass asks the threshold queries, first/last point, idle edges and step change
  only of the series that need them (:data:`SECOND_PASS`, :func:`_needs`), selected by GPU
  and pod: a series whose raw extremes stay on one side of a threshold has its answer from
  its points and sum, one present at the chunk's first/last step starts/ends there; series
  with more raw samples than points (a step longer than the scrape interval) get the
  timestamp forms instead (:data:`MULTI_SAMPLE`);
- for GPUs whose series overlap in time within a chunk (time-sliced between pods), the share
  weight ``1 / count by (UUID, uuid, GPU_I_ID) (U)`` summed per series (:func:`share_query`),
  so a shared GPU is split, not billed twice. It matches vectors at every step, so it runs on
  those GPUs only (a regex on their UUIDs).

What costs is the per-point work of subqueries: the selector at every step, and every
operator applied per point, since Prometheus hashes each output point's labels (arithmetic
twice: it also drops the metric name). Raw range functions cost ~20x less. Hence: no
per-point arithmetic except the packing constant on filtered points, comparisons that keep
the smaller side, window functions instead of ``changes``/``idelta``/``timestamp`` over every
point, raw forms wherever the step grid does not matter, and ``--step 1m`` (a quarter of the
points; phases from the last sample of every minute). Chunks are evaluated separately and
summed (every figure is a sum or a max), so a month of a 1,000-GPU fleet is ~30 queries per
day of range, each answering one number per series.
:func:`gpuaudit.classify.pushdown.usage_from_pushdown` builds from them the same
:class:`~gpuaudit.classify.Usage` the local engine builds.

Semantics against the local engine (``gpuaudit.classify.phases``): a sample stands for one
step here; locally it stands until the next sample, capped at 3 intervals. On regular
scrapes the two agree exactly (local with ``cap_intervals=1`` agrees on gaps too); across a
gap local credits up to 2 more intervals of observed time. The longest idle stretch is not
computable in PromQL; the mean idle run is reported as its lower bound.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from gpuaudit.classify.usage import IDLE_BELOW_PCT as IDLE_PCT
from gpuaudit.classify.usage import PHASE_LOWER_PCT
from gpuaudit.errors import InputError
from gpuaudit.promql import duration, fresh, node_cpu_pct, with_matcher

__all__ = ["MAX_FIELDS", "MULTI_SAMPLE", "NARROWED", "SECOND_PASS", "build_queries", "decode",
           "needs", "pack_base", "share_query", "straddles", "unpack"]

_GPU_KEY = "UUID, uuid, GPU_I_ID"
_SUBQUERY = re.compile(r"\[\d+ms:\d+(?:ms|h)\]")
_UTIL = "DCGM_FI_DEV_GPU_UTIL"
_GR = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
_SM = "DCGM_FI_PROF_SM_ACTIVE"

#: raw per-series means: signal -> metric (sum_over_time and count_over_time)
_MEANS: dict[str, str] = {
    "sm_active": _SM,
    "sm_occupancy": "DCGM_FI_PROF_SM_OCCUPANCY",
    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "pcie_tx": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "pcie_rx": "DCGM_FI_PROF_PCIE_RX_BYTES",
    "power": "DCGM_FI_DEV_POWER_USAGE",
}
_MAXES: dict[str, str] = {"temp_c": "DCGM_FI_DEV_GPU_TEMP", "mem_used_mib": "DCGM_FI_DEV_FB_USED",
                          "xid": "DCGM_FI_DEV_XID_ERRORS"}
_DELTAS: dict[str, str] = {"energy_mj": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                           "ecc": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
#: fields summed across chunks (everything not in _MAX_FIELDS / first / last)
MAX_FIELDS = frozenset({"temp_c", "mem_used_mib", "xid", "mem_total_mib"})


def pack_base(points: int) -> float:
    """The power of two ``K`` that packs a count and a sum of utilization (0..100 %) of at
    most ``points`` values into one number, ``count * K + sum`` (see :func:`unpack`):
    ``K > 200 * points``, so the sum never reaches ``K`` even with readings up to 200 %
    (which :func:`unpack` then rejects as bad data)."""
    return float(2 ** int(np.ceil(np.log2(200 * max(points, 1) + 1))))


def unpack(total: float, base: float, *, where: str, top: float = 100.0
           ) -> tuple[float, float]:
    """``sum_over_time((U + K)[...])`` -> (count, sum of U). Exact for integer utilization
    (DCGM_FI_DEV_GPU_UTIL is an integer percent): every partial sum is an integer below 2**53.
    For fractional readings (100 x GR_ENGINE_ACTIVE, SM_ACTIVE ratios) each addition rounds at
    the ulp of the packed total (~1e-5 for a day at 15 s), far below a second. Every term is
    >= K and K is a power of two, so rounding never drops the total below ``count * K``: the
    count is exact. A sum outside 0..``top`` x count (``top``: 100 for a percent, 1 for a
    ratio) is a reading outside 0..100 %: an error."""
    count = float(np.floor(total / base))
    rest = total - count * base
    if rest < -1e-6 or rest > top * count + 1e-6 * max(count, 1.0):
        raise InputError(f"utilization outside 0..100 % (packed total {total!r}, "
                         f"{count:g} points, sum {rest!r})", where=where,
                         fix="check the exporter: DCGM_FI_DEV_GPU_UTIL is a percent, "
                         "GR_ENGINE_ACTIVE and SM_ACTIVE are ratios")
    return count, rest


#: phase thresholds (idle below the first, productive from the second, compute-bound from
#: the third), in percent; ratio views (SM_ACTIVE) compare against a hundredth of them
_LOWER_PCT: tuple[float, float, float] = (PHASE_LOWER_PCT[1], PHASE_LOWER_PCT[2],
                                           PHASE_LOWER_PCT[3])  # classify.usage's band edges

#: threshold queries run only for series whose raw extremes straddle the threshold (name ->
#: view prefix, threshold index): for the others every point is on one side, so the answer
#: follows from the points and their sum (:func:`decode`)
NARROWED: dict[str, tuple[str, int]] = {
    "lo": ("", 0), "idle_pairs": ("", 0), "hi": ("", 1), "top": ("", 2),
    "sm_lo": ("sm_", 0), "sm_hi": ("sm_", 1), "sm_top": ("sm_", 2),
}
_VIEW_TOP = {"": 100.0, "sm_": 1.0}  # full scale of a view's readings (percent, ratio)
_COUNT_ONLY = frozenset({"top", "sm_top", "idle_pairs"})  # answers a count, not count x K + sum

#: queries for series-chunks with more raw samples than points (a step longer than the
#: scrape interval, e.g. ``--step 1m`` on 15 s scrapes, or jitter putting two samples in
#: one step), where one-sample-per-step edges do not hold: first/last point from the
#: timestamps of every point, idle runs from idle/not-idle transitions (``changes``, about
#: half of them: an estimate, not a bound), and the sum of the points by subquery (where each
#: step holds one sample, the raw ``raw_sum`` is that sum)
MULTI_SAMPLE = ("first_ts", "last_ts", "changes", "sum")
_WINDOW_FORMS = ("first", "last", "edges", "idle_pairs")  # what MULTI_SAMPLE replaces


def straddles(v: Mapping[str, float], name: str) -> bool:
    """Whether series-chunk answers ``v`` need the threshold query ``name`` (see
    :data:`NARROWED`): its raw minimum is below the threshold and its maximum at or above
    it, or the extremes are unknown. The raw samples of the chunk and the step before it
    include every fresh point and every two-step window, so otherwise all points (and all
    two-step windows) fall on one side."""
    pre, k = NARROWED[name]
    t = _LOWER_PCT[k] * _VIEW_TOP[pre] / 100.0
    lo, hi = v.get(f"{pre}umin"), v.get(f"{pre}umax")
    if lo is None or hi is None or lo != lo or hi != hi:
        return True
    return lo < t <= hi


def needs(v: Mapping[str, float], name: str) -> bool:
    """Whether series-chunk answers ``v`` (first pass) need the second-pass query ``name``:
    a threshold query where the series straddles it (:func:`straddles`); first / last point
    where it has none at the chunk's first / last step; edges (for idle runs) where it may
    be idle; the step change where its readings vary."""
    if name in NARROWED:
        return f"{NARROWED[name][0]}n" in v and straddles(v, name)
    if "n" not in v:
        return False
    lo, hi = v.get("umin", float("nan")), v.get("umax", float("nan"))
    known = lo == lo and hi == hi
    if name == "first":
        return "at_start" not in v
    if name == "last":
        return "at_end" not in v
    if name == "edges":
        return not known or lo < _LOWER_PCT[0]
    if name == "absstep":
        return not known or lo < hi
    raise KeyError(name)


#: queries the second pass asks only of the series that need them (:func:`needs`); a
#: series not asked has its answer from the first pass (first / last: the chunk's edge;
#: edges and step change: zero)
SECOND_PASS = (*NARROWED, "first", "last", "edges", "absstep")


def _phase_view(metric: str, point: str, compared: str, *, r: str, r2: str, s: str,
                base: float, thresholds: tuple[float, float, float], scale: str,
                raw_scale: str) -> dict[str, str]:
    """The phase queries of one utilization view of ``metric``: five subqueries and the raw
    extremes (``umin``/``umax``, in the unit the thresholds compare, which tell whether a
    threshold query can be skipped: :data:`NARROWED`; over ``r2``, the chunk and the step
    before it, which the first step's two-step window reaches). ``point`` is the fresh-sample
    expression (one point per step with a sample), ``compared`` what the thresholds test
    (``point`` itself, or ``100 * point`` for MIG). ``scale`` (``"100 * "`` or empty) turns a
    ratio sum into percent outside the subquery, where it costs one operation per series,
    not one per point."""
    lo, hi, top = thresholds

    def sub(agg: str, x: str) -> str:
        return f"{agg}(({x})[{r}:{s}])"

    return {
        "n": sub("count_over_time", point),
        "sum": scale + sub("sum_over_time", point),
        "umin": f"{raw_scale}min_over_time({metric}[{r2}])",
        "umax": f"{raw_scale}max_over_time({metric}[{r2}])",
        "lo": sub("sum_over_time", f"({compared} < {lo:g}) + {base:.0f}"),
        "hi": sub("sum_over_time", f"({compared} >= {hi:g}) + {base:.0f}"),
        "top": sub("count_over_time", f"{compared} >= {top:g}"),
    }


def build_queries(sel: str, step_s: float, range_s: float, *, has_sm: bool,
                  family: str = "util", signals: bool = True,
                  has_cpu: bool = False) -> dict[str, str]:
    """The PromQL of one chunk: name -> expression, evaluated at the chunk's last step.

    ``sel`` is a matcher list (``{namespace="x"}``, already escaped; see
    :func:`gpuaudit.measure.fleet.prometheus.selector`). ``range_s`` is the chunk length
    (points ``end - range_s + step .. end``). ``family``: ``util`` reads
    ``DCGM_FI_DEV_GPU_UTIL``; ``mig`` reads ``100 * DCGM_FI_PROF_GR_ENGINE_ACTIVE`` of MIG
    instances (``GPU_I_ID!=""``), which report no GPU_UTIL.

    What a subquery costs in Prometheus is its per-point work: the selector at every step,
    and every operator applied per point (an arithmetic operator hashes each point's labels
    twice, a comparison filter once per point it keeps). Raw range functions cost ~20x less
    than either. So (figures per 1,000 GPU-days at 15 s in docs/benchmarks.md):

    - phases: points and sum with no per-point operator; below 10 % and from 70 % one packed
      filter each (``sum_over_time(((U < 10) + K)[R:s])``: count x K + sum, see
      :func:`unpack`); from 90 % a count;
    - the step change and idle runs from two-step windows ``W = X[2s-1ms]``, whose range
      functions need no operator: ``sum(max_over_time(W)) - sum(min_over_time(W))`` is the
      sum of ``|u - previous u|`` over consecutive points; idle points whose window is all
      idle (``max_over_time(W) < 10``) continue a run;
    - first and last point: a series present at the chunk's first (last) step starts
      (ends) there; otherwise at the first (last) step whose window holds one sample
      (``count_over_time(W) == 1``: a start, or the step after an end), a filter that keeps
      few points;
    - the spread and every other signal from raw range functions.
    The share weight of time-sliced GPUs (:func:`share_query`) matches vectors at every step,
    so it runs only for GPUs whose series overlap.

    ``has_cpu`` (node_exporter's ``node_cpu_seconds_total`` is scraped): the host's CPU busy
    percent (:func:`gpuaudit.promql.node_cpu_pct` by ``Hostname``) matched to each GPU series
    at every point where the GPU has a reading, summed and counted over all its points, its
    idle points (``U < 10``) and its busy points (``U >= 10``): ``sum_host_cpu`` /
    ``cnt_host_cpu`` and the ``_idle`` / ``_busy`` pairs. A vector match per point, so it
    costs like the share weight, and only when node_exporter is there.
    """
    s = duration(step_s)
    r = duration(range_s - 0.001)
    rr = duration(range_s)
    w2 = duration(2 * step_s - 0.001)
    r2 = duration(range_s + step_s - 0.001)
    base = pack_base(round(range_s / step_s))
    if family == "mig":
        metric = _GR + with_matcher(sel, 'GPU_I_ID!=""')
        point = fresh(metric, step_s)
        q = _phase_view(metric, point, f"(100 * {point})", r=r, r2=r2, s=s, base=base,
                        thresholds=_LOWER_PCT, scale="100 * ", raw_scale="100 * ")
        scale = "100 * "
    else:
        metric = _UTIL + sel
        point = fresh(metric, step_s)
        q = _phase_view(metric, point, point, r=r, r2=r2, s=s, base=base,
                        thresholds=_LOWER_PCT, scale="", raw_scale="")
        scale = ""
    # a step whose two-step window holds one sample: a series' first point, or the step
    # after its last
    edge = f"count_over_time({metric}[{w2}]) == 1"
    # a point at the chunk's last / first step (then it ends / starts there)
    offset = range_s - step_s
    window = f"{metric}[{duration(step_s - 0.001)}]"
    at_end = f"count_over_time({window})"
    at_start = f"count_over_time({window} offset {duration(offset)})" if offset > 0 else at_end
    # every digit (``:g`` keeps six: a chunk past ~11.6 days would move the start by seconds)
    first = f"({at_start} * 0 + time() - {offset:.17g})"
    if offset > 0:
        first += f" or min_over_time(timestamp({edge})[{duration(offset - 0.001)}:{s}])"
    q.update({
        "std": f"{scale}stddev_over_time({metric}[{r}])",
        "idle_pairs": f"count_over_time(({scale}max_over_time({metric}[{w2}]) < "
                      f"{_LOWER_PCT[0]:g})[{r}:{s}])",
        "edges": f"count_over_time(({edge})[{r}:{s}])",
        "absstep": f"{scale}(sum_over_time(max_over_time({metric}[{w2}])[{r}:{s}]) - "
                   f"sum_over_time(min_over_time({metric}[{w2}])[{r}:{s}]))",
        "first": first,
        "last": (f"({at_end} * 0 + time()) or "
                 f"(max_over_time(timestamp({edge})[{r}:{s}]) - {step_s:.17g})"),
        "at_start": at_start,  # then first / last need no subquery
        "at_end": at_end,
        # the edges above assume at most one sample per step (the step is the scrape
        # interval); where the raw samples outnumber the points they do not hold, and these
        # (costlier: an operator on every point) take over (:data:`MULTI_SAMPLE`)
        "raw_n": f"count_over_time({metric}[{r}])",
        "raw_sum": f"{scale}sum_over_time({metric}[{r}])",  # = sum where raw_n = n
        "first_ts": f"min_over_time(timestamp({point})[{r}:{s}])",
        "last_ts": f"max_over_time(timestamp({point})[{r}:{s}])",
        "changes": f"changes(({scale}{metric} < bool {_LOWER_PCT[0]:g})[{r}:{s}])",
    })
    if has_sm and family == "util":
        sm = fresh(_SM + sel, step_s)
        view = _phase_view(_SM + sel, sm, sm, r=r, r2=r2, s=s, base=base, scale="100 * ",
                           raw_scale="", thresholds=(_LOWER_PCT[0] / 100, _LOWER_PCT[1] / 100,
                                                     _LOWER_PCT[2] / 100))
        q.update({f"sm_{name}": expr for name, expr in view.items()})
    if not signals:
        return q
    for name, metric in _MEANS.items():
        # (start - step, end]: a sample on the chunk edge belongs to one chunk only
        q[f"sum_{name}"] = f"sum_over_time({metric}{sel}[{r}])"
        q[f"cnt_{name}"] = f"count_over_time({metric}{sel}[{r}])"
    q["std_power"] = f"stddev_over_time(DCGM_FI_DEV_POWER_USAGE{sel}[{r}])"
    for name, metric in _MAXES.items():
        q[name] = f"max_over_time({metric}{sel}[{rr}])"
    for name, metric in _DELTAS.items():  # [start - step, end]: chunk deltas add up
        q[name] = f"max_over_time({metric}{sel}[{rr}]) - min_over_time({metric}{sel}[{rr}])"
    if has_cpu:
        c = node_cpu_pct(step_s, by_hostname=True)
        u = point if family != "mig" else f"(100 * {point})"
        for suffix, when in (("", u), ("_idle", f"({u} < {IDLE_PCT:g})"),
                             ("_busy", f"({u} >= {IDLE_PCT:g})")):
            matched = f"({c} * on(Hostname) group_right() ({when} * 0 + 1))[{r}:{s}]"
            q[f"sum_host_cpu{suffix}"] = f"sum_over_time({matched})"
            q[f"cnt_host_cpu{suffix}"] = f"count_over_time({matched})"
    fb = [fresh(f"DCGM_FI_DEV_FB_{k}{sel}", step_s) for k in ("FREE", "USED", "RESERVED")]
    q["mem_total_mib"] = (f"max_over_time(({fb[0]} + {fb[1]} + ({fb[2]} or {fb[0]} * 0))"
                          f"[{r}:1h])")
    return q


def share_query(sel: str, step_s: float, range_s: float, *, family: str = "util") -> str:
    """``wsum``: the sum over a chunk's steps of 1 / (series of the same GPU at that step),
    per series; a time-sliced GPU's pods split its time by it. Vector matching per step
    (``on(UUID, uuid, GPU_I_ID) group_left``), so it runs only on GPUs whose series overlap
    in time (``sel`` narrows to them)."""
    if family == "mig":
        msel = with_matcher(sel, 'GPU_I_ID!=""')
        u = f"(100 * {fresh(_GR + msel, step_s)})"
    else:
        u = fresh(_UTIL + sel, step_s)
    key = f"count by ({_GPU_KEY}) ({u})"
    return (f"sum_over_time((({u} * 0 + 1) / on({_GPU_KEY}) group_left() {key})"
            f"[{duration(range_s - 0.001)}:{duration(step_s)}])")


def _threshold_answer(v: dict[str, float], name: str, base: float, *, where: str
                      ) -> tuple[float, float]:
    """(count, sum in the view's unit) of the threshold query ``name`` (:data:`NARROWED`)
    for series-chunk answers ``v``. A series whose extremes straddle the threshold was
    asked: its answer (popped), or none: no point. Otherwise all its points or none are on
    the threshold's side, whether it was asked or not (the same figures either way; for
    ``idle_pairs`` of an all-idle series that is its points, which leaves the idle runs an
    upper bound: one more per series end in the chunk at most)."""
    pre, k = NARROWED[name]
    top = _VIEW_TOP[pre]
    x = v.pop(name, None)
    if straddles(v, name):
        if x is None:
            return 0.0, 0.0
        return (x, 0.0) if name in _COUNT_ONLY else unpack(x, base, where=where, top=top)
    t = _LOWER_PCT[k] * top / 100.0
    below = k == 0
    inside = v[f"{pre}umax"] < t if below else v[f"{pre}umin"] >= t
    return (v[f"{pre}n"], v.get(f"{pre}sum", 0.0) * top / 100.0) if inside else (0.0, 0.0)


def decode(v: dict[str, float], range_s: float, step_s: float, *, where: str) -> None:
    """Turn one series-chunk's answers into the named figures (in place): ``n``,
    ``idle``/``under``/``prod``/``cb`` (points per phase), ``busy`` (sum of U), ``unused``
    (sum of 100 - U over underutilized points), ``headroom`` (the same over productive and
    compute-bound points), ``u2`` (sum of squares, from the raw spread), ``runs`` (idle runs,
    at least as many as there are: see below), and the SM view's ``sm_*``.

    Idle runs: idle points less those whose two-step window is all idle, plus the chunk's
    edge steps (series starts and the steps after series ends). On a series that neither
    starts nor ends in the chunk that is exact; otherwise each edge can add one run, so the
    mean idle run (idle time / runs) stays a lower bound of the longest one.
    Answers of one chunk come from separate queries; on a store still ingesting the chunk's
    last step they may disagree by a point, so derived counts are clamped at zero."""
    base = pack_base(round(range_s / step_s))
    for pre, top in _VIEW_TOP.items():
        if f"{pre}n" not in v:
            continue
        n = v[f"{pre}n"]
        total = v.get(f"{pre}sum", 0.0)  # percent

        c_lo, s_lo = _threshold_answer(v, f"{pre}lo", base, where=where)
        c_hi, s_hi = _threshold_answer(v, f"{pre}hi", base, where=where)
        c_top = min(_threshold_answer(v, f"{pre}top", base, where=where)[0], c_hi)
        pairs = 0.0 if pre else _threshold_answer(v, "idle_pairs", base, where=where)[0]
        for name in ("n", "sum", "umin", "umax"):
            v.pop(f"{pre}{name}", None)
        s_lo, s_hi = s_lo * 100.0 / top, s_hi * 100.0 / top  # percent
        under = max(0.0, n - c_lo - c_hi)
        v.update({f"{pre}idle": c_lo, f"{pre}under": under, f"{pre}prod": c_hi - c_top,
                  f"{pre}cb": c_top, f"{pre}busy": total})
        if pre:
            continue
        edges = v.pop("edges", 0.0)
        runs = min(c_lo, max(0.0, c_lo - pairs + edges))
        if "changes" in v:  # several samples per step (MULTI_SAMPLE): an estimate
            runs = min(c_lo, float(np.ceil(v.pop("changes") / 2.0)))
        v.update({"n": n, "unused": max(0.0, 100.0 * under - (total - s_lo - s_hi)),
                  "headroom": 100.0 * c_hi - s_hi, "runs": runs})
        if n > 0:
            mean = total / n
            std = v.pop("std", 0.0)
            v["u2"] = n * (std * std + mean * mean)
    for name in ("std", "idle_pairs", "edges", "umin", "umax", "sm_umin", "sm_umax", "raw_n",
                 "changes"):
        v.pop(name, None)


