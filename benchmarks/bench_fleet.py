"""Fleet audit at scale: a real Prometheus holding GPUs x days of dcgm-exporter history
(backfilled with promtool), audited by PromQL pushdown and by raw query_range pull.

    .venv/bin/python benchmarks/bench_fleet.py --gpus 100 --days 7 --step 15

Reports, per mode: wall time of the audit (fresh process), peak RSS of that process, HTTP
requests and bytes moved (on the wire and decoded). Build time (generation + promtool) is
reported apart. Needs `prometheus` and `promtool` on PATH.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fleet"))

from fleetgen import backfill, make_fleet, run_prometheus  # noqa: E402

CHILD = r"""
import json, resource, sys, time
from gpuaudit.cli.fleet import audit_fleet
url, start, end, step, raw = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
t = time.perf_counter()
r = audit_fleet(prometheus=url, start_s=start, end_s=end, step_s=step, by=("team",), raw=raw,
                pricing={"price": "1.00"})
wall = time.perf_counter() - t
f = r.extra["fleet"]
print(json.dumps({"wall_s": wall, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "transfer": f["transfer"], "gpu_hours": f["total"]["gpu_hours"],
                  "idle_h": f["total"]["phase_hours"]["idle"]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=100)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--step", type=int, default=15)
    ap.add_argument("--modes", default="pushdown,raw")
    args = ap.parse_args()
    t0 = time.perf_counter()
    fleet = make_fleet(nodes=max(1, args.gpus // 4), gpus_per_node=4, hours=args.days * 24,
                       step_s=args.step, seed=3, segment_hours=12.0)
    tmp = Path(tempfile.mkdtemp(prefix="gpuaudit-bench-"))
    samples = backfill(fleet, tmp / "data")
    build_s = time.perf_counter() - t0
    print(f"built {args.gpus} GPUs x {args.days:g} d at {args.step} s: {samples:,} samples, "
          f"{len(fleet.series)} series, {build_s:.0f} s (generate + promtool)", flush=True)
    results = {}
    with run_prometheus(tmp / "data") as url:
        for mode in args.modes.split(","):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, url, str(fleet.start_s), str(fleet.end_s),
                 str(args.step), "1" if mode == "raw" else "0"],
                capture_output=True, text=True, check=True, timeout=3600)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            results[mode] = res
            tr = res["transfer"]
            print(f"{mode:9s} wall {res['wall_s']:7.1f} s  peak RSS {res['rss_mib']:7.0f} MiB  "
                  f"requests {tr['requests']:6d}  wire {tr['wire_bytes']:>13,} B  decoded "
                  f"{tr['body_bytes']:>13,} B  GPU-h {res['gpu_hours']:.1f} idle-h "
                  f"{res['idle_h']:.1f}", flush=True)
    if "pushdown" in results and "raw" in results:
        p, r = results["pushdown"]["transfer"], results["raw"]["transfer"]
        print(f"raw/pushdown bytes: wire {r['wire_bytes'] / p['wire_bytes']:.0f}x, decoded "
              f"{r['body_bytes'] / p['body_bytes']:.0f}x")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
