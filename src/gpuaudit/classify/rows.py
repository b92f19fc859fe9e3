"""Rows: a batch's columns as NumPy arrays, and each row's step to its series' next sample.

The phase engine (:mod:`gpuaudit.classify.phases`) works on *row dicts*: column name -> one
NumPy array per column, all of one length. The keys are ``code`` (series), ``ts`` (epoch ns),
``cell``, ``u`` (utilization %, NaN: no reading), optionally ``util`` (``util_gpu_pct`` alone,
where ``u`` fell back to ``gr_engine_active``), ``share`` (a time-sliced GPU's share), ``sm`` (SM activity 0-1) and the signal columns of :mod:`gpuaudit.classify.signals`
(``sig_*``, ``max_*``, ``thermal``/``powercap``). A row dict may omit an optional key where
the batch had no value for it; :func:`concat` fills such gaps with neutral values.

:func:`sort_and_step` orders rows by series and time and gives each row its duration: the time
to the next distinct timestamp of its series, where that successor is in the same rows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import numpy as np

from gpuaudit.errors import SampleTableError
from gpuaudit.series import series_order

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["NS", "Rows", "concat", "float_column", "infer_interval_s", "order_error",
           "read_rows", "sort_and_step"]

NS = 1_000_000_000

Rows = dict[str, np.ndarray]


def float_column(batch: pa.RecordBatch, name: str) -> np.ndarray | None:
    """The column as float64 with NaN for nulls; None when every value is null."""
    col = batch.column(name)
    if col.null_count == len(col):
        return None
    if col.null_count:
        import pyarrow as pa

        col = col.cast(pa.float64()).fill_null(np.nan)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)


def read_rows(batch: pa.RecordBatch, ts: np.ndarray, codes: np.ndarray,
              cells: np.ndarray) -> Rows:
    """The rows' identity, utilization, share and SM activity (signals: see
    :func:`gpuaudit.classify.signals.signal_columns`).

    Utilization is ``util_gpu_pct``; where that is null, ``100 x gr_engine_active`` (DCGM on
    MIG instances reports no GPU_UTIL); NaN where neither was measured."""
    rows: Rows = {"code": codes, "ts": ts, "cell": cells}
    u = float_column(batch, "util_gpu_pct")
    if u is None:
        u = np.full(batch.num_rows, np.nan)
    gr = float_column(batch, "gr_engine_active")
    if gr is not None:
        rows["util"] = u  # util_gpu_pct alone: what the busy onsets read (classify.lag)
        u = np.where(np.isnan(u), gr * 100.0, u)
    rows["u"] = u
    share = float_column(batch, "gpu_share")
    if share is not None:
        rows["share"] = np.where(np.isnan(share), 1.0, share)
    sm = float_column(batch, "sm_active")
    if sm is not None:
        rows["sm"] = sm
    return rows


def sort_and_step(rows: Rows, position: str, uuid_of: Callable[[int], str]
                  ) -> tuple[Rows, np.ndarray, np.ndarray]:
    """Rows grouped by series in time order, each row's duration to the next distinct
    timestamp of its series (ns), and which rows have that successor in these rows.

    A series' timestamp must not repeat (except a time-sliced GPU's rows, with ``share``) or
    run backwards: :func:`order_error` names the first that does (``uuid_of``: a series code's
    gpu_uuid)."""
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
        raise order_error(uuid_of(int(c[i])), int(t[i]), position)
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


def order_error(uuid: str, ts_ns: int, position: str) -> SampleTableError:
    """The error for a GPU's timestamp that repeats or runs backwards at ``position``."""
    when = datetime.fromtimestamp(ts_ns / NS, tz=timezone.utc).isoformat()
    return SampleTableError(
        f"timestamp {when} repeats or runs backwards for GPU {uuid}",
        column="ts", value=when, where=position,
        fix="each GPU's samples must be in time order with no duplicates "
        "(a time-sliced GPU's rows need gpu_share)",
    )


def concat(a: Rows, b: Rows) -> Rows:
    """Row-wise concatenation of two row dicts whose optional columns may differ."""
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


def _blank_like(a: np.ndarray, n: int, key: str) -> np.ndarray:
    """``n`` rows of a column the other rows lack: a full share, False, NaN (not measured)."""
    if key == "share":
        return np.ones(n)
    if a.dtype == bool:
        return np.zeros(n, dtype=bool)
    if a.dtype.kind == "f":
        return np.full(n, np.nan)
    return np.zeros(n, dtype=a.dtype)


def infer_interval_s(codes: np.ndarray, ts: np.ndarray) -> float:
    """Median spacing of consecutive distinct timestamps within each series."""
    order = np.argsort(codes, kind="stable")
    c, t = codes[order], ts[order]
    d = np.diff(t)
    same = c[1:] == c[:-1]
    d = d[same & (d > 0)]
    if d.size == 0:
        return 1.0
    return float(np.median(d)) / NS
