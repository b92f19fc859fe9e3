"""The classify stage's output: where GPU time went, per GPU, per group and overall.

Seconds are GPU-seconds (a GPU shared by two pods for one second gives each half a second).
Observed time is split into the four phases; *unobserved* time is the part of a gap past the
cap plus time whose samples carried no utilization reading. Unobserved time is billed and
reported on its own line, never counted as idle and never called waste.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from gpuaudit.series import ImportNote

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "CPU_FIELDS",
    "HIST_EDGES_PCT",
    "IDLE_BELOW_PCT",
    "PHASES",
    "PHASE_LOWER_PCT",
    "CellColumns",
    "JobPattern",
    "Pattern",
    "PhaseTime",
    "RunPhase",
    "SeriesSignals",
    "Timeline",
    "Usage",
    "add_phase_index",
    "arrow_cells",
    "cells_total",
    "largest_remainder",
]

#: The four phases of observed time, and the utilization (percent) at which each begins.
PHASES: tuple[str, ...] = ("idle", "underutilized", "productive", "compute_bound")
PHASE_LOWER_PCT: tuple[float, ...] = (0.0, 10.0, 70.0, 90.0)
#: Below this utilization (percent) a GPU-second is idle: the first band edge, named because
#: idle runs, idle shutdown and the fleet's idle queries all test it.
IDLE_BELOW_PCT: float = PHASE_LOWER_PCT[1]


def add_phase_index(key: np.ndarray, u_pct: np.ndarray) -> np.ndarray:
    """Add each row's phase index (how many of the edges 10, 70, 90 % its utilization
    reaches) to the integer array ``key`` in place; returns ``key``. Callers start ``key``
    at ``cell * len(PHASES)`` to get (cell, phase) keys for one ``bincount``."""
    for edge in PHASE_LOWER_PCT[1:]:
        key += u_pct >= edge
    return key


def largest_remainder(values: Sequence[float], total: int = 100) -> list[int]:
    """Round ``values`` (which sum to ``total`` up to float error) to integers summing to it.

    Hare's largest-remainder method: floor each, then hand the missing units to the largest
    fractional parts. All-zero input gives all zeros.
    """
    s = float(sum(values))
    if s <= 0:
        return [0 for _ in values]
    scaled = [v * total / s for v in values]
    floors = [int(x) for x in scaled]
    missing = total - sum(floors)
    order = sorted(range(len(values)), key=lambda i: (scaled[i] - floors[i], -i), reverse=True)
    for i in order[:missing]:
        floors[i] += 1
    return floors


@dataclass(frozen=True)
class PhaseTime:
    """GPU-seconds in each phase, plus unobserved time and the utilization-weighted sums.

    ``underutilized_unused_s`` is the unused share of underutilized time (sum of dt x (1 - u)),
    the part of it that is waste; ``headroom_s`` the same over productive and compute-bound
    time (not waste). ``busy_s`` is effective GPU-seconds (sum of dt x u).
    """

    idle_s: float = 0.0
    underutilized_s: float = 0.0
    productive_s: float = 0.0
    compute_bound_s: float = 0.0
    gap_s: float = 0.0
    no_reading_s: float = 0.0
    underutilized_unused_s: float = 0.0
    headroom_s: float = 0.0
    busy_s: float = 0.0
    samples: int = 0
    sm_idle_s: float = 0.0
    sm_underutilized_s: float = 0.0
    sm_productive_s: float = 0.0
    sm_compute_bound_s: float = 0.0
    sm_busy_s: float = 0.0

    @property
    def observed_s(self) -> float:
        return self.idle_s + self.underutilized_s + self.productive_s + self.compute_bound_s

    @property
    def unobserved_s(self) -> float:
        return self.gap_s + self.no_reading_s

    @property
    def total_s(self) -> float:
        return self.observed_s + self.unobserved_s

    @property
    def wasted_s(self) -> float:
        """Idle time whole plus the unused share of underutilized time."""
        return self.idle_s + self.underutilized_unused_s

    def phase_seconds(self) -> dict[str, float]:
        return {p: getattr(self, f"{p}_s") for p in PHASES}

    def phase_shares_pct(self) -> dict[str, int]:
        """Shares of observed time, whole percents summing to exactly 100 (or all 0)."""
        secs = self.phase_seconds()
        return dict(zip(secs, largest_remainder(list(secs.values()))))

    @property
    def has_sm_view(self) -> bool:
        return (self.sm_idle_s + self.sm_underutilized_s + self.sm_productive_s
                + self.sm_compute_bound_s) > 0

    def sm_phase_seconds(self) -> dict[str, float]:
        return {p: getattr(self, f"sm_{p}_s") for p in PHASES}

    def sm_phase_shares_pct(self) -> dict[str, int]:
        """The SM view's shares, whole percents summing to exactly 100 (or all 0)."""
        secs = self.sm_phase_seconds()
        return dict(zip(secs, largest_remainder(list(secs.values()))))

    @property
    def mean_util_pct(self) -> float | None:
        """Time-weighted mean utilization over observed time."""
        return 100.0 * self.busy_s / self.observed_s if self.observed_s > 0 else None

    def __add__(self, other: PhaseTime) -> PhaseTime:
        return PhaseTime(**{n: getattr(self, n) + getattr(other, n)
                            for n in CELL_VALUE_COLUMNS})

    @staticmethod
    def total(times: Sequence[PhaseTime]) -> PhaseTime:
        """The field-wise sum of ``times`` (the same additions, in the same order, as
        ``PhaseTime() + times[0] + times[1] + ...``, without the intermediate objects)."""
        sums: dict[str, Any] = {n: sum((getattr(t, n) for t in times), 0.0)
                                for n in CELL_VALUE_COLUMNS}
        sums["samples"] = sum(t.samples for t in times)
        return PhaseTime(**sums)


