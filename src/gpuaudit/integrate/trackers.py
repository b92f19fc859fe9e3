"""What gpuaudit sends to an experiment tracker (MLflow, Weights & Biases), built once.

A :class:`TrackerSummary` holds everything a tracker gets, independent of the tracker: scalar
metrics (phase shares, cost, waste, effective GPU-hours, unit costs), string tags (sampled or
not and why, the rate used, the labels), the top recommendations as rows and as a Markdown
table, the HTML and JSON reports, and the utilization / memory / power time series
downsampled onto one common time grid (:func:`downsample`). The tracker modules
(:mod:`gpuaudit.integrate.mlflow_tracker`, :mod:`gpuaudit.integrate.wandb_tracker`) only
translate it into their library's calls, within that tracker's own limits.

Tracker libraries are optional extras imported lazily by :func:`require`, so ``import
gpuaudit`` and the core install never load them.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import ModuleType
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from gpuaudit import __version__
from gpuaudit.errors import MissingExtraError

__all__ = [
    "PREFIX",
    "SERIES_COLUMNS",
    "Series",
    "StepLog",
    "StepSeries",
    "Tracker",
    "TrackerSummary",
    "downsample",
    "nothing_sampled",
    "require",
    "step_series",
    "summarize",
]

#: Every metric, tag and artifact gpuaudit writes lives under this name.
PREFIX = "gpuaudit"

#: Sample-table columns sent as time series, per GPU.
SERIES_COLUMNS = ("util_gpu_pct", "mem_used_mib", "power_w")

#: Default points per time series: enough for a chart, far below every tracker's limits.
DEFAULT_MAX_POINTS = 1000

#: Recommendations sent (most valuable first).
TOP_RECOMMENDATIONS = 10

_UNIT_NAMES = {"samples": "sample", "tokens": "token", "steps": "step", "epochs": "epoch"}


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import an optional dependency, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{what} needs the {module!r} package, which is not installed ({exc})",
            extra=extra) from exc


@dataclass(frozen=True)
class Series:
    """Downsampled time series on one common grid: ``columns[name][i]`` at ``elapsed_s[i]``.

    Names are ``gpu<index>/<column>`` (``gpu0/util_gpu_pct``); a value is NaN where that GPU
    had no reading in that interval (never a fake 0).
    """

    elapsed_s: np.ndarray  # float64, seconds since the first sample, increasing
    ts_ms: np.ndarray  # int64, Unix milliseconds of each point
    columns: dict[str, np.ndarray]  # float64

    def __len__(self) -> int:
        return int(self.elapsed_s.size)

    def rows(self) -> Iterator[tuple[float, int, dict[str, float]]]:
        """(elapsed_s, ts_ms, {name: value}) per point, NaN values left out."""
        for i in range(len(self)):
            values = {name: float(col[i]) for name, col in self.columns.items()
                      if not np.isnan(col[i])}
            yield float(self.elapsed_s[i]), int(self.ts_ms[i]), values


def _series_names(table: pa.Table) -> tuple[np.ndarray, list[str]]:
    """Per row, the index of its GPU; and each GPU's name (``gpu<index>``, made unique)."""
    uuids = table.column("gpu_uuid").combine_chunks()
    if isinstance(uuids, pa.DictionaryArray):
        uuids = uuids.dictionary_decode()
    uuid_list = uuids.to_pylist()
    index_col = table.column("gpu_index").to_pylist()
    codes: dict[str | None, int] = {}
    names: list[str] = []
    per_row = np.empty(len(uuid_list), dtype=np.int64)
    for i, (uuid, index) in enumerate(zip(uuid_list, index_col)):
        code = codes.get(uuid)
        if code is None:
            code = codes[uuid] = len(names)
            base = f"gpu{index}" if index is not None else f"gpu{code}"
            name, k = base, 1
            while name in names:
                k += 1
                name = f"{base}_{k}"
            names.append(name)
        per_row[i] = code
    return per_row, names


