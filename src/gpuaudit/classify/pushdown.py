"""Pushdown answers -> :class:`~gpuaudit.classify.usage.Usage`.

The phase classification already ran inside the Prometheus-compatible store as PromQL
(:mod:`gpuaudit.measure.pushdown` generates the queries and collects the per-series,
per-chunk answers); this module turns those answers into the same ``Usage`` that local
:func:`gpuaudit.classify.classify` builds, so pricing, recommendations and reports apply
unchanged. Limits of the pushdown view are in docs/fleet.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa

from gpuaudit.classify.patterns import detect_patterns, job_patterns
from gpuaudit.classify.phases import group_key_names
from gpuaudit.classify.usage import CELL_VALUE_COLUMNS, SeriesSignals, Usage
from gpuaudit.measure.dcgm import SeriesId
from gpuaudit.measure.pushdown import MAX_FIELDS, PushdownData

__all__ = ["usage_from_pushdown"]


def _phase_values(v: Mapping[str, float], step_s: float) -> dict[str, float]:
    """PhaseTime fields of one series-chunk from its pushdown answers. A time-sliced GPU's
    series is weighted by its mean share over the chunk (``wsum / n``: exact when the pods
    sharing it overlap for the whole chunk)."""
    s = step_s
    get = v.get
    n = get("n", 0.0)
    share = get("wsum", n) / n if n > 0 else 1.0
    k = s * share
    out = {
        "idle_s": get("idle", 0.0) * k,
        "underutilized_s": get("under", 0.0) * k,
        "productive_s": get("prod", 0.0) * k,
        "compute_bound_s": get("cb", 0.0) * k,
        "underutilized_unused_s": get("unused", 0.0) * k / 100.0,
        "headroom_s": get("headroom", 0.0) * k / 100.0,
        "busy_s": get("busy", 0.0) * k / 100.0,
        "samples": float(n),
        "no_reading_s": 0.0,
        "sm_idle_s": get("sm_idle", 0.0) * k,
        "sm_underutilized_s": get("sm_under", 0.0) * k,
        "sm_productive_s": get("sm_prod", 0.0) * k,
        "sm_compute_bound_s": get("sm_cb", 0.0) * k,
        "sm_busy_s": get("sm_busy", 0.0) * k / 100.0,
    }
    out["gap_s"] = 0.0  # set per GPU in to_usage
    return out


def usage_from_pushdown(
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
            if name in MAX_FIELDS:
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
    patterns = detect_patterns(series, s)
    usage = Usage(
        cells=cells, by=keys, series=series, patterns=patterns,
        job_patterns=job_patterns(series, patterns),
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
    # idle runs: at least as many as there are (measure.pushdown.decode), so the mean idle
    # run below is a lower bound of the longest
    runs = max(sig.get("runs", 0.0), 1.0) if sig.get("idle_s", 0.0) > 0 else 0.0
    idle_s = sig.get("idle_s", 0.0)
    steps = sig.get("n", 0.0)
    energy = sig.get("energy_mj")
    xid = mx.get("xid")

    def m(name: str) -> float | None:
        x = mx.get(name)
        return None if x is None or not np.isfinite(x) else float(x)

    return SeriesSignals(
        gpu_uuid=uuid, host=sid.host, gpu_model=sid.gpu_model, mig_profile=sid.mig_profile,
        samples=int(n), observed_s=obs, mean_util_pct=mean_u, std_util_pct=std_u,
        mean_abs_step_pct=sig.get("absstep", 0.0) / steps if steps > 0 else None,  # per point
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
