"""Crash-safe recording of live samples: an Arrow IPC journal, finalised to Parquet.

While sampling, each flush appends one record batch to ``<out>.partial.arrows`` (an Arrow
IPC *stream*: readable up to its last complete message without a footer) and fsyncs it;
marks, events and counters go to ``<out>.partial.jsonl``, one JSON object per flush. So a
SIGKILL loses at most one flush interval. :meth:`Recorder.close` streams the journal into
``<out>`` as Parquet (zstd, row groups of up to :data:`ROW_GROUP_ROWS` rows, memory flat
however long the run) with the key-value metadata of :mod:`gpuaudit.schema` (``META_*``) plus
the keys below, then removes the journal.

:func:`recover_recording` reads either: the finished Parquet file, or, when only the journal
is there (the recorder died), the journal up to its last complete batch, with an
:class:`~gpuaudit.schema.ImportNote` saying so. :func:`read_recording` reads a finished file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

from gpuaudit import __version__
from gpuaudit.errors import InputError
from gpuaudit.measure.parquet_io import batch_groups
from gpuaudit.schema import (
    META_HOST,
    META_INTERVAL_S,
    META_ORIGIN,
    META_SOURCE,
    META_START,
    META_VERSION,
    SAMPLE_SCHEMA,
    ImportNote,
    Recording,
    validate,
)

__all__ = [
    "JOURNAL_SUFFIX",
    "LOCK_SUFFIX",
    "META_COUNTERS",
    "META_EVENTS",
    "META_LABELS",
    "META_MARKS",
    "META_NOTES",
    "META_PROGRESS",
    "META_SAMPLER",
    "OUTPUT_MODES",
    "SIDE_SUFFIX",
    "Extras",
    "OutputLock",
    "Recorder",
    "journal_for",
    "read_recording",
    "read_side_journal",
    "recover_journal_copy",
    "recover_recording",
]

JOURNAL_SUFFIX = ".partial.arrows"
SIDE_SUFFIX = ".partial.jsonl"
LOCK_SUFFIX = ".lock"
#: What a recorder does with an output that already holds a recording (finished, or the
#: journal of a killed run): refuse it, replace it, or continue it.
OUTPUT_MODES = ("create", "force", "append")
ROW_GROUP_ROWS = 128 * 1024

#: Extra metadata keys of a live recording (JSON values).
META_LABELS = b"gpuaudit.labels"      # {"team": "vision"}
META_MARKS = b"gpuaudit.marks"        # [[ts_ns, "epoch 3"], ...]
META_EVENTS = b"gpuaudit.events"      # ["2025-...Z GPU-... lost: ...", ...]
META_COUNTERS = b"gpuaudit.counters"  # {"steps": 120, "samples": 3840, "tokens": null}
META_PROGRESS = b"gpuaudit.progress"  # [[ts_ns, steps, samples, tokens], ...] one per flush
META_SAMPLER = b"gpuaudit.sampler"    # tick statistics: ticks, late, missed, lateness p50/p99
META_NOTES = b"gpuaudit.notes"        # ["CUDA_VISIBLE_DEVICES entry ...", warnings, ...]


@dataclass
class Extras:
    """What a recording carries besides samples; grows during the run."""

    labels: dict[str, str] = field(default_factory=dict)
    marks: list[tuple[int, str]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    counters: dict[str, float | None] = field(default_factory=dict)
    progress: list[tuple[int, float, float | None, float | None]] = field(default_factory=list)
    sampler: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_meta(self) -> dict[bytes, bytes]:
        enc = json.dumps
        return {
            META_LABELS: enc(self.labels).encode(),
            META_MARKS: enc([list(m) for m in self.marks]).encode(),
            META_EVENTS: enc(self.events).encode(),
            META_COUNTERS: enc(self.counters).encode(),
            META_PROGRESS: enc([list(p) for p in self.progress]).encode(),
            META_SAMPLER: enc(self.sampler).encode(),
            META_NOTES: enc(self.notes).encode(),
        }

    def delta_json(self, seen: dict[str, int]) -> str:
        """The lists' entries not yet journaled (``seen`` counts them) and the current dicts."""
        out: dict[str, Any] = {"labels": self.labels, "counters": self.counters,
                               "sampler": self.sampler}
        for key in _LIST_KEYS:
            items = getattr(self, key)
            out[key] = [list(x) if isinstance(x, tuple) else x for x in items[seen.get(key, 0):]]
            seen[key] = len(items)
        return json.dumps(out)


