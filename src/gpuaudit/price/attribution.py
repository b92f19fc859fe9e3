"""Attribution: who pays for each GPU-second, from labels, a mapping file and pod labels.

Resolution, per (namespace, pod, labels) of a series or sample row, for each of ``team``,
``project`` and ``user``:

1. the tagging policy's pod labels ``team-id`` / ``project-id`` / ``user-id`` (also written
   ``team_id``, or ``team``), from the series' own labels or from kube-state-metrics
   ``kube_pod_labels`` (``label_team_id`` ...) joined on (namespace, pod);
2. the mapping file's ``[label.<key>]`` table (a label value -> team/project);
3. the mapping file's ``[namespace.<ns>]`` table;
4. otherwise ``unattributed``.

A GPU no pod holds (``pod`` null) is ``unallocated`` for every key: its cost is its own line,
never spread over the teams. A time-sliced GPU is split by ``gpu_share`` upstream, so each
pod pays its share once. Mapping file (TOML)::

    [namespace.team-vision]
    team = "vision"
    project = "perception"

    [label.cost_center]          # a pod label's value -> attribution
    "cc-42" = { team = "nlp" }

Rollups (:func:`fleet_summary`) sum priced cells by any keys and produce the plain-dict fleet
section (showback, worst pods, KPIs, histograms) that every renderer reads from
``AuditResult.extra["fleet"]``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuaudit.classify.patterns import detect_patterns
from gpuaudit.classify.phases import group_key_names
from gpuaudit.classify.usage import CELL_VALUE_COLUMNS, PHASES, PhaseTime, SeriesSignals, Usage
from gpuaudit.errors import InputError
from gpuaudit.measure.dcgm import SeriesId
from gpuaudit.measure.pushdown import MAX_FIELDS, PushdownData
from gpuaudit.price.catalog import Rate
from gpuaudit.price.money import SECONDS_PER_HOUR, dec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "ATTRIBUTION_KEYS",
    "UNALLOCATED",
    "UNATTRIBUTED",
    "Attributor",
    "MappingFile",
    "attribute_table",
    "fleet_summary",
    "load_mapping",
    "usage_from_pushdown",
]

ATTRIBUTION_KEYS: tuple[str, ...] = ("team", "project", "user")
UNALLOCATED = "unallocated"
UNATTRIBUTED = "unattributed"
#: histogram bins (percent), the phase edges
HIST_EDGES: tuple[str, ...] = ("0-10", "10-70", "70-90", "90-100")


@dataclass(frozen=True)
class MappingFile:
    """A parsed mapping file: namespace -> attribution, label key -> value -> attribution."""

    namespaces: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    labels: Mapping[str, Mapping[str, Mapping[str, str]]] = field(default_factory=dict)
    path: str | None = None


def _norm_entry(v: Any, where: str) -> dict[str, str]:
    if isinstance(v, str):
        return {"team": v}
    if isinstance(v, Mapping):
        bad = [k for k in v if not isinstance(v[k], str)]
        if bad:
            raise InputError(f"value of {bad[0]!r} is not a string", where=where,
                             fix='write team = "name"')
        return {str(k): str(x) for k, x in v.items()}
    raise InputError(f"expected a team name or a table, got {v!r}", where=where,
                     fix='write "<value>" = "team" or "<value>" = { team = "t", project = "p" }')


def load_mapping(path: str | Path) -> MappingFile:
    """Read a mapping file (TOML, see the module doc). Errors name the file and the key."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read mapping file: {exc.strerror or exc}", where=str(p),
                         fix="give an existing TOML file (--map-file)") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", where=str(p),
                         fix="see docs/fleet.md for the mapping file format") from exc
    unknown = sorted(set(doc) - {"namespace", "label"})
    if unknown:
        raise InputError(f"unknown section [{unknown[0]}]", where=str(p),
                         fix="use [namespace.<name>] and [label.<key>] sections")
    ns = {str(k): _norm_entry(v, f"{p}: [namespace.{k}]")
          for k, v in doc.get("namespace", {}).items()}
    labels = {str(k): {str(val): _norm_entry(e, f"{p}: [label.{k}] {val!r}")
                       for val, e in tbl.items()}
              for k, tbl in doc.get("label", {}).items()}
    return MappingFile(namespaces=ns, labels=labels, path=str(p))


