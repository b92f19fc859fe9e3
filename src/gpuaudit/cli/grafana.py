"""``gpuaudit grafana``: a Grafana dashboard (JSON) for GPU health, utilization and cost."""

from __future__ import annotations

from pathlib import Path

import click

from gpuaudit.cli.output import write_output
from gpuaudit.cli.params import OutputFile

__all__ = ["grafana_cmd"]


@click.command("grafana")
@click.option("-o", "--output", type=OutputFile(), default=None,
              help="Write the dashboard here instead of stdout.")
@click.option("--exported", "exported_labels", is_flag=True,
              help="Match exported_namespace (dcgm-exporter Helm chart default, "
              "honorLabels: false).")
@click.option("--title", default="GPU cost and health (gpuaudit)", show_default=True)
@click.option("--uid", default="gpuaudit-gpu", show_default=True, help="Dashboard uid.")
def grafana_cmd(output: Path | None, exported_labels: bool, title: str, uid: str) -> None:
    """Write a Grafana dashboard over dcgm-exporter and gpuaudit exporter series."""
    from gpuaudit.integrate.grafana import dashboard_json

    text = dashboard_json(exported_labels=exported_labels, title=title, uid=uid)
    write_output(text, output, "Grafana dashboard", "(Dashboards > New > Import)")
