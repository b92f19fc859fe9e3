"""Options shared by every command that ends in a priced report, and the one way to emit it.

``gpuaudit report``, ``fleet``, ``trace`` and ``run`` all take the same pricing flags
(``--price``, ``--gpu-model``, ``--provider``, ``--purchase``, ``--catalog``) and output
flags (``--format``, ``-o``), so a user learns them once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from gpuaudit.cli.output import write_output
from gpuaudit.cli.params import Money, Number, OutputFile, one_value
from gpuaudit.report import render
from gpuaudit.result import FORMATS, AuditResult
from gpuaudit.validate import ENERGY_USD_PER_KWH, PRICE_USD_PER_GPU_HOUR, count_quantity

__all__ = ["emit", "output_options", "pricing_kwargs", "pricing_options",
           "warn_unmatched_groups"]

F = TypeVar("F", bound=Callable[..., Any])


def pricing_options(f: F) -> F:
    opts = [
        click.option("--price", "price", metavar="USD_PER_GPU_HOUR", default=None,
                     type=Money(PRICE_USD_PER_GPU_HOUR),
                     help="Price of one GPU-hour; overrides every catalog."),
        click.option("--gpu-model", "gpu_model", default=None,
                     help="GPU model to price (e.g. H100, 'A100 80GB SXM'); overrides the "
                     "model the samples name."),
        click.option("--provider", default=None,
                     help="Price list: aws, gcp, azure, coreweave, lambda, runpod "
                     "(default aws) or a provider in --catalog."),
        click.option("--purchase", type=click.Choice(["on-demand", "spot", "committed"]),
                     default="on-demand", show_default=True, help="Purchase option priced."),
        click.option("--catalog", type=click.Path(dir_okay=False, path_type=Path),
                     default=None, help="Your own prices (TOML, see docs/pricing.md)."),
        click.option("--energy-price", "energy_price", metavar="USD_PER_KWH", default=None,
                     type=Money(ENERGY_USD_PER_KWH), help="Price of energy, for the energy line."),
        click.option("--tokens", type=Number(count_quantity("tokens")), default=None,
                     help="Tokens processed (unit cost)."),
        click.option("--samples", "samples_count", type=Number(count_quantity("samples")),
                     default=None, help="Training/inference samples processed (unit cost)."),
        click.option("--epochs", type=Number(count_quantity("epochs")), default=None,
                     help="Epochs run (unit cost)."),
        click.option("--steps", type=Number(count_quantity("steps")), default=None,
                     help="Steps run (unit cost)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def output_options(f: F) -> F:
    f = click.option("-o", "--output", type=OutputFile(), default=None,
                     help="Write the report here instead of stdout ('-': stdout; its folder "
                     "must exist).")(f)
    f = click.option("--format", "fmt", type=click.Choice(list(FORMATS)), multiple=True,
                     default=["terminal"], show_default=True, callback=one_value,
                     help="Report format.")(f)
    return f


def pricing_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    """Pop the pricing options from a command's kwargs into ``gpuaudit.audit`` arguments."""
    counts = {k: v for k, v in (("tokens", kw.pop("tokens", None)),
                                ("samples", kw.pop("samples_count", None)),
                                ("epochs", kw.pop("epochs", None)),
                                ("steps", kw.pop("steps", None))) if v is not None}
    return {
        "price": kw.pop("price", None),
        "gpu_model": kw.pop("gpu_model", None),
        "provider": kw.pop("provider", None),
        "purchase": kw.pop("purchase", "on-demand"),
        "catalog": kw.pop("catalog", None),
        "energy_usd_per_kwh": kw.pop("energy_price", None),
        "counts": counts or None,
    }


def warn_unmatched_groups(result: AuditResult) -> None:
    """A ``--by`` key no sample has (every GPU in one "(none)" group) is said on stderr too,
    not only in the report's data notes, so a piped or saved report cannot hide it."""
    for n in result.usage.notes:
        if n.where == "--by":
            click.echo(f"gpuaudit: warning: {n.reason}", err=True)


def emit(result: AuditResult, fmt: str, output: Path | None) -> None:
    """Render ``result`` and write it to ``output`` or stdout (terminal colour when a tty)."""
    warn_unmatched_groups(result)
    if output is not None and str(output) != "-":
        write_output(render(result, fmt, width=100, color=False), output, f"{fmt} report")
        return
    tty = sys.stdout.isatty()
    import shutil

    from gpuaudit.cli.console import use_color

    width = shutil.get_terminal_size((100, 40)).columns if tty else 100
    colored = use_color(sys.stdout)
    # color=: click would strip the escapes from a pipe even under --color always
    click.echo(render(result, fmt, width=max(80, min(width, 140)), color=colored), nl=False,
               color=colored)
