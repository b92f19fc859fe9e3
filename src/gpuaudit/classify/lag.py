"""Stragglers by time lag: which GPU of a job starts each step late.

In a synchronous job (data, tensor or pipeline parallel) every rank meets its peers at each
collective. A rank that reaches it late (its batch arrives late, its clocks are throttled,
its node is slow) holds the others: they start the step together with it, or spin in the
collective (busy time) until it arrives. Busyness alone cannot name it (the waiting peers
may read *busier*, spinning in NCCL); the order of the busy onsets can: the straggler's
onsets come after its peers' at step after step.

A busy onset is a sample at ``u >= 10%`` (NVML utilization.gpu, DCGM_FI_DEV_GPU_UTIL)
after one below it. Onsets are read in a pass over a re-readable source (a recording or a
file), per GPU in time order (at most :data:`MAX_ONSETS` per GPU). For each onset of a GPU,
the nearest onset of each peer within half the GPU's step period gives a lag; the step's lag
is the median over peers, the GPU's lag the median over steps (:func:`onset_lags`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuaudit.classify.usage import IDLE_BELOW_PCT, OnsetLag

if TYPE_CHECKING:
    from gpuaudit.schema import Recording, SampleSource

__all__ = ["MAX_ONSETS", "OnsetAcc", "busy_onsets", "nanmedian_columns", "onset_lags",
           "onsets_of"]

#: Onsets kept per GPU (the first ones): 20,000 steps are far more than a lag needs.
MAX_ONSETS = 20_000
_NS = 1_000_000_000


def busy_onsets(source: SampleSource | Recording, uuids: Sequence[str]
                ) -> dict[str, np.ndarray]:
    """Busy-onset times (ns) per GPU of ``uuids``, in time order (vectorised per batch: one
    sort by GPU and time, no per-GPU scan of the rows)."""
    return onsets_of(_batch_arrays(source), uuids)


#: one batch as arrays: (series names, each row's index into them, utilization %, ts ns)
BatchArrays = tuple[list[str], np.ndarray, np.ndarray, np.ndarray]


def _batch_arrays(source: SampleSource | Recording) -> Iterator[BatchArrays]:
    import pyarrow as pa
    import pyarrow.compute as pc

    for batch in source.batches():
        if batch.num_rows == 0:
            continue
        uu = pc.dictionary_encode(batch.column("gpu_uuid"))
        if isinstance(uu, pa.ChunkedArray):  # pragma: no cover - a batch column is one chunk
            uu = uu.combine_chunks()
        names = [str(x) for x in uu.dictionary.to_pylist()]
        codes = uu.indices.to_numpy(zero_copy_only=False)
        u = batch.column("util_gpu_pct").cast(pa.float64()).to_numpy(zero_copy_only=False)
        ts = batch.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
        yield names, codes, u, ts


def onsets_of(batches: Iterable[BatchArrays], uuids: Sequence[str]) -> dict[str, np.ndarray]:
    """:func:`busy_onsets` over batches given as arrays (a source read without Arrow, such
    as a profiler trace's busy/idle series, gives them directly)."""
    want = set(uuids)
    out: dict[str, list[np.ndarray]] = {u: [] for u in uuids}
    kept = dict.fromkeys(uuids, 0)
    last_busy: dict[str, bool] = {}
    for names, codes, u, ts_all in batches:
        wanted = np.array([n in want and kept[n] < MAX_ONSETS for n in names], dtype=bool)
        ok = ~np.isnan(u) & wanted[codes]
        if not ok.any():
            continue
        ts = ts_all[ok]
        c, u = codes[ok], u[ok]
        order = np.lexsort((ts, c))
        c, ts, busy = c[order], ts[order], u[order] >= IDLE_BELOW_PCT
        first = np.ones(c.size, dtype=bool)
        first[1:] = c[1:] != c[:-1]
        prev = np.empty_like(busy)
        prev[1:] = busy[:-1]
        # a series' first sample ever is no onset; a later batch continues the last state
        carry = np.array([last_busy.get(n, True) for n in names], dtype=bool)
        prev[first] = carry[c[first]]
        onset = busy & ~prev
        last = np.append(first[1:], True)
        for k, b in zip(c[last].tolist(), busy[last].tolist()):
            last_busy[names[k]] = bool(b)
        if not onset.any():
            continue
        oc, ots = c[onset], ts[onset]
        starts = np.flatnonzero(np.append(True, oc[1:] != oc[:-1]))
        for k, part in zip(oc[starts].tolist(), np.split(ots, starts[1:])):
            name = names[k]
            part = part[: MAX_ONSETS - kept[name]]
            out[name].append(part)
            kept[name] += int(part.size)
    return {n: np.concatenate(v) if v else np.zeros(0, np.int64) for n, v in out.items()}


class OnsetAcc:
    """Busy onsets gathered in classify's own pass (:class:`~gpuaudit.classify.phases._Engine`),
    so the lags need no second read of the samples: the same onsets :func:`busy_onsets`
    finds, for every series (which GPUs share a job is known only at the end).

    Fed each batch's new rows grouped by series in time order; stitched across row-group
    ranges by :meth:`absorb`. Per series it keeps the last reading's busy state and its first
    reading (time, busy), the state a range that read the earlier rows hands on.
    """

    def __init__(self) -> None:
        self.size = 0
        self.last_busy = np.zeros(0, dtype=bool)  # True before any reading: no onset
        self.head_seen = np.zeros(0, dtype=bool)
        self.head_busy = np.zeros(0, dtype=bool)
        self.head_ts = np.zeros(0, dtype=np.int64)
        self.kept = np.zeros(0, dtype=np.int64)
        #: (series codes, onset times) per batch, each grouped by series in time order
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []

    def grow(self, n: int) -> None:
        if n <= self.size:
            return
        new = max(n, 2 * self.size, 64)

        def grown(a: np.ndarray, fill: object) -> np.ndarray:
            out = np.full(new, fill, dtype=a.dtype)
            out[: a.shape[0]] = a
            return out

        self.last_busy = grown(self.last_busy, True)
        self.head_seen = grown(self.head_seen, False)
        self.head_busy = grown(self.head_busy, False)
        self.head_ts = grown(self.head_ts, 0)
        self.kept = grown(self.kept, 0)
        self.size = new

    def add(self, c: np.ndarray, ts: np.ndarray, util: np.ndarray) -> None:
        """Rows of series ``c`` (grouped by series, each in time order) at ``ts`` with
        utilization ``util`` (``util_gpu_pct``, NaN where not read: such rows are skipped)."""
        ok = ~np.isnan(util)
        if not ok.all():
            c, ts, util = c[ok], ts[ok], util[ok]
        n = c.shape[0]
        if n == 0:
            return
        busy = util >= IDLE_BELOW_PCT
        first = np.ones(n, dtype=bool)
        first[1:] = c[1:] != c[:-1]
        fc = c[first]
        fresh = ~self.head_seen[fc]
        if fresh.any():
            self.head_seen[fc[fresh]] = True
            self.head_busy[fc[fresh]] = busy[first][fresh]
            self.head_ts[fc[fresh]] = ts[first][fresh]
        prev = np.empty(n, dtype=bool)
        prev[1:] = busy[:-1]
        prev[first] = self.last_busy[fc]
        last = np.ones(n, dtype=bool)
        last[:-1] = first[1:]
        self.last_busy[c[last]] = busy[last]
        onset = busy & ~prev
        if not onset.any():
            return
        oc, ots = c[onset], ts[onset]
        # the first MAX_ONSETS per series: each onset's rank within its series here
        start = np.ones(oc.shape[0], dtype=bool)
        start[1:] = oc[1:] != oc[:-1]
        idx = np.arange(oc.shape[0])
        rank = idx - np.maximum.accumulate(np.where(start, idx, 0))
        keep = rank < MAX_ONSETS - self.kept[oc]
        if not keep.all():
            oc, ots = oc[keep], ots[keep]
        if oc.shape[0]:
            self.kept += np.bincount(oc, minlength=self.size)[: self.size]
            self.parts.append((oc, ots))

    def absorb(self, other: OnsetAcc, m: np.ndarray) -> None:
        """Continue with ``other``, which read the rows that follow and whose series ``i`` is
        ``m[i]`` here. ``other`` took each series' first reading for no onset; it is one
        where this side's last reading was below the threshold."""
        n_other = m.shape[0]
        other.grow(n_other)
        self.grow(int(m.max()) + 1 if n_other else 0)
        sc = np.flatnonzero(other.head_seen[:n_other])
        ms = m[sc]
        boundary = other.head_busy[sc] & ~self.last_busy[ms]
        if boundary.any():
            order = np.argsort(ms[boundary], kind="stable")
            bc = ms[boundary][order]
            self.parts.append((bc, other.head_ts[sc][boundary][order]))
            self.kept[bc] += 1
        for oc, ots in other.parts:
            mc = m[oc]
            self.parts.append((mc, ots))
            self.kept += np.bincount(mc, minlength=self.size)[: self.size]
        fresh = ~self.head_seen[ms]
        self.head_seen[ms[fresh]] = True
        self.head_busy[ms[fresh]] = other.head_busy[sc[fresh]]
        self.head_ts[ms[fresh]] = other.head_ts[sc[fresh]]
        self.last_busy[ms] = other.last_busy[sc]

    def compact(self) -> None:
        """The parts as one, grouped by series (each in time order): what a row-group range
        hands on, sorted where it ran (on its own core) rather than after the ranges meet."""
        if len(self.parts) > 1 or (self.parts and not _ascending(self.parts[0][0])):
            self.parts = [_by_series(np.concatenate([p[0] for p in self.parts]),
                                     np.concatenate([p[1] for p in self.parts]))]

    def __getstate__(self) -> dict[str, object]:
        """Pickled (a range's engine on its way back from its worker): a part grouped by
        series travels as its per-series counts instead of a code per onset, a third of a
        100M-row range's answer (~2M onsets: 18 of 46 MB)."""
        state = dict(self.__dict__)
        state["parts"] = [(c.dtype.str, np.bincount(c), t) if c.size and _ascending(c)
                          else ("", c, t) for c, t in self.parts]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        parts = state.pop("parts")
        self.__dict__.update(state)
        self.parts = [(np.repeat(np.arange(x.shape[0], dtype=dtype), x) if dtype else x, t)
                      for dtype, x, t in parts]  # type: ignore[attr-defined]

    def onsets(self, uuids: Sequence[str]) -> dict[str, np.ndarray]:
        """Busy-onset times (ns) per GPU, as :func:`busy_onsets` gives them; ``uuids``: the
        series in code order."""
        parts = self.parts
        if len(parts) > _FEW_PARTS:
            parts = [(np.concatenate([p[0] for p in parts]),
                      np.concatenate([p[1] for p in parts]))]
        # each part grouped by series (parts in time order, so each series' pieces too)
        grouped = []
        for c, t in parts:
            if not _ascending(c):
                c, t = _by_series(c, t)
            grouped.append((t, np.searchsorted(c, np.arange(len(uuids) + 1))))
        out = {}
        for k, u in enumerate(uuids):
            pieces = [t[b[k]:b[k + 1]] for t, b in grouped if b[k + 1] > b[k]]
            x = (pieces[0] if len(pieces) == 1 else np.concatenate(pieces) if pieces
                 else np.zeros(0, dtype=np.int64))
            out[u] = x[:MAX_ONSETS].astype(np.int64)
        return out


#: Up to this many parts, :meth:`OnsetAcc.onsets` slices each part per series; more (a range
#: that was not compacted: one part per batch) are joined first
_FEW_PARTS = 8


def _loaded_kernel() -> Any:
    """The compiled loops (:mod:`gpuaudit.classify._kernel`) where classify's pass loaded
    them already (importing numba for these alone would cost more than they save)."""
    return sys.modules.get("gpuaudit.classify._kernel")


def _ascending(c: np.ndarray) -> bool:
    return bool((c[1:] >= c[:-1]).all())


def _by_series(c: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Onsets sorted by series, stably (each series' stay in time order): a counting sort
    where the compiled loops are loaded (classify's pass loaded them), else NumPy's."""
    kernel = _loaded_kernel()
    if kernel is not None and c.size:
        out_c, out_t = np.empty_like(c), np.empty_like(t)
        kernel.group_by_series(np.ascontiguousarray(c, dtype=np.int64),
                                       np.ascontiguousarray(t, dtype=np.int64),
                                       int(c.max()) + 1, out_c, out_t)
        return out_c, out_t
    order = np.argsort(c, kind="stable")
    return c[order], t[order]


#: From this many onsets on, the steps' lags take the compiled loop where numba is loaded
#: already (classify's pass loaded it): the NumPy form below costs ~0.1 us per onset and peer
COMPILED_FROM_ONSETS = 100_000


def onset_lags(onsets: Mapping[str, np.ndarray], jobs: Mapping[str, Sequence[str]], *,
               compiled: bool | None = None) -> tuple[OnsetLag, ...]:
    """Each GPU's lag behind its peers (jobs of at least two GPUs with onsets).

    ``compiled``: the steps' lags in the compiled loop (:func:`gpuaudit.classify._kernel.
    lag_steps`, the same figures); None: where classify's pass loaded the compiled loops
    and the onsets are many."""
    if compiled is None:
        compiled = _loaded_kernel() is not None and sum(
            int(onsets[m].size) for v in jobs.values() for m in v if m in onsets
        ) >= COMPILED_FROM_ONSETS
    out: list[OnsetLag] = []
    for job, members in jobs.items():
        have = [m for m in members if onsets.get(m) is not None and onsets[m].size >= 2]
        if len(have) < 2:
            continue
        for g in have:
            mine = onsets[g].astype(np.int64)
            period = float(np.median(np.diff(mine))) / _NS
            if period <= 0:
                continue
            half_ns = period * _NS / 2
            if compiled:
                step = _steps_compiled(mine, [onsets[p] for p in have if p != g], half_ns)
            else:
                step = _steps(mine, [onsets[p] for p in have if p != g], half_ns)
            if step is None:
                continue
            out.append(OnsetLag(
                gpu_uuid=g, job=job, steps=int(step.size), period_s=period,
                median_lag_s=float(np.median(step)),
                late_share=float(np.mean(step > 0)),
            ))
    return tuple(out)


def _steps(mine: np.ndarray, peers: Sequence[np.ndarray], half_ns: float) -> np.ndarray | None:
    """Each onset's lag (s): the median over peers of the time from the peer's nearest onset
    within ``half_ns``; onsets no peer matches are left out (None: none matched)."""
    per_peer = []
    for theirs in peers:
        theirs = theirs.astype(np.int64)
        i = np.clip(np.searchsorted(theirs, mine), 1, theirs.size - 1)
        left, right = theirs[i - 1], theirs[i]
        near = np.where(mine - left <= right - mine, left, right)
        d = (mine - near).astype(np.float64)
        per_peer.append(np.where(np.abs(d) <= half_ns, d, np.nan))
    lags = np.asarray(per_peer)
    matched = ~np.all(np.isnan(lags), axis=0)
    if not matched.any():
        return None
    return np.asarray(nanmedian_columns(lags[:, matched]) / _NS)


def nanmedian_columns(a: np.ndarray) -> np.ndarray:
    """``np.nanmedian(a, axis=0)`` for a 2-D array with a value in every column, to the last
    bit (the middle value, or the mean of the two middle ones, of each column's values), in
    one sort: NumPy's own takes a Python call per column once a column holds more than a few
    hundred values (~19 ms for 7 peers x 9,000 steps, per GPU)."""
    srt = np.sort(a, axis=0)  # NaN sorts last
    k = np.count_nonzero(~np.isnan(a), axis=0)
    cols = np.arange(a.shape[1])
    lo = srt[(k - 1) // 2, cols]
    hi = srt[k // 2, cols]
    return np.asarray(np.where(k % 2 == 1, lo, (lo + hi) / 2.0))


def _steps_compiled(mine: np.ndarray, peers: Sequence[np.ndarray], half_ns: float
                    ) -> np.ndarray | None:
    """:func:`_steps` in one compiled pass over the onsets (merge walks, no peer matrix)."""
    from gpuaudit.classify import _kernel  # type: ignore[attr-defined]

    bounds = np.zeros(len(peers) + 1, dtype=np.int64)
    bounds[1:] = np.cumsum([p.size for p in peers])
    theirs = np.concatenate([p.astype(np.int64) for p in peers])
    med = np.empty(mine.shape[0])
    _kernel.lag_steps(np.ascontiguousarray(mine), theirs, bounds, float(half_ns), med)
    matched = ~np.isnan(med)
    if not matched.any():
        return None
    return np.asarray(med[matched] / _NS)
