"""``gpuaudit scrape URL...``: record dcgm-exporter ``/metrics`` endpoints into a recording.

Each tick GETs every endpoint (in parallel, httpx), parses the text exposition format
(:func:`gpuaudit.measure.fleet.dcgm.parse_metrics_text`) and appends the rows to a crash-safe
journal (:class:`gpuaudit.measure.live.recorder.Recorder`); the Parquet recording is written when
``--duration`` ends or on Ctrl-C. An endpoint that fails on a tick is an event in the
recording (its GPUs' time is unobserved), not the end of the recording; if every endpoint
fails on the first tick the command stops with the error.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from gpuaudit.cli.params import Duration, Number, OutputFile
from gpuaudit.cli.run import output_mode_option
from gpuaudit.validate import SCRAPE_DURATION_S, SCRAPE_EVERY_S, TIMEOUT_S

__all__ = ["SCRAPE_CONCURRENCY", "scrape_cmd", "scrape_to_recording"]

#: endpoints scraped at once (each tick reads every endpoint, this many at a time)
SCRAPE_CONCURRENCY = 16


def scrape_to_recording(urls: list[str], output: Path, *, every_s: float, duration_s: float,
                        timeout_s: float = 10.0, clock: object = time,
                        mode: str = "create") -> int:
    """Scrape ``urls`` every ``every_s`` for ``duration_s`` into ``output``; returns rows
    written. Ctrl-C finishes the recording cleanly."""
    import httpx

    from gpuaudit.errors import GpuauditError
    from gpuaudit.measure.fleet.dcgm import scrape_once
    from gpuaudit.measure.live.recorder import Extras, Recorder

    t_start = time.time()
    rec = Recorder(output, interval_s=every_s, origin=f"dcgm-exporter {', '.join(urls)}",
                   source="dcgm-exporter", host=None, start_ns=int(t_start * 1e9), mode=mode)
    extras = Extras()
    seen_notes: set[str] = set()
    ticks = 0
    mono0 = time.monotonic()
    from concurrent.futures import ThreadPoolExecutor

    def one(client: httpx.Client, url: str, ts_ns: int) -> Any:
        try:
            return scrape_once([url], client=client, ts_ns=ts_ns)
        except GpuauditError as exc:
            return exc

    try:
        # every endpoint of a tick at once (bounded): a slow node delays no other node's
        # sample, and a tick lasts as long as its slowest endpoint, not their sum
        with httpx.Client(timeout=timeout_s, limits=httpx.Limits(
                max_connections=SCRAPE_CONCURRENCY)) as client, \
                ThreadPoolExecutor(max_workers=min(SCRAPE_CONCURRENCY, len(urls))) as pool:
            while True:
                now_ns = time.time_ns()
                tables = []
                answers = list(pool.map(one, [client] * len(urls), urls, [now_ns] * len(urls)))
                for url, answer in zip(urls, answers):
                    try:
                        if isinstance(answer, GpuauditError):
                            raise answer
                        table, notes = answer
                    except GpuauditError as exc:
                        if ticks == 0 and len(urls) == 1:
                            raise
                        extras.events.append(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
                                             f" {url} unavailable: {exc.what}")
                        continue
                    tables.append(table)
                    for n in notes:
                        if n.reason not in seen_notes:
                            seen_notes.add(n.reason)
                            extras.notes.append(f"{n.where}: {n.reason}")
                if ticks == 0 and not tables:
                    from gpuaudit.errors import SourceUnavailableError

                    raise SourceUnavailableError("no endpoint answered on the first scrape",
                                                 where=", ".join(urls),
                                                 fix="check the URLs (http://<node>:9400/metrics)")
                for t in tables:
                    for batch in t.to_batches():
                        rec.write(batch)
                rec.write(None, extras)
                ticks += 1
                if ticks * every_s >= duration_s - 1e-9:
                    break
                next_t = mono0 + ticks * every_s
                time.sleep(max(0.0, next_t - time.monotonic()))
    except KeyboardInterrupt:
        extras.events.append("stopped by Ctrl-C")
    except BaseException:
        rec.close(extras)
        raise
    extras.sampler = {"ticks": ticks, "every_s": every_s}
    rec.close(extras)
    return rec.rows


@click.command("scrape")
@click.argument("urls", nargs=-1, required=True)
@click.option("--every", "every_s", type=Duration(SCRAPE_EVERY_S), default="15s",
              show_default=True, help="Scrape interval.")
@click.option("--duration", "duration_s", type=Duration(SCRAPE_DURATION_S), default="10m",
              show_default=True, help="How long to record.")
@click.option("-o", "--output", type=OutputFile(), required=True,
              help="Recording to write (Parquet).")
@click.option("--timeout", "timeout_s", type=Number(TIMEOUT_S), default=10.0, show_default=True,
              help="Seconds per request.")
@output_mode_option
def scrape_cmd(urls: tuple[str, ...], every_s: float, duration_s: float, output: Path,
               timeout_s: float, output_mode: str) -> None:
    """Record dcgm-exporter endpoints (http://node:9400/metrics ...) into a recording."""
    rows = scrape_to_recording(list(urls), output, every_s=every_s, duration_s=duration_s,
                               timeout_s=timeout_s, mode=output_mode)
    click.echo(f"wrote {rows} sample rows to {output}", err=True)
