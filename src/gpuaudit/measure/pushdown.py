"""Pushdown: the phase classification runs inside Prometheus as PromQL; only per-series sums
cross the wire, never raw samples.

For every chunk of the range (one day by default) and every dcgm-exporter series (one per GPU,
MIG instance, or GPU x pod when time-sliced), instant queries at the chunk's end compute,
over a subquery at the scrape step ``s`` whose points are exactly the chunk's steps:

- ``U`` = ``last_over_time(DCGM_FI_DEV_GPU_UTIL{sel}[s-1ms]) or 100 *
  last_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{sel}[s-1ms])`` (MIG has no GPU_UTIL), a
  sample seen once per step (see :func:`gpuaudit.measure.prometheus.fresh`);
- phase seconds: ``sum_over_time(((U >= bool 10) * (U < bool 70))[R:s]) * s`` and the like,
  weighted by ``1 / count by (UUID, uuid, GPU_I_ID) (U)`` when a GPU is time-sliced between
  pods (only when the store shows sharing), so a shared GPU is split, not billed twice;
- effective seconds ``sum_over_time(U[R:s]) * s / 100``, the unused share of underutilized
  time and the headroom of busy time the same way, the SM view on
  ``DCGM_FI_PROF_SM_ACTIVE``;
- per series for patterns: point count, sum of squares (std), idle-run starts
  (``(U < bool 10) - (U offset s < bool 10)``), mean absolute change, first/last point
  (``timestamp``), and raw ``sum_over_time``/``count_over_time``/``max_over_time`` of power,
  temperature, framebuffer, tensor/DRAM/SM activity, PCIe, energy (max - min, mJ), ECC, XID.

Chunks are evaluated separately and summed (every figure is a sum or a max), so a month of a
1,000-GPU fleet is ~40 queries per day of range, each answering one number per series.
:func:`gpuaudit.classify.pushdown.usage_from_pushdown` builds from them the same
:class:`~gpuaudit.classify.Usage` the local engine builds (it lives in the price stage
because measure may not import classify).

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
from gpuaudit.measure.prometheus import PromClient, duration, fresh, selector, time_chunks
from gpuaudit.schema import ImportNote

__all__ = ["MAX_FIELDS", "PushdownData", "build_queries", "pull_aggregates"]

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


def build_queries(sel: str, step_s: float, range_s: float, *, shared: bool, has_sm: bool,
                  family: str = "util", signals: bool = True) -> dict[str, str]:
    """The PromQL of one chunk: name -> expression, evaluated at the chunk's last step.

    ``sel`` is a matcher list (``{namespace="x"}``, already escaped; see
    :func:`gpuaudit.measure.prometheus.selector`). ``range_s`` is the chunk length
    (points ``end - range_s + step .. end``). ``family``: ``util`` reads
    ``DCGM_FI_DEV_GPU_UTIL``; ``mig`` reads ``100 * DCGM_FI_PROF_GR_ENGINE_ACTIVE`` of MIG
    instances (``GPU_I_ID!=""``), which report no GPU_UTIL. Only scalar comparisons and
    functions run per step (no vector matching, which costs a hash per series per step),
    except the share weight of time-sliced GPUs, one query when the store shows sharing.
    """
    s = duration(step_s)
    r = duration(range_s - 0.001)
    w2 = duration(2 * step_s - 0.001)
    if family == "mig":
        msel = _with(sel, 'GPU_I_ID!=""')
        u = f"(100 * {fresh(_GR + msel, step_s)})"
        step_change = f"abs(100 * idelta({_GR}{msel}[{w2}]))"
    else:
        u = fresh(_UTIL + sel, step_s)
        step_change = f"abs(idelta({_UTIL}{sel}[{w2}]))"

    def sub(agg: str, x: str) -> str:
        return f"{agg}(({x})[{r}:{s}])"

    q: dict[str, str] = {
        "idle": sub("count_over_time", f"{u} < 10"),
        "under": sub("count_over_time", f"{u} >= 10 < 70"),
        "prod": sub("count_over_time", f"{u} >= 70 < 90"),
        "cb": sub("count_over_time", f"{u} >= 90"),
        "busy": sub("sum_over_time", u),
        "unused": sub("sum_over_time", f"100 - ({u} >= 10 < 70)"),
        "headroom": sub("sum_over_time", f"100 - ({u} >= 70)"),
        "n": sub("count_over_time", u),
        "u2": sub("sum_over_time", f"{u} ^ 2"),
        "changes": f"changes(({u} < bool 10)[{r}:{s}])",
        "absstep": sub("sum_over_time", step_change),
        "first": sub("min_over_time", f"timestamp({u})"),
        "last": sub("max_over_time", f"timestamp({u})"),
    }
    if shared:
        key = f"count by ({_GPU_KEY}) ({u})"
        q["wsum"] = sub("sum_over_time",
                        f"({u} * 0 + 1) / on({_GPU_KEY}) group_left() {key}")
    if has_sm and family == "util":
        smu = f"(100 * {fresh(_SM + sel, step_s)})"
        q["sm_idle"] = sub("count_over_time", f"{smu} < 10")
        q["sm_under"] = sub("count_over_time", f"{smu} >= 10 < 70")
        q["sm_prod"] = sub("count_over_time", f"{smu} >= 70 < 90")
        q["sm_cb"] = sub("count_over_time", f"{smu} >= 90")
        q["sm_busy"] = sub("sum_over_time", smu)
    if not signals:
        return q
    rr = duration(range_s)
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
    """Run the pushdown queries chunk by chunk (step-aligned, ``chunk_s`` long) and collect
    the answers. A chunk the server refuses as too big is split in two and retried."""
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
        # more than one series per GPU in the range: pods changed or the GPU is time-sliced
        "shared": f"max(count by ({_GPU_KEY}) (last_over_time({_UTIL}{sel}[{whole}]) or "
                  f"last_over_time({_GR}{mig_sel}[{whole}])))",
        "sm": f"count(last_over_time({_SM}{sel}[{whole}]))",
        "mig": f"count(last_over_time({_GR}{mig_sel}[{whole}]))",
    }
    found = {k: client.query(q, float(end_s)) for k, q in probes.items()}
    shared = bool(found["shared"]) and found["shared"][0][1] > 1
    has_sm = bool(found["sm"])
    families = ["util", "mig"] if found["mig"] else ["util"]
    data = PushdownData(ids=[], chunks=[], step_s=step_s, values={},
                        origin=f"Prometheus {client.url} (PromQL pushdown, step {step_s:g} s)",
                        has_sm=has_sm, shared=shared)
    id_index: dict[SeriesId, int] = {}
    data.chunks = list(chunks)
    jobs: list[tuple[int, float, float, str, str]] = []
    for i, (a, b) in enumerate(chunks):
        for fam in families:
            qs = build_queries(sel, step_s, b - a + step_s, shared=shared, has_sm=has_sm,
                               family=fam, signals=fam == "util")
            jobs += [(i, a, b, name, expr) for name, expr in qs.items()]
    advance = client.progress("pushdown", len(jobs)) if client.progress else None

    def run(job: tuple[int, float, float, str, str]) -> tuple[int, str,
                                                             list[tuple[dict[str, str], float]]]:
        i, _a, b, name, expr = job
        rows = client.query(expr, b)
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
                if value == value:  # NaN: nothing measured
                    data.values.setdefault((code, i), {})[name] = value
    data.queries = len(jobs) + len(probes)
    for label, secs in (("1h", 3600.0), ("24h", 86400.0)):
        span = min(secs, end_s - start_s + step_s)
        rng = f"[{duration(span - 0.001)}:{duration(step_s)}]"
        total = count = 0.0
        for fam in families:
            u = f"(100 * {fresh(_GR + mig_sel, step_s)})" if fam == "mig" else \
                fresh(_UTIL + sel, step_s)
            for agg in ("sum_over_time", "count_over_time"):
                res = client.query(f"sum({agg}({u}{rng}))", float(end_s))
                data.queries += 1
                if res and res[0][1] == res[0][1]:
                    if agg == "sum_over_time":
                        total += res[0][1]
                    else:
                        count += res[0][1]
        data.fleet_util_pct[label] = total / count if count > 0 else None
    return data
