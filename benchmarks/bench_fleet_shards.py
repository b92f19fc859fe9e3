"""A fleet past one Prometheus, at scale: GPUs x days of dcgm-exporter history split by node
across 4 local stores (2 Prometheus, backfilled with promtool; 2 VictoriaMetrics, imported
with timestamps), audited by one ``audit_fleet(prometheus=[4 stores])`` in a fresh process
set up as ``gpuaudit fleet``'s own (``BENCH_AS_LIBRARY=1``: as a library's caller's instead).

    .venv/bin/python benchmarks/bench_fleet_shards.py --gpus 10000 --days 7   # the goal
    .venv/bin/python benchmarks/bench_fleet_shards.py --gpus 250 --days 7 \
        --keep benchmarks/_work/shards_250x7d   # build once, audit again later from it

Reports: build time per store kind, the audit's wall time, peak RSS (the child's own VmHWM:
``ru_maxrss`` after fork + exec keeps the parent's peak, and the parent holds the generated
fleet) and CPU seconds of the audit process, CPU seconds of the 4 servers during the audit, requests and bytes on the wire
(gzip, as downloaded) and decoded, per store and in all; GPU-hours, idle hours and cost; the
1-minute load average before and after (the machine may be shared). Goal: 10,000 GPUs x 7 d
at 15 s in <= 60 s and <= 4 GiB on 2 cores. Needs `prometheus`, `promtool` and
`victoria-metrics`.
"""

from __future__ import annotations

import argparse
import contextlib
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

from fleetgen import (  # noqa: E402
    backfill,
    import_victoria_metrics,
    make_fleet,
    run_prometheus,
    run_victoria_metrics,
)

CHILD = r"""
import json, os, resource, sys, time
if not os.environ.get("BENCH_AS_LIBRARY"):
    # the process as `gpuaudit fleet` sets it up (gpuaudit.cli.main): gpuaudit owns it
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from gpuaudit._heap import keep_freed_memory, own_process
    keep_freed_memory()
    own_process()
from gpuaudit.api import audit_fleet
stores, start, end, step = json.loads(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
prof = None
if os.environ.get("BENCH_PROFILE"):
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
t = time.perf_counter()
kw = {"fetch": sys.argv[5]} if len(sys.argv) > 5 else {}
r = audit_fleet(prometheus=stores, start_s=start, end_s=end, step_s=step, by=("team",),
                pricing={"price": "1.00"}, **kw)
wall = time.perf_counter() - t
if prof is not None:
    import pstats
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
f = r.extra["fleet"]
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": wall, "rss_mib": int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "transfer": f["transfer"], "gpu_hours": f["total"]["gpu_hours"],
                  "idle_h": f["total"]["phase_hours"]["idle"], "cost_usd": f["total"]["cost_usd"]}))
"""

KINDS = ("prometheus", "prometheus", "victoria-metrics", "victoria-metrics")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_pid(port: str) -> int:
    """The pid of the server listening on 127.0.0.1:``port`` (its command line names it)."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if f"127.0.0.1:{port}".encode() in cmd:
                    return int(pid)
    raise RuntimeError(f"no server on port {port}")


def audit(urls: list[str], pids: list[int], fleet: object, args: argparse.Namespace,
          src: Path | None, name: str, fetch: str | None = None) -> dict[str, object]:
    """One audit in a fresh process (``src``: another tree's src/ first on the path)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src.resolve())
    if args.profile:
        env["BENCH_PROFILE"] = "1"
    cpu0 = [cpu_s(p) for p in pids]
    load = os.getloadavg()[0]
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(urls),
                          str(fleet.start_s), str(fleet.end_s), str(args.step),  # type: ignore[attr-defined]
                          *([fetch] if fetch else [])],
                         capture_output=True, text=True, timeout=7200, env=env)
    if out.returncode:
        sys.exit(out.stderr[-3000:])
    if args.profile:
        print(out.stderr[-6000:])
    res: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    server = [cpu_s(p) - c for p, c in zip(pids, cpu0)]
    tr: dict[str, object] = res["transfer"]  # type: ignore[assignment]
    print(f"[{name}] {args.gpus} GPUs x {args.days:g} d at {args.step} s over {len(urls)} stores: wall "
          f"{res['wall_s']:.1f} s, peak RSS {res['rss_mib']:.0f} MiB, CPU client "
          f"{res['cpu_s']:.1f} s, servers {sum(server):.1f} s "
          f"({', '.join(f'{x:.1f}' for x in server)}), requests {tr['requests']}, wire "
          f"{tr['wire_bytes']:,} B, decoded {tr['body_bytes']:,} B; GPU-h "
          f"{res['gpu_hours']:.1f}, idle-h {res['idle_h']:.1f}, cost {res['cost_usd']} USD "
          f"(load before {load:.2f}, after {os.getloadavg()[0]:.2f})", flush=True)
    for st in tr["stores"]:  # type: ignore[attr-defined]
        print(f"  {st['name']}: {st['requests']} requests, wire {st['wire_bytes']:,} B, "
              f"decoded {st['body_bytes']:,} B", flush=True)
    return res


