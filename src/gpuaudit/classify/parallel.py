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
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuaudit.classify.phases import _Engine
from gpuaudit.errors import SampleTableError

if TYPE_CHECKING:
    from gpuaudit.classify.timeline import Grid
    from gpuaudit.schema import SampleSource

__all__ = ["MIN_ROWS_PER_WORKER", "BoundaryOrderError", "available_cpus", "classify_ranges",
           "run_range"]

#: A range smaller than this is not worth a worker: starting one costs ~0.3 s (an interpreter
#: plus numpy and pyarrow), about what the engine needs for 3M rows on one core.
MIN_ROWS_PER_WORKER = 8_000_000

Recipe = Callable[[], "SampleSource"]


class BoundaryOrderError(Exception):
    """A series runs backwards exactly where one range ends and the next begins. The caller
    reads the file once more in one pass, so the reader can name the file row."""


def available_cpus() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_range(recipe: Recipe, by: tuple[str, ...], interval_s: float,
              cap_intervals: float, grid: Grid | None = None, onsets: bool = False) -> _Engine:
    """One range through a phase engine, not finished: its carried rows stay pending."""
    from gpuaudit._heap import keep_freed_memory
    from gpuaudit.classify.phases import _Engine, engine_batches

    keep_freed_memory()
    source = recipe()
    engine = _Engine(by, interval_s, cap_intervals, grid, onsets)
    rows = getattr(source, "num_rows", None)
    engine.expected_rows = rows if isinstance(rows, int) else None
    for i, batch in enumerate(engine_batches(source, by)):
        engine.feed(batch, position=f"{source.origin} (batch {i})")
    engine.detach()
    return engine


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


def _start(recipe: Recipe, by: tuple[str, ...], interval_s: float, cap_intervals: float,
           grid: Grid | None, onsets: bool = False) -> subprocess.Popen[bytes] | None:
    task = pickle.dumps((recipe, by, interval_s, cap_intervals, grid, onsets),
                        pickle.HIGHEST_PROTOCOL)
    env = dict(os.environ)
    # the worker imports this very copy of gpuaudit, wherever it was imported from
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    try:
        # -c, not -m: under -m runpy imports the package first (which imports this module
        # through classify.passes) and then runs this module again as __main__
        proc = subprocess.Popen([sys.executable, "-c", _WORKER],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    except OSError:
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


def _collect(proc: subprocess.Popen[bytes]) -> _Engine | None:
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
    return payload  # type: ignore[no-any-return]


_WORKER = "import sys; from gpuaudit.classify.parallel import _main; sys.exit(_main())"


def _main() -> int:
    recipe, by, interval_s, cap_intervals, grid, onsets = pickle.loads(sys.stdin.buffer.read())
    out: tuple[str, Any]
    try:
        out = ("ok", run_range(recipe, by, interval_s, cap_intervals, grid, onsets))
    except Exception as exc:  # sent back whole, raised in the caller
        out = ("error", exc)
    sys.stdout.buffer.write(pickle.dumps(out, pickle.HIGHEST_PROTOCOL))
    sys.stdout.buffer.flush()
    return 0

