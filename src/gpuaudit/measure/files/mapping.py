"""From a file's own columns to the sample table: column mapping, resolution and conversion.

A source column reaches the table by, in order: the user's ``--map`` (``src=target``), its
name being a sample-table column, its name being an ``nvidia-smi --query-gpu`` field (header
units such as ``[MiB]`` allowed), or a known alias of one (``temperature_C``). A target is a
table column, optionally with a scale (``util_gpu_pct:ratio``, ``sm_active:percent``) or an
epoch unit (``ts:ms``), ``label:<key>`` (lands in ``labels``) or ``-`` (dropped on purpose).
Everything not imported is listed in an :class:`~gpuaudit.schema.ImportNote`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuaudit import schema
from gpuaudit.errors import InputError
from gpuaudit.limits import MAX_LABEL_CHARS
from gpuaudit.measure.files import nvidia_smi as smi
from gpuaudit.measure.files.nulls import nulls
from gpuaudit.schema import ImportNote

__all__ = ["BatchConverter", "NoteBook", "Plan", "Target", "parse_mapping", "parse_target",
           "resolve_columns"]

Locate = Callable[[int], str]

_TS_UNITS = ("s", "ms", "us", "ns")
_STRING_COLS = {"host", "gpu_uuid", "gpu_model", "mig_profile", "namespace", "pod", "container"}


@dataclass(frozen=True)
class Target:
    """Where one source column goes."""

    column: str | None  # sample-table column; None for a label or a dropped column
    label: str | None = None
    scale: str | None = None  # "ratio" | "percent": the scale the *source* is written in
    ts_unit: str | None = None
    drop: bool = False


def valid_targets() -> list[str]:
    """Every target name ``--map`` accepts, for error messages."""
    return [*schema.column_names(), "label:<key>", "-"]


def parse_target(spec: str, *, source: str = "") -> Target:
    """``'util_gpu_pct:ratio'``, ``'ts:ms'``, ``'label:team'``, ``'-'`` -> :class:`Target`."""
    text = spec.strip()
    where = f"--map {source}={spec}" if source else f"--map target {spec!r}"
    if text in ("-", "ignore"):
        return Target(None, drop=True)
    if text.startswith("label:"):
        key = text[len("label:"):].strip()
        if not key:
            raise InputError("label target without a key", where=where,
                             fix="write label:<key>, e.g. --map user_name=label:user")
        return Target(None, label=key)
    name, _, suffix = text.partition(":")
    name, suffix = name.strip(), suffix.strip()
    names = schema.column_names()
    if name not in names:
        raise InputError(
            f"unknown target column {name!r}", where=where,
            fix="map to one of: " + ", ".join(valid_targets()),
        )
    col = schema.column(name)
    if not suffix:
        return Target(name)
    if name == "ts" and suffix in _TS_UNITS:
        return Target(name, ts_unit=suffix)
    if suffix in ("ratio", "percent") and col.scale is not None:
        return Target(name, scale=suffix)
    allowed = "s, ms, us, ns" if name == "ts" else (
        "ratio, percent" if col.scale else "none")
    raise InputError(
        f"unknown suffix {suffix!r} for target column {name!r}", where=where,
        fix=f"suffixes allowed on {name}: {allowed}",
    )


def parse_mapping(text: str) -> dict[str, str]:
    """``"gpu_util=util_gpu_pct:ratio,time=ts,pod_name=pod"`` -> ``{source: target}``.

    Targets are checked here (an unknown one is an error listing the valid ones); whitespace
    around names is ignored; the same source mapped twice is an error.
    """
    out: dict[str, str] = {}
    for i, item in enumerate(text.split(",")):
        if not item.strip():
            continue
        src, eq, tgt = item.partition("=")
        src, tgt = src.strip(), tgt.strip()
        if not eq or not src or not tgt:
            raise InputError(
                f"mapping item {i + 1} {item.strip()!r} is not source=target",
                where="--map",
                fix="write comma-separated source_column=table_column pairs, e.g. "
                "--map gpu_util=util_gpu_pct,time=ts,pod_name=pod",
            )
        if src in out:
            raise InputError(f"source column {src!r} is mapped twice", where="--map",
                             fix="map each source column once")
        parse_target(tgt, source=src)
        out[src] = tgt
    return out


class NoteBook:
    """Collects :class:`ImportNote` s, merging repeats of one reason and column."""

    def __init__(self) -> None:
        self._notes: dict[tuple[str, str | None], ImportNote] = {}

    def add(self, reason: str, count: int, where: str | None = None,
            column: str | None = None) -> None:
        key = (reason, column)
        old = self._notes.get(key)
        if old is None:
            self._notes[key] = ImportNote(reason, count, where, column)
        else:
            self._notes[key] = ImportNote(reason, old.count + count, old.where, column)

    @property
    def notes(self) -> tuple[ImportNote, ...]:
        return tuple(self._notes.values())


@dataclass(frozen=True)
class SourceColumn:
    """One imported source column: its position, target and how it was recognised."""

    name: str
    position: int
    target: Target
    kind: str  # "map" | "table" | "nvidia-smi" | "alias"
    unit: str | None = None


@dataclass(frozen=True)
class Plan:
    columns: tuple[SourceColumn, ...]
    nvidia_smi: bool
    static_notes: tuple[ImportNote, ...] = field(default=())

    def has(self, column: str) -> bool:
        return any(c.target.column == column for c in self.columns)


def resolve_columns(
    names: Sequence[str],
    mapping: Mapping[str, str] | None,
    *,
    where: str,
) -> Plan:
    """Decide where every source column goes (see module doc); ``where`` names the header."""
    mapping = dict(mapping or {})
    missing = [s for s in mapping if s not in names
               and s not in {smi.split_header_unit(n)[0] for n in names}]
    if missing:
        raise InputError(
            f"--map names column(s) {missing} that the file does not have",
            where=where, fix=f"the file's columns are: {', '.join(names)}",
        )
    chosen: dict[str, tuple[int, SourceColumn]] = {}  # target key -> (rank, column)
    notes: list[ImportNote] = []
    unknown: list[str] = []
    known_unused: list[str] = []
    dropped: list[str] = []
    nvsmi = False
    for pos, raw_name in enumerate(names):
        base, header_unit = smi.split_header_unit(raw_name)
        spec = mapping.get(raw_name, mapping.get(base))
        rank: int
        unit: str | None = None
        if spec is not None:
            target = parse_target(spec, source=raw_name)
            if target.drop:
                dropped.append(raw_name)
                continue
            kind, rank = "map", -1
            field_name = smi.resolve_header(raw_name)
            if field_name and smi.FIELDS[field_name].column == target.column:
                unit = smi.FIELDS[field_name].unit
        elif base in schema.column_names():
            target, kind, rank = Target(base), "table", 0
        else:
            field_name = smi.resolve_header(raw_name)
            if field_name is None:
                if smi.is_known_field(raw_name):
                    known_unused.append(raw_name)
                    nvsmi = True
                else:
                    unknown.append(raw_name)
                continue
            fld = smi.FIELDS[field_name]
            exact = base.lower() == field_name
            kind = "nvidia-smi" if exact else "alias"
            nvsmi = True
            rank = fld.rank + (0 if exact else 10)
            unit = fld.unit
            if fld.column.startswith("label:"):
                target = Target(None, label=fld.column[len("label:"):])
            else:
                target = Target(fld.column)
        if header_unit and unit and header_unit not in (unit, f"°{unit}"):
            raise InputError(
                f"column {raw_name!r} is in {header_unit}, expected {unit}",
                where=f"{where}, column {pos + 1}",
                fix=f"convert the column to {unit} before importing",
            )
        if header_unit and not unit and target.column in ("ts", "gpu_index"):
            unit = None
        key = target.column or f"label:{target.label}"
        col = SourceColumn(raw_name, pos, target, kind, unit)
        prev = chosen.get(key)
        if prev is not None:
            if prev[0] == rank == -1:
                raise InputError(
                    f"--map sends both {prev[1].name!r} and {raw_name!r} to {key!r}",
                    where="--map", fix="map only one source column to each target",
                )
            loser = col if rank >= prev[0] else prev[1]
            if rank < prev[0]:
                chosen[key] = (rank, col)
            notes.append(ImportNote(
                f"column {loser.name!r} not imported: {key} already comes from "
                f"{chosen[key][1].name!r}", 1, where, loser.name))
            continue
        chosen[key] = (rank, col)
    if unknown and not mapping:
        raise InputError(
            f"unknown column(s) {unknown}: not sample-table columns, nvidia-smi --query-gpu "
            "fields or known aliases",
            where=where,
            fix=f"map them, e.g. --map '{unknown[0]}=label:{unknown[0]}' to keep it as a "
            f"label, '{unknown[0]}=<table column>', or '{unknown[0]}=-' to drop it",
        )
    if unknown:
        notes.append(ImportNote(
            f"unmapped column(s) not imported: {', '.join(unknown)}", len(unknown), where))
    if known_unused:
        notes.append(ImportNote(
            "nvidia-smi field(s) with no sample-table column, not imported: "
            + ", ".join(known_unused), len(known_unused), where))
    if dropped:
        notes.append(ImportNote(f"column(s) dropped by --map: {', '.join(dropped)}",
                                len(dropped), where))
    cols = tuple(sorted((c for _r, c in chosen.values()), key=lambda c: c.position))
    return Plan(cols, nvsmi, tuple(notes))


# --------------------------------------------------------------------------- conversion


def _as_array(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_dictionary(t))


def _first_null(arr: pa.Array) -> int:
    return int(pc.index(pc.is_null(arr), True).as_py())


def _const_dict(value: str, n: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)),
                                          pa.array([value], type=pa.string()))


def _header_scale(name: str) -> str | None:
    """The scale a header states: ``utilization_gpu_percent``, ``gpu_util_pct``,
    ``util [%]`` -> percent; ``sm_active_ratio`` -> ratio; None when it says nothing."""
    base, unit = smi.split_header_unit(name)
    low = base.strip().lower()
    if unit == "%" or low.endswith(("percent", "pct", "%")):
        return "percent"
    if low.endswith(("ratio", "fraction")):
        return "ratio"
    return None


class BatchConverter:
    """Turns raw batches (a file's own columns) into sample-table batches.

    Decisions taken on the first values (timestamp format, epoch unit, ratio-vs-percent
    auto-detection) stay fixed for the rest of the stream and are reported once as notes.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        host: str,
        host_from: str,
        gpu_model: str | None,
        tz: str,
        notes: NoteBook,
        where: str,
    ) -> None:
        self.plan = plan
        self.host = host
        self.host_from = host_from
        self.gpu_model = gpu_model
        self.tz = tz
        self.notes = notes
        self.where = where
        self._time_fmt: smi.TimeFormat | None = None
        self._ts_state: dict[str, int] = {}  # local times across a DST change
        self._auto_scale: dict[str, str] = {}
        for note in plan.static_notes:
            notes.add(note.reason, note.count, note.where, note.column)
        if not plan.has("ts"):
            raise InputError(
                "no timestamp column", where=where,
                fix="name the time column with --map <column>=ts (add :s/:ms/:us/:ns for "
                "epoch numbers), or for a noheader nvidia-smi log include 'timestamp' in "
                "--fields",
            )

    # -- per column ------------------------------------------------------------------
    def _count_nulls(self, arr: pa.Array, sc: SourceColumn, locate: Locate) -> None:
        if arr.null_count and sc.target.column not in (None, "gpu_model", "mig_profile",
                                                       "namespace", "pod", "container",
                                                       "xid", "labels"):
            self.notes.add(
                "empty, N/A or [Not Supported] values read as null (not measured)",
                arr.null_count, locate(_first_null(arr)), sc.name)

    def _time(self, arr: pa.Array, sc: SourceColumn, locate: Locate) -> pa.Array:
        if self._time_fmt is None:
            fmt = smi.detect_time_format(arr, self.tz, sc.target.ts_unit)
            if fmt is None:
                return arr
            fmt = replace(fmt, example_where=locate(fmt.example_row))
            self._time_fmt = fmt
            if fmt.kind == "epoch" and sc.target.ts_unit is None:
                self.notes.add(f"epoch timestamps read as {fmt.epoch_unit} since 1970 "
                               "(told by their magnitude)", 1, fmt.example_where, sc.name)
            if fmt.assumed_tz:
                self.notes.add(f"timestamps carry no time zone; assumed {fmt.assumed_tz} "
                               "(pass --tz to change)", 1, fmt.example_where, sc.name)
        out = smi.parse_timestamp(arr, self._time_fmt, column=sc.name, locate=locate,
                                  state=self._ts_state)
        if out.null_count:
            row = _first_null(out)
            raise InputError(f"column {sc.name!r} has an empty timestamp", where=locate(row),
                             fix="every sample needs a time; remove or repair this row")
        return out

    def _number(self, arr: pa.Array, sc: SourceColumn, col: schema.Column,
                locate: Locate) -> pa.Array:
        work_type = pa.float64() if pa.types.is_floating(col.type) else col.type
        if col.type == pa.uint64():
            out = (smi.parse_hex_mask(arr, column=sc.name, locate=locate) if _is_text(arr.type)
                   else pc.cast(arr, pa.uint64()))
            return out
        if pa.types.is_integer(work_type):
            work_type = pa.int64()
        if _is_text(arr.type):
            out = smi.parse_number(arr, work_type, unit=sc.unit, column=sc.name, locate=locate)
        else:
            try:
                out = pc.cast(arr, work_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InputError(f"column {sc.name!r} of type {arr.type} cannot be read as "
                                 f"{col.name} ({col.type})", where=self.where,
                                 fix="give numbers in this column") from exc
        out, n_bad = schema.null_sentinels(out)
        if n_bad:
            self.notes.add("NaN or DCGM blank sentinel values read as null", n_bad,
                           locate(0), sc.name)
        return self._scale(out, sc, col, locate)

    def _scale(self, out: pa.Array, sc: SourceColumn, col: schema.Column,
               locate: Locate) -> pa.Array:
        """The source's scale -> the table column's. A scale declared in the mapping
        (``util_gpu_pct:percent``) or by the header (``utilization_gpu_percent``,
        ``util [%]``, ``..._ratio``) is obeyed whatever the values look like. A mapped or
        aliased column without one is judged by its range on the first rows that hold a
        non-zero value: largest value at most 1 -> a ratio, above 1 -> a percent (averaged
        readings such as 0.47 beside 28.2 are percent; whether values are whole numbers
        decides nothing); the decision is a data note and holds for the whole file."""
        if col.scale is None:
            return out
        given = sc.target.scale
        said = (_header_scale(sc.name) if given is None and sc.kind in ("map", "alias")
                else None)
        if said is not None:  # the header states it (utilization_gpu_percent): obeyed
            given = said
        elif given is None and sc.kind in ("map", "alias"):
            given = self._auto_scale.get(col.name)
            mx = float(pc.max(out).as_py() or 0.0) if len(out) > out.null_count else 0.0
            if given is None and mx > 0.0:
                given = self._auto_scale[col.name] = "ratio" if mx <= 1.0 else "percent"
                other = "percent" if given == "ratio" else "ratio"
                self.notes.add(
                    f"column {sc.name!r} read as a {given} "
                    f"({'0..1' if given == 'ratio' else '0..100'}) for {col.name}: its "
                    f"largest value in the first rows is {mx:g}, "
                    f"{'at most 1' if given == 'ratio' else 'above 1'} (map it with "
                    f"{col.name}:{other} to override)", 1, locate(0), sc.name)
            elif given == "ratio" and mx > 1.0:  # decided on earlier rows, contradicted here
                row = int(pc.index(pc.greater(out, 1.0), True).as_py())
                raise InputError(
                    f"column {sc.name!r} was read as a ratio (0..1) for {col.name}, since its "
                    f"first values were at most 1, but this row holds {out[row].as_py()}",
                    where=locate(row),
                    fix=f"declare the scale in the mapping: {sc.name}={col.name}:percent "
                    f"(or {col.name}:ratio if the values above 1 are wrong)")
        if given is None or given == col.scale:
            return out
        if given == "ratio":
            return pc.multiply(out, 100.0)
        return pc.divide(out, 100.0)

    def _text(self, arr: pa.Array) -> pa.Array:
        s = pc.cast(arr, pa.string()) if not pa.types.is_string(arr.type) else arr
        s = pc.ascii_trim_whitespace(s)
        return pc.if_else(pc.equal(s, ""), pa.scalar(None, pa.string()), s)

    def _labels_column(self, arr: pa.Array, sc: SourceColumn,
                       parts: list[tuple[str, pa.Array]]) -> pa.Array | None:
        if pa.types.is_map(arr.type):
            return arr
        if pa.types.is_struct(arr.type):
            for i in range(arr.type.num_fields):
                f = arr.type.field(i)
                if pa.types.is_nested(f.type):
                    raise InputError(
                        f"label {f.name!r} of column {sc.name!r} holds a nested value "
                        f"({f.type}); a label is one string or number",
                        where=self.where,
                        fix=f'flatten it ({{"{f.name}": "value"}}) or drop the column with '
                        f"--map {sc.name}=-")
                parts.append((f.name, pc.struct_field(arr, [i])))
            return None
        if _is_text(arr.type):
            enc = pc.dictionary_encode(pc.cast(arr, pa.string()))
            uniques = []
            for text in enc.dictionary.to_pylist():
                try:
                    obj = json.loads(text) if text else {}
                except ValueError as exc:
                    raise InputError(f"column {sc.name!r} value {text!r} is not a JSON object",
                                     where=self.where,
                                     fix='write labels as {"team": "a", "project": "b"}') from exc
                if not isinstance(obj, dict):
                    raise InputError(f"column {sc.name!r} value {text!r} is not a JSON object",
                                     where=self.where,
                                     fix='write labels as {"team": "a", "project": "b"}')
                uniques.append([(str(k), None if v is None else str(v)) for k, v in obj.items()])
            maps = pa.array(uniques, type=schema.column("labels").type)
            return pc.take(maps, enc.indices)
        raise InputError(f"column {sc.name!r} of type {arr.type} cannot hold labels",
                         where=self.where, fix="give labels as a map or a JSON object")

    # -- whole batch -------------------------------------------------------------------
    def convert(self, raw: pa.RecordBatch | pa.Table, locate: Locate) -> pa.Table:
        """Convert one raw batch; ``locate(row)`` names the row's place in the file."""
        n = raw.num_rows
        cols: dict[str, pa.Array] = {}
        label_parts: list[tuple[str, pa.Array]] = []
        labels_col: pa.Array | None = None
        for sc in self.plan.columns:
            arr = _as_array(raw.column(sc.position))
            if pa.types.is_null(arr.type):
                arr = pa.nulls(n, pa.string())
            self._count_nulls(arr, sc, locate)
            tgt = sc.target
            if tgt.label is not None:
                label_parts.append((tgt.label, self._text(arr)))
                continue
            assert tgt.column is not None
            col = schema.column(tgt.column)
            if tgt.column == "ts":
                cols["ts"] = self._time(arr, sc, locate)
            elif tgt.column == "labels":
                labels_col = self._labels_column(arr, sc, label_parts)
            elif tgt.column in _STRING_COLS:
                cols[tgt.column] = self._text(arr)
            else:
                cols[tgt.column] = self._number(arr, sc, col, locate)
        self._identity(cols, n, locate)
        for c in schema.COLUMNS:
            if c.name not in cols and c.name != "labels":
                cols[c.name] = nulls(c.type, n)  # (sliced from one array per type)
        if label_parts:
            if labels_col is not None:
                raise InputError("labels come both from a labels column and from label:<key> "
                                 "columns", where=self.where,
                                 fix="use one way of giving labels")
            labels_col = build_labels(label_parts, n)
        if labels_col is not None:
            self._check_label_lengths(labels_col, locate)
            cols["labels"] = labels_col
        return schema.build_table(cols, n)

    def _check_label_lengths(self, labels: pa.Array, locate: Locate) -> None:
        """No label key or value longer than :data:`gpuaudit.limits.MAX_LABEL_CHARS`: a label
        names a team or a job; a megabyte "label" is a mistake in the file or the mapping."""
        if len(labels) == 0 or labels.null_count == len(labels):
            return
        for part, what in ((labels.keys, "key"), (labels.items, "value")):
            lengths = pc.utf8_length(part)
            top = pc.max(lengths).as_py()
            if top is None or top <= MAX_LABEL_CHARS:
                continue
            at = int(np.argmax(lengths.to_numpy(zero_copy_only=False) > MAX_LABEL_CHARS))
            offsets = labels.offsets.to_numpy()
            row = int(np.searchsorted(offsets, at, side="right")) - 1
            raise InputError(
                f"a label {what} of {top:,} characters (the limit is {MAX_LABEL_CHARS:,}): "
                f"{str(part[at].as_py())[:60]!r}...",
                where=locate(row),
                fix="labels name a team, project or job: map a long column to '-' to drop "
                "it (--map COLUMN=-) or shorten it")

    def _identity(self, cols: dict[str, pa.Array], n: int, locate: Locate) -> None:
        for name in ("host", "gpu_uuid"):
            arr = cols.get(name)
            if arr is not None and arr.null_count:
                row = _first_null(arr)
                raise InputError(f"empty {name} value", where=locate(row),
                                 fix=f"every row needs a {name}; repair this row")
        host_arr = cols.get("host")
        if host_arr is None:
            if n:
                self.notes.add(f"no host column: host {self.host!r} taken from "
                               f"{self.host_from}", n, locate(0), "host")
            cols["host"] = _const_dict(self.host, n)
        if "gpu_uuid" not in cols:
            cols["gpu_uuid"] = self._derive_uuid(cols, host_arr, n, locate)
        model = cols.get("gpu_model")
        if self.gpu_model is not None:
            if model is None:
                cols["gpu_model"] = _const_dict(self.gpu_model, n)
            elif model.null_count:
                cols["gpu_model"] = pc.fill_null(model, self.gpu_model)
        elif model is None and n:
            self.notes.add("no GPU model in the file: gpu_model is null (pricing needs "
                           "--gpu-model)", n, locate(0), "gpu_model")

    def _derive_uuid(self, cols: dict[str, pa.Array], host_arr: pa.Array | None, n: int,
                     locate: Locate) -> pa.Array:
        idx = cols.get("gpu_index")
        pod = cols.get("pod")
        if idx is not None:
            if idx.null_count:
                row = _first_null(idx)
                raise InputError("empty GPU index and no uuid column to tell GPUs apart",
                                 where=locate(row),
                                 fix="repair this row, or include uuid in --query-gpu")
            key, how = pc.cast(idx, pa.string()), "host/gpu<index>"
            sep = "/gpu"
        elif pod is not None:
            key, how, sep = pc.fill_null(pod, "(no pod)"), "host/<pod> (one series per pod)", "/"
        else:
            key, how, sep = None, "host/gpu (all rows of a host are one GPU)", "/gpu"
        if n:
            self.notes.add(f"no GPU uuid column: gpu_uuid derived as {how}", n, locate(0),
                           "gpu_uuid")
        if key is None:
            if host_arr is None:
                return _const_dict(f"{self.host}/gpu", n)
            return pc.binary_join_element_wise(host_arr, "gpu", "/")
        if host_arr is None:
            enc = pc.dictionary_encode(key)
            names = [f"{self.host}{sep}{v}" for v in enc.dictionary.to_pylist()]
            return pa.DictionaryArray.from_arrays(enc.indices, pa.array(names, pa.string()))
        return pc.binary_join_element_wise(host_arr, key, sep)


def build_labels(parts: Sequence[tuple[str, pa.Array]], n: int) -> pa.Array:
    """Label columns -> one ``map<string, string>`` column (null cells leave the key out)."""
    keys_all = [k for k, _ in parts]
    valid = np.stack([np.asarray(pc.is_valid(a).to_numpy(zero_copy_only=False))
                      for _, a in parts], axis=1) if parts else np.zeros((n, 0), bool)
    counts = valid.sum(axis=1, dtype=np.int32)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    rows, which = np.nonzero(valid)
    combined = pa.concat_arrays([pc.cast(a, pa.string()) for _, a in parts])
    values = combined.take(pa.array(which.astype(np.int64) * n + rows))
    keys = pa.array(keys_all, pa.string()).take(pa.array(which))
    return pa.MapArray.from_arrays(pa.array(offsets), keys, values,
                                   type=schema.column("labels").type)
