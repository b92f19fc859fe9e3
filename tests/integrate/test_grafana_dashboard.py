"""The Grafana dashboard's structure: ids, queries, metrics that exist, units, variables."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuaudit.cli import main
from gpuaudit.integrate.exporter import METRICS
from gpuaudit.integrate.grafana import dashboard

COUNTERS = Path(__file__).parents[1] / "data" / "dcgm_counters"
PROMQL_WORDS = {"sum", "by", "rate", "increase", "avg", "max", "min", "without", "on", "and",
                "or", "unless", "label_values", "avg_over_time", "max_over_time"}


def dcgm_fields() -> dict[str, bool]:
    """Field name -> enabled by default, from both counter files (commented = known, off)."""
    out: dict[str, bool] = {}
    for f in ("default-counters.csv", "dcp-metrics-included.csv"):
        for line in (COUNTERS / f).read_text().splitlines():
            m = re.match(r"^\s*(#\s*)?(DCGM_[A-Z0-9_]+)\s*,", line)
            if m:
                out[m.group(2)] = out.get(m.group(2), False) or m.group(1) is None
    return out


def exporter_names() -> set[str]:
    return set(METRICS)


def metric_names(expr: str) -> set[str]:
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\$\w+", "", expr)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
    return {n for n in names if n not in PROMQL_WORDS and not n.startswith("__")
            and n not in ("team", "phase", "kind")}


def data_panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in d["panels"] if p["type"] != "row"]


@pytest.mark.parametrize("exported", [False, True])
def test_ids_queries_and_metrics(exported: bool) -> None:
    d = json.loads(json.dumps(dashboard(exported_labels=exported)))  # JSON round trip
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    known = set(dcgm_fields()) | exporter_names()
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE"} <= set(dcgm_fields())
    for p in data_panels(d):
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["expr"].strip()
            names = metric_names(t["expr"])
            assert names, t["expr"]
            assert names <= known, (p["title"], names - known)
            assert t["datasource"]["uid"] == "${datasource}"


def test_failure_mode_rows_in_order() -> None:
    rows = [p["title"].split(":")[0].split(" ")[0] for p in dashboard()["panels"]
            if p["type"] == "row"]
    assert rows == ["Health", "Utilization", "Bottlenecks", "Cost"]


def test_units_match_the_source_units() -> None:
    fields = dcgm_fields()
    for p in data_panels(dashboard()):
        unit = p["fieldConfig"]["defaults"]["unit"]
        exprs = " ".join(t["expr"] for t in p["targets"])
        if "/" in exprs:
            assert unit == "percentunit", p["title"]  # a ratio of two MiB figures
        elif "DCGM_FI_PROF_PCIE" in exprs or "NVLINK_BANDWIDTH" in exprs:
            assert unit == "binBps"
        elif "DCGM_FI_PROF_" in exprs:
            assert unit == "percentunit", p["title"]  # ratios 0..1
        elif "DCGM_FI_DEV_FB_" in exprs:
            assert unit == "mbytes", p["title"]  # MiB is Grafana's binary mbytes
        elif "GPU_UTIL" in exprs:
            assert unit == "percent"
        elif "dollars" in exprs:
            assert unit == "currencyUSD"
        elif "TEMP" in exprs:
            assert unit == "celsius"
        elif "POWER" in exprs:
            assert unit == "watt"
    assert fields["DCGM_FI_DEV_GPU_UTIL"] is True
    assert fields["DCGM_FI_PROF_SM_OCCUPANCY"] is False  # known but off by default


def test_template_variables_and_grid() -> None:
    d = dashboard(exported_labels=True)
    names = [v["name"] for v in d["templating"]["list"]]
    assert names == ["datasource", "namespace", "gpu", "team"]
    ns = next(v for v in d["templating"]["list"] if v["name"] == "namespace")
    assert "exported_namespace" in ns["query"]["query"]
    for p in data_panels(d):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        assert all("$namespace" in t["expr"] for t in p["targets"]
                   if "DCGM" in t["expr"] or "gpuaudit_cost" in t["expr"])


def test_cli_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    assert main(["grafana", "-o", str(out), "--exported"]) == 0
    d = json.loads(out.read_text())
    assert d["uid"] == "gpuaudit-gpu" and data_panels(d)