def _policy_value(labels: Mapping[str, str], key: str) -> str | None:
    for name in (f"{key}-id", f"{key}_id", f"label_{key}_id", key, f"label_{key}"):
        v = labels.get(name)
        if v:
            return v
    return None


@dataclass
class Attributor:
    """Resolves who pays (see the module doc). ``pod_labels`` maps (namespace, pod) to the
    pod's Kubernetes labels (from ``kube_pod_labels``, ``label_`` prefix removed)."""

    mapping: MappingFile | None = None
    pod_labels: Mapping[tuple[str, str], Mapping[str, str]] = field(default_factory=dict)

    def resolve(self, namespace: str | None, pod: str | None,
                labels: Mapping[str, str]) -> dict[str, str]:
        """The row's labels with team, project and user set (and the pod's own labels)."""
        out = dict(labels)
        if pod is None:
            for k in ATTRIBUTION_KEYS:
                out[k] = UNALLOCATED
            return out
        kube = self.pod_labels.get((namespace or "", pod), {})
        merged = {**kube, **labels}
        for k, v in kube.items():
            out.setdefault(k, v)
        for key in ATTRIBUTION_KEYS:
            value = _policy_value(merged, key)
            if value is None and self.mapping is not None:
                for lkey, table in self.mapping.labels.items():
                    lv = merged.get(lkey)
                    if lv is not None and lv in table and key in table[lv]:
                        value = table[lv][key]
                        break
                if value is None and namespace is not None and \
                        namespace in self.mapping.namespaces:
                    value = self.mapping.namespaces[namespace].get(key)
            out[key] = value or UNATTRIBUTED
        return out


def attribute_table(table: pa.Table, attributor: Attributor) -> pa.Table:
    """The sample table with ``team``/``project``/``user`` (and joined pod labels) in its
    ``labels`` map. Resolved once per distinct (namespace, pod, labels), not per row."""
    if table.num_rows == 0:
        return table
    ns = table.column("namespace").cast(pa.string())
    pod = table.column("pod").cast(pa.string())
    labels = table.column("labels").combine_chunks()
    key = pc.binary_join_element_wise(pc.fill_null(ns, ""), pc.fill_null(pod, "\x00"),
                                      _map_text(labels), "\x1f")
    enc = pc.dictionary_encode(key).combine_chunks()
    idx = enc.indices.to_numpy(zero_copy_only=False)
    first = np.zeros(len(enc.dictionary), dtype=np.int64)
    first[idx[::-1]] = np.arange(idx.shape[0])[::-1]
    ns_l, pod_l, lab_l = (ns.take(pa.array(first)).to_pylist(),
                          pod.take(pa.array(first)).to_pylist(),
                          labels.take(pa.array(first)).to_pylist())
    resolved = [list(attributor.resolve(n, p, dict(lb or [])).items())
                for n, p, lb in zip(ns_l, pod_l, lab_l)]
    new = pa.array(resolved, type=pa.map_(pa.string(), pa.string())).take(pa.array(idx))
    i = table.schema.get_field_index("labels")
    return table.set_column(i, table.schema.field(i), new)


def _map_text(arr: pa.Array) -> pa.Array:
    """Each map of a map<string,string> array as one string (``k=v`` joined), columnar."""
    if len(arr) == 0 or arr.null_count == len(arr):
        return pa.array([""] * len(arr), pa.string())
    entries = pc.binary_join_element_wise(arr.keys, pc.fill_null(arr.items, ""), "\x1d")
    lists = pa.ListArray.from_arrays(arr.offsets, entries)
    return pc.fill_null(pc.binary_join(lists, "\x1c"), "")


# -- rollups -------------------------------------------------------------------------------
def _pt(row: Mapping[str, Any]) -> PhaseTime:
    vals: dict[str, Any] = {c: (int(row[c]) if c == "samples" else float(row[c]))
                            for c in CELL_VALUE_COLUMNS}
    return PhaseTime(**vals)


