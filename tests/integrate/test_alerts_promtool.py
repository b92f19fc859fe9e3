"""The generated alert rules, checked and unit-tested by promtool (each alert fires and not)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuaudit.cli import main
from gpuaudit.errors import InputError
from gpuaudit.integrate.alerts import AlertThresholds, alert_rules, rules_yaml

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")

GPU_A = {"gpu": "0", "UUID": "GPU-aaaa", "Hostname": "node-1", "modelName": "NVIDIA H100"}
GPU_B = {"gpu": "1", "UUID": "GPU-bbbb", "Hostname": "node-1", "modelName": "NVIDIA H100"}


def _series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{inner}}}", "values": values}


def _expand(template: str, labels: dict[str, str], value: float) -> str:
    """What Prometheus renders for the templates the rules use ($labels.X, printf of $value)."""
    out = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
    return re.sub(r'\{\{ \$value \| printf "(%\.\df)" \}\}', lambda m: m.group(1) % value, out)


def _alert(rules: dict[str, Any], name: str, labels: dict[str, str], value: float
           ) -> dict[str, Any]:
    rule = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == name)
    exp = {**labels, **rule["labels"]}
    return {"exp_labels": exp,
            "exp_annotations": {k: _expand(v, {**labels, **rule["labels"]}, value)
                                for k, v in rule["annotations"].items()}}


def _cases(rules: dict[str, Any], pod: str = "pod", ns: str = "namespace") -> list[dict[str, Any]]:
    held_a = {**GPU_A, ns: "ml", pod: "trainer-0"}
    held_b = {**GPU_B, ns: "ml", pod: "server-0"}
    util, fb_used, fb_free = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
    tensor, gr = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    return [
        {   # fires: held at 20 % for 90 min; not: held at 80 %, or at 0 % but held by no one
            "input_series": [_series(util, held_a, "20+0x120"), _series(util, held_b, "80+0x120"),
                             _series(util, {**GPU_A, "gpu": "7"}, "0+0x120")],
            "alert_rule_test": [
                {"eval_time": "90m", "alertname": "GpuUnderutilized",
                 "exp_alerts": [_alert(rules, "GpuUnderutilized", held_a, 20)]},
                {"eval_time": "10m", "alertname": "GpuUnderutilized", "exp_alerts": []},
            ]},
        {   # fires: held, 0 % for 5 h; not: active 70 min before the evaluation
            "input_series": [_series(util, held_a, "0+0x300"),
                             _series(util, held_b, "0+0x200 50 0+0x99"),
                             _series(util, {**GPU_A, "gpu": "7"}, "0+0x300")],
            "alert_rule_test": [
                {"eval_time": "270m", "alertname": "GpuHeldIdle",
                 "exp_alerts": [_alert(rules, "GpuHeldIdle", held_a, 0)]},
                {"eval_time": "2h", "alertname": "GpuHeldIdle", "exp_alerts": []},
            ]},
        {   # fires: busy engine, idle tensor pipe; not: idle GPU; not: tensor cores in use
            "input_series": [_series(tensor, held_a, "0.001+0x90"), _series(gr, held_a, "0.8+0x90"),
                             _series(tensor, held_b, "0.001+0x90"), _series(gr, held_b, "0.1+0x90"),
                             _series(tensor, GPU_B, "0.3+0x90"), _series(gr, GPU_B, "0.8+0x90")],
            "alert_rule_test": [
                {"eval_time": "60m", "alertname": "GpuTensorCoresIdle",
                 "exp_alerts": [_alert(rules, "GpuTensorCoresIdle", held_a, 0.001)]},
            ]},
        {   # fires: 90 % of the framebuffer for 20 min; not: half full
            "input_series": [_series(fb_used, held_a, "72000+0x30"),
                             _series(fb_free, held_a, "8000+0x30"),
                             _series(fb_used, held_b, "40000+0x30"),
                             _series(fb_free, held_b, "40000+0x30")],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "GpuMemoryPressure",
                 "exp_alerts": [_alert(rules, "GpuMemoryPressure", held_a, 0.9)]},
                {"eval_time": "5m", "alertname": "GpuMemoryPressure", "exp_alerts": []},
            ]},
        {   # fires at once on a double-bit error; not on a clean GPU
            "input_series": [_series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", GPU_A, "0 0 2 2 2"),
                             _series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", GPU_B, "0+0x4")],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "GpuEccDoubleBitErrors",
                 "exp_alerts": [_alert(rules, "GpuEccDoubleBitErrors", GPU_A, 2)]},
                {"eval_time": "1m", "alertname": "GpuEccDoubleBitErrors", "exp_alerts": []},
            ]},
        {   # fires: 90 C for 10 min; not: 80 C; not: a 2-minute spike
            "input_series": [_series("DCGM_FI_DEV_GPU_TEMP", GPU_A, "90+0x15"),
                             _series("DCGM_FI_DEV_GPU_TEMP", GPU_B, "80+0x15"),
                             _series("DCGM_FI_DEV_GPU_TEMP", {**GPU_B, "gpu": "2"},
                                     "70 90 90 70+0x12")],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "GpuHighTemperature",
                 "exp_alerts": [_alert(rules, "GpuHighTemperature", GPU_A, 90)]},
            ]},
        {   # fires on an XID; not without one
            "input_series": [_series("DCGM_FI_DEV_XID_ERRORS", GPU_A, "0 79 79"),
                             _series("DCGM_FI_DEV_XID_ERRORS", GPU_B, "0 0 0")],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "GpuXidError",
                 "exp_alerts": [_alert(rules, "GpuXidError", GPU_A, 79)]},
                {"eval_time": "0m", "alertname": "GpuXidError", "exp_alerts": []},
            ]},
    ]


def _run_promtool(tmp_path: Path, t: AlertThresholds, pod: str, ns: str) -> None:
    assert PROMTOOL is not None
    rules_file = tmp_path / "gpu-alerts.yml"
    rules_file.write_text(rules_yaml(t), encoding="utf-8")
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules_file)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 7 rules found" in check.stdout
    tests = {"rule_files": [rules_file.name], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", **c} for c in _cases(alert_rules(t), pod, ns)]}
    test_file = tmp_path / "gpu-alerts.test.yml"
    test_file.write_text(json.dumps(tests, indent=1), encoding="utf-8")  # JSON is YAML
    run = subprocess.run([PROMTOOL, "test", "rules", test_file.name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


@needs_promtool
def test_every_alert_fires_and_holds_fire(tmp_path: Path) -> None:
    _run_promtool(tmp_path, AlertThresholds(), "pod", "namespace")


@needs_promtool
def test_exported_labels_variant(tmp_path: Path) -> None:
    _run_promtool(tmp_path, AlertThresholds(exported_labels=True), "exported_pod",
                  "exported_namespace")


@needs_promtool
def test_a_changed_threshold_changes_what_fires(tmp_path: Path) -> None:
    """At a 10 % threshold the 20 %-busy GPU no longer counts as underutilized."""
    t = AlertThresholds(underutil_pct=10)
    rules = alert_rules(t)
    case = _cases(rules)[0]
    case["alert_rule_test"] = [{"eval_time": "90m", "alertname": "GpuUnderutilized",
                                "exp_alerts": []}]
    rules_file = tmp_path / "r.yml"
    rules_file.write_text(rules_yaml(t), encoding="utf-8")
    (tmp_path / "t.yml").write_text(json.dumps({
        "rule_files": ["r.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", **case}]}), encoding="utf-8")
    assert PROMTOOL is not None
    run = subprocess.run([PROMTOOL, "test", "rules", "t.yml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


@needs_promtool
def test_cli_writes_a_valid_rule_file(tmp_path: Path) -> None:
    out = tmp_path / "a.yml"
    assert main(["alerts", "-o", str(out), "--underutil-pct", "40", "--temperature-c", "80",
                 "--held-idle-hours", "6"]) == 0
    text = out.read_text()
    assert "< 40" in text and "> 80" in text and 'for: "6h"' in text
    assert PROMTOOL is not None
    run = subprocess.run([PROMTOOL, "check", "rules", str(out)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(InputError, match="duration"):
        AlertThresholds(underutil_window="an hour")
    with pytest.raises(InputError, match=r"memory_pressure_ratio.*not percent: 85 percent is 0\.85"):
        AlertThresholds(memory_pressure_ratio=85)
