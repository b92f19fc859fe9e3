"""The sample table: the one contract between measurement and everything after it.

One row per GPU (or MIG instance) per sample, as an Arrow table. Units live in column names.
A column a source cannot measure is null, never a fake zero. Every source (NVML, dcgm-exporter,
Prometheus, files, profiler traces) produces this table; every analysis reads only this table.

``gpu_uuid`` names one time series: a whole GPU's UUID, an NVML MIG device UUID
(``MIG-...``), or ``<parent-uuid>/gi<GPU_I_ID>`` for a MIG instance seen through DCGM.
Within one ``gpu_uuid`` timestamps strictly increase, except that a GPU time-sliced between
several pods may repeat a timestamp once per pod, each such row carrying ``gpu_share`` (the
pod's share of that GPU at that time; the shares of one timestamp sum to 1).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuaudit.errors import SampleTableError
from gpuaudit.series import LEAN_LABEL_KEYS, ImportNote, series_order

__all__ = [
    "COLUMNS",
    "DCGM_SENTINEL_MIN",
    "LEAN_LABEL_KEYS",
    "SAMPLE_SCHEMA",
    "Column",
    "ImportNote",
    "OrderCheck",
    "Recording",
    "SampleSource",
    "build_table",
    "empty_table",
    "float_blanks",
    "lean_table",
    "null_sentinels",
    "series_order",
    "validate",
]


@dataclass(frozen=True)
class Column:
    """One column of the sample table: name (with unit), Arrow type, valid range, meaning."""

    name: str
    type: pa.DataType
    nullable: bool
    doc: str
    lo: float | None = None
    hi: float | None = None
    scale: str | None = None  # "percent" (0..100) or "ratio" (0..1)


_DICT = pa.dictionary(pa.int32(), pa.string())
TS_TYPE = pa.timestamp("ns", tz="UTC")

COLUMNS: tuple[Column, ...] = (
    Column("ts", TS_TYPE, False, "sample time, UTC"),
    Column("host", _DICT, False, "host name the GPU is attached to"),
    Column("gpu_uuid", _DICT, False, "the time series' identity and join key (see module doc)"),
    Column("gpu_model", _DICT, True, "marketing name, e.g. 'NVIDIA H100 80GB HBM3'"),
    Column("gpu_index", pa.int16(), True, "index as the host enumerates it"),
    Column("mig_profile", pa.string(), True, "MIG profile such as '1g.10gb'; null for a whole GPU"),
    Column("util_gpu_pct", pa.float32(), True,
           "NVML utilization.gpu / DCGM_FI_DEV_GPU_UTIL: share of time any kernel ran",
           0.0, 100.0, "percent"),
    Column("util_mem_pct", pa.float32(), True, "memory controller busy share", 0.0, 100.0,
           "percent"),
    Column("mem_used_mib", pa.float32(), True, "framebuffer used, MiB", 0.0, None),
    Column("mem_total_mib", pa.float32(), True, "framebuffer total, MiB", 0.0, None),
    Column("power_w", pa.float32(), True, "board power draw, W", 0.0, None),
    Column("power_limit_w", pa.float32(), True, "enforced power limit, W", 0.0, None),
    Column("temp_c", pa.float32(), True, "GPU temperature, degrees C", -50.0, 150.0),
    Column("sm_clock_mhz", pa.float32(), True, "SM clock, MHz", 0.0, None),
    Column("energy_j", pa.float64(), True, "cumulative energy counter since driver load, J",
           0.0, None),
    Column("clocks_event_reasons", pa.uint64(), True,
           "NVML clocks event (throttle) reasons bitmask"),
    Column("sm_active", pa.float32(), True, "DCGM_FI_PROF_SM_ACTIVE / GPM SM util, ratio",
           0.0, 1.0, "ratio"),
    Column("sm_occupancy", pa.float32(), True, "DCGM_FI_PROF_SM_OCCUPANCY / GPM, ratio",
           0.0, 1.0, "ratio"),
    Column("tensor_active", pa.float32(), True,
           "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE / GPM tensor util, ratio", 0.0, 1.0, "ratio"),
    Column("dram_active", pa.float32(), True, "DCGM_FI_PROF_DRAM_ACTIVE / GPM DRAM bw, ratio",
           0.0, 1.0, "ratio"),
    Column("gr_engine_active", pa.float32(), True,
           "DCGM_FI_PROF_GR_ENGINE_ACTIVE, ratio (the utilization signal on MIG)",
           0.0, 1.0, "ratio"),
    Column("pcie_tx_bytes_per_s", pa.float64(), True, "PCIe transmit, bytes/s", 0.0, None),
    Column("pcie_rx_bytes_per_s", pa.float64(), True, "PCIe receive, bytes/s", 0.0, None),
    Column("nvlink_tx_bytes_per_s", pa.float64(), True, "NVLink transmit, bytes/s", 0.0, None),
    Column("nvlink_rx_bytes_per_s", pa.float64(), True, "NVLink receive, bytes/s", 0.0, None),
    Column("host_cpu_util_pct", pa.float32(), True,
           "the host's CPU busy share over the sample interval, all cores (psutil.cpu_times "
           "deltas; node_exporter node_cpu_seconds_total, non-idle modes over all modes)",
           0.0, 100.0, "percent"),
    Column("proc_cpu_util_pct", pa.float32(), True,
           "the measured workload's process tree (its pid and every descendant) CPU time over "
           "the sample interval, as a percent of ALL the host's cores (top's 400% on 4 cores "
           "is 100 here), so it shares host_cpu_util_pct's scale", 0.0, 100.0, "percent"),
    Column("ecc_dbe_total", pa.int64(), True, "volatile double-bit ECC errors (count)", 0.0,
           None),
    Column("xid", pa.int64(), True, "last XID error code seen, null if none"),
    Column("namespace", pa.string(), True, "Kubernetes namespace holding the GPU"),
    Column("pod", pa.string(), True, "Kubernetes pod (or job) holding the GPU"),
    Column("container", pa.string(), True, "container holding the GPU"),
    Column("gpu_share", pa.float32(), True,
           "share of this GPU held by this row's pod when time-sliced; null means whole",
           0.0, 1.0, "ratio"),
    Column("labels", pa.map_(pa.string(), pa.string()), True,
           "everything else: team, project, user, experiment, job id"),
)

SAMPLE_SCHEMA: pa.Schema = pa.schema([pa.field(c.name, c.type, c.nullable) for c in COLUMNS])
_BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}

#: dcgm-exporter and DCGM report "blank" values as huge sentinels (DCGM_FT_INT64_BLANK and
#: friends start at 0x7ffffff0 for int32 and 9223372036854775792 for int64; FP64 blank is
#: 140737488355328.0). Anything at or above these is "not measured", never a reading.
DCGM_SENTINEL_MIN = 9223372036854775792
_DCGM_INT32_BLANK_MIN = 0x7FFFFFF0
_DCGM_FP64_BLANK_MIN = 140737488355328.0

#: Parquet key-value metadata keys of a gpuaudit recording.
META_VERSION = b"gpuaudit.version"
META_SOURCE = b"gpuaudit.source"
META_ORIGIN = b"gpuaudit.origin"
META_INTERVAL_S = b"gpuaudit.interval_s"
META_HOST = b"gpuaudit.host"
META_START = b"gpuaudit.start"


@dataclass(frozen=True)
class Recording:
    """A validated sample table plus what is known about where it came from.

    ``source`` is a short kind (``nvml``, ``nvidia-smi-csv``, ``dcgm-exporter``,
    ``prometheus``, ``parquet``, ``csv``, ``trace``); ``origin`` is a human sentence naming
    the file, URL or public dataset the samples came from, shown in every report.
    ``interval_s`` is the nominal sampling interval (None when unknown: classify infers it).
    ``series_end_ns`` says where a series' observation ends (``gpu_uuid`` -> Unix ns) when
    the source knows it, as a profiler trace knows its window's end: that series' last sample
    stands until then instead of one nominal interval.
    """

    table: pa.Table
    source: str
    origin: str
    interval_s: float | None = None
    notes: tuple[ImportNote, ...] = ()
    events: tuple[str, ...] = ()
    meta: Mapping[str, str] = field(default_factory=dict)
    series_end_ns: Mapping[str, int] = field(default_factory=dict)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The table as record batches, so a Recording is also a :class:`SampleSource`."""
        yield from self.table.to_batches(max_chunksize=1 << 20)


