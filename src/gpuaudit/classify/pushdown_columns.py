"""The pushdown's answers held columnar: one float64 array per query name, one row per
(series, chunk) that any query answered, rows sorted by (series code, chunk); NaN where a
query gave no answer for that row (Prometheus leaves the series out, or answers NaN: nothing
measured). A 10,000-GPU week is ~30 arrays of a few hundred thousand rows, not a Python dict
per series and chunk.

:func:`decode_columns` is :func:`gpuaudit.classify.pushdown_queries.decode` applied to every
row at once (the per-row function stays the reference: a property test holds them equal).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from gpuaudit.classify.pushdown_queries import (
    _COUNT_ONLY,
    _LOWER_PCT,
    _VIEW_TOP,
    NARROWED,
    pack_base,
)
from gpuaudit.errors import InputError

__all__ = ["Answers", "decode_columns", "straddles_columns"]


class Answers:
    """Per-query columns over (series code, chunk) rows. Answers are added per query
    (:meth:`add`: keys ``code * nchunks + chunk`` and values) and laid out by :meth:`flush`;
    a later answer for the same row and name replaces an earlier one."""

    def __init__(self, nchunks: int) -> None:
        self.nchunks = max(1, int(nchunks))
        self.key = np.zeros(0, np.int64)  # sorted, unique
        self.cols: dict[str, np.ndarray] = {}
        self._pending: list[tuple[str, np.ndarray, np.ndarray]] = []

    @classmethod
    def from_rows(cls, nchunks: int,
                  rows: Mapping[tuple[int, int], Mapping[str, float]]) -> Answers:
        """From ``{(code, chunk): {name: value}}`` (tests, tools)."""
        out = cls(nchunks)
        by_name: dict[str, tuple[list[int], list[float]]] = {}
        for (code, chunk), v in rows.items():
            for name, x in v.items():
                ks, xs = by_name.setdefault(name, ([], []))
                ks.append(code * out.nchunks + chunk)
                xs.append(float(x))
        for name, (ks, xs) in by_name.items():
            out.add(name, np.array(ks, np.int64), np.array(xs, np.float64))
        # rows answered by no query at all still exist (an empty dict)
        out._pending.append(("", np.array([c * out.nchunks + i for c, i in rows], np.int64),
                             np.full(len(rows), np.nan)))
        out.flush()
        out.cols.pop("", None)
        return out

    def add(self, name: str, keys: np.ndarray, values: np.ndarray) -> None:
        self._pending.append((name, keys, values))

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        new = np.unique(np.concatenate([self.key, *(k for _, k, _ in pending)]))
        if new.shape[0] != self.key.shape[0]:
            pos = np.searchsorted(new, self.key)
            for name, col in self.cols.items():
                grown = np.full(new.shape[0], np.nan)
                grown[pos] = col
                self.cols[name] = grown
            self.key = new
        for name, keys, values in pending:
            target = self.cols.get(name)
            if target is None:
                target = np.full(self.key.shape[0], np.nan)
                self.cols[name] = target
            target[np.searchsorted(self.key, keys)] = values

    @property
    def rows(self) -> int:
        return int(self.key.shape[0])

    @property
    def code(self) -> np.ndarray:
        return self.key // self.nchunks

    @property
    def chunk(self) -> np.ndarray:
        return self.key % self.nchunks

    def col(self, name: str) -> np.ndarray:
        """The column ``name`` (all NaN when no row has it; a new array, not stored)."""
        c = self.cols.get(name)
        return c if c is not None else np.full(self.rows, np.nan)

    def has(self, name: str) -> np.ndarray:
        c = self.cols.get(name)
        return ~np.isnan(c) if c is not None else np.zeros(self.rows, bool)

    def pop(self, name: str) -> np.ndarray:
        c = self.cols.pop(name, None)
        return c if c is not None else np.full(self.rows, np.nan)

    def put(self, name: str, values: np.ndarray) -> None:
        """Set column ``name`` (NaN: no answer); an all-NaN column is dropped."""
        if np.isnan(values).all():
            self.cols.pop(name, None)
        else:
            self.cols[name] = values

    def take(self, rows: np.ndarray) -> Answers:
        """The rows ``rows`` (a boolean mask or sorted indices), as a new :class:`Answers`."""
        out = Answers(self.nchunks)
        out.key = self.key[rows]
        out.cols = {n: c[rows] for n, c in self.cols.items()}
        return out

    def row_dict(self, r: int) -> dict[str, float]:
        return {n: float(c[r]) for n, c in self.cols.items() if c[r] == c[r]}

    def iter_rows(self) -> Iterator[tuple[tuple[int, int], dict[str, float]]]:
        for r in range(self.rows):
            k = int(self.key[r])
            yield (k // self.nchunks, k % self.nchunks), self.row_dict(r)


def straddles_columns(a: Answers, name: str) -> np.ndarray:
    """:func:`gpuaudit.classify.pushdown_queries.straddles` of every row."""
    pre, k = NARROWED[name]
    t = _LOWER_PCT[k] * _VIEW_TOP[pre] / 100.0
    lo, hi = a.col(f"{pre}umin"), a.col(f"{pre}umax")
    known = ~np.isnan(lo) & ~np.isnan(hi)
    with np.errstate(invalid="ignore"):
        out: np.ndarray = ~known | ((lo < t) & (t <= hi))
    return out


def _unpack_columns(total: np.ndarray, base: np.ndarray, top: float, rows: np.ndarray,
                    where: Callable[[int], str]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gpuaudit.classify.pushdown_queries.unpack` of the rows ``rows`` (a mask)."""
    count = np.floor(total / base)
    rest = total - count * base
    bad = rows & ((rest < -1e-6) | (rest > top * count + 1e-6 * np.maximum(count, 1.0)))
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise InputError(f"utilization outside 0..100 % (packed total {float(total[r])!r}, "
                         f"{float(count[r]):g} points, sum {float(rest[r])!r})", where=where(r),
                         fix="check the exporter: DCGM_FI_DEV_GPU_UTIL is a percent, "
                         "GR_ENGINE_ACTIVE and SM_ACTIVE are ratios")
    return count, rest


