"""Classify one large file on several cores: row-group ranges in worker processes, stitched.

A gpuaudit Parquet recording is cut into consecutive row-group ranges
(:meth:`gpuaudit.measure.files.FileSource.split`). Each range runs through its own phase
engine; this process takes the first range, and each other range runs in a fresh interpreter
(``python -c`` running :func:`_main`) that reads a pickled task on stdin and writes its
engine on stdout. The engines are then stitched in order (``_Engine.absorb``), which gives
exactly the result one engine reading the whole file would give (a property test checks it).

Fresh interpreters rather than ``multiprocessing``: a fork copies whatever threads the caller
runs (Arrow's pools, a live sampler), and spawn re-imports the caller's ``__main__``, which
breaks scripts without a ``__main__`` guard. A worker that dies without an answer has its
range classified here instead: the result never depends on whether workers could start.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuaudit import _workers
from gpuaudit._workers import available_cpus
from gpuaudit.classify.phases import _Engine
from gpuaudit.errors import SampleTableError

if TYPE_CHECKING:
    from gpuaudit.classify.timeline import Grid
    from gpuaudit.schema import SampleSource

__all__ = ["MIN_ROWS_PER_WORKER", "RANGES_PER_PROCESS", "BoundaryOrderError", "available_cpus",
           "claim_ranges", "classify_ranges", "run_range"]

#: A range smaller than this is not worth a worker: starting one costs ~0.3 s (an interpreter
#: plus numpy and pyarrow), about what the engine needs for 3M rows on one core.
MIN_ROWS_PER_WORKER = 8_000_000
#: With one worker, the file is cut into this many ranges per process, claimed from both
#: ends (:func:`claim_ranges`), so a process that starts late or runs slower takes fewer
RANGES_PER_PROCESS = 4

Recipe = Callable[[], "SampleSource"]


class BoundaryOrderError(Exception):
    """A series runs backwards exactly where one range ends and the next begins. The caller
    reads the file once more in one pass, so the reader can name the file row."""


def run_range(recipe: Recipe, by: tuple[str, ...], interval_s: float,
              cap_intervals: float, grid: Grid | None = None, onsets: bool = False,
              expected_rows: int | None = None) -> _Engine:
    """One range through a phase engine, not finished: its carried rows stay pending.
    ``expected_rows``: the whole file's rows (else the range's), which decides whether the
    compiled loop pays back."""
    from gpuaudit._heap import arrow_on_heap, keep_freed_memory
    from gpuaudit.classify.phases import _Engine

    keep_freed_memory()
    arrow_on_heap()
    engine = _Engine(by, interval_s, cap_intervals, grid, onsets)
    _feed(engine, recipe, expected_rows)
    engine.detach()
    return engine


def _feed(engine: _Engine, recipe: Recipe, expected_rows: int | None) -> None:
    """The range's batches into ``engine`` (which may have read the range before it)."""
    from gpuaudit.classify.phases import engine_batches

    source = recipe()
    rows = getattr(source, "num_rows", None)
    if expected_rows is None and isinstance(rows, int):
        expected_rows = rows
    engine.expected_rows = expected_rows
    for i, batch in enumerate(engine_batches(source, engine.by)):
        engine.feed(batch, position=f"{source.origin} (batch {i})")