def downsample(table: pa.Table, max_points: int = DEFAULT_MAX_POINTS,
               columns: tuple[str, ...] = SERIES_COLUMNS) -> Series:
    """Mean of each GPU's readings in at most ``max_points`` equal time intervals.

    Every GPU shares one grid (a point's time is the mean sample time in its interval), so a
    tracker can log one row per point. Empty intervals are left out; nulls are skipped, and
    an interval where a GPU had no reading is NaN for that GPU.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    empty = Series(np.zeros(0), np.zeros(0, dtype=np.int64), {})
    if table.num_rows == 0:
        return empty
    ts_ns = table.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
    t0, t1 = int(ts_ns.min()), int(ts_ns.max())
    span = t1 - t0
    # offsets in ns as float: exact below 2**53 ns (104 days)
    off = (ts_ns - t0).astype(np.float64)
    if span == 0:
        bucket = np.zeros(ts_ns.size, dtype=np.int64)
        n = 1
    else:
        n = max_points
        bucket = np.minimum((off / span * n).astype(np.int64), n - 1)
    rows = np.bincount(bucket, minlength=n)
    keep = rows > 0
    mean_off = np.bincount(bucket, weights=off, minlength=n)[keep] / rows[keep]
    gpu_of_row, names = _series_names(table)
    out: dict[str, np.ndarray] = {}
    for col in columns:
        if col not in table.column_names:
            continue
        vals = table.column(col).cast(pa.float64()).to_numpy(zero_copy_only=False)
        vals = np.asarray(vals, dtype=np.float64)  # nulls -> NaN
        seen = ~np.isnan(vals)
        for g, name in enumerate(names):
            mine = (gpu_of_row == g) & seen
            if not mine.any():
                continue
            count = np.bincount(bucket[mine], minlength=n)[keep]
            total = np.bincount(bucket[mine], weights=vals[mine], minlength=n)[keep]
            with np.errstate(invalid="ignore", divide="ignore"):
                out[f"{name}/{col}"] = np.where(count > 0, total / np.maximum(count, 1),
                                                np.nan)
    elapsed = mean_off / 1e9
    ts_ms = ((t0 + mean_off) // 1_000_000).astype(np.int64)
    return Series(elapsed, ts_ms, out)


class StepLog:
    """When the training step counter (``m.step()``, the callbacks) reached each value.

    Appends are O(1); past ``cap`` entries every other one is dropped and only every
    ``stride``-th call is kept from then on, so memory stays bounded on long runs while every
    kept entry is a real (time, step) pair.
    """

    def __init__(self, cap: int = 20_000) -> None:
        self.cap = max(int(cap), 2)
        self.ts_ns: list[int] = []
        self.steps: list[int] = []
        self._stride = 1
        self._calls = 0
        self._last: tuple[int, int] | None = None

    def add(self, ts_ns: int, step: int) -> None:
        """The counter reached ``step`` at ``ts_ns`` (Unix nanoseconds)."""
        self._last = (int(ts_ns), int(step))
        self._calls += 1
        if (self._calls - 1) % self._stride:
            return
        self.ts_ns.append(int(ts_ns))
        self.steps.append(int(step))
        if len(self.steps) >= self.cap:
            del self.ts_ns[1::2], self.steps[1::2]
            self._stride *= 2

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ts_ns, step) as int64 arrays, the latest step always included."""
        ts, st = list(self.ts_ns), list(self.steps)
        if self._last is not None and (not st or st[-1] != self._last[1]):
            ts.append(self._last[0])
            st.append(self._last[1])
        return np.asarray(ts, dtype=np.int64), np.asarray(st, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class StepSeries:
    """GPU cost on the training step: at each logged step ``steps[i]`` (reached at
    ``ts_ms[i]``), ``columns[name][i]``: ``cost_usd`` and ``gpu_hours`` so far,
    ``usd_per_step`` (cumulative cost over steps so far), ``util_gpu_pct`` (mean over every
    GPU's readings since the previous logged step; NaN where none)."""

    steps: np.ndarray  # int64, increasing
    ts_ms: np.ndarray  # int64
    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.steps.size)

    def rows(self) -> Iterator[tuple[int, int, dict[str, float]]]:
        for i in range(len(self)):
            values = {k: float(c[i]) for k, c in self.columns.items() if not np.isnan(c[i])}
            yield int(self.steps[i]), int(self.ts_ms[i]), values


