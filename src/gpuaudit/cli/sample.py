"""``gpuaudit sample``: record the GPUs of this machine for a while, no workload attached.

::

    gpuaudit sample --duration 60 -o idle-box.parquet

Ctrl-C (or SIGTERM) ends the recording early; it is finalised either way. Without an NVIDIA
driver or GPU this is an error (exit 2), since sampling is all the command does.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

import click

from gpuaudit.cli.params import Number, OutputFile
from gpuaudit.cli.run import default_output, output_mode_option, parse_labels
from gpuaudit.validate import FLUSH_S, HZ, LIVE_DURATION_S

__all__ = ["sample_cmd"]


@click.command("sample")
@click.option("--duration", type=Number(LIVE_DURATION_S), default=None,
              help="seconds to record (default: until Ctrl-C)")
@click.option("--hz", type=Number(HZ), default=10.0,
              show_default=True, help="samples per second")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="attribution label on every sample (repeatable)")
@click.option("-o", "--output", type=OutputFile(), default=None,
              help="recording path (Parquet); default gpuaudit-sample-<UTC time>.parquet")
@click.option("--flush-s", type=Number(FLUSH_S), default=5.0, show_default=True,
              help="seconds between journal flushes: at most this much is lost if killed")
@click.option("--process/--no-process", "process", default=None,
              help="sample in a separate process (default: at --hz 50 and above)")
@output_mode_option
def sample_cmd(duration: float | None, hz: float, labels: tuple[str, ...],
               output: Path | None, flush_s: float, process: bool | None,
               output_mode: str) -> None:
    """Record every visible GPU to a Parquet recording."""
    from gpuaudit.measure.live.nvml import NvmlBackend
    from gpuaudit.measure.live.sampler import Sampler

    out = str(output) if output else default_output("sample")
    sampler = Sampler(NvmlBackend(), interval_s=1.0 / hz, labels=parse_labels(labels),
                      output=out, flush_s=flush_s, process=process, output_mode=output_mode,
                      origin="live NVML sampling by gpuaudit sample")
    sampler.start()  # SourceUnavailableError -> "error: ..." and exit 2
    done = threading.Event()

    def finish(signum: int, frame: FrameType | None) -> None:
        done.set()

    previous = {s: signal.signal(s, finish) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        click.echo(f"gpuaudit: sampling {len(sampler.devices)} device(s) at {hz:g} Hz to "
                   f"{out}" + (f" for {duration:g} s" if duration else "; Ctrl-C to stop"),
                   err=True)
        done.wait(duration)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        recording = sampler.stop()
    stats = sampler.stats()
    click.echo(f"gpuaudit: wrote {recording.table.num_rows} samples ({stats.ticks} ticks, "
               f"{stats.rate_hz:.1f} Hz, {stats.missed} missed) to {out}", err=True)
    for event in recording.events:
        click.echo(f"gpuaudit: event: {event}", err=True)
