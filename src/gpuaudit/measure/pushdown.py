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
:func:`to_usage` builds the same :class:`~gpuaudit.classify.Usage` the local engine builds.

Semantics against the local engine (``gpuaudit.classify.phases``): a sample stands for one
step here; locally it stands until the next sample, capped at 3 intervals. On regular
scrapes the two agree exactly (local with ``cap_intervals=1`` agrees on gaps too); across a
gap local credits up to 2 more intervals of observed time. The longest idle stretch is not
computable in PromQL; the mean idle run is reported as its lower bound.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa

from gpuaudit.classify.patterns import detect_patterns
from gpuaudit.classify.phases import group_key_names
from gpuaudit.classify.usage import CELL_VALUE_COLUMNS, SeriesSignals, Usage
from gpuaudit.errors import InputError
from gpuaudit.measure.dcgm import SeriesId, series_id
from gpuaudit.measure.prometheus import PromClient, duration, fresh, selector, time_chunks
from gpuaudit.schema import ImportNote

__all__ = ["PushdownData", "build_queries", "pull_aggregates", "to_usage"]

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
_MAX_FIELDS = frozenset({"temp_c", "mem_used_mib", "xid", "mem_total_mib"})


def build_queries(sel: str, step_s: float, range_s: float, *, shared: bool, has_sm: bool,
                  ) -> dict[str, str]:
    """The PromQL of one chunk: name -> expression, evaluated at the chunk's last step.

    ``sel`` is a matcher list (``{namespace="x"}``, already escaped; see
    :func:`gpuaudit.measure.prometheus.selector`). ``range_s`` is the chunk length
    (points ``end - range_s + step .. end``).
    """
    s = duration(step_s)
    r = duration(range_s - 0.001)
    w = duration(step_s - 0.001)

    def f(metric: str, off: bool = False) -> str:
        if not off:
            return fresh(f"{metric}{sel}", step_s)
        return f"last_over_time({metric}{sel}[{w}] offset {s})"

    u = f"({f(_UTIL)} or 100 * {f(_GR)})"
    u_off = f"({f(_UTIL, True)} or 100 * {f(_GR, True)})"
    weight = f"(({u} * 0 + 1) / on({_GPU_KEY}) group_left() count by ({_GPU_KEY}) ({u}))"

    def wsum(x: str) -> str:
        inner = f"({x}) * {weight}" if shared else x
        return f"sum_over_time(({inner})[{r}:{s}])"

    def sub(agg: str, x: str) -> str:
        return f"{agg}(({x})[{r}:{s}])"

    q: dict[str, str] = {
        "idle": wsum(f"{u} < bool 10"),
        "under": wsum(f"({u} >= bool 10) * ({u} < bool 70)"),
        "prod": wsum(f"({u} >= bool 70) * ({u} < bool 90)"),
        "cb": wsum(f"{u} >= bool 90"),
        "busy": wsum(u),
        "unused": wsum(f"(100 - {u}) * ({u} >= bool 10) * ({u} < bool 70)"),
        "headroom": wsum(f"(100 - {u}) * ({u} >= bool 70)"),
        "n": sub("count_over_time", u),
        "u2": sub("sum_over_time", f"{u} ^ 2"),
        "runs": sub("sum_over_time",
                    f"clamp_min(({u} < bool 10) - (({u_off} < bool 10) or ({u} * 0)), 0)"),
        "absstep": sub("sum_over_time", f"abs({u} - {u_off})"),
        "steps": sub("count_over_time", f"{u} - {u_off}"),
        "first": sub("min_over_time", f"timestamp({u})"),
        "last": sub("max_over_time", f"timestamp({u})"),
    }
    if has_sm:
        smu = f"(100 * {f(_SM)})"
        q["sm_idle"] = wsum(f"{smu} < bool 10")
        q["sm_under"] = wsum(f"({smu} >= bool 10) * ({smu} < bool 70)")
        q["sm_prod"] = wsum(f"({smu} >= bool 70) * ({smu} < bool 90)")
        q["sm_cb"] = wsum(f"{smu} >= bool 90")
        q["sm_busy"] = wsum(smu)
    rr = duration(range_s)
    for name, metric in _MEANS.items():
        q[f"sum_{name}"] = f"sum_over_time({metric}{sel}[{rr}])"
        q[f"cnt_{name}"] = f"count_over_time({metric}{sel}[{rr}])"
    q["std_power"] = f"stddev_over_time(DCGM_FI_DEV_POWER_USAGE{sel}[{rr}])"
    for name, metric in _MAXES.items():
        q[name] = f"max_over_time({metric}{sel}[{rr}])"
    for name, metric in _DELTAS.items():
        q[name] = f"max_over_time({metric}{sel}[{rr}]) - min_over_time({metric}{sel}[{rr}])"
    fb = [f("DCGM_FI_DEV_FB_FREE"), f("DCGM_FI_DEV_FB_USED")]
    reserved = f"({f('DCGM_FI_DEV_FB_RESERVED')} or {fb[0]} * 0)"
    q["mem_total_mib"] = f"max_over_time(({fb[0]} + {fb[1]} + {reserved})[{r}:1h])"
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
    whole = duration(end_s - start_s + step_s - 0.001)
    u_all = f"({fresh(_UTIL + sel, step_s)} or 100 * {fresh(_GR + sel, step_s)})"
    shared_q = (f"max(max_over_time((count by ({_GPU_KEY}) ({u_all}))"
                f"[{whole}:{duration(step_s)}]))")
    sm_q = f"count(count_over_time({_SM}{sel}[{duration(end_s - start_s + step_s)}]))"
    shared_v = client.query(shared_q, float(end_s))
    shared = bool(shared_v) and shared_v[0][1] > 1
    has_sm = bool(client.query(sm_q, float(end_s)))
    data = PushdownData(ids=[], chunks=[], step_s=step_s, values={},
                        origin=f"Prometheus {client.url} (PromQL pushdown, step {step_s:g} s)",
                        has_sm=has_sm, shared=shared)
    id_index: dict[SeriesId, int] = {}
    jobs: list[tuple[int, float, float]] = [(i, a, b) for i, (a, b) in enumerate(chunks)]
    data.chunks = list(chunks)
    nq = len(build_queries(sel, step_s, step_s, shared=shared, has_sm=has_sm))
    advance = client.progress("pushdown", len(jobs) * nq) if client.progress else None

    def run(job: tuple[int, float, float]) -> tuple[int, dict[str, list[tuple[dict[str, str],
                                                                             float]]]]:
        i, a, b = job
        qs = build_queries(sel, step_s, b - a + step_s, shared=shared, has_sm=has_sm)
        out = {}
        for name, expr in qs.items():
            out[name] = client.query(expr, b)
            if advance:
                advance(1)
        return i, out

    with cf.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for i, answers in pool.map(run, jobs):
            for name, rows in answers.items():
                for labels, value in rows:
                    sid = series_id(labels, default_host="unknown",
                                    where=f"{client.url}: pushdown {name}")
                    code = id_index.get(sid)
                    if code is None:
                        code = id_index[sid] = len(data.ids)
                        data.ids.append(sid)
                    if value == value:  # NaN: nothing measured
                        data.values.setdefault((code, i), {})[name] = value
            data.queries += len(answers)
    for label, secs in (("1h", 3600.0), ("24h", 86400.0)):
        span = min(secs, end_s - start_s + step_s)
        rng = f"[{duration(span - 0.001)}:{duration(step_s)}]"
        res = client.query(f"sum(sum_over_time({u_all}{rng})) / sum(count_over_time({u_all}"
                           f"{rng}))", float(end_s))
        data.fleet_util_pct[label] = res[0][1] if res and res[0][1] == res[0][1] else None
        data.queries += 1
    data.queries += 2
    return data


