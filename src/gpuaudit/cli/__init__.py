"""The ``gpuaudit`` command line: a thin composition of the pipeline stages.

Each subcommand lives in its own module under ``gpuaudit.cli`` and is imported only when it
runs, so ``gpuaudit --help`` stays fast and a heavy dependency of one command never slows
another. Errors the user can act on (:class:`gpuaudit.errors.GpuauditError`) print
``error: ...`` on stderr and exit 2.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

import click

from gpuaudit import __version__

# command name -> "module:attribute" (module relative to gpuaudit.cli)
COMMANDS: dict[str, str] = {
    "audit": "audit:audit_cmd",
    "bill": "bill:bill_cmd",
    "report": "report:report_cmd",
    "trace": "trace:trace_cmd",
    "run": "run:run_cmd",
    "sample": "sample:sample_cmd",
    "scrape": "scrape:scrape_cmd",
    "fleet": "fleet:fleet_cmd",
    "grafana": "grafana:grafana_cmd",
    "alerts": "alerts:alerts_cmd",
    "exporter": "exporter:exporter_cmd",
    "rightsize": "capacity:rightsize_cmd",
    "simulate": "capacity:simulate_cmd",
    "queue": "capacity:queue_cmd",
}


# command name -> its help's first paragraph, so `gpuaudit --help` lists the commands without
# importing them (and numpy, pyarrow, the pipeline behind them); tests/cli/test_cli_help.py
# keeps this equal to each command's own help
SUMMARIES: dict[str, str] = {
    "alerts": "Write Prometheus alerting rules (YAML) for GPU waste, GPU health and budgets.",
    "audit": "Audit this machine's GPUs live, or the bundled real recording if it has none.",
    "bill": "Split a cloud bill over the GPU time measured, by team, reconciled to the cent.",
    "exporter": "Serve gpuaudit's cost, waste and phase time as Prometheus metrics.",
    "fleet": "Fleet audit from dcgm-exporter series in Prometheus, attributed to teams.",
    "grafana": "Write a Grafana dashboard over dcgm-exporter and gpuaudit exporter series.",
    "queue": "Wait times of pods pending for nvidia.com/gpu, beside the GPU-hours idle "
             "meanwhile; the idle capacity while pods waited goes to the recommender as a "
             "scheduling finding.",
    "report": "Audit PATH: a gpuaudit Parquet recording, an nvidia-smi CSV log, or any "
              "CSV/JSONL.",
    "rightsize": "The cheapest GPU, provider and purchase option that meets the measured "
                 "need.",
    "run": "Run COMMAND while sampling its GPUs; exit with COMMAND's exit code.",
    "sample": "Record every visible GPU to a Parquet recording.",
    "scrape": "Record dcgm-exporter endpoints (http://node:9400/metrics ...) into a recording.",
    "simulate": "Replay the history packed by MIG, MPS or time-slicing: GPUs needed, risk, "
                "dollars.",
    "trace": "Audit PyTorch profiler traces (a directory of rank traces, .json/.json.gz) or an "
             "nsys cuda_gpu_kern_sum CSV: busy/idle and its causes, kernel classes, overlap, "
             "input stalls, tensor-core use, what it costs and what to change.",
}


class _LazyGroup(click.Group):
    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        # standalone (``cli()``, click's CliRunner): the same error handling as ``main``
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        sys.exit(run_argv(args, prog_name or "gpuaudit"))

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click would import every command for its one-line help; the table has it
        rows = []
        limit = formatter.width - 6 - max(len(n) for n in COMMANDS)
        for name in self.list_commands(ctx):
            text = SUMMARIES.get(name)
            if text is None:  # a command without a summary: ask it (imports it)
                cmd = self.get_command(ctx, name)
                text = cmd.get_short_help_str(limit) if cmd is not None else ""
            # a stand-in command shortens it exactly as click shortens the real one's
            rows.append((name, click.Command(name, help=text).get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        from gpuaudit._heap import loading_code

        with loading_code():
            module = importlib.import_module(f"gpuaudit.cli.{module_name}")
        command: click.Command = getattr(module, attr)
        names = {p.name for p in command.params}
        if cmd_name in READS_FILES and "max_input_bytes" not in names:
            command.params.append(_max_input_option())
        if "quiet" not in names:  # after the command too: gpuaudit report ... -q
            from gpuaudit.cli.console import common_options

            command.params.extend(common_options())
        return command


#: commands that read user files: each takes --max-input-bytes (gpuaudit.limits)
READS_FILES = ("audit", "bill", "report", "trace", "rightsize", "simulate", "exporter",
               "fleet")


def _max_input_option() -> click.Option:
    from gpuaudit.cli.params import Parsed

    def apply(ctx: click.Context, param: click.Parameter, value: int | None) -> None:
        if value is None:
            return
        import os

        from gpuaudit.limits import MAX_INPUT_BYTES_ENV

        # the environment carries it to the worker processes a large file is read by
        os.environ[MAX_INPUT_BYTES_ENV] = str(value)

    return click.Option(["--max-input-bytes", "max_input_bytes"],
                        type=Parsed("gpuaudit.limits:parse_bytes", "SIZE"),
                        expose_value=False, is_eager=True, callback=apply,
                        help="Most bytes one compressed input (.gz, .zst, ...) may inflate "
                        "to (default 2GiB; also GPUAUDIT_MAX_INPUT_BYTES).")


def _root_options(f: Any) -> Any:
    from gpuaudit.cli.console import common_options

    for opt in common_options():
        f.__click_params__ = [*getattr(f, "__click_params__", []), opt]
    return f


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuaudit")
@_root_options
def cli() -> None:
    """Measure where GPU time goes, price the waste, recommend the fixes."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code. Called with no
    ``argv`` (the process's own command line: the console script, ``python -m gpuaudit``)
    the process is about to end with the command, so its heap is frozen once the command
    is done and the exit skips walking it; a caller passing ``argv`` (a test, a program
    running several command lines) keeps an ordinary, collectable heap."""
    from gpuaudit._heap import keep_freed_memory, own_process, spare_the_exit

    keep_freed_memory()  # this process is ours: see gpuaudit._heap
    if argv is None:
        own_process()  # what the command loads is frozen once loaded (_heap.loading_code)
        one_blas_thread()
    code = run_argv(argv)
    if argv is None:
        spare_the_exit()  # the command is done: exit without walking its heap
    return code


def one_blas_thread() -> None:
    """OpenBLAS (in NumPy's wheels) starts a thread per core as NumPy is imported, and they
    spin a while: ~0.08 s of a core per process, in the command and in each of classify's
    worker processes (which inherit the setting), while both cores load their code. gpuaudit
    multiplies matrices in two places only (the trace's number parsing, the capacity
    profiles' hour-of-day sums: tens of milliseconds at most), so one thread is the better
    trade; a value the user set is kept. Before NumPy is imported, in a process of ours."""
    import os

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def run_argv(argv: Sequence[str] | None = None, prog_name: str = "gpuaudit") -> int:
    """Run one command line and return its exit code: every mistake (ours or click's) prints
    ``error: ...`` on stderr and returns 2, never a traceback."""
    from gpuaudit.cli.console import configure
    from gpuaudit.errors import GpuauditError

    configure(color="auto", verbosity=0)  # each run starts from the defaults
    try:
        rv = cli.main(args=argv, prog_name=prog_name, standalone_mode=False)
        if isinstance(rv, int) and not isinstance(rv, bool):
            return rv  # ctx.exit(code) (e.g. `run` passing on its child's exit code)
    except GpuauditError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:  # click's own usage errors, in our form
        _show_click_error(exc)
        return 2
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except BrokenPipeError:
        return 0
    return 0


def _show_click_error(exc: click.ClickException) -> None:
    """What ``exc.show()`` prints (usage, a help hint), with ``error:`` in lower case as every
    other error of gpuaudit, and exit status 2 for every such mistake."""
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.UsageError) and ctx is not None:
        hint = ""
        if ctx.command.get_help_option(ctx) is not None:
            names = ctx.command.get_help_option_names(ctx)
            hint = f"Try '{ctx.command_path} {max(names, key=len)}' for help.\n"
        click.echo(f"{ctx.get_usage()}\n{hint}", err=True)
    click.echo(f"error: {exc.format_message()}", err=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
