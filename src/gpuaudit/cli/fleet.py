"""``gpuaudit fleet``: audit a GPU fleet from Prometheus (dcgm-exporter series), by team.

Default path: the phase classification is pushed down into Prometheus as PromQL
(:mod:`gpuaudit.classify.pushdown`), so only per-series sums cross the wire. ``--raw`` pulls
the samples with ``query_range`` instead and classifies them here. ``--recording`` audits a
recording made by ``gpuaudit scrape`` the same way. The composition itself is
:func:`gpuaudit.api.audit_fleet` (also for Python callers); this module parses options and
renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from gpuaudit.cli.options import (
    output_options,
    pricing_kwargs,
    pricing_options,
    warn_unmatched_groups,
)
from gpuaudit.cli.output import write_output
from gpuaudit.cli.params import Duration, Number, Time
from gpuaudit.errors import InputError
from gpuaudit.validate import (
    CONCURRENCY,
    FLEET_CHUNK_S,
    FLEET_SHARD_S,
    FLEET_SINCE_S,
    FLEET_STEP_S,
    RETRIES,
    TIMEOUT_S,
    parse_duration_s,
    parse_time_s,
)

__all__ = ["fleet_cmd", "parse_duration_s", "parse_time_s"]

# parse_duration_s and parse_time_s live in gpuaudit.validate; re-exported here for callers
# that imported them from this module

def _matchers(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise InputError(f"cannot read --match {item!r}", fix="write LABEL=VALUE")
        out[k.strip()] = v
    return out


@click.command("fleet")
@click.option("--prometheus", "prometheus", metavar="[NAME=]URL", multiple=True,
              help="Prometheus-compatible base URL (Prometheus, Thanos, Mimir, VictoriaMetrics); "
              "repeat for stores sharded by cluster or region (eu=http://...).")
@click.option("--recording", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Audit a recording from `gpuaudit scrape` instead.")
@click.option("--since", "since_s", type=Duration(FLEET_SINCE_S), default="7d",
              show_default=True, help="Range ending now (or --end).")
@click.option("--start", "start_s", type=Time(), default=None,
              help="Range start (ISO 8601 or epoch seconds).")
@click.option("--end", "end_s", type=Time(), default=None,
              help="Range end (ISO 8601, epoch seconds or 'now').")
@click.option("--step", "step_s", type=Duration(FLEET_STEP_S), default=None,
              help="Scrape interval of the exporter series (default: detected).")
@click.option("--by", "by", multiple=True, metavar="KEY",
              help="Roll up by team, project, user, namespace, pod or any label "
              "(repeat or comma-separate; default team).")
@click.option("--map-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="TOML mapping namespace/label -> team/project (docs/fleet.md).")
@click.option("--match", "match", multiple=True, metavar="LABEL=VALUE",
              help="Only series with this label value (repeatable), e.g. Hostname=node-1.")
@click.option("--raw", is_flag=True, help="Pull raw samples (query_range) instead of pushdown.")
@click.option("--fetch", type=click.Choice(["pushdown", "raw", "native", "auto"]), default=None,
              help="How samples are read: pushdown (PromQL, the default), raw (query_range, "
              "= --raw), native (raw samples as stored: Prometheus remote read, "
              "VictoriaMetrics native export; classified here), auto (native where every store "
              "answers it, else pushdown).")
@click.option("--chunk", "chunk_s", type=Duration(FLEET_CHUNK_S), default="1d",
              show_default=True, help="Time chunk per query batch.")
@click.option("--time-shard", "shard_s", type=Duration(FLEET_SHARD_S), default="7d",
              show_default=True, help="Time shard: whole chunks fetched together, shards "
              "concurrently.")
@click.option("--concurrency", type=Number(CONCURRENCY), default=4, show_default=True,
              help="Requests in flight per store.")
@click.option("--allow-partial", is_flag=True,
              help="A shard failing after its retries is left out and listed in the report, "
              "and a store's partial answer (a part it could not reach: a Thanos store, a "
              "remote-read endpoint) is kept and noted, instead of an error.")
@click.option("--dedupe", is_flag=True,
              help="A GPU several stores hold (HA replicas) counts once: the store with the "
              "most points per chunk.")
@click.option("--bearer-token-file", type=click.Path(path_type=Path), default=None,
              help="File holding a bearer token (re-read per request).")
@click.option("--bearer-token-env", default=None, metavar="VAR",
              help="Environment variable holding a bearer token.")
@click.option("--basic-auth", default=None, metavar="USER:PASSWORD_ENV",
              help="Basic auth: user name and the environment variable holding the password.")
@click.option("--ca-file", type=click.Path(path_type=Path), default=None,
              help="CA bundle (PEM) to verify the server's certificate.")
@click.option("--timeout", "timeout_s", type=Number(TIMEOUT_S), default=60.0, show_default=True,
              help="Seconds per request.")
@click.option("--retries", type=Number(RETRIES), default=4, show_default=True,
              help="Retries per request (exponential backoff) before giving up.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bars on stderr (default: when stderr is a terminal).")
@pricing_options
@output_options
def fleet_cmd(prometheus: tuple[str, ...], recording: Path | None, since_s: float,
              start_s: float | None, end_s: float | None, step_s: float | None,
              by: tuple[str, ...], map_file: Path | None,
              match: tuple[str, ...], raw: bool, fetch: str | None, chunk_s: float,
              shard_s: float,
              concurrency: int, allow_partial: bool, dedupe: bool,
              bearer_token_file: Path | None,
              bearer_token_env: str | None, basic_auth: str | None, ca_file: Path | None,
              timeout_s: float, retries: int, progress: bool | None, fmt: str,
              output: Path | None, **kw: Any) -> None:
    """Fleet audit from dcgm-exporter series in Prometheus, attributed to teams."""
    import os
    import sys

    if fetch in ("native", "auto"):
        from gpuaudit._heap import one_heap

        one_heap()  # before any thread of this process allocates (see gpuaudit._heap)
    pricing = pricing_kwargs(kw)
    groups = tuple(k.strip() for item in by for k in item.split(",") if k.strip())
    client_kwargs: dict[str, Any] = {"timeout_s": timeout_s, "retries": retries,
                                     "bearer_token_file": bearer_token_file,
                                     "bearer_token_env": bearer_token_env, "ca_file": ca_file}
    if basic_auth:
        user, sep, var = basic_auth.partition(":")
        password = os.environ.get(var) if sep else None
        if not password:
            raise InputError("--basic-auth needs USER:VAR with the password in $VAR",
                             fix="export PROM_PASSWORD=...; --basic-auth me:PROM_PASSWORD")
        client_kwargs["basic_auth"] = (user, password)
    stop = None
    from gpuaudit.cli.console import quiet

    if progress or (progress is None and sys.stderr.isatty() and not quiet()):
        from gpuaudit.report.progress import progress_bars

        hook, stop = progress_bars()
        client_kwargs["progress"] = hook
    try:
        from gpuaudit.api import audit_fleet

        result = audit_fleet(
            prometheus=list(prometheus) or None, recording=recording,
            start_s=start_s, end_s=end_s, since_s=since_s, step_s=step_s,
            by=groups or ("team",), map_file=map_file, matchers=_matchers(match), raw=raw,
            client_kwargs=client_kwargs, chunk_s=chunk_s, pricing=pricing,
            shard_s=shard_s, concurrency=concurrency, allow_partial=allow_partial,
            dedupe=dedupe, fetch=fetch)
    finally:
        if stop is not None:
            stop()
    emit_fleet(result, fmt, output)


def emit_fleet(result: Any, fmt: str, output: Path | None) -> None:
    """The core report plus the fleet section (terminal/Markdown); JSON and HTML carry the
    fleet dict in ``extra.fleet``."""
    import sys

    from gpuaudit.report.fleet import render_fleet

    warn_unmatched_groups(result)
    from gpuaudit.cli.console import use_color

    tty = (output is None or str(output) == "-") and use_color(sys.stdout)
    text = result.render(fmt, width=100, color=tty)
    if fmt in ("terminal", "markdown"):
        text = text.rstrip("\n") + "\n" + render_fleet(result.extra["fleet"], fmt)
    write_output(text, output, f"{fmt} report")
