"""``gpuaudit exporter``: serve cost and waste as Prometheus metrics.

::

    gpuaudit exporter --source run.parquet --by namespace,team     # a recording, audited once
    gpuaudit exporter --live --interval 1 --refresh 15              # this machine's GPUs (NVML)

Binds 127.0.0.1:9402 unless ``--listen`` says otherwise. Metrics: see
:mod:`gpuaudit.integrate.exporter` and docs/dashboards-and-alerts.md.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import click

from gpuaudit.cli.options import pricing_kwargs, pricing_options
from gpuaudit.cli.params import Number
from gpuaudit.validate import EXPORTER_INTERVAL_S, EXPORTER_REFRESH_S, LIVE_DURATION_S

__all__ = ["exporter_cmd"]


@click.command("exporter")
@click.option("--listen", default="127.0.0.1:9402", show_default=True, metavar="HOST:PORT",
              help="Address to serve /metrics on (0.0.0.0:9402 to expose it beyond this host).")
@click.option("--source", "source", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="A recording or log file to audit and export.")
@click.option("--live", is_flag=True, help="Sample this machine's GPUs with NVML and export "
              "the running totals.")
@click.option("--by", "by", multiple=True, default=("namespace", "team"), show_default=True,
              metavar="KEY", help="Labels besides gpu/host/gpu_model: pod, namespace, container "
              "or any label key (repeat or comma-separate).")
@click.option("--interval", "interval_s", type=Number(EXPORTER_INTERVAL_S), default=1.0,
              show_default=True, help="--live: seconds between samples.")
@click.option("--refresh", "refresh_s", type=Number(EXPORTER_REFRESH_S), default=15.0,
              show_default=True, help="--live: seconds between audits of the new samples.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="--live: attribution label on every sample (team=vision).")
@click.option("--web.config.file", "web_config", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Prometheus' web configuration (TLS, basic auth users).")
@click.option("--duration", type=Number(LIVE_DURATION_S), default=None,
              help="Stop after this many seconds (default: until Ctrl-C).")
@pricing_options
def exporter_cmd(listen: str, source: Path | None, live: bool, by: tuple[str, ...],
                 interval_s: float, refresh_s: float, labels: tuple[str, ...],
                 web_config: Path | None, duration: float | None, **kw: Any) -> None:
    """Serve gpuaudit's cost, waste and phase time as Prometheus metrics."""
    from gpuaudit.errors import InputError
    from gpuaudit.integrate.exporter import (
        ExporterState,
        LiveFeed,
        audit_into,
        parse_listen,
        serve,
        source_path,
    )

    if (source is None) == (not live):
        raise InputError("give exactly one of --source FILE or --live", where="exporter",
                         fix="gpuaudit exporter --source run.parquet, or --live on a GPU host")
    host, port = parse_listen(listen)
    groups = tuple(k for item in by for k in item.split(",") if k.strip())
    state = ExporterState(groups)
    # bind first: a port in use or a host that does not resolve fails before any audit
    from gpuaudit.integrate.webconfig import load_web_config

    web = load_web_config(web_config) if web_config is not None else None
    server = serve(state, host, port, start=False, web=web)
    audit_kw = pricing_kwargs(kw)
    feed: LiveFeed | None = None
    sampler: Any = None
    if source is not None:
        audit_into(state, source_path(source), extra={"timeline": None}, **audit_kw)
    else:
        from gpuaudit.cli.run import parse_labels
        from gpuaudit.measure.live.nvml import NvmlBackend
        from gpuaudit.measure.live.sampler import Sampler

        sampler = Sampler(NvmlBackend(), interval_s=interval_s, labels=parse_labels(labels),
                          flush_s=refresh_s, origin="live NVML sampling by gpuaudit exporter")
        sampler.start()  # SourceUnavailableError -> "error: ..." and exit 2
        feed = LiveFeed(sampler, state, refresh_s=refresh_s, audit_kw=audit_kw).start()
    server.start()
    bound = server.server_address
    scheme = "https" if web is not None and web.tls is not None else "http"
    click.echo(f"gpuaudit: exporting on {scheme}://{host}:{bound[1]}/metrics "
               f"({len(state.totals)} series sets); Ctrl-C to stop", err=True)
    done = threading.Event()

    def finish(signum: int, frame: FrameType | None) -> None:
        done.set()

    previous = {s: signal.signal(s, finish) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        done.wait(duration)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        server.shutdown()
        server.server_close()
        if feed is not None:
            feed.stop()
        if sampler is not None:
            sampler.stop()
