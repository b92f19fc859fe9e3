"""A ``--by`` group's GPUs are listed in the usage's series order, whatever the order its
cells were numbered in. Cells are numbered batch by batch, so that order followed where the
read cut its batches (2^17 or 2^19 rows, one process or two): a GPU that joined a group
later moved in the list when the batch size changed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gpuaudit import audit
from gpuaudit.measure.files import open_samples, write_recording
from gpuaudit.schema import TS_TYPE, Recording, build_table

NS = 1_000_000_000


def _moving_gpus(ticks: int = 600) -> pa.Table:
    """GPU-c is in namespace x from the start; GPU-b moves there from y after a quarter of
    the run, GPU-a after half of it. All three idle: one diagnosis per GPU."""
    cols: dict[str, list[object]] = {k: [] for k in ("ts", "host", "gpu_uuid",
                                                    "util_gpu_pct", "namespace")}
    for t in range(ticks):
        for g, moves_at in (("GPU-a", ticks // 2), ("GPU-b", ticks // 4), ("GPU-c", 0)):
            cols["ts"].append((1_700_000_000 + t) * NS)
            cols["host"].append("h")
            cols["gpu_uuid"].append(g)
            cols["util_gpu_pct"].append(0.0)
            cols["namespace"].append("x" if t >= moves_at else "y")
    cols["ts"] = pa.array(np.array(cols["ts"], dtype=np.int64)).cast(TS_TYPE)
    return build_table(cols)


def test_a_groups_gpus_follow_the_series_order_whatever_the_batches(tmp_path):
    path = tmp_path / "moving.parquet"
    write_recording(Recording(table=_moving_gpus(), source="t", origin="t", interval_s=1.0),
                    path, row_group_rows=300)
    seen = set()
    for batch_rows in (3, 30, 300, 1 << 20):
        r = audit(open_samples(path, batch_rows=batch_rows), price="2.00", by=["namespace"],
                  workers=1)
        order = [s.gpu_uuid for s in r.usage.series]
        groups = {g.key: g.gpu_uuids for g in r.group_diagnoses}
        assert groups[("x",)] == tuple(u for u in order if u in groups[("x",)])
        assert set(groups[("x",)]) == {"GPU-a", "GPU-b", "GPU-c"}
        seen.add(tuple(sorted(groups.items())))
    assert len(seen) == 1  # the same lists, whatever the batch size
