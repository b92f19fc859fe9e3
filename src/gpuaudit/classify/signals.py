"""Signals beside utilization, per GPU: what the pattern, diagnosis and health rules read.

- time-weighted means over the time each field was measured: SM activity and occupancy,
  tensor and DRAM activity, PCIe and NVLink traffic (and PCIe over idle time, NVLink over busy
  time), power (with its spread), the host's and the workload's CPU busy share (and the
  host's over this GPU's idle and busy seconds apart: CPU work while the GPU waits);
- maxima: temperature, memory used and total, the power limit;
- throttle seconds from the NVML clocks-event reasons (thermal, power cap);
- point signals that need no time weighting: the energy counter's first and last reading, the
  ECC double-bit error counter's range, XID codes, pods.

:func:`signal_columns` reads a batch's signal columns into the engine's row dict
(:mod:`gpuaudit.classify.rows`); :func:`timeline_signals` renames them for the timeline;
:class:`Signals` accumulates them per series and stitches ranges (:meth:`Signals.absorb`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpuaudit.classify.accumulate import Grow, grown
from gpuaudit.classify.rows import Rows, float_column
from gpuaudit.classify.usage import IDLE_BELOW_PCT

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["CPU_SIGNALS", "MAX_SIGNALS", "MEAN_SIGNALS", "SPLIT_SIGNALS", "Signals", "signal_columns", "timeline_signals"]

# NVML clocks-event reason bits (nvml.h, nvmlClocksEventReason*).
_THERMAL_BITS = 0x8 | 0x20 | 0x40  # HW slowdown, SW thermal, HW thermal
_POWER_BITS = 0x4 | 0x80  # SW power cap, HW power brake

#: Per-series time-weighted means: signal name -> columns summed (a row's value is their sum)
MEAN_SIGNALS: dict[str, tuple[str, ...]] = {
    "sm_active": ("sm_active",),
    "sm_occupancy": ("sm_occupancy",),
    "tensor_active": ("tensor_active",),
    "dram_active": ("dram_active",),
    "pcie": ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"),
    "nvlink": ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"),
    "power": ("power_w",),
    # derived from the two above: PCIe over idle time (the host feeding a waiting GPU),
    # NVLink over busy time (collectives run as kernels)
    "pcie_idle": (),
    "nvlink_busy": (),
    # CPU beside the GPU (issue 21): the host's and the workload's process tree, both percent
    # of all the host's cores; the host's over this GPU's idle (u < 10) and busy seconds apart
    "host_cpu_util_pct": ("host_cpu_util_pct",),
    "proc_cpu_util_pct": ("proc_cpu_util_pct",),
    "host_cpu_util_pct_while_idle": (),
    "host_cpu_util_pct_while_busy": (),
    "proc_cpu_util_pct_while_idle": (),
    "proc_cpu_util_pct_while_busy": (),
}
#: derived mean signals: name -> (source signal, True for idle time / False for busy time)
SPLIT_SIGNALS: dict[str, tuple[str, bool]] = {
    "pcie_idle": ("pcie", True),
    "nvlink_busy": ("nvlink", False),
    "host_cpu_util_pct_while_idle": ("host_cpu_util_pct", True),
    "host_cpu_util_pct_while_busy": ("host_cpu_util_pct", False),
    "proc_cpu_util_pct_while_idle": ("proc_cpu_util_pct", True),
    "proc_cpu_util_pct_while_busy": ("proc_cpu_util_pct", False),
}
#: The CPU signals, under the same name on the timeline and in SeriesSignals
CPU_SIGNALS = tuple(k for k in MEAN_SIGNALS if "cpu" in k)
#: Per-series maxima
MAX_SIGNALS = ("temp_c", "mem_used_mib", "mem_total_mib", "power_limit_w")

#: Per-series sums: ``<name>_w`` (value x seconds) and ``<name>_t`` (seconds measured) per mean
#: signal, power squared for its spread, and the throttled seconds.
_SUMS = ("thermal_s", "power_s", *(f"{k}_w" for k in MEAN_SIGNALS),
         *(f"{k}_t" for k in MEAN_SIGNALS), "power2_w")


def signal_columns(batch: pa.RecordBatch, u: np.ndarray) -> Rows:
    """The batch's signal columns as row-dict entries (absent where never measured):
    ``sig_<mean signal>`` (SM activity is the row dict's ``sm``), ``max_<max signal>``, and
    ``thermal``/``powercap`` (bool). ``u``: the rows' utilization %, which splits PCIe and
    NVLink traffic into idle and busy time."""
    rows: Rows = {}
    for name, cols in MEAN_SIGNALS.items():
        if name == "sm_active":
            continue
        total: np.ndarray | None = None
        for c in cols:
            x = float_column(batch, c)
            if x is None:
                continue
            total = x if total is None else np.where(np.isnan(total), x, total + np.nan_to_num(x))
        if total is not None:
            rows[f"sig_{name}"] = total
    split = [(name, base, while_idle) for name, (base, while_idle) in SPLIT_SIGNALS.items()
             if f"sig_{base}" in rows]
    if split:
        idle = u < IDLE_BELOW_PCT  # NaN (no reading) compares False on both sides
        busy = u >= IDLE_BELOW_PCT
    for name, base, while_idle in split:
        rows[f"sig_{name}"] = np.where(idle if while_idle else busy, rows[f"sig_{base}"],
                                       np.nan)
    for name in MAX_SIGNALS:
        x = float_column(batch, name)
        if x is not None:
            rows[f"max_{name}"] = x
    cer = batch.column("clocks_event_reasons")
    if cer.null_count < len(cer):
        bits = cer.fill_null(0).to_numpy(zero_copy_only=False).astype(np.uint64)
        rows["thermal"] = (bits & np.uint64(_THERMAL_BITS)) != 0
        rows["powercap"] = (bits & np.uint64(_POWER_BITS)) != 0
    return rows


def timeline_signals(r: Rows) -> dict[str, np.ndarray]:
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
                         ("power_w", "sig_power"), ("mem_used_mib", "max_mem_used_mib"),
                         *((n, f"sig_{n}") for n in CPU_SIGNALS)):
        if theirs in r:
            out[ours] = r[theirs]
    return out


def _code_pods(codes: np.ndarray, pod: pa.Array) -> list[tuple[int, str]]:
    """The distinct (series code, pod) pairs of the rows that name a pod. A dictionary
    column (the engine encodes a ``--by pod`` column once, for its cells) is paired by its
    indices, with no text hashed again; plain text is grouped by Arrow."""
    import pyarrow as pa

    if isinstance(pod, pa.ChunkedArray):
        pod = pod.combine_chunks()
    if not pa.types.is_dictionary(pod.type):
        combo = pa.table({"c": codes, "p": pod}).group_by(["c", "p"]).aggregate([])
        return [(c, p) for c, p in zip(combo.column("c").to_pylist(),
                                       combo.column("p").to_pylist()) if p is not None]
    n = len(pod.dictionary)
    ind = pod.indices.fill_null(n).to_numpy(zero_copy_only=False).astype(np.int64)
    key = codes.astype(np.int64) * (n + 1) + ind
    size = (int(codes.max()) + 1) * (n + 1) if codes.size else 0
    if size <= 8 * key.shape[0] + 4096:  # a flag per possible pair
        present = np.zeros(size, dtype=bool)
        present[key] = True
        pairs = np.flatnonzero(present)
    else:
        pairs = np.unique(key)
    code, at = np.divmod(pairs, n + 1)
    named = at < n
    vals = pod.dictionary.cast(pa.string()).to_pylist()
    return [(c, vals[i]) for c, i in zip(code[named].tolist(), at[named].tolist())
            if vals[i] is not None]


class Signals:
    """Per-series signal accumulators, indexed by series code."""

    def __init__(self) -> None:
        self.sums = Grow(_SUMS)
        self.series_max: dict[str, np.ndarray] = {k: np.zeros(0) for k in MAX_SIGNALS}
        self.energy_first = np.zeros(0)
        self.energy_last = np.zeros(0)
        self.ecc_min = np.zeros(0)
        self.ecc_max = np.zeros(0)
        self.xids: dict[int, set[int]] = {}
        self.pods: dict[int, set[str]] = {}

    def grow(self, n: int) -> None:
        """Make room for series codes below ``n``."""
        self.sums.ensure(n)
        size = self.sums.size
        if self.energy_first.shape[0] < size:
            self.energy_first = grown(self.energy_first, size, np.nan)
            self.energy_last = grown(self.energy_last, size, np.nan)
            self.ecc_min = grown(self.ecc_min, size, np.nan)
            self.ecc_max = grown(self.ecc_max, size, np.nan)
            for k in MAX_SIGNALS:
                self.series_max[k] = grown(self.series_max[k], size, np.nan)

    # -- per batch ------------------------------------------------------------------------
    def add_points(self, batch: pa.RecordBatch, codes: np.ndarray) -> None:
        """Signals that need no time weighting (rows in time order per series, any series
        order): energy counter, ECC, XID, pods."""
        import pyarrow as pa
        import pyarrow.compute as pc

        energy = float_column(batch, "energy_j")
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
        ecc = float_column(batch, "ecc_dbe_total")
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
            for c, p in _code_pods(codes, pod):
                self.pods.setdefault(c, set()).add(p)

    def add(self, r: Rows, obs: np.ndarray) -> None:
        """The time-weighted signals of rows whose duration is known: ``obs`` observed
        seconds each (not weighted by share: a signal is the GPU's, not the slice's)."""
        s = self.sums
        c = r["code"]
        for name in MEAN_SIGNALS:
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
        for name in MAX_SIGNALS:
            x = r.get(f"max_{name}")
            if x is None or np.isnan(x).all():
                continue
            m = np.full(s.size, -np.inf)
            np.fmax.at(m, c, x)
            seen = np.isfinite(m)
            self.series_max[name][seen] = np.fmax(self.series_max[name][seen], m[seen])
        if "thermal" in r:
            s.add("thermal_s", c, np.where(r["thermal"], obs, 0.0))
            s.add("power_s", c, np.where(r["powercap"], obs, 0.0))

    # -- results --------------------------------------------------------------------------
    def mean(self, name: str, code: int) -> float | None:
        """The series' time-weighted mean of a :data:`MEAN_SIGNALS` signal (None: never
        measured)."""
        t = float(self.sums.data[f"{name}_t"][code])
        return float(self.sums.data[f"{name}_w"][code]) / t if t > 0 else None

    def measured_s(self, name: str, code: int) -> float:
        """Seconds over which the series' :data:`MEAN_SIGNALS` signal was measured (the
        weight of its mean: a ``_while_idle`` signal's is the idle seconds with a reading)."""
        return float(self.sums.data[f"{name}_t"][code])

    def std_power_w(self, code: int, mean_w: float | None) -> float | None:
        """The series' time-weighted standard deviation of power, given its mean."""
        if mean_w is None:
            return None
        p_t = float(self.sums.data["power_t"][code])
        return float(np.sqrt(max(float(self.sums.data["power2_w"][code]) / p_t - mean_w**2,
                                 0.0)))

    def maximum(self, name: str, code: int) -> float | None:
        """The series' largest value of a :data:`MAX_SIGNALS` signal (None: never measured)."""
        v = float(self.series_max[name][code])
        return None if np.isnan(v) else v

    def energy_j(self, code: int) -> float | None:
        """The energy counter's last reading minus its first (None: no reading)."""
        first, last = float(self.energy_first[code]), float(self.energy_last[code])
        return None if np.isnan(first) else last - first

    def ecc_dbe_delta(self, code: int) -> int | None:
        """How far the ECC double-bit error counter moved (None: no reading)."""
        lo, hi = float(self.ecc_min[code]), float(self.ecc_max[code])
        return None if np.isnan(lo) else int(hi - lo)

    def throttle_s(self, code: int) -> tuple[float, float]:
        """Thermal and power-cap throttled seconds."""
        return float(self.sums.data["thermal_s"][code]), float(self.sums.data["power_s"][code])

    # -- merging ranges -------------------------------------------------------------------
    def absorb(self, other: Signals, m: np.ndarray) -> None:
        """Add ``other``'s signals, which read the rows that follow (the next range of the
        stream) and whose series ``i`` is ``m[i]`` here."""
        n_other = m.shape[0]
        for name in _SUMS:
            self.sums.data[name][m] += other.sums.data[name][:n_other]
        seen_first = np.isnan(self.energy_first[m])
        self.energy_first[m] = np.where(seen_first, other.energy_first[:n_other],
                                        self.energy_first[m])
        later = ~np.isnan(other.energy_last[:n_other])
        self.energy_last[m[later]] = other.energy_last[:n_other][later]
        self.ecc_min[m] = np.fmin(self.ecc_min[m], other.ecc_min[:n_other])
        self.ecc_max[m] = np.fmax(self.ecc_max[m], other.ecc_max[:n_other])
        for name in MAX_SIGNALS:
            self.series_max[name][m] = np.fmax(self.series_max[name][m],
                                               other.series_max[name][:n_other])
        for code, xs in other.xids.items():
            self.xids.setdefault(int(m[code]), set()).update(xs)
        for code, ps in other.pods.items():
            self.pods.setdefault(int(m[code]), set()).update(ps)