_LIST_KEYS = ("marks", "events", "progress", "notes")


def iso_utc(ts_ns: int) -> str:
    """``2025-01-02T03:04:05.678901Z`` for a UTC epoch in nanoseconds."""
    dt = datetime.fromtimestamp(ts_ns / 1e9, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def base_meta(*, source: str, origin: str, interval_s: float | None, host: str | None,
              start_ns: int) -> dict[bytes, bytes]:
    """The schema's META_* keys."""
    return {
        META_VERSION: __version__.encode(),
        META_SOURCE: source.encode(),
        META_ORIGIN: origin.encode(),
        META_INTERVAL_S: (repr(float(interval_s)) if interval_s else "").encode(),
        META_HOST: (host or socket.gethostname()).encode(),
        META_START: iso_utc(start_ns).encode(),
    }


def _fsync(f: Any) -> None:
    f.flush()
    with contextlib.suppress(OSError):
        os.fsync(f.fileno())


class OutputLock:
    """An exclusive ``flock`` on ``<out>.lock``, held while one process records to ``<out>``.

    A second recorder on the same path fails at once with the holder's pid instead of
    truncating the first one's journal. The lock file holds the pid; it is removed on
    :meth:`release`. The kernel drops the lock when the holder dies (SIGKILL included), so a
    stale lock file never blocks: the next recorder takes it over.
    """

    def __init__(self, out: Path) -> None:
        self.path = Path(str(out) + LOCK_SUFFIX)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise InputError(
                    f"another process (pid {holder}) is recording to {out}",
                    where=str(out),
                    fix="choose another -o path, or wait for that recording to finish"
                ) from None
            # the file may have been removed by a holder releasing it between our open and
            # our flock: then we locked an orphan inode; take the lock again on the new file
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # while still holding it: nobody can lock the old inode
        os.close(self._fd)
        self._fd = None


def _existing(out: Path) -> str | None:
    """What already lies at ``out``: a finished recording, a killed run's journal, or None."""
    journal = Path(str(out) + JOURNAL_SUFFIX)
    if journal.exists():
        return "the journal of a recording whose recorder did not finish (killed or crashed)"
    if out.exists():
        return "a file (a finished recording?)"
    return None


class Recorder:
    """Journals record batches as they come and writes the final Parquet on :meth:`close`.

    Not thread-safe: one writer (the sampler's writer thread) calls :meth:`write`.
    """

    def __init__(self, path: str | os.PathLike[str], *, interval_s: float | None,
                 origin: str, source: str = "nvml", host: str | None = None,
                 start_ns: int, mode: str = "create") -> None:
        """``mode``: what to do when ``path`` already holds a recording or a killed run's
        journal: ``create`` refuses it (an :class:`InputError` naming the fix), ``force``
        replaces it, ``append`` continues it (its rows and marks come first)."""
        if mode not in OUTPUT_MODES:
            raise ValueError(f"mode must be one of {OUTPUT_MODES}, not {mode!r}")
        if str(path) == "-":
            raise InputError("a recording is a Parquet file and cannot go to stdout (-o -)",
                             fix="give a file path, e.g. -o run.parquet")
        self.path = Path(path)
        self.journal = Path(str(self.path) + JOURNAL_SUFFIX)
        self.side = Path(str(self.path) + SIDE_SUFFIX)
        self.meta = base_meta(source=source, origin=origin, interval_s=interval_s, host=host,
                              start_ns=start_ns)
        if self.path.parent and not self.path.parent.exists():
            raise InputError(f"directory {self.path.parent} does not exist",
                             where=str(self.path), fix="create it or choose another -o path")
        self._lock = OutputLock(self.path)
        try:
            prior = self._claim(mode, interval_s)
            self._open(prior)
        except BaseException:
            self._lock.release()
            raise
        self.closed = False

    def _claim(self, mode: str, interval_s: float | None) -> Recording | None:
        """Check what lies at the output against ``mode``; the prior recording to continue."""
        found = _existing(self.path)
        if found is None or mode == "force":
            for p in (self.journal, self.side, self.path):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            return None
        if mode == "create":
            raise InputError(
                f"{self.path} already exists: {found}; it is left untouched",
                where=str(self.path),
                fix=f"gpuaudit report {self.path} reads it (recovering a journal); pass "
                "--append to continue it, --force to replace it, or choose another -o path")
        prior = recover_recording(self.path)
        if prior.interval_s and interval_s and abs(prior.interval_s - interval_s) > 1e-9:
            raise InputError(
                f"{self.path} was sampled every {prior.interval_s:g} s, this run every "
                f"{interval_s:g} s: one recording has one nominal interval",
                where=str(self.path),
                fix=f"--hz {1 / prior.interval_s:g} to continue it, or another -o path")
        if schema_start := prior.meta.get("start"):
            self.meta[META_START] = schema_start.encode()
        return prior

    def _open(self, prior: Recording | None) -> None:
        """Start the journal; a continued recording's rows and extras go in first, written
        to a new journal that replaces the old one only once fsynced (no window where a
        crash loses them)."""
        self._seen: dict[str, int] = {}
        self.rows = 0
        tmp = Path(str(self.journal) + ".new")
        self._jf = open(tmp if prior is not None else self.journal, "wb")
        self._writer = pa.ipc.new_stream(self._jf, SAMPLE_SCHEMA.with_metadata(self.meta))
        self.prior_extras: dict[str, Any] = {}
        if prior is not None:
            for batch in prior.table.to_batches():
                self._writer.write_batch(batch)
                self.rows += batch.num_rows
            self.prior_extras = {k: json.loads(prior.meta[k]) for k in _LIST_KEYS
                                 if k in prior.meta}
        _fsync(self._jf)
        side_tmp = Path(str(self.side) + ".new")
        self._sf = open(side_tmp if prior is not None else self.side, "w")
        if self.prior_extras:
            self._sf.write(json.dumps(self.prior_extras) + "\n")
        _fsync(self._sf)
        if prior is not None:
            os.replace(tmp, self.journal)
            os.replace(side_tmp, self.side)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # the finished file's rows now live in the journal

    def write(self, batch: pa.RecordBatch | None, extras: Extras | None = None) -> None:
        """Append a batch (and the current extras) to the journal, then fsync both."""
        if batch is not None and batch.num_rows:
            self._writer.write_batch(batch)
            self.rows += batch.num_rows
            _fsync(self._jf)
        if extras is not None:
            self._sf.write(extras.delta_json(self._seen) + "\n")
            _fsync(self._sf)

    def close(self, extras: Extras) -> Path:
        """Finish the journal and stream it into the Parquet file; remove the journal."""
        if self.closed:
            return self.path
        self._writer.close()
        _fsync(self._jf)
        self._jf.close()
        self._sf.close()
        meta = {**self.meta, **extras.to_meta()}
        for key, before in self.prior_extras.items():  # a continued run's lists come first
            k = f"gpuaudit.{key}".encode()
            meta[k] = json.dumps([*before, *json.loads(meta.get(k, b"[]"))]).encode()
        finalize_journal(self.journal, self.path, meta)
        with contextlib.suppress(FileNotFoundError):
            self.side.unlink()
        self.closed = True
        self._lock.release()
        return self.path

    def abandon(self) -> None:
        """Close the files without finalising (the journal stays for recovery)."""
        if self.closed:
            return
        with contextlib.suppress(Exception):
            self._writer.close()
        self._jf.close()
        self._sf.close()
        self.closed = True
        self._lock.release()


def _journal_batches(journal: Path) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[bool]]:
    """Batches of an IPC stream up to the last complete one; ``truncated[0]`` tells if cut."""
    source = pa.OSFile(str(journal), "rb")
    try:
        reader = pa.ipc.open_stream(source)
    except (pa.ArrowInvalid, OSError) as exc:
        source.close()
        raise InputError(f"{journal} holds no readable samples ({exc})", where=str(journal),
                         fix="the recorder died before its first flush; nothing to recover"
                         ) from exc
    truncated = [False]

    def gen() -> Iterator[pa.RecordBatch]:
        try:
            while True:
                try:
                    yield reader.read_next_batch()
                except StopIteration:
                    return
                except (pa.ArrowInvalid, OSError):
                    truncated[0] = True
                    return
        finally:
            source.close()

    return reader.schema, gen(), truncated