@dataclass
class _Line:
    time: PhaseTime = field(default_factory=PhaseTime)
    cost: Decimal = Decimal(0)
    waste: Decimal = Decimal(0)

    def add(self, t: PhaseTime, rate: Rate) -> None:
        per_s = rate.usd_per_gpu_hour / SECONDS_PER_HOUR
        self.time = self.time + t
        self.cost += dec(t.total_s) * per_s
        self.waste += (dec(t.idle_s) + dec(t.underutilized_unused_s)) * per_s

    def to_dict(self) -> dict[str, Any]:
        t = self.time
        hours = t.total_s / 3600.0
        return {
            "gpu_hours": round(hours, 4),
            "effective_gpu_hours": round(t.busy_s / 3600.0, 4),
            "observed_hours": round(t.observed_s / 3600.0, 4),
            "unobserved_hours": round(t.unobserved_s / 3600.0, 4),
            "phase_hours": {p: round(getattr(t, f"{p}_s") / 3600.0, 4) for p in PHASES},
            "phase_pct": t.phase_shares_pct(),
            "mean_util_pct": None if t.mean_util_pct is None else round(t.mean_util_pct, 2),
            "cost_usd": str(self.cost.quantize(Decimal("0.01"))),
            "waste_usd": str(self.waste.quantize(Decimal("0.01"))),
            "waste_pct": round(float(self.waste / self.cost) * 100, 1) if self.cost > 0 else 0.0,
        }


def _rate_of(rates: Mapping[str | None, Rate], model: str | None) -> Rate:
    r = rates.get(model) or rates.get(None)
    if r is None:
        r = next(iter(rates.values()))
    return r


def rollup(cells: pa.Table, keys: Sequence[str], rates: Mapping[str | None, Rate],
           ) -> list[tuple[tuple[str | None, ...], _Line]]:
    """Priced lines of ``cells`` summed by ``keys`` (cells columns), most costly first."""
    lines: dict[tuple[str | None, ...], _Line] = {}
    cols = cells.to_pylist()
    for row in cols:
        k = tuple(row.get(x) for x in keys)
        lines.setdefault(k, _Line()).add(_pt(row), _rate_of(rates, row.get("gpu_model")))
    return sorted(lines.items(), key=lambda kv: (-kv[1].cost, [str(x) for x in kv[0]]))


def coarse_usage(usage: Usage, keys: Sequence[str]) -> Usage:
    """``usage`` with its cells summed to (gpu_uuid, host, gpu_model, ``keys``)."""
    keys = tuple(keys)
    base = ["gpu_uuid", "host", "gpu_model", *keys]
    if usage.cells.num_rows == 0:
        return replace(usage, by=keys)
    agg = usage.cells.group_by(base, use_threads=False).aggregate(
        [(c, "sum") for c in CELL_VALUE_COLUMNS])
    agg = agg.rename_columns([c[:-4] if c.endswith("_sum") else c for c in agg.column_names])
    agg = agg.select([*base, *CELL_VALUE_COLUMNS])
    return replace(usage, cells=agg, by=keys)


def _key_dict(names: Sequence[str], values: Sequence[str | None], pod_col: str | None,
              ) -> dict[str, str]:
    out = {}
    for n, v in zip(names, values):
        label = n[6:] if n.startswith("label:") else n
        out[label] = v if v is not None else (UNALLOCATED if n in ("pod", "namespace",
                                                                    "container") else "")
    return out


