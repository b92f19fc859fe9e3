"""Nobody in through the rules file (issue 22 item 7): a budget team named like a Go template
is shown literally when the alert fires (real promtool renders it), DEL and C1 characters keep
the YAML valid, and a malformed --selector is refused before a file Prometheus would reject."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuaudit.cli import main
from gpuaudit.errors import InputError
from gpuaudit.integrate.alerts import AlertThresholds, literal, rules_yaml
from gpuaudit.price.billing.budgets import load_budgets
from gpuaudit.promql import parse_selector

PROMTOOL = shutil.which("promtool")
EVIL = '{{ query "up" | first | value }}'


def test_template_in_a_team_name_is_rendered_literally(tmp_path: Path) -> None:
    assert PROMTOOL is not None, "promtool is installed by scripts/test"
    b = tmp_path / "budgets.toml"
    b.write_text('usd_per_gpu_hour = "6.52"\n[budgets]\n' + json.dumps(EVIL)
                 + ' = "15000"\n')
    rules = tmp_path / "rules.yml"
    rules.write_text(rules_yaml(budgets=load_budgets(b)), encoding="utf-8")
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    team_sel = EVIL.replace("\\", "\\\\").replace('"', '\\"')
    series = [{"series": f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",pod="p-{g}",team="{team_sel}"}}',
               "values": "50+0x300"} for g in range(4)]
    # an "up" series: if the team's template ran, the label would read its value instead
    series.append({"series": 'up{job="x"}', "values": "1+0x300"})
    summary = (f"team {EVIL}: month-end GPU spend forecast 19403.52 USD is over the budget "
               "15000 USD")
    tests = {"rule_files": [rules.name], "evaluation_interval": "5m", "tests": [{
        "interval": "5m", "input_series": series,
        "alert_rule_test": [{"eval_time": "25h", "alertname": "GpuBudgetForecastExceeded",
                             "exp_alerts": [{
                                 "exp_labels": {"severity": "warning", "category": "budget",
                                                "budget_team": EVIL, "team": EVIL},
                                 "exp_annotations": {"summary": summary}}]}]}]}
    # the description is not compared (exp_annotations must match all): drop it from rules
    text = rules.read_text().splitlines()
    rules.write_text("\n".join(ln for ln in text if "description:" not in ln) + "\n")
    t = tmp_path / "rules.test.yml"
    t.write_text(json.dumps(tests), encoding="utf-8")
    run = subprocess.run([PROMTOOL, "test", "rules", t.name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_literal_escapes_both_delimiters_once() -> None:
    assert literal("a {{ b }} c") == 'a {{ "{{" }} b {{ "}}" }} c'
    assert literal("plain") == "plain"


def test_del_and_c1_characters_keep_the_yaml_valid(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    b = tmp_path / "budgets.toml"
    b.write_text('usd_per_gpu_hour = "1"\n[budgets]\n"team\\u007fx\\u0085y\\u009fz" = "10"\n')
    rules = tmp_path / "rules.yml"
    rules.write_text(rules_yaml(budgets=load_budgets(b)), encoding="utf-8")
    assert "\x7f" not in rules.read_text() and "\x9f" not in rules.read_text()
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("bad", ['cluster="prod', 'cluster=prod', '"x"="y"', 'a="b",,c="d"',
                                 'a=="b"', 'a="b" c="d"', '{a="b"'])
def test_malformed_selector_is_refused(bad: str) -> None:
    with pytest.raises(InputError, match="not a list of PromQL label matchers"):
        AlertThresholds(selector=bad)


def test_selector_is_written_back_canonically() -> None:
    assert parse_selector('{ cluster = "prod" , team=~\'ml.*\' }') == \
        'cluster="prod",team=~"ml.*"'
    assert parse_selector('x!="a\\"b"') == 'x!="a\\"b"'
    assert parse_selector("") == ""


def test_cli_selector_typo_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    rc = main(["alerts", "--selector", 'cluster="prod', "-o", str(tmp_path / "r.yml")])
    assert rc == 2
    assert "PromQL label matchers" in capsys.readouterr().err
    assert not (tmp_path / "r.yml").exists()
    assert main(["alerts", "--selector", 'cluster="prod"', "-o", str(tmp_path / "r.yml")]) == 0
    check = subprocess.run([PROMTOOL or "promtool", "check", "rules", str(tmp_path / "r.yml")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