def _phase_values(v: Mapping[str, float], step_s: float) -> dict[str, float]:
    """PhaseTime fields of one series-chunk from its query answers."""
    s = step_s
    get = v.get
    out = {
        "idle_s": get("idle", 0.0) * s,
        "underutilized_s": get("under", 0.0) * s,
        "productive_s": get("prod", 0.0) * s,
        "compute_bound_s": get("cb", 0.0) * s,
        "underutilized_unused_s": get("unused", 0.0) * s / 100.0,
        "headroom_s": get("headroom", 0.0) * s / 100.0,
        "busy_s": get("busy", 0.0) * s / 100.0,
        "samples": float(get("n", 0.0)),
        "no_reading_s": 0.0,
        "sm_idle_s": get("sm_idle", 0.0) * s,
        "sm_underutilized_s": get("sm_under", 0.0) * s,
        "sm_productive_s": get("sm_prod", 0.0) * s,
        "sm_compute_bound_s": get("sm_cb", 0.0) * s,
        "sm_busy_s": get("sm_busy", 0.0) * s / 100.0,
    }
    out["gap_s"] = 0.0  # set per GPU in to_usage
    return out


def to_usage(
    data: PushdownData,
    *,
    by: Sequence[str] = (),
    labels_for: Callable[[SeriesId], Mapping[str, str]] | None = None,
) -> tuple[Usage, pa.Table]:
    """The :class:`Usage` of the whole range (cells per GPU and group, as local classify
    builds), and a per-chunk cells table (column ``day_start``: the chunk's start, UTC) for
    daily figures. ``labels_for`` gives a series' label map (attribution: team, project ...)
    for label group keys."""
    keys = group_key_names(by)
    s = data.step_s

    def group_of(sid: SeriesId) -> tuple[str | None, ...]:
        labels = labels_for(sid) if labels_for else dict(sid.labels)
        out: list[str | None] = []
        for k in keys:
            out.append(labels.get(k[6:]) if k.startswith("label:") else getattr(sid, k))
        return tuple(out)

    groups = [group_of(sid) for sid in data.ids]
    cell_rows: dict[tuple[str, tuple[str | None, ...]], np.ndarray] = {}
    day_rows: dict[tuple[int, str, tuple[str | None, ...]], np.ndarray] = {}
    meta: dict[str, SeriesId] = {}
    ncol = len(CELL_VALUE_COLUMNS)
    per_gpu: dict[str, dict[str, Any]] = {}
    for (code, chunk), v in sorted(data.values.items()):
        sid = data.ids[code]
        if "n" not in v and "idle" not in v:
            continue  # a series with no utilization readings (signals only)
        pv = _phase_values(v, s)
        vec = np.array([pv[c] for c in CELL_VALUE_COLUMNS])
        key = (sid.gpu_uuid, groups[code])
        meta.setdefault(sid.gpu_uuid, sid)
        cell_rows[key] = cell_rows.get(key, np.zeros(ncol)) + vec
        dkey = (chunk, sid.gpu_uuid, groups[code])
        day_rows[dkey] = day_rows.get(dkey, np.zeros(ncol)) + vec
        g = per_gpu.setdefault(sid.gpu_uuid, {"first": np.inf, "last": -np.inf,
                                              "pods": set(), "sig": {}, "max": {}})
        g["first"] = min(g["first"], v.get("first", np.inf))
        g["last"] = max(g["last"], v.get("last", -np.inf))
        if sid.pod:
            g["pods"].add(sid.pod)
        for name, x in v.items():
            if name in _MAX_FIELDS:
                g["max"][name] = max(g["max"].get(name, -np.inf), x)
            elif name not in ("first", "last"):
                g["sig"][name] = g["sig"].get(name, 0.0) + x
        cnt_p = v.get("cnt_power", 0.0)
        if cnt_p > 0 and "std_power" in v:
            mean_p = v.get("sum_power", 0.0) / cnt_p
            g["sig"]["sumsq_power"] = g["sig"].get("sumsq_power", 0.0) + cnt_p * (
                v["std_power"] ** 2 + mean_p**2)
        g["sig"]["observed_s"] = g["sig"].get("observed_s", 0.0) + (
            pv["idle_s"] + pv["underutilized_s"] + pv["productive_s"] + pv["compute_bound_s"])
        g["sig"]["busy_s"] = g["sig"].get("busy_s", 0.0) + pv["busy_s"]
        g["sig"]["idle_s"] = g["sig"].get("idle_s", 0.0) + pv["idle_s"]
        g["sig"]["high_s"] = g["sig"].get("high_s", 0.0) + pv["productive_s"] + \
            pv["compute_bound_s"]
    _spread_gaps(cell_rows, {u: (g["first"], g["last"]) for u, g in per_gpu.items()}, s)
    for i in range(len(data.chunks)):
        spans: dict[str, tuple[float, float]] = {}
        for (code, chunk), v in data.values.items():
            if chunk != i or "first" not in v:
                continue
            uuid = data.ids[code].gpu_uuid
            a, b = spans.get(uuid, (np.inf, -np.inf))
            spans[uuid] = (min(a, v["first"]), max(b, v["last"]))
        day_i = {(k[1], k[2]): vec for k, vec in day_rows.items() if k[0] == i}
        _spread_gaps(day_i, spans, s)
    cells = _cells_table([(k[0], k[1], v) for k, v in cell_rows.items()], keys, meta)
    day_cells = _cells_table([(k[1], k[2], v) for k, v in day_rows.items()], keys, meta,
                             days=[data.chunks[k[0]][0] for k in day_rows])
    series = tuple(_signals(uuid, meta[uuid], g, s) for uuid, g in per_gpu.items())
    t0 = min((g["first"] for g in per_gpu.values()), default=None)
    t1 = max((g["last"] for g in per_gpu.values()), default=None)
    usage = Usage(
        cells=cells, by=keys, series=series, patterns=detect_patterns(series, s),
        window_start=_dt(t0), window_end=_dt(t1 + s if t1 is not None else None),
        interval_s=s, cap_s=s, source="prometheus-pushdown", origin=data.origin,
        notes=tuple(data.notes),
    )
    return usage, day_cells