#: Numeric columns of :attr:`Usage.cells`, in :class:`PhaseTime` field order.
CELL_VALUE_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(PhaseTime))


#: The CPU fields of :class:`SeriesSignals` (percent of all the host's cores; None: not
#: measured), in the order reports show them.
CPU_FIELDS = ("host_cpu_util_pct", "host_cpu_util_pct_while_idle",
              "host_cpu_util_pct_while_busy", "proc_cpu_util_pct",
              "proc_cpu_util_pct_while_idle", "proc_cpu_util_pct_while_busy")


@dataclass(frozen=True)
class SeriesSignals:
    """Per-GPU statistics the pattern, diagnosis and health rules read.

    Means are time-weighted over the samples where the field was measured (None: never).
    """

    gpu_uuid: str
    host: str
    gpu_model: str | None
    mig_profile: str | None
    samples: int
    observed_s: float
    mean_util_pct: float | None
    std_util_pct: float | None
    mean_abs_step_pct: float | None
    idle_runs: int
    idle_s: float
    busy_high_s: float  # time at u >= 70
    max_idle_run_s: float = 0.0
    #: closed idle gaps (an idle stretch between two busy samples; not the leading or
    #: trailing one) and their quartiles in seconds: the loop's cadence. A host step (CPU
    #: optimizer, offload) repeats at a steady length; an input pipeline's gaps scatter.
    idle_gaps: int = 0
    idle_gap_quartiles_s: tuple[float, ...] | None = None
    mean_sm_active: float | None = None
    mean_sm_occupancy: float | None = None
    mean_tensor_active: float | None = None
    mean_dram_active: float | None = None
    mean_pcie_bytes_per_s: float | None = None
    mean_nvlink_bytes_per_s: float | None = None
    #: PCIe TX + RX over idle time only (u < 10): the host feeding a GPU that waits
    mean_pcie_idle_bytes_per_s: float | None = None
    #: NVLink TX + RX over busy time only (u >= 10): collectives run as kernels
    mean_nvlink_busy_bytes_per_s: float | None = None
    mean_power_w: float | None = None
    #: CPU beside the GPU (issue 21), time-weighted means in percent of ALL the host's cores
    #: (None: not measured): the whole host's busy share, the measured workload's process tree
    #: (live runs only), and each over this GPU's idle seconds (u < 10) and busy seconds
    #: (u >= 10) apart: "GPU idle while the host's CPUs are 95% busy in the same seconds"
    host_cpu_util_pct: float | None = None
    proc_cpu_util_pct: float | None = None
    host_cpu_util_pct_while_idle: float | None = None
    host_cpu_util_pct_while_busy: float | None = None
    proc_cpu_util_pct_while_idle: float | None = None
    proc_cpu_util_pct_while_busy: float | None = None
    power_limit_w: float | None = None
    std_power_w: float | None = None
    max_temp_c: float | None = None
    mem_used_max_mib: float | None = None
    mem_total_mib: float | None = None
    energy_j: float | None = None
    ecc_dbe_delta: int | None = None
    xid_codes: tuple[int, ...] = ()
    thermal_throttle_s: float = 0.0
    power_throttle_s: float = 0.0
    pods: tuple[str, ...] = ()

    @property
    def idle_gap_median_s(self) -> float | None:
        q = self.idle_gap_quartiles_s
        return q[1] if q else None

    @property
    def idle_gap_dispersion(self) -> float | None:
        """Quartile coefficient of dispersion of the idle gaps, (Q3 - Q1) / (Q3 + Q1): 0 for
        gaps of one length, near 1 for gaps that scatter over orders of magnitude. Robust to
        the odd long gap (a checkpoint, an evaluation) that would swamp a standard
        deviation."""
        q = self.idle_gap_quartiles_s
        if not q or q[2] + q[0] <= 0:
            return None
        return (q[2] - q[0]) / (q[2] + q[0])