def only_stores(args: argparse.Namespace) -> None:
    """Audit the stores ``args.only_stores`` of ``args.keep`` (this tree and ``--base``
    alternating), the fleet's range from --days (the generator's start)."""
    from types import SimpleNamespace

    assert args.keep is not None, "--only-stores needs --keep"
    fleet = SimpleNamespace(start_s=1_704_067_200,
                            end_s=1_704_067_200 + int(args.days * 86400) - args.step)
    idx = [int(x) for x in args.only_stores.split(",")]
    with contextlib.ExitStack() as stack:
        urls = []
        for i in idx:
            run = run_prometheus if KINDS[i] == "prometheus" else run_victoria_metrics
            urls.append(f"s{i}=" + stack.enter_context(run(args.keep / f"store{i}")))
        pids = [server_pid(u.rsplit(":", 1)[1]) for u in urls]
        while True:  # let the servers finish compacting promtool's blocks
            c0 = sum(cpu_s(p) for p in pids)
            time.sleep(20)
            if sum(cpu_s(p) for p in pids) - c0 < 0.5:
                break
        print(f"stores {args.only_stores} (uptime: {os.getloadavg()})", flush=True)
        trees = [("this tree", None)] + ([("base", args.base)] if args.base else [])
        for _run in range(args.runs):
            for name, src in trees:
                audit(urls, pids, fleet, args, src, name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--step", type=int, default=15)
    ap.add_argument("--keep", type=Path, default=None, help="directory to keep / reuse")
    ap.add_argument("--jobs", type=int, default=2, help="promtool runs at a time")
    ap.add_argument("--base", type=Path, default=None,
                    help="src/ of another gpuaudit tree (e.g. `git archive main src`): its "
                    "audit runs interleaved with this tree's on the same stores")
    ap.add_argument("--runs", type=int, default=1, help="audits per tree")
    ap.add_argument("--profile", action="store_true", help="cProfile the client (stderr)")
    ap.add_argument("--fetch", default=None,
                    help="this tree's fetch modes, comma-separated (e.g. native,pushdown: "
                    "each run audits once per mode); default: the tree's default")
    ap.add_argument("--base-fetch", default=None,
                    help="--base's fetch modes, comma-separated (default: its default)")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--only-stores", default=None, metavar="I,J",
                    help="audit only these stores of --keep, as built so far (no build, no "
                    "stamp needed: e.g. 0,1 = the Prometheus stores of a build stopped early); "
                    "waits until the servers' CPU settles (compaction) first")
    args = ap.parse_args()
    if args.only_stores:
        only_stores(args)
        return
    fleet = make_fleet(nodes=max(4, args.gpus // 4), gpus_per_node=4, hours=args.days * 24,
                       step_s=args.step, seed=3, segment_hours=12.0)
    hosts = fleet.hosts()
    parts = [fleet.subset(set(hosts[i::4])) for i in range(4)]
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="gpuaudit-shards-"))
    stamp = tmp / "built.json"
    want = {"gpus": args.gpus, "days": args.days, "step": args.step}
    built = stamp.exists() and json.loads(stamp.read_text()).get("spec") == want
    info: dict[str, object] = json.loads(stamp.read_text()) if built else {"spec": want}
    with contextlib.ExitStack() as stack:
        urls = []
        for i, (kind, part) in enumerate(zip(KINDS, parts)):
            data = tmp / f"store{i}"
            if kind == "prometheus":
                if not built:
                    shutil.rmtree(data, ignore_errors=True)
                    t0 = time.perf_counter()
                    n = backfill(part, data, jobs=args.jobs)
                    info[f"store{i}"] = {"kind": kind, "samples": n,
                                         "build_s": time.perf_counter() - t0}
                url = stack.enter_context(run_prometheus(data))
            else:
                if not built:
                    shutil.rmtree(data, ignore_errors=True)
                url = stack.enter_context(run_victoria_metrics(data))
                if not built:
                    t0 = time.perf_counter()
                    n = import_victoria_metrics(part, url, tmp / f"import{i}")
                    info[f"store{i}"] = {"kind": kind, "samples": n,
                                         "build_s": time.perf_counter() - t0}
            urls.append(f"s{i}={url}")
            print(f"store s{i} ({kind}): {info[f'store{i}']}", flush=True)
        if not built:
            stamp.write_text(json.dumps(info))
        du = subprocess.run(["du", "-sh", *(str(tmp / f"store{i}") for i in range(4))],
                            capture_output=True, text=True)
        print("on disk:", " ".join(line.split()[0] for line in du.stdout.splitlines()))
        if args.build_only:
            return
        pids = [server_pid(u.rsplit(":", 1)[1]) for u in urls]
        modes = args.fetch.split(",") if args.fetch else [None]
        trees: list[tuple[str, Path | None, str | None]] = [
            (f"this tree{f' --fetch {m}' if m else ''}", None, m) for m in modes]
        base_modes = args.base_fetch.split(",") if args.base_fetch else [None]
        trees += [(f"base{f' --fetch {m}' if m else ''}", args.base, m)
                  for m in base_modes] if args.base else []
        results: dict[str, list[dict[str, object]]] = {}
        for _run in range(args.runs):
            for name, src, mode in trees:
                results.setdefault(name, []).append(
                    audit(urls, pids, fleet, args, src, name, mode))
        for name, rs in results.items():
            walls = sorted(float(r["wall_s"]) for r in rs)  # type: ignore[arg-type]
            print(f"{name}: wall min {walls[0]:.1f} s, median {walls[len(walls) // 2]:.1f} s "
                  f"over {len(walls)} run(s)")
    if args.keep is None:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
