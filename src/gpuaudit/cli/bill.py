"""``gpuaudit bill``: the cloud bill (FOCUS, AWS CUR, GCP export) split over measured GPU time.

``--format`` takes both kinds of name, because they never collide: an input format
(``focus``, ``cur``, ``gcp``: forces how the bill is read; otherwise detected from its
columns) and an output format (``terminal``, ``json``, ``markdown``, ``html``, ``csv``,
``parquet``). Give it twice for both: ``--format cur --format json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuaudit.cli.output import write_output
from gpuaudit.cli.params import Duration, Number, OutputDir, OutputFile, Parsed, one_value
from gpuaudit.errors import InputError
from gpuaudit.validate import FLEET_STEP_S, WORKERS

__all__ = ["bill_cmd"]

INPUT_FORMATS = ("focus", "cur", "gcp")
OUTPUT_FORMATS = ("terminal", "json", "markdown", "html", "csv", "parquet")


class _BillCommand(click.Command):
    """``gpuaudit bill FILE ...`` as always; ``gpuaudit bill compare LAST THIS`` runs
    :data:`compare_cmd` (a first argument ``compare`` that is not a file in the folder)."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        if args and args[0] == "compare" and not Path("compare").exists():
            return compare_cmd.make_context(f"{info_name} compare", list(args[1:]),
                                            parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.command is not self:
            return ctx.command.invoke(ctx)
        return super().invoke(ctx)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_paragraph()
        formatter.write_text("Realised savings: gpuaudit bill compare LAST.json THIS.json "
                             "(two reports of gpuaudit bill --format json), or two bills: "
                             "gpuaudit bill compare last.csv this.csv --telemetry RUN.")


@click.command("compare")
@click.argument("last", type=click.Path(exists=True, path_type=Path))
@click.argument("this", type=click.Path(exists=True, path_type=Path))
@click.option("--telemetry", type=click.Path(exists=True, path_type=Path), multiple=True,
              help="With two bills instead of two reports: the measured GPU time (one "
              "recording for both, or given twice: one per bill, in order).")
@click.option("--by", "by", multiple=True, metavar="KEY",
              help="With two bills: split by these keys (comma-separate; default team).")
@click.option("--format", "fmt", type=click.Choice(["terminal", "markdown", "json"]),
              multiple=True, default=["terminal"], show_default=True, callback=one_value,
              help="Report format.")
@click.option("-o", "--output", type=OutputFile(), default=None,
              help="Write the comparison here instead of stdout ('-': stdout).")
def compare_cmd(last: Path, this: Path, telemetry: tuple[Path, ...], by: tuple[str, ...],
                fmt: str, output: Path | None) -> None:
    """Realised savings: per team and per remediation, what last month's bill report
    projected and what this month's bill shows. LAST and THIS: two reports of gpuaudit bill
    --format json, or two bills with --telemetry."""
    import json

    from gpuaudit.api.bill import compare_bills
    from gpuaudit.report.bill import render_compare

    keys = [k.strip() for v in by for k in v.split(",") if k.strip()] or ["team"]
    cmp = compare_bills(last, this, telemetry=list(telemetry) or None, by=keys)
    text = json.dumps(cmp, indent=2) + "\n" if fmt == "json" else render_compare(cmp, fmt)
    write_output(text, output, f"{fmt} comparison")


@click.command("bill", cls=_BillCommand)
@click.argument("bill_path", metavar="FILE|DIR",
                type=click.Path(exists=True, path_type=Path))
@click.option("--telemetry", type=click.Path(exists=True, path_type=Path), default=None,
              help="Measured GPU time: a recording (Parquet, CSV, nvidia-smi log).")
@click.option("--prometheus", metavar="URL", default=None,
              help="Measured GPU time from dcgm-exporter series (pushdown, hourly).")
@click.option("--by", "by", multiple=True, metavar="KEY",
              help="Split by team, project, user, namespace or any label (comma-separate; "
              "default team).")
@click.option("--method", type=click.Choice(["allocation", "usage"]), default="allocation",
              show_default=True, help="allocation: who held the GPU pays; usage: who kept it "
              "busy pays, idle time goes to the idle line.")
@click.option("--format", "formats", multiple=True, metavar="FORMAT",
              help="Bill format (focus, cur, gcp; default: detected) and/or report format "
              "(terminal, json, markdown, html, csv, parquet). Repeat for both.")
@click.option("-o", "--output", type=OutputFile(), default=None,
              help="Write the report here instead of stdout (its folder must exist).")
@click.option("--cost", type=click.Choice(["billed", "effective", "list"]), default="billed",
              show_default=True, help="Which cost to split: the invoice (BilledCost), the "
              "amortized EffectiveCost, or ListCost.")
@click.option("--budgets", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Monthly budgets per team (TOML, docs/billing.md).")
@click.option("--map-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="namespace/label -> team mapping (docs/fleet.md), as the fleet "
              "audit applies it.")
@click.option("--match", "match", multiple=True, metavar="LABEL=VALUE",
              help="Only series with this label value (with --prometheus).")
@click.option("--step", "step_s", type=Duration(FLEET_STEP_S), default=None,
              help="Scrape interval (with --prometheus; default 60s).")
@click.option("--host-alias", "host_alias", multiple=True, metavar="HOST=RESOURCE_ID",
              help="Telemetry host HOST is the bill's resource RESOURCE_ID (when the names "
              "differ, e.g. a Kubernetes node name and an EC2 instance id).")
@click.option("--catalog", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Your own prices (TOML) for models the bill does not price.")
@click.option("--workers", type=Number(WORKERS), default=None,
              help="Processes for a large recording.")
@click.option("--sql-out", "sql_out", type=OutputDir(),
              default=None, help="Also write the join's inputs (Parquet), their DDL, its SQL "
              "and a README here, to run the same query in Spark, Athena/Trino or BigQuery "
              "(docs/billing.md).")
@click.option("--dialect", "dialect", type=click.Choice(["duckdb", "spark", "trino", "bigquery"]),
              default="duckdb", show_default=True, help="The SQL dialect --sql-out writes.")
@click.option("--engine", "engine", type=click.Choice(["duckdb", "spark"]), default="duckdb",
              show_default=True, help="Where the join runs: DuckDB in-process, or a Spark "
              "session (pip install 'gpuaudit[spark]'; the active session or local mode).")
@click.option("--spark-master", "spark_master", metavar="URL", default=None,
              help="With --engine spark: the Spark master to run the join on (yarn, "
              "spark://HOST:7077, k8s://..., or local[N]; default local[2]).")
@click.option("--spark-conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
              help="With --engine spark: a Spark setting for the session (repeatable), e.g. "
              "spark.driver.memory=8g.")
@click.option("--timeline/--no-timeline", default=None,
              help="Fold the per-GPU utilization timeline into the report (default: for "
              "terminal, markdown and html; json, csv and parquet skip it).")
@click.option("--memory-limit", "memory_limit", default=None,
              type=Parsed("gpuaudit.limits:parse_memory_limit", "SIZE"),
              help="Most memory DuckDB holds for the bill (e.g. 4GB; default 80% of the "
              "memory available); past it, it spills to disk.")
def bill_cmd(bill_path: Path, telemetry: Path | None, prometheus: str | None,
             by: tuple[str, ...], method: str, formats: tuple[str, ...], output: Path | None,
             cost: str, budgets: Path | None, map_file: Path | None, match: tuple[str, ...],
             step_s: float | None, host_alias: tuple[str, ...], catalog: Path | None,
             workers: int | None, sql_out: Path | None, dialect: str, engine: str,
             spark_master: str | None, spark_conf: tuple[str, ...],
             timeline: bool | None, memory_limit: int | None) -> None:
    """Split a cloud bill over the GPU time measured, by team, reconciled to the cent."""
    from gpuaudit._heap import arrow_on_heap

    arrow_on_heap()  # before pyarrow is imported, here and in the worker (see gpuaudit._heap)
    if telemetry is not None and workers != 1:
        # a large telemetry recording is classified on two cores: its worker imports beside
        # this process's imports and the bill's read, not after them (gpuaudit._workers)
        from gpuaudit._workers import prestart

        prestart(telemetry)
    from gpuaudit.api import bill
    from gpuaudit.cli.fleet import _matchers

    in_fmt, out_fmt = _formats(formats)
    if dialect != "duckdb" and sql_out is None:
        raise InputError(f"--dialect {dialect} says how --sql-out writes the SQL",
                         fix=f"add --sql-out DIR (gpuaudit bill ... --sql-out sql/ "
                         f"--dialect {dialect})")
    if out_fmt == "parquet" and output is None:
        raise InputError("--format parquet needs -o FILE", fix="add -o showback.parquet")
    if out_fmt == "parquet" and str(output) == "-":
        raise InputError("a Parquet showback is binary and cannot go to stdout (-o -)",
                         fix="give a file path, e.g. -o showback.parquet, or --format csv "
                         "-o - for the same table as text")
    aliases: dict[str, str] = {}
    for item in host_alias:
        h, sep, r = item.partition("=")
        if not sep or not h or not r:
            raise InputError(f"cannot read --host-alias {item!r}", fix="write HOST=RESOURCE_ID")
        aliases[h.strip()] = r.strip()
    groups = tuple(k.strip() for item in by for k in item.split(",") if k.strip())
    if (spark_master is not None or spark_conf) and engine != "spark":
        raise InputError("--spark-master and --spark-conf set up the Spark session of "
                         "--engine spark", fix="add --engine spark")
    settings: dict[str, str] = {}
    for item in spark_conf:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise InputError(f"cannot read --spark-conf {item!r}",
                             fix="write KEY=VALUE, e.g. spark.driver.memory=8g")
        settings[k.strip()] = v.strip()
    from gpuaudit.report.progress import progress

    with progress(f"splitting {bill_path.name} over the measured GPU time"):
        result = bill(bill_path, telemetry=telemetry, prometheus=prometheus,
                      by=groups or ("team",), method=method, fmt=in_fmt, cost=cost,
                      budgets=budgets, map_file=map_file, matchers=_matchers(match),
                      step_s=step_s, host_aliases=aliases,
                      catalog=catalog, workers=workers, sql_dir=sql_out,
                      sql_dialect=dialect, engine=engine, spark_master=spark_master,
                      spark_conf=settings or None, memory_limit=memory_limit,
                      timeline=timeline if timeline is not None
                      else out_fmt in ("terminal", "markdown", "html"))
    emit_bill(result, out_fmt, output)


def _formats(values: tuple[str, ...]) -> tuple[str | None, str]:
    in_fmt: str | None = None
    out_fmt: str | None = None
    for v in values:
        if v in INPUT_FORMATS or v in OUTPUT_FORMATS:
            kind = "bill" if v in INPUT_FORMATS else "report"
            had = in_fmt if v in INPUT_FORMATS else out_fmt
            if had is not None and had != v:
                raise InputError(
                    f"--format given two {kind} formats ({had}, {v}): give one",
                    fix=f"at most one {kind} format and one of the other kind "
                    "(--format cur --format json); run the command once per report format")
            if v in INPUT_FORMATS:
                in_fmt = v
            else:
                out_fmt = v
        else:
            raise InputError(f"unknown --format {v!r}",
                             fix=f"bill formats: {', '.join(INPUT_FORMATS)}; report formats: "
                             f"{', '.join(OUTPUT_FORMATS)}")
    return in_fmt, out_fmt or "terminal"


def emit_bill(result: Any, fmt: str, output: Path | None) -> None:
    """The bill section first, then the audit of the measured time at the bill's rates."""
    import sys

    from gpuaudit.report.bill import render_bill, showback_csv, write_showback_parquet

    if fmt == "csv":
        write_output(showback_csv(result.showback), output, "showback CSV")
        return
    if fmt == "parquet":
        assert output is not None
        write_showback_parquet(result.showback, output)
        click.echo(f"wrote showback Parquet to {output}", err=True)
        return
    from gpuaudit.cli.console import use_color

    tty = (output is None or str(output) == "-") and use_color(sys.stdout)
    if fmt in ("terminal", "markdown"):
        text = render_bill(result.extra["bill"], fmt) + "\n" + result.render(
            fmt, width=100, color=tty)
    else:
        text = result.render(fmt, width=100, color=False)
    write_output(text, output, f"{fmt} report")
