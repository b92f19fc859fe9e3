"""Fleet audit at scale: a real Prometheus holding GPUs x days of dcgm-exporter history
(backfilled with promtool), audited by PromQL pushdown and by raw query_range pull.

    .venv/bin/python benchmarks/bench_fleet.py --gpus 100 --days 7 --step 15
    .venv/bin/python benchmarks/bench_fleet.py --gpus 100 --days 7 --audit-steps 15,60 \
        --keep benchmarks/_work/fleet_100x7d   # build once, audit again later from it

Reports, per mode: wall time of the audit (fresh process), peak RSS of that process, HTTP
requests and bytes moved (on the wire and decoded). Build time (generation + one promtool
run per 2-hour block, two at a time) is reported apart. ``--keep DIR`` keeps the TSDB in DIR
and reuses it when it is already there (same --gpus/--days/--step). The load average is
printed with the figures (the machine may be shared). Needs `prometheus` and `promtool`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
from gpuaudit.api import audit_fleet
url, start, end, step, raw = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
t = time.perf_counter()
r = audit_fleet(prometheus=url, start_s=start, end_s=end, step_s=step, by=("team",), raw=raw,
                pricing={"price": "1.00"})
wall = time.perf_counter() - t
f = r.extra["fleet"]
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": wall, "rss_mib": int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "transfer": f["transfer"], "gpu_hours": f["total"]["gpu_hours"],
                  "idle_h": f["total"]["phase_hours"]["idle"]}))
"""


def server_cpu_s(data: Path) -> float:
    """CPU seconds used so far by the Prometheus process serving ``data`` (user + system)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if cmd[0].endswith(b"prometheus") and any(str(data).encode() in c for c in cmd):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError):
            continue
    return float("nan")


def settle(data: Path) -> int:
    """Start Prometheus on the fresh blocks and wait until its compactor has merged them (it
    starts ~1 min after start-up), as a long-running server would hold them; returns the
    number of blocks then. Audits on 84 uncompacted 2-hour blocks would be slower and are not
    what a real store serves."""
    import httpx

    def blocks(url: str) -> int:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith("prometheus_tsdb_blocks_loaded "):
                return int(float(line.split()[1]))
        return -1

    with run_prometheus(data) as url:
        t0 = time.monotonic()
        seen = [blocks(url)]
        while time.monotonic() - t0 < 600:
            time.sleep(5)
            seen.append(blocks(url))
            if time.monotonic() - t0 > 90 and len(set(seen[-7:])) == 1:
                break
    return seen[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=100)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--step", type=int, default=15, help="scrape interval of the history")
    ap.add_argument("--audit-steps", default=None,
                    help="comma-separated --step values of the pushdown audits (default: the "
                    "scrape interval); raw runs at the scrape interval")
    ap.add_argument("--modes", default="pushdown,raw")
    ap.add_argument("--keep", type=Path, default=None, help="TSDB directory to keep / reuse")
    ap.add_argument("--jobs", type=int, default=2, help="promtool runs at a time")
    args = ap.parse_args()
    fleet = make_fleet(nodes=max(1, args.gpus // 4), gpus_per_node=4, hours=args.days * 24,
                       step_s=args.step, seed=3, segment_hours=12.0)
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="gpuaudit-bench-"))
    stamp = tmp / "built.json"
    want = {"gpus": args.gpus, "days": args.days, "step": args.step}
    if stamp.exists() and json.loads(stamp.read_text()).get("spec") == want:
        info = json.loads(stamp.read_text())
        print(f"reusing {tmp}: {info['samples']:,} samples, {info['series']} series, built in "
              f"{info['build_s']:.0f} s", flush=True)
    else:
        shutil.rmtree(tmp / "data", ignore_errors=True)
        t0 = time.perf_counter()
        samples = backfill(fleet, tmp / "data", jobs=args.jobs, progress=True)
        info = {"spec": want, "samples": samples, "series": len(fleet.series),
                "build_s": time.perf_counter() - t0}
        info["blocks_after_compaction"] = settle(tmp / "data")
        stamp.write_text(json.dumps(info))
        print(f"built {args.gpus} GPUs x {args.days:g} d at {args.step} s: {samples:,} samples, "
              f"{len(fleet.series)} series, {info['build_s']:.0f} s (generate + promtool)",
              flush=True)
    du = subprocess.run(["du", "-sh", str(tmp / "data")], capture_output=True, text=True)
    print(f"TSDB on disk: {du.stdout.split()[0] if du.stdout else '?'}", flush=True)
    audit_steps = [float(x) for x in (args.audit_steps or str(args.step)).split(",")]
    runs = [(m, st) for m in args.modes.split(",")
            for st in (audit_steps if m == "pushdown" else [float(args.step)])]
    results: dict[tuple[str, float], dict[str, object]] = {}
    with run_prometheus(tmp / "data") as url:
        for mode, st in runs:
            load = os.getloadavg()[0]
            cpu0 = server_cpu_s(tmp / "data")
            out = subprocess.run(
                [sys.executable, "-c", CHILD, url, str(fleet.start_s), str(fleet.end_s),
                 str(st), "1" if mode == "raw" else "0"],
                capture_output=True, text=True, check=True, timeout=3600)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            res["server_cpu_s"] = server_cpu_s(tmp / "data") - cpu0
            results[(mode, st)] = res
            tr = res["transfer"]
            print(f"{mode:9s} step {st:3.0f} s  wall {res['wall_s']:7.1f} s  peak RSS "
                  f"{res['rss_mib']:7.0f} MiB  CPU client {res['cpu_s']:6.1f} s, Prometheus "
                  f"{res['server_cpu_s']:6.1f} s  requests {tr['requests']:6d}  wire "
                  f"{tr['wire_bytes']:>13,} B  decoded {tr['body_bytes']:>13,} B  GPU-h "
                  f"{res['gpu_hours']:.1f} idle-h {res['idle_h']:.1f}  (load before "
                  f"{load:.2f}, after {os.getloadavg()[0]:.2f})", flush=True)
    push = results.get(("pushdown", float(args.step)))
    raw = results.get(("raw", float(args.step)))
    if push and raw:
        p, r = push["transfer"], raw["transfer"]
        assert isinstance(p, dict) and isinstance(r, dict)
        print(f"raw/pushdown bytes: wire {r['wire_bytes'] / p['wire_bytes']:.0f}x, decoded "
              f"{r['body_bytes'] / p['body_bytes']:.0f}x")
    if args.keep is None:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
