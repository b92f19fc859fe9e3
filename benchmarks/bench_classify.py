"""Classify + price + recommend N samples from Parquet: gpuaudit vs a straightforward pandas
implementation of the same time-weighted phase computation, each in a fresh process.

    python benchmarks/bench_classify.py --gpus 1000 --hours 28          # 100.8M samples
    python benchmarks/bench_classify.py --gpus 100 --hours 28 --pandas  # with the pandas column
    python benchmarks/bench_classify.py --duckdb  # with the same shares as one DuckDB query

The input is SYNTHETIC: per GPU a utilization shape (idle, bursty input-starved, steady
half-busy, saturated, phased) with noise, at 1 Hz, written as a gpuaudit Parquet recording
(zstd, 1M-row row groups, GPUs interleaved per tick as a sampler writes them). It is generated
once under benchmarks/_work/ (git-ignored). Timings are wall seconds and peak RSS (ru_maxrss)
of the whole child process, median of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORK = Path(__file__).resolve().parent / "_work"


def generate(path: Path, gpus: int, hours: float, hz: float, power: bool = False) -> None:
    """The synthetic fleet's recording at ``path``; ``power``: with each GPU's power too
    (``90 + 6.1 x utilization`` W, as dcgm-exporter records power on every GPU)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpuaudit.schema import SAMPLE_SCHEMA, build_table

    ticks = int(hours * 3600 * hz)
    rng = np.random.default_rng(0)
    kinds = rng.integers(0, 5, gpus)
    uuids = np.array([f"GPU-{i:08d}-bench" for i in range(gpus)])
    hosts = np.array([f"node-{i // 8:04d}" for i in range(gpus)])
    t0 = 1_760_000_000 * 10**9
    step = int(10**9 / hz)
    ticks_per_group = max(1, (1 << 20) // gpus)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, SAMPLE_SCHEMA, compression="zstd") as w:
        for start in range(0, ticks, ticks_per_group):
            n = min(ticks_per_group, ticks - start)
            k = np.arange(start, start + n)
            tick = np.repeat(k, gpus)
            g = np.tile(np.arange(gpus), n)
            kind = kinds[g]
            noise = rng.normal(0, 4, tick.shape[0])
            u = np.select(
                [kind == 0, kind == 1, kind == 2, kind == 3],
                [np.zeros_like(noise) + np.abs(noise) / 4,
                 np.where((tick // 2 + g) % 2 == 0, 0.0, 100.0),
                 45.0 + noise,
                 97.0 + noise / 2],
                default=np.where((tick // 1800 + g) % 3 == 0, 0.0, 92.0 + noise),
            ).clip(0, 100).round()
            table = build_table({
                "ts": pa.array(t0 + tick * step).cast(pa.timestamp("ns", "UTC")),
                "host": pa.DictionaryArray.from_arrays(pa.array(g // 8, pa.int32()),
                                                       pa.array(hosts[:: 8])),
                "gpu_uuid": pa.DictionaryArray.from_arrays(pa.array(g, pa.int32()),
                                                           pa.array(uuids)),
                "gpu_model": pa.DictionaryArray.from_arrays(
                    pa.array(np.zeros(g.shape[0], np.int32)), pa.array(["NVIDIA H100 80GB HBM3"])),
                "util_gpu_pct": pa.array(u.astype(np.float32)),
                **({"power_w": pa.array((90.0 + 6.1 * u).astype(np.float32))}
                   if power else {}),
            })
            w.write_table(table)
    meta = {b"gpuaudit.version": b"0.1.0",
            b"gpuaudit.interval_s": str(1 / hz).encode(), b"gpuaudit.source": b"synthetic",
            b"gpuaudit.origin": b"SYNTHETIC benchmark fleet (benchmarks/bench_classify.py)"}
    # a second pass stamps the gpuaudit key-value metadata on the file
    table_iter = pq.ParquetFile(tmp)
    schema = SAMPLE_SCHEMA.with_metadata(meta)
    with pq.ParquetWriter(path, schema, compression="zstd") as w:
        for i in range(table_iter.num_row_groups):
            w.write_table(table_iter.read_row_group(i).replace_schema_metadata(meta))
    tmp.unlink()


GPUAUDIT_CHILD = r"""
import sys, time, resource, json
t = time.perf_counter()
from gpuaudit.measure.files import open_samples
from gpuaudit.classify import classify, diagnose
from gpuaudit.price import price_usage, resolve_rates
from gpuaudit.recommend import recommend
src = open_samples(sys.argv[1])
usage = classify(src, workers=int(sys.argv[2]) if len(sys.argv) > 2 else None)
rates = resolve_rates({s.gpu_model for s in usage.series}, provider="aws")
cost = price_usage(usage, rates)
plan = recommend(usage, cost, diagnose(usage.series, usage.patterns))
wall = time.perf_counter() - t
pt = usage.overall()
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "rss_mib": me.ru_maxrss / 1024,
                  "child_rss_mib": kids.ru_maxrss / 1024,
                  "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
                  "samples": pt.samples, "shares": pt.phase_shares_pct(),
                  "cost": str(cost.total.observed_cost.quantize(1)), "recs": len(plan.recommendations)}))
"""

PANDAS_CHILD = r"""
import sys, time, resource, json
t = time.perf_counter()
import numpy as np, pandas as pd
df = pd.read_parquet(sys.argv[1], columns=["ts", "gpu_uuid", "util_gpu_pct"])
df["gpu_uuid"] = df["gpu_uuid"].astype(str)
df = df.sort_values(["gpu_uuid", "ts"], kind="stable")
interval = 1.0
nxt = df.groupby("gpu_uuid")["ts"].shift(-1)
dt = (nxt - df["ts"]).dt.total_seconds().fillna(interval)
obs = dt.clip(upper=3 * interval)
df["obs"] = obs
df["gap"] = dt - obs
df["phase"] = pd.cut(df["util_gpu_pct"], [-1, 10, 70, 90, 101], right=False,
                     labels=["idle", "underutilized", "productive", "compute_bound"])
per = df.pivot_table(index="gpu_uuid", columns="phase", values="obs", aggfunc="sum", observed=False)
tot = per.sum()
cost = float((obs.sum() + df["gap"].sum()) / 3600 * 6.88)
wall = time.perf_counter() - t
shares = (100 * tot / tot.sum()).round().astype(int).to_dict()
print(json.dumps({"wall_s": wall, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "samples": int(len(df)), "shares": {str(k): v for k, v in shares.items()},
                  "cost": str(round(cost))}))
"""

DUCKDB_CHILD = r"""
import sys, time, resource, json
t = time.perf_counter()
import duckdb
# the same time-weighted phase shares as PANDAS_CHILD in one SQL query: each sample holds
# until its GPU's next one, capped at 3 intervals (the rest is a gap), banded by utilization
QUERY = '''
    WITH s AS (
        SELECT util_gpu_pct AS u,
               coalesce((epoch_ns(lead(ts) OVER (PARTITION BY gpu_uuid ORDER BY ts))
                         - epoch_ns(ts)) / 1e9, 1.0) AS dt
        FROM read_parquet(?)
    ), o AS (SELECT u, dt, least(dt, 3.0) AS obs FROM s)
    SELECT count(*),
           sum(obs) FILTER (WHERE u < 10), sum(obs) FILTER (WHERE u >= 10 AND u < 70),
           sum(obs) FILTER (WHERE u >= 70 AND u < 90), sum(obs) FILTER (WHERE u >= 90),
           sum(dt)
    FROM o'''
row = duckdb.connect().execute(QUERY, [sys.argv[1]]).fetchone()
n, parts, span = row[0], [x or 0.0 for x in row[1:5]], row[5]
names = ["idle", "underutilized", "productive", "compute_bound"]
shares = {k: round(100 * v / sum(parts)) for k, v in zip(names, parts)}
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "samples": int(n), "shares": shares, "cost": str(round(span / 3600 * 6.88))}))
"""


def run_child(code: str, path: Path, *extra: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code, str(path), *extra], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_of(code: str, path: Path, repeat: int, *extra: str) -> dict[str, object]:
    runs = [run_child(code, path, *extra) for _ in range(repeat)]
    walls = [float(r["wall_s"]) for r in runs]
    best = runs[walls.index(statistics.median(walls))] if repeat % 2 else runs[0]
    return {**best, "wall_s": statistics.median(walls),
            "rss_mib": max(float(r["rss_mib"]) for r in runs),
            "child_rss_mib": max(float(r.get("child_rss_mib", 0.0)) for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--hours", type=float, default=28.0)
    ap.add_argument("--hz", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pandas", action="store_true", help="also run the pandas implementation")
    ap.add_argument("--duckdb", action="store_true",
                    help="also run the same shares as one DuckDB SQL query")
    ap.add_argument("--workers", type=int, default=None,
                    help="classify(workers=N); default: one per core for large files")
    ap.add_argument("--cli", action="store_true",
                    help="also time the whole `gpuaudit report ... --format json` command once")
    ap.add_argument("--power", action="store_true",
                    help="a recording with power_w beside utilization (its own file)")
    ap.add_argument("--generate-only", action="store_true",
                    help="write the recording (if absent), print its path, time nothing")
    args = ap.parse_args()
    path = WORK / (f"fleet_{args.gpus}gpu_{args.hours:g}h_{args.hz:g}hz"
                   f"{'_power' if args.power else ''}.parquet")
    if not path.exists():
        t = time.perf_counter()
        generate(path, args.gpus, args.hours, args.hz, power=args.power)
        print(f"generated {path} in {time.perf_counter() - t:.0f} s "
              f"({path.stat().st_size / 2**20:.0f} MiB)", file=sys.stderr)
    if args.generate_only:
        print(path)
        return
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    print(f"machine: {os.cpu_count()} cores, {cpu}; python {platform.python_version()}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    g = median_of(GPUAUDIT_CHILD, path, args.repeat,
                  *([str(args.workers)] if args.workers is not None else []))
    kids = float(g["child_rss_mib"])
    print(f"gpuaudit: {g['samples']:,} samples  {g['wall_s']:.2f} s  peak RSS {g['rss_mib']:.0f} MiB"
          + (f" + worker {kids:.0f} MiB = {float(g['rss_mib']) + kids:.0f} MiB" if kids else "")
          + f"  cpu {float(g['cpu_s']):.1f} s"
          f"  ({int(g['samples']) / float(g['wall_s']) / 1e6:.1f} M samples/s)  shares {g['shares']}")
    if args.cli:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpuaudit", "report", str(path), "--provider",
                        "aws", "--format", "json", "-o", os.devnull], check=True)
        print(f"gpuaudit report (CLI, whole command incl. timeline and JSON): "
              f"{time.perf_counter() - t:.2f} s")
    if args.pandas:
        p = median_of(PANDAS_CHILD, path, args.repeat)
        print(f"pandas:   {p['samples']:,} samples  {p['wall_s']:.2f} s  peak RSS "
              f"{p['rss_mib']:.0f} MiB  shares {p['shares']}")
    if args.duckdb:
        d = median_of(DUCKDB_CHILD, path, args.repeat)
        print(f"DuckDB:   {d['samples']:,} samples  {d['wall_s']:.2f} s  peak RSS "
              f"{d['rss_mib']:.0f} MiB  shares {d['shares']}")


if __name__ == "__main__":
    main()
