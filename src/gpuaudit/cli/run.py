"""``gpuaudit run -- CMD``: run a workload while sampling the GPUs it can see.

Returns the child's exit code (128 + N when a signal N killed it, as a shell does),
forwards SIGTERM, SIGHUP and SIGINT to it, finalises the recording and prints the report on
stderr when it ends. Without an NVIDIA driver or GPU the command still runs; stderr says
plainly that nothing was sampled and why.

SIGINT: a Ctrl-C at a terminal already reaches the whole foreground process group, child
included, so it is forwarded only when gpuaudit is not the terminal's foreground job (e.g. a
scheduler sending ``kill -INT`` to gpuaudit alone); a second copy would interrupt the
child's own cleanup.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

import click

from gpuaudit.cli.options import (
    emit,
    output_options,
    pricing_kwargs,
    pricing_options,
    warn_unmatched_groups,
)
from gpuaudit.cli.params import Number, OutputFile
from gpuaudit.errors import InputError, SourceUnavailableError
from gpuaudit.validate import FLUSH_S, HZ

__all__ = ["parse_labels", "run_cmd", "run_workload"]

_FORWARD = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

def parse_labels(values: Sequence[str]) -> dict[str, str]:
    """``["team=vision", "project=resnet"]`` -> dict; a value may contain '='."""
    out: dict[str, str] = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key.strip():
            raise InputError(f"label {v!r} is not key=value", where="--label",
                             fix="write labels as --label team=vision")
        out[key.strip()] = value.strip()
    return out


def default_output(kind: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"gpuaudit-{kind}-{stamp}.parquet"


def _terminal_foreground() -> bool:
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
    return False


def output_mode_option(f: Any) -> Any:
    """``--force`` / ``--append``: what to do with an output that already holds a recording
    (default: refuse it, leaving it untouched). The command receives ``output_mode``."""
    import functools

    @click.option("--append", is_flag=True,
                  help="continue the recording already at the output path (a finished one, "
                  "or a killed run's journal)")
    @click.option("--force", is_flag=True,
                  help="replace a recording already at the output path")
    @functools.wraps(f)
    def wrapper(*args: Any, force: bool, append: bool, **kwargs: Any) -> Any:
        if force and append:
            raise InputError("--force and --append contradict each other",
                             fix="--append continues the recording, --force replaces it: "
                             "give one")
        mode = "force" if force else "append" if append else "create"
        return f(*args, output_mode=mode, **kwargs)

    return wrapper


def run_workload(
    command: Sequence[str],
    *,
    hz: float = 10.0,
    labels: dict[str, str] | None = None,
    output: str | None = None,
    backend: Any = None,
    flush_s: float = 5.0,
    echo: Any = None,
    process: bool | None = None,
    env: dict[str, str] | None = None,
    output_mode: str = "create",
    cpu: Any = None,
) -> tuple[int, Any, str | None]:
    """Run ``command`` under the sampler; return (exit code, Recording or None, why-not).

    ``why-not`` is set when nothing was sampled. ``process``: sample in a separate process
    (True), in a thread of this one (False), or choose by rate (None: process at >= 50 Hz).
    ``env``: variables added to the child's environment (a tracker's run id).
    ``cpu``: the CPU reader (None: psutil; False: no CPU columns), see measure/live/cpu.py.
    """
    from gpuaudit.measure.live.nvml import NvmlBackend
    from gpuaudit.measure.live.sampler import Sampler

    say = echo or (lambda text: click.echo(text, err=True))
    out_path = output or default_output("run")
    # the child sees the same CUDA_VISIBLE_DEVICES as we read it from
    backend = backend if backend is not None else NvmlBackend()
    sampler: Sampler | None = Sampler(
        backend, interval_s=1.0 / hz, labels=labels or {}, output=out_path, flush_s=flush_s,
        process=process, origin=f"live NVML sampling by gpuaudit run -- {' '.join(command)}",
        output_mode=output_mode,
        # the workload's process tree is this process's descendants (the command started
        # below, its workers); a separate sampling process leaves itself out
        cpu=cpu, cpu_pid=os.getpid(),
    )
    unavailable: str | None = None
    try:
        assert sampler is not None
        sampler.start()
    except SourceUnavailableError as exc:
        unavailable = str(exc).replace("\n", " ")
        say(f"gpuaudit: nothing will be sampled: {unavailable}; running the command anyway")
        sampler = None
    except InputError:  # the user's mistake (an output already recorded to): before the job
        raise
    except Exception as exc:  # measurement must never stop the job
        unavailable = f"the sampler failed to start: {type(exc).__name__}: {exc}"
        say(f"gpuaudit: nothing will be sampled: {unavailable}; running the command anyway")
        sampler = None

    forward_int = not _terminal_foreground()
    started: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and not forward_int:
            return
        if not started:  # arrived while the child was being started: send it once it is
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            started[0].send_signal(signum)

    # installed before the child starts, so a signal can never find the default action
    previous = {s: signal.signal(s, forward) for s in _FORWARD}
    try:
        try:
            child = subprocess.Popen(list(command),
                                     env={**os.environ, **env} if env else None)
        except OSError as exc:
            say(f"error: cannot run {command[0]!r}: {exc.strerror or exc}\n"
                "  fix: check the command name and PATH")
            if sampler is not None:
                sampler.stop()
            return 127, None, "the command could not be started"  # as a shell does
        started.append(child)
        for signum in pending:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)
        code = child.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if code < 0:
        code = 128 - code
    recording = None
    if sampler is not None:
        t0 = time.monotonic()
        recording = sampler.stop()
        say(f"gpuaudit: recorded {recording.table.num_rows} samples of "
            f"{len(sampler.devices)} device(s) to {out_path} "
            f"(finalised in {time.monotonic() - t0:.1f} s)")
        for event in recording.events:
            say(f"gpuaudit: event: {event}")
        if recording.table.num_rows == 0:
            unavailable = "the command ended before the first sample"
    return code, recording, unavailable


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--hz", type=Number(HZ), default=10.0,
              show_default=True, help="samples per second")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="attribution label on every sample (repeatable)")
@click.option("-r", "--record", "record", type=OutputFile(), default=None,
              help="recording path (Parquet); default gpuaudit-run-<UTC time>.parquet")
@click.option("--flush-s", type=Number(FLUSH_S), default=5.0, show_default=True,
              help="seconds between journal flushes: at most this much is lost if killed")
@output_mode_option
@click.option("--no-report", is_flag=True, help="record only; print no report")
@click.option("--process/--no-process", "process", default=None,
              help="sample in a separate process (default: at --hz 50 and above)")
@click.option("--mlflow", "to_mlflow", is_flag=True,
              help="log the audit to the MLflow run (active, MLFLOW_RUN_ID, or a new one); "
              "needs gpuaudit[mlflow]")
@click.option("--wandb", "to_wandb", is_flag=True,
              help="log the audit to the W&B run the command uses (WANDB_RUN_ID or a new "
              "one; offline mode works); needs gpuaudit[wandb]")
@pricing_options
@output_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run_cmd(ctx: click.Context, /, hz: float, labels: tuple[str, ...], record: Path | None,
            flush_s: float, no_report: bool, process: bool | None, to_mlflow: bool,
            to_wandb: bool, command: tuple[str, ...], output_mode: str,
            **opts: Any) -> None:
    """Run COMMAND while sampling its GPUs; exit with COMMAND's exit code.

    \b
    gpuaudit run --hz 10 --label team=vision -- python train.py
    gpuaudit run --mlflow --label team=vision -- python train.py
    gpuaudit run --wandb -- python train.py
    """
    from gpuaudit.integrate.tracker_runs import begin_trackers, make_trackers

    label_map = parse_labels(labels)
    # a missing extra, or a tracker that cannot be reached: error, exit 2, before the job
    trackers = make_trackers(mlflow=to_mlflow, wandb=to_wandb, child=True)
    env = begin_trackers(trackers)
    record_path = str(record) if record else default_output("run")
    code, recording, unavailable = run_workload(
        command, hz=hz, labels=label_map, output=record_path, flush_s=flush_s,
        process=process, env=env, output_mode=output_mode)
    fmt = opts.pop("fmt", None) or "terminal"
    out = opts.pop("output", None)
    pricing = pricing_kwargs(opts)
    result = None
    if recording is not None and recording.table.num_rows and (trackers or not no_report):
        try:
            result = _audit(recording, pricing)
        except Exception as exc:  # the job's exit code matters more than our report
            click.echo(f"gpuaudit: report failed: {exc}", err=True)
    if not no_report and recording is not None:
        try:
            _report(recording, result, unavailable, fmt, out)
        except Exception as exc:
            click.echo(f"gpuaudit: report failed: {exc}", err=True)
    if trackers:
        _log_trackers(trackers, result, recording, unavailable, label_map, code,
                      record_path if recording is not None else None,
                      counts=pricing.get("counts"))
    ctx.exit(code)


def _audit(recording: Any, pricing: dict[str, Any]) -> Any:
    from gpuaudit.api import audit
    from gpuaudit.monitor import counts_from

    pricing = dict(pricing)
    pricing["counts"] = pricing["counts"] or counts_from(recording)
    return audit(recording, **pricing)


def _log_trackers(trackers: list[Any], result: Any, recording: Any, unavailable: str | None,
                  labels: dict[str, str], code: int, record: str | None, *,
                  counts: dict[str, float] | None = None) -> None:
    """Send the audit (or why there is none) to each tracker, tagged with the exit code;
    the counted work (``--steps``, ``--tokens``, ``--samples``) is sent even with no GPU."""
    from gpuaudit.integrate.tracker_runs import finish_trackers
    from gpuaudit.integrate.trackers import nothing_sampled, summarize

    def say(text: str) -> None:
        click.echo(text, err=True)

    try:
        if result is not None:
            summary = summarize(result, labels=labels, exit_code=code, recording_path=record,
                                samples=recording.table)
        else:
            why = unavailable or "the audit of the recording failed"
            summary = nothing_sampled(why, labels=labels, exit_code=code, counts=counts)
    except Exception as exc:
        say(f"gpuaudit: tracker summary failed: {type(exc).__name__}: {exc}")
        summary = nothing_sampled(f"the tracker summary failed: {exc}", labels=labels,
                                  exit_code=code, counts=counts)
    finish_trackers(trackers, summary, failed=code != 0, say=say)


def _report(recording: Any, result: Any, unavailable: str | None, fmt: str,
            out: Any) -> None:
    """The priced report: terminal text on stderr (the child's stdout stays its own),
    other formats through the shared ``emit`` (stdout or ``-o``)."""
    from gpuaudit.monitor import render_report

    if recording is None or recording.table.num_rows == 0:
        click.echo(render_report(recording, "terminal", unavailable=unavailable), err=True,
                   nl=False)
        return
    if result is None:
        return  # the audit failed and said so
    if out is None and fmt == "terminal":
        warn_unmatched_groups(result)
        click.echo(result.render(fmt, width=100, color=False), err=True, nl=False)
    else:
        emit(result, fmt, out)
