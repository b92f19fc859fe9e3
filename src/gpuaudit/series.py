"""The parts of the sample table's contract that need no Arrow: import notes and the order
that groups rows by series. :mod:`gpuaudit.schema` re-exports both; a path that never builds
an Arrow table (``gpuaudit trace``, whose report is classified from the trace's own columns)
imports them from here, so it never loads pyarrow."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LEAN_LABEL_KEYS", "ImportNote", "series_order"]


@dataclass(frozen=True)
class ImportNote:
    """Something an importer changed or dropped, reported to the user, never hidden.

    ``count`` rows or cells were affected; ``reason`` says what and why, ``where`` points at
    the first occurrence (file:line, metric, label).
    """

    reason: str
    count: int
    where: str | None = None
    column: str | None = None


def series_order(codes: np.ndarray) -> np.ndarray:
    """A permutation that groups rows by series, each series in its original (time) order.

    Rows written tick by tick with the GPUs in a fixed order (samplers, nvidia-smi, DCGM
    scrapes) are regrouped by a reshape, starting and ending mid-tick included; anything else
    by a stable sort (a radix sort while codes fit 16 bits).
    """
    n = codes.shape[0]
    if n > 2:
        again = np.flatnonzero(codes[1:] == codes[0])
        if again.size:
            g = int(again[0]) + 1
            if (g >= 2 and np.unique(codes[:g]).size == g
                    and np.array_equal(codes[g:], codes[:-g])):
                ticks = -(-n // g)
                idx = np.full(ticks * g, -1, dtype=np.int64)
                idx[:n] = np.arange(n, dtype=np.int64)
                grouped = idx.reshape(ticks, g).T.ravel()
                return np.asarray(grouped[grouped >= 0])
    if n and int(codes.max()) < 65536 and int(codes.min()) >= 0:
        return np.asarray(np.argsort(codes.astype(np.uint16), kind="stable"))
    return np.asarray(np.argsort(codes, kind="stable"))


#: A lean batch (a source that keeps identities per series, not per row: the native fleet
#: fetch, :func:`gpuaudit.measure.fleet.dcgm.lean_columns`) carries each ``--by`` label's
#: value as a dictionary column ``label:<key>`` and no per-row ``labels``; this schema
#: metadata key lists the label keys its series carry (joined by U+001F), which the
#: per-row maps would otherwise tell (:class:`gpuaudit.classify.coding.Coding` reads both).
LEAN_LABEL_KEYS = b"gpuaudit.label_keys"
