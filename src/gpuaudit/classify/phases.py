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

This module is the order of work (``_Engine.feed``/``finish``, and ``_Engine.absorb`` stitching
row-group ranges) and the public helpers for group keys. Each seam lives in its own module,
readable alone: :mod:`~gpuaudit.classify.coding` (series codes and cell ids),
:mod:`~gpuaudit.classify.rows` (a batch as a row dict; each row's step to its successor),
:mod:`~gpuaudit.classify.accumulate` (phase seconds per cell; utilization statistics and idle
stretches per series), :mod:`~gpuaudit.classify.signals` (the other per-GPU signals) and
:mod:`~gpuaudit.classify.timeline` (the report's timeline).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuaudit.classify import fused
from gpuaudit.classify.accumulate import (
    SeriesStats,
    absorb_cells,
    add_phase_seconds,
    gap_quantiles,
    new_cells,
    weigh,
)
from gpuaudit.classify.coding import Coding
from gpuaudit.classify.lag import OnsetAcc
from gpuaudit.classify.rows import (
    NS,
    Rows,
    concat,
    infer_interval_s,
    order_error,
    read_rows,
    sort_and_step,
)
from gpuaudit.classify.signals import Signals, signal_columns
from gpuaudit.classify.signals import timeline_signals as _timeline_signals  # patched by a bench
from gpuaudit.classify.timeline import Grid, TimelineAcc
from gpuaudit.classify.usage import CELL_VALUE_COLUMNS, CellColumns, SeriesSignals
from gpuaudit.errors import InputError
from gpuaudit.series import ImportNote, series_order

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DEFAULT_CAP_INTERVALS", "TIMELINE_BUCKETS", "engine_batches", "group_key_names"]

DEFAULT_CAP_INTERVALS = 3.0
_NS = NS
#: From this many rows on, classify tunes the allocator (see gpuaudit._heap).
_LARGE_ROWS = 1_000_000
#: The timeline folded into the pass holds GPUs x buckets x 6 floats; wider fleets get it from
#: a second pass that keeps only the first GPUs.
_TIMELINE_MAX_SERIES = 4096
TIMELINE_BUCKETS = 240

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



def engine_batches(source: Any, by: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """The source's batches as the engine reads them: lean (``batches(lean=True)``: no
    labels, host, model and MIG profile per row, only where a GPU first appears) where the
    source offers it and no ``--by`` key but periods reads those columns; else with the
    ``--by`` text columns (namespace, pod, container) as the file's dictionaries where the
    source offers that (``batches(dictionaries=...)``)."""
    # (declared by the source's class: a proxy forwarding unknown attributes to a file
    # source, such as the plan's handover, does not take batches(lean=True) through)
    if (hasattr(type(source), "reads_lean") and getattr(source, "reads_lean", False)
            and all(k.startswith("period:") for k in by)):
        return source.batches(lean=True)  # type: ignore[no-any-return]
    # the text keys as the file's own dictionaries: the cells are coded by their indices
    # (Coding.encode_keys leaves them as they are), no text decoded and hashed per row
    text_keys = [k for k in by if k in ("namespace", "pod", "container")]
    if text_keys and getattr(type(source), "reads_dictionaries", False):
        return source.batches(dictionaries=text_keys)  # type: ignore[no-any-return]
    return source.batches()  # type: ignore[no-any-return]


class _Engine:
    """The phase classification of one stream (or one row-group range of it), batch by batch.

    Each seam keeps its own state: ``coding`` (series codes, cell ids), ``cells`` (phase
    seconds per cell), ``stats`` (utilization statistics per series), ``signals`` (the other
    signals per series) and ``timeline`` (the report's timeline, when its buckets are known up
    front). What stays here is the order of work: read a batch into rows, step them, carry the
    rows whose successor has not arrived, accumulate the rest; and stitching ranges.
    """

    def __init__(self, by: tuple[str, ...], interval_s: float | None, cap_intervals: float,
                 grid: Grid | None = None, onsets: bool = False, cells_only: bool = False):
        self.by = by
        #: only the cells are wanted (classify.passes.classify_cells): the NumPy path gathers
        #: no series statistics or signals (the rows and the path taken stay classify's, so
        #: the cells' sums are its own, to the bit)
        self.cells_only = cells_only
        self.interval_s = interval_s
        self.cap_intervals = cap_intervals
        self.coding = Coding(by)
        self.cells = new_cells()
        self.stats = SeriesStats()
        self.signals = Signals()
        # the report's timeline, folded into this pass when its buckets are known up front
        self.timeline = TimelineAcc(grid) if grid is not None else None
        # busy onsets for the lags (classify.lag), gathered here rather than in a second read
        self.onsets = OnsetAcc() if onsets else None
        #: rows whose successor has not arrived yet (carried to the next batch)
        self.pending: Rows | None = None
        #: rows the source will yield, where it says so up front (a Parquet footer), and rows
        #: fed so far: the compiled loop pays back only on large sources (fused.MIN_SOURCE_ROWS)
        self.expected_rows: int | None = None
        self.rows_fed = 0
        self.t_min: int | None = None
        self.t_end: int | None = None

    # the identities classify reads off a finished engine
    @property
    def series_index(self) -> dict[str, int]:
        return self.coding.series_index

    @property
    def series_meta(self) -> list[tuple[str, str | None, str | None]]:
        return self.coding.series_meta

    @property
    def label_keys(self) -> set[str]:
        return self.coding.label_keys

    # -- per batch ------------------------------------------------------------------------
    def feed(self, batch: pa.RecordBatch, position: str) -> None:
        if batch.num_rows == 0:
            return
        self.feed_rows(self._rows(batch), position)

    def add_series(self, uuid: str, host: str, gpu_model: str | None,
                   mig_profile: str | None, first_ts: int) -> int:
        """A series given by its identity, for :meth:`feed_columns` (without ``--by`` keys:
        the series is its one cell); returns its code."""
        if self.by:
            raise ValueError("plain columns carry no group keys: classify them without by")
        code = self.coding.add_series(uuid, host, gpu_model, mig_profile, first_ts)
        self._grow_series(self.coding.n_series)
        self.coding.cell(code, ())
        self.cells.ensure(self.coding.n_cells)
        return code

    def feed_columns(self, codes: np.ndarray, ts: np.ndarray, u: np.ndarray,
                     position: str) -> None:
        """Rows given as plain columns rather than an Arrow batch: series codes (from
        :meth:`add_series`), timestamps (epoch ns) and utilization (%, NaN: no reading);
        no other signal. The same accounting as :meth:`feed`."""
        if codes.shape[0] == 0:
            return
        cell_of_code = np.empty(self.coding.n_series, dtype=np.int64)
        cell_of_code[self.coding.series_of_cells()] = np.arange(self.coding.n_cells)
        self.feed_rows({"code": codes.astype(np.int64, copy=False),
                        "ts": ts.astype(np.int64, copy=False),
                        "cell": cell_of_code[codes],
                        "u": u.astype(np.float64, copy=False)}, position)

    def feed_rows(self, rows: Rows, position: str) -> None:
        """One batch's rows as a row dict (:mod:`gpuaudit.classify.rows`), series and
        cells already registered."""
        if self.interval_s is None:
            self.interval_s = infer_interval_s(rows["code"], rows["ts"])
        t0 = int(rows["ts"].min())
        self.t_min = t0 if self.t_min is None else min(self.t_min, t0)
        self.rows_fed += int(rows["code"].shape[0])
        if self._stream(rows):
            return
        pending = self.pending
        if pending is not None and "share" in pending and bool((pending["share"] < 1.0).any()):
            # a time-sliced GPU's rows of one timestamp may straddle the batch boundary:
            # process the carried rows together with the batch
            self.pending = None
            if self.onsets is not None:
                order = series_order(rows["code"])
                self.onsets.add(rows["code"][order], rows["ts"][order],
                                rows.get("util", rows["u"])[order])
            self._process(concat(pending, rows), final=False, position=position)
            return
        self.pending = None
        r, dt_ns, done = sort_and_step(rows, position, self.coding.uuid_of)
        if self.onsets is not None:
            self.onsets.add(r["code"], r["ts"], r.get("util", r["u"]))
        if pending is not None:
            self._resolve_carried(pending, r, position)
        self._finish_rows(r, dt_ns, done)

    def _stream(self, rows: Rows) -> bool:
        """A large batch of plain rows (utilization and the maxima only) through the compiled loop of
        :mod:`~gpuaudit.classify.fused`: the whole of :meth:`feed` in one pass over the rows.
        False: the NumPy path below takes it (small, time-sliced, signal columns, no numba,
        or out of order, whose error the NumPy path raises)."""
        size = self.expected_rows if self.expected_rows is not None else self.rows_fed
        pending = self.pending
        if pending is not None and "share" in pending and bool(
                (pending["share"] == 1.0).all()):
            # carried after a batch with time-sliced rows, but none of them sliced: a share
            # of 1 weighs as no share does (x * 1.0 == x), so the loop may take them on
            pending = {k: v for k, v in pending.items() if k != "share"}
        # (a small batch takes the loop too once it is loaded: a row group's last rows, say)
        if ((rows["code"].shape[0] < fused.MIN_ROWS and not fused.loaded())
                or size < fused.MIN_SOURCE_ROWS
                or not fused.COLUMNS.issuperset(rows)
                or (pending is not None and not fused.COLUMNS.issuperset(pending))
                or not fused.available()):
            return False
        if self.timeline is not None and self.coding.n_series > _TIMELINE_MAX_SERIES:
            self.timeline = None  # too wide to hold here: the caller makes a second pass
        assert self.interval_s is not None
        out = fused.stream_batch(rows, pending, self.coding.n_series,
                                 self.cap_intervals * self.interval_s, self.cells, self.stats,
                                 self.timeline, self.onsets, self.signals)
        if out is None:
            return False
        self.pending, end = out
        if end >= 0:
            self.t_end = end if self.t_end is None else max(self.t_end, end)
        return True

    def detach(self) -> None:
        """Drop the per-file dictionary cache before the engine is sent to another process;
        the onsets grouped by series where this range ran."""
        self.coding.detach()
        if self.onsets is not None:
            self.onsets.compact()

    def finish(self, series_end_ns: Mapping[str, int] | None = None) -> None:
        """Account the last samples: each stands for one nominal interval, or until its
        series' known end (``series_end_ns``, see :class:`~gpuaudit.schema.Recording`)."""
        pending, self.pending = self.pending, None
        if pending is not None and pending["code"].shape[0]:
            self._process(pending, final=True, position="end of stream",
                          ends=series_end_ns)

    def _rows(self, batch: pa.RecordBatch) -> Rows:
        """The batch as a row dict (see :mod:`gpuaudit.classify.rows`); new series and cells
        get room in every accumulator; point signals are taken here."""
        import pyarrow as pa

        ts = batch.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
        batch = self.coding.encode_keys(batch)
        codes = self.coding.series_codes(batch, ts)
        self._grow_series(self.coding.n_series)
        cells = self.coding.cell_ids(codes, batch)
        self.cells.ensure(self.coding.n_cells)
        rows = read_rows(batch, ts, codes, cells)
        rows.update(signal_columns(batch, rows["u"]))  # (they choose the path: _stream)
        if not self.cells_only:
            self.signals.add_points(batch, codes)
        return rows

    def _grow_series(self, n: int) -> None:
        self.stats.grow(n)
        self.signals.grow(n)
        if self.onsets is not None:
            self.onsets.grow(n)

    def _process(self, rows: Rows, *, final: bool, position: str,
                 ends: Mapping[str, int] | None = None) -> None:
        r, dt_ns, done = sort_and_step(rows, position, self.coding.uuid_of)
        if final:
            assert self.interval_s is not None
            done = np.ones(r["code"].shape[0], dtype=bool)
            dt_ns = np.full(done.shape[0], round(self.interval_s * _NS), dtype=np.int64)
            if ends:
                end_by_code = np.full(self.coding.n_series, -1, dtype=np.int64)
                for uuid, end in ends.items():
                    code = self.series_index.get(uuid)
                    if code is not None:
                        end_by_code[code] = int(end)
                series_end = end_by_code[r["code"]]
                known = series_end > r["ts"]
                dt_ns = np.where(known, series_end - r["ts"], dt_ns)
        self._finish_rows(r, dt_ns, done)

    def _finish_rows(self, r: Rows, dt_ns: np.ndarray, done: np.ndarray) -> None:
        """Accumulate the rows whose successor is known; carry the rest."""
        if not done.all():
            rest = {k: v[~done] for k, v in r.items()}
            self.pending = rest if self.pending is None else concat(self.pending, rest)
            r = {k: v[done] for k, v in r.items()}
            dt_ns = dt_ns[done]
        if dt_ns.shape[0] == 0:
            return
        end = int((r["ts"] + dt_ns).max())
        self.t_end = end if self.t_end is None else max(self.t_end, end)
        self._accumulate(r, dt_ns)

    def _resolve_carried(self, pending: Rows, r: Rows, position: str) -> None:
        """Carried rows whose series has a sample in this batch end at that sample: accumulate
        them before the batch's rows (the step statistics run in time order)."""
        c, t = r["code"], r["ts"]
        first = np.ones(c.shape[0], dtype=bool)
        first[1:] = c[1:] != c[:-1]
        next_ts = np.full(self.stats.size, -1, dtype=np.int64)
        next_ts[c[first]] = t[first]
        pc_ = pending["code"]
        nxt = next_ts[pc_]
        found = nxt >= 0
        if found.any():
            dt = nxt - pending["ts"]
            wrong = found & (dt <= 0)
            if wrong.any():
                i = int(np.flatnonzero(wrong)[0])
                raise order_error(self.coding.uuid_of(int(pc_[i])), int(nxt[i]), position)
            resolved = {k: v[found] for k, v in pending.items()}
            end = int((resolved["ts"] + dt[found]).max())
            self.t_end = end if self.t_end is None else max(self.t_end, end)
            self._accumulate(resolved, dt[found])
        if not found.all():
            rest = {k: v[~found] for k, v in pending.items()}
            self.pending = rest if self.pending is None else concat(self.pending, rest)

    def _accumulate(self, r: Rows, dt_ns: np.ndarray) -> None:
        """Rows whose duration is known (grouped by series, in time order) into every
        accumulator."""
        assert self.interval_s is not None
        cap_s = self.cap_intervals * self.interval_s
        if self.timeline is not None and self.coding.n_series > _TIMELINE_MAX_SERIES:
            self.timeline = None  # too wide to hold here: the caller makes a second pass
        w = weigh(r, dt_ns, cap_s)
        add_phase_seconds(self.cells, r["cell"], w, r.get("sm"))
        if self.timeline is not None:
            self.timeline.add(r["code"], r["ts"], w.u_ok, w.read_w, self.coding.n_series,
                              _timeline_signals(r))
        if not self.cells_only:
            self.stats.add(r["code"], r["u"], w)
            self.signals.add(r, w.obs)

    # -- stitching ranges (the merge protocol) --------------------------------------------
    def absorb(self, other: _Engine, position: str) -> None:
        """Continue this engine with ``other``, which read the rows that follow this engine's
        (the next row-group range of the same file), exactly as if one engine read both.

        ``other`` saw each series start cold: no previous value, no idle stretch to continue.
        Stitching resolves this engine's carried rows at ``other``'s first sample of their
        series, then corrects each series' first row in ``other``: the step from this
        engine's last value, an idle run that merely continues, and the idle stretch that
        spans the boundary (:meth:`SeriesStats.absorb`). Time-sliced rows are never split
        (see FileSource.split).
        """
        if other.interval_s != self.interval_s:
            raise InputError(
                f"ranges of one stream disagree on the interval ({self.interval_s} vs "
                f"{other.interval_s} s)", where=position,
                fix="pass interval_s, or classify without workers")
        # 0. other's series and cells under this engine's codes: m[code], cmap[cell]
        m, cmap = self.coding.absorb(other.coding)
        self._grow_series(self.coding.n_series)
        self.cells.ensure(self.coding.n_cells)
        # 1. this engine's carried rows end at the other's first sample of their series
        if self.pending is not None:
            pending, self.pending = self.pending, None
            order = np.argsort(m)
            self._resolve_carried(pending, {"code": m[order],
                                            "ts": other.coding.first_ts[:m.shape[0]][order]},
                                  position)
        # 2. cells add up; 3. series statistics, corrected at the boundary; 4. signals
        absorb_cells(self.cells, other.cells, cmap)
        self.stats.absorb(other.stats, m)
        self.signals.absorb(other.signals, m)
        if self.timeline is not None and other.timeline is not None:
            self.timeline.absorb(other.timeline, m, self.coding.n_series)
        else:
            self.timeline = None
        if self.onsets is not None and other.onsets is not None:
            self.onsets.absorb(other.onsets, m)
        else:
            self.onsets = None
        if other.t_min is not None:
            self.t_min = other.t_min if self.t_min is None else min(self.t_min, other.t_min)
        if other.t_end is not None:
            self.t_end = other.t_end if self.t_end is None else max(self.t_end, other.t_end)
        # 5. the other's carried rows are carried on
        if other.pending is not None:
            rest = dict(other.pending)
            rest["code"] = m[rest["code"]]
            rest["cell"] = cmap[rest["cell"]]
            self.pending = rest if self.pending is None else concat(self.pending, rest)

    # -- results --------------------------------------------------------------------------
    def cell_columns(self) -> CellColumns:
        """The cells as plain columns (what :meth:`cells_table` holds, without Arrow)."""
        n = self.coding.n_cells
        cols: dict[str, list[Any]] = dict(self.coding.cell_values())
        for name in CELL_VALUE_COLUMNS:
            vals = self.cells.data[name][:n]
            cols[name] = (vals.astype(np.int64) if name == "samples" else vals).tolist()
        return CellColumns(cols)

    def cells_table(self) -> pa.Table:
        import pyarrow as pa

        n = self.coding.n_cells
        cols = self.coding.cell_columns()
        for name in CELL_VALUE_COLUMNS:
            vals = self.cells.data[name][:n]
            cols[name] = pa.array(vals.astype(np.int64) if name == "samples" else vals)
        return pa.table(cols)

    def series_signals(self) -> tuple[SeriesSignals, ...]:
        out = []
        d = self.stats.sums.data
        sig = self.signals
        # per-series phase totals come from the cells (several cells per series when grouped)
        n_cells = self.coding.n_cells
        n_series = self.coding.n_series
        code_of_cell = self.coding.series_of_cells()
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
            mean_u = 100.0 * float(s_busy[code]) / obs if obs > 0 else None
            std_u = None
            if mean_u is not None:
                std_u = float(np.sqrt(max(float(d["u2_w"][code]) / obs - mean_u * mean_u, 0.0)))
            steps = float(d["steps"][code])
            p_mean = sig.mean("power", code)
            thermal_s, power_s = sig.throttle_s(code)
            self.stats.grow(code + 1)
            gaps = self.stats.gap_hist[code]
            quart = gap_quantiles(gaps)
            out.append(SeriesSignals(
                gpu_uuid=uuid, host=host, gpu_model=model, mig_profile=mig,
                samples=int(s_samples[code]),
                observed_s=obs, mean_util_pct=mean_u, std_util_pct=std_u,
                mean_abs_step_pct=float(d["abs_step"][code]) / steps if steps > 0 else None,
                idle_runs=int(d["idle_runs"][code]), idle_s=float(s_idle[code]),
                max_idle_run_s=float(self.stats.max_idle_run[code]),
                idle_gaps=int(gaps.sum()),
                idle_gap_quartiles_s=quart,
                busy_high_s=float(s_high[code]),
                mean_sm_active=sig.mean("sm_active", code),
                mean_sm_occupancy=sig.mean("sm_occupancy", code),
                mean_tensor_active=sig.mean("tensor_active", code),
                mean_dram_active=sig.mean("dram_active", code),
                mean_pcie_bytes_per_s=sig.mean("pcie", code),
                mean_nvlink_bytes_per_s=sig.mean("nvlink", code),
                mean_pcie_idle_bytes_per_s=sig.mean("pcie_idle", code),
                mean_nvlink_busy_bytes_per_s=sig.mean("nvlink_busy", code),
                mean_power_w=p_mean, std_power_w=sig.std_power_w(code, p_mean),
                host_cpu_util_pct=sig.mean("host_cpu_util_pct", code),
                proc_cpu_util_pct=sig.mean("proc_cpu_util_pct", code),
                host_cpu_util_pct_while_idle=sig.mean("host_cpu_util_pct_while_idle", code),
                host_cpu_util_pct_while_busy=sig.mean("host_cpu_util_pct_while_busy", code),
                proc_cpu_util_pct_while_idle=sig.mean("proc_cpu_util_pct_while_idle", code),
                proc_cpu_util_pct_while_busy=sig.mean("proc_cpu_util_pct_while_busy", code),
                power_limit_w=sig.maximum("power_limit_w", code),
                max_temp_c=sig.maximum("temp_c", code),
                mem_used_max_mib=sig.maximum("mem_used_mib", code),
                mem_total_mib=sig.maximum("mem_total_mib", code),
                energy_j=sig.energy_j(code),
                ecc_dbe_delta=sig.ecc_dbe_delta(code),
                xid_codes=tuple(sorted(sig.xids.get(code, ()))),
                thermal_throttle_s=thermal_s,
                power_throttle_s=power_s,
                pods=tuple(sorted(sig.pods.get(code, ()))),
            ))
        return tuple(out)
