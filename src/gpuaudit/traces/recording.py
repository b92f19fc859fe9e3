"""A profiler trace as a gpuaudit recording (the sample table) plus trace-only findings.

The samples are :func:`gpuaudit.traces.windows.busy_series`'s (each rank one GPU series of
per-window busy then idle samples; see that module for why), written into a sample table for
everything that reads one: ``gpuaudit trace`` itself classifies the same columns without
building it (:mod:`gpuaudit.api.trace`). :func:`findings` lives in
:mod:`gpuaudit.traces.findings` and is re-exported here.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gpuaudit.schema import ImportNote, Recording, build_table, validate
from gpuaudit.traces.analysis import AnalysisOptions
from gpuaudit.traces.findings import TraceFinding, findings, rank_findings
from gpuaudit.traces.loader import Trace
from gpuaudit.traces.windows import busy_series, series_origin

__all__ = ["TraceFinding", "findings", "rank_findings", "trace_to_recording"]


def trace_to_recording(trace: Trace, *, window_s: float = 0.1,
                       options: AnalysisOptions | None = None) -> Recording:
    """The trace as a :class:`~gpuaudit.schema.Recording` of per-window busy shares.

    ``host`` is the trace's ``host_name`` (else the file name), ``gpu_uuid`` is
    ``trace:<host>:rank<r>:gpu<device>``, ``gpu_model`` comes from ``deviceProperties``.
    """
    series, empty = busy_series(trace, window_s=window_s, options=options)
    notes = [ImportNote(n.reason, n.count, n.where, n.column)
             for n in (*trace.all_notes(), *empty)]
    if series:
        ts = np.concatenate([s.ts_ns for s in series])
        idx = np.concatenate([np.full(s.ts_ns.shape[0], -1 if s.device is None else s.device,
                                      dtype=np.int16) for s in series])
        hosts, uuids, models, labels = [], [], [], []
        for s in series:
            n = int(s.ts_ns.shape[0])
            hosts += [s.host] * n
            uuids += [s.gpu_uuid] * n
            models += [s.gpu_model] * n
            labels += [[("source_file", s.source_file), ("rank", str(s.rank))]] * n
        table = build_table({
            "ts": pa.array(ts, pa.timestamp("ns", tz="UTC")),
            "host": hosts, "gpu_uuid": uuids, "gpu_model": models,
            "gpu_index": pa.array(idx, mask=idx < 0),
            "util_gpu_pct": np.concatenate([s.util_pct for s in series]),
            "labels": pa.array(labels, pa.map_(pa.string(), pa.string())),
        })
    else:
        from gpuaudit.schema import empty_table

        table = empty_table()
    table = validate(table, source="trace")
    return Recording(
        table=table, source="trace", origin=series_origin(trace, window_s),
        interval_s=window_s, notes=tuple(notes),
        meta={"ranks": str(len(trace.ranks)), "window_s": str(window_s)},
        series_end_ns={s.gpu_uuid: s.end_ns for s in series},
    )
