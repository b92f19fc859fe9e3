"""``gpuaudit audit``: the main job. Live on this machine's NVIDIA GPUs when there are any,
otherwise on the bundled real recording, and it always says which."""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any

import click

from gpuaudit.cli.options import emit, output_options, pricing_kwargs, pricing_options
from gpuaudit.cli.params import Number, OutputFile
from gpuaudit.validate import HZ, LIVE_DURATION_S

DEMO = "nanogpt_8xh100.parquet"


def demo_path() -> Path:
    """Path of the bundled real recording (see gpuaudit/data/README.md)."""
    return Path(str(resources.files("gpuaudit").joinpath("data").joinpath(DEMO)))


@click.command("audit")
@click.option("--duration", type=Number(LIVE_DURATION_S), default=30.0, show_default=True,
              help="Seconds to sample live GPUs.")
@click.option("--hz", type=Number(HZ), default=10.0, show_default=True,
              help="Live sampling rate (samples per second).")
@click.option("--demo", is_flag=True, help="Audit the bundled real recording even if a GPU is "
              "present.")
@click.option("-r", "--record", type=OutputFile(), default=None,
              help="Also keep the live recording here (Parquet).")
@pricing_options
@output_options
def audit_cmd(duration: float, hz: float, demo: bool, record: Path | None, fmt: str,
              output: Path | None, **kw: Any) -> None:
    """Audit this machine's GPUs live, or the bundled real recording if it has none."""
    from gpuaudit.api import audit
    from gpuaudit.errors import SourceUnavailableError

    pricing = pricing_kwargs(kw)
    recording = None
    why = "--demo given"
    if not demo:
        try:
            recording = _sample_live(duration, hz, record)
        except SourceUnavailableError as exc:
            why = str(exc).splitlines()[0]
    if recording is not None:
        click.echo(f"gpuaudit: audited {len(set(recording.table.column('gpu_uuid').to_pylist()))}"
                   f" live GPU(s) on this machine for {duration:g} s at {hz:g} Hz", err=True)
        result = audit(recording, **pricing)
    else:
        path = demo_path()
        click.echo(f"gpuaudit: no live GPU audit ({why}); auditing the bundled REAL recording "
                   f"{path.name} (nanoGPT training on 8x H100, karpathy/nanoGPT PR #643)",
                   err=True)
        result = audit(path, extra={"demo": demo_notice(why)}, **pricing)
    emit(result, fmt, output)


def demo_notice(why: str) -> dict[str, str]:
    """What every format says when the report is of the bundled recording, not this machine
    (JSON: the top-level ``demo`` object, docs/json-schema.md)."""
    return {
        "recording": DEMO,
        "reason": why,
        "statement": (
            "DEMO: this report is of the bundled real recording (nanoGPT training on 8x H100, "
            "karpathy/nanoGPT PR #643, 2025-09-24), not of this machine's GPUs; no live GPU "
            f"audit was made ({why})"),
    }


def _sample_live(duration: float, hz: float, record: Path | None) -> Any:
    from gpuaudit.measure.live.nvml import NvmlBackend
    from gpuaudit.measure.live.sampler import Sampler

    sampler = Sampler(NvmlBackend(), interval_s=1.0 / hz, output=record)
    sampler.start()
    click.echo(f"gpuaudit: sampling {len(sampler.devices)} GPU(s) for {duration:g} s "
               "(Ctrl-C stops early and reports)", err=True)
    try:
        time.sleep(duration)
    except KeyboardInterrupt:
        pass
    return sampler.stop()
