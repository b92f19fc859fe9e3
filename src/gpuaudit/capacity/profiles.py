"""Workload profiles from history: each workload's demand on one time grid, and its summary.

A *workload* is what holds a GPU today: one physical GPU (or one MIG instance of it), split by
the ``by`` keys (namespace, pod, a label) when given, so that a GPU two namespaces used in turn
is two workloads. Its history is resampled onto a common grid of ``step_s`` steps:

- ``util_pct``: the mean utilization of the step in units of one whole GPU of the model it ran
  on (``util_gpu_pct``, else ``100 x gr_engine_active`` as classify reads MIG rows; a MIG
  instance's reading times its share of the GPU's compute slices; a time-sliced row times its
  ``gpu_share`` where the workload is a pod);
- ``sm_pct``: the same for ``sm_active`` (DCGM_FI_PROF_SM_ACTIVE / NVML GPM) where measured;
- ``mem_mib``: the highest ``mem_used_mib`` of the step.

NaN marks a step with no sample: unobserved, never zero demand. The matrices are built batch by
batch from any sample source gpuaudit reads (recordings, CSV / nvidia-smi logs through
:func:`gpuaudit.measure.files.open_samples`, Prometheus through
:class:`gpuaudit.measure.fleet.prometheus.PrometheusSource`), with one sort per batch and
``reduceat``: no per-row Python.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuaudit.errors import InputError
from gpuaudit.hardware import MIG_COMPUTE_SLICES
from gpuaudit.schema import Recording, SampleSource
from gpuaudit.validate import STEP_S

__all__ = ["ProfileBuilder", "Profiles", "WorkloadStats", "build_profiles", "profile_stats"]

_COLUMNS = ("namespace", "pod", "container", "host", "gpu_model")
#: a MIG instance's gpu_uuid is ``<parent-uuid>/gi<GPU_I_ID>`` (gpuaudit.measure.fleet.dcgm)
_MIG_SUFFIX = re.compile(r"/gi\d+$")
#: a step counts as busy (for burst lengths) from this utilization, the idle phase's edge
BUSY_FROM_PCT = 10.0


@dataclass(frozen=True)
class Profiles:
    """Per-workload demand on one grid (W workloads x T steps). See the module doc."""

    workload: tuple[str, ...]
    gpu_uuid: tuple[str, ...]  # physical GPU (a MIG instance's parent)
    gpu_model: tuple[str | None, ...]
    group: tuple[tuple[str | None, ...], ...]
    group_keys: tuple[str, ...]
    start_ns: int
    step_s: float
    util_pct: np.ndarray  # float32 (W, T)
    mem_mib: np.ndarray  # float32 (W, T)
    sm_pct: np.ndarray | None
    mem_total_mib: np.ndarray  # float32 (W,), NaN unknown
    power_w_mean: np.ndarray  # float64 (W,), NaN unknown
    dram_active_mean: np.ndarray
    tensor_active_mean: np.ndarray
    origin: str = ""

    @property
    def steps(self) -> int:
        return int(self.util_pct.shape[1])

    @property
    def window_s(self) -> float:
        return self.steps * self.step_s

    def __len__(self) -> int:
        return len(self.workload)

    @property
    def main_model(self) -> str | None:
        """The GPU model most workloads ran on (a tie: the first by name); None if no
        workload's model is known."""
        models = [m for m in self.gpu_model if m]
        return max(sorted(set(models)), key=models.count) if models else None

    def subset(self, rows: np.ndarray) -> Profiles:
        """The workloads at ``rows`` (indices), same grid."""
        idx = [int(i) for i in rows]
        return Profiles(
            workload=tuple(self.workload[i] for i in idx),
            gpu_uuid=tuple(self.gpu_uuid[i] for i in idx),
            gpu_model=tuple(self.gpu_model[i] for i in idx),
            group=tuple(self.group[i] for i in idx), group_keys=self.group_keys,
            start_ns=self.start_ns, step_s=self.step_s, util_pct=self.util_pct[rows],
            mem_mib=self.mem_mib[rows],
            sm_pct=None if self.sm_pct is None else self.sm_pct[rows],
            mem_total_mib=self.mem_total_mib[rows], power_w_mean=self.power_w_mean[rows],
            dram_active_mean=self.dram_active_mean[rows],
            tensor_active_mean=self.tensor_active_mean[rows], origin=self.origin)


