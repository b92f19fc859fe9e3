"""Real-GPU check of the NVML sampler (NVIDIA H200 + PyTorch on the device machine).

NOT YET RUN: written without a GPU. Runs four workloads under ``gpuaudit.monitor`` at 10 Hz,
writes one small recording each to OUT_DIR, and checks each against its known shape:

  bf16   steady bf16 matmul loop       -> mostly >= 90 % util, tensor_active > 0
  fp32   the same in fp32              -> mostly >= 90 % util
  starved  CPU work + sleeps between small kernels -> low mean util, bouncing
  idle   nothing on the GPU            -> util < 10 % nearly always

Every recording must hold >= 100 samples with real variance in power, and on Hopper the GPM
fields (sm_active, tensor_active, dram_active) must be present.

Then, informational (no pass/fail): a GIL-bound pure-Python loop under ``monitor(hz=100)``
with the sampler in a thread (``process=False``) and in a separate process
(``process=True``), the achieved rate of each with the real pynvml (goal: >= 99 Hz for the
process), in ``h200_check.json`` under ``gil_busy_100hz``.

    python benchmarks/device/h200_check.py OUT_DIR [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

EXPECT: dict[str, dict[str, float]] = {
    # share of samples in a band, as the workload's known shape
    "bf16": {"busy_share_min": 0.8, "tensor_mean_min": 0.05},
    "fp32": {"busy_share_min": 0.8},
    "starved": {"util_mean_max": 60.0, "util_std_min": 5.0},
    "idle": {"idle_share_min": 0.9},
}


def check(name: str, table: pa.Table, gpm_expected: bool = True) -> list[str]:
    """Problems with one workload's recording (empty list: it matches its shape)."""
    problems: list[str] = []
    n = table.num_rows
    if n < 100:
        problems.append(f"{name}: {n} samples, want >= 100")
        return problems
    util = table.column("util_gpu_pct").to_numpy(zero_copy_only=False).astype(float)
    power = table.column("power_w").to_numpy(zero_copy_only=False).astype(float)
    if np.isnan(power).all() or np.nanstd(power) <= 0.0:
        problems.append(f"{name}: power has no variance (std {np.nanstd(power):.3f} W)")
    exp = EXPECT.get(name, {})
    busy = float(np.nanmean(util >= 90)) if util.size else 0.0
    idle = float(np.nanmean(util < 10)) if util.size else 0.0
    if "busy_share_min" in exp and busy < exp["busy_share_min"]:
        problems.append(f"{name}: {busy:.0%} of samples >= 90% util, want "
                        f">= {exp['busy_share_min']:.0%}")
    if "idle_share_min" in exp and idle < exp["idle_share_min"]:
        problems.append(f"{name}: {idle:.0%} of samples idle, want >= {exp['idle_share_min']:.0%}")
    if "util_mean_max" in exp and np.nanmean(util) > exp["util_mean_max"]:
        problems.append(f"{name}: mean util {np.nanmean(util):.1f}% > {exp['util_mean_max']}")
    if "util_std_min" in exp and np.nanstd(util) < exp["util_std_min"]:
        problems.append(f"{name}: util std {np.nanstd(util):.1f} < {exp['util_std_min']}")
    if gpm_expected:
        for col in ("sm_active", "tensor_active", "dram_active"):
            if table.column(col).null_count == n:
                problems.append(f"{name}: GPM column {col} is empty")
    if "tensor_mean_min" in exp:
        t = table.column("tensor_active").to_numpy(zero_copy_only=False).astype(float)
        if not np.isnan(t).all() and np.nanmean(t) < exp["tensor_mean_min"]:
            problems.append(f"{name}: mean tensor_active {np.nanmean(t):.3f} < "
                            f"{exp['tensor_mean_min']}")
    return problems


def _workloads(seconds: float) -> dict[str, Callable[[Any], None]]:
    import torch

    dev = torch.device("cuda:0")

    def matmul(dtype: Any) -> Callable[[Any], None]:
        def run(m: Any) -> None:
            a = torch.randn(8192, 8192, device=dev, dtype=dtype)
            b = torch.randn(8192, 8192, device=dev, dtype=dtype)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for _ in range(10):
                    a @ b
                torch.cuda.synchronize()
                m.step(samples=10)
        return run

    def starved(m: Any) -> None:
        x = torch.randn(1024, 1024, device=dev)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sum(i * i for i in range(200_000))  # CPU-side "data loading"
            time.sleep(0.05)
            y = x @ x
            torch.cuda.synchronize()
            m.step(samples=1)
            del y

    def idle(m: Any) -> None:
        time.sleep(seconds)

    return {"bf16": matmul(torch.bfloat16), "fp32": matmul(torch.float32),
            "starved": starved, "idle": idle}


def main() -> int:
    ap = argparse.ArgumentParser(description="real-GPU check of the gpuaudit NVML sampler")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    import gpuaudit
    from gpuaudit.measure.live.recorder import read_recording

    args.out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    failed = False
    for name, work in _workloads(args.seconds).items():
        path = args.out_dir / f"h200_{name}.parquet"
        with gpuaudit.monitor(labels={"workload": name}, hz=10, output=path,
                              flush_s=2.0) as m:
            work(m)
        rec = read_recording(path)
        cuda0 = rec.table.filter(pa.compute.equal(rec.table.column("gpu_index"), 0))
        problems = check(name, cuda0)
        stats = m.stats
        summary[name] = {"rows": rec.table.num_rows, "problems": problems,
                         "sampler": stats.as_dict() if stats else None,
                         "totals": m.totals}
        print(f"{name}: {rec.table.num_rows} rows, "
              f"{'OK' if not problems else '; '.join(problems)}", flush=True)
        failed |= bool(problems)
    summary["gil_busy_100hz"] = {}
    for process in (False, True):
        mode = "process" if process else "thread"
        path = args.out_dir / f"h200_gil_busy_100hz_{mode}.parquet"
        with gpuaudit.monitor(labels={"workload": f"gil-busy-{mode}"}, hz=100, output=path,
                              process=process) as m:
            end = time.monotonic() + args.seconds
            x = 0
            while time.monotonic() < end:  # pure Python: holds the GIL
                for i in range(1000):
                    x += i * i
        stats = m.stats
        summary["gil_busy_100hz"][mode] = stats.as_dict() if stats else None
        print(f"gil-busy 100 Hz, sampler in a {mode}: "
              f"{stats.rate_hz if stats else float('nan'):.2f} Hz", flush=True)
    (args.out_dir / "h200_check.json").write_text(json.dumps(summary, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