_OBS = [CELL_VALUE_COLUMNS.index(c) for c in ("idle_s", "underutilized_s", "productive_s",
                                              "compute_bound_s")]
_GAP = CELL_VALUE_COLUMNS.index("gap_s")


def _spread_gaps(rows: Mapping[tuple[str, tuple[str | None, ...]], np.ndarray],
                 spans: Mapping[str, tuple[float, float]], step_s: float) -> None:
    """Unobserved time of each GPU (its span, first to last point plus a step, less the
    observed time of all its series), shared among its cells by their observed time (in
    place). Local classify gives a gap to the sample before it; PromQL cannot say which."""
    by_gpu: dict[str, list[np.ndarray]] = {}
    for (uuid, _g), vec in rows.items():
        by_gpu.setdefault(uuid, []).append(vec)
    for uuid, vecs in by_gpu.items():
        if uuid not in spans:
            continue
        first, last = spans[uuid]
        obs = np.array([v[_OBS].sum() for v in vecs])
        gap = max(0.0, last - first + step_s - float(obs.sum()))
        if gap <= 1e-6:
            continue
        weights = obs / obs.sum() if obs.sum() > 0 else np.full(len(vecs), 1.0 / len(vecs))
        for v, w in zip(vecs, weights):
            v[_GAP] += gap * w


