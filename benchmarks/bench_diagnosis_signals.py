"""What bucketing the diagnostic signals beside utilization costs classify (docs/diagnosis.md).

    python benchmarks/bench_diagnosis_signals.py --gpus 64 --hours 8 --repeat 3

The input is SYNTHETIC: per GPU, at 1 Hz, utilization plus every DCGM field the timeline
buckets (sm_active, sm_occupancy, tensor_active, dram_active, PCIe and NVLink TX/RX,
mem_used_mib, power_w), written once as a gpuaudit Parquet recording under
benchmarks/_work/. Each run is a fresh process classifying it in one process (workers=1):
"with" is classify as shipped (signals bucketed in the same pass), "without" the same with the
bucketing switched off (``phases._timeline_signals`` returning nothing), the cost before the
diagnosis could judge the steady state. Median wall and CPU seconds (process_time, less
sensitive to a loaded machine) of --repeat runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

WORK = Path(__file__).resolve().parent / "_work"

CHILD = r"""
import sys, time
from gpuaudit.classify import phases
if sys.argv[2] == "without":
    phases._timeline_signals = lambda r: {}
from gpuaudit.classify import classify
from gpuaudit.measure.files import open_samples
t, c = time.perf_counter(), time.process_time()
u = classify(open_samples(sys.argv[1]), workers=1)
assert u.timeline is not None
print(time.perf_counter() - t, time.process_time() - c, len(u.timeline.signals))
"""


def generate(path: Path, gpus: int, hours: float) -> None:
    import numpy as np
    import pyarrow as pa

    from gpuaudit.measure.parquet_io import write_recording
    from gpuaudit.schema import Recording, build_table

    ticks = int(hours * 3600)
    rng = np.random.default_rng(0)
    tick = np.repeat(np.arange(ticks), gpus)
    g = np.tile(np.arange(gpus), ticks)
    busy = ((tick + g) % 10) < 3
    n = tick.shape[0]

    def f(lo: float, hi: float, scale: float) -> np.ndarray:
        return np.where(busy, hi, lo) + rng.normal(0, scale, n)

    table = build_table({
        "ts": pa.array(1_760_000_000 * 10**9 + tick * 10**9).cast(pa.timestamp("ns", "UTC")),
        "host": [f"node-{i // 8}" for i in g.tolist()],
        "gpu_uuid": [f"GPU-{i:04d}" for i in g.tolist()],
        "gpu_model": ["NVIDIA H100 80GB HBM3"] * n,
        "util_gpu_pct": np.where(busy, 90.0, 0.0),
        "sm_active": f(0.0, 0.6, 0.01).clip(0, 1), "sm_occupancy": f(0.0, 0.3, 0.01).clip(0, 1),
        "tensor_active": f(0.0, 0.4, 0.01).clip(0, 1), "dram_active": f(0.01, 0.3, 0.01).clip(0, 1),
        "pcie_tx_bytes_per_s": f(1e9, 2e8, 1e7).clip(0), "pcie_rx_bytes_per_s": f(1e9, 2e8, 1e7).clip(0),
        "nvlink_tx_bytes_per_s": f(0.0, 5e9, 1e7).clip(0),
        "nvlink_rx_bytes_per_s": f(0.0, 5e9, 1e7).clip(0),
        "mem_used_mib": np.full(n, 30_000.0), "power_w": f(120.0, 600.0, 5.0),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    write_recording(Recording(table=table, source="synthetic", origin="bench"), path,
                    interval_s=1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--hours", type=float, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    path = WORK / f"diag_signals_{a.gpus}x{a.hours:g}h.parquet"
    if not path.exists():
        generate(path, a.gpus, a.hours)
    rows = a.gpus * int(a.hours * 3600)
    for mode in ("without", "with"):
        times, cpus = [], []
        for _ in range(a.repeat):
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], check=True,
                                 capture_output=True, text=True).stdout.split()
            times.append(float(out[0]))
            cpus.append(float(out[1]))
        print(f"{rows:,} samples, signals {mode:7s}: median wall {statistics.median(times):.2f} s, "
              f"CPU {statistics.median(cpus):.2f} s (CPU runs "
              f"{', '.join(f'{t:.2f}' for t in cpus)}; {out[2]} signals bucketed)")


if __name__ == "__main__":
    main()