def step_series(samples: pa.Table, step_ts_ns: np.ndarray, step_counts: np.ndarray, *,
                cost_usd: float, gpu_hours: float,
                max_points: int = DEFAULT_MAX_POINTS) -> StepSeries | None:
    """Cost, GPU-hours and utilisation at up to ``max_points`` training steps.

    Cost and GPU-hours so far are the audit's totals times the share of sample rows taken by
    that step's time (sampling is periodic, so rows measure GPU-time); the last counted step
    carries the whole total (the tail of the run after it is its work too), so the curve ends
    at the audit's cost and its cost per step at the scalar ``usd_per_step``. None when no step was counted or nothing sampled.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    ts = np.asarray(step_ts_ns, dtype=np.int64)
    st = np.asarray(step_counts, dtype=np.int64)
    keep_steps = st > 0
    ts, st = ts[keep_steps], st[keep_steps]
    if st.size == 0 or samples.num_rows == 0:
        return None
    # one entry per step value (the time it was first reached), steps increasing
    st, first = np.unique(st, return_index=True)
    ts = ts[first]
    if st.size > max_points:
        pick = np.unique(np.linspace(0, st.size - 1, max_points).round().astype(np.int64))
        st, ts = st[pick], ts[pick]
    sample_ts = table_ts_ns(samples)
    order = np.argsort(sample_ts, kind="stable")
    sample_ts = sample_ts[order]
    n = sample_ts.size
    upto = np.searchsorted(sample_ts, ts, side="right")  # rows taken by each step's time
    upto[-1] = n  # the run's tail after its last step belongs to that step
    share = upto / n
    cost = cost_usd * share
    hours = gpu_hours * share
    util = np.full(st.size, np.nan)
    if "util_gpu_pct" in samples.column_names:
        u = np.asarray(samples.column("util_gpu_pct").cast(pa.float64())
                       .to_numpy(zero_copy_only=False), dtype=np.float64)[order]
        seen = ~np.isnan(u)
        csum = np.concatenate([[0.0], np.cumsum(np.where(seen, u, 0.0))])
        ccount = np.concatenate([[0], np.cumsum(seen)])
        lo = np.concatenate([[0], upto[:-1]])
        cnt = ccount[upto] - ccount[lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            util = np.where(cnt > 0, (csum[upto] - csum[lo]) / np.maximum(cnt, 1), np.nan)
    cols = {"cost_usd": cost, "gpu_hours": hours, "usd_per_step": cost / st,
            "util_gpu_pct": util}
    return StepSeries(st, ts // 1_000_000, cols)


def table_ts_ns(table: pa.Table) -> np.ndarray:
    """The sample table's ``ts`` as int64 Unix nanoseconds."""
    return np.asarray(table.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False),
                      dtype=np.int64)


def step_at(step_ts_ns: np.ndarray, step_counts: np.ndarray, ts_ms: np.ndarray) -> np.ndarray:
    """The training step reached at each time ``ts_ms`` (0 before the first counted step)."""
    order = np.argsort(step_ts_ns, kind="stable")
    t = np.asarray(step_ts_ns, dtype=np.int64)[order]
    s = np.maximum.accumulate(np.asarray(step_counts, dtype=np.int64)[order]) if t.size \
        else np.zeros(0, dtype=np.int64)
    i = np.searchsorted(t, np.asarray(ts_ms, dtype=np.int64) * 1_000_000, side="right")
    return np.where(i > 0, s[np.maximum(i - 1, 0)] if s.size else 0, 0).astype(np.int64)


@dataclass(frozen=True)
class TrackerSummary:
    """Everything a tracker receives for one run (see the module doc)."""

    metrics: dict[str, float]
    tags: dict[str, str]
    recommendations: tuple[dict[str, Any], ...] = ()
    recommendations_md: str = ""
    html: str | None = None
    report_json: str | None = None
    series: Series | None = None
    counts: dict[str, float] = field(default_factory=dict)
    #: GPU cost on the training step (None: no step was counted)
    step_series: StepSeries | None = None
    #: the training step reached at each point of ``series`` (None: no step was counted)
    series_steps: np.ndarray | None = None

    @property
    def sampled(self) -> bool:
        return self.tags.get(f"{PREFIX}.sampled") == "true"