def finalize_journal(journal: Path, out: Path, meta: Mapping[bytes, bytes]) -> int:
    """Stream a journal into a zstd Parquet file at ``out`` (atomic rename); return rows."""
    rows, _, _ = _journal_to_parquet(journal, out, meta)
    with contextlib.suppress(FileNotFoundError):
        journal.unlink()
    return rows


def _journal_to_parquet(journal: Path, out: Path, meta: Mapping[bytes, bytes] | None
                        ) -> tuple[int, bool, int | None]:
    """Stream ``journal`` into Parquet at ``out`` (atomic rename), leaving the journal.

    ``meta`` None keeps the journal's own schema metadata plus its side journal's extras.
    Returns (rows, whether the last batch was cut off and dropped, the last sample's ts in
    ns or None)."""
    schema, batches, truncated = _journal_batches(journal)
    if meta is None:
        meta = dict(schema.metadata or {})
        side = Path(str(journal)[: -len(JOURNAL_SUFFIX)] + SIDE_SUFFIX)
        for key, value in (_last_side(side) or {}).items():
            meta[f"gpuaudit.{key}".encode()] = json.dumps(value).encode()
    tmp = out.with_name(out.name + ".tmp")
    rows = 0
    last_ns: int | None = None
    with pq.ParquetWriter(str(tmp), SAMPLE_SCHEMA.with_metadata(dict(meta)),
                          compression="zstd") as writer:
        for group in batch_groups(batches, ROW_GROUP_ROWS):
            table = pa.Table.from_batches(group, SAMPLE_SCHEMA)
            writer.write_table(table)
            rows += table.num_rows
            if table.num_rows:
                top = pa.compute.max(table.column("ts")).cast(pa.int64()).as_py()
                last_ns = top if last_ns is None else max(last_ns, top)
    os.replace(tmp, out)
    return rows, truncated[0], last_ns


