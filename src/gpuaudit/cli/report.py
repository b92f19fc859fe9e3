"""``gpuaudit report FILE``: audit a recording or log file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuaudit.cli.options import emit, output_options, pricing_kwargs, pricing_options


@click.command("report")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--map", "mapping", default=None, metavar="SRC=DST,...",
              help="Map CSV columns to sample-table columns, e.g. "
              "gpu_util=util_gpu_pct,time=ts,pod_name=pod (':ratio'/':percent' sets the scale; "
              "'label:<key>' keeps a column as a label).")
@click.option("--fields", default=None, metavar="F1,F2,...",
              help="nvidia-smi --query-gpu fields of a noheader log, in order.")
@click.option("--by", "by", multiple=True, metavar="KEY",
              help="Group by pod, namespace, container, host, gpu_model or any label key "
              "(repeat or comma-separate).")
@click.option("--host", default=None, help="Host name when the file has none.")
@click.option("--tz", default="UTC", show_default=True,
              help="Time zone of timestamps written without one (nvidia-smi local time).")
@click.option("--interval", "interval_s", type=float, default=None,
              help="Nominal sample interval in seconds (default: from the file).")
@pricing_options
@output_options
def report_cmd(path: Path, mapping: str | None, fields: str | None, by: tuple[str, ...],
               host: str | None, tz: str, interval_s: float | None, fmt: str,
               output: Path | None, **kw: Any) -> None:
    """Audit PATH: a gpuaudit Parquet recording, an nvidia-smi CSV log, or any CSV/JSONL."""
    from gpuaudit.api import audit
    from gpuaudit.measure.files import parse_mapping

    groups = tuple(k for item in by for k in item.split(",") if k.strip())
    result = audit(
        path,
        by=groups,
        mapping=parse_mapping(mapping) if mapping else None,
        fields=[f.strip() for f in fields.split(",")] if fields else None,
        host=host, tz=tz, interval_s=interval_s,
        **pricing_kwargs(kw),
    )
    emit(result, fmt, output)
