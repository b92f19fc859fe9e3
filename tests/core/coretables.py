"""Small sample tables built column by column, for the core tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from gpuaudit.schema import Recording, build_table

NS = 1_000_000_000


def series_table(util_by_gpu: dict[str, Sequence[float | None]], *, interval_s: float = 1.0,
                 t0_s: int = 1_700_000_000, model: str = "NVIDIA H100 80GB HBM3",
                 extra: dict[str, dict[str, Sequence[object]]] | None = None) -> pa.Table:
    """One row per GPU per tick, GPUs interleaved as a sampler writes them."""
    gpus = list(util_by_gpu)
    n = max(len(v) for v in util_by_gpu.values())
    rows: dict[str, list[object]] = {"ts": [], "host": [], "gpu_uuid": [], "gpu_model": [],
                                     "util_gpu_pct": []}
    extra_cols: dict[str, list[object]] = {}
    for i in range(n):
        for g in gpus:
            vals = util_by_gpu[g]
            if i >= len(vals):
                continue
            rows["ts"].append(int((t0_s + i * interval_s) * NS))
            rows["host"].append("h1")
            rows["gpu_uuid"].append(g)
            rows["gpu_model"].append(model)
            rows["util_gpu_pct"].append(vals[i])
            for col, per_gpu in (extra or {}).items():
                extra_cols.setdefault(col, []).append(per_gpu[g][i])
    cols: dict[str, object] = dict(rows)
    cols["ts"] = pa.array(np.array(rows["ts"], dtype=np.int64)).cast(pa.timestamp("ns", "UTC"))
    cols.update(extra_cols)
    return build_table(cols)


def recording(table: pa.Table, interval_s: float | None = 1.0) -> Recording:
    return Recording(table=table, source="test", origin="test table", interval_s=interval_s)


