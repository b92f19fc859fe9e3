"""``gpuaudit alerts``: Prometheus alerting rules for GPU waste and health (dcgm-exporter)."""

from __future__ import annotations

from pathlib import Path

import click

from gpuaudit.cli.output import write_output
from gpuaudit.cli.params import Number, OutputFile, PromDuration
from gpuaudit.validate import (
    ALERT_HELD_IDLE_HOURS,
    ALERT_TEMPERATURE_C,
    ALERT_UNDERUTIL_PCT,
    MEMORY_PRESSURE_RATIO,
    RATIO,
    TENSOR_IDLE_RATIO,
)

__all__ = ["alerts_cmd"]


@click.command("alerts")
@click.option("-o", "--output", type=OutputFile(), default=None,
              help="Write the rule file here instead of stdout.")
@click.option("--underutil-pct", type=Number(ALERT_UNDERUTIL_PCT), default=50.0,
              show_default=True,
              help="GpuUnderutilized: mean utilization (percent) below this ...")
@click.option("--underutil-window", type=PromDuration(), default="1h", show_default=True,
              help="... averaged over this window, on a GPU a pod holds.")
@click.option("--memory-pressure", "memory_pressure_ratio", type=Number(MEMORY_PRESSURE_RATIO),
              default=0.85, show_default=True,
              help="GpuMemoryPressure: framebuffer used/(used+free) above.")
@click.option("--temperature-c", type=Number(ALERT_TEMPERATURE_C), default=85.0,
              show_default=True, help="GpuHighTemperature: degrees C above this for 5 minutes.")
@click.option("--tensor-idle", "tensor_idle_ratio", type=Number(TENSOR_IDLE_RATIO),
              default=0.01, show_default=True,
              help="GpuTensorCoresIdle: tensor pipe active ratio below ...")
@click.option("--tensor-busy", "tensor_busy_ratio", type=Number(RATIO), default=0.5,
              show_default=True,
              help="... while the graphics engine is active above this ratio.")
@click.option("--held-idle-hours", type=Number(ALERT_HELD_IDLE_HOURS), default=4.0,
              show_default=True,
              help="GpuHeldIdle: a held GPU with no activity for this many hours.")
@click.option("--for", "for_duration", type=PromDuration(), default="15m", show_default=True,
              help="How long the waste conditions must hold before firing.")
@click.option("--exported", "exported_labels", is_flag=True,
              help="Match exported_pod/exported_namespace (dcgm-exporter Helm chart default, "
              "honorLabels: false).")
@click.option("--selector", default="", metavar='LABEL="VALUE",...',
              help='Extra label matchers for every rule, e.g. cluster="prod".')
@click.option("--budgets", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Add GpuBudgetForecastExceeded per team of this budget file "
              "(TOML, docs/billing.md).")
def alerts_cmd(output: Path | None, budgets: Path | None, **kw: object) -> None:
    """Write Prometheus alerting rules (YAML) for GPU waste, GPU health and budgets."""
    from gpuaudit.integrate.alerts import AlertThresholds, rules_yaml

    loaded = None
    if budgets is not None:
        from gpuaudit.api.bill import load_budgets

        loaded = load_budgets(budgets)
    text = rules_yaml(AlertThresholds(**kw), budgets=loaded)  # type: ignore[arg-type]
    write_output(text, output, "alert rules", f"(check: promtool check rules {output})")