@dataclass(frozen=True)
class OnsetLag:
    """How late one GPU starts its steps behind the other GPUs of its job
    (:mod:`gpuaudit.classify.lag`): the median over ``steps`` of the median lag (seconds)
    of its busy onsets behind its peers' nearest ones, the share of steps it started after
    them, and its step period (the median time between its onsets)."""

    gpu_uuid: str
    job: str
    steps: int
    period_s: float
    median_lag_s: float
    late_share: float


@dataclass(frozen=True)
class RunPhase:
    """One stretch of a GPU's run: ``warm-up``, ``steady`` or ``cool-down`` (see
    :func:`gpuaudit.classify.patterns.split_run`), with its time-weighted means.

    ``start_s``/``end_s`` are seconds from the window start. ``signals`` holds the means of
    the diagnostic fields measured in it (names as in ``classify.timeline.SIGNALS``:
    ``sm_active``, ``tensor_active``, ``dram_active``, ``sm_occupancy``, ``pcie_bytes_per_s``,
    ``nvlink_bytes_per_s``, ``mem_used_mib``, ``power_w``).
    """

    name: str
    start_s: float
    end_s: float
    observed_s: float
    mean_util_pct: float | None
    idle_share: float
    busy_share: float
    signals: dict[str, float] = field(default_factory=dict)

    def signal(self, name: str) -> float | None:
        return self.signals.get(name)


@dataclass(frozen=True)
class Pattern:
    """The shape of one GPU's utilization series, with the numbers that decided it.

    kinds: ``idle`` (almost always idle), ``bursty`` (bouncing between idle and busy in short
    runs: an input-starved loop), ``phased`` (long idle stretches beside busy stretches),
    ``steady`` (steadily half-busy), ``saturated`` (busy nearly always), ``mixed``.
    Where the run has a warm-up or cool-down that differs from its steady state, ``kind`` is
    the steady state's shape and ``shape`` says the whole (``warm-up, then saturated, then
    cool-down``); ``run_phases`` holds each stretch.
    """

    gpu_uuid: str
    kind: str
    evidence: str
    idle_share: float
    busy_share: float
    mean_idle_run_s: float | None
    max_idle_run_s: float = 0.0
    shape: str = ""
    run_phases: tuple[RunPhase, ...] = ()

    @property
    def steady(self) -> RunPhase | None:
        return next((p for p in self.run_phases if p.name == "steady"), None)


@dataclass(frozen=True)
class JobPattern:
    """The shape of a job (the GPUs of one host and pod set): the shape
    most of its GPUs share, named once, with the count that decided it."""

    job: str
    gpu_uuids: tuple[str, ...]
    kind: str
    shape: str
    evidence: str


#: Histogram bin edges, percent: 0, 5, ..., 100 (the last bin includes 100).
HIST_EDGES_PCT: tuple[float, ...] = tuple(float(x) for x in range(0, 101, 5))