class _Grid:
    """Growing (W, T) float32 accumulators addressed by flat key w * T + step, zero-filled
    (``np.zeros``: the kernel's zero pages, no writing up front). The memory grid holds
    ``mem + 1`` so that 0 means "no reading" (see :func:`build_profiles`)."""

    def __init__(self, steps: int) -> None:
        self.t = steps
        self.cap = 0
        self.arrays: dict[str, np.ndarray] = {}

    def ensure(self, rows: int) -> None:
        if rows <= self.cap:
            return
        new = max(rows, 2 * self.cap, 16)
        for name, arr in list(self.arrays.items()):
            grown = np.zeros((new, self.t), dtype=np.float32)
            grown[: self.cap] = arr
            self.arrays[name] = grown
        self.cap = new

    def add(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            self.arrays[name] = np.zeros((self.cap, self.t), dtype=np.float32)
        return self.arrays[name]


def _strings(batch: pa.RecordBatch, key: str) -> pa.Array:
    if key.startswith("label:"):
        col = batch.column(batch.schema.get_field_index("labels"))
        return pc.map_lookup(col, key.removeprefix("label:"), "first")
    if key not in _COLUMNS:
        raise InputError(f"cannot group by {key!r}",
                         fix=f"use one of {', '.join(_COLUMNS)} or a label key (team, ...)")
    return batch.column(batch.schema.get_field_index(key))


def _codes(arr: pa.Array) -> tuple[np.ndarray, list[Any]]:
    """Integer codes (-1 for null) and the values they index."""
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    idx = arr.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return idx, arr.dictionary.to_pylist()


def _float(batch: pa.RecordBatch, name: str) -> np.ndarray | None:
    i = batch.schema.get_field_index(name)
    if i < 0:
        return None
    col = batch.column(i)
    if col.null_count == len(col):
        return None
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)


def _mig_scale(batch: pa.RecordBatch) -> np.ndarray | None:
    i = batch.schema.get_field_index("mig_profile")
    if i < 0 or batch.column(i).null_count == len(batch.column(i)):
        return None
    codes, values = _codes(batch.column(i))
    scale = np.ones(len(values) + 1)
    for k, v in enumerate(values):
        head = str(v).split("g.", 1)[0]
        scale[k] = int(head) / MIG_COMPUTE_SLICES if head.isdigit() else 1.0
    out: np.ndarray = scale[codes]
    return out


def _batches_and_window(source: SampleSource | Recording | pa.Table,
                        window_ns: tuple[int, int] | None
                        ) -> tuple[Iterable[pa.RecordBatch], tuple[int, int], str]:
    if isinstance(source, pa.Table):
        source = Recording(table=source, source="table", origin="an in-memory sample table")
    origin = getattr(source, "origin", "")
    if window_ns is None:
        window_ns = getattr(source, "ts_range_ns", None)
    if window_ns is not None:
        return source.batches(), window_ns, origin
    batches = list(source.batches())
    lo, hi = None, None
    for b in batches:
        if b.num_rows == 0:
            continue
        ts = b.column(b.schema.get_field_index("ts")).cast(pa.int64())
        mm = pc.min_max(ts)
        a, z = mm["min"].as_py(), mm["max"].as_py()
        lo = a if lo is None else min(lo, a)
        hi = z if hi is None else max(hi, z)
    if lo is None or hi is None:
        raise InputError("no samples to profile", where=origin or None,
                         fix="check the file or the Prometheus range (--since, --start/--end)")
    return batches, (lo, hi), origin


def build_profiles(
    source: SampleSource | Recording | pa.Table,
    *,
    step_s: float = 60.0,
    by: Sequence[str] = (),
    window_ns: tuple[int, int] | None = None,
) -> Profiles:
    """Resample a sample source onto a ``step_s`` grid, one row per workload (module doc).

    ``by``: group keys (``namespace``, ``pod``, a label such as ``team``) that split a GPU's
    history into workloads. ``window_ns``: first and last timestamp, where the source does not
    say (a file's footer does; otherwise the batches are read into memory once first).
    """
    step_s = STEP_S.check(step_s, "step_s")
    if step_s <= 0:
        raise InputError(f"step must be positive, got {step_s}", fix="pass --step 1m or more")
    batches, window, origin = _batches_and_window(source, window_ns)
    builder = ProfileBuilder(window, step_s=step_s, by=by, origin=origin)
    for batch in batches:
        builder.add(batch)
    return builder.finish()


