"""``gpuaudit report FILE``: audit a recording or log file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuaudit.cli.options import emit, output_options, pricing_kwargs, pricing_options
from gpuaudit.cli.params import Number, SamplesPath, TimeZone
from gpuaudit.validate import INTERVAL_S, WORKERS


@click.command("report")
@click.argument("path", type=SamplesPath())
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
@click.option("--tz", type=TimeZone(), default="UTC", show_default=True,
              help="Time zone of timestamps written without one (nvidia-smi local time).")
@click.option("--interval", "interval_s", type=Number(INTERVAL_S), default=None,
              help="Nominal sample interval in seconds (default: from the file).")
@click.option("--workers", type=Number(WORKERS), default=None,
              help="Processes for a large gpuaudit recording (row-group ranges, stitched "
              "exactly). Default: one per available core, from 8M rows per process.")
@pricing_options
@output_options
def report_cmd(path: Path, mapping: str | None, fields: str | None, by: tuple[str, ...],
               host: str | None, tz: str, interval_s: float | None, workers: int | None,
               fmt: str, output: Path | None, **kw: Any) -> None:
    """Audit PATH: a gpuaudit Parquet recording, an nvidia-smi CSV log, or any CSV/JSONL."""
    from gpuaudit._heap import arrow_on_heap, loading_code

    arrow_on_heap()  # before pyarrow is imported, here and in the worker (see gpuaudit._heap)
    if workers != 1:  # a large Parquet file's worker imports beside this process's imports
        from gpuaudit._workers import prestart

        prestart(path)
    with loading_code():
        from gpuaudit.api import audit
        from gpuaudit.measure.files import open_samples, parse_mapping
        from gpuaudit.report.progress import progress

    groups = tuple(k for item in by for k in item.split(",") if k.strip())
    pricing = pricing_kwargs(kw)
    source = open_samples(
        path,
        mapping=parse_mapping(mapping) if mapping else None,
        fields=[f.strip() for f in fields.split(",")] if fields else None,
        host=host, gpu_model=pricing["gpu_model"], tz=tz,
    )
    with progress(f"auditing {path.name}", total=source.num_rows, unit="rows") as advance:
        result = audit(_Counting(source, advance), by=groups, interval_s=interval_s,
                       extra={"source_path": str(path)}, workers=workers, **pricing)
    emit(result, fmt, output)


class _Counting:
    """The file's sample source, advancing a progress bar by each batch's rows (first pass).

    Everything classify asks of a file source passes through: the footer's row count and time
    span, and ``split`` for worker ranges. Ranges run side by side and hold equal rows, so the
    first range (read in this process) is wrapped with ``scale`` = the number of ranges and
    advances the bar by its rows times that.
    """

    rereadable = True

    def __init__(self, source: Any, advance: Any, scale: int = 1) -> None:
        self._source = source
        self._advance = advance
        self._scale = scale
        self._passes = 0
        self.source = source.source
        self.origin = source.origin
        self.interval_s = source.interval_s

    @property
    def notes(self) -> Any:
        return self._source.notes

    @property
    def events(self) -> Any:
        return self._source.events

    @property
    def num_rows(self) -> int | None:
        return self._source.num_rows  # type: ignore[no-any-return]

    @property
    def ts_range_ns(self) -> tuple[int, int] | None:
        return self._source.ts_range_ns  # type: ignore[no-any-return]

    @property
    def checks_order(self) -> bool:
        return bool(self._source.checks_order)

    @checks_order.setter
    def checks_order(self, value: bool) -> None:
        self._source.checks_order = value

    def defer_order_check(self) -> None:
        self._source.defer_order_check()

    def split(self, parts: int, **kw: Any) -> list[Any] | None:
        recipes: list[Any] | None = self._source.split(parts, **kw)
        if recipes:
            self._passes += 1  # the ranges are the first pass
            # the ranges this process reads count for every process's (about as many),
            # up to the file's rows (it reads them all where no worker could start)
            scale = min(parts, len(recipes))
            total = self._source.num_rows
            left = [total if isinstance(total, int) else None]

            def advance(n: int) -> None:
                if left[0] is not None:
                    n = min(n, left[0])
                    left[0] -= n
                if n:
                    self._advance(n)

            recipes = [_CountedRange(r, advance, scale) for r in recipes]
        return recipes

    @property
    def reads_lean(self) -> bool:
        return bool(getattr(self._source, "reads_lean", False))

    def batches(self, **kw: Any) -> Any:
        self._passes += 1
        count = self._passes == 1
        for batch in self._source.batches(**kw):
            if count:
                self._advance(batch.num_rows * self._scale)
            yield batch


class _CountedRange:
    """A range recipe whose source advances the progress bar when read in this process (by
    its rows times ``scale``); sent to a worker process, it is the plain recipe."""

    def __init__(self, recipe: Any, advance: Any, scale: int) -> None:
        self._recipe = recipe
        self._advance = advance
        self._scale = scale

    def __call__(self) -> _Counting:
        return _Counting(self._recipe(), self._advance, self._scale)

    def __reduce__(self) -> Any:
        return self._recipe.__reduce__()