def _dt(t: float | None) -> datetime | None:
    if t is None or not np.isfinite(t):
        return None
    return datetime.fromtimestamp(t, tz=timezone.utc)


def _cells_table(rows: list[tuple[str, tuple[str | None, ...], np.ndarray]],
                 keys: tuple[str, ...], meta: Mapping[str, SeriesId],
                 days: list[float] | None = None) -> pa.Table:
    cols: dict[str, pa.Array] = {}
    if days is not None:
        cols["day_start"] = pa.array(np.array(days) * 1e9, type=pa.int64()).cast(
            pa.timestamp("ns", tz="UTC"))
    cols["gpu_uuid"] = pa.array([r[0] for r in rows], type=pa.string())
    cols["host"] = pa.array([meta[r[0]].host for r in rows], type=pa.string())
    cols["gpu_model"] = pa.array([meta[r[0]].gpu_model for r in rows], type=pa.string())
    for j, k in enumerate(keys):
        cols[k] = pa.array([r[1][j] for r in rows], type=pa.string())
    mat = np.array([r[2] for r in rows]).reshape(len(rows), len(CELL_VALUE_COLUMNS))
    for j, c in enumerate(CELL_VALUE_COLUMNS):
        col = mat[:, j]
        cols[c] = pa.array(np.round(col).astype(np.int64) if c == "samples" else col)
    return pa.table(cols)