def _threshold_columns(a: Answers, has_view: np.ndarray, name: str, base: np.ndarray,
                       where: Callable[[int], str]) -> tuple[np.ndarray, np.ndarray]:
    """(count, sum in the view's unit) of threshold query ``name`` on every row (rows
    outside ``has_view`` get zeros and are not used)."""
    pre, k = NARROWED[name]
    top = _VIEW_TOP[pre]
    x = a.pop(name)
    asked = straddles_columns(a, name)
    got = asked & ~np.isnan(x) & has_view
    if name in _COUNT_ONLY:
        c_ask, s_ask = np.where(got, x, 0.0), np.zeros(a.rows)
    else:
        c, s = _unpack_columns(np.where(got, x, 0.0), base, top, got, where)
        c_ask, s_ask = np.where(got, c, 0.0), np.where(got, s, 0.0)
    t = _LOWER_PCT[k] * top / 100.0
    with np.errstate(invalid="ignore"):
        inside = a.col(f"{pre}umax") < t if k == 0 else a.col(f"{pre}umin") >= t
    n = np.nan_to_num(a.col(f"{pre}n"))
    s_all = np.nan_to_num(a.col(f"{pre}sum")) * top / 100.0
    c_out = np.where(asked, c_ask, np.where(inside, n, 0.0))
    s_out = np.where(asked, s_ask, np.where(inside, s_all, 0.0))
    return c_out, s_out


def decode_columns(a: Answers, range_s: np.ndarray, step_s: float, *,
                   where: Callable[[int], str]) -> None:
    """:func:`gpuaudit.classify.pushdown_queries.decode` of every row (in place).
    ``range_s``: each row's chunk length; ``where(row)`` names a row in errors."""
    # the packing base depends only on the chunk length: computed per distinct length
    lengths, inverse = np.unique(range_s, return_inverse=True)
    base = np.array([pack_base(round(float(r) / step_s)) for r in lengths])[inverse] \
        if range_s.shape[0] else np.zeros(0)
    for pre, top in _VIEW_TOP.items():
        has_view = a.has(f"{pre}n")
        if not has_view.any():
            continue
        n = a.col(f"{pre}n")
        total = np.nan_to_num(a.col(f"{pre}sum"))
        c_lo, s_lo = _threshold_columns(a, has_view, f"{pre}lo", base, where)
        c_hi, s_hi = _threshold_columns(a, has_view, f"{pre}hi", base, where)
        c_top = np.minimum(_threshold_columns(a, has_view, f"{pre}top", base, where)[0], c_hi)
        pairs = np.zeros(a.rows) if pre else \
            _threshold_columns(a, has_view, "idle_pairs", base, where)[0]
        s_lo, s_hi = s_lo * 100.0 / top, s_hi * 100.0 / top

        def keep(x: np.ndarray, old: np.ndarray | None = None,
                 view: np.ndarray = has_view) -> np.ndarray:
            """x on the view's rows; elsewhere what was there (NaN: nothing)."""
            return np.where(view, x, np.nan if old is None else old)

        for name in ("n", "sum", "umin", "umax"):
            a.pop(f"{pre}{name}")
        under = np.maximum(0.0, n - c_lo - c_hi)
        for name, x in (("idle", c_lo), ("under", under), ("prod", c_hi - c_top),
                        ("cb", c_top), ("busy", total)):
            a.put(f"{pre}{name}", keep(x, a.cols.get(f"{pre}{name}")))
        if pre:
            continue
        edges = np.nan_to_num(a.pop("edges"))
        runs = np.minimum(c_lo, np.maximum(0.0, c_lo - pairs + edges))
        changes = a.col("changes")
        multi = ~np.isnan(changes) & has_view
        runs = np.where(multi, np.minimum(c_lo, np.ceil(np.nan_to_num(changes) / 2.0)), runs)
        a.put("changes", np.where(multi, np.nan, changes))
        a.put("n", keep(n, a.cols.get("n")))
        a.put("unused", keep(np.maximum(0.0, 100.0 * under - (total - s_lo - s_hi)),
                             a.cols.get("unused")))
        a.put("headroom", keep(100.0 * c_hi - s_hi, a.cols.get("headroom")))
        a.put("runs", keep(runs, a.cols.get("runs")))
        pos = has_view & (n > 0)
        std = np.nan_to_num(a.col("std"))
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(pos, total / np.where(pos, n, 1.0), 0.0)
        a.put("u2", np.where(pos, n * (std * std + mean * mean), a.col("u2")))
    for name in ("std", "idle_pairs", "edges", "umin", "umax", "sm_umin", "sm_umax", "raw_n",
                 "changes"):
        a.pop(name)
