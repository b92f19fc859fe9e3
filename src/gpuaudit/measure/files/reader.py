"""Samples from files: gpuaudit Parquet recordings, any Parquet/CSV/JSON Lines in the table's
columns or a ``--map``, and ``nvidia-smi --query-gpu=... --format=csv`` logs.

Everything streams: CSV through ``pyarrow.csv.open_csv`` (every column read as text, then
converted with pyarrow.compute kernels, so units, ``[N/A]`` and bad cells are handled and
located), JSON Lines through ``pyarrow.json.open_json``, Parquet by row group
(``ParquetFile.iter_batches``). :func:`open_samples` returns a :class:`FileSource` (a
:class:`~gpuaudit.schema.SampleSource`); :func:`read_samples` materialises a
:class:`~gpuaudit.schema.Recording`. See ``docs/input-formats.md``.
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

from gpuaudit import schema
from gpuaudit.errors import InputError
from gpuaudit.limits import BoundedStream, check_json_depth
from gpuaudit.measure.files import nvidia_smi as smi
from gpuaudit.measure.files.mapping import BatchConverter, NoteBook, parse_mapping, resolve_columns
from gpuaudit.measure.files.nulls import nulls
from gpuaudit.measure.live.recorder import JOURNAL_SUFFIX, journal_for, recover_journal_copy
from gpuaudit.measure.parquet_io import (
    META_EVENTS,
    META_NOTES,
    batch_groups,
    decode_meta,
    notes_from_json,
    read_metadata,
    write_recording,
)
from gpuaudit.schema import ImportNote, Recording
from gpuaudit.validate import check_time_zone

__all__ = ["FORMATS", "FileSource", "open_samples", "parse_mapping", "read_samples",
           "write_recording"]

FORMATS = ("parquet", "csv", "jsonl", "nvidia-smi")
_HEAD_BYTES = 1 << 16
#: Parser block cap: Arrow reads up to 32 blocks ahead, so this bounds read-ahead memory.
_MAX_BLOCK = 1 << 20
#: Rows converted at a time from a text file (CSV, JSONL): larger batches cost memory and,
#: past cache sizes, speed.
_CHUNK_ROWS = 1 << 17
#: ... and decoded at a time from a Parquet file: each batch has fixed costs (Arrow's table
#: steps, the checks, the null columns, classify's per-batch set-up: ~1 ms) that matter more
#: than cache sizes there: 2^19 rows took ~18 % less CPU than 2^17 in classify's lean read
#: of 100.8M rows, and `simulate`'s shared read of 43.2M ~15-20 % less wall, for ~80-190
#: MiB more memory (docs/benchmarks.md)
_PARQUET_CHUNK_ROWS = 1 << 19
_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")
_DATA_CELL = re.compile(r"^\s*([+-]?\d|\[|$)")

Locate = Callable[[int], str]
RawBatches = Callable[[], Iterator[tuple[pa.RecordBatch, Locate]]]


# --------------------------------------------------------------------------- public API


def open_samples(
    path: str | Path,
    *,
    fmt: str | None = None,
    mapping: Mapping[str, str] | None = None,
    fields: Sequence[str] | None = None,
    host: str | None = None,
    gpu_model: str | None = None,
    tz: str = "UTC",
    batch_rows: int = 1 << 20,
) -> FileSource:
    """Open a file of samples as a stream of validated sample-table batches.

    ``fmt`` is ``parquet``, ``csv``, ``jsonl`` or ``nvidia-smi`` (None: told from the magic
    bytes, extension and header). ``mapping`` sends source columns to table columns
    (:func:`parse_mapping`). ``fields`` names the columns of a ``noheader`` nvidia-smi log
    (the ``--query-gpu`` list). ``host`` and ``gpu_model`` fill what the file lacks
    (host defaults to the file name's stem). ``tz`` is the zone of timestamps that carry
    none (nvidia-smi writes local time). Batches hold at most ``batch_rows`` rows (and at
    most 131,072: bigger batches only cost memory and speed). Header problems raise here; bad rows raise while
    streaming, each as an :class:`~gpuaudit.errors.InputError` naming file:line and the fix.
    """
    if fmt is None and Path(path).exists() and _is_exposition(Path(path)):
        return _exposition_source(Path(path), mapping=mapping, fields=fields, host=host,
                                  gpu_model=gpu_model, tz=tz, batch_rows=batch_rows)
    journal = journal_for(path)
    if journal is not None:  # a recording whose recorder was killed: read its journal
        out = Path(_scratch_dir()) / (Path(path).name.removesuffix(JOURNAL_SUFFIX)
                                      .removesuffix(".parquet") + ".recovered.parquet")
        note = recover_journal_copy(journal, out)
        src = FileSource(out, fmt="parquet", mapping=mapping, fields=fields, host=host,
                         gpu_model=gpu_model, tz=tz, batch_rows=batch_rows)
        src.origin = f"{src.origin} (recovered from {journal})"
        src._book.add(note.reason, note.count, note.where)
        return src
    return FileSource(Path(path), fmt=fmt, mapping=mapping, fields=fields, host=host,
                      gpu_model=gpu_model, tz=tz, batch_rows=batch_rows)


_SCRATCH: list[str] = []


def _scratch_dir() -> str:
    """A private temporary folder for this process, removed at exit."""
    if not _SCRATCH:
        import atexit
        import shutil
        import tempfile

        _SCRATCH.append(tempfile.mkdtemp(prefix="gpuaudit-"))
        atexit.register(shutil.rmtree, _SCRATCH[0], ignore_errors=True)
    return _SCRATCH[0]


def read_samples(
    path: str | Path,
    *,
    fmt: str | None = None,
    mapping: Mapping[str, str] | None = None,
    fields: Sequence[str] | None = None,
    host: str | None = None,
    gpu_model: str | None = None,
    tz: str = "UTC",
    batch_rows: int = 1 << 20,
) -> Recording:
    """:func:`open_samples` (same arguments), consumed whole into a validated Recording."""
    return open_samples(path, fmt=fmt, mapping=mapping, fields=fields, host=host,
                        gpu_model=gpu_model, tz=tz, batch_rows=batch_rows).to_recording()


# --------------------------------------------------------------------------- the source


class FileSource:
    """A :class:`~gpuaudit.schema.SampleSource` reading one file.

    The first batch is read when the source is opened (so header errors, the format and the
    sampling interval are known at once); ``batches()`` may be called again to re-read.
    """

    source: str
    origin: str
    interval_s: float | None
    rereadable = True  # batches() may be called again: it re-reads the file

    def __init__(
        self,
        path: Path,
        *,
        fmt: str | None,
        mapping: Mapping[str, str] | None,
        fields: Sequence[str] | None,
        host: str | None,
        gpu_model: str | None,
        tz: str,
        batch_rows: int,
        row_groups: tuple[int, int] | None = None,
        shown: Path | None = None,
        known: tuple[list[str] | None, frozenset[str]] | None = None,
    ) -> None:
        if batch_rows < 1:
            raise InputError(f"batch_rows must be positive, got {batch_rows}",
                             fix="pass batch_rows >= 1")
        if fmt is not None and fmt not in FORMATS:
            raise InputError(f"unknown format {fmt!r}", where=str(path),
                             fix=f"use one of: {', '.join(FORMATS)}")
        _check_file(path)
        self.path = path
        #: the file notes and row errors name: ``path`` itself, or the file the user gave
        #: when ``path`` is a scratch copy parsed from it (a saved dcgm-exporter page)
        self.shown_path = shown or path
        self.fmt = fmt or _sniff_format(path)
        if self.fmt != "parquet":
            _refuse_profiler_trace(path)
        self.mapping = dict(mapping) if mapping else None
        self.fields = _split_fields(fields)
        self.host = host or _stem(path)
        self.host_from = "--host" if host else f"the file name {path.name!r}"
        self.gpu_model = gpu_model
        self.tz = check_time_zone(tz, "tz")
        self.batch_rows = batch_rows
        self._chunk = min(batch_rows, _CHUNK_ROWS)
        self._parquet_chunk = min(batch_rows, _PARQUET_CHUNK_ROWS)
        self.row_groups = row_groups
        #: check each GPU's time order while streaming (see :meth:`defer_order_check`)
        self.checks_order = True
        self.interval_s = None
        self.meta: dict[str, str] = {"path": str(path), "format": self.fmt}
        self._events: tuple[str, ...] = ()
        self._interval_fixed = False
        self._book = NoteBook()
        #: for a range of a file already opened (FileSource.split): the columns holding data
        #: and the range checks the footer proves, as the whole file's footer gave them
        self._known = known
        #: the text columns the batches keep as the file's dictionaries (see batches())
        self._dictionaries: tuple[str, ...] = ()
        self._setup()
        self._primed: tuple[Iterator[pa.RecordBatch], pa.RecordBatch] | None = None
        #: set up and not read yet: the next batches() need not set up again
        self._fresh = True
        if known is None:  # (a range of an opened file need not prove it can be read)
            it = self._stream()
            first = next(it)
            self._primed = (it, first)

    # -- protocol ---------------------------------------------------------------------
    @property
    def notes(self) -> tuple[ImportNote, ...]:
        return self._book.notes

    @property
    def events(self) -> tuple[str, ...]:
        return self._events

    #: ``batches(lean=True)`` is understood (see :meth:`batches`)
    reads_lean = True
    #: ``batches(dictionaries=...)`` is understood (see :meth:`batches`)
    reads_dictionaries = True

    def batches(self, *, lean: bool = False, dictionaries: Sequence[str] = ()
                ) -> Iterator[pa.RecordBatch]:
        """Validated :data:`~gpuaudit.schema.SAMPLE_SCHEMA` batches, each GPU in time order.

        ``lean``: for classify's engine, which reads a GPU's host, model and MIG profile off
        its first row only and the labels only to group by them. A gpuaudit Parquet
        recording then decodes neither ``labels`` (null in every batch) nor ``host``,
        ``gpu_model`` and ``mig_profile`` per row: those are given in the batches where a
        GPU first appears in this stream (read from their row group then) and null in the
        others, which saves about half the decoding. Other sources ignore it.

        ``dictionaries``: of ``namespace``, ``pod`` and ``container``, the columns a gpuaudit
        Parquet recording hands over as the file's own dictionaries (``dictionary<int32,
        string>``: the same values, each row an index) instead of decoding their text per
        row: for classify's engine, which codes its cells by the indices. Other sources
        ignore it."""
        fresh, self._fresh = self._fresh, False
        self._dictionaries = tuple(c for c in dictionaries if c in _DICTIONARY_COLUMNS) \
            if self.fmt == "parquet" and self._own else ()
        if (lean or self._dictionaries) and self.fmt == "parquet" and self._own:
            self._primed = None  # re-readable: the primed batch was read with every column
            if not fresh:
                self._book = NoteBook()
                self._setup()
            yield from self._stream(lean=lean)
        elif self._primed is not None:
            it, first = self._primed
            self._primed = None
            yield first
            yield from it
        else:
            if not fresh:
                self._book = NoteBook()
                self._setup()
            yield from self._stream()

    @property
    def num_rows(self) -> int | None:
        """Rows this source will yield, where the file says so up front (Parquet's footer)."""
        if self.fmt != "parquet":
            return None
        md = self._footer
        return int(sum(md.row_group(i).num_rows for i in self._groups()))

    @property
    def ts_range_ns(self) -> tuple[int, int] | None:
        """First and last timestamp (ns) from a gpuaudit recording's footer statistics, so
        the report's timeline buckets are known before the first row is read; None where
        the file does not say."""
        if self.fmt != "parquet" or not self._own:
            return None
        md = self._footer
        lo: int | None = None
        hi: int | None = None
        ts_col = schema.SAMPLE_SCHEMA.get_field_index("ts")
        for i in self._groups():
            st = md.row_group(i).column(ts_col).statistics
            if st is None or not st.has_min_max:
                return None
            a, b = int(st.min_raw), int(st.max_raw)
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
        return None if lo is None or hi is None else (lo, hi)

    def defer_order_check(self) -> None:
        """Leave each GPU's time order to the consumer: classify's engine groups every row by
        GPU and checks the order in the pass it makes anyway, so the same work here is
        paid twice (about a tenth of a large report). A violation then surfaces from the
        consumer without a file line; it reads again with :attr:`checks_order` on to name
        it."""
        self.checks_order = False

    def split(self, parts: int, *, min_rows_per_part: int = 1, pieces: int = 1
              ) -> list[Callable[[], FileSource]] | None:
        """Recipes for ``parts`` sources over consecutive row-group ranges of this file
        (``pieces``: each part cut into that many ranges, as far as the row groups allow).

        Each recipe is picklable (a worker process opens its own range); read one after the
        other, the ranges give exactly this source's stream. Offered only where a range
        can be classified alone and stitched: a gpuaudit Parquet recording with a known
        interval, several row groups and no time-sliced rows (``gpu_share`` null in every
        row group per the footer statistics). Fewer parts when the file has fewer row groups
        or fewer than ``min_rows_per_part`` rows per part; None when that leaves one.
        """
        if (self.fmt != "parquet" or not self._own or self.interval_s is None or parts < 2
                or self.row_groups is not None or self._read_cols is None
                or "gpu_share" in self._read_cols):
            return None
        md = self._footer
        rows = np.array([md.row_group(i).num_rows for i in range(md.num_row_groups)])
        parts = min(parts, rows.shape[0], int(rows.sum()) // max(min_rows_per_part, 1))
        if parts < 2:
            return None
        parts = min(parts * max(pieces, 1), rows.shape[0])
        # cut where the running row count crosses each 1/parts of the total
        cum = np.cumsum(rows)
        cuts = np.searchsorted(cum, cum[-1] * np.arange(1, parts) / parts, side="left") + 1
        bounds = sorted({0, *(int(c) for c in cuts if 0 < c < rows.shape[0]), rows.shape[0]})
        known = (self._read_cols, self._proven)
        return [functools.partial(_open_part, self.path, self.gpu_model, self.batch_rows,
                                  (a, b), self.checks_order, known)
                for a, b in itertools.pairwise(bounds)]

    def _groups(self) -> range:
        """The row groups this source reads (a Parquet file's footer)."""
        if self.row_groups is not None:
            return range(*self.row_groups)
        return range(self._footer.num_row_groups)

    def to_recording(self) -> Recording:
        batches = list(self.batches())
        table = pa.Table.from_batches(batches, schema=schema.SAMPLE_SCHEMA)
        return Recording(table=table, source=self.source, origin=self.origin,
                         interval_s=self.interval_s, notes=self.notes, events=self.events,
                         meta=dict(self.meta))

    # -- setup per format ----------------------------------------------------------------
    def _setup(self) -> None:
        self._converter: BatchConverter | None = None
        self._read_cols: list[str] | None = None
        self._proven: frozenset[str] = frozenset()
        self._raw_lean: RawBatches | None = None
        if self.fmt == "parquet":
            self._setup_parquet()
        elif self.fmt == "jsonl":
            self._setup_jsonl()
        else:
            self._setup_csv()

    def _converter_for(self, names: Sequence[str], where: str) -> BatchConverter:
        plan = resolve_columns(names, self.mapping, where=where)
        conv = BatchConverter(plan, host=self.host, host_from=self.host_from,
                              gpu_model=self.gpu_model, tz=self.tz, notes=self._book,
                              where=where)
        self._nvidia_smi = plan.nvidia_smi
        return conv

    def _setup_csv(self) -> None:
        path = self.path
        head, head_lines = _head_lines(path)
        first = head_lines[0] if head_lines else ""
        # RFC 4180: a header may quote its names (R's write.csv, Excel, pyarrow do)
        cells = next(csv.reader([first])) if first else [""]
        header = not any(_DATA_CELL.match(c) for c in cells)
        if header:
            names = [c.strip() for c in cells]
            if self.fields:
                self._book.add("the file has a header; --fields ignored", 1, f"{path}:1")
        else:
            if not self.fields:
                raise InputError(
                    f"the first line has no column names ({first[:60]!r}...): this looks "
                    "like an nvidia-smi log written with --format=csv,noheader",
                    where=f"{path}:1",
                    fix="pass --fields with the --query-gpu list the log was written with, "
                    "e.g. --fields timestamp,index,name,utilization.gpu,memory.used,power.draw",
                )
            names = list(self.fields)
            if len(names) != len(cells):
                raise InputError(
                    f"--fields names {len(names)} columns but the file has {len(cells)}",
                    where=f"{path}:1", fix="give exactly the --query-gpu list of the log")
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise InputError(f"column {dup!r} appears twice in the header",
                             where=f"{path}:1", fix="give every column a distinct name")
        self._converter = self._converter_for(names, f"{path}:1")
        self.source = "nvidia-smi-csv" if (self._nvidia_smi or self.fmt == "nvidia-smi") \
            else "csv"
        kind = "nvidia-smi --query-gpu CSV log" if self.source == "nvidia-smi-csv" else \
            "CSV file"
        self.origin = f"{kind} {path}"
        row_bytes = max(16, len(head) // max(1, len(head_lines)))
        block = int(min(max(self._chunk * row_bytes, 4096), _MAX_BLOCK))
        header_lines = 1 if header else 0

        def raw() -> Iterator[tuple[pa.RecordBatch, Locate]]:
            yield from _csv_batches(path, names, header_lines, block, self._chunk,
                                    self._book)

        self._raw: RawBatches = raw

    def _setup_jsonl(self) -> None:
        path = self.path
        self.source = "jsonl"
        self.origin = f"JSON Lines file {path}"
        head, head_lines = _head_lines(path)
        row_bytes = max(16, len(head) // max(1, len(head_lines)))
        block = int(min(max(self._chunk * row_bytes, 1 << 16), _MAX_BLOCK))
        self._converter = None

        def raw() -> Iterator[tuple[pa.RecordBatch, Locate]]:
            line = 0
            # the C parser under pyarrow recurses per nesting level and crashes on a row
            # nested ~10^4 deep: measure the depth first (limits.MAX_JSON_DEPTH)
            try:
                with open_stream(path) as f:
                    check_json_depth(iter(lambda: f.read(1 << 23), b""), str(path))
                with open_stream(path) as f:
                    reader = pjson.open_json(f, read_options=pjson.ReadOptions(
                        block_size=block))
                    for batch in reader:
                        base = line
                        line += batch.num_rows
                        yield batch, _at_line(path, base)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise _jsonl_error(path, exc) from exc
            except OSError as exc:
                raise _decompress_error(path, exc) from exc

        self._raw = raw

    def _setup_parquet(self) -> None:
        path = self.path
        shown = self.shown_path
        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"not a readable Parquet file: {exc}", where=str(path),
                             fix="give a .parquet file written by gpuaudit or another Parquet "
                             "writer, or pass --format csv/jsonl") from exc
        meta = read_metadata(pf)
        self.meta.update(decode_meta(meta))
        own = schema.META_VERSION in meta and _recording_columns(pf.schema_arrow.names)
        self._own = own
        if own:
            self._interval_fixed = True  # a recording's interval is its metadata's, or None
            self.source = meta.get(schema.META_SOURCE, b"parquet").decode("utf-8", "replace")
            self.origin = meta.get(schema.META_ORIGIN, f"gpuaudit recording {path}".encode()) \
                .decode("utf-8", "replace")
            if schema.META_INTERVAL_S in meta:
                try:
                    self.interval_s = float(meta[schema.META_INTERVAL_S])
                    self._interval_fixed = True
                except ValueError:
                    self._book.add("unreadable gpuaudit.interval_s metadata ignored", 1,
                                   str(path))
            for note in notes_from_json(meta.get(META_NOTES, b"[]").decode("utf-8", "replace")):
                self._book.add(note.reason, note.count, note.where, note.column)
            try:
                self._events = tuple(str(e) for e in json.loads(meta.get(META_EVENTS, b"[]")))
            except ValueError:
                self._events = ()
        else:
            self.source = "parquet"
            self.origin = f"Parquet file {path}"
            self._converter = self._converter_for(pf.schema_arrow.names, str(path))

        # Columns that are null in every row group (per the footer's statistics) are not
        # read at all: a recording of an nvidia-smi log carries a handful of measured columns
        # among the table's 33, and decoding the rest costs as much as the data.
        known = self._known
        read_cols = (known[0] if known is not None else _columns_with_data(pf)) if own else None
        self._read_cols = read_cols
        self._footer = pf.metadata
        names = pf.schema_arrow.names
        groups = None
        first_row = 0
        if self.row_groups is not None:
            groups = list(self._groups())
            first_row = sum(pf.metadata.row_group(i).num_rows
                            for i in range(self.row_groups[0]))
        # an older recording lacks the columns added since (host_cpu_util_pct, ...): null
        full = list(schema.SAMPLE_SCHEMA.names) if own else names
        fill = _NullFill(full)
        # range checks the footer's statistics already prove for every row group read
        self._proven = ((known[1] if known is not None
                         else _proven_in_range(pf.metadata, self._groups()))
                        if own else frozenset())

        def read_dictionary(cols: Sequence[str] | None) -> list[str] | None:
            """The columns asked for as dictionaries that are read at all."""
            asked = [c for c in self._dictionaries if cols is None or c in cols]
            return asked or None

        def raw() -> Iterator[tuple[pa.RecordBatch, Locate]]:
            row = first_row
            for batch in pq.ParquetFile(path, read_dictionary=read_dictionary(read_cols)
                                        ).iter_batches(batch_size=self._parquet_chunk,
                                                       columns=read_cols,
                                                       row_groups=groups):
                base = row
                row += batch.num_rows
                if batch.num_columns < len(full):
                    batch = fill(batch)
                yield batch, _at_row(shown, base)

        def lean() -> Iterator[tuple[pa.RecordBatch, Locate]]:
            cols = [c for c in (read_cols if read_cols is not None else names)
                    if c not in _LEAN_SKIPPED]
            first = _FirstRows(path, pf.metadata, self.gpu_model)
            row = first_row
            # a row-group range runs beside the others' processes, one per core: Arrow's
            # decoding threads would only wake and wait on one another there
            for batch in pq.ParquetFile(path, read_dictionary=read_dictionary(cols)
                                        ).iter_batches(batch_size=self._parquet_chunk,
                                                       columns=cols,
                                                       row_groups=groups,
                                                       use_threads=groups is None):
                base = row
                row += batch.num_rows
                ident = first.identity(batch.column("gpu_uuid"), base)
                if ident is not None:
                    batch = pa.RecordBatch.from_arrays(
                        [*batch.columns, *ident.columns],
                        names=[*batch.schema.names, *ident.schema.names])
                yield fill(batch), _at_row(shown, base)

        self._raw = raw
        self._raw_lean = lean

    # -- the stream --------------------------------------------------------------------
    def _stream(self, lean: bool = False) -> Iterator[pa.RecordBatch]:
        order = schema.OrderCheck()
        total = 0
        raws = self._raw_lean() if lean and self._raw_lean is not None else self._raw()
        for raw, locate in raws:
            if raw.num_rows == 0:
                continue
            if self.fmt == "jsonl" and self._converter is None:
                self._converter = self._converter_for(raw.schema.names, f"{self.path}:1")
                self.source = "nvidia-smi-jsonl" if self._nvidia_smi else "jsonl"
            if self._converter is None:  # a gpuaudit recording: already the table
                table = pa.Table.from_batches([raw])
                # (a lean batch's identity got the model where it was read)
                if self.gpu_model is not None and not lean:
                    model = table.column("gpu_model")
                    if model.null_count:
                        table = table.set_column(
                            table.schema.get_field_index("gpu_model"), "gpu_model",
                            pc.fill_null(model.cast(pa.string()), self.gpu_model))
            else:
                table = self._converter.convert(raw, locate)
            table, kept = _dictionaries_out(table, self._dictionaries)
            table = schema.validate(table, source=str(self.path), locate=locate,
                                    check_order=False, proven=self._proven)
            for name, col in kept.items():
                table = table.set_column(table.schema.get_field_index(name), name, col)
            if self.checks_order:
                order.check(table, locate)
            total += table.num_rows
            if not self._interval_fixed:
                self._infer_interval(table, locate)
            yield table.combine_chunks().to_batches(max_chunksize=table.num_rows)[0]
        if total == 0:
            raise InputError(
                "no samples: the file holds no data rows"
                + (" (a header only)" if self.fmt not in ("parquet", "jsonl") else ""),
                where=str(self.path),
                fix="check the logging command ran and wrote rows (nvidia-smi -l writes a "
                "row per GPU per interval)",
            )

    def _infer_interval(self, table: pa.Table, locate: Locate) -> None:
        interval = infer_interval_s(table)
        if interval is not None:
            self.interval_s = interval
            self._interval_fixed = True
            self._book.add(f"sampling interval inferred from timestamps: {interval:g} s "
                           "(median gap within each GPU)", 1, locate(0), "ts")


# --------------------------------------------------------------------------- helpers


def _recording_columns(names: Sequence[str]) -> bool:
    """Whether a gpuaudit recording's columns are the sample table's, or an earlier version's
    (the same columns in the same order, less some added since)."""
    full = list(schema.SAMPLE_SCHEMA.names)
    if names == full:
        return True
    return (set(names) <= set(full) and {"ts", "host", "gpu_uuid"} <= set(names)
            and sorted(names, key=full.index) == list(names))


def _columns_with_data(pf: pq.ParquetFile) -> list[str] | None:
    """Names of the columns holding at least one non-null value (None: statistics missing)."""
    md = pf.metadata
    names = pf.schema_arrow.names
    leaf_of = {pf.schema.column(i).path.split(".")[0]: i for i in range(md.num_columns)}
    keep = []
    for name in names:
        if pa.types.is_nested(pf.schema_arrow.field(name).type):
            keep.append(name)  # an empty map reads as null in leaf statistics: always read
            continue
        i = leaf_of.get(name)
        if i is None:
            return None
        has_data = False
        for rg in range(md.num_row_groups):
            col = md.row_group(rg).column(i)
            stats = col.statistics
            if stats is None or not stats.has_null_count:
                return None
            if stats.null_count < col.num_values or col.num_values < md.row_group(rg).num_rows:
                has_data = True
                break
        if has_data or name in ("ts", "host", "gpu_uuid"):
            keep.append(name)
    return keep


#: Columns ``FileSource.batches(dictionaries=...)`` may hand over as the file's dictionaries
_DICTIONARY_COLUMNS = frozenset(("namespace", "pod", "container"))


def _dictionaries_out(table: pa.Table, names: Sequence[str]
                      ) -> tuple[pa.Table, dict[str, pa.ChunkedArray]]:
    """``table`` with the text columns read as dictionaries (``names``) taken out (nulls in
    their place), so that the sample table's check and its cast to plain text skip them, and
    those columns, to put back after it. A dictionary of text holds the same values as the
    text column, and the check has no range to test on text."""
    kept: dict[str, pa.ChunkedArray] = {}
    for name in names:
        i = table.schema.get_field_index(name)
        if i < 0:
            continue
        col = table.column(i)
        if pa.types.is_dictionary(col.type) and pa.types.is_string(col.type.value_type):
            kept[name] = col
            table = table.set_column(i, name, pa.nulls(table.num_rows, pa.string()))
    return table, kept


#: Columns a lean read (``FileSource.batches(lean=True)``) does not decode per row
_IDENTITY = ("host", "gpu_model", "mig_profile")
_LEAN_SKIPPED = frozenset((*_IDENTITY, "labels"))


class _FirstRows:
    """For a lean read: the identity columns (host, gpu_model, mig_profile) of the batches
    where a GPU first appears in the stream, read from their row groups; None for the
    others (no GPU new there).

    Per batch the work is over the uuid dictionary (the entries already seen), and over the
    rows only when the dictionary holds an entry not seen yet."""

    def __init__(self, path: Path, footer: pq.FileMetaData, gpu_model: str | None) -> None:
        self.path = path
        #: the model for GPUs whose rows name none (``--gpu-model``)
        self.gpu_model = gpu_model
        self.seen: set[str] = set()
        self._dictionary: pa.Array | None = None
        self._known = np.zeros(0, dtype=bool)  # per dictionary entry: seen in this stream
        self._starts = np.cumsum([0] + [footer.row_group(i).num_rows
                                        for i in range(footer.num_row_groups)])
        self._file: pq.ParquetFile | None = None

    def identity(self, uuid: pa.Array, base: int) -> pa.RecordBatch | None:
        """The identity columns of the rows ``base`` .. ``base + len(uuid)`` of the file, if
        some row's GPU was not seen before in this stream (then every GPU in it is seen)."""
        if not pa.types.is_dictionary(uuid.type):
            uuid = pc.dictionary_encode(uuid)
        if self._dictionary is None or not uuid.dictionary.equals(self._dictionary):
            self._dictionary = uuid.dictionary
            self._known = np.array([u in self.seen for u in uuid.dictionary.to_pylist()],
                                   dtype=bool)
        if self._known.all():
            return None
        idx = uuid.indices.to_numpy(zero_copy_only=False)
        entries, first = np.unique(idx, return_index=True)
        new = ~self._known[entries]
        if not new.any():
            return None
        names = uuid.dictionary.to_pylist()
        for j in entries[new].tolist():
            self.seen.add(names[j])
        self._known[entries] = True
        # the identity up to the last new GPU's first row (a fleet's GPUs all appear in its
        # first tick: a thousand rows, not the row group); null after it
        upto = int(first[new].max()) + 1
        ident = self._rows(base, upto)
        if self.gpu_model is not None:  # as the full read fills it (FileSource._stream)
            if "gpu_model" not in ident.schema.names:
                ident = ident.append_column("gpu_model", pa.nulls(upto, pa.string()))
            at = ident.schema.get_field_index("gpu_model")
            model = ident.column(at)
            if model.null_count:
                ident = ident.set_column(at, "gpu_model", pc.dictionary_encode(
                    pc.fill_null(model.cast(pa.string()), self.gpu_model)))
        if upto == len(uuid):
            return ident
        return pa.RecordBatch.from_arrays(
            [pa.concat_arrays([col, _nulls(name, len(uuid) - upto)])
             for name, col in zip(ident.schema.names, ident.columns)],
            names=ident.schema.names)

    def _rows(self, base: int, n: int) -> pa.RecordBatch:
        """The identity columns of file rows ``base`` .. ``base + n``, decoding each row
        group they fall in only as far as needed."""
        if self._file is None:
            self._file = pq.ParquetFile(self.path)
        have = set(self._file.schema_arrow.names)
        cols = [c for c in _IDENTITY if c in have]
        parts = []
        row = base
        while row < base + n:
            rg = int(np.searchsorted(self._starts, row, side="right")) - 1
            lo = row - int(self._starts[rg])
            take = min(base + n - row, int(self._starts[rg + 1]) - row)
            head = next(self._file.iter_batches(batch_size=lo + take, row_groups=[rg],
                                                columns=cols, use_threads=False))
            parts.append(pa.Table.from_batches([head.slice(lo, take)]))
            row += take
        return pa.concat_tables(parts).combine_chunks().to_batches()[0]


def _proven_in_range(footer: pq.FileMetaData, groups: range) -> frozenset[str]:
    """The columns with a valid range (:data:`gpuaudit.schema.COLUMNS`) whose footer
    statistics show every value inside it in each of ``groups`` (NaN, which no range check
    flags, is left out of Parquet's statistics): their per-batch range check is skipped."""
    leaf = {footer.schema.column(i).path: i for i in range(footer.num_columns)}
    out = set()
    for col in schema.COLUMNS:
        if (col.lo is None and col.hi is None) or col.name not in leaf:
            continue
        i = leaf[col.name]
        for rg in groups:
            st = footer.row_group(rg).column(i).statistics
            if st is None or not st.has_min_max:
                break
            lo, hi = st.min, st.max
            if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
                break
            if (col.lo is not None and not lo >= col.lo) or (
                    col.hi is not None and not hi <= col.hi):
                break
        else:
            out.add(col.name)
    return frozenset(out)


class _NullFill:
    """Puts back the all-null columns that were not read, as the table's full schema.

    The null arrays are built once, as long as the longest batch seen, all over one zeroed
    buffer (:mod:`gpuaudit.measure.files.nulls`), and each batch takes a zero-copy slice of
    them (building ~25 of them per batch cost as much as decoding the data; batch lengths
    vary at every row-group edge, so a cache by length missed).
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        have = set(batch.schema.names)
        arrays = [batch.column(name) if name in have else _nulls(name, n)
                  for name in self.names]
        full = schema.SAMPLE_SCHEMA
        if any(pa.types.is_dictionary(batch.schema.field(name).type) for name in
               _DICTIONARY_COLUMNS & have):
            # a text column read as the file's dictionary stays one (from_arrays would
            # cast it to the schema's plain text)
            full = pa.schema([f.with_type(a.type) if f.name in _DICTIONARY_COLUMNS else f
                              for f, a in zip(full, arrays)], metadata=full.metadata)
        return pa.RecordBatch.from_arrays(arrays, schema=full)


def _nulls(name: str, n: int) -> pa.Array:
    """``n`` nulls of the sample table's column ``name`` (all over one zeroed buffer, sliced
    from the longest asked for: every range and source in this process shares them)."""
    return nulls(schema.SAMPLE_SCHEMA.field(name).type, n)


def _open_part(path: Path, gpu_model: str | None, batch_rows: int,
               row_groups: tuple[int, int], checks_order: bool = True,
               known: tuple[list[str] | None, frozenset[str]] | None = None) -> FileSource:
    """One row-group range of a gpuaudit Parquet recording (see :meth:`FileSource.split`):
    ``known``, what the whole file's footer said (its columns with data, the range checks it
    proves), is not worked out again."""
    src = FileSource(path, fmt="parquet", mapping=None, fields=None, host=None,
                     gpu_model=gpu_model, tz="UTC", batch_rows=batch_rows,
                     row_groups=row_groups, known=known)
    src.checks_order = checks_order
    return src


def infer_interval_s(table: pa.Table) -> float | None:
    """Median gap between consecutive samples of the same GPU, in seconds (None: no gaps)."""
    uuid = table.column("gpu_uuid").combine_chunks()
    if not pa.types.is_dictionary(uuid.type):
        uuid = pc.dictionary_encode(uuid)
    codes = uuid.indices.to_numpy(zero_copy_only=False)
    ts = table.column("ts").cast(pa.int64()).to_numpy()
    order = np.argsort(codes, kind="stable")
    c, t = codes[order], ts[order]
    same = c[1:] == c[:-1]
    gaps = (t[1:] - t[:-1])[same]
    gaps = gaps[gaps > 0]
    if gaps.size == 0:
        return None
    return round(float(np.median(gaps)) / 1e9, 9)


def _at_line(path: Path, base: int) -> Locate:
    """Row r of a batch whose first row is line ``base + 1`` -> ``file:line``."""

    def locate(row: int) -> str:
        return f"{path}:{base + row + 1}"

    return locate


def _at_lines(path: Path, lines: np.ndarray) -> Locate:
    def locate(row: int) -> str:
        return f"{path}:{int(lines[row])}"

    return locate


def _at_row(path: Path, base: int) -> Locate:
    def locate(row: int) -> str:
        return f"{path}: row {base + row + 1}"

    return locate


def _check_file(path: Path) -> None:
    if not path.exists():
        raise InputError("no such file", where=str(path), fix="check the path")
    if path.is_dir():
        raise InputError("is a directory, not a file", where=str(path),
                         fix="give one recording or log file")
    if path.stat().st_size == 0:
        raise InputError("empty file (0 bytes): no samples", where=str(path),
                         fix="check the logging command ran and wrote to this file")


def _stem(path: Path) -> str:
    name = path.name
    for ext in _COMPRESSED:
        if name.endswith(ext):
            name = name[: -len(ext)]
    return Path(name).stem or name


def _split_fields(fields: Sequence[str] | None) -> list[str] | None:
    if fields is None:
        return None
    if isinstance(fields, str):
        fields = fields.split(",")
    out = [f.strip() for f in fields if f.strip()]
    return out or None


def _read_head(path: Path) -> bytes:
    try:
        with open_stream(path) as f:
            return bytes(f.read(_HEAD_BYTES))
    except OSError as exc:
        raise _decompress_error(path, exc) from exc


def open_stream(path: Path) -> Any:
    """The file's bytes as pyarrow reads them, decompressed by its extension (``.gz``,
    ``.bz2``, ``.zst``, ``.lz4``) and bounded: a compressed file may inflate to at most
    :func:`gpuaudit.limits.max_input_bytes`, so a decompression bomb is an error, not
    gigabytes of memory."""
    stream = pa.input_stream(str(path), compression="detect")
    if not any(path.name.lower().endswith(ext) for ext in _COMPRESSED):
        return stream
    return pa.PythonFile(BoundedStream(stream, str(path)), mode="r")


def _decompress_error(path: Path, exc: OSError) -> InputError:
    return InputError(
        f"cannot read the file: {exc}",
        where=str(path),
        fix="a compressed file cut short (an interrupted copy or download) cannot be read: "
        "copy it again (`gzip -t FILE` checks a .gz file)")


def _sniff_format(path: Path) -> str:
    head = _read_head(path)
    if head[:4] == b"PAR1":
        return "parquet"
    suffixes = [s.lower() for s in path.suffixes if s.lower() not in _COMPRESSED]
    ext = suffixes[-1] if suffixes else ""
    if ext in (".parquet", ".pq"):
        return "parquet"
    if ext in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        return "jsonl"
    return "csv"


#: dcgm-exporter's default collect interval (``-c 30000`` ms): what one saved page stands for
DCGM_EXPORTER_INTERVAL_S = 30.0
_EXPOSITION = re.compile(rb"^(# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* |DCGM_FI_[A-Z0-9_]+[{ ])",
                         re.M)


def _is_exposition(path: Path) -> bool:
    """A saved ``/metrics`` page (Prometheus text format): ``curl node:9400/metrics > f``."""
    try:
        head = _read_head(path).lstrip(b"\xef\xbb\xbf \t\r\n")
    except InputError:
        return False
    first = head.split(b"\n", 1)[0]
    return bool(_EXPOSITION.match(first))


def _exposition_source(path: Path, **kw: Any) -> FileSource:
    """One saved dcgm-exporter page as a source: one sample per GPU (MIG instance, or GPU x
    pod), at the page's own sample timestamps or else the file's modification time. A page
    is a snapshot; ``gpuaudit scrape`` records a series of them."""
    import os

    from gpuaudit.measure.fleet.dcgm import parse_metrics_text

    # through the bounded reader: a .prom.gz is inflated, within --max-input-bytes
    with open_stream(path) as f:
        try:
            raw = b"".join(bytes(c) for c in iter(lambda: f.read(1 << 20), b""))
        except OSError as exc:
            raise _decompress_error(path, exc) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _utf8_error(path, raw[: exc.start].count(b"\n") + 1, raw[exc.start]) from None
    if not re.search(r"^DCGM_FI_", text, re.M):
        raise InputError(
            "this is a Prometheus metrics page without dcgm-exporter series (no DCGM_FI_* "
            "metric), not GPU samples", where=str(path),
            fix="save dcgm-exporter's page (curl http://<node>:9400/metrics > node.prom), or "
            "record it over time with gpuaudit scrape http://<node>:9400/metrics -o run.parquet")
    ts_ns = os.stat(path).st_mtime_ns
    table, notes = parse_metrics_text(text, ts_ns=ts_ns, default_host=kw.get("host")
                                      or _stem(path), where=str(path))
    out = Path(_scratch_dir()) / (path.name + ".parquet")
    write_recording(Recording(table=table, source="dcgm-exporter page",
                              origin=f"a saved dcgm-exporter page {path}",
                              interval_s=DCGM_EXPORTER_INTERVAL_S,
                              notes=tuple(notes)), out)
    src = FileSource(out, fmt="parquet", mapping=None, fields=None, host=kw.get("host"),
                     gpu_model=kw.get("gpu_model"), tz="UTC",
                     batch_rows=kw.get("batch_rows", 1 << 20), shown=path)
    src.origin = f"a saved dcgm-exporter page {path} (one sample per GPU)"
    src._book.add("one dcgm-exporter page is a snapshot: one sample per GPU, standing for one "
                  f"sampling interval ({DCGM_EXPORTER_INTERVAL_S:g} s, dcgm-exporter's default "
                  "collect interval; --interval to change); `gpuaudit scrape URL -o "
                  "rec.parquet` records a series", table.num_rows, str(path))
    return src


def _refuse_profiler_trace(path: Path) -> None:
    """A PyTorch profiler (Kineto/Chrome) trace is one JSON object with a ``traceEvents``
    array, not a table of samples: say so and name the command that reads it, rather than
    failing on its layout ("the first line is empty")."""
    head = _read_head(path).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"{") and (b'"traceEvents"' in head or (
            b'"schemaVersion"' in head and b'"deviceProperties"' in head)):
        raise InputError(
            "this is a profiler trace (PyTorch profiler / Kineto JSON), not a table of GPU "
            "samples: use gpuaudit trace", where=str(path),
            fix=f"gpuaudit trace {path} (add --gpu-model/--provider or --price as for report)")


def _head_lines(path: Path) -> tuple[bytes, list[str]]:
    """The first 64 KiB (whole lines) decoded as UTF-8; a bad byte is a located error."""
    head = _read_head(path)
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:]
    if len(head) == _HEAD_BYTES and b"\n" in head:
        head = head[: head.rindex(b"\n") + 1]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = head[: exc.start].count(b"\n") + 1
        raise _utf8_error(path, line, head[exc.start]) from exc
    lines = [ln for ln in text.splitlines()]
    while lines and not lines[0].strip():
        raise InputError("the first line is empty", where=f"{path}:1",
                         fix="remove leading blank lines; the first line must be the header "
                         "(or data, for a noheader log)")
    if not lines:
        raise InputError("no lines", where=str(path), fix="check the file was written")
    return head, lines


def _utf8_error(path: Path, line: int, byte: int) -> InputError:
    return InputError(
        f"byte 0x{byte:02x} is not UTF-8 text",
        where=f"{path}:{line}",
        fix="re-save the file as UTF-8, e.g. iconv -f latin1 -t utf-8 in > out",
    )


def _scan_lines(path: Path, predicate: Callable[[int, bytes], bool]) -> int | None:
    """1-based number of the first line matching ``predicate`` (the error path only)."""
    if any(path.name.endswith(ext) for ext in _COMPRESSED):
        try:
            with open_stream(path) as f:
                for no, line in enumerate(io.BufferedReader(_NativeRaw(f)), start=1):
                    if predicate(no, line):
                        return no
        except OSError:
            return None  # cut short: the caller names what it found so far
        return None
    with open(path, "rb") as g:
        for no, line in enumerate(g, start=1):
            if predicate(no, line):
                return no
    return None


class _NativeRaw(io.RawIOBase):
    """A pyarrow stream as a Python raw stream (to iterate lines without reading it whole)."""

    def __init__(self, f: Any) -> None:
        super().__init__()
        self._f = f

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        chunk = self._f.read(len(view))
        view[: len(chunk)] = chunk
        return len(chunk)


def _csv_error(path: Path, exc: Exception, ncols: int, header_lines: int) -> InputError:
    msg = str(exc)
    if "UTF8" in msg or "utf8" in msg.lower():
        bad: list[int] = []

        def not_utf8(_no: int, line: bytes) -> bool:
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                bad.append(line[e.start])
                return True
            return False

        no = _scan_lines(path, not_utf8)
        return _utf8_error(path, no or 0, bad[0] if bad else 0)
    m = re.search(r"Expected (\d+) columns, got (\d+)", msg)
    if m:
        def wrong_count(no: int, line: bytes) -> bool:
            if no <= header_lines or not line.strip():
                return False
            return line.count(b",") + 1 != ncols

        no = _scan_lines(path, wrong_count)
        return InputError(
            f"row has {m.group(2)} columns, the header has {m.group(1)}",
            where=f"{path}:{no}" if no else str(path),
            fix="repair or remove this line (a log cut off mid-write leaves a short last line)",
        )
    return InputError(f"cannot read as CSV: {msg}", where=str(path),
                      fix="check the file is comma-separated text")


def _jsonl_error(path: Path, exc: Exception) -> InputError:
    bad: list[str] = []

    def not_json(_no: int, line: bytes) -> bool:
        if not line.strip():
            return False
        try:
            obj = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            bad.append("not UTF-8")
            return True
        except ValueError as e:
            bad.append(str(e))
            return True
        if not isinstance(obj, dict):
            bad.append("not a JSON object")
            return True
        return False

    no = _scan_lines(path, not_json)
    if no is not None:
        return InputError(f"line is not a JSON object ({bad[0]})", where=f"{path}:{no}",
                          fix="write one JSON object per line, UTF-8")
    return InputError(f"cannot read as JSON Lines: {exc}", where=str(path),
                      fix="write one JSON object per line with the same keys and value types "
                      "on every line")


def _csv_batches(
    path: Path, names: list[str], header_lines: int, block: int, batch_rows: int,
    book: NoteBook,
) -> Iterator[tuple[pa.RecordBatch, Locate]]:
    """Raw text batches of about ``batch_rows`` rows with each row's line number (blank
    lines and repeated headers from appended logs are dropped and counted)."""
    seen = 0
    for group in batch_groups(_csv_blocks(path, names, header_lines, block), batch_rows):
        batch = _one_batch(group)
        base = header_lines + seen
        seen += batch.num_rows
        blank = pc.is_null(batch.column(0))
        for i in range(1, batch.num_columns):
            blank = pc.and_(blank, pc.is_null(batch.column(i)))
        n_blank = pc.sum(blank).as_py() or 0
        repeat = pc.fill_null(pc.equal(pc.ascii_trim_whitespace(batch.column(0)), names[0]),
                              False)
        n_repeat = pc.sum(repeat).as_py() or 0
        if not (n_blank or n_repeat):
            yield batch, _at_line(path, base)
            continue
        drop = pc.or_(blank, repeat)
        keep = np.flatnonzero(~np.asarray(drop.to_numpy(zero_copy_only=False)))
        if n_blank:
            first = base + 1 + int(pc.index(blank, True).as_py())
            book.add("blank lines skipped", int(n_blank), f"{path}:{first}")
        if n_repeat:
            first = base + 1 + int(pc.index(repeat, True).as_py())
            book.add("repeated header lines skipped (appended logs)", int(n_repeat),
                     f"{path}:{first}")
        yield batch.take(pa.array(keep)), _at_lines(path, keep + base + 1)


def _one_batch(parts: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(parts) == 1:
        return parts[0]
    return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]


def _csv_blocks(path: Path, names: list[str], header_lines: int,
                block: int) -> Iterator[pa.RecordBatch]:
    """The parser's blocks, every column as text (``pyarrow.csv.open_csv``).

    Arrow's streaming reader reads up to 32 blocks ahead of the consumer, so the block is
    kept small (:data:`_MAX_BLOCK`): that read-ahead, not the file, bounds memory.
    """
    read = pcsv.ReadOptions(column_names=names, skip_rows=header_lines, block_size=block,
                            use_threads=True)
    parse = pcsv.ParseOptions(ignore_empty_lines=False)
    conv = pcsv.ConvertOptions(column_types={n: pa.string() for n in names},
                               null_values=smi.NULL_VALUES, strings_can_be_null=True,
                               quoted_strings_can_be_null=True)
    try:
        with open_stream(path) as stream:
            reader = pcsv.open_csv(stream, read_options=read, parse_options=parse,
                                   convert_options=conv)
            yield from reader
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _csv_error(path, exc, len(names), header_lines) from exc
    except OSError as exc:
        raise _decompress_error(path, exc) from exc

