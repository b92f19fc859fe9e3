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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuaudit.classify.usage import CELL_VALUE_COLUMNS, PHASES, Usage, arrow_cells
from gpuaudit.errors import InputError
from gpuaudit.price.catalog import Rate
from gpuaudit.price.cost import CostLine, cost_lines
from gpuaudit.price.money import cents
from gpuaudit.validate import read_toml_file

__all__ = [
    "ATTRIBUTION_KEYS",
    "UNALLOCATED",
    "UNATTRIBUTED",
    "Attributor",
    "MappingFile",
    "attribute_table",
    "cells_of_group",
    "fleet_summary",
    "load_mapping",
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
    doc = read_toml_file(p, what="mapping file", option="--map-file",
                         format_fix="see docs/fleet.md for the mapping file format")
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
def line_dict(ln: CostLine) -> dict[str, Any]:
    """A priced line as the fleet section's plain dict (hours, phases, dollars)."""
    t = ln.time
    cost = ln.observed_cost
    cl = ln.in_cents()
    return {
        "gpu_hours": round(t.total_s / 3600.0, 4),
        "effective_gpu_hours": round(t.busy_s / 3600.0, 4),
        "observed_hours": round(t.observed_s / 3600.0, 4),
        "unobserved_hours": round(t.unobserved_s / 3600.0, 4),
        "phase_hours": {p: round(getattr(t, f"{p}_s") / 3600.0, 4) for p in PHASES},
        "phase_pct": t.phase_shares_pct(),
        "mean_util_pct": None if t.mean_util_pct is None else round(t.mean_util_pct, 2),
        "cost_usd": str(cl.observed),
        "waste_usd": str(cl.waste),
        "waste_pct": round(float(ln.waste / cost) * 100, 1) if cost > 0 else 0.0,
    }


def _total(cells: pa.Table, rates: Mapping[str | None, Rate]) -> CostLine:
    lines = cost_lines(cells, rates, ())
    return lines[0] if lines else CostLine.empty()


def cells_of_group(cells: pa.Table, keys: Sequence[str], key: Sequence[str | None]
                   ) -> pa.Table:
    """The cells whose ``keys`` columns equal ``key`` (None matches null)."""
    mask = None
    for k, v in zip(keys, key):
        m = pc.is_null(cells.column(k)) if v is None else pc.equal(cells.column(k), v)
        m = pc.fill_null(m, False)
        mask = m if mask is None else pc.and_(mask, m)
    return cells.filter(mask) if mask is not None else cells


def coarse_usage(usage: Usage, keys: Sequence[str]) -> Usage:
    """``usage`` with its cells summed to (gpu_uuid, host, gpu_model, ``keys``)."""
    keys = tuple(keys)
    base = list(dict.fromkeys(["gpu_uuid", "host", "gpu_model", *keys]))  # --by host: once
    if usage.cells.num_rows == 0:
        return replace(usage, by=keys)
    agg = arrow_cells(usage.cells).group_by(base, use_threads=False).aggregate(
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
    cells = arrow_cells(usage.cells)
    show = []
    pod_keys = [k for k in ("namespace", "pod") if k in cells.column_names]
    for line in cost_lines(cells, rates, keys):
        key = line.key
        entry: dict[str, Any] = {"group": _key_dict(keys, key, None), **line_dict(line)}
        sub = cells_of_group(cells, keys, key)
        pods = [(ln.key, ln) for ln in cost_lines(sub, rates, pod_keys)
                if pod_keys and ln.key[-1] is not None]
        pods.sort(key=lambda kv: -kv[1].waste)
        entry["worst_pods"] = [{**_key_dict(pod_keys, k, None),
                                "cost_usd": str(ln.in_cents().observed),
                                "waste_usd": str(ln.in_cents().waste),
                                "mean_util_pct": None if ln.time.mean_util_pct is None
                                else round(ln.time.mean_util_pct, 1)}
                               for k, ln in pods[:worst_pods]]
        entry["advice"] = list((advice or {}).get(tuple(key), []))
        show.append(entry)
    unalloc = CostLine.empty()
    if "pod" in cells.column_names:
        unalloc = _total(cells.filter(pc.is_null(cells.column("pod"))), rates)
    total = _total(cells, rates)
    kpis: dict[str, Any] = {
        "util_window_pct": {k: (None if v is None else round(v, 2))
                            for k, v in (util_window_pct or {}).items()},
    }
    days: list[dict[str, Any]] = []
    day_waste: list[Decimal] = []
    if daily is not None and daily.num_rows:
        day_ns = daily.column("day_start").cast(pa.int64()).to_numpy()
        for d in np.unique(day_ns):
            sub = daily.filter(pc.equal(daily.column("day_start").cast(pa.int64()), int(d)))
            line = _total(sub, rates)
            tt = line.time
            day_waste.append(line.waste)
            days.append({
                "day_start": datetime.fromtimestamp(int(d) / 1e9, tz=timezone.utc).isoformat(),
                "gpu_hours": round(tt.total_s / 3600.0, 3),
                "idle_gpu_hours": round(tt.idle_s / 3600.0, 3),
                "mean_util_pct": None if tt.mean_util_pct is None else round(tt.mean_util_pct, 2),
                "waste_usd": str(line.in_cents().waste),
                "cost_usd": str(line.in_cents().observed),
            })
    kpis["days"] = days
    if days:
        kpis["idle_gpu_hours_per_day"] = round(
            sum(d["idle_gpu_hours"] for d in days) / len(days), 3)
        # the mean of the days' unrounded waste, rounded once (not a mean of rounded cents)
        kpis["waste_usd_per_day"] = str(cents(sum(day_waste, Decimal(0)) / len(day_waste)))
    hist = []
    if pod_keys:
        for pk, ln in sorted(((ln.key, ln) for ln in cost_lines(cells, rates, pod_keys)),
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
        "total": line_dict(total),
        "showback": show,
        "unallocated": line_dict(unalloc),
        "kpis": kpis,
        "histograms": {"edges_pct": list(HIST_EDGES), "jobs": hist},
        "transfer": dict(transfer or {}),
    }
