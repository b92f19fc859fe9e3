"""Time-weighted phase classification over a stream of sample batches.

A sample stands for the time until the next sample of the same GPU (``gpu_uuid``), capped at
``cap_intervals`` nominal intervals; the rest of a longer gap is *unobserved*. A series' last
sample stands for one nominal interval (or until the series' known end, where the source
states it: a profiler trace's window). Utilization ``u`` is ``util_gpu_pct``; where that is
null and ``gr_engine_active`` was measured (DCGM on MIG instances reports no GPU_UTIL) it is
``100 x gr_engine_active``. A sample with neither is unobserved time ("no reading").

Phases: idle ``u < 10``, underutilized ``10 <= u < 70``, productive ``70 <= u < 90``,
compute-bound ``u >= 90``. Where ``sm_active`` exists the same split is made on
``100 x sm_active`` (the SM view) and reported beside, because a tiny kernel running nonstop
reads 100 % utilization while using a sliver of the SMs.

The engine is columnar: per batch it sorts rows by series with a stable (radix) sort, finds
each row's next distinct timestamp, and accumulates with ``numpy.bincount``. Rows whose
successor has not arrived yet are carried to the next batch, so memory stays bounded by the
batch size whatever the recording's length.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuaudit.classify.timeline import Grid, TimelineAcc
from gpuaudit.classify.usage import (
    CELL_VALUE_COLUMNS,
    IDLE_BELOW_PCT,
    SeriesSignals,
    add_phase_index,
)
from gpuaudit.errors import InputError, SampleTableError
from gpuaudit.schema import ImportNote, series_order

__all__ = ["DEFAULT_CAP_INTERVALS", "TIMELINE_BUCKETS", "group_key_names"]

DEFAULT_CAP_INTERVALS = 3.0
_NS = 1_000_000_000
#: From this many rows on, classify tunes the allocator (see gpuaudit._heap).
_LARGE_ROWS = 1_000_000
#: The timeline folded into the pass holds GPUs x buckets x 6 floats; wider fleets get it from
#: a second pass that keeps only the first GPUs.
_TIMELINE_MAX_SERIES = 4096
TIMELINE_BUCKETS = 240

# NVML clocks-event reason bits (nvml.h, nvmlClocksEventReason*).
_THERMAL_BITS = 0x8 | 0x20 | 0x40  # HW slowdown, SW thermal, HW thermal
_POWER_BITS = 0x4 | 0x80  # SW power cap, HW power brake

# Per-series time-weighted means: signal name -> (columns summed, scale)
_MEAN_SIGNALS: dict[str, tuple[tuple[str, ...], float]] = {
    "sm_active": (("sm_active",), 1.0),
    "sm_occupancy": (("sm_occupancy",), 1.0),
    "tensor_active": (("tensor_active",), 1.0),
    "dram_active": (("dram_active",), 1.0),
    "pcie": (("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"), 1.0),
    "nvlink": (("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"), 1.0),
    "power": (("power_w",), 1.0),
    # derived below from the two above: PCIe over idle time (the host feeding a waiting GPU),
    # NVLink over busy time (collectives run as kernels)
    "pcie_idle": ((), 1.0),
    "nvlink_busy": ((), 1.0),
}
_MAX_SIGNALS = ("temp_c", "mem_used_mib", "mem_total_mib", "power_limit_w")

_GROUP_COLUMNS = ("host", "gpu_model", "mig_profile", "namespace", "pod", "container")


def unmatched_group_notes(cells: pa.Table, keys: Sequence[str],
                          label_keys: Iterable[str] | None) -> list[ImportNote]:
    """A note for each group key no sample has a value for (``--by nosuchlabel``): every
    GPU then falls in one "(none)" group, which must not pass for a real grouping. Names
    the label keys the samples do carry (``label_keys``; None: not known here)."""
    have = sorted(set(label_keys or ()))
    out = []
    for key in keys:
        if key not in cells.column_names or key.startswith("period:"):
            continue
        col = cells.column(key)
        if cells.num_rows == 0 or col.null_count < len(col):
            continue
        name = key.removeprefix("label:")
        if key.startswith("label:"):
            what = f"no sample carries the label {name!r}"
            present = (f"; the labels present are: {', '.join(have)}" if have
                       else "; the samples carry no labels at all" if label_keys is not None
                       else "; check the name against the series' labels and --map-file")
        else:
            what = f"no sample has a {name!r} value"
            present = (f"; the labels present are: {', '.join(have)}" if have else "")
        out.append(ImportNote(
            f"--by {name}: {what}, so every GPU falls in one '(none)' group{present}",
            int(cells.num_rows), "--by", name))
    return out


def group_key_names(by: Sequence[str]) -> tuple[str, ...]:
    """Normalise ``--by`` keys: table columns stay, anything else is a label key.

    ``gpu`` means per GPU (the default view, no extra key). Label keys may be written
    ``team`` or ``label:team``; both become ``label:team``. ``period:<seconds>`` groups by
    the UTC period a sample starts in (``period:3600``: the hour; its value is the period's
    start in epoch seconds, as text): the bill's join reads measured time per hour so.
    """
    out: list[str] = []
    for raw in by:
        key = raw.strip()
        if not key or key in ("gpu", "gpu_uuid"):
            continue
        if key.startswith("period:"):
            secs = key[7:]
            if not secs.isdigit() or int(secs) <= 0:
                raise InputError(f"group key {key!r}: the period is not whole seconds",
                                 fix="write period:<seconds>, e.g. period:3600 for hours")
        elif key.startswith("label:"):
            key = key
        elif key not in _GROUP_COLUMNS:
            key = f"label:{key}"
        if key not in out:
            out.append(key)
    return tuple(out)


@dataclass
class _Grow:
    """Named float64 accumulators indexed by a growing integer id."""

    names: Sequence[str]
    size: int = 0
    data: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data = {n: np.zeros(0) for n in self.names}

    def ensure(self, n: int) -> None:
        if n <= self.size:
            return
        new = max(n, self.size * 2, 64)
        for k, v in self.data.items():
            grown = np.zeros(new)
            grown[: v.shape[0]] = v
            self.data[k] = grown
        self.size = new

    def add(self, name: str, ids: np.ndarray, weights: np.ndarray) -> None:
        if ids.size:
            self.data[name][: self.size] += np.bincount(ids, weights=weights, minlength=self.size)


_SERIES_SUMS = (
    "u2_w", "abs_step", "steps", "idle_runs",
    "thermal_s", "power_s", *(f"{k}_w" for k in _MEAN_SIGNALS), *(f"{k}_t" for k in _MEAN_SIGNALS),
    "power2_w",
)


class _Engine:
    def __init__(self, by: tuple[str, ...], interval_s: float | None, cap_intervals: float,
                 grid: Grid | None = None):
        self.by = by
        # the report's timeline, folded into this pass when its buckets are known up front
        self.timeline = TimelineAcc(grid) if grid is not None else None
        self.interval_s = interval_s
        self.cap_intervals = cap_intervals
        self.series_index: dict[str, int] = {}
        #: the label keys the samples carry, gathered only when grouping by a label (so a
        #: ``--by`` key no sample has can be reported with the keys that do exist)
        self.label_keys: set[str] = set()
        self.series_meta: list[tuple[str, str | None, str | None]] = []
        self.cell_index: dict[tuple[int, tuple[str | None, ...]], int] = {}
        self.cells = _Grow(CELL_VALUE_COLUMNS)
        self.series = _Grow(_SERIES_SUMS)
        self.series_max: dict[str, np.ndarray] = {k: np.zeros(0) for k in _MAX_SIGNALS}
        self.last_u = np.zeros(0)
        self.last_idle = np.zeros(0, dtype=bool)
        self.cur_idle_run = np.zeros(0)
        self.max_idle_run = np.zeros(0)
        self.energy_first = np.zeros(0)
        self.energy_last = np.zeros(0)
        self.ecc_min = np.zeros(0)
        self.ecc_max = np.zeros(0)
        # each series' head (first accumulated row) and leading idle stretch, so an engine
        # that read a later range of the stream can be stitched onto this one (absorb)
        self.first_ts = np.zeros(0, dtype=np.int64)
        self.started = np.zeros(0, dtype=bool)
        self.head_u = np.zeros(0)
        self.head_idle = np.zeros(0, dtype=bool)
        self.head_open = np.zeros(0, dtype=bool)
        self.head_run = np.zeros(0)
        self._dictionary: pa.Array | None = None
        self._mapping = np.zeros(0, dtype=np.int64)
        self.xids: dict[int, set[int]] = {}
        self.pods: dict[int, set[str]] = {}
        self.pending: dict[str, np.ndarray] | None = None
        self.t_min: int | None = None
        self.t_end: int | None = None
        self.has_sm = False

    # -- identity -------------------------------------------------------------------------
    def _series_codes(self, batch: pa.RecordBatch, ts: np.ndarray) -> np.ndarray:
        col = batch.column("gpu_uuid")
        if not pa.types.is_dictionary(col.type):
            col = pc.dictionary_encode(col)
        idx = col.indices.to_numpy(zero_copy_only=False)
        if self._dictionary is None or not col.dictionary.equals(self._dictionary):
            self._dictionary = col.dictionary
            self._mapping = np.array([self.series_index.get(u, -1)
                                      for u in col.dictionary.to_pylist()], dtype=np.int64)
        mapping = self._mapping
        if (mapping < 0).any():
            # a sliced batch may carry dictionary entries none of its rows use: only the
            # entries some row uses become series, in order of first appearance
            present = np.flatnonzero(np.bincount(idx, minlength=mapping.shape[0]))
            new = present[mapping[present] < 0]
            if new.size:
                dictionary = col.dictionary.to_pylist()
                hosts = batch.column("host")
                models = batch.column("gpu_model")
                migs = batch.column("mig_profile")
                is_new = np.zeros(mapping.shape[0], dtype=bool)
                is_new[new] = True
                rows = np.flatnonzero(is_new[idx])
                _, at = np.unique(idx[rows], return_index=True)
                first_rows = np.sort(rows[at])
                start = len(self.series_index)
                for row in first_rows.tolist():
                    j = int(idx[row])
                    code = len(self.series_index)
                    self.series_index[dictionary[j]] = code
                    self.series_meta.append(
                        (str(hosts[row].as_py()), models[row].as_py(), migs[row].as_py())
                    )
                    mapping[j] = code
                self._grow_series(len(self.series_index))
                self.first_ts[start:len(self.series_index)] = ts[first_rows]
        return np.asarray(mapping[idx])

    def _grow_series(self, n: int) -> None:
        self.series.ensure(n)
        size = self.series.size
        if self.last_u.shape[0] < size:
            def grow(a: np.ndarray, fill: float | bool) -> np.ndarray:
                out = np.full(size, fill, dtype=a.dtype)
                out[: a.shape[0]] = a
                return out

            self.last_u = grow(self.last_u, np.nan)
            self.last_idle = grow(self.last_idle, False)
            self.cur_idle_run = grow(self.cur_idle_run, 0.0)
            self.max_idle_run = grow(self.max_idle_run, 0.0)
            self.energy_first = grow(self.energy_first, np.nan)
            self.energy_last = grow(self.energy_last, np.nan)
            self.ecc_min = grow(self.ecc_min, np.nan)
            self.ecc_max = grow(self.ecc_max, np.nan)
            self.first_ts = grow(self.first_ts, 0)
            self.started = grow(self.started, False)
            self.head_u = grow(self.head_u, np.nan)
            self.head_idle = grow(self.head_idle, False)
            self.head_open = grow(self.head_open, False)
            self.head_run = grow(self.head_run, 0.0)
            for k in _MAX_SIGNALS:
                self.series_max[k] = grow(self.series_max[k], np.nan)

    def _group_values(self, batch: pa.RecordBatch) -> list[pa.Array]:
        values: list[pa.Array] = []
        if any(not k.startswith("period:") for k in self.by):
            labels = batch.column("labels")
            if isinstance(labels, pa.ChunkedArray):
                labels = labels.combine_chunks()
            self.label_keys.update(k for k in pc.unique(labels.keys).to_pylist() if k)
        for key in self.by:
            if key.startswith("label:"):
                arr = pc.map_lookup(batch.column("labels"), key[6:], "first")
            elif key.startswith("period:"):
                secs = int(key[7:])
                ts = pc.cast(batch.column("ts"), pa.int64())
                arr = pc.multiply(pc.divide(ts, secs * _NS), secs)  # ts >= 0: floor
            else:
                arr = batch.column(key)
            values.append(arr.cast(pa.string()))
        return values

    def _cell_ids(self, codes: np.ndarray, batch: pa.RecordBatch) -> np.ndarray:
        if not self.by:
            ids = np.empty(len(self.series_index), dtype=np.int64)
            for code in range(len(self.series_index)):
                ids[code] = self._cell(code, ())
            return np.asarray(ids[codes])
        group_vals = self._group_values(batch)
        # Encode the combination of series and group values row by row only over the
        # distinct combinations (few), not per row.
        combo_codes = np.zeros(codes.shape[0], dtype=np.int64)
        key_tables: list[list[str | None]] = []
        key_inds: list[np.ndarray] = []
        for vals in group_vals:
            enc = pc.dictionary_encode(vals)
            key_tables.append([*enc.dictionary.to_pylist(), None])  # last: null
            ind = enc.indices.fill_null(len(key_tables[-1]) - 1).to_numpy(
                zero_copy_only=False).astype(np.int64)
            key_inds.append(ind)
            combo_codes = combo_codes * len(key_tables[-1]) + ind
        combined = codes.astype(np.int64) * int(combo_codes.max() + 1 if combo_codes.size else 1)
        combined = combined + combo_codes
        uniq, inverse = np.unique(combined, return_inverse=True)
        first_rows = np.zeros(uniq.shape[0], dtype=np.int64)
        first_rows[inverse[::-1]] = np.arange(codes.shape[0])[::-1]
        # the distinct combinations' keys, column by column in C (list.__getitem__ over the
        # indices), then one dictionary lookup per combination
        cols = [list(map(tbl.__getitem__, ind[first_rows].tolist()))
                for tbl, ind in zip(key_tables, key_inds)]
        index = self.cell_index
        out: list[int] = []
        for code, key in zip(codes[first_rows].tolist(), zip(*cols)):
            cid = index.get((code, key))
            out.append(self._cell(code, key) if cid is None else cid)
        cell_of_uniq = np.array(out, dtype=np.int64)
        return np.asarray(cell_of_uniq[inverse])

    def _cell(self, code: int, key: tuple[str | None, ...]) -> int:
        cid = self.cell_index.get((code, key))
        if cid is None:
            cid = len(self.cell_index)
            self.cell_index[(code, key)] = cid
            self.cells.ensure(cid + 1)
        return cid

    # -- per batch ------------------------------------------------------------------------
    def _rows(self, batch: pa.RecordBatch) -> dict[str, np.ndarray]:
        n = batch.num_rows
        ts = batch.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
        codes = self._series_codes(batch, ts)
        rows: dict[str, np.ndarray] = {
            "code": codes,
            "ts": ts,
            "cell": self._cell_ids(codes, batch),
        }
        u = _float(batch, "util_gpu_pct")
        if u is None:
            u = np.full(n, np.nan)
        gr = _float(batch, "gr_engine_active")
        if gr is not None:
            u = np.where(np.isnan(u), gr * 100.0, u)
        rows["u"] = u
        share = _float(batch, "gpu_share")
        if share is not None:
            rows["share"] = np.where(np.isnan(share), 1.0, share)
        sm = _float(batch, "sm_active")
        if sm is not None:
            self.has_sm = True
            rows["sm"] = sm
        for name, (cols, _scale) in _MEAN_SIGNALS.items():
            if name == "sm_active":
                continue
            total: np.ndarray | None = None
            for c in cols:
                x = _float(batch, c)
                if x is None:
                    continue
                total = x if total is None else np.where(np.isnan(total), x, total + np.nan_to_num(x))
            if total is not None:
                rows[f"sig_{name}"] = total
        idle = u < IDLE_BELOW_PCT  # NaN (no reading) compares False on both sides
        if "sig_pcie" in rows:
            rows["sig_pcie_idle"] = np.where(idle, rows["sig_pcie"], np.nan)
        if "sig_nvlink" in rows:
            rows["sig_nvlink_busy"] = np.where(u >= IDLE_BELOW_PCT, rows["sig_nvlink"], np.nan)
        for name in _MAX_SIGNALS:
            x = _float(batch, name)
            if x is not None:
                rows[f"max_{name}"] = x
        cer = batch.column("clocks_event_reasons")
        if cer.null_count < len(cer):
            bits = cer.fill_null(0).to_numpy(zero_copy_only=False).astype(np.uint64)
            rows["thermal"] = (bits & np.uint64(_THERMAL_BITS)) != 0
            rows["powercap"] = (bits & np.uint64(_POWER_BITS)) != 0
        self._point_signals(batch, codes)
        return rows

    def _point_signals(self, batch: pa.RecordBatch, codes: np.ndarray) -> None:
        """Signals that need no time weighting: energy counter, ECC, XID, pods."""
        energy = _float(batch, "energy_j")
        if energy is not None:
            ok = ~np.isnan(energy)
            if ok.any():
                c, e = codes[ok], energy[ok]
                first = np.isnan(self.energy_first)
                # first reading per series in this batch (rows in time order per series)
                _, first_idx = np.unique(c[::-1], return_index=True)
                uniq_c = np.unique(c)
                last_vals = e[::-1][first_idx]
                _, firsts = np.unique(c, return_index=True)
                first_vals = e[firsts]
                newly = first[uniq_c]
                self.energy_first[uniq_c[newly]] = first_vals[newly]
                self.energy_last[uniq_c] = last_vals
        ecc = _float(batch, "ecc_dbe_total")
        if ecc is not None:
            ok = ~np.isnan(ecc)
            if ok.any():
                mins = np.full(self.ecc_min.shape[0], np.inf)
                maxs = np.full(self.ecc_max.shape[0], -np.inf)
                np.minimum.at(mins, codes[ok], ecc[ok])
                np.maximum.at(maxs, codes[ok], ecc[ok])
                seen = np.isfinite(mins)
                self.ecc_min[seen] = np.fmin(self.ecc_min[seen], mins[seen])
                self.ecc_max[seen] = np.fmax(self.ecc_max[seen], maxs[seen])
        xid = batch.column("xid")
        if xid.null_count < len(xid):
            mask = np.asarray(pc.is_valid(xid).to_numpy(zero_copy_only=False))
            for c, x in zip(codes[mask].tolist(), xid.filter(pa.array(mask)).to_pylist()):
                self.xids.setdefault(c, set()).add(int(x))
        pod = batch.column("pod")
        if pod.null_count < len(pod):
            combo = pa.table({"c": codes, "p": pod}).group_by(["c", "p"]).aggregate([])
            for c, p in zip(combo.column("c").to_pylist(), combo.column("p").to_pylist()):
                if p is not None:
                    self.pods.setdefault(c, set()).add(p)

    def feed(self, batch: pa.RecordBatch, position: str) -> None:
        if batch.num_rows == 0:
            return
        rows = self._rows(batch)
        if self.interval_s is None:
            self.interval_s = _infer_interval_s(rows["code"], rows["ts"])
        t0 = int(rows["ts"].min())
        self.t_min = t0 if self.t_min is None else min(self.t_min, t0)
        pending = self.pending
        if pending is not None and "share" in pending and bool((pending["share"] < 1.0).any()):
            # a time-sliced GPU's rows of one timestamp may straddle the batch boundary:
            # process the carried rows together with the batch
            self.pending = None
            self._process(_concat(pending, rows), final=False, position=position)
            return
        self.pending = None
        r, dt_ns, done = self._sort_and_step(rows, position)
        if pending is not None:
            self._resolve_carried(pending, r, position)
        self._finish_rows(r, dt_ns, done)

    def detach(self) -> None:
        """Drop the per-file dictionary cache before the engine is sent to another process."""
        self._dictionary = None
        self._mapping = np.zeros(0, dtype=np.int64)

    def finish(self, series_end_ns: Mapping[str, int] | None = None) -> None:
        """Account the last samples: each stands for one nominal interval, or until its
        series' known end (``series_end_ns``, see :class:`~gpuaudit.schema.Recording`)."""
        pending, self.pending = self.pending, None
        if pending is not None and pending["code"].shape[0]:
            self._process(pending, final=True, position="end of stream",
                          ends=series_end_ns)

    def _process(self, rows: dict[str, np.ndarray], *, final: bool, position: str,
                 ends: Mapping[str, int] | None = None) -> None:
        r, dt_ns, done = self._sort_and_step(rows, position)
        if final:
            assert self.interval_s is not None
            done = np.ones(r["code"].shape[0], dtype=bool)
            dt_ns = np.full(done.shape[0], round(self.interval_s * _NS), dtype=np.int64)
            if ends:
                end_by_code = np.full(len(self.series_index), -1, dtype=np.int64)
                for uuid, end in ends.items():
                    code = self.series_index.get(uuid)
                    if code is not None:
                        end_by_code[code] = int(end)
                end = end_by_code[r["code"]]
                known = end > r["ts"]
                dt_ns = np.where(known, end - r["ts"], dt_ns)
        self._finish_rows(r, dt_ns, done)

    def _finish_rows(self, r: dict[str, np.ndarray], dt_ns: np.ndarray, done: np.ndarray
                     ) -> None:
        """Accumulate the rows whose successor is known; carry the rest."""
        if not done.all():
            rest = {k: v[~done] for k, v in r.items()}
            self.pending = rest if self.pending is None else _concat(self.pending, rest)
            r = {k: v[done] for k, v in r.items()}
            dt_ns = dt_ns[done]
        if dt_ns.shape[0] == 0:
            return
        end = int((r["ts"] + dt_ns).max())
        self.t_end = end if self.t_end is None else max(self.t_end, end)
        self._accumulate(r, dt_ns)

    def _sort_and_step(self, rows: dict[str, np.ndarray], position: str
                       ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Rows grouped by series in time order, each row's duration to the next distinct
        timestamp of its series, and which rows have that successor in this chunk."""
        codes = rows["code"]
        n = codes.shape[0]
        order = series_order(codes)
        r = {k: v[order] for k, v in rows.items()}
        c, t = r["code"], r["ts"]
        same_series = np.zeros(n, dtype=bool)
        same_series[1:] = c[1:] == c[:-1]
        dt_prev = np.zeros(n, dtype=np.int64)
        dt_prev[1:] = t[1:] - t[:-1]
        dup_ok = r["share"] < 1.0 if "share" in r else np.zeros(n, dtype=bool)
        bad = same_series & ((dt_prev < 0) | ((dt_prev == 0) & ~dup_ok))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            self._order_error(int(c[i]), int(t[i]), position)
        if "share" not in r:
            # no repeated timestamps: each row's successor is simply the next row
            done = np.zeros(n, dtype=bool)
            done[:-1] = same_series[1:]
            dt_next = np.zeros(n, dtype=np.int64)
            dt_next[:-1] = dt_prev[1:]
            dt_next[~done] = 0
            return r, dt_next, done
        new_group = ~same_series | (dt_prev != 0)
        gid = np.cumsum(new_group) - 1
        g_start = np.flatnonzero(new_group)
        g_c = c[g_start]
        g_t = t[g_start]
        has_next = np.zeros(g_start.shape[0], dtype=bool)
        has_next[:-1] = g_c[1:] == g_c[:-1]
        g_next = np.zeros(g_start.shape[0], dtype=np.int64)
        g_next[:-1] = g_t[1:]
        done = has_next[gid]
        dt_ns = np.where(done, g_next[gid] - t, 0)
        return r, dt_ns, done

    def _resolve_carried(self, pending: dict[str, np.ndarray], r: dict[str, np.ndarray],
                         position: str) -> None:
        """Carried rows whose series has a sample in this batch end at that sample: accumulate
        them before the batch's rows (the step statistics run in time order)."""
        c, t = r["code"], r["ts"]
        first = np.ones(c.shape[0], dtype=bool)
        first[1:] = c[1:] != c[:-1]
        next_ts = np.full(self.series.size, -1, dtype=np.int64)
        next_ts[c[first]] = t[first]
        pc_ = pending["code"]
        nxt = next_ts[pc_]
        found = nxt >= 0
        if found.any():
            dt = nxt - pending["ts"]
            wrong = found & (dt <= 0)
            if wrong.any():
                i = int(np.flatnonzero(wrong)[0])
                self._order_error(int(pc_[i]), int(nxt[i]), position)
            resolved = {k: v[found] for k, v in pending.items()}
            end = int((resolved["ts"] + dt[found]).max())
            self.t_end = end if self.t_end is None else max(self.t_end, end)
            self._accumulate(resolved, dt[found])
        if not found.all():
            rest = {k: v[~found] for k, v in pending.items()}
            self.pending = rest if self.pending is None else _concat(self.pending, rest)

    def _order_error(self, code: int, ts_ns: int, position: str) -> None:
        uuid = next(k for k, v in self.series_index.items() if v == code)
        when = datetime.fromtimestamp(ts_ns / _NS, tz=timezone.utc).isoformat()
        raise SampleTableError(
            f"timestamp {when} repeats or runs backwards for GPU {uuid}",
            column="ts", value=when, where=position,
            fix="each GPU's samples must be in time order with no duplicates "
            "(a time-sliced GPU's rows need gpu_share)",
        )

    def _accumulate(self, r: dict[str, np.ndarray], dt_ns: np.ndarray) -> None:
        assert self.interval_s is not None
        cap_s = self.cap_intervals * self.interval_s
        dt_s = dt_ns * (1.0 / _NS)
        obs = np.minimum(dt_s, cap_s)
        gap = dt_s - obs
        share = r.get("share")
        obs_w = obs
        if share is not None:
            obs_w = obs * share
            gap = gap * share
        u = r["u"]
        no_reading = np.isnan(u)
        has_nr = bool(no_reading.any())
        u_ok = np.where(no_reading, 0.0, u) if has_nr else u
        read_w = np.where(no_reading, 0.0, obs_w) if has_nr else obs_w
        cell = r["cell"]
        cells = self.cells
        n = cells.size
        d = cells.data
        # one pass per quantity over (cell, phase) keys instead of one per phase; the phase
        # is how many of the edges 10, 70, 90 the utilization reaches
        key = add_phase_index(cell * 4, u_ok)
        by_phase = np.bincount(key, weights=read_w, minlength=4 * n).reshape(n, 4)
        unused_w = u_ok * -0.01
        unused_w += 1.0
        unused_w *= read_w
        unused = np.bincount(key, weights=unused_w, minlength=4 * n).reshape(n, 4)
        for k, name in enumerate(("idle_s", "underutilized_s", "productive_s", "compute_bound_s")):
            d[name][:n] += by_phase[:, k]
        d["underutilized_unused_s"][:n] += unused[:, 1]
        d["headroom_s"][:n] += unused[:, 2] + unused[:, 3]
        d["busy_s"][:n] += (by_phase - unused).sum(axis=1)
        if gap.any():
            cells.add("gap_s", cell, gap)
        if has_nr:
            cells.add("no_reading_s", cell, np.where(no_reading, obs_w, 0.0))
        d["samples"][:n] += np.bincount(cell, minlength=n)
        sm = r.get("sm")
        if sm is not None:
            sm_ok = ~np.isnan(sm)
            if sm_ok.any():
                sm_w = np.where(sm_ok, obs_w, 0.0)
                sm_pct = np.where(sm_ok, sm * 100.0, 0.0)
                sm_by = np.bincount(add_phase_index(cell * 4, sm_pct), weights=sm_w,
                                    minlength=4 * n).reshape(n, 4)
                for k, name in enumerate(
                    ("sm_idle_s", "sm_underutilized_s", "sm_productive_s", "sm_compute_bound_s")
                ):
                    d[name][:n] += sm_by[:, k]
                cells.add("sm_busy_s", cell, sm_w * sm_pct / 100.0)
        if self.timeline is not None:
            if len(self.series_index) > _TIMELINE_MAX_SERIES:
                self.timeline = None  # too wide to hold here: the caller makes a second pass
            else:
                self.timeline.add(r["code"], r["ts"], u_ok, read_w, len(self.series_index),
                                  _timeline_signals(r))
        self._series_stats(r, obs, u, no_reading if has_nr else None, u_ok, read_w)

    def _series_stats(
        self, r: dict[str, np.ndarray], obs: np.ndarray, u: np.ndarray,
        no_reading: np.ndarray | None, u0: np.ndarray, w: np.ndarray,
    ) -> None:
        """Per-series sums the cells cannot give (time-weighted u^2, steps, idle runs)."""
        s = self.series
        c = r["code"]
        s.add("u2_w", c, w * u0 * u0)
        idle = u0 < IDLE_BELOW_PCT
        if no_reading is not None:
            idle &= ~no_reading
        # consecutive steps within a series, the first row of each series against the carry
        first = np.ones(c.shape[0], dtype=bool)
        first[1:] = c[1:] != c[:-1]
        prev_u = np.empty_like(u)
        prev_u[1:] = u[:-1]
        prev_u[first] = self.last_u[c[first]]
        prev_idle = np.empty(c.shape[0], dtype=bool)
        prev_idle[1:] = idle[:-1]
        prev_idle[first] = self.last_idle[c[first]]
        self._record_heads(c[first], np.flatnonzero(first), u, idle)
        step = np.abs(u - prev_u)
        ok = ~np.isnan(step)
        if ok.all():
            s.add("abs_step", c, step)
            s.data["steps"][: s.size] += np.bincount(c, minlength=s.size)
        else:
            s.add("abs_step", c, np.where(ok, step, 0.0))
            s.data["steps"][: s.size] += np.bincount(c[ok], minlength=s.size)
        run_start = idle & ~prev_idle
        s.data["idle_runs"][: s.size] += np.bincount(c[run_start], minlength=s.size)
        last = np.append(c[1:] != c[:-1], True)
        self._idle_run_lengths(c, idle, prev_idle, run_start, first, last, w)
        self.last_u[c[last]] = u[last]
        self.last_idle[c[last]] = idle[last]
        for name in _MEAN_SIGNALS:
            x = r.get("sm" if name == "sm_active" else f"sig_{name}")
            if x is None:
                continue
            okx = ~np.isnan(x)
            if not okx.any():
                continue
            wx = np.where(okx, obs, 0.0)
            s.add(f"{name}_w", c, wx * np.where(okx, x, 0.0))
            s.add(f"{name}_t", c, wx)
            if name == "power":
                s.add("power2_w", c, wx * np.where(okx, x * x, 0.0))
        for name in _MAX_SIGNALS:
            x = r.get(f"max_{name}")
            if x is None or np.isnan(x).all():
                continue
            m = np.full(self.series.size, -np.inf)
            np.fmax.at(m, c, x)
            seen = np.isfinite(m)
            self.series_max[name][seen] = np.fmax(self.series_max[name][seen], m[seen])
        if "thermal" in r:
            s.add("thermal_s", c, np.where(r["thermal"], obs, 0.0))
            s.add("power_s", c, np.where(r["powercap"], obs, 0.0))

    def _idle_run_lengths(self, c: np.ndarray, idle: np.ndarray, prev_idle: np.ndarray,
                          run_start: np.ndarray, first: np.ndarray, last: np.ndarray,
                          w: np.ndarray) -> None:
        """Longest idle stretch per series, carried across batches (rows sorted by series).

        A stretch here is a maximal run of idle rows of one series in this batch: it starts
        where the series' previous row was not idle (or at its first row here) and ends where
        the next row is not idle (or at its last row here). Its length is the difference of
        the running sum of idle time at its two ends, plus the carried stretch it continues.
        """
        n = c.shape[0]
        idle_w = np.where(idle, w, 0.0)
        cs = np.cumsum(idle_w)
        next_busy = np.ones(n, dtype=bool)
        next_busy[:-1] = ~idle[1:]
        starts = np.flatnonzero(run_start | (first & idle))
        ends = np.flatnonzero(idle & (last | next_busy))
        length = cs[ends] - cs[starts] + idle_w[starts]
        cont = first[starts] & prev_idle[starts]
        length[cont] += self.cur_idle_run[c[starts[cont]]]
        series_starts = np.flatnonzero(first)
        cs_ = c[series_starts]
        open_ = self.head_open[cs_]
        if open_.any():
            # a leading idle stretch ends at its series' first busy (or unread) row: at this
            # batch's boundary, or at the end of the series' first stretch here
            o, oc = series_starts[open_], cs_[open_]
            at_edge = ~idle[o]
            self.head_run[oc[at_edge]] = self.cur_idle_run[oc[at_edge]]
            self.head_open[oc[at_edge]] = False
            o, oc = o[~at_edge], oc[~at_edge]
            k = np.searchsorted(starts, o)
            closed = ~last[ends[k]]
            self.head_run[oc[closed]] = length[k[closed]]
            self.head_open[oc[closed]] = False
        np.maximum.at(self.max_idle_run, c[starts], length)
        self.cur_idle_run[cs_] = 0.0
        tail = last[ends]
        self.cur_idle_run[c[ends[tail]]] = length[tail]

    def _record_heads(self, codes: np.ndarray, rows: np.ndarray, u: np.ndarray,
                      idle: np.ndarray) -> None:
        """Note the first accumulated row of series seen for the first time."""
        new = ~self.started[codes]
        if not new.any():
            return
        codes, rows = codes[new], rows[new]
        self.started[codes] = True
        self.head_u[codes] = u[rows]
        self.head_idle[codes] = idle[rows]
        self.head_open[codes] = idle[rows]

    # -- stitching ranges -----------------------------------------------------------------
    def absorb(self, other: _Engine, position: str) -> None:
        """Continue this engine with ``other``, which read the rows that follow this engine's
        (the next row-group range of the same file), exactly as if one engine read both.

        ``other`` saw each series start cold: no previous value, no idle stretch to continue.
        Stitching resolves this engine's carried rows at ``other``'s first sample of their
        series, then corrects each series' first row in ``other``: the step from this
        engine's last value, an idle run that merely continues, and the idle stretch that
        spans the boundary. Time-sliced rows are never split (see FileSource.split).
        """
        if other.interval_s != self.interval_s:
            raise InputError(
                f"ranges of one stream disagree on the interval ({self.interval_s} vs "
                f"{other.interval_s} s)", where=position,
                fix="pass interval_s, or classify without workers")
        self.label_keys |= other.label_keys
        n_other = len(other.series_index)
        m = np.empty(n_other, dtype=np.int64)
        for uuid, code in other.series_index.items():
            mine = self.series_index.get(uuid)
            if mine is None:
                mine = len(self.series_index)
                self.series_index[uuid] = mine
                self.series_meta.append(other.series_meta[code])
            m[code] = mine
        self._grow_series(len(self.series_index))
        # 1. this engine's carried rows end at the other's first sample of their series
        if self.pending is not None:
            pending, self.pending = self.pending, None
            order = np.argsort(m)
            self._resolve_carried(pending, {"code": m[order],
                                            "ts": other.first_ts[:n_other][order]}, position)
        # 2. cells and sums add up
        cmap = np.empty(len(other.cell_index), dtype=np.int64)
        for (code, key), cid in other.cell_index.items():
            cmap[cid] = self._cell(int(m[code]), key)
        for name in CELL_VALUE_COLUMNS:
            self.cells.data[name][cmap] += other.cells.data[name][: cmap.shape[0]]
        for name in _SERIES_SUMS:
            self.series.data[name][m] += other.series.data[name][:n_other]
        # 3. the other's first accumulated row of each series, seen with this engine's carry
        sc = np.flatnonzero(other.started[:n_other])
        ms = m[sc]
        step = np.abs(other.head_u[sc] - self.last_u[ms])
        ok = ~np.isnan(step)
        self.series.data["abs_step"][ms[ok]] += step[ok]
        self.series.data["steps"][ms[ok]] += 1.0
        continued = other.head_idle[sc] & self.last_idle[ms]
        self.series.data["idle_runs"][ms[continued]] -= 1.0
        head_run = np.where(other.head_open[sc], other.cur_idle_run[sc], other.head_run[sc])
        joined = np.where(continued, self.cur_idle_run[ms] + head_run, 0.0)
        self.max_idle_run[ms] = np.maximum(
            np.maximum(self.max_idle_run[ms], other.max_idle_run[sc]), joined)
        self.cur_idle_run[ms] = np.where(other.head_open[sc] & continued,
                                         self.cur_idle_run[ms] + other.cur_idle_run[sc],
                                         other.cur_idle_run[sc])
        self.last_u[ms] = other.last_u[sc]
        self.last_idle[ms] = other.last_idle[sc]
        newly = ~self.started[ms]
        for name in ("head_u", "head_idle", "head_open", "head_run"):
            getattr(self, name)[ms[newly]] = getattr(other, name)[sc[newly]]
        self.started[ms] = True
        # 4. point signals
        seen_first = np.isnan(self.energy_first[m])
        self.energy_first[m] = np.where(seen_first, other.energy_first[:n_other],
                                        self.energy_first[m])
        later = ~np.isnan(other.energy_last[:n_other])
        self.energy_last[m[later]] = other.energy_last[:n_other][later]
        self.ecc_min[m] = np.fmin(self.ecc_min[m], other.ecc_min[:n_other])
        self.ecc_max[m] = np.fmax(self.ecc_max[m], other.ecc_max[:n_other])
        for name in _MAX_SIGNALS:
            self.series_max[name][m] = np.fmax(self.series_max[name][m],
                                               other.series_max[name][:n_other])
        for code, xs in other.xids.items():
            self.xids.setdefault(int(m[code]), set()).update(xs)
        for code, ps in other.pods.items():
            self.pods.setdefault(int(m[code]), set()).update(ps)
        self.has_sm = self.has_sm or other.has_sm
        if self.timeline is not None and other.timeline is not None:
            self.timeline.absorb(other.timeline, m, len(self.series_index))
        else:
            self.timeline = None
        if other.t_min is not None:
            self.t_min = other.t_min if self.t_min is None else min(self.t_min, other.t_min)
        if other.t_end is not None:
            self.t_end = other.t_end if self.t_end is None else max(self.t_end, other.t_end)
        # 5. the other's carried rows are carried on
        if other.pending is not None:
            rest = dict(other.pending)
            rest["code"] = m[rest["code"]]
            rest["cell"] = cmap[rest["cell"]]
            self.pending = rest if self.pending is None else _concat(self.pending, rest)

    # -- results --------------------------------------------------------------------------
    def cells_table(self) -> pa.Table:
        n = len(self.cell_index)
        uuids = list(self.series_index)
        code_of_cell = np.empty(n, dtype=np.int64)
        keys: list[tuple[str | None, ...]] = [()] * n
        for (code, key), cid in self.cell_index.items():
            code_of_cell[cid] = code
            keys[cid] = key
        cols: dict[str, pa.Array] = {
            "gpu_uuid": pa.array([uuids[i] for i in code_of_cell], type=pa.string()),
            "host": pa.array([self.series_meta[i][0] for i in code_of_cell], type=pa.string()),
            "gpu_model": pa.array([self.series_meta[i][1] for i in code_of_cell], type=pa.string()),
        }
        for j, name in enumerate(self.by):
            cols[name] = pa.array([k[j] for k in keys], type=pa.string())
        for name in CELL_VALUE_COLUMNS:
            vals = self.cells.data[name][:n]
            cols[name] = pa.array(vals.astype(np.int64) if name == "samples" else vals)
        return pa.table(cols)

    def series_signals(self) -> tuple[SeriesSignals, ...]:
        out = []
        d = self.series.data
        # per-series phase totals come from the cells (several cells per series when grouped)
        n_cells = len(self.cell_index)
        n_series = len(self.series_index)
        code_of_cell = np.empty(n_cells, dtype=np.int64)
        for (code, _key), cid in self.cell_index.items():
            code_of_cell[cid] = code
        cd = self.cells.data

        def per_series(*names: str) -> np.ndarray:
            total = sum(cd[name][:n_cells] for name in names)
            return np.bincount(code_of_cell, weights=np.asarray(total, dtype=np.float64),
                               minlength=n_series)

        s_obs = per_series("idle_s", "underutilized_s", "productive_s", "compute_bound_s")
        s_busy = per_series("busy_s")
        s_idle = per_series("idle_s")
        s_high = per_series("productive_s", "compute_bound_s")
        s_samples = per_series("samples")
        for uuid, code in self.series_index.items():
            host, model, mig = self.series_meta[code]
            obs = float(s_obs[code])

            def mean(name: str, code: int = code) -> float | None:
                t = float(d[f"{name}_t"][code])
                return float(d[f"{name}_w"][code]) / t if t > 0 else None

            mean_u = 100.0 * float(s_busy[code]) / obs if obs > 0 else None
            std_u = None
            if mean_u is not None:
                std_u = float(np.sqrt(max(float(d["u2_w"][code]) / obs - mean_u * mean_u, 0.0)))
            steps = float(d["steps"][code])
            p_mean = mean("power")
            p_std = None
            if p_mean is not None:
                p_t = float(d["power_t"][code])
                p_std = float(np.sqrt(max(float(d["power2_w"][code]) / p_t - p_mean**2, 0.0)))

            def mx(name: str, code: int = code) -> float | None:
                v = float(self.series_max[name][code])
                return None if np.isnan(v) else v

            e_first, e_last = float(self.energy_first[code]), float(self.energy_last[code])
            ecc_lo, ecc_hi = float(self.ecc_min[code]), float(self.ecc_max[code])
            out.append(SeriesSignals(
                gpu_uuid=uuid, host=host, gpu_model=model, mig_profile=mig,
                samples=int(s_samples[code]),
                observed_s=obs, mean_util_pct=mean_u, std_util_pct=std_u,
                mean_abs_step_pct=float(d["abs_step"][code]) / steps if steps > 0 else None,
                idle_runs=int(d["idle_runs"][code]), idle_s=float(s_idle[code]),
                max_idle_run_s=float(self.max_idle_run[code]),
                busy_high_s=float(s_high[code]),
                mean_sm_active=mean("sm_active"), mean_sm_occupancy=mean("sm_occupancy"),
                mean_tensor_active=mean("tensor_active"), mean_dram_active=mean("dram_active"),
                mean_pcie_bytes_per_s=mean("pcie"), mean_nvlink_bytes_per_s=mean("nvlink"),
                mean_pcie_idle_bytes_per_s=mean("pcie_idle"),
                mean_nvlink_busy_bytes_per_s=mean("nvlink_busy"),
                mean_power_w=p_mean, std_power_w=p_std, power_limit_w=mx("power_limit_w"),
                max_temp_c=mx("temp_c"), mem_used_max_mib=mx("mem_used_mib"),
                mem_total_mib=mx("mem_total_mib"),
                energy_j=None if np.isnan(e_first) else e_last - e_first,
                ecc_dbe_delta=None if np.isnan(ecc_lo) else int(ecc_hi - ecc_lo),
                xid_codes=tuple(sorted(self.xids.get(code, ()))),
                thermal_throttle_s=float(d["thermal_s"][code]),
                power_throttle_s=float(d["power_s"][code]),
                pods=tuple(sorted(self.pods.get(code, ()))),
            ))
        return tuple(out)


def _timeline_signals(r: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The rows' diagnostic signals under their timeline names (classify.timeline.SIGNALS)."""
    out = {}
    if "sm" in r:
        out["sm_active"] = r["sm"]
    for name in ("sm_occupancy", "tensor_active", "dram_active"):
        if f"sig_{name}" in r:
            out[name] = r[f"sig_{name}"]
    for ours, theirs in (("pcie_bytes_per_s", "sig_pcie"), ("nvlink_bytes_per_s", "sig_nvlink"),
                         ("pcie_idle_bytes_per_s", "sig_pcie_idle"),
                         ("nvlink_busy_bytes_per_s", "sig_nvlink_busy"),
                         ("power_w", "sig_power"), ("mem_used_mib", "max_mem_used_mib")):
        if theirs in r:
            out[ours] = r[theirs]
    return out


def _concat(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Row-wise concatenation of two row dicts whose optional signals may differ."""
    n_a, n_b = a["code"].shape[0], b["code"].shape[0]
    out = {}
    for k in set(a) | set(b):
        x = a.get(k)
        y = b.get(k)
        if x is None:
            assert y is not None
            x = _blank_like(y, n_a, k)
        if y is None:
            y = _blank_like(x, n_b, k)
        out[k] = np.concatenate([x, y])
    return out


def _float(batch: pa.RecordBatch, name: str) -> np.ndarray | None:
    col = batch.column(name)
    if col.null_count == len(col):
        return None
    if col.null_count:
        col = col.cast(pa.float64()).fill_null(np.nan)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)


def _blank_like(a: np.ndarray, n: int, key: str) -> np.ndarray:
    if key == "share":
        return np.ones(n)
    if a.dtype == bool:
        return np.zeros(n, dtype=bool)
    if a.dtype.kind == "f":
        return np.full(n, np.nan)
    return np.zeros(n, dtype=a.dtype)


def _infer_interval_s(codes: np.ndarray, ts: np.ndarray) -> float:
    """Median spacing of consecutive distinct timestamps within each series."""
    order = np.argsort(codes, kind="stable")
    c, t = codes[order], ts[order]
    d = np.diff(t)
    same = c[1:] == c[:-1]
    d = d[same & (d > 0)]
    if d.size == 0:
        return 1.0
    return float(np.median(d)) / _NS