@dataclass(frozen=True)
class Timeline:
    """Bucketed utilization per GPU. Arrays are ``(gpus, buckets)``; NaN / -1 mean no reading.

    ``phase`` holds the index into :data:`~gpuaudit.classify.usage.PHASES` of the phase with
    the most observed time in the bucket. ``hist_s`` is observed GPU-seconds per 5 % bin.
    """

    start: datetime
    bucket_s: float
    gpu_uuids: tuple[str, ...]
    hosts: tuple[str, ...]
    util_pct: np.ndarray
    phase: np.ndarray
    observed_s: np.ndarray
    hist_s: np.ndarray
    truncated_gpus: int = 0
    #: observed seconds per phase, ``(gpus, buckets, len(PHASES))``
    phase_s: np.ndarray | None = None
    #: time-weighted bucket means of the diagnostic signals a source measured
    #: (``classify.timeline.SIGNALS``), each ``(gpus, buckets)``, NaN where a bucket has none
    signals: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def buckets(self) -> int:
        return int(self.util_pct.shape[1]) if self.util_pct.ndim == 2 else 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form, as stored in ``AuditResult.extra["timeline"]``."""
        gpus = []
        util = _tenths_or_none(self.util_pct)
        phase = np.asarray(self.phase).astype(np.int64).astype(object)
        phase[np.asarray(self.phase) < 0] = None
        for i, uuid in enumerate(self.gpu_uuids):
            gpus.append({
                "gpu_uuid": uuid,
                "host": self.hosts[i],
                "util_pct": util[i],
                "phase": phase[i].tolist(),
            })
        return {
            "version": 1,
            "start": self.start.isoformat(),
            "bucket_s": self.bucket_s,
            "buckets": self.buckets,
            "phases": list(PHASES),
            "gpus": gpus,
            "truncated_gpus": self.truncated_gpus,
            "histogram": {
                "edges_pct": list(HIST_EDGES_PCT),
                "seconds": [round(float(x), 3) for x in self.hist_s.tolist()],
            },
        }


def _tenths_or_none(x: np.ndarray) -> list[Any]:
    """``[[None if isnan(v) else round(v, 1) for v in row] for row in x]``, the same floats
    without a call per value: ``rint(10 v) / 10`` is Python's correctly rounded ``round(v, 1)``
    wherever ``10 v`` is not within rounding error of a half (where it could round the other
    way than the exact value); those few values take ``round`` itself."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        return [[None if math.isnan(v) else round(v, 1) for v in row] for row in x.tolist()]
    with np.errstate(invalid="ignore", over="ignore"):
        t = x * 10.0
        out = np.rint(t) / 10.0
        frac = t - np.floor(t)
        # (and beyond a million, where 10 v / 10 need not give v back: round itself)
        near_half = (np.abs(frac - 0.5) < 1e-6) | ~(np.abs(x) < 1e6)
    obj = out.astype(object)
    for i, j in zip(*np.nonzero(near_half)):
        obj[i, j] = round(float(x[i, j]), 1)
    obj[np.isnan(x)] = None
    return obj.tolist()  # type: ignore[no-any-return]


