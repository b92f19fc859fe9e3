"""Where the stores' CPU goes in a fleet audit: every first-pass pushdown query of one day
chunk, asked alone of one Prometheus and one VictoriaMetrics store of
``bench_fleet_shards.py``'s fleet, with the server's CPU seconds (user + system, from
/proc) and the answer's size.

    .venv/bin/python benchmarks/bench_fleet_queries.py --keep benchmarks/_work/shards_250x7d --gpus 250 --days 7

Each query runs ``--repeat`` times (the minimum CPU is kept); the day is the fleet's
second (a full day). Server CPU at /proc's resolution (10 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fleet"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    from bench_fleet_shards import cpu_s, server_pid
    from fleetgen import make_fleet, run_prometheus, run_victoria_metrics

    from gpuaudit.classify.pushdown import chunk_grid
    from gpuaudit.classify.pushdown_queries import MULTI_SAMPLE, SECOND_PASS, build_queries
    from gpuaudit.measure.fleet.prometheus import PromClient

    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, required=True)
    ap.add_argument("--gpus", type=int, default=250)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--step", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    fleet = make_fleet(nodes=max(4, args.gpus // 4), gpus_per_node=4, hours=args.days * 24,
                       step_s=args.step, seed=3, segment_hours=12.0)
    step = float(args.step)
    chunks = chunk_grid((fleet.start_s // step + 1) * step, (fleet.end_s // step) * step, step)
    a, b = chunks[1]
    qs = build_queries("", step, b - a + step, has_sm=False, family="util", signals=True)
    first = {n: e for n, e in qs.items() if n not in MULTI_SAMPLE and n not in SECOND_PASS}
    second = {n: e for n, e in qs.items() if n in SECOND_PASS}
    print(f"load average {os.getloadavg()[0]:.2f}; chunk {a:.0f}..{b:.0f}, "
          f"{args.gpus} GPUs / 4 stores")
    for i, (kind, run) in enumerate((("prometheus", run_prometheus),
                                     ("victoria-metrics", run_victoria_metrics))):
        store = 0 if i == 0 else 2
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(run(args.keep / f"store{store}"))
            pid = server_pid(url.rsplit(":", 1)[1])
            c = PromClient(url, timeout_s=600)
            c.query_rows("count(DCGM_FI_DEV_GPU_UTIL)", b)  # warm the index
            total = 0.0
            rows = []
            for phase, group in (("first pass", first), ("second pass (all series)", second)):
                for name, expr in group.items():
                    best = float("inf")
                    for _ in range(args.repeat):
                        c0, t0, w0 = cpu_s(pid), time.perf_counter(), c.body_bytes
                        raws, _vals = c.query_rows(expr, b)
                        best = min(best, cpu_s(pid) - c0)
                        size = c.body_bytes - w0
                    wall = time.perf_counter() - t0
                    if phase == "first pass":
                        total += best
                    rows.append((phase, name, best, wall, len(raws), size, expr))
            print(f"\n{kind} (store{store}): first pass {total:.2f} CPU-s for one day")
            print("| pass | query | server CPU s | wall s | series | answer bytes | PromQL |")
            print("|---|---|---|---|---|---|---|")
            for phase, name, cpu, wall, n, size, expr in sorted(rows, key=lambda r: -r[2]):
                short = expr if len(expr) < 90 else expr[:87] + "..."
                print(f"| {phase} | {name} | {cpu:.2f} | {wall:.2f} | {n} | {size:,} | "
                      f"`{short}` |")


if __name__ == "__main__":
    main()
