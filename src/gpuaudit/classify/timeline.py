"""A downsampled per-GPU utilization timeline and a utilization histogram.

The HTML report's timeline and histogram and the terminal's sparklines draw from this; they
compute nothing themselves. It is built in a second streaming pass over the same samples the
phase engine read (:func:`gpuaudit.classify.classify` first gives the window), with the same
time weighting (see :mod:`gpuaudit.classify.phases`): a sample stands until the next sample of
its ``gpu_uuid``, capped at ``cap_s``; a series' last sample stands for one nominal interval;
``u`` is ``util_gpu_pct`` (NVML utilization.gpu / DCGM_FI_DEV_GPU_UTIL), else
``100 x gr_engine_active`` (DCGM_FI_PROF_GR_ENGINE_ACTIVE); a sample with neither is left out.

The window is cut into at most ``max_buckets`` equal buckets, none shorter than the nominal
interval. A sample's whole weight goes to the bucket its timestamp falls in. Per GPU and bucket
it keeps the time-weighted mean utilization and the phase holding the most time (the band
colour); a bucket with no reading is null (unobserved, not idle). The histogram holds observed
GPU-seconds in 5 % utilization bins over all GPUs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import numpy as np

from gpuaudit.classify.usage import (
    HIST_EDGES_PCT,
    IDLE_BELOW_PCT,
    PHASES,
    Timeline,
    Usage,
    add_phase_index,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from gpuaudit.schema import Recording, SampleSource

__all__ = ["HIST_EDGES_PCT", "SIGNALS", "Grid", "Timeline", "TimelineAcc", "build_timeline",
           "resample_mean", "timeline_for", "timeline_grid", "timeline_of_rows"]

_NS = 1_000_000_000
_N_HIST = len(HIST_EDGES_PCT) - 1
#: Diagnostic signals bucketed beside utilization (so the diagnosis can judge a run's warm-up,
#: steady state and cool-down apart): name -> the sample-table columns summed into it.
SIGNALS: dict[str, tuple[str, ...]] = {
    "sm_active": ("sm_active",),
    "sm_occupancy": ("sm_occupancy",),
    "tensor_active": ("tensor_active",),
    "dram_active": ("dram_active",),
    "pcie_bytes_per_s": ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"),
    "nvlink_bytes_per_s": ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"),
    "mem_used_mib": ("mem_used_mib",),
    "power_w": ("power_w",),
    # derived: PCIe over idle time (u < 10), NVLink over busy time (u >= 10)
    "pcie_idle_bytes_per_s": (),
    "nvlink_busy_bytes_per_s": (),
    # CPU, percent of all the host's cores; the _while_ ones over idle (busy) time only
    "host_cpu_util_pct": ("host_cpu_util_pct",),
    "proc_cpu_util_pct": ("proc_cpu_util_pct",),
    "host_cpu_util_pct_while_idle": (),
    "host_cpu_util_pct_while_busy": (),
    "proc_cpu_util_pct_while_idle": (),
    "proc_cpu_util_pct_while_busy": (),
}

class _Acc:
    """Per (series, bucket) accumulators that grow with the number of series seen."""

    def __init__(self, n_buckets: int) -> None:
        self.nb = n_buckets
        self.rows = 0
        # observed time per (series, bucket) is the sum of ``ph`` over the phases (one
        # weighted count per row fewer)
        self.uw = np.zeros((0, n_buckets))
        self.ph = np.zeros((0, n_buckets, len(PHASES)))
        # per signal: (time with a reading, time-weighted sum), made on first sight
        self.sig: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def ensure(self, n: int) -> None:
        if n <= self.rows:
            return
        new = max(n, 2 * self.rows, 16)

        def grown(a: np.ndarray) -> np.ndarray:
            g = np.zeros((new, *a.shape[1:]))
            g[: a.shape[0]] = a
            return g

        for name in ("uw", "ph"):
            setattr(self, name, grown(getattr(self, name)))
        self.sig = {k: (grown(t), grown(x)) for k, (t, x) in self.sig.items()}
        self.rows = new

    def signal(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in self.sig:
            self.sig[name] = (np.zeros((self.rows, self.nb)), np.zeros((self.rows, self.nb)))
        return self.sig[name]


@dataclass(frozen=True)
class Grid:
    """The buckets of a timeline: ``nb`` buckets of ``width_ns`` from ``start_ns``."""

    start: datetime
    start_ns: int
    width_ns: int
    nb: int


def timeline_grid(start: datetime, end: datetime, interval_s: float,
                  max_buckets: int = 240) -> Grid:
    """At most ``max_buckets`` equal buckets over ``[start, end)``, none shorter than the
    nominal interval."""
    if max_buckets < 1:
        raise ValueError(f"max_buckets must be >= 1, got {max_buckets}")
    start_ns = _ns(start)
    wall_ns = max(_ns(end) - start_ns, 1)
    interval_ns = max(round(interval_s * _NS), 1)
    width_ns = max(math.ceil(wall_ns / max_buckets), interval_ns)
    return Grid(start, start_ns, width_ns, max(1, math.ceil(wall_ns / width_ns)))


class TimelineAcc:
    """Per (series, bucket) time, utilization-weighted time and phase time, plus the
    histogram; fed with rows whose durations are known (by the phase engine, or by
    :func:`build_timeline`'s own pass)."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.acc = _Acc(grid.nb)
        self.hist = np.zeros(_N_HIST)

    def add(self, code: np.ndarray, ts_ns: np.ndarray, u_pct: np.ndarray, w_s: np.ndarray,
            n_series: int, signals: dict[str, np.ndarray] | None = None) -> None:
        """Rows of series ``code`` at ``ts_ns`` with utilization ``u_pct`` standing for
        ``w_s`` observed seconds (0 for rows without a reading, whose ``u_pct`` is ignored).
        ``signals``: per-row values of some :data:`SIGNALS` (NaN where not measured)."""
        acc, g = self.acc, self.grid
        acc.ensure(n_series)
        if code.shape[0] == 0:
            return
        bucket = (ts_ns - g.start_ns) // g.width_ns
        np.clip(bucket, 0, g.nb - 1, out=bucket)
        # a batch spans a few buckets: count over those only, not the whole grid
        lo, hi = int(bucket.min()), int(bucket.max()) + 1
        span = hi - lo
        cell = code * span
        cell += bucket
        cell -= lo
        rows = int(code.max()) + 1
        size = rows * span
        u = np.where(w_s > 0, u_pct, 0.0)
        acc.uw[:rows, lo:hi] += np.bincount(cell, weights=w_s * u,
                                            minlength=size).reshape(rows, span)
        k = len(PHASES)
        cell *= k
        add_phase_index(cell, u)
        acc.ph[:rows, lo:hi] += np.bincount(cell, weights=w_s,
                                            minlength=size * k).reshape(rows, span, k)
        hb = (u // 5.0).astype(np.int64)
        np.clip(hb, 0, _N_HIST - 1, out=hb)
        self.hist += np.bincount(hb, weights=w_s, minlength=_N_HIST)
        if signals:
            cell //= k
            for name, x in signals.items():
                ok = ~np.isnan(x)
                if not ok.any():
                    continue
                t, xs = acc.signal(name)
                wt = np.where(ok, w_s, 0.0)
                t[:rows, lo:hi] += np.bincount(cell, weights=wt, minlength=size).reshape(rows, span)
                xs[:rows, lo:hi] += np.bincount(cell, weights=wt * np.where(ok, x, 0.0),
                                                minlength=size).reshape(rows, span)

    def absorb(self, other: TimelineAcc, codes: np.ndarray, n_series: int) -> None:
        """Add another accumulator over the same grid whose series ``i`` is ``codes[i]`` here."""
        self.acc.ensure(n_series)
        n = codes.shape[0]
        other.acc.ensure(n)
        self.acc.uw[codes] += other.acc.uw[:n]
        self.acc.ph[codes] += other.acc.ph[:n]
        for name, (t, x) in other.acc.sig.items():
            mine_t, mine_x = self.acc.signal(name)
            mine_t[codes] += t[:n]
            mine_x[codes] += x[:n]
        self.hist += other.hist

    def timeline(self, uuids: Sequence[str], hosts: Sequence[str], max_gpus: int = 512
                 ) -> Timeline:
        """The finished timeline; series are ``uuids`` in code order."""
        acc, g = self.acc, self.grid
        n_gpus = len(uuids)
        keep = min(n_gpus, max_gpus)
        acc.ensure(n_gpus)
        w = acc.ph[:keep].sum(axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            util = np.where(w > 0, acc.uw[:keep] / np.where(w > 0, w, 1.0), np.nan)
        phase = np.where(w > 0, np.argmax(acc.ph[:keep], axis=2), -1).astype(np.int8)
        signals = {}
        with np.errstate(invalid="ignore", divide="ignore"):
            for name, (t, x) in acc.sig.items():
                signals[name] = np.where(t[:keep] > 0, x[:keep] / np.where(t[:keep] > 0,
                                                                           t[:keep], 1.0), np.nan)
        return Timeline(
            start=g.start, bucket_s=g.width_ns / _NS, gpu_uuids=tuple(uuids[:keep]),
            hosts=tuple(hosts[:keep]), util_pct=util, phase=phase, observed_s=w,
            hist_s=self.hist.copy(), truncated_gpus=n_gpus - keep,
            phase_s=acc.ph[:keep].copy(), signals=signals,
        )


def build_timeline(
    source: SampleSource | Recording,
    *,
    start: datetime,
    end: datetime,
    interval_s: float,
    cap_s: float,
    max_buckets: int = 240,
    max_gpus: int = 512,
) -> Timeline:
    """Stream ``source`` once and bucket each GPU's utilization over ``[start, end)``.

    Vectorised per batch (numpy ``bincount``); memory is O(GPUs x buckets), whatever the
    recording's length. GPUs past ``max_gpus`` (in order of first appearance) are counted in
    ``truncated_gpus`` and left out of the per-GPU arrays but not out of the histogram.
    """
    index: dict[str, int] = {}
    hosts: list[str] = []
    rows = (_rows(batch, index, hosts) for batch in source.batches() if batch.num_rows)
    return timeline_of_rows(rows, index, hosts, start=start, end=end, interval_s=interval_s,
                            cap_s=cap_s, max_buckets=max_buckets, max_gpus=max_gpus)


def timeline_of_rows(
    batches: Iterable[dict[str, np.ndarray]],
    index: dict[str, int],
    hosts: list[str],
    *,
    start: datetime,
    end: datetime,
    interval_s: float,
    cap_s: float,
    max_buckets: int = 240,
    max_gpus: int = 512,
) -> Timeline:
    """:func:`build_timeline` over row dicts (``code``, ``ts``, ``u``, ``share`` and the
    ``sig_*`` signals present) whose codes index ``index`` (gpu_uuid -> code, filled in by
    the time each batch is consumed) and ``hosts``: a source read without Arrow (a profiler
    trace's busy/idle series) gives them directly."""
    grid = timeline_grid(start, end, interval_s, max_buckets)
    interval_ns = max(round(interval_s * _NS), 1)
    cap_ns = max(round(cap_s * _NS), 1)
    tl = TimelineAcc(grid)
    pending: dict[str, np.ndarray] | None = None

    def consume(rows: dict[str, np.ndarray], final: bool) -> dict[str, np.ndarray] | None:
        order = np.argsort(rows["code"], kind="stable")
        r = {k: v[order] for k, v in rows.items()}
        c, t = r["code"], r["ts"]
        n = c.shape[0]
        same = np.zeros(n, dtype=bool)
        same[1:] = c[1:] == c[:-1]
        step = np.zeros(n, dtype=np.int64)
        step[1:] = t[1:] - t[:-1]
        new_group = ~same | (step != 0)
        gid = np.cumsum(new_group) - 1
        g_start = np.flatnonzero(new_group)
        g_c, g_t = c[g_start], t[g_start]
        has_next = np.zeros(g_start.shape[0], dtype=bool)
        has_next[:-1] = g_c[1:] == g_c[:-1]
        g_next = np.zeros(g_start.shape[0], dtype=np.int64)
        g_next[:-1] = g_t[1:]
        if final:
            done = np.ones(n, dtype=bool)
            dt = np.full(n, interval_ns, dtype=np.int64)
            left = None
        else:
            done = has_next[gid]
            dt = np.where(done, g_next[gid] - t, 0)
            left = {k: v[~done] for k, v in r.items()}
        if done.any():
            w_s = np.minimum(dt[done], cap_ns) / _NS * r["share"][done]
            u = r["u"][done]
            sig = {name: r[f"sig_{name}"][done] for name in SIGNALS if f"sig_{name}" in r}
            tl.add(r["code"][done], r["ts"][done], np.nan_to_num(u), np.where(np.isnan(u), 0.0, w_s),
                   len(index), sig)
        return left

    for rows in batches:
        if pending is not None and pending["code"].shape[0]:
            n_old, n_new = pending["code"].shape[0], rows["code"].shape[0]
            rows = {k: np.concatenate([pending.get(k, np.full(n_old, np.nan)),
                                       rows.get(k, np.full(n_new, np.nan))])
                    for k in set(rows) | set(pending)}
        pending = consume(rows, final=False)
    if pending is not None and pending["code"].shape[0]:
        consume(pending, final=True)
    return tl.timeline(list(index), hosts, max_gpus)


def _rows(batch: pa.RecordBatch, index: dict[str, int], hosts: list[str]) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.compute as pc

    col = batch.column("gpu_uuid")
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    idx = col.indices.to_numpy(zero_copy_only=False)
    host_col = batch.column("host")
    mapping = np.full(len(col.dictionary), -1, dtype=np.int64)
    dictionary = col.dictionary.to_pylist()
    # only entries some row uses are GPUs (a sliced batch keeps its whole dictionary), in
    # order of first appearance, as in the phase engine
    present, first_rows = np.unique(idx, return_index=True)
    for j, row in sorted(zip(present.tolist(), first_rows.tolist()), key=lambda x: x[1]):
        uuid = dictionary[j]
        code = index.get(uuid)
        if code is None:
            code = index[uuid] = len(index)
            hosts.append(str(host_col[row].as_py()))
        mapping[j] = code
    n = batch.num_rows
    u = _float(batch, "util_gpu_pct", n)
    gr = _float(batch, "gr_engine_active", n)
    u = np.where(np.isnan(u), gr * 100.0, u)
    share = _float(batch, "gpu_share", n)
    out = {
        "code": mapping[idx],
        "ts": batch.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False),
        "u": u,
        "share": np.where(np.isnan(share), 1.0, share),
    }
    for name, cols in SIGNALS.items():
        total: np.ndarray | None = None
        for c in cols:
            if batch.column(c).null_count == n:
                continue
            x = _float(batch, c, n)
            total = x if total is None else np.where(np.isnan(total), x, total + np.nan_to_num(x))
        if total is not None:
            out[f"sig_{name}"] = total
    if "sig_pcie_bytes_per_s" in out:
        out["sig_pcie_idle_bytes_per_s"] = np.where(u < IDLE_BELOW_PCT,
                                                    out["sig_pcie_bytes_per_s"], np.nan)
    if "sig_nvlink_bytes_per_s" in out:
        out["sig_nvlink_busy_bytes_per_s"] = np.where(u >= IDLE_BELOW_PCT,
                                                      out["sig_nvlink_bytes_per_s"], np.nan)
    for base in ("host_cpu_util_pct", "proc_cpu_util_pct"):
        if f"sig_{base}" in out:
            out[f"sig_{base}_while_idle"] = np.where(u < IDLE_BELOW_PCT, out[f"sig_{base}"],
                                                     np.nan)
            out[f"sig_{base}_while_busy"] = np.where(u >= IDLE_BELOW_PCT, out[f"sig_{base}"],
                                                     np.nan)
    return out


def _float(batch: pa.RecordBatch, name: str, n: int) -> np.ndarray:
    col = batch.column(name)
    if col.null_count == len(col):
        return np.full(n, np.nan)
    import pyarrow as pa

    return np.asarray(col.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False),
                      dtype=np.float64)


def _ns(t: datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    delta = t - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * _NS + delta.microseconds * 1000


def timeline_for(source: SampleSource | Recording, usage: Usage, *,
                 max_buckets: int = 240) -> Timeline | None:
    """The timeline of ``source`` over the window :func:`classify` found (None if empty)."""
    if usage.window_start is None or usage.window_end is None:
        return None
    return build_timeline(source, start=usage.window_start, end=usage.window_end,
                          interval_s=usage.interval_s, cap_s=usage.cap_s,
                          max_buckets=max_buckets)


def resample_mean(values: Sequence[float | None], n: int) -> list[float | None]:
    """Average ``values`` (None = no reading) into ``n`` equal slices, for narrow displays."""
    m = len(values)
    if m == 0 or n <= 0:
        return []
    if m <= n:
        return list(values)
    arr = np.array([np.nan if v is None else float(v) for v in values])
    edges = np.linspace(0, m, n + 1).round().astype(np.int64)
    out: list[float | None] = []
    for a, b in itertools.pairwise(edges.tolist()):
        seg = arr[a:max(b, a + 1)]
        seg = seg[~np.isnan(seg)]
        out.append(float(seg.mean()) if seg.size else None)
    return out