def journal_for(path: str | os.PathLike[str]) -> Path | None:
    """The journal to read for ``path`` when it is one, or when ``path`` itself is missing
    and its recorder left a journal (killed, crashed, or still recording); else None."""
    p = Path(path)
    if p.name.endswith(JOURNAL_SUFFIX):
        return p
    journal = Path(str(p) + JOURNAL_SUFFIX)
    return journal if journal.exists() and not p.exists() else None


def recover_journal_copy(journal: Path, out: Path) -> ImportNote:
    """Copy what ``journal`` holds into a Parquet recording at ``out`` (the journal and the
    user's files are left as they are) and return the note a report shows about it."""
    if not journal.exists():
        raise InputError(f"no journal at {journal}", where=str(journal),
                         fix="give the recording's .parquet path or its .partial.arrows journal")
    rows, truncated, last_ns = _journal_to_parquet(journal, out, None)
    lock = Path(str(journal)[: -len(JOURNAL_SUFFIX)] + LOCK_SUFFIX)
    live = _lock_holder(lock)
    if live is not None:
        why = (f"the recording is still in progress (pid {live} holds {lock.name}): this "
               "report covers the samples flushed so far")
    else:
        why = ("recovered from the journal of a recording whose recorder did not finish "
               "(killed or crashed)")
    lost = ("" if live is not None else
            f"; samples after {iso_utc(last_ns) if last_ns else 'its start'} were lost (at "
            "most one flush interval, --flush-s)")
    if truncated:
        lost += "; the journal's last batch was cut off mid-write and dropped"
    return ImportNote(reason=f"{why}: {rows:,} rows read{lost}", count=rows,
                      where=str(journal))


