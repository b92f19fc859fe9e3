"""A Grafana dashboard (JSON model) organised by failure mode.

Rows: health (temperature, power, ECC, XID), utilization and throughput (GPU_UTIL, SM active
vs occupancy, tensor active), bottlenecks (PCIe vs DRAM vs SM), cost (gpuaudit exporter:
dollars and waste per team). Every panel queries dcgm-exporter fields (``DCGM_FI_*``, see its
``default-counters.csv`` / ``dcp-metrics-included.csv``; SM active/occupancy and ECC are
commented out there by default) or the series of :mod:`gpuaudit.integrate.exporter`.

Units follow Grafana's ids: framebuffer is MiB -> ``mbytes`` (Grafana's binary mebibytes;
``decmbytes`` would be SI megabytes), ``DCGM_FI_PROF_*`` ratios -> ``percentunit``, GPU_UTIL
percent -> ``percent``, PCIe bytes/s -> ``binBps``, power ``watt``, temperature ``celsius``,
money ``currencyUSD``. Template variables: datasource, namespace, GPU (UUID) and team.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["dashboard", "dashboard_json"]


def dashboard(*, exported_labels: bool = False, title: str = "GPU cost and health (gpuaudit)",
              uid: str = "gpuaudit-gpu") -> dict[str, Any]:
    """The dashboard model. ``exported_labels``: match ``exported_namespace`` (dcgm-exporter
    Helm chart default ``honorLabels: false``) instead of ``namespace``."""
    ns = "exported_namespace" if exported_labels else "namespace"
    sel = f'{ns}=~"$namespace", UUID=~"$gpu"'
    cost_sel = 'namespace=~"$namespace", gpu=~"$gpu", team=~"$team"'
    ds = {"type": "prometheus", "uid": "${datasource}"}
    panels: list[dict[str, Any]] = []
    next_id = [1]
    y = [0]

    def row(title: str) -> None:
        panels.append({"id": next_id[0], "type": "row", "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y[0]}, "panels": []})
        next_id[0] += 1
        y[0] += 1

    def panel(title: str, exprs: list[tuple[str, str]], unit: str, *, x: int, w: int = 12,
              h: int = 8, kind: str = "timeseries", desc: str = "",
              minmax: tuple[float | None, float | None] = (None, None)) -> None:
        defaults: dict[str, Any] = {"unit": unit}
        if minmax[0] is not None:
            defaults["min"] = minmax[0]
        if minmax[1] is not None:
            defaults["max"] = minmax[1]
        panels.append({
            "id": next_id[0], "type": kind, "title": title, "description": desc,
            "datasource": ds,
            "gridPos": {"h": h, "w": w, "x": x, "y": y[0]},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"displayMode": "table", "placement": "bottom",
                                   "calcs": ["mean", "max"]}} if kind == "timeseries" else {},
            "targets": [{"refId": chr(ord("A") + i), "datasource": ds, "expr": e,
                         "legendFormat": legend} for i, (e, legend) in enumerate(exprs)],
        })
        next_id[0] += 1
        if x + w >= 24:
            y[0] += h

    gpu_legend = "{{Hostname}}{{hostname}} gpu {{gpu}}"
    row("Health: temperature, power, ECC, XID")
    panel("GPU temperature", [(f"DCGM_FI_DEV_GPU_TEMP{{{sel}}}", gpu_legend)], "celsius", x=0,
          desc="DCGM_FI_DEV_GPU_TEMP. Sustained > 85 C means thermal throttling.")
    panel("Power draw", [(f"DCGM_FI_DEV_POWER_USAGE{{{sel}}}", gpu_legend)], "watt", x=12,
          desc="DCGM_FI_DEV_POWER_USAGE (W).")
    panel("ECC double-bit errors (volatile)",
          [(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{sel}}}", gpu_legend)], "short", x=0, kind="stat",
          desc="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: uncorrectable errors since driver load; any "
          "non-zero value needs the node drained. Enable it in the exporter's counters CSV.")
    panel("Last XID error", [(f"DCGM_FI_DEV_XID_ERRORS{{{sel}}}", gpu_legend)], "none", x=12,
          kind="stat", desc="DCGM_FI_DEV_XID_ERRORS: code of the last XID (0: none).")
    row("Utilization and throughput")
    panel("GPU utilization", [(f"DCGM_FI_DEV_GPU_UTIL{{{sel}}}", gpu_legend)], "percent",
          x=0, minmax=(0, 100),
          desc="DCGM_FI_DEV_GPU_UTIL: share of time any kernel ran; a tiny kernel running "
          "nonstop reads 100%. Not reported on MIG: use graphics engine active.")
    panel("SM active vs SM occupancy",
          [(f"DCGM_FI_PROF_SM_ACTIVE{{{sel}}}", "SM active " + gpu_legend),
           (f"DCGM_FI_PROF_SM_OCCUPANCY{{{sel}}}", "occupancy " + gpu_legend)],
          "percentunit", x=12, minmax=(0, 1),
          desc="DCGM_FI_PROF_SM_ACTIVE (cycles with a warp resident) vs "
          "DCGM_FI_PROF_SM_OCCUPANCY (warps resident / max): active but low occupancy means "
          "small kernels or launch-bound work.")
    panel("Tensor pipe active", [(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{sel}}}", gpu_legend)],
          "percentunit", x=0, minmax=(0, 1),
          desc="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: near 0 on a busy GPU means FP32 math (try "
          "AMP/bf16).")
    panel("Graphics engine active", [(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{sel}}}", gpu_legend)],
          "percentunit", x=12, minmax=(0, 1),
          desc="DCGM_FI_PROF_GR_ENGINE_ACTIVE: the utilization signal on MIG instances.")
    panel("Framebuffer used", [(f"DCGM_FI_DEV_FB_USED{{{sel}}}", gpu_legend)], "mbytes", x=0,
          desc="DCGM_FI_DEV_FB_USED (MiB; Grafana unit mbytes = mebibytes).")
    panel("Framebuffer used share",
          [(f"DCGM_FI_DEV_FB_USED{{{sel}}} / (DCGM_FI_DEV_FB_USED{{{sel}}} + "
            f"DCGM_FI_DEV_FB_FREE{{{sel}}})", gpu_legend)], "percentunit", x=12, minmax=(0, 1),
          desc="used / (used + free); the GpuMemoryPressure alert fires above 0.85.")
    row("Bottlenecks: PCIe vs DRAM vs SM")
    panel("PCIe traffic",
          [(f"DCGM_FI_PROF_PCIE_TX_BYTES{{{sel}}}", "tx " + gpu_legend),
           (f"DCGM_FI_PROF_PCIE_RX_BYTES{{{sel}}}", "rx " + gpu_legend)], "binBps", x=0,
          desc="DCGM_FI_PROF_PCIE_TX/RX_BYTES (bytes/s): high while SM active is low means "
          "input-bound (host-to-device copies).")
    panel("DRAM active vs SM active",
          [(f"DCGM_FI_PROF_DRAM_ACTIVE{{{sel}}}", "DRAM " + gpu_legend),
           (f"DCGM_FI_PROF_SM_ACTIVE{{{sel}}}", "SM " + gpu_legend)], "percentunit", x=12,
          minmax=(0, 1),
          desc="DCGM_FI_PROF_DRAM_ACTIVE near 1 with SM active lower: memory-bound.")
    panel("NVLink bandwidth", [(f"rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{{sel}}}[5m])",
                                gpu_legend)], "binBps", x=0, w=24,
          desc="rate of DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL: collectives between GPUs.")
    row("Cost (gpuaudit exporter)")
    panel("Cost per team", [(f"sum by (team) (rate(gpuaudit_cost_dollars_total{{{cost_sel}}}"
                             "[$__rate_interval])) * 3600", "{{team}}")],
          "currencyUSD", x=0, desc="Dollars per hour by team (gpuaudit_cost_dollars_total); "
          "an empty team is GPU time no one holds (unallocated).")
    panel("Waste per team", [(f"sum by (team) (rate(gpuaudit_waste_dollars_total{{{cost_sel}}}"
                              "[$__rate_interval])) * 3600", "{{team}}")],
          "currencyUSD", x=12, desc="Dollars per hour wasted by team: idle time plus the "
          "unused share of underutilized time (gpuaudit_waste_dollars_total).")
    panel("Cost and waste in range",
          [(f"sum(increase(gpuaudit_cost_dollars_total{{{cost_sel}}}[$__range]))", "cost"),
           (f"sum(increase(gpuaudit_waste_dollars_total{{{cost_sel}}}[$__range]))", "waste")],
          "currencyUSD", x=0, kind="stat")
    panel("GPU time by phase",
          [(f"sum by (phase) (rate(gpuaudit_phase_seconds_total{{{cost_sel}}}"
            "[$__rate_interval]))", "{{phase}}"),
           (f"sum(rate(gpuaudit_unobserved_seconds_total{{{cost_sel}}}[$__rate_interval]))",
            "unobserved")], "short", x=12,
          desc="GPUs in each phase (GPU-seconds per second): idle, underutilized, productive, "
          "compute_bound; unobserved time is billed but never called idle.")
    panel("Recommended savings", [("gpuaudit_savings_ratio", "{{kind}}")], "percentunit",
          x=0, w=24, h=6, kind="bargauge", minmax=(0, 1),
          desc="gpuaudit_savings_ratio: the plan's honest combination (total = "
          "1 - (1 - efficiency)(1 - rate)).")

    def var(name: str, label: str, query: str) -> dict[str, Any]:
        return {"name": name, "label": label, "type": "query", "datasource": ds,
                "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
                "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
                "current": {"text": "All", "value": "$__all"}, "sort": 1}

    return {
        "uid": uid,
        "title": title,
        "tags": ["gpu", "gpuaudit", "dcgm", "finops"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "1m",
        "time": {"from": "now-24h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            var("namespace", "Namespace", f"label_values(DCGM_FI_DEV_GPU_UTIL, {ns})"),
            var("gpu", "GPU", f'label_values(DCGM_FI_DEV_GPU_UTIL{{{ns}=~"$namespace"}}, UUID)'),
            var("team", "Team", "label_values(gpuaudit_cost_dollars_total, team)"),
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


def dashboard_json(**kw: Any) -> str:
    return json.dumps(dashboard(**kw), indent=2) + "\n"