class ProfileBuilder:
    """:func:`build_profiles` batch by batch, for a caller that reads the batches itself
    (``gpuaudit.api`` reads a file once for the profiles and the audit's classify together).

    ``window_ns``: the first and last timestamp of the samples to come (a recording's footer
    says: ``FileSource.ts_range_ns``); samples outside it are not counted."""

    def __init__(self, window_ns: tuple[int, int], *, step_s: float = 60.0,
                 by: Sequence[str] = (), origin: str = "") -> None:
        step_s = STEP_S.check(step_s, "step_s")
        if step_s <= 0:
            raise InputError(f"step must be positive, got {step_s}",
                             fix="pass --step 1m or more")
        self.keys = tuple(by)
        self.step_s = float(step_s)
        self.origin = origin
        lo, hi = window_ns
        self.step_ns = round(step_s * 1e9)
        self.start = lo // self.step_ns * self.step_ns
        self.steps = (hi - self.start) // self.step_ns + 1
        self.grid = _Grid(self.steps)
        self.index: dict[tuple[Any, ...], int] = {}
        self.names: list[tuple[str, str, str | None, tuple[str | None, ...]]] = []
        self.scal: dict[str, list[float]] = {k: [] for k in (
            "mem_total", "power_sum", "power_n", "dram_sum", "dram_n", "tensor_sum",
            "tensor_n")}
        self._lut: np.ndarray | None = None
        self._dicts: tuple[Any, ...] | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        """Accumulate one sample-table batch."""
        n = batch.num_rows
        if n == 0:
            return
        keys, steps, start, step_ns = self.keys, self.steps, self.start, self.step_ns
        grid, index, names, scal = self.grid, self.index, self.names, self.scal
        per_pod = "pod" in keys
        ts = batch.column(batch.schema.get_field_index("ts")).cast(pa.int64()).to_numpy()
        step = (ts - start) // step_ns
        inside = (step >= 0) & (step < steps)
        uu_codes, uu_vals = _codes(batch.column(batch.schema.get_field_index("gpu_uuid")))
        mm_codes, mm_vals = _codes(batch.column(batch.schema.get_field_index("gpu_model")))
        combo = uu_codes.copy()
        mult = len(uu_vals) + 1
        group_parts: list[tuple[np.ndarray, list[Any]]] = []
        for k in keys:
            c, v = _codes(_strings(batch, k))
            group_parts.append((c, v))
            combo = combo * (len(v) + 1) + (c + 1)
            mult *= len(v) + 1
        combo = combo * (len(mm_vals) + 1) + (mm_codes + 1)
        mult *= len(mm_vals) + 1
        if mult <= 4 * n + 1024:  # a dense lookup: no sort of the batch (``dense`` below)
            present = np.zeros(mult, dtype=bool)
            present[combo] = True
            uniq = np.flatnonzero(present)
            first_of = np.empty(mult, dtype=np.int64)
            first_of[combo[::-1]] = np.arange(n - 1, -1, -1)
            first = first_of[uniq]
            slot = np.empty(mult, dtype=np.int64)
            slot[uniq] = np.arange(len(uniq))
            inv = slot[combo]
        else:
            uniq, first, inv = np.unique(combo, return_index=True, return_inverse=True)
        # the combination -> workload table of the previous batch holds while the batch's
        # dictionaries are the same (batches of one row group share them): only combinations
        # not seen before go through the Python loop
        dense = mult <= 4 * n + 1024
        dicts = (uu_vals, [v for _c, v in group_parts], mm_vals)
        if dense and (self._lut is None or self._lut.shape[0] != mult
                      or self._dicts != dicts):
            self._lut = np.full(mult, -1, dtype=np.int64)
            self._dicts = dicts
        lut = self._lut if dense else None
        local = lut[uniq] if lut is not None else np.full(len(uniq), -1, dtype=np.int64)
        for j in np.flatnonzero(local < 0).tolist():
            row = first[j]
            uuid = str(uu_vals[uu_codes[row]])
            group = tuple(None if c[row] < 0 else str(v[c[row]]) for c, v in group_parts)
            model = None if mm_codes[row] < 0 else str(mm_vals[mm_codes[row]])
            key = (uuid, group)
            w = index.get(key)
            if w is None:
                w = index[key] = len(names)
                label = uuid if not group else uuid + " " + " ".join(
                    f"{k.removeprefix('label:')}={g}" for k, g in zip(keys, group))
                names.append((label, _MIG_SUFFIX.sub("", uuid), model, group))
                for lst in scal.values():
                    lst.append(0.0)
                scal["mem_total"][-1] = np.nan
            local[j] = w
            if lut is not None:
                lut[uniq[j]] = w
        wid = local[inv.reshape(-1)]
        grid.ensure(len(names))
        util = _float(batch, "util_gpu_pct")
        gr = _float(batch, "gr_engine_active")
        if util is None:
            util = np.full(n, np.nan) if gr is None else gr * 100.0
        elif gr is not None:
            util = np.where(np.isnan(util), gr * 100.0, util)
        mig = _mig_scale(batch)
        if mig is not None:
            util = util * mig
        share = _float(batch, "gpu_share")
        weight = np.ones(n) if share is None else np.where(np.isnan(share), 1.0, share)
        sm = _float(batch, "sm_active")
        if sm is not None and mig is not None:
            sm = sm * mig
        mem = _float(batch, "mem_used_mib")
        ok = inside & ~np.isnan(util)
        flat = wid * steps + step
        _accumulate(grid, "u", flat, ok, util, weight, per_pod)
        if sm is not None and np.any(~np.isnan(sm)):
            _accumulate(grid, "s", flat, inside & ~np.isnan(sm), sm * 100.0, weight, per_pod)
        if mem is not None:
            okm = inside & ~np.isnan(mem)
            if okm.any():
                cells = grid.add("mem").reshape(-1)
                np.fmax.at(cells, flat[okm], mem[okm].astype(np.float32) + 1.0)
        for name, col in (("mem_total", "mem_total_mib"), ("power", "power_w"),
                          ("dram", "dram_active"), ("tensor", "tensor_active")):
            vals = _float(batch, col)
            if vals is None:
                continue
            good = ~np.isnan(vals)
            if name == "mem_total":
                top = np.full(len(names), -np.inf)
                np.maximum.at(top, wid[good], vals[good])
                for jm in np.flatnonzero(top > -np.inf).tolist():
                    cur = scal["mem_total"][jm]
                    m = float(top[jm])
                    scal["mem_total"][jm] = m if np.isnan(cur) else max(cur, m)
                continue
            sums = np.bincount(wid[good], weights=vals[good], minlength=len(names))
            cnt = np.bincount(wid[good], minlength=len(names))
            for jj in np.flatnonzero(cnt):
                scal[f"{name}_sum"][int(jj)] += float(sums[jj])
                scal[f"{name}_n"][int(jj)] += float(cnt[jj])

    def finish(self) -> Profiles:
        """The profiles of every batch added (the builder is spent)."""
        names, grid, scal, steps = self.names, self.grid, self.scal, self.steps
        if not names:
            raise InputError("no samples to profile", where=self.origin or None,
                             fix="check the file or the Prometheus range")
        w_total = len(names)
        grid.ensure(w_total)
        num = grid.arrays.pop("u_num", np.zeros((grid.cap, steps), np.float32))[:w_total]
        den = grid.arrays.pop("u_den", np.zeros((grid.cap, steps), np.float32))[:w_total]
        with np.errstate(invalid="ignore", divide="ignore"):
            util_m = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan
                              ).astype(np.float32)
        del num, den
        sm_m = None
        if "s_num" in grid.arrays:
            sn, sd = grid.arrays.pop("s_num")[:w_total], grid.arrays.pop("s_den")[:w_total]
            with np.errstate(invalid="ignore", divide="ignore"):
                sm_m = np.where(sd > 0, sn / np.where(sd > 0, sd, 1), np.nan
                                ).astype(np.float32)
        mem_m = grid.arrays.get("mem")
        if mem_m is None:
            mem_m = np.full((w_total, steps), np.nan, np.float32)
        else:  # stored + 1: 0 is a step without a reading
            mem_m = mem_m[:w_total]
            mem_m -= 1.0
            mem_m[mem_m < 0] = np.nan

        def mean(name: str) -> np.ndarray:
            s = np.asarray(scal[f"{name}_sum"])
            c = np.asarray(scal[f"{name}_n"])
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(c > 0, s / np.where(c > 0, c, 1), np.nan)

        return Profiles(
            workload=tuple(n[0] for n in names), gpu_uuid=tuple(n[1] for n in names),
            gpu_model=tuple(n[2] for n in names), group=tuple(n[3] for n in names),
            group_keys=self.keys, start_ns=int(self.start), step_s=self.step_s,
            util_pct=util_m, mem_mib=mem_m, sm_pct=sm_m,
            mem_total_mib=np.asarray(scal["mem_total"], np.float32),
            power_w_mean=mean("power"), dram_active_mean=mean("dram"),
            tensor_active_mean=mean("tensor"), origin=self.origin)