def _base_tags(labels: Mapping[str, str] | None, exit_code: int | None,
               recording_path: str | None) -> dict[str, str]:
    tags = {f"{PREFIX}.version": __version__}
    for k, v in (labels or {}).items():
        tags[f"{PREFIX}.label.{k}"] = str(v)
    if exit_code is not None:
        tags[f"{PREFIX}.exit_code"] = str(exit_code)
    if recording_path:
        tags[f"{PREFIX}.recording"] = str(recording_path)
    return tags


def nothing_sampled(why: str, *, labels: Mapping[str, str] | None = None,
                    exit_code: int | None = None,
                    counts: Mapping[str, float] | None = None) -> TrackerSummary:
    """The summary of a run on which nothing was sampled: tags that say so and why."""
    tags = _base_tags(labels, exit_code, None)
    tags[f"{PREFIX}.sampled"] = "false"
    tags[f"{PREFIX}.not_sampled_reason"] = why
    metrics = {f"{PREFIX}/{k}": float(v) for k, v in (counts or {}).items() if v}
    return TrackerSummary(metrics=metrics, tags=tags, counts=dict(counts or {}))


def _recommendation_rows(doc: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    rows = []
    for rank, r in enumerate(doc.get("recommendations", [])[:TOP_RECOMMENDATIONS], 1):
        rows.append({"rank": rank, "id": r["id"], "title": r["title"], "lever": r["lever"],
                     "counted": bool(r["counted"]), "fraction": float(r["fraction"]),
                     "monthly_usd": str(r["monthly_usd"]), "evidence": str(r["evidence"])})
    return tuple(rows)


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _markdown(rows: tuple[dict[str, Any], ...], doc: Mapping[str, Any]) -> str:
    cell = _cell
    lines = ["# gpuaudit: top recommendations", ""]
    if not rows:
        lines.append("No recommendation: nothing measured calls for a change.")
    else:
        lines += ["| # | id | recommendation | lever | counted | saves | $/month | evidence |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['rank']} | {cell(r['id'])} | {cell(r['title'])} | "
                         f"{r['lever']} | {'yes' if r['counted'] else 'no'} | "
                         f"{r['fraction'] * 100:.1f}% | {r['monthly_usd']} | "
                         f"{cell(r['evidence'])} |")
    s = doc.get("savings") or {}
    if s:
        lines += ["", f"Combined plan: saves {float(s['total_fraction']) * 100:.1f}% "
                  f"(${s['monthly_savings_usd']} of ${s['monthly_cost_usd']} a month); "
                  "fixes combine as 1 - prod(1 - f), never summed."]
    return "\n".join(lines) + "\n"


def summarize(report: Any, *, labels: Mapping[str, str] | None = None,
              exit_code: int | None = None, recording_path: str | None = None,
              max_points: int = DEFAULT_MAX_POINTS, samples: pa.Table | None = None,
              html: bool = True,
              steps: tuple[np.ndarray, np.ndarray] | None = None) -> TrackerSummary:
    """The summary of an audited run: ``report`` is :func:`gpuaudit.audit`'s result.

    ``samples``: the sample table for the time series (None: no series). ``steps``: when the
    training step counter reached each value, ``(ts_ns, step)`` (:class:`StepLog`), which puts
    the series on the training step and adds the cost-per-step curve.
    """
    doc = report.to_dict()
    cost = report.cost
    total = cost.total
    overall = doc["phases"]["overall"]
    t = total.time  # unrounded seconds (the JSON rounds them to the millisecond)
    observed_s = float(t.observed_s)
    p = PREFIX
    metrics: dict[str, float] = {}
    for phase in ("idle", "underutilized", "productive", "compute_bound"):
        seconds = float(getattr(t, f"{phase}_s"))
        metrics[f"{p}/share_pct/{phase}"] = (seconds / observed_s * 100.0
                                             if observed_s > 0 else 0.0)
        metrics[f"{p}/seconds/{phase}"] = seconds
    metrics[f"{p}/observed_s"] = observed_s
    metrics[f"{p}/unobserved_s"] = float(t.unobserved_s)
    if overall.get("mean_util_pct") is not None:
        metrics[f"{p}/mean_util_pct"] = float(overall["mean_util_pct"])
    money: dict[str, Decimal | None] = {
        "cost_usd": total.observed_cost,
        "waste_usd": total.waste,
        "hourly_usd": cost.hourly_cost,
        "monthly_usd": cost.cost_projection.get("monthly"),
        "waste_monthly_usd": cost.waste_projection.get("monthly"),
        "usd_per_effective_gpu_hour": cost.cost_per_effective_gpu_hour,
    }
    for name, value in money.items():
        if value is not None:
            metrics[f"{p}/{name}"] = float(value)
    metrics[f"{p}/waste_share_pct"] = float(total.waste_share) * 100.0
    metrics[f"{p}/gpu_hours"] = float(total.gpu_hours)
    metrics[f"{p}/effective_gpu_hours"] = float(total.effective_gpu_hours)
    metrics[f"{p}/gpus"] = float(len(report.usage.series))
    for unit, usd in cost.unit_costs.items():
        metrics[f"{p}/usd_per_{_UNIT_NAMES.get(unit, unit)}"] = float(usd)
    counts = {k: float(v) for k, v in cost.counts.items()}
    for unit, n in counts.items():
        metrics[f"{p}/{unit}"] = n
    savings = doc.get("savings") or {}
    if savings:
        metrics[f"{p}/savings_fraction"] = float(savings["total_fraction"])
        metrics[f"{p}/savings_monthly_usd"] = float(Decimal(savings["monthly_savings_usd"]))
    if cost.energy is not None:
        metrics[f"{p}/energy_kwh"] = float(cost.energy.kwh)

    tags = _base_tags(labels, exit_code, recording_path)
    tags[f"{p}.sampled"] = "true"
    tags[f"{p}.source"] = str(doc["source"].get("kind") or "")
    models = sorted({str(s.gpu_model) for s in report.usage.series if s.gpu_model})
    if models:
        tags[f"{p}.gpu_models"] = ", ".join(models)
    rates = doc.get("rates") or []
    if rates:
        tags[f"{p}.rates"] = "; ".join(
            f"{r['gpu_model'] or r['gpu_model_seen']}: ${r['usd_per_gpu_hour']}/GPU-h "
            f"{r['provider'] or ''} {r['purchase']} ({r['source']}, {r['as_of']})".replace("  ", " ")
            for r in rates)
    rows = _recommendation_rows(doc)
    if rows:
        tags[f"{p}.top_recommendation"] = f"{rows[0]['id']}: {rows[0]['title']}"
    series = None
    by_step: StepSeries | None = None
    series_steps: np.ndarray | None = None
    if samples is not None and samples.num_rows:
        series = downsample(samples, max_points)
        if steps is not None and len(steps[0]):
            by_step = step_series(samples, steps[0], steps[1],
                                  cost_usd=float(total.observed_cost),
                                  gpu_hours=float(total.gpu_hours), max_points=max_points)
            if by_step is not None:
                series_steps = step_at(steps[0], steps[1], series.ts_ms)
    return TrackerSummary(
        metrics=metrics, tags=tags, recommendations=rows,
        recommendations_md=_markdown(rows, doc),
        html=report.render("html") if html else None,
        report_json=json.dumps(doc, indent=2, default=str),
        series=series, counts=counts, step_series=by_step, series_steps=series_steps)


class Tracker(Protocol):
    """One experiment tracker. ``begin`` before the work (returns environment variables a
    child process needs to log to the same run), ``finish`` after it."""

    name: str

    def begin(self) -> dict[str, str]: ...

    def finish(self, summary: TrackerSummary, *, failed: bool = False) -> str: ...

