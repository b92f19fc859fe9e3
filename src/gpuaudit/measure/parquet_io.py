"""gpuaudit recordings on disk: the sample table in Parquet (zstd, row groups, metadata).

Key-value metadata (``gpuaudit.*``, the ``META_*`` keys of :mod:`gpuaudit.schema`) carries the
tool version, source kind, origin sentence, nominal interval, hosts and start time; the
importer's notes and events travel as JSON under ``gpuaudit.notes`` / ``gpuaudit.events``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpuaudit import __version__, schema
from gpuaudit.errors import InputError
from gpuaudit.schema import ImportNote, Recording, SampleSource

__all__ = ["META_EVENTS", "META_NOTES", "read_metadata", "write_recording"]

META_NOTES = b"gpuaudit.notes"
META_EVENTS = b"gpuaudit.events"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def notes_to_json(notes: tuple[ImportNote, ...]) -> str:
    return json.dumps([{"reason": n.reason, "count": n.count, "where": n.where,
                        "column": n.column} for n in notes])


def notes_from_json(text: str) -> tuple[ImportNote, ...]:
    try:
        items = json.loads(text)
        return tuple(ImportNote(str(i["reason"]), int(i["count"]), i.get("where"),
                                i.get("column")) for i in items)
    except (ValueError, KeyError, TypeError):
        return ()


def read_metadata(pf: pq.ParquetFile) -> dict[bytes, bytes]:
    """The file's key-value metadata (``pyarrow.parquet.FileMetaData.metadata``)."""
    return dict(pf.metadata.metadata or {})


def write_recording(
    recording_or_source: Recording | SampleSource,
    path: str | Path,
    *,
    interval_s: float | None = None,
    row_group_rows: int = 1 << 20,
) -> None:
    """Write samples as a gpuaudit recording: Parquet, zstd, one row group per ``row_group_rows``.

    Streams: a :class:`SampleSource` is consumed batch by batch, never held whole. The file
    appears atomically (written beside, then renamed). ``interval_s`` overrides the source's.
    """
    path = Path(path)
    src = recording_or_source
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    hosts: set[str] = set()
    start_ns: int | None = None
    rows = 0
    try:
        with pq.ParquetWriter(tmp, schema.SAMPLE_SCHEMA, compression="zstd",
                              version="2.6") as writer:
            for batch in _batches(src):
                if batch.schema != schema.SAMPLE_SCHEMA:
                    batch = pa.Table.from_batches([batch]).cast(schema.SAMPLE_SCHEMA) \
                        .combine_chunks().to_batches()[0]
                if batch.num_rows == 0:
                    continue
                rows += batch.num_rows
                hosts.update(str(h) for h in
                             pc.unique(batch.column("host").cast(pa.string())).to_pylist())
                first = pc.min(batch.column("ts").cast(pa.int64())).as_py()
                start_ns = first if start_ns is None else min(start_ns, first)
                writer.write_batch(batch, row_group_size=row_group_rows)
            interval = interval_s if interval_s is not None else src.interval_s
            meta: dict[bytes, bytes] = {
                schema.META_VERSION: __version__.encode(),
                schema.META_SOURCE: src.source.encode(),
                schema.META_ORIGIN: src.origin.encode(),
                schema.META_HOST: ",".join(sorted(hosts)).encode(),
                META_NOTES: notes_to_json(tuple(src.notes)).encode(),
                META_EVENTS: json.dumps(list(src.events)).encode(),
            }
            if interval is not None:
                meta[schema.META_INTERVAL_S] = repr(float(interval)).encode()
            if start_ns is not None:
                start = _EPOCH + dt.timedelta(microseconds=start_ns // 1000)
                meta[schema.META_START] = start.isoformat().encode()
            writer.add_key_value_metadata(meta)
        os.replace(tmp, path)
    except OSError as exc:
        raise InputError(f"cannot write recording: {exc.strerror or exc}", where=str(path),
                         fix="check the directory exists and is writable") from exc
    finally:
        if tmp.exists():
            tmp.unlink()


def _batches(src: Recording | SampleSource) -> Iterator[pa.RecordBatch]:
    yield from src.batches()


def decode_meta(meta: Mapping[bytes, bytes]) -> dict[str, str]:
    """``gpuaudit.*`` keys as text (other keys, e.g. ``ARROW:schema``, left out)."""
    out: dict[str, str] = {}
    for k, v in meta.items():
        if k.startswith(b"gpuaudit."):
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


def batch_groups(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[list[pa.RecordBatch]]:
    """Consecutive batches gathered into groups of at least ``rows`` rows (the last group may
    hold fewer): CSV parser blocks into import batches, journal batches into row groups."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for b in batches:
        pending.append(b)
        count += b.num_rows
        if count >= rows:
            yield pending
            pending, count = [], 0
    if pending:
        yield pending