@runtime_checkable
class SampleSource(Protocol):
    """Samples that arrive as a stream of validated batches (bounded memory for big files).

    ``batches()`` yields :data:`SAMPLE_SCHEMA` record batches, each already validated, with
    each GPU's rows in time order across the whole stream. ``notes`` and ``events`` are
    complete once ``batches()`` is exhausted. :class:`Recording` satisfies this protocol.
    """

    source: str
    origin: str
    interval_s: float | None

    @property
    def notes(self) -> tuple[ImportNote, ...]: ...

    @property
    def events(self) -> tuple[str, ...]: ...

    def batches(self) -> Iterator[pa.RecordBatch]: ...


def empty_table() -> pa.Table:
    """A sample table with no rows and every column typed."""
    return SAMPLE_SCHEMA.empty_table()


def _as_array(values: Any, col: Column, length: int) -> pa.Array:
    if values is None:
        return pa.nulls(length, type=col.type)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        arr = values
    elif col.type == TS_TYPE:
        arr = pa.array(values)
    elif pa.types.is_dictionary(col.type):
        arr = pa.array(values, type=pa.string())
    else:
        arr = pa.array(values, type=col.type, from_pandas=True)
    if col.type == TS_TYPE:
        if pa.types.is_timestamp(arr.type):
            if arr.type.tz is None:
                arr = arr.cast(pa.timestamp(arr.type.unit, tz="UTC"))
            arr = arr.cast(TS_TYPE)
        else:
            arr = arr.cast(pa.int64()).cast(TS_TYPE)
        return arr
    if pa.types.is_dictionary(col.type):
        if not pa.types.is_dictionary(arr.type):
            arr = pc.dictionary_encode(arr.cast(pa.string()))
        return arr.cast(col.type)
    return arr.cast(col.type)