def _accumulate(grid: _Grid, name: str, flat: np.ndarray, ok: np.ndarray, values: np.ndarray,
                weight: np.ndarray, per_pod: bool) -> None:
    """Add sum(value x share) and sum(share) per cell (a GPU-level workload's rows of one
    timestamp have shares summing to 1, so their mean is the GPU's reading); a pod's own
    rows weigh 1 each, so its cell holds its share of the GPU."""
    num = grid.add(f"{name}_num").reshape(-1)
    den = grid.add(f"{name}_den").reshape(-1)
    f = flat[ok]
    if f.size == 0:
        return
    w = weight[ok]
    v = (values[ok] * w).astype(np.float32)
    d = np.ones(f.size, np.float32) if per_pod else w.astype(np.float32)
    np.add.at(num, f, v)  # unbuffered: cells hit twice (time-sliced rows) add both
    np.add.at(den, f, d)


@dataclass(frozen=True)
class WorkloadStats:
    """One workload's summary over the observed steps (percentiles of step means)."""

    workload: str
    gpu_uuid: str
    gpu_model: str | None
    group: tuple[str | None, ...]
    observed_s: float
    util_p50_pct: float | None
    util_p95_pct: float | None
    util_p99_pct: float | None
    util_mean_pct: float | None
    sm_p95_pct: float | None
    mem_peak_mib: float | None
    mem_p99_mib: float | None
    burst_mean_s: float | None
    diurnal_util_pct: tuple[float | None, ...]  # 24 hours of the day, UTC


