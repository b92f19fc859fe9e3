"""Pushdown: the phase classification runs inside Prometheus as PromQL; only per-series sums
cross the wire, never raw samples.

For every chunk of the range (one day by default) and every dcgm-exporter series (one per GPU,
MIG instance, or GPU x pod when time-sliced), instant queries at the chunk's end compute,
over a subquery at the audit step ``s`` whose points are exactly the chunk's steps:

- ``U`` = ``last_over_time(DCGM_FI_DEV_GPU_UTIL{sel}[s-1ms])`` (MIG instances, which have no
  GPU_UTIL: ``100 * last_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{sel}[s-1ms])``), a sample
  seen once per step (see :func:`gpuaudit.measure.prometheus.fresh`);
- four packed subqueries ``sum_over_time(((U < t) + K)[R:s])`` for t = 10, 70, 90 and for
  every point: each answer is ``count * K + sum`` (:func:`unpack`), so the points and the
  utilization sum below each threshold give the phase seconds, busy, unused and headroom
  time (:func:`decode`); the SM view the same way on ``DCGM_FI_PROF_SM_ACTIVE``;
- for patterns: the spread (raw ``stddev_over_time``), idle/not-idle transitions
  (``changes``), the mean absolute step change (``idelta``), first/last point
  (``timestamp``), and raw ``sum_over_time``/``count_over_time``/``max_over_time`` of power,
  temperature, framebuffer, tensor/DRAM/SM activity, PCIe, energy (max - min, mJ), ECC, XID;
- for GPUs whose series overlap in time within a chunk (time-sliced between pods), the share
  weight ``1 / count by (UUID, uuid, GPU_I_ID) (U)`` summed per series (:func:`share_query`),
  so a shared GPU is split, not billed twice. It matches vectors at every step, so it runs on
  those GPUs only (a regex on their UUIDs).

What costs is subqueries: each evaluates ``last_over_time`` for every series at every step,
~10x a raw range function. Hence packing (4 subqueries instead of 9), raw forms wherever the
step grid does not matter, and ``--step 1m`` (a quarter of the points; phases from the last
sample of every minute). Chunks are evaluated separately and summed (every figure is a sum or
a max), so a month of a 1,000-GPU fleet is ~30 queries per day of range, each answering one
number per series. :func:`gpuaudit.classify.pushdown.usage_from_pushdown` builds from them
the same :class:`~gpuaudit.classify.Usage` the local engine builds.

Semantics against the local engine (``gpuaudit.classify.phases``): a sample stands for one
step here; locally it stands until the next sample, capped at 3 intervals. On regular
scrapes the two agree exactly (local with ``cap_intervals=1`` agrees on gaps too); across a
gap local credits up to 2 more intervals of observed time. The longest idle stretch is not
computable in PromQL; the mean idle run is reported as its lower bound.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gpuaudit.errors import InputError
from gpuaudit.measure.dcgm import SeriesId, series_id
from gpuaudit.measure.prometheus import (
    PromClient,
    duration,
    escape_label_value,
    fresh,
    selector,
    time_chunks,
)
from gpuaudit.schema import ImportNote

__all__ = ["MAX_FIELDS", "PushdownData", "build_queries", "decode", "pack_base",
           "pull_aggregates", "share_query", "unpack"]

_GPU_KEY = "UUID, uuid, GPU_I_ID"
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


def _with(sel: str, extra: str) -> str:
    inner = sel[1:-1] if sel else ""
    return "{" + ",".join(x for x in (inner, extra) if x) + "}"


def pack_base(points: int) -> float:
    """The power of two ``K`` that packs a count and a sum of utilization (0..100 %) of at
    most ``points`` values into one number, ``count * K + sum`` (see :func:`unpack`):
    ``K > 200 * points``, so the sum never reaches ``K`` even with readings up to 200 %
    (which :func:`unpack` then rejects as bad data)."""
    return float(2 ** int(np.ceil(np.log2(200 * max(points, 1) + 1))))


def unpack(total: float, base: float, *, where: str) -> tuple[float, float]:
    """``sum_over_time((U + K)[...])`` -> (count, sum of U). Exact for integer utilization
    (DCGM_FI_DEV_GPU_UTIL is an integer percent): every partial sum is an integer below 2**53.
    For fractional readings (100 x GR_ENGINE_ACTIVE) each addition rounds at the ulp of the
    packed total (~1e-5 for a day at 15 s), far below a second. Every term is >= K and K is
    a power of two, so rounding never drops the total below ``count * K``: the count is
    exact. A sum outside 0..100 x count means utilization outside 0..100 %: an error."""
    count = float(np.floor(total / base))
    rest = total - count * base
    if rest < -1e-6 or rest > 100.0 * count + 1e-6 * max(count, 1.0):
        raise InputError(f"utilization outside 0..100 % (packed total {total!r}, "
                         f"{count:g} points, sum {rest!r})", where=where,
                         fix="check the exporter: DCGM_FI_DEV_GPU_UTIL is a percent, "
                         "GR_ENGINE_ACTIVE a ratio")
    return count, rest


#: packed subqueries (name -> upper threshold; None: every point) and what they decode to
_PACKED: dict[str, float | None] = {"p_all": None, "p10": 10.0, "p70": 70.0, "p90": 90.0}


def build_queries(sel: str, step_s: float, range_s: float, *, has_sm: bool,
                  family: str = "util", signals: bool = True) -> dict[str, str]:
    """The PromQL of one chunk: name -> expression, evaluated at the chunk's last step.

    ``sel`` is a matcher list (``{namespace="x"}``, already escaped; see
    :func:`gpuaudit.measure.prometheus.selector`). ``range_s`` is the chunk length
    (points ``end - range_s + step .. end``). ``family``: ``util`` reads
    ``DCGM_FI_DEV_GPU_UTIL``; ``mig`` reads ``100 * DCGM_FI_PROF_GR_ENGINE_ACTIVE`` of MIG
    instances (``GPU_I_ID!=""``), which report no GPU_UTIL.

    Cost is the subqueries (each evaluates ``last_over_time`` per series per step); raw
    range functions cost ~10x less. So the phase figures come from four packed subqueries,
    ``sum_over_time(((U < t) + K)[R:s])`` for t = 10, 70, 90 and every point (decoded by
    :func:`unpack` into counts and sums below each threshold), the spread from raw
    ``stddev_over_time``, and only ``changes``, the step change and first/last timestamps
    need subqueries of their own. Only scalar comparisons and functions run per step (no
    vector matching, which hashes every series' labels at every step); the share weight of
    time-sliced GPUs (:func:`share_query`) runs only for GPUs whose series overlap.
    """
    s = duration(step_s)
    r = duration(range_s - 0.001)
    rr = duration(range_s)
    w2 = duration(2 * step_s - 0.001)
    base = pack_base(round(range_s / step_s))
    if family == "mig":
        msel = _with(sel, 'GPU_I_ID!=""')
        u = f"(100 * {fresh(_GR + msel, step_s)})"
        raw = f"100 * stddev_over_time({_GR}{msel}[{rr}])"
        plain = f"(100 * {_GR}{msel})"
        step_change = f"abs(100 * idelta({_GR}{msel}[{w2}]))"
    else:
        u = fresh(_UTIL + sel, step_s)
        raw = f"stddev_over_time({_UTIL}{sel}[{rr}])"
        plain = f"{_UTIL}{sel}"
        step_change = f"abs(idelta({_UTIL}{sel}[{w2}]))"

    def sub(agg: str, x: str) -> str:
        return f"{agg}(({x})[{r}:{s}])"

    def packed(x: str, below: float | None) -> str:
        cond = x if below is None else f"({x} < {below:g})"
        return sub("sum_over_time", f"{cond} + {base:.0f}")

    q: dict[str, str] = {name: packed(u, t) for name, t in _PACKED.items()}
    q.update({
        "std": raw,
        # the plain selector is ~3x cheaper than fresh(); a value held across a missed
        # scrape (5-minute lookback) repeats itself, so it adds no change
        "changes": f"changes(({plain} < bool 10)[{r}:{s}])",
        "absstep": sub("sum_over_time", step_change),
        "first": sub("min_over_time", f"timestamp({u})"),
        "last": sub("max_over_time", f"timestamp({u})"),
    })
    if has_sm and family == "util":
        smu = f"(100 * {fresh(_SM + sel, step_s)})"
        q.update({f"sm_{name}": packed(smu, t) for name, t in _PACKED.items()})
    if not signals:
        return q
    for name, metric in _MEANS.items():
        q[f"sum_{name}"] = f"sum_over_time({metric}{sel}[{rr}])"
        q[f"cnt_{name}"] = f"count_over_time({metric}{sel}[{rr}])"
    q["std_power"] = f"stddev_over_time(DCGM_FI_DEV_POWER_USAGE{sel}[{rr}])"
    for name, metric in _MAXES.items():
        q[name] = f"max_over_time({metric}{sel}[{rr}])"
    for name, metric in _DELTAS.items():
        q[name] = f"max_over_time({metric}{sel}[{rr}]) - min_over_time({metric}{sel}[{rr}])"
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
        msel = _with(sel, 'GPU_I_ID!=""')
        u = f"(100 * {fresh(_GR + msel, step_s)})"
    else:
        u = fresh(_UTIL + sel, step_s)
    key = f"count by ({_GPU_KEY}) ({u})"
    return (f"sum_over_time((({u} * 0 + 1) / on({_GPU_KEY}) group_left() {key})"
            f"[{duration(range_s - 0.001)}:{duration(step_s)}])")


def decode(v: dict[str, float], range_s: float, step_s: float, *, where: str) -> None:
    """Turn one series-chunk's packed answers into the named figures (in place): ``n``,
    ``idle``/``under``/``prod``/``cb`` (points per phase), ``busy`` (sum of U), ``unused``
    (sum of 100 - U over underutilized points), ``headroom`` (the same over productive and
    compute-bound points), ``u2`` (sum of squares, from the raw spread), and ``sm_*``."""
    base = pack_base(round(range_s / step_s))
    for pre in ("", "sm_"):
        if f"{pre}p_all" not in v:
            continue
        n, total = unpack(v.pop(f"{pre}p_all"), base, where=where)
        c10, s10 = unpack(v.pop(f"{pre}p10", 0.0) or 0.0, base, where=where)
        c70, s70 = unpack(v.pop(f"{pre}p70", 0.0) or 0.0, base, where=where)
        c90, _s90 = unpack(v.pop(f"{pre}p90", 0.0) or 0.0, base, where=where)
        under, high = c70 - c10, n - c70
        v.update({f"{pre}idle": c10, f"{pre}under": under, f"{pre}prod": c90 - c70,
                  f"{pre}cb": n - c90, f"{pre}busy": total})
        if pre:
            continue
        v.update({"n": n, "unused": 100.0 * under - (s70 - s10),
                  "headroom": 100.0 * high - (total - s70)})
        if n > 0:
            mean = total / n
            std = v.pop("std", 0.0)
            v["u2"] = n * (std * std + mean * mean)
    v.pop("std", None)


@dataclass
class PushdownData:
    """Per-series, per-chunk sums from the store. ``values[(code, chunk)]`` maps a query name
    to its number; ``ids[code]`` decodes the series; ``chunks`` are (start_s, end_s)."""

    ids: list[SeriesId]
    chunks: list[tuple[float, float]]
    step_s: float
    values: dict[tuple[int, int], dict[str, float]]
    origin: str
    notes: list[ImportNote] = field(default_factory=list)
    fleet_util_pct: dict[str, float | None] = field(default_factory=dict)
    queries: int = 0
    has_sm: bool = False
    shared: bool = False


def pull_aggregates(
    client: PromClient,
    *,
    start_s: float,
    end_s: float,
    step_s: float,
    matchers: Mapping[str, str] | None = None,
    chunk_s: float = 86_400.0,
    workers: int = 4,
) -> PushdownData:
    """Run the pushdown queries chunk by chunk (step-aligned, ``chunk_s`` long, ``workers``
    queries at a time) and collect the decoded answers; then the share weight of GPUs whose
    series overlap in a chunk (time-sliced), on those GPUs only."""
    if step_s <= 0:
        raise InputError(f"step {step_s} s is not positive", fix="--step 15s, 1m, ...")
    sel = selector(matchers)
    start_s = np.ceil(start_s / step_s) * step_s
    end_s = np.floor(end_s / step_s) * step_s
    points = max(1, round(chunk_s / step_s))
    chunks = time_chunks(float(start_s), float(end_s), step_s, points)
    whole = duration(end_s - start_s + step_s)
    mig_sel = _with(sel, 'GPU_I_ID!=""')
    probes = {
        "sm": f"count(last_over_time({_SM}{sel}[{whole}]))",
        "mig": f"count(last_over_time({_GR}{mig_sel}[{whole}]))",
    }
    found = {k: client.query(q, float(end_s)) for k, q in probes.items()}
    has_sm = bool(found["sm"])
    families = ["util", "mig"] if found["mig"] else ["util"]
    data = PushdownData(ids=[], chunks=list(chunks), step_s=step_s, values={},
                        origin=f"Prometheus {client.url} (PromQL pushdown, step {step_s:g} s)",
                        has_sm=has_sm)
    id_index: dict[SeriesId, int] = {}
    uuid_label: dict[int, tuple[str, str]] = {}  # code -> (UUID or uuid, value)
    jobs: list[tuple[int, str, str]] = []
    for i, (a, b) in enumerate(chunks):
        for fam in families:
            qs = build_queries(sel, step_s, b - a + step_s, has_sm=has_sm, family=fam,
                               signals=fam == "util")
            jobs += [(i, name, expr) for name, expr in qs.items()]
    _run(client, jobs, chunks, data, id_index, uuid_label, workers, "pushdown")
    for (code, i), v in data.values.items():
        a, b = chunks[i]
        decode(v, b - a + step_s, step_s, where=f"{client.url}: pushdown, series "
               f"{data.ids[code].gpu_uuid}, chunk starting {a:.0f}")
    # time-sliced GPUs: series of one GPU whose [first, last] overlap within a chunk
    share_jobs: list[tuple[int, str, str]] = []
    for i, (a, b) in enumerate(chunks):
        by_gpu: dict[str, list[tuple[float, float, int]]] = {}
        for (code, j), v in data.values.items():
            if j == i and "first" in v and "last" in v:
                by_gpu.setdefault(data.ids[code].gpu_uuid, []).append(
                    (v["first"], v["last"], code))
        overlapping: dict[str, set[str]] = {}
        for spans in by_gpu.values():
            spans.sort()
            if any(spans[k + 1][0] <= max(x[1] for x in spans[:k + 1])
                   for k in range(len(spans) - 1)):
                for _f, _l, code in spans:
                    name, value = uuid_label[code]
                    overlapping.setdefault(name, set()).add(value)
        for name, values in sorted(overlapping.items()):
            data.shared = True
            for part in _batches(sorted(values), 200):
                narrow = _with(sel, f'{name}=~"{escape_label_value(_regex(part))}"')
                for fam in families:
                    share_jobs.append((i, "wsum", share_query(narrow, step_s, b - a + step_s,
                                                              family=fam)))
    _run(client, share_jobs, chunks, data, id_index, uuid_label, workers, "time-sliced GPUs")
    data.queries = len(jobs) + len(share_jobs) + len(probes)
    for label, secs in (("1h", 3600.0), ("24h", 86400.0)):
        rng = duration(min(secs, end_s - start_s + step_s))
        total = count = 0.0
        for fam in families:
            metric, scale = (f"{_GR}{mig_sel}", 100.0) if fam == "mig" else \
                (f"{_UTIL}{sel}", 1.0)
            for agg in ("sum_over_time", "count_over_time"):
                res = client.query(f"sum({agg}({metric}[{rng}]))", float(end_s))
                data.queries += 1
                if res and res[0][1] == res[0][1]:
                    if agg == "sum_over_time":
                        total += scale * res[0][1]
                    else:
                        count += res[0][1]
        data.fleet_util_pct[label] = total / count if count > 0 else None
    return data


def _run(client: PromClient, jobs: list[tuple[int, str, str]],
         chunks: list[tuple[float, float]], data: PushdownData, id_index: dict[SeriesId, int],
         uuid_label: dict[int, tuple[str, str]], workers: int, what: str) -> None:
    """Evaluate ``jobs`` (chunk, name, PromQL) at their chunk's end, ``workers`` at a time,
    into ``data.values``; NaN answers (nothing measured) are left out."""
    if not jobs:
        return
    advance = client.progress(what, len(jobs)) if client.progress else None

    def run(job: tuple[int, str, str]) -> tuple[int, str, list[tuple[dict[str, str], float]]]:
        i, name, expr = job
        rows = client.query(expr, chunks[i][1])
        if advance:
            advance(1)
        return i, name, rows

    with cf.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for i, name, rows in pool.map(run, jobs):
            for labels, value in rows:
                sid = series_id(labels, default_host="unknown",
                                where=f"{client.url}: pushdown {name}")
                code = id_index.get(sid)
                if code is None:
                    code = id_index[sid] = len(data.ids)
                    data.ids.append(sid)
                    uuid_label[code] = ("UUID", labels["UUID"]) if labels.get("UUID") else \
                        ("uuid", labels.get("uuid", ""))
                if value == value:  # NaN: nothing measured
                    data.values.setdefault((code, i), {})[name] = value


def _batches(items: list[str], size: int) -> list[list[str]]:
    return [items[k:k + size] for k in range(0, len(items), size)]


def _regex(values: list[str]) -> str:
    """An RE2 alternation matching exactly ``values`` (Prometheus anchors regex matchers)."""
    special = set("\\.+*?()|[]{}^$")
    return "|".join("".join("\\" + c if c in special else c for c in v) for v in values)