def build_table(columns: Mapping[str, Any], length: int | None = None) -> pa.Table:
    """Assemble a sample table from whatever columns a source has; the rest become nulls.

    ``columns`` maps sample-table column names to arrays or sequences. Unknown names are an
    error (a typo would otherwise vanish). Required columns (ts, host, gpu_uuid) must exist.
    """
    unknown = sorted(set(columns) - set(_BY_NAME))
    if unknown:
        raise SampleTableError(
            f"unknown sample-table column(s) {unknown}",
            column=unknown[0],
            fix=f"use one of: {', '.join(_BY_NAME)}",
        )
    missing = [c for c in ("ts", "host", "gpu_uuid") if columns.get(c) is None]
    if missing:
        raise SampleTableError(
            f"required column(s) {missing} missing",
            column=missing[0],
            fix="every sample needs a timestamp (ts), a host and a gpu_uuid",
        )
    if length is None:
        length = len(columns["ts"])
    arrays = [_as_array(columns.get(c.name), c, length) for c in COLUMNS]
    return pa.Table.from_arrays(arrays, schema=SAMPLE_SCHEMA)


def lean_table(columns: Mapping[str, Any], coded: Mapping[str, pa.Array], *,
               length: int) -> pa.Table:
    """A table in the lean layout classify's engine reads (see
    :func:`~gpuaudit.measure.fleet.dcgm.series_table`): the sample table's columns in its
    order, those of ``coded`` (dictionary columns) in their place or, for names outside
    the sample table (``label:<key>``), appended; every other column that no row has a
    value in (or that ``columns`` lacks) of type null, with no buffers. ``columns`` as for
    :func:`build_table`; ``ts`` is required."""
    fields: list[pa.Field] = []
    arrays: list[pa.Array] = []
    for c in COLUMNS:
        if c.name in coded:
            arr = coded[c.name]
            fields.append(pa.field(c.name, arr.type))
            arrays.append(arr)
            continue
        values = columns.get(c.name)
        arr = None if values is None else _as_array(values, c, length)
        if c.name != "ts" and (arr is None or arr.null_count == length):
            fields.append(pa.field(c.name, pa.null()))
            arrays.append(pa.nulls(length))
        else:
            fields.append(SAMPLE_SCHEMA.field(c.name))
            arrays.append(arr)
    for name, arr in coded.items():
        if name not in _BY_NAME:
            fields.append(pa.field(name, arr.type))
            arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def float_blanks(x: np.ndarray) -> np.ndarray:
    """Where float64 values ``x`` are DCGM blank sentinels (magnitude >= 2**47; NaN is not
    one): the values :func:`null_sentinels` turns into nulls besides NaN, for a caller that
    holds NumPy arrays (no Arrow round trip)."""
    return np.asarray(np.abs(x) >= _DCGM_FP64_BLANK_MIN)


