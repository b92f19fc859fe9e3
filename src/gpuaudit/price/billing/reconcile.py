"""Reconciliation to the cent: each charge period's lines sum to its billed cost, exactly.

The join gives each (period, line, phase) an amount in units of 1e-12 USD. Per charge period
the billed total (the exact sum of the bill's own amounts) is rounded half-even to the cent
once; each row is floored to the cent and the missing cents go to the rows with the largest
remainders (Hare's largest-remainder method, as ``money.allocate_cents``; amounts may be
negative: a refund). So the rounded rows of a period sum to the rounded billed total of that
period, always; totals over periods are sums of those cents, so a showback table adds up to
the totals a reader sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np

__all__ = ["UNITS_PER_CENT", "cents_of_units", "reconcile_cents"]

UNITS_PER_CENT = 10_000_000_000  # 1e-12 USD units per cent


def cents_of_units(units: int, per: int = UNITS_PER_CENT) -> int:
    """An exact amount in 1e-12 units rounded half-even to whole cents (whole minor units
    of ``per`` units each: 1e12 for JPY, 1e9 for BHD)."""
    return int((Decimal(units) / per).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def reconcile_cents(period: np.ndarray, floor_cents: np.ndarray, rem_units: np.ndarray,
                    target_cents: Sequence[int]) -> np.ndarray:
    """Whole cents per row such that each period's rows sum to ``target_cents[period]``.

    ``period``: each row's period index (0..P-1); ``floor_cents`` and ``rem_units``: the row's
    amount as floor(amount / cent) and the remainder in [0, 1e8) units. Rows are ranked in
    each period by remainder (largest first, then by position) and the missing cents handed
    out in that order (all rows first take whole rounds when more cents are missing than the
    period has rows, e.g. after truncation dust; never in practice more than one).
    """
    n = period.shape[0]
    out: np.ndarray = floor_cents.astype(np.int64).copy()
    if n == 0:
        return out
    counts = np.bincount(period, minlength=len(target_cents)).astype(np.int64)
    sums = np.zeros(len(target_cents), dtype=np.int64)
    np.add.at(sums, period, out)
    missing = np.asarray(target_cents, dtype=np.int64) - sums
    if np.any((counts == 0) & (missing != 0)):
        bad = int(np.flatnonzero((counts == 0) & (missing != 0))[0])
        raise ValueError(f"period {bad} has a billed total but no rows")
    safe = np.maximum(counts, 1)
    q, r = np.divmod(missing, safe)
    order = np.lexsort((np.arange(n), -rem_units.astype(np.int64), period))
    start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - start[period[order]]
    out += q[period] + (rank < r[period])
    return out


def split_cents(units: Sequence[int], target: int, per: int = UNITS_PER_CENT) -> list[int]:
    """Whole cents for exact amounts ``units`` (1e-12 USD) summing to ``target`` cents:
    floor each, then the missing cents by largest remainder (ties: first)."""
    if not units:
        return []
    floors = [u // per for u in units]
    rems = [u - f * per for u, f in zip(units, floors)]
    missing = target - sum(floors)
    q, r = divmod(missing, len(units))
    order = sorted(range(len(units)), key=lambda i: (-rems[i], i))
    out = [f + q for f in floors]
    for i in order[:r]:
        out[i] += 1
    return out
