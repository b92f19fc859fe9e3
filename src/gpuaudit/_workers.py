"""Worker processes (fresh interpreters, each in a session of its own), and the one a
command starts ahead of its task where it knows early that a second core will be used.

:mod:`gpuaudit.classify.parallel` starts a worker (a fresh interpreter that imports gpuaudit,
NumPy, PyArrow and numba, then reads its task on stdin) once the file is open and split:
about half a second into the command, while the second core sat idle. :func:`prestart` starts
it first thing instead, so its imports and the loading of the compiled loop run beside this
process's own imports; :func:`take` hands it to the first range that needs a worker. A worker
no range took reads an empty stdin when this process exits (or is ended at exit) and stops
without a word. :func:`prestart_trace` does the same for a large profiler trace or a folder
of ranks (:mod:`gpuaudit.traces._kineto_parts`); ``take(kind)`` keeps the kinds apart. This
module imports nothing heavy: it runs before anything else is imported.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["PRESTART_BYTES", "TRACE_PRESTART_BYTES", "TRACE_WORKER", "WORKER", "available_cpus",
           "json_size", "prestart", "prestart_trace", "spawn", "take", "widen"]

#: The worker's program: -c, not -m (under -m runpy imports the package first, which imports
#: the parallel module through classify.passes, and then runs the module again as __main__)
WORKER = "import sys; from gpuaudit.classify.parallel import _main; sys.exit(_main())"
#: ... and started ahead, loading the compiled loop while it waits for its task, and the
#: file reader its task opens the range with (PyArrow, Parquet: ~0.15 s of imports, else
#: paid when the task arrives, unpickling it); the cyclic collector paused while it
#: imports and what they made frozen after (as :func:`gpuaudit._heap.loading_code` does in
#: a process of ours: see there)
_WARM_WORKER = ("import gc, sys; gc.disable(); import gpuaudit.measure.files; "
                "from gpuaudit.classify.parallel import _main; gc.freeze(); gc.enable(); "
                "sys.exit(_main(True))")
#: The trace-decoding helper's program (gpuaudit.traces._kineto_parts), the collector
#: paused for its imports as in classify's worker
TRACE_WORKER = ("import gc, sys; gc.disable(); from gpuaudit.traces._kineto_parts import _main; "
                "gc.freeze(); gc.enable(); sys.exit(_main())")
#: A Parquet file from this size on is worth a worker started ahead (two processes share a
#: file of 16M rows or more; a gpuaudit recording holds ~0.7 bytes a row at its smallest)
PRESTART_BYTES = 12 << 20

#: A trace (its JSON, inflated) from this size on is worth a decoding helper started ahead
#: (gpuaudit.traces._kineto_parts: two parts of PART_BYTES or more)
TRACE_PRESTART_BYTES = 24 << 20

#: Workers started ahead and not yet taken, by kind ("classify", "trace")
_ready: dict[str, subprocess.Popen[bytes]] = {}


def spawn(program: str = WORKER) -> subprocess.Popen[bytes] | None:
    """A worker process running ``program`` with this copy of gpuaudit on its path (None
    where it cannot start)."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    try:
        # a session of its own: a Ctrl-C at the terminal reaches this process, which stops
        # its workers, and not the workers themselves (each would print its traceback)
        proc = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env, start_new_session=True)
    except OSError:
        return None
    widen(proc.stdout)
    return proc


#: The answer's pipe is widened to this (Linux; where allowed): a range's engine is ~30 MB,
#: which through the default 64 KiB pipe takes ~450 hand-overs between the two processes
PIPE_BYTES = 1 << 20


def widen(pipe: object) -> None:
    """Ask for a :data:`PIPE_BYTES` pipe buffer (F_SETPIPE_SZ); nothing where refused."""
    try:
        import fcntl

        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # type: ignore[attr-defined]
    except (AttributeError, ImportError, OSError, ValueError):
        pass


def prestart(path: Path | str) -> None:
    """Start a worker now if ``path`` is a Parquet file large enough to be classified on two
    or more cores (a guess from its size: a worker that is not taken costs the idle core a
    moment and is ended at exit)."""
    try:
        p = Path(path)
        if not p.is_file() or p.stat().st_size < PRESTART_BYTES:
            return
        with p.open("rb") as f:
            if f.read(4) != b"PAR1":
                return
    except OSError:
        return
    _start("classify", _WARM_WORKER)


def prestart_trace(paths: list[Path]) -> None:
    """Start a trace-decoding helper now if ``paths`` (trace files, or folders of them)
    hold JSON enough to be decoded on two cores: one large trace in parts, or several ranks'
    traces side by side (gpuaudit.traces._kineto_parts). A guess from the files' sizes, as
    for :func:`prestart`: a ``.gz``'s from its trailer."""
    try:
        files = [q for p in map(Path, paths)
                 for q in (sorted(p.iterdir()) if p.is_dir() else [p])
                 if q.is_file() and (q.name.endswith(".json") or q.name.endswith(".json.gz"))]
        size = sum(map(json_size, files))
    except OSError:
        return
    if size >= TRACE_PRESTART_BYTES:
        _start("trace", TRACE_WORKER)


def json_size(path: Path) -> int:
    """A trace file's JSON size: a plain file's own, a ``.gz``'s from its trailer (the
    inflated size modulo 4 GiB, so at least the file's size)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        if f.read(2) == b"\x1f\x8b" and size >= 18:
            f.seek(-4, os.SEEK_END)
            size = max(size, int.from_bytes(f.read(4), "little"))
    return size


def _start(kind: str, program: str) -> None:
    if kind in _ready or available_cpus() < 2:
        return
    proc = spawn(program)
    if proc is not None:
        if not _ready:
            atexit.register(_end)
        _ready[kind] = proc


def take(kind: str = "classify") -> subprocess.Popen[bytes] | None:
    """The worker of ``kind`` started ahead, if there is one still running (once)."""
    proc = _ready.pop(kind, None)
    if proc is not None and proc.poll() is not None:
        return None
    return proc


def _end() -> None:
    for kind in list(_ready):
        proc = take(kind)
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


def available_cpus() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
