"""dcgm-exporter: its metric names and labels, and ``/metrics`` text into the sample table.

Reads the Prometheus text exposition format that NVIDIA dcgm-exporter serves on
``:9400/metrics`` (parsed with ``prometheus_client.parser.text_string_to_metric_families``),
and the same series as Prometheus stores them (``query_range`` results, see
:mod:`gpuaudit.measure.fleet.prometheus`). Facts from the exporter's code and docs this module
respects:

- identity labels: ``UUID`` (``uuid`` in old-name mode), ``gpu`` (index), ``modelName``,
  ``Hostname`` (becoming ``hostname``); ``pci_bus_id``, ``device`` and
  ``DCGM_FI_DRIVER_VERSION`` are ignored;
- Kubernetes labels ``pod``/``namespace``/``container`` appear only for GPUs a container holds
  (old exporters print ``pod=""``: read as null); Prometheus with ``honorLabels: false``
  renames them ``exported_pod``/``exported_namespace``/``exported_container`` (preferred when
  both exist, because then plain ``pod`` is the exporter's own pod);
- MIG instances keep the parent ``UUID`` and add ``GPU_I_PROFILE``/``GPU_I_ID``: their
  ``gpu_uuid`` is ``<parent-uuid>/gi<GPU_I_ID>`` with ``mig_profile`` set; MIG reports no
  ``DCGM_FI_DEV_GPU_UTIL`` (classify falls back to ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``);
- units: ``DCGM_FI_DEV_GPU_UTIL`` percent, ``DCGM_FI_PROF_*`` ratios 0..1 (PCIe/NVLink bytes
  per second), framebuffer MiB, power W, ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` mJ (counter,
  converted once here to J);
- blank values are huge sentinels (``9223372036854775794``): they become nulls, counted in a
  note (:func:`gpuaudit.schema.null_sentinels`); NaN too.

A GPU time-sliced between several pods appears once per pod at the same scrape: those rows
get ``gpu_share = 1 / n`` so the GPU is split, never billed twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuaudit.errors import InputError
from gpuaudit.schema import (
    LEAN_LABEL_KEYS,
    ImportNote,
    SeriesId,
    build_table,
    float_blanks,
    lean_table,
)

__all__ = [
    "DCGM_COLUMNS",
    "IDENTITY_LABELS",
    "KNOWN_UNUSED",
    "LEAN_IDENTITY",
    "UTIL_METRICS",
    "SeriesId",
    "lean_columns",
    "parse_metrics_text",
    "series_id",
    "series_table",
]

#: The utilization metrics, the first preferred: ``util_gpu_pct``, and the graphics engine's
#: activity that classify falls back to where it is missing (MIG instances). A series with
#: either has samples (the scrape interval is found on them; the raw fetch keeps their rows).
UTIL_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE")

#: dcgm-exporter metric -> (sample-table column, factor applied once on import).
DCGM_COLUMNS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_gpu_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("util_mem_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit_w", 1.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("power_limit_w", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", 1e-3),  # mJ -> J
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("clocks_event_reasons", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clocks_event_reasons", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_bytes_per_s", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe_total", 1.0),
    "DCGM_FI_DEV_XID_ERRORS": ("xid", 1.0),
}
#: Framebuffer parts summed into mem_total_mib (free + used + reserved, MiB).
_FB_PARTS = ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED")

#: Metrics the exporter ships by default (etc/default-counters.csv, dcp-metrics-included.csv)
#: that have no sample-table column; read without a warning, listed in one note.
KNOWN_UNUSED: frozenset[str] = frozenset({
    "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DRIVER_VERSION", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION", "DCGM_FI_DEV_COUNT", "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_USED_PERCENT", "DCGM_FI_PROF_NVLINK_L0_TX_BYTES",
    *_FB_PARTS,
})

#: Columns whose DCGM field is 64-bit (the int32 blank range is a real value there).
_WIDE_COLUMNS = frozenset({"energy_j", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
                           "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s",
                           "clocks_event_reasons", "ecc_dbe_total"})
_INT32_BLANK_MIN = float(0x7FFFFFF0)

#: Labels that identify the series or are exporter plumbing; everything else goes to
#: the ``labels`` map (team, project, relabelled pod labels ...).
IDENTITY_LABELS: frozenset[str] = frozenset({
    "__name__", "gpu", "UUID", "uuid", "pci_bus_id", "device", "modelName", "Hostname",
    "hostname", "DCGM_FI_DRIVER_VERSION", "GPU_I_PROFILE", "GPU_I_ID", "pod", "namespace",
    "container", "exported_pod", "exported_namespace", "exported_container", "instance",
    "job", "err_code", "err_msg", "exported_job", "exported_instance", "endpoint", "service",
})


def _blank(v: str | None) -> str | None:
    return v if v else None


def series_id(labels: Mapping[str, str], *, default_host: str, where: str) -> SeriesId:
    """Decode the identity of one series from its labels (see the module doc for names).

    ``default_host`` is used when the series has no ``Hostname``/``hostname`` (the scraped
    endpoint's host, or Prometheus' ``instance``). A series with no UUID is an error.
    """
    uuid = labels.get("UUID") or labels.get("uuid")
    if not uuid:
        raise InputError(
            f"series without a UUID/uuid label: {dict(labels)}",
            where=where,
            fix="point gpuaudit at dcgm-exporter's /metrics (its series carry UUID), or "
            "relabel the series to keep UUID",
        )
    gi = labels.get("GPU_I_ID")
    profile = _blank(labels.get("GPU_I_PROFILE"))
    if gi:
        uuid = f"{uuid}/gi{gi}"
    host = labels.get("Hostname") or labels.get("hostname") or \
        (labels.get("instance", "").rsplit(":", 1)[0] or default_host)
    idx_text = labels.get("gpu")
    try:
        idx = int(idx_text) if idx_text not in (None, "") else None
    except ValueError:
        idx = None
    exported = "exported_pod" in labels or "exported_namespace" in labels
    pfx = "exported_" if exported else ""
    # honorLabels: false and an unheld GPU: plain pod/container name the exporter itself
    own = not exported and any("dcgm-exporter" in labels.get(k, "") for k in ("pod", "container"))
    extra = tuple(sorted((k, v) for k, v in labels.items() if k not in IDENTITY_LABELS and v))
    return SeriesId(
        host=host, gpu_uuid=uuid, gpu_model=_blank(labels.get("modelName")), gpu_index=idx,
        mig_profile=profile if gi else None,
        namespace=None if own else _blank(labels.get(f"{pfx}namespace")),
        pod=None if own else _blank(labels.get(f"{pfx}pod")),
        container=None if own else _blank(labels.get(f"{pfx}container")),
        labels=extra,
    )


def series_table(
    ids: Sequence[SeriesId],
    codes: np.ndarray,
    ts_ns: np.ndarray,
    values: Mapping[str, np.ndarray],
    *,
    where: str,
    lean: tuple[Sequence[Mapping[str, str]], Sequence[str]] | None = None,
) -> tuple[pa.Table, list[ImportNote]]:
    """The sample table for rows given columnar: row i is series ``ids[codes[i]]`` at
    ``ts_ns[i]``; ``values`` maps dcgm-exporter metric names to float64 arrays (NaN: absent).

    Converts units once, nulls sentinels and NaN (counted in notes), derives mem_total_mib
    from free + used + reserved, and sets ``gpu_share`` on rows of one GPU at one time held by
    several pods. Rows come out sorted by (gpu_uuid, ts, pod).

    ``lean`` (each series' labels, as the rows' ``labels`` map would hold them, and the
    label keys to read from them): the lean layout classify's engine reads
    (:func:`lean_columns`): the same rows, but every identity column a dictionary over the
    series' values (no text per row), ``labels`` null, a column without values of type
    null (no buffers), a ``label:<key>`` column per key,
    and the label keys the rows' series carry in the schema metadata
    (:data:`~gpuaudit.series.LEAN_LABEL_KEYS`); not a
    :data:`~gpuaudit.schema.SAMPLE_SCHEMA` table.
    """
    n = int(codes.shape[0])
    notes: list[ImportNote] = []
    host = np.array([s.host for s in ids], dtype=object)
    uuid = np.array([s.gpu_uuid for s in ids], dtype=object)
    # order rows by GPU then time, so each GPU's series is in time order
    if lean is not None and n:
        # the GPUs numbered in order of first appearance in the rows (as the dictionary
        # encoding of the text per row below numbers them), from the series' uuids
        gpu_ids: dict[str, int] = {}
        of_series = np.array([gpu_ids.setdefault(u, len(gpu_ids)) for u in uuid],
                             dtype=np.int64)
        rows_gpu = of_series[codes]
        first = np.full(len(gpu_ids), n, dtype=np.int64)
        first[rows_gpu[::-1]] = np.arange(n - 1, -1, -1)
        rank = np.empty(len(gpu_ids), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(gpu_ids))
        g = rank[rows_gpu]
    elif lean is not None:
        g = np.zeros(0, dtype=np.int64)
    else:
        gpu_codes = pc.dictionary_encode(pa.array(uuid[codes] if n else [], type=pa.string()))
        g = np.asarray(gpu_codes.indices.to_numpy(zero_copy_only=False), dtype=np.int64) \
            if n else np.zeros(0, dtype=np.int64)
    # rows already in (GPU, time, series) order (one series per GPU in a chunk, the
    # native fetch's common case) are kept as they are: no sort, no copy per column
    order = _row_order(g, ts_ns, codes)
    if order is not None:
        codes, ts_ns, g = codes[order], ts_ns[order], g[order]
    coded: dict[str, pa.Array] = {}
    if lean is not None:
        maps, keys = lean
        coded = lean_columns(ids, codes, {k: [m.get(k) for m in maps] for k in keys})
        cols: dict[str, object] = {"ts": pa.array(ts_ns, type=pa.int64()),
                                   "host": pa.nulls(n, pa.string()),
                                   "gpu_uuid": pa.nulls(n, pa.string())}
    else:
        cols = {
            "ts": pa.array(ts_ns, type=pa.int64()),
            "host": pa.array(host[codes] if n else [], type=pa.string()),
            "gpu_uuid": pa.array(uuid[codes] if n else [], type=pa.string()),
        }

    def attr(name: str) -> pa.Array:
        return pa.array([getattr(ids[c], name) for c in range(len(ids))])

    if lean is None:
        for name in ("gpu_model", "mig_profile", "namespace", "pod", "container"):
            per_series = attr(name).cast(pa.string()) if ids else pa.array([], pa.string())
            cols[name] = per_series.take(pa.array(codes, type=pa.int64()))
    idx = attr("gpu_index").cast(pa.int16()) if ids else pa.array([], pa.int16())
    cols["gpu_index"] = idx.take(pa.array(codes, type=pa.int64()))
    label_items = pa.array([list(s.labels) for s in ids],
                           type=pa.map_(pa.string(), pa.string())) \
        if ids and lean is None else None
    if label_items is not None:
        cols["labels"] = label_items.take(pa.array(codes, type=pa.int64()))
    merged: dict[str, np.ndarray] = {}
    for metric, arr in values.items():
        if metric not in DCGM_COLUMNS:
            continue
        col, factor = DCGM_COLUMNS[metric]
        x = _taken(np.asarray(arr, dtype=np.float64), order)
        if col not in _WIDE_COLUMNS:
            blank = x >= _INT32_BLANK_MIN
            if blank.any():
                notes.append(ImportNote(
                    f"{int(blank.sum())} blank value(s) (DCGM int32 sentinel) read as null",
                    int(blank.sum()), where=f"{where}: {metric}", column=col))
                x = np.where(blank, np.nan, x)
        # what null_sentinels nulls besides NaN, counted and made NaN in NumPy
        blank = float_blanks(x)
        count = int(blank.sum())
        if count:
            notes.append(ImportNote(
                f"{count} DCGM blank sentinel value(s) (e.g. 9223372036854775794) "
                "read as null", count, where=f"{where}: {metric}", column=col))
            x = np.where(blank, np.nan, x)
        if factor != 1.0:
            x = x * factor
        if col in merged:
            merged[col] = np.where(np.isnan(merged[col]), x, merged[col])
        else:
            merged[col] = x
    fb = [_taken(np.asarray(values[m], dtype=np.float64), order)
          for m in _FB_PARTS if m in values]
    if len(fb) >= 2 and "DCGM_FI_DEV_FB_FREE" in values:
        total = np.zeros(n)
        for part in fb:
            part = np.where(part >= _INT32_BLANK_MIN, np.nan, part)
            total = total + np.nan_to_num(part)
        free = _taken(np.asarray(values["DCGM_FI_DEV_FB_FREE"], dtype=np.float64), order)
        merged["mem_total_mib"] = np.where(np.isnan(free) | (free >= _INT32_BLANK_MIN),
                                           np.nan, total)
    for col, x in merged.items():
        if col == "xid":
            x = np.where(x == 0.0, np.nan, x)  # XID 0 is "no error", not an error code
        if col in ("clocks_event_reasons", "ecc_dbe_total", "xid"):
            # a bitmask, a counter, an error code: a reading that is not a whole number
            # >= 0 (a recording rule's average, a negative) is nulled and counted, never
            # truncated or wrapped
            bad = (x < 0.0) | (x != np.floor(x))
            bad &= ~np.isnan(x)
            if bad.any():
                notes.append(ImportNote(
                    f"{int(bad.sum())} value(s) that are not a whole number >= 0 read as null",
                    int(bad.sum()), where=f"{where}: {col}", column=col))
                x = np.where(bad, np.nan, x)
            cols[col] = pa.array(np.nan_to_num(x).astype(np.int64), mask=np.isnan(x)).cast(
                pa.uint64() if col == "clocks_event_reasons" else pa.int64())
        else:
            cols[col] = pa.array(x, mask=np.isnan(x))
    if n:
        same = np.zeros(n, dtype=bool)
        same[1:] = (g[1:] == g[:-1]) & (ts_ns[1:] == ts_ns[:-1])
        start = ~same
        grp = np.cumsum(start) - 1
        size = np.bincount(grp)[grp]
        if (size > 1).any():
            share = np.where(size > 1, 1.0 / size, np.nan)
            cols["gpu_share"] = pa.array(share, mask=size <= 1, type=pa.float64())
    ts = pa.array(cols.pop("ts"), type=pa.int64()).cast(pa.timestamp("ns", tz="UTC"))
    if lean is None:
        table = build_table({"ts": ts, **cols}, length=n)  # type: ignore[arg-type]
    else:
        table = lean_table({"ts": ts, **cols}, coded, length=n)
        present = np.flatnonzero(np.bincount(codes, minlength=len(ids))).tolist() if n else []
        seen = sorted({k for c in present for k in lean[0][c] if k})
        table = table.replace_schema_metadata({LEAN_LABEL_KEYS: "\x1f".join(seen).encode()})
    return table, notes


def _row_order(g: np.ndarray, ts_ns: np.ndarray, codes: np.ndarray) -> np.ndarray | None:
    """The order a stable ``np.lexsort((codes, ts_ns, g))`` puts the rows in; None when
    they are in it already. Rows in (``codes``, ``ts_ns``) order (as the native fetch's
    join gives them: a GPU's rows split between its series where a pod starts within
    the chunk) need only a stable sort by (``g``, ``ts_ns``) as one integer key: the
    merge of a few sorted runs instead of a three-key sort."""
    n = g.shape[0]
    if n < 2:
        return None
    dg = np.diff(g)
    dt = np.diff(ts_ns)
    dc = np.diff(codes)
    if not ((dg < 0) | ((dg == 0) & ((dt < 0) | ((dt == 0) & (dc < 0))))).any():
        return None
    lo, hi = int(ts_ns.min()), int(ts_ns.max())
    by_code = not ((dc < 0) | ((dc == 0) & (dt < 0))).any()
    if by_code and (int(g.max()) + 1) * (hi - lo + 1) < 2**62:
        return np.argsort(g * (hi - lo + 1) + (ts_ns - lo), kind="stable")
    return np.lexsort((codes, ts_ns, g))


def _taken(x: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    return x if order is None else x[order]


#: the identity columns a lean table holds as dictionaries over the series' values
LEAN_IDENTITY = ("host", "gpu_uuid", "gpu_model", "mig_profile", "namespace", "pod",
                 "container")


def lean_columns(ids: Sequence[SeriesId], codes: np.ndarray,
                 labels: Mapping[str, Sequence[str | None]]) -> dict[str, pa.Array]:
    """The identity columns of rows of series ``codes`` as dictionary arrays (indices per
    row, each distinct value once in the dictionary, in the series' order; null where the
    series has none): :data:`LEAN_IDENTITY`, and ``label:<key>`` per key of ``labels``
    (each series' value). The text is the series', never built per row."""
    per_series: dict[str, Sequence[str | None]] = {
        name: [getattr(s, name) for s in ids] for name in LEAN_IDENTITY}
    per_series.update({f"label:{k}": v for k, v in labels.items()})
    out: dict[str, pa.Array] = {}
    for name, vals in per_series.items():
        table: dict[str, int] = {}
        ind = np.array([-1 if v is None else table.setdefault(v, len(table)) for v in vals],
                       dtype=np.int32)
        rows = ind[codes] if codes.shape[0] else np.zeros(0, dtype=np.int32)
        # (no validity bitmap to build where every series has a value)
        out[name] = pa.DictionaryArray.from_arrays(
            pa.array(rows, type=pa.int32(), mask=rows < 0 if (ind < 0).any() else None),
            pa.array(list(table), type=pa.string()))
    return out


def parse_metrics_text(
    text: str,
    *,
    ts_ns: int,
    default_host: str,
    where: str,
) -> tuple[pa.Table, list[ImportNote]]:
    """One dcgm-exporter ``/metrics`` page (text exposition format) as sample-table rows.

    Every series of a GPU (or MIG instance, or GPU x pod when time-sliced) scraped at
    ``ts_ns`` becomes one row. A sample's own timestamp, when the page carries one, wins.
    Metrics with no column are listed in notes (known exporter fields and unknown names
    separately), never an error.
    """
    from prometheus_client.parser import text_string_to_metric_families

    index: dict[tuple[SeriesId, int], int] = {}
    ids: list[SeriesId] = []
    id_index: dict[SeriesId, int] = {}
    row_code: list[int] = []
    row_ts: list[int] = []
    cells: dict[str, dict[int, float]] = {}
    unknown: dict[str, int] = {}
    unused: set[str] = set()
    blank_unused: dict[str, int] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise InputError(f"not Prometheus text exposition format: {exc}", where=where,
                         fix="the URL must serve dcgm-exporter's /metrics page") from exc
    for fam in families:
        for s in fam.samples:
            # the parser names counter samples <family>_total; dcgm-exporter's names have none
            name = fam.name if s.name in (fam.name, f"{fam.name}_total") else s.name
            if name not in DCGM_COLUMNS and name not in _FB_PARTS:
                if name in KNOWN_UNUSED or name.startswith("DCGM_FI_"):
                    unused.add(name)
                    if float(s.value) >= _INT32_BLANK_MIN or s.value != s.value:
                        blank_unused[name] = blank_unused.get(name, 0) + 1
                else:
                    unknown[name] = unknown.get(name, 0) + 1
                continue
            sid = series_id(s.labels, default_host=default_host, where=f"{where}: {name}")
            code = id_index.get(sid)
            if code is None:
                code = id_index[sid] = len(ids)
                ids.append(sid)
            t = round(float(s.timestamp) * 1e9) if s.timestamp is not None else ts_ns
            key = (sid, t)
            row = index.get(key)
            if row is None:
                row = index[key] = len(row_code)
                row_code.append(code)
                row_ts.append(t)
            cells.setdefault(name, {})[row] = float(s.value)
    n = len(row_code)
    values: dict[str, np.ndarray] = {}
    for name, by_row in cells.items():
        arr = np.full(n, np.nan)
        arr[list(by_row)] = list(by_row.values())
        values[name] = arr
    table, notes = series_table(ids, np.array(row_code, dtype=np.int64),
                                np.array(row_ts, dtype=np.int64), values, where=where)
    known = sorted(unused - set(_FB_PARTS))
    if known:
        notes.append(ImportNote(
            f"{len(known)} dcgm-exporter metric(s) have no sample-table column and were not "
            f"kept: {', '.join(known)}", len(known), where=where))
    if blank_unused:
        notes.append(ImportNote(
            f"{sum(blank_unused.values())} DCGM blank sentinel value(s) in metrics not kept "
            f"({', '.join(sorted(blank_unused))})", sum(blank_unused.values()), where=where))
    if unknown:
        notes.append(ImportNote(
            f"{len(unknown)} unknown metric name(s) ignored: {', '.join(sorted(unknown))}",
            sum(unknown.values()), where=where))
    return table, notes


def scrape_once(
    urls: Sequence[str],
    *,
    client: object,
    ts_ns: int,
) -> tuple[pa.Table, list[ImportNote]]:
    """GET each dcgm-exporter ``/metrics`` URL once (``client``: an ``httpx.Client``) and
    return the rows of all of them stamped ``ts_ns`` (a sample's own timestamp wins).

    An endpoint that cannot be reached or answers non-200 raises
    :class:`~gpuaudit.errors.SourceUnavailableError` naming the URL.
    """
    import concurrent.futures as cf
    from urllib.parse import urlsplit

    import httpx

    from gpuaudit.errors import SourceUnavailableError

    assert isinstance(client, httpx.Client)

    def fetch(url: str) -> str:
        try:
            resp = client.get(url)
        except httpx.HTTPError as exc:
            raise SourceUnavailableError(
                f"cannot scrape dcgm-exporter: {exc.__class__.__name__}: {exc}", where=url,
                fix="check the exporter runs and the URL (usually http://<node>:9400/metrics)",
            ) from exc
        if resp.status_code != 200:
            raise SourceUnavailableError(
                f"dcgm-exporter answered HTTP {resp.status_code}", where=url,
                fix="check the URL path (/metrics) and the exporter's logs")
        return resp.text

    with cf.ThreadPoolExecutor(max_workers=min(8, max(1, len(urls)))) as pool:
        pages = list(pool.map(fetch, urls))
    tables: list[pa.Table] = []
    notes: list[ImportNote] = []
    for url, page in zip(urls, pages):
        host = urlsplit(url).hostname or url
        t, n = parse_metrics_text(page, ts_ns=ts_ns, default_host=host, where=url)
        tables.append(t)
        notes.extend(n)
    if not tables:
        from gpuaudit.schema import empty_table

        return empty_table(), notes
    return pa.concat_tables(tables), notes