def null_sentinels(arr: pa.Array) -> tuple[pa.Array, int]:
    """Turn NaN and DCGM blank sentinels into nulls; return the array and how many changed."""
    if len(arr) == 0:
        return arr, 0
    if pa.types.is_floating(arr.type):
        bad = pc.or_kleene(pc.is_nan(arr), pc.greater_equal(pc.abs(arr), _DCGM_FP64_BLANK_MIN))
    elif pa.types.is_integer(arr.type):
        limit = _DCGM_INT32_BLANK_MIN if arr.type.bit_width <= 32 else DCGM_SENTINEL_MIN
        if pa.types.is_unsigned_integer(arr.type) and arr.type.bit_width == 64:
            return arr, 0  # bitmasks (clocks_event_reasons) use every bit
        bad = pc.greater_equal(arr, limit)
    else:
        return arr, 0
    bad = pc.fill_null(bad, False)
    n = pc.sum(bad).as_py() or 0
    if n == 0:
        return arr, 0
    return pc.if_else(bad, pa.nulls(len(arr), type=arr.type), arr), int(n)


Locate = Callable[[int], str]


def _first_true(mask: pa.Array | pa.ChunkedArray) -> int:
    idx = pc.index(pc.fill_null(mask, False), True).as_py()
    return int(idx)


def validate(
    table: pa.Table,
    *,
    source: str,
    locate: Locate | None = None,
    check_order: bool = True,
    proven: Collection[str] = (),
) -> pa.Table:
    """Check a sample table against the contract and return it cast to :data:`SAMPLE_SCHEMA`.

    Raises :class:`SampleTableError` naming the column, the row (``locate(row)`` turns it
    into file:line), the value and the fix for: values outside a column's range, negative
    power, a ratio column holding percents, and timestamps that repeat or run backwards
    within one GPU's series. A column's scale is what its name declares (``util_gpu_pct`` is
    percent, 0..100, fractions included): guessing a source's scale from its values is the
    importer's job (:mod:`gpuaudit.measure.files.mapping`, by range). ``proven``: columns
    whose range is already known to hold (a Parquet file's statistics), not checked again.
    """

    def where(row: int) -> str:
        return locate(row) if locate else f"{source}: row {row}"

    if table.schema.names != SAMPLE_SCHEMA.names:
        missing = [n for n in SAMPLE_SCHEMA.names if n not in table.schema.names]
        extra = [n for n in table.schema.names if n not in SAMPLE_SCHEMA.names]
        raise SampleTableError(
            f"columns do not match the sample table (missing {missing}, unknown {extra})",
            column=(missing or extra or ["?"])[0],
            where=source,
            fix="build tables with gpuaudit.schema.build_table",
        )
    if table.schema != SAMPLE_SCHEMA:
        table = table.cast(SAMPLE_SCHEMA)
    if table.num_rows == 0:
        return table
    for col in COLUMNS:
        arr = table.column(col.name)
        if col.name in proven or arr.null_count == len(arr):
            continue
        if col.lo is not None:
            bad = pc.less(arr, col.lo)
            if pc.any(bad).as_py():
                row = _first_true(bad)
                value = arr[row].as_py()
                raise SampleTableError(
                    f"column '{col.name}' = {value} is below {col.lo:g}",
                    column=col.name, row=row, value=value, where=where(row),
                    fix="check the source's units and sign; a value it could not measure "
                    "must be empty, not negative",
                )
        if col.hi is not None:
            bad = pc.greater(arr, col.hi)
            if pc.any(bad).as_py():
                row = _first_true(bad)
                value = arr[row].as_py()
                hint = (
                    "this looks like a percent in a ratio column: divide by 100 (with --map, "
                    "mark the column as percent)"
                    if col.scale == "ratio" and col.hi == 1.0 and value <= 100.0
                    else "check the source's units"
                )
                raise SampleTableError(
                    f"column '{col.name}' = {value} is above {col.hi:g} ({col.scale or 'max'})",
                    column=col.name, row=row, value=value, where=where(row), fix=hint,
                )
    if check_order:
        OrderCheck().check(table, where)
    return table


