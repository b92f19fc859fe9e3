"""Import speed of nvidia-smi CSV logs: gpuaudit's streaming importer vs plain pandas.

Input (synthetic-from-real): the real nanoGPT 8xH100 log
(``tests/data/nvidia_smi/nanogpt_8xh100_nvidia_smi.csv``, 6,240 rows) repeated in time,
each copy shifted by the log's span, so values and layout are real and only the length grows.

Each measurement runs in a fresh Python process (``resource.getrusage`` peak RSS covers one
import only); the median of ``--repeat`` runs is reported. Usage::

    .venv/bin/pip install pandas            # benchmark only, not a gpuaudit dependency
    .venv/bin/python benchmarks/bench_import.py --reps 800

The pandas baseline is the straightforward implementation: ``read_csv`` (whole file,
``skipinitialspace``, the nvidia-smi null markers), unit stripping with ``str.replace`` on
text columns, ``to_numeric``, ``to_datetime(utc=True)``, gpu_uuid from host and index, and
the same per-GPU time-order check; it reaches a DataFrame, not the full sample table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "data" / "nvidia_smi" / "nanogpt_8xh100_nvidia_smi.csv"


def make_input(path: Path, reps: int) -> int:
    """Write ``reps`` time-shifted copies of the real log; return the data row count."""
    lines = REAL.read_text().splitlines()
    header, body = lines[0], lines[1:]
    parsed = [ln.split(",", 1) for ln in body]
    stamps = [dt.datetime.fromisoformat(ts.replace("Z", "+00:00")) for ts, _ in parsed]
    t0 = stamps[0]
    span = stamps[-1] - t0 + dt.timedelta(seconds=0.331)
    offsets = [s - t0 for s in stamps]
    with path.open("w") as f:
        f.write(header + "\n")
        for k in range(reps):
            base = t0 + span * k
            cache: dict[dt.timedelta, str] = {}
            out = []
            for off, (_ts, rest) in zip(offsets, parsed):
                text = cache.get(off)
                if text is None:
                    text = (base + off).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
                    cache[off] = text
                out.append(f"{text},{rest}\n")
            f.write("".join(out))
    return reps * len(body)


def run_gpuaudit(path: str) -> int:
    from gpuaudit.measure.files import open_samples

    rows = 0
    for batch in open_samples(path).batches():
        rows += batch.num_rows
    return rows


def run_pandas(path: str) -> int:
    import numpy as np
    import pandas as pd

    df = pd.read_csv(path, skipinitialspace=True,
                     na_values=["[N/A]", "[Not Supported]", "N/A"], keep_default_na=True)
    units = {"utilization_gpu_percent": "%", "power_W": "W", "temperature_C": "C"}
    for col, unit in units.items():
        if df[col].dtype == object:
            df[col] = df[col].str.replace(rf"\s*{unit}$", "", regex=True)
        df[col] = pd.to_numeric(df[col]).astype("float32")
    df["ts"] = pd.to_datetime(df["timestamp"], utc=True, format="ISO8601")
    host = Path(path).stem
    df["gpu_uuid"] = host + "/gpu" + df["gpu_index"].astype(str)
    if ((df["utilization_gpu_percent"] < 0) | (df["utilization_gpu_percent"] > 100)).any():
        raise ValueError("utilization out of range")
    ts = df["ts"].astype("int64").to_numpy()
    codes = df["gpu_uuid"].astype("category").cat.codes.to_numpy()
    order = np.argsort(codes, kind="stable")
    c, t = codes[order], ts[order]
    if ((c[1:] == c[:-1]) & (t[1:] <= t[:-1])).any():
        raise ValueError("time runs backwards")
    return len(df)


def child(impl: str, path: str) -> None:
    t0 = time.perf_counter()
    rows = run_gpuaudit(path) if impl == "gpuaudit" else run_pandas(path)
    seconds = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rows": rows, "seconds": seconds, "peak_rss_mib": peak_mib}))


def measure(impl: str, path: Path, repeat: int) -> dict[str, float]:
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, __file__, "--child", impl, str(path)],
                             check=True, capture_output=True, text=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    secs = statistics.median(r["seconds"] for r in runs)
    return {"rows": runs[0]["rows"], "seconds": secs, "rows_per_s": runs[0]["rows"] / secs,
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=800, help="copies of the 6,240-row log")
    ap.add_argument("--repeat", type=int, default=3, help="fresh-process runs per tool")
    ap.add_argument("--child", nargs=2, metavar=("IMPL", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "nanogpt_repeated.csv"
        rows = make_input(path, args.reps)
        size_mib = path.stat().st_size / 2**20
        print(f"input: {rows:,} rows, {size_mib:.0f} MiB (synthetic-from-real: nanoGPT 8xH100 "
              f"log x{args.reps})")
        print(f"machine: nproc={os.cpu_count()}, {cpu_model()}, Python "
              f"{platform.python_version()}")
        results = {"gpuaudit open_samples": measure("gpuaudit", path, args.repeat)}
        try:
            import pandas

            results[f"pandas {pandas.__version__} read_csv + cleanup"] = measure(
                "pandas", path, args.repeat)
        except ImportError:
            print("pandas not installed: baseline skipped (pip install pandas)")
    print(f"{'implementation':34} {'seconds':>8} {'rows/s':>12} {'peak RSS MiB':>13}")
    for name, r in results.items():
        print(f"{name:34} {r['seconds']:8.2f} {r['rows_per_s']:12,.0f} {r['peak_rss_mib']:13.0f}")


if __name__ == "__main__":
    main()
