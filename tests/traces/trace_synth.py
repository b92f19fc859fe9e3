"""Small synthetic Kineto traces for edge cases (the real ones live in tests/data/traces)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7,
           cat: str = "kernel") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts,
            "dur": dur, "args": {"device": 0, "stream": stream, "correlation": corr}}


def launch(ts: float, corr: int, name: str = "cudaLaunchKernel",
           dur: float = 5.0) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts,
            "dur": dur, "args": {"correlation": corr}}


def span(name: str, ts: float, dur: float, cat: str = "user_annotation") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {}}


def write(path: Path, events: list[dict[str, Any]], rank: int | None = 0,
          gz: bool = False, **meta: Any) -> Path:
    doc: dict[str, Any] = {"schemaVersion": 1,
                           "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": 2}
    doc["traceEvents"] = events
    doc.update({"traceName": str(path), "displayTimeUnit": "ms", **meta})
    data = json.dumps(doc, indent=1).encode()
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path