def _lock_holder(lock: Path) -> str | None:
    """The pid holding ``lock`` (a recorder still running), or None when no one does."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _decode_meta(meta: Mapping[bytes, bytes]) -> dict[str, str]:
    return {k.decode().removeprefix("gpuaudit."): v.decode() for k, v in meta.items()
            if k.startswith(b"gpuaudit.")}


def _recording(table: pa.Table, meta: Mapping[bytes, bytes], where: str,
               notes: Sequence[ImportNote] = ()) -> Recording:
    m = _decode_meta(meta)
    table = validate(table.cast(SAMPLE_SCHEMA), source=where)
    interval = m.get("interval_s") or ""
    events = tuple(json.loads(m.get("events", "[]")))
    return Recording(
        table=table,
        source=m.get("source", "nvml"),
        origin=m.get("origin", where),
        interval_s=float(interval) if interval else None,
        notes=tuple(notes),
        events=events,
        meta=m,
    )


def read_recording(path: str | os.PathLike[str]) -> Recording:
    """Read a finished recording (Parquet written by :class:`Recorder`)."""
    p = Path(path)
    try:
        pf = pq.ParquetFile(str(p))
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read {p} as Parquet: {exc}", where=str(p),
                         fix="give a recording written by gpuaudit run/sample/monitor") from exc
    meta = pf.schema_arrow.metadata or {}
    return _recording(pf.read(), meta, str(p))


def recover_recording(path: str | os.PathLike[str], *, finalize: bool = False,
                      extras: Mapping[str, Any] | None = None) -> Recording:
    """A recording from ``path``, whether it finished or its recorder was killed.

    ``path`` is the recording's Parquet path or its ``.partial.arrows`` journal. With only a
    journal, the samples up to the last complete flush come back with a note; with
    ``finalize=True`` the journal is also turned into the Parquet file, as ``close`` would.
    ``extras`` (``{"marks": [...], "events": [...], ...}``, the :class:`Extras` field names)
    replace what the side journal says for those keys: the sampling process's parent knows
    every mark and counter, the journal only those sent before the kill.
    """
    p = Path(path)
    if str(p).endswith(JOURNAL_SUFFIX):
        p = Path(str(p)[: -len(JOURNAL_SUFFIX)])
    journal = Path(str(p) + JOURNAL_SUFFIX)
    if p.exists() and not journal.exists():
        return read_recording(p)
    if not journal.exists():
        raise InputError(f"no recording at {p} (and no journal {journal.name})", where=str(p),
                         fix="check the path given to -o / output=")
    schema, batches, truncated = _journal_batches(journal)
    table = pa.Table.from_batches(list(batches), SAMPLE_SCHEMA)
    meta = dict(schema.metadata or {})
    side = Path(str(p) + SIDE_SUFFIX)
    found = {**(_last_side(side) or {}), **(extras or {})}
    for key, value in found.items():
        meta[f"gpuaudit.{key}".encode()] = json.dumps(value).encode()
    note = ImportNote(
        reason="recovered from the journal of a recording that did not finish (its recorder "
        "was killed or crashed); samples after the last flush are lost"
        + ("; the journal's last batch was cut off and dropped" if truncated[0] else ""),
        count=table.num_rows,
        where=str(journal),
    )
    rec = _recording(table, meta, str(journal), notes=(note,))
    if finalize:
        finalize_journal(journal, p, meta)
        with contextlib.suppress(FileNotFoundError):
            side.unlink()
    return rec


def read_side_journal(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What the side journal (``<out>.partial.jsonl``) of a recording holds so far, merged:
    marks, events, progress and notes concatenated, labels, counters and sampler latest.
    None when there is no side journal (the recording finished, or never started)."""
    return _last_side(Path(str(path) + SIDE_SUFFIX))


def _last_side(side: Path) -> dict[str, Any] | None:
    """Merge the side journal: lists concatenate, dicts take their latest value."""
    if not side.exists():
        return None
    merged: dict[str, Any] = {key: [] for key in _LIST_KEYS}
    for line in side.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            break  # a line cut by the kill
        for key, value in entry.items():
            if key in _LIST_KEYS:
                merged[key].extend(value)
            else:
                merged[key] = value
    return merged
