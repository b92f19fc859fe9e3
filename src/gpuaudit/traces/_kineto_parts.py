"""A large trace's events array decoded on several cores: consecutive parts, one per process.

Decoding the events (:mod:`gpuaudit.traces._kineto_json`: msgspec builds a struct per event,
then the selector and the columns read them) runs on one core at ~130 MB/s of JSON, and a
rank's trace of a long training run is 100 MB to a few GB. Once the document's events array
is found (:func:`~gpuaudit.traces._kineto_json.decode`), it is cut into parts at candidate element
boundaries (``}`` ``,`` ``{``), this process decodes the first part, and each other part is
sent to a helper process (a fresh interpreter, as :mod:`gpuaudit.classify.parallel` uses:
started ahead by the command, :func:`gpuaudit._workers.prestart_trace`, or here) that decodes
it with the same code and answers its columns.

The answer is exactly the one-process answer, or it is not used:

- **Boundaries.** A candidate cut can lie inside a string. Part ``k``'s end is proven an
  element boundary when part ``k`` decodes to it exactly from a proven start (the argument
  of :mod:`~gpuaudit.traces._kineto_json`: only "after an element of the array" accepts the
  closing ``]``), and the next part starts at the ``{`` after that boundary's comma. The
  first part starts at the array's first element; so each part, taken in order, proves the
  next one's start.
- **Per event.** What is kept of an event, and how its numbers and FLOPs are read, depends
  on that event alone, so a part reads the same in any process.
- **Anything else** (a part that does not decode to its end, a helper that fails, dies or
  cannot start, a trace event of the wrong type): from the first part not accepted on, this
  process decodes the rest itself, in order, so an error names the right event and byte.

Names are merged into this process's table in first-seen order, as one pass interns them.

**A large plain file** (:func:`decode_file`) is not read whole first: the events array is
found from the file's head and tail, the header and tail are proven valid around it
(:func:`~gpuaudit.traces._kineto_json.meta_around`), this process reads only its own part
and each helper maps its part from the file itself. With the parts' proof above, that proves
the whole document valid; anything unexpected sends it down the whole-read path.

**Several ranks' files** (a distributed job's folder) are shared out whole instead
(:func:`load_ranks`): each helper loads its files into RankTraces, this process loads its
own in one part each, and a file a helper could not load is loaded here, so the first error
in file order is the one raised.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from gpuaudit import _workers
from gpuaudit.errors import InputError
from gpuaudit.traces import _kineto_json as kj

T = TypeVar("T")

__all__ = ["HELPER_PART_BYTES", "MAX_PARTS", "PART_BYTES", "decode_events", "decode_file",
           "load_ranks", "plan"]

#: The smallest part worth a helper started ahead (its interpreter and imports are already
#: paid, beside this process's own imports). Measured on 2 cores (docs/benchmarks.md): a
#: 15 MB trace in two parts ran no faster than in one (the hand-over, the helper's page
#: faults and the merge cost ~50 ms), a 32 MB one 17 % faster.
PART_BYTES = 12 << 20
#: ... and worth a helper started here, when the array is reached (its start, ~0.15 s of
#: a core, overlaps this process's own part only when that part is at least this large)
HELPER_PART_BYTES = 48 << 20
#: Parts at most (this process and 7 helpers)
MAX_PARTS = 8


def plan(arr: memoryview, lo: int, end: int, parts: int) -> list[tuple[int, int]]:
    """``arr[lo:end]`` (an events array's elements) cut into at most ``parts`` consecutive
    ``(start, stop)`` spans at candidate boundaries near equal sizes: each stop is just after
    a ``}``, the next start at the ``{`` after the comma. Candidates, not proven ones."""
    return _plan(lambda pos: _cut_in(arr, pos, end), lo, end, parts)


def _cut_in(buf: Any, pos: int, end: int, base: int = 0) -> tuple[int, int] | None:
    """The first candidate cut in ``buf[pos:end]``: (just after its ``}``, its ``{``), plus
    ``base``."""
    m = kj._CUT.search(buf, pos, end)
    return (base + m.start() + 1, base + m.end() - 1) if m else None


def _plan(cut_from: Callable[[int], tuple[int, int] | None], lo: int, end: int, parts: int
          ) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    start = lo
    for k in range(1, parts):
        pos = max(lo + (end - lo) * k // parts, start + 1)
        cut = cut_from(pos) if pos < end else None
        if cut is None:
            break
        spans.append((start, cut[0]))
        start = cut[1]
    spans.append((start, end))
    return spans


def _helpers(n_bytes: int) -> list[subprocess.Popen[bytes]]:
    """Helper processes for an events array of ``n_bytes``: the one started ahead if any,
    plus ones started now where the array is large enough to repay their start."""
    cpus = _workers.available_cpus()
    if cpus < 2 or n_bytes < 2 * PART_BYTES:
        return []
    ready = _workers.take("trace")
    # parts of PART_BYTES or more; a helper started here only for parts of HELPER_PART_BYTES
    count = min(cpus, MAX_PARTS, n_bytes // PART_BYTES) - 1
    return _gather(min(count, max(ready is not None, n_bytes // HELPER_PART_BYTES - 1)), ready)


def _fit(helpers: list[subprocess.Popen[bytes]], spans: list[tuple[int, int]]
         ) -> list[subprocess.Popen[bytes]]:
    """One helper for each span after the first (this process's): those beyond are stopped
    (there were fewer candidate cuts than helpers)."""
    for proc in helpers[len(spans) - 1:]:
        _stop(proc)
    return helpers[:len(spans) - 1]


def _gather(count: int, ready: subprocess.Popen[bytes] | None
            ) -> list[subprocess.Popen[bytes]]:
    """``count`` helpers at most: ``ready`` (the one started ahead) first, then ones started
    now (fewer where one cannot start)."""
    out = [ready] if ready is not None else []
    for unneeded in out[count:]:
        _stop(unneeded)
    out = out[:count]
    while len(out) < count:
        proc = _workers.spawn(_workers.TRACE_WORKER)
        if proc is None:
            break
        out.append(proc)
    return out


def decode_events(arr: memoryview, end: int, path: Path, acc: kj._Accumulator,
                  slice_bytes: int, frame: kj._Frame) -> None:
    """Decode the elements ``arr[1:end]`` into ``acc``, on several cores where it pays
    (see the module docstring); the same columns as one pass in every case (a
    :data:`~gpuaudit.traces._kineto_json.EventsDecoder`)."""
    helpers = _helpers(end - 1)
    spans = plan(arr, 1, end, len(helpers) + 1) if helpers else [(1, end)]
    helpers = _fit(helpers, spans)
    if not helpers:
        kj.decode_part(arr, 1, end, path, acc, slice_bytes, frame)
        return
    files: list[str | None] = []
    start, stop = spans[0]
    try:
        for proc, (a, b) in zip(helpers, spans[1:]):
            with _interrupt_held():  # a file made is a file recorded, to be removed
                made = _hand_over(arr[a:b])
                files.append(made[0] if made is not None else None)
            if made is not None:  # the part's elements are the file's [1, b - a + 1)
                _send(proc, _FileTask(acc.cats, acc.select, slice_bytes, made[0], 1,
                                      b - a + 1, made[1]))
        try:
            kj.decode_part(arr, start, stop, path, acc, slice_bytes, frame)
        except kj.NotABoundary as exc:  # the first cut was inside a string: one pass on
            kj.decode_part(arr, exc.at, end, path, acc, slice_bytes, frame)
            return
        for proc, name, (a, _) in zip(helpers, files, spans[1:]):
            got = _answer(proc) if name is not None else None
            if not isinstance(got, kj._PartState):
                # from here on, one pass here (an error then names its event and byte)
                kj.decode_part(arr, a, end, path, acc, slice_bytes, frame)
                return
            acc.absorb(got)
    finally:
        for proc in helpers:
            _stop(proc)
        for name in files:
            if name is not None:
                _remove(name)


#: bytes read at a plain file's head and tail to find its events array (a Kineto header or
#: tail is a few KiB; a file whose are larger is read whole, as one pass reads it), and the
#: window read at a time to find a cut
_PROBE_BYTES = kj.PROBE_BYTES


def decode_file(path: Path, cats: tuple[str, ...], select: kj.Selector,
                slice_bytes: int | None = None) -> tuple[dict[str, Any], kj.Columns] | None:
    """A large plain (not gzip) trace file decoded in parts without reading it whole first:
    ``(meta, columns)`` as :func:`~gpuaudit.traces._kineto_json.decode` gives them, or None
    where this does not apply or anything is not as expected (the caller then reads and
    decodes the document whole, which names any error).

    The events array is found from the file's head and tail, and the header and tail are
    proven valid around it (:func:`~gpuaudit.traces._kineto_json.meta_around`); the array's
    parts are then proven by decoding, as in :func:`decode_events`. So no pass validates the
    whole document first, and this process reads only its own part: each helper maps its
    part from the file itself. Where a helper fails, this process reads and decodes that
    part. The file must look the same (size, modification time, inode) throughout."""
    try:
        f = open(path, "rb", buffering=0)  # closed below, helpers or not
    except OSError:
        return None
    helpers: list[subprocess.Popen[bytes]] = []
    try:
        stamp = _stamp(os.fstat(f.fileno()))
        if stamp[0] < 2 * PART_BYTES or _workers.available_cpus() < 2:
            return None
        found = kj.locate_events(lambda pos, n: _read_at(f, pos, n), stamp[0],
                                 _PROBE_BYTES)
        if found is None:
            return None
        meta, lo, end = found
        helpers = _helpers(end - lo)
        spans = _plan(lambda pos: _file_cut(f, pos, end), lo, end, len(helpers) + 1)
        helpers = _fit(helpers, spans)
        if not helpers:
            return None
        slice_bytes = slice_bytes or kj.SLICE_BYTES
        for proc, (a, b) in zip(helpers, spans[1:]):
            _send(proc, _FileTask(cats, select, slice_bytes, str(path), a, b, stamp))
        acc = kj._Accumulator(cats, select)
        at = lo  # where the next element starts, proven
        for k, (a, b) in enumerate(spans):
            if at != a:  # the cut before was not a boundary: on from there in one pass
                at = _decode_span(f, at, end, path, acc, slice_bytes)
                break
            got = _answer(helpers[k - 1]) if k else None
            if isinstance(got, kj._PartState):  # decoded to its end: its cut is proven
                acc.absorb(got)
                at = spans[k + 1][0] if k + 1 < len(spans) else end
            else:  # this process's part, or one its helper did not answer
                at = _decode_span(f, a, b, path, acc, slice_bytes)
                at = spans[k + 1][0] if at == b and k + 1 < len(spans) else at
        if at != end or _stamp(os.stat(path)) != stamp:  # not decoded, or changed while
            return None  # read: the document is read whole
        return meta, acc.finish()
    except OSError:
        return None
    finally:
        f.close()
        for proc in helpers:
            _stop(proc)


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ino


def _read_at(f: Any, pos: int, n: int) -> bytes:
    """At most ``n`` bytes of the file from ``pos`` (a probe or a window: a MiB at most)."""
    f.seek(pos)
    return bytes(f.read(n))


def _read_into(f: Any, pos: int, view: memoryview) -> None:
    """Fill ``view`` from the file at ``pos`` (an OSError where the file ends first)."""
    f.seek(pos)
    got = 0
    while got < len(view):
        k = f.readinto(view[got:])
        if not k:
            raise OSError(f"{f.name}: ended at byte {pos + got}")
        got += k


def _file_cut(f: Any, pos: int, end: int) -> tuple[int, int] | None:
    """The first candidate cut in the file from ``pos`` (see :func:`plan`), read a window at a
    time (None within 8 windows: fewer parts)."""
    for _ in range(8):
        if pos >= end:
            return None
        window = _read_at(f, pos, min(_PROBE_BYTES, end - pos))
        cut = _cut_in(window, 0, len(window), base=pos)
        if cut is not None:
            return cut
        pos += max(len(window) - 64, 1)  # overlapping: a cut across two windows is found
    return None


def _decode_span(f: Any, a: int, b: int, path: Path, acc: kj._Accumulator,
                 slice_bytes: int) -> int:
    """The file's bytes ``[a, b)`` (elements of its events array from a proven start) read
    and decoded into ``acc``: returns ``b``, or where the decode stopped where ``b`` is not
    just after an element (a cut inside a string or a nested object), or -1 where it
    failed otherwise (the caller then reads the document whole)."""
    buf = bytearray(b - a + 2)
    buf[0], buf[-1] = 0x5B, 0x5D  # [ and ]
    _read_into(f, a, memoryview(buf)[1:-1])
    try:
        kj.decode_part(memoryview(buf), 1, len(buf) - 1, path, acc, slice_bytes,
                       kj._Frame.over(buf))
    except kj.NotABoundary as exc:
        return a + exc.at - 1
    except (InputError, msgspec.DecodeError, RecursionError):
        return -1
    return b


def _hand_over(part: memoryview) -> tuple[str, tuple[int, int, int]] | None:
    """The part between brackets, as a JSON array of its own, in a new file that its helper
    maps as it maps a plain trace's part (:class:`_FileTask`): its name and stamp, or None
    where it cannot be written (that part is then decoded here). In memory where
    /dev/shm exists and has room for it (a container's is often 64 MiB), else in the
    temporary folder. Not through the helper's stdin: a pipe takes ~1 MiB per hand-over, and
    this process, decoding meanwhile, holds the interpreter for a whole slice at a time, so a
    thread feeding the pipe would move one chunk per slice."""
    fd, name, stamp = -1, "", None
    try:
        fd, name = tempfile.mkstemp(prefix="gpuaudit-trace-part-", dir=_part_dir(len(part)))
        for view in (memoryview(b"["), part, memoryview(b"]")):
            while len(view):
                view = view[os.write(fd, view):]
        stamp = _stamp(os.fstat(fd))
    except OSError:  # no room, no folder: this process decodes the part
        pass
    finally:  # a Ctrl-C while writing leaves no file behind either
        if fd >= 0:
            os.close(fd)
        if name and stamp is None:
            _remove(name)
    return (name, stamp) if stamp is not None else None


@contextmanager
def _interrupt_held() -> Iterator[None]:
    """SIGINT held back (blocked for this thread, delivered when the block ends) where the
    platform allows: a Ctrl-C between creating a part's file and recording its name would
    leave the file behind."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = mask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, old)


def _part_dir(n_bytes: int) -> str | None:
    """/dev/shm where it is writable with room for ``n_bytes`` and as much again to spare,
    else None (the temporary folder)."""
    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
    except (OSError, AttributeError):  # none there, or no statvfs (Windows)
        return None
    room = st.f_bavail * st.f_frsize
    return shm if os.access(shm, os.W_OK) and room >= 2 * n_bytes + (1 << 20) else None


def _remove(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass


def _send(proc: subprocess.Popen[bytes], task: _FileTask | _RanksTask) -> None:
    """Write the task to the helper (a few hundred bytes: the pipe takes them at once)."""
    try:
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps(task, protocol=5))
        proc.stdin.close()
    except (OSError, ValueError):  # the helper died or was stopped: its answer is missing
        pass


def _answer(proc: subprocess.Popen[bytes]) -> Any:
    """What the helper answered, or None where it died or wrote something unreadable (the
    caller checks the answer's type)."""
    try:
        assert proc.stdout is not None
        return pickle.load(proc.stdout)
    except Exception:  # any broken answer means: do the work here
        return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass


@dataclass(frozen=True)
class _FileTask:
    """A part of a file, ``[lo, hi)``, for a helper to map and decode in place, if the file
    still has the ``stamp`` this process saw: of a plain trace file (:func:`decode_file`), or
    a part's own file (:func:`_hand_over`)."""

    cats: tuple[str, ...]
    select: kj.Selector
    slice_bytes: int
    path: str
    lo: int
    hi: int
    stamp: tuple[int, int, int]


@dataclass(frozen=True)
class _RanksTask:
    """Whole rank trace files for a helper to load, each with ``load(path, parts=False)``
    (a module-level function: pickled by name, imported by the helper)."""

    paths: tuple[str, ...]
    load: Callable[..., Any]


def load_ranks(files: list[Path], load: Callable[..., T], kind: type[T]) -> list[T]:
    """``load(file)`` of each file, in order: where there are several, their JSON is large
    enough and the process may use two cores or more, shared between this process and
    helper processes, each loading whole files (a rank's trace reads the same in any
    process); what a helper answers counts only as a ``kind``. A file a helper could not
    load (an error, a helper that dies or cannot start) is loaded here, so the first error
    in file order is raised, as one process raises it."""
    try:
        sizes = [_workers.json_size(f) for f in files]
    except OSError:  # loading names the file that cannot be read
        sizes = [0] * len(files)
    procs = min(_workers.available_cpus(), len(files), MAX_PARTS, sum(sizes) // PART_BYTES)
    if procs < 2:
        return [load(f) for f in files]
    helpers = _gather(procs - 1, _workers.take("trace"))
    share = _balance(sizes, len(helpers) + 1)
    try:
        for proc, own in zip(helpers, share[1:]):
            _send(proc, _RanksTask(tuple(str(files[i]) for i in own), load))
        got: dict[int, T | Exception | None] = {}
        for i in share[0]:  # this process's files, helpers being busy: in one part each
            try:
                got[i] = load(files[i], parts=False)
            except Exception as exc:  # raised in file order, below
                got[i] = exc
        for proc, own in zip(helpers, share[1:]):
            got.update(zip(own, _ranks_answer(proc, len(own), kind)))
    finally:
        for proc in helpers:
            _stop(proc)
    out = []
    for i, f in enumerate(files):
        r = got.get(i)
        if isinstance(r, Exception):
            raise r
        out.append(r if r is not None else load(f))
    return out


def _ranks_answer(proc: subprocess.Popen[bytes], n: int, kind: type[T]) -> list[T | None]:
    """A helper's answers (None for each it could not load, or all where it failed)."""
    got = _answer(proc)
    if not isinstance(got, list) or len(got) != n:
        return [None] * n
    return [r if isinstance(r, kind) else None for r in got]


def _balance(sizes: list[int], n: int) -> list[list[int]]:
    """File indices in ``n`` shares of about equal size (the largest file first to the
    lightest share), each share in file order; the first share is this process's."""
    shares: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        k = load.index(min(load))
        shares[k].append(i)
        load[k] += sizes[i]
    return [sorted(s) for s in shares]


def _main() -> int:
    """The helper: read a task on stdin, answer on stdout: a part's state (a
    :class:`~gpuaudit.traces._kineto_json._PartState`) or, for a :class:`_RanksTask`, a
    RankTrace per file; None for what it could not do (the caller does it, and reports).
    An empty stdin (a helper started ahead and never needed) ends it without a word."""
    try:
        task = pickle.load(sys.stdin.buffer)
    except EOFError:
        return 0
    answer = _ranks(task) if isinstance(task, _RanksTask) else _file_part(task)
    try:
        pickle.dump(answer, sys.stdout.buffer, protocol=5)
        sys.stdout.buffer.flush()
    except OSError:  # the caller stopped waiting (it ended, or did the work itself):
        os._exit(0)  # nothing more to say, not even the flush of a closed pipe at exit
    return 0


def _file_part(task: _FileTask) -> kj._PartState | None:
    try:
        with open(task.path, "rb") as f:
            if _stamp(os.fstat(f.fileno())) != task.stamp:
                return None
            # mapped (copy on write: a slice's framing brackets copy only the pages they touch)
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        acc = kj._Accumulator(task.cats, task.select)
        kj.decode_part(memoryview(buf), task.lo, task.hi, Path(task.path), acc,
                       task.slice_bytes, kj._Frame.over(buf), _releaser(buf, task.lo))
        return acc.state()
    except Exception:  # the part is decoded again by the caller
        return None


def _releaser(buf: mmap.mmap, lo: int) -> Callable[[int], None] | None:
    """What lets the pages of a mapped part go once decoded (a file's pages, read again from
    it if ever touched again), so a helper holds one slice of its part, not all of it: its
    peak RSS on the 106 MB trace fell from 98 to ~50 MiB. None where the platform cannot."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None or not hasattr(buf, "madvise"):
        return None
    kept = lo - lo % mmap.PAGESIZE  # the first page not yet let go

    def done(upto: int) -> None:
        nonlocal kept
        stop = (upto - 1) - (upto - 1) % mmap.PAGESIZE  # the page the next slice starts in stays
        if stop > kept:
            buf.madvise(advice, kept, stop - kept)
            kept = stop

    return done


def _ranks(task: _RanksTask) -> list[Any]:
    out: list[Any] = []
    for path in task.paths:
        try:
            out.append(task.load(path, parts=False))
        except Exception:  # loaded again by the caller, who reports
            out.append(None)
    return out
