"""Nsight Systems kernel summary: ``nsys stats --report cuda_gpu_kern_sum --format csv``.

Columns (nsys 2023+): ``Time (%)``, ``Total Time (ns)``, ``Instances``, ``Avg (ns)``,
``Med (ns)``, ``Min (ns)``, ``Max (ns)``, ``StdDev (ns)``, ``Name``. Older releases call the
report ``gpukernsum`` and name the time columns ``Total Time`` / ``Average`` (ns too).

A summary has no timeline: it gives the kernel breakdown (categories, top kernels, tensor
core share, small kernels) but cannot show idle time, its causes, overlap or input stalls.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from gpuaudit.errors import InputError
from gpuaudit.traces import kernels as kclass

__all__ = ["NsysKernelSummary", "read_nsys_kern_sum"]

_ALIASES = {
    "total_ns": ("Total Time (ns)", "Total Time", "Total Time(ns)"),
    "count": ("Instances", "Count", "Calls"),
    "avg_ns": ("Avg (ns)", "Average", "Average (ns)", "Avg(ns)"),
    "max_ns": ("Max (ns)", "Maximum", "Max(ns)"),
    "min_ns": ("Min (ns)", "Minimum", "Min(ns)"),
    "name": ("Name",),
}


@dataclass(frozen=True)
class NsysKernelSummary:
    """Per-kernel totals from nsys, with categories; ``table`` columns: name, total_ns,
    count, avg_ns, category, tensor_core, hta_type."""

    path: Path
    table: pa.Table

    CANNOT_SHOW = ("GPU idle time and its causes (host wait, kernel wait)",
                   "communication/computation overlap", "input (DataLoader) stalls",
                   "per-window utilization (no timestamps)")

    def category_ns(self) -> dict[str, int]:
        t = self.table.group_by("category").aggregate([("total_ns", "sum")])
        return dict(zip(t.column("category").to_pylist(),
                        (int(x) for x in t.column("total_ns_sum").to_pylist())))

    def as_dict(self, top: int = 10) -> dict[str, Any]:
        total = float(pc.sum(self.table.column("total_ns")).as_py() or 0)
        cats = self.table.column("category").to_numpy(zero_copy_only=False)
        dur = self.table.column("total_ns").to_numpy()
        tc = self.table.column("tensor_core").to_numpy(zero_copy_only=False).astype(bool)
        matmul = np.isin(cats, ["gemm", "convolution", "attention"])
        avg = self.table.column("avg_ns").to_numpy(zero_copy_only=False)
        cnt = self.table.column("count").to_numpy()
        small = avg < 10_000
        order = np.argsort(-dur, kind="stable")[:top]
        rows = self.table.take(pa.array(order)).to_pylist()
        for r in rows:
            r["share_of_kernel_time"] = r["total_ns"] / total if total else 0.0
        return {
            "source": str(self.path),
            "kernel_time_ns": int(total),
            "category_ns": self.category_ns(),
            "tensor_core_share": float(dur[matmul & tc].sum() / dur[matmul].sum())
            if dur[matmul].sum() else None,
            "small_kernel_share": float(cnt[small].sum() / cnt.sum()) if cnt.sum() else None,
            "top_kernels": rows,
            "cannot_show": list(self.CANNOT_SHOW),
        }


def read_nsys_kern_sum(path: str | Path) -> NsysKernelSummary:
    """Read a ``cuda_gpu_kern_sum`` CSV; lines before the header (nsys banners) are skipped."""
    path = Path(path)
    raw = path.read_bytes()
    lines = raw.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines)
                  if b"Name" in ln and (b"Total Time" in ln or b"Instances" in ln)), None)
    if start is None:
        raise InputError(
            "no cuda_gpu_kern_sum header (a line with 'Total Time (ns)' ... 'Name') found",
            where=f"{path}:1",
            fix="export with `nsys stats --report cuda_gpu_kern_sum --format csv "
            "-o out report.nsys-rep`",
        )
    try:
        t = pacsv.read_csv(io.BytesIO(b"".join(lines[start:])))
    except pa.ArrowInvalid as exc:
        raise InputError(f"cannot parse the CSV: {exc}", where=f"{path}:{start + 1}",
                         fix="give the CSV exactly as nsys stats wrote it") from exc
    cols: dict[str, pa.ChunkedArray] = {}
    for key, names in _ALIASES.items():
        found = next((n for n in names if n in t.column_names), None)
        if found is None:
            if key in ("max_ns", "min_ns", "avg_ns"):
                continue
            raise InputError(f"column {names[0]!r} missing (have {t.column_names})",
                             where=f"{path}:{start + 1}",
                             fix="export the cuda_gpu_kern_sum report with --format csv")
        cols[key] = t.column(found)
    name = cols["name"].cast(pa.string())
    name_list = [str(n) for n in name.to_pylist()]
    total = _num(cols["total_ns"], path, "total time")
    count = _num(cols["count"], path, "instances")
    avg = _num(cols["avg_ns"], path, "avg") if "avg_ns" in cols else pc.divide(total, count)
    out = pa.table({
        "name": name,
        "total_ns": total,
        "count": count,
        "avg_ns": avg.cast(pa.float64()),
        "category": pa.array(kclass.category(name_list).tolist(), pa.string()),
        "tensor_core": pa.array(kclass.is_tensor_core(name_list)),
        "hta_type": pa.array(kclass.hta_type(name_list).tolist(), pa.string()),
    })
    return NsysKernelSummary(path, out)


def _num(col: pa.ChunkedArray, path: Path, what: str) -> pa.Array:
    arr = col.combine_chunks()
    if pa.types.is_string(arr.type):
        arr = pc.replace_substring(arr, ",", "")
    try:
        out = arr.cast(pa.int64()) if not pa.types.is_floating(arr.type) else arr
    except pa.ArrowInvalid as exc:
        raise InputError(f"column {what!r} holds a non-number ({exc})", where=str(path),
                         fix="export with --format csv (not the table format)") from exc
    if out.null_count:
        raise InputError(f"column {what!r} has {out.null_count} empty cells", where=str(path),
                         fix="export the report again; a summary row is never empty")
    return out