class OrderCheck:
    """Each GPU's timestamps must increase across a whole stream of tables, not just one.

    Keeps the last timestamp of every ``gpu_uuid`` between calls; a fresh instance checks a
    single table. Rows of a time-sliced GPU (``gpu_share`` set) may repeat a timestamp.
    """

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.last_ts = np.empty(0, dtype=np.int64)
        self._dictionary: pa.Array | None = None
        self._mapping = np.empty(0, dtype=np.int64)

    def check(self, table: pa.Table, where: Callable[[int], str]) -> None:
        uuid = table.column("gpu_uuid").combine_chunks()
        if not pa.types.is_dictionary(uuid.type):
            uuid = pc.dictionary_encode(uuid)
        if self._dictionary is None or not uuid.dictionary.equals(self._dictionary):
            self._dictionary = uuid.dictionary
            self._mapping = np.array([self.codes.setdefault(str(v), len(self.codes))
                                      for v in uuid.dictionary.to_pylist()], dtype=np.int64)
        mapping = self._mapping
        if len(self.codes) > len(self.last_ts):
            grown = np.full(len(self.codes), np.iinfo(np.int64).min, dtype=np.int64)
            grown[: len(self.last_ts)] = self.last_ts
            self.last_ts = grown
        codes = mapping[uuid.indices.to_numpy(zero_copy_only=False)]
        shared = np.asarray(pc.is_valid(table.column("gpu_share")).to_numpy(zero_copy_only=False))
        ts = table.column("ts").cast(pa.int64()).to_numpy()
        bad = order_violation(codes, ts, shared, self.last_ts)
        if bad >= 0:
            gpu = uuid.dictionary[uuid.indices[bad].as_py()].as_py()
            ts_v = table.column("ts")[bad]
            raise SampleTableError(
                f"timestamp {ts_v} repeats or runs backwards for GPU {gpu}",
                column="ts", row=bad, value=str(ts_v), where=where(bad),
                fix="each GPU's samples must be in time order with no duplicates; sort the "
                "file by time, or give each GPU a distinct gpu_uuid (a uuid or index column)",
            )


def order_violation(
    codes: np.ndarray,
    ts_ns: np.ndarray,
    shared: np.ndarray,
    last_ts: np.ndarray | None = None,
) -> int:
    """Index of the first row whose timestamp does not follow its series' previous one, or -1.

    ``codes`` gives each row's series, ``shared`` marks rows of a time-sliced GPU (which may
    repeat a timestamp). ``last_ts`` (per code, int64 min for none) carries state between
    batches of a stream and is updated in place.
    """
    n = codes.shape[0]
    if n == 0:
        return -1
    order = series_order(codes)
    c = codes[order]
    t = ts_ns[order]
    s = shared[order]
    first = np.ones(n, dtype=bool)
    first[1:] = c[1:] != c[:-1]
    prev = np.empty(n, dtype=np.int64)
    prev[1:] = t[:-1]
    if last_ts is not None:
        prev[first] = last_ts[c[first]]
    else:
        prev[first] = np.iinfo(np.int64).min
    ok = (t > prev) | ((t == prev) & s)
    if last_ts is not None:
        last_idx = np.flatnonzero(np.append(c[1:] != c[:-1], True))
        last_ts[c[last_idx]] = t[last_idx]
    if ok.all():
        return -1
    return int(order[int(np.flatnonzero(~ok)[0])])


def column(name: str) -> Column:
    """The :class:`Column` called ``name`` (KeyError lists nothing: use COLUMNS to browse)."""
    return _BY_NAME[name]


def column_names() -> Sequence[str]:
    return [c.name for c in COLUMNS]


@dataclass(frozen=True)
class SeriesId:
    """Who a fleet series belongs to (one GPU, MIG instance, or GPU x pod when time-sliced):
    the identity columns of the sample table, decoded from a dcgm-exporter series' labels by
    :func:`gpuaudit.measure.fleet.dcgm.series_id`."""

    host: str
    gpu_uuid: str
    gpu_model: str | None
    gpu_index: int | None
    mig_profile: str | None
    namespace: str | None
    pod: str | None
    container: str | None
    labels: tuple[tuple[str, str], ...]

    @property
    def gpu_key(self) -> tuple[str, str]:
        return (self.host, self.gpu_uuid)
