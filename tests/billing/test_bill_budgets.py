"""Budgets: the TOML, the forecast and its interval (property-tested), and the Prometheus
rule, checked and unit-tested by real promtool (it fires over the budget, not under it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuaudit.errors import InputError
from gpuaudit.integrate.alerts import budget_rules, rules_yaml, to_yaml
from gpuaudit.price.billing.budgets import forecast, load_budgets

PROMTOOL = shutil.which("promtool")


def test_load_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "b.toml"
    p.write_text('month = "2026-10"\n[budgets]\nvision = "20000.00"\nnlp = 15000\n')
    b = load_budgets(p)
    assert b.monthly == {"vision": Decimal("20000.00"), "nlp": Decimal(15000)}
    assert b.month == "2026-10" and b.currency == "USD"
    p.write_text('[budgets]\nvision = "lots"\n')
    with pytest.raises(InputError, match=r"\[budgets\] vision"):
        load_budgets(p)
    p.write_text('month = "Oct"\n[budgets]\nvision = "1"\n')
    with pytest.raises(InputError, match="is not YYYY-MM"):
        load_budgets(p)
    p.write_text('montly = "2026-10"\n[budgets]\nvision = "1"\n')
    with pytest.raises(InputError, match="unknown key 'montly'"):
        load_budgets(p)
    p.write_text("[other]\n")
    with pytest.raises(InputError, match=r"no \[budgets\] table"):
        load_budgets(p)


@given(st.lists(st.integers(0, 10**7), min_size=1, max_size=31), st.integers(28, 31))
def test_forecast_interval_properties(cents: list[int], n_days: int) -> None:
    daily = [Decimal(c) / 100 for c in cents][:n_days]
    mtd, fc, lo, hi = forecast(daily, n_days)
    assert mtd == sum(daily, Decimal(0))
    assert mtd <= lo <= fc <= hi
    d, r = len(daily), n_days - len(daily)
    assert fc == mtd + mtd / d * r
    if len(set(daily)) == 1 or r == 0:
        assert lo == fc == hi  # no spread, or nothing left to forecast


def test_forecast_by_hand() -> None:
    daily = [Decimal(0)] * 4 + [Decimal("155.12")]
    mtd, fc, lo, hi = forecast(daily, 31)
    assert (mtd, fc.quantize(Decimal("0.01"))) == (Decimal("155.12"), Decimal("961.74"))
    assert lo == mtd and hi.quantize(Decimal("0.01")) == Decimal("2410.62")


def test_rule_needs_a_rate(tmp_path: Path) -> None:
    p = tmp_path / "b.toml"
    p.write_text('[budgets]\nvision = "1"\n')
    with pytest.raises(InputError, match="usd_per_gpu_hour"):
        budget_rules(load_budgets(p))


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_budget_rule_fires_over_budget_only(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    b = tmp_path / "budgets.toml"
    # vision holds 4 GPUs for a day: 4 x 24 h x 31 days (January, promtool's clock) x 6.52
    # = 19,403.52 a month: over 15,000, under nlp's 20,000 for the same use
    b.write_text('usd_per_gpu_hour = "6.52"\n[budgets]\nvision = "15000"\nnlp = "20000"\n')
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(rules_yaml(budgets=load_budgets(b)), encoding="utf-8")
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules_file)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    series = []
    for team in ("vision", "nlp"):
        for g in range(4):
            series.append({"series": f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",pod="{team}-0",'
                                     f'team="{team}"}}', "values": "50+0x300"})
    summary = ("team vision: month-end GPU spend forecast 19403.52 USD is over the budget "
               "15000 USD")
    desc = budget_rules(load_budgets(b))["groups"][0]["rules"][1]["annotations"]["description"]
    tests = {"rule_files": [rules_file.name], "evaluation_interval": "5m", "tests": [{
        "interval": "5m", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "25h", "alertname": "GpuBudgetForecastExceeded", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "category": "budget",
                               "budget_team": "vision", "team": "vision"},
                "exp_annotations": {"summary": summary, "description": desc}}]},
            {"eval_time": "10m", "alertname": "GpuBudgetForecastExceeded", "exp_alerts": []},
        ]}]}
    t = tmp_path / "rules.test.yml"
    t.write_text(json.dumps(tests), encoding="utf-8")
    run = subprocess.run([PROMTOOL, "test", "rules", t.name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "gpuaudit-gpu-budgets" in to_yaml(budget_rules(load_budgets(b)))