@dataclass(frozen=True)
class CellColumns:
    """:attr:`Usage.cells` as plain columns (name -> one list per column, all of one length),
    for a usage classified without Arrow (a profiler trace's, see
    :func:`gpuaudit.classify.columns.classify_columns`): the same rows and columns the Arrow
    table would hold. :meth:`to_arrow` builds that table (importing pyarrow)."""

    columns: dict[str, list[Any]]

    @property
    def num_rows(self) -> int:
        return len(next(iter(self.columns.values()), []))

    @property
    def column_names(self) -> list[str]:
        return list(self.columns)

    def rows(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """The rows as dicts of the ``names`` columns present (as ``pa.Table.to_pylist``)."""
        cols = {n: self.columns[n] for n in names if n in self.columns}
        return [dict(zip(cols, vals)) for vals in zip(*cols.values())] if cols else \
            [{} for _ in range(self.num_rows)]

    def to_arrow(self) -> pa.Table:
        import pyarrow as pa

        return pa.table({k: pa.array(v, type=pa.int64() if k == "samples" else
                                     pa.float64() if k in CELL_VALUE_COLUMNS else pa.string())
                         for k, v in self.columns.items()})


#: what :attr:`Usage.cells` holds: an Arrow table, or plain columns (a trace's usage)
Cells = Union["pa.Table", CellColumns]


def arrow_cells(cells: Cells) -> pa.Table:
    """``cells`` as an Arrow table (plain columns are converted; a table is returned as is)."""
    return cells.to_arrow() if isinstance(cells, CellColumns) else cells


@dataclass(frozen=True)
class Usage:
    """Where GPU time went. ``cells`` has one row per (gpu_uuid, group values) with the
    :data:`CELL_VALUE_COLUMNS`; ``by`` names the group columns (label keys as ``label:<k>``).
    ``cells`` is an Arrow table, or :class:`CellColumns` where the usage was classified
    from plain columns (:func:`arrow_cells` gives the table either way).
    """

    cells: Cells
    by: tuple[str, ...]
    series: tuple[SeriesSignals, ...]
    patterns: tuple[Pattern, ...]
    window_start: datetime | None
    window_end: datetime | None
    interval_s: float
    cap_s: float
    source: str
    origin: str
    notes: tuple[ImportNote, ...] = ()
    events: tuple[str, ...] = ()
    findings: tuple[object, ...] = field(default=())
    #: the per-GPU timeline, built in the same pass where the window was known up front
    timeline: Timeline | None = None
    #: one shape per job (see :func:`gpuaudit.classify.patterns.job_patterns`)
    job_patterns: tuple[JobPattern, ...] = ()
    #: each GPU's busy-onset lag behind its job's peers, where the source could be re-read
    #: (see :mod:`gpuaudit.classify.lag`); empty for fleet pushdowns and live streams
    onset_lags: tuple[OnsetLag, ...] = ()

    @property
    def wall_s(self) -> float:
        """Seconds from the first sample to the end of the last sample's interval."""
        if self.window_start is None or self.window_end is None:
            return 0.0
        return (self.window_end - self.window_start).total_seconds()

    def overall(self) -> PhaseTime:
        return _sum_rows(self.cells)

    def per_gpu(self) -> list[tuple[str, PhaseTime]]:
        return [(str(k[0]), v) for k, v in self.grouped(("gpu_uuid",))]

    def per_group(self) -> list[tuple[tuple[str | None, ...], PhaseTime]]:
        return self.grouped(self.by) if self.by else []

    def grouped(self, keys: Sequence[str]) -> list[tuple[tuple[str | None, ...], PhaseTime]]:
        """Sum the cells over ``keys`` (any of gpu_uuid, host, gpu_model and the ``by`` keys)."""
        if self.cells.num_rows == 0:
            return []
        if isinstance(self.cells, CellColumns):
            return _grouped_plain(self.cells, keys)
        agg = self.cells.group_by(list(keys), use_threads=False).aggregate(
            [(c, "sum") for c in CELL_VALUE_COLUMNS]
        )
        agg = agg.sort_by([(k, "ascending") for k in keys])
        out: list[tuple[tuple[str | None, ...], PhaseTime]] = []
        cols = {c: agg.column(f"{c}_sum").to_pylist() for c in CELL_VALUE_COLUMNS}
        key_cols = [agg.column(k).to_pylist() for k in keys]
        for i in range(agg.num_rows):
            vals: dict[str, Any] = {
                c: (int(cols[c][i]) if c == "samples" else float(cols[c][i]))
                for c in CELL_VALUE_COLUMNS
            }
            pt = PhaseTime(**vals)
            out.append((tuple(kc[i] for kc in key_cols), pt))
        return out

    def series_by_uuid(self) -> dict[str, SeriesSignals]:
        return {s.gpu_uuid: s for s in self.series}


def cells_total(cells: Cells) -> PhaseTime:
    """The field-wise sum of every cell (``Usage.overall()`` of a usage with these cells)."""
    return _sum_rows(cells)


def _sum_rows(cells: Cells) -> PhaseTime:
    if cells.num_rows == 0:
        return PhaseTime()
    vals: dict[str, Any] = {}
    if isinstance(cells, CellColumns):
        for c in CELL_VALUE_COLUMNS:
            vals[c] = _sum_column(cells.columns[c], c)
        return PhaseTime(**vals)
    import pyarrow.compute as pc

    for c in CELL_VALUE_COLUMNS:
        s = pc.sum(cells.column(c)).as_py() or 0
        vals[c] = int(s) if c == "samples" else float(s)
    return PhaseTime(**vals)


def _sum_column(values: Sequence[Any], name: str) -> int | float:
    """A cell column's sum as Arrow's ``sum`` gives it: integers for ``samples``; floats
    added in order (Arrow sums a float64 column of up to 16 values in order: a trace's
    usage has one cell per rank)."""
    if name == "samples":
        return int(sum(int(v) for v in values))
    return float(sum((float(v) for v in values), 0.0))


def _grouped_plain(cells: CellColumns, keys: Sequence[str]
                   ) -> list[tuple[tuple[str | None, ...], PhaseTime]]:
    """:meth:`Usage.grouped` on plain columns: groups in key order (nulls last, as Arrow
    sorts them), each group's sums in row order."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    key_cols = [cells.columns[k] for k in keys]
    for i, key in enumerate(zip(*key_cols)):
        groups.setdefault(key, []).append(i)
    out = []
    for key in sorted(groups, key=lambda k: tuple((v is None, v or "") for v in k)):
        rows = groups[key]
        vals = {c: _sum_column([cells.columns[c][i] for i in rows], c)
                for c in CELL_VALUE_COLUMNS}
        out.append((key, PhaseTime(**vals)))  # type: ignore[arg-type]
    return out