def _signals(uuid: str, sid: SeriesId, g: Mapping[str, Any], step_s: float) -> SeriesSignals:
    sig: Mapping[str, float] = g["sig"]
    mx: Mapping[str, float] = g["max"]
    obs = sig.get("observed_s", 0.0)
    n = sig.get("n", 0.0)
    mean_u = 100.0 * sig.get("busy_s", 0.0) / obs if obs > 0 else None
    std_u = None
    if n > 0 and mean_u is not None:
        std_u = float(np.sqrt(max(sig.get("u2", 0.0) / n - mean_u**2, 0.0)))

    def mean(name: str) -> float | None:
        c = sig.get(f"cnt_{name}", 0.0)
        return sig.get(f"sum_{name}", 0.0) / c if c > 0 else None

    pcie = [mean("pcie_tx"), mean("pcie_rx")]
    p_mean = mean("power")
    p_std = None
    if p_mean is not None and "sumsq_power" in sig:
        p_std = float(np.sqrt(max(sig["sumsq_power"] / sig["cnt_power"] - p_mean**2, 0.0)))
    runs = sig.get("runs", 0.0)
    idle_s = sig.get("idle_s", 0.0)
    steps = sig.get("steps", 0.0)
    energy = sig.get("energy_mj")
    xid = mx.get("xid")

    def m(name: str) -> float | None:
        x = mx.get(name)
        return None if x is None or not np.isfinite(x) else float(x)

    return SeriesSignals(
        gpu_uuid=uuid, host=sid.host, gpu_model=sid.gpu_model, mig_profile=sid.mig_profile,
        samples=int(n), observed_s=obs, mean_util_pct=mean_u, std_util_pct=std_u,
        mean_abs_step_pct=sig.get("absstep", 0.0) / steps if steps > 0 else None,
        idle_runs=round(runs), idle_s=idle_s,
        busy_high_s=sig.get("high_s", 0.0),
        max_idle_run_s=idle_s / runs if runs > 0 else 0.0,
        mean_sm_active=mean("sm_active"), mean_sm_occupancy=mean("sm_occupancy"),
        mean_tensor_active=mean("tensor_active"), mean_dram_active=mean("dram_active"),
        mean_pcie_bytes_per_s=None if pcie[0] is None and pcie[1] is None else
        (pcie[0] or 0.0) + (pcie[1] or 0.0),
        mean_power_w=p_mean, std_power_w=p_std,
        max_temp_c=m("temp_c"), mem_used_max_mib=m("mem_used_mib"),
        mem_total_mib=m("mem_total_mib"),
        energy_j=energy / 1000.0 if energy is not None else None,
        ecc_dbe_delta=int(sig["ecc"]) if "ecc" in sig else None,
        xid_codes=(int(xid),) if xid is not None and xid > 0 else (),
        pods=tuple(sorted(g["pods"])),
    )