def _claim(claims: str, k: int) -> bool:
    """Take range ``k`` for this process: True unless the other process took it first."""
    try:
        os.close(os.open(os.path.join(claims, str(k)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def claim_ranges(recipes: Sequence[Recipe], by: tuple[str, ...], interval_s: float,
                 cap_intervals: float, *, grid: Grid | None = None, onsets: bool = False,
                 expected_rows: int | None = None) -> _Engine:
    """The ranges shared by this process and one worker, claimed from both ends: this process
    takes them from the first on, the worker from the last back, each while it finds the next
    one unclaimed, so both work until they meet however fast each runs (a worker that starts
    late or shares its core with other jobs takes fewer). Stitched in order into one engine,
    not yet finished: the same result as one engine reading the whole file."""
    from gpuaudit.classify.phases import _Engine

    claims = tempfile.mkdtemp(prefix="gpuaudit-ranges-")
    try:
        proc = _start(recipes, by, interval_s, cap_intervals, grid, onsets, claims=claims,
                      expected_rows=expected_rows)
        try:
            engine = _Engine(by, interval_s, cap_intervals, grid, onsets)
            k = 0
            while k < len(recipes) and _claim(claims, k):
                _feed(engine, recipes[k], expected_rows)
                k += 1
            engine.detach()
            got = _collect(proc) if proc is not None else None
            if got is None:  # the worker died: the ranges from k on are read here
                for j in range(k, len(recipes)):
                    _feed(engine, recipes[j], expected_rows)
                return engine
            first, other = got
            if other is not None:
                if first != k:  # pragma: no cover - the claims leave no hole
                    raise RuntimeError(f"ranges {k} to {first - 1} were claimed by neither")
                try:
                    engine.absorb(other, position=f"the start of range {k + 1} of "
                                                  f"{len(recipes)}")
                except SampleTableError as exc:
                    raise BoundaryOrderError(str(exc)) from exc
            return engine
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(claims, ignore_errors=True)


def _claim_from_the_end(recipes: Sequence[Recipe], claims: str, by: tuple[str, ...],
                        interval_s: float, cap_intervals: float, grid: Grid | None,
                        onsets: bool, expected_rows: int | None
                        ) -> tuple[int, _Engine | None]:
    """The worker's side of :func:`claim_ranges`: ranges from the last back while unclaimed,
    each through its own engine, which then takes in the ones after it. Returns the first
    range it read (``len(recipes)``: none) and their engine."""
    acc: _Engine | None = None
    first = len(recipes)
    for k in range(len(recipes) - 1, -1, -1):
        if not _claim(claims, k):
            break
        engine = run_range(recipes[k], by, interval_s, cap_intervals, grid, onsets,
                           expected_rows)
        if acc is not None:
            try:
                engine.absorb(acc, position=f"the start of range {k + 2} of {len(recipes)}")
            except SampleTableError as exc:
                raise BoundaryOrderError(str(exc)) from exc
        acc, first = engine, k
    if acc is not None:
        acc.detach()
    return first, acc


def classify_ranges(recipes: Sequence[Recipe], by: tuple[str, ...], interval_s: float,
                    cap_intervals: float, *, grid: Grid | None = None,
                    onsets: bool = False, processes: bool = True) -> _Engine:
    """Every range through its own engine (ranges after the first in worker processes when
    ``processes``), stitched in order into one engine, not yet finished."""
    workers: list[subprocess.Popen[bytes] | None] = []
    if processes:
        for recipe in recipes[1:]:
            workers.append(_start(recipe, by, interval_s, cap_intervals, grid, onsets))
    try:
        engine = run_range(recipes[0], by, interval_s, cap_intervals, grid, onsets)
        for k, recipe in enumerate(recipes[1:]):
            proc = workers[k] if processes else None
            other = _collect(proc) if proc is not None else None
            if other is None:
                other = run_range(recipe, by, interval_s, cap_intervals, grid, onsets)
            try:
                engine.absorb(other, position=f"the start of range {k + 2} of {len(recipes)}")
            except SampleTableError as exc:
                raise BoundaryOrderError(str(exc)) from exc
        return engine
    finally:
        for proc in workers:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def _start(recipe: Recipe | Sequence[Recipe], by: tuple[str, ...], interval_s: float,
           cap_intervals: float, grid: Grid | None, onsets: bool = False,
           claims: str | None = None, expected_rows: int | None = None
           ) -> subprocess.Popen[bytes] | None:
    """A worker for one range, or (``claims``: the claims' directory) for the ranges it
    claims from the end (:func:`claim_ranges`)."""
    task = pickle.dumps((recipe, by, interval_s, cap_intervals, grid, onsets, claims,
                         expected_rows), pickle.HIGHEST_PROTOCOL)
    # the worker started ahead of its task (gpuaudit._workers), else a fresh one; either
    # imports this very copy of gpuaudit, wherever it was imported from
    proc = _workers.take() or _workers.spawn(_workers.WORKER)
    if proc is None:
        return None
    assert proc.stdin is not None
    try:
        proc.stdin.write(task)
        proc.stdin.close()
    except OSError:  # it died at once
        proc.kill()
        proc.wait()
        return None
    return proc


def _collect(proc: subprocess.Popen[bytes]) -> Any:
    """The worker's engine; its data error re-raised here; None if it died without answer."""
    assert proc.stdout is not None
    data = proc.stdout.read()
    proc.wait()
    if proc.returncode != 0 or not data:
        return None
    try:
        kind, payload = pickle.loads(data)
    except Exception:  # something else wrote to its stdout (a sitecustomize, say)
        return None
    if kind == "error":
        raise payload
    return payload


def _main(warm: bool = False) -> int:
    """A worker's life: the task on stdin, the answer on stdout. ``warm``: started ahead of
    its task (gpuaudit._workers): load the compiled loop while waiting for it."""
    from gpuaudit._heap import own_process

    own_process()  # (what it loads is frozen once loaded: gpuaudit._heap.loading_code)
    if warm:
        from gpuaudit.classify import fused

        fused.warm()
    data = sys.stdin.buffer.read()
    if not data:  # started ahead of a task that never came
        return 0
    recipe, by, interval_s, cap_intervals, grid, onsets, claims, expected_rows = pickle.loads(
        data)
    out: tuple[str, Any]
    try:
        if claims is not None:
            out = ("ok", _claim_from_the_end(recipe, claims, by, interval_s, cap_intervals,
                                             grid, onsets, expected_rows))
        else:
            out = ("ok", run_range(recipe, by, interval_s, cap_intervals, grid, onsets,
                                   expected_rows))
    except Exception as exc:  # sent back whole, raised in the caller
        out = ("error", exc)
    sys.stdout.buffer.write(pickle.dumps(out, pickle.HIGHEST_PROTOCOL))
    sys.stdout.buffer.flush()
    # the caller reads the answer to its end, which comes when this process has exited
    from gpuaudit._heap import spare_the_exit

    spare_the_exit()
    return 0