def row_percentiles(m: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """Percentiles of each row ignoring NaN (linear interpolation, as numpy's default), NaN
    for an all-NaN row; (len(qs), rows). One sort of the matrix, no per-row Python."""
    s = np.sort(m, axis=1)  # NaN sorts last
    n = np.sum(~np.isnan(m), axis=1)
    out = np.full((len(qs), m.shape[0]), np.nan)
    has = n > 0
    rows = np.flatnonzero(has)
    for i, q in enumerate(qs):
        pos = (n[has] - 1) * (q / 100.0)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, n[has] - 1)
        frac = pos - lo
        a = s[rows, lo].astype(np.float64)
        b = s[rows, hi].astype(np.float64)
        out[i, rows] = a + (b - a) * frac
    return out


def profile_stats(p: Profiles) -> tuple[WorkloadStats, ...]:
    """Part 1 of the capacity report: percentiles, peak memory, SM, diurnal shape, bursts."""
    u = p.util_pct
    up = row_percentiles(u, (50, 95, 99))
    observed = np.sum(~np.isnan(u), axis=1)
    with np.errstate(invalid="ignore"):
        umean = np.where(observed > 0, np.nansum(u, axis=1) / np.maximum(observed, 1), np.nan)
    smp = row_percentiles(p.sm_pct, (95,))[0] if p.sm_pct is not None else None
    mp = row_percentiles(p.mem_mib, (99,))[0]
    with np.errstate(invalid="ignore"):
        mpeak = np.where(np.any(~np.isnan(p.mem_mib), axis=1),
                         np.nanmax(np.where(np.isnan(p.mem_mib), -np.inf, p.mem_mib), axis=1),
                         np.nan)
    busy = np.nan_to_num(u, nan=0.0) >= BUSY_FROM_PCT
    starts = busy.copy()
    starts[:, 1:] &= ~busy[:, :-1]
    runs = starts.sum(axis=1)
    burst = np.where(runs > 0, busy.sum(axis=1) / np.maximum(runs, 1) * p.step_s, np.nan)
    hod = ((p.start_ns // 1_000_000_000 + np.arange(p.steps) * p.step_s) // 3600 % 24
           ).astype(np.int64)
    onehot = np.zeros((p.steps, 24), np.float32)
    onehot[np.arange(p.steps), hod] = 1.0
    valid = (~np.isnan(u)).astype(np.float32)
    sums = np.nan_to_num(u, nan=0.0) @ onehot
    cnts = valid @ onehot
    out = []
    for w in range(len(p)):
        def f(x: Any) -> float | None:
            v = float(x)
            return None if np.isnan(v) else v

        out.append(WorkloadStats(
            workload=p.workload[w], gpu_uuid=p.gpu_uuid[w], gpu_model=p.gpu_model[w],
            group=p.group[w], observed_s=float(observed[w]) * p.step_s,
            util_p50_pct=f(up[0, w]), util_p95_pct=f(up[1, w]), util_p99_pct=f(up[2, w]),
            util_mean_pct=f(umean[w]), sm_p95_pct=None if smp is None else f(smp[w]),
            mem_peak_mib=f(mpeak[w]), mem_p99_mib=f(mp[w]), burst_mean_s=f(burst[w]),
            diurnal_util_pct=tuple(f(sums[w, h] / cnts[w, h]) if cnts[w, h] > 0 else None
                                   for h in range(24))))
    return tuple(out)