def fleet_summary(
    usage: Usage,
    rates: Mapping[str | None, Rate],
    *,
    group_keys: Sequence[str],
    daily: pa.Table | None = None,
    util_window_pct: Mapping[str, float | None] | None = None,
    advice: Mapping[tuple[str | None, ...], list[dict[str, Any]]] | None = None,
    transfer: Mapping[str, Any] | None = None,
    worst_pods: int = 5,
    histograms: int = 20,
) -> dict[str, Any]:
    """The fleet section (plain, JSON-able dicts) from a fine-grained ``usage`` whose cells
    carry the ``group_keys`` and ``pod``/``namespace``; ``daily`` is a cells table with a
    ``day_start`` column (one row per day, GPU and group)."""
    keys = list(group_keys)
    cells = usage.cells
    show = []
    pod_keys = [k for k in ("namespace", "pod") if k in cells.column_names]
    for key, line in rollup(cells, keys, rates):
        entry: dict[str, Any] = {"group": _key_dict(keys, key, None), **line.to_dict()}
        mask = None
        for k, v in zip(keys, key):
            m = pc.is_null(cells.column(k)) if v is None else pc.equal(cells.column(k), v)
            m = pc.fill_null(m, False)
            mask = m if mask is None else pc.and_(mask, m)
        sub = cells.filter(mask) if mask is not None else cells
        pods = [(k, ln) for k, ln in rollup(sub, pod_keys, rates)
                if pod_keys and k[-1] is not None]
        pods.sort(key=lambda kv: -kv[1].waste)
        entry["worst_pods"] = [{**_key_dict(pod_keys, k, None),
                                "cost_usd": str(ln.cost.quantize(Decimal("0.01"))),
                                "waste_usd": str(ln.waste.quantize(Decimal("0.01"))),
                                "mean_util_pct": None if ln.time.mean_util_pct is None
                                else round(ln.time.mean_util_pct, 1)}
                               for k, ln in pods[:worst_pods]]
        entry["advice"] = list((advice or {}).get(tuple(key), []))
        show.append(entry)
    unalloc = _Line()
    if "pod" in cells.column_names:
        for _k, ln in rollup(cells.filter(pc.is_null(cells.column("pod"))), [], rates):
            unalloc = ln
    total = _Line()
    for _k, ln in rollup(cells, [], rates):
        total = ln
    kpis: dict[str, Any] = {
        "util_window_pct": {k: (None if v is None else round(v, 2))
                            for k, v in (util_window_pct or {}).items()},
    }
    days: list[dict[str, Any]] = []
    if daily is not None and daily.num_rows:
        day_ns = daily.column("day_start").cast(pa.int64()).to_numpy()
        for d in np.unique(day_ns):
            sub = daily.filter(pc.equal(daily.column("day_start").cast(pa.int64()), int(d)))
            line = _Line()
            for _k, ln in rollup(sub, [], rates):
                line = ln
            tt = line.time
            days.append({
                "day_start": datetime.fromtimestamp(int(d) / 1e9, tz=timezone.utc).isoformat(),
                "gpu_hours": round(tt.total_s / 3600.0, 3),
                "idle_gpu_hours": round(tt.idle_s / 3600.0, 3),
                "mean_util_pct": None if tt.mean_util_pct is None else round(tt.mean_util_pct, 2),
                "waste_usd": str(line.waste.quantize(Decimal("0.01"))),
                "cost_usd": str(line.cost.quantize(Decimal("0.01"))),
            })
    kpis["days"] = days
    if days:
        kpis["idle_gpu_hours_per_day"] = round(
            sum(d["idle_gpu_hours"] for d in days) / len(days), 3)
        kpis["waste_usd_per_day"] = str((sum((Decimal(d["waste_usd"]) for d in days),
                                             Decimal(0)) / len(days)).quantize(Decimal("0.01")))
    hist = []
    if pod_keys:
        for pk, ln in sorted(rollup(cells, pod_keys, rates),
                             key=lambda kv: -kv[1].time.total_s):
            if pk[-1] is None:
                continue
            pt = ln.time
            obs = pt.observed_s
            hist.append({**_key_dict(pod_keys, pk, None),
                         "observed_hours": round(obs / 3600.0, 3),
                         "bins_pct": {e: round(100.0 * getattr(pt, f"{p}_s") / obs, 1)
                                      if obs > 0 else 0.0
                                      for e, p in zip(HIST_EDGES, PHASES)}})
            if len(hist) >= histograms:
                break
    return {
        "version": "1.0",
        "group_keys": [k[6:] if k.startswith("label:") else k for k in keys],
        "total": total.to_dict(),
        "showback": show,
        "unallocated": unalloc.to_dict(),
        "kpis": kpis,
        "histograms": {"edges_pct": list(HIST_EDGES), "jobs": hist},
        "transfer": dict(transfer or {}),
    }


# -- pushdown answers -> Usage ---------------------------------------------------------
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
    # idle runs from the number of idle/not-idle transitions (PromQL changes()): about half
    runs = float(np.ceil(sig.get("changes", 0.0) / 2.0)) if sig.get("idle_s", 0.0) > 0 else 0.0
    if sig.get("idle_s", 0.0) > 0:
        runs = max(runs, 1.0)
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
