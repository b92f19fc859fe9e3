"""The fleet audit's client side at 10,000 GPUs, without 10,000 GPUs of stores: the real
pushdown answers of the 4-store fleet of ``bench_fleet_shards.py`` (fetched once from the
real servers), replicated K times under new GPU, host and pod names, then what the client
does after the fetch (merge of the stores' answers, usage, pricing, showback, advice) timed
in a fresh process, for this tree and optionally another (``--base``, interleaved).

    .venv/bin/python benchmarks/bench_fleet_shards.py --gpus 250 --days 7 --keep benchmarks/_work/shards_250x7d --build-only
    .venv/bin/python benchmarks/bench_fleet_client.py --keep benchmarks/_work/shards_250x7d --gpus 250 --days 7 --scale 40 --base benchmarks/_work/base/src

This measures the client only: the stores' query CPU, which dominates the fleet audit
(docs/benchmarks.md), is not in it. The answers are real (one store's answer per series
and chunk, as the stores computed them); the replication multiplies GPUs, series and pods,
not the time range.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fleet"))

CHILD = r"""
import json, pickle, resource, sys, time
path, start, end, step = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
t0 = time.perf_counter()
import gpuaudit.api.fleet as F
from gpuaudit.classify.pushdown import PushdownData, merge_pushdown, usage_from_pushdown
from gpuaudit.price.attribution import Attributor
columnar = hasattr(PushdownData, "from_rows")
with open(path + (".columns.pkl" if columnar else ".rows.pkl"), "rb") as f:
    saved = pickle.load(f)
parts = []
for p in saved["parts"]:
    if columnar:
        from gpuaudit.classify.pushdown_columns import Answers
        a = Answers(len(p["chunks"]))
        a.key, a.cols = p["key"], p["cols"]
        d = PushdownData(ids=p["ids"], chunks=p["chunks"], step_s=p["step_s"], answers=a,
                         origin=p["origin"])
    else:
        d = PushdownData(ids=p["ids"], chunks=p["chunks"], step_s=p["step_s"],
                         values=p["rows"], origin=p["origin"])
    d.fleet_util_sums = p["fleet_util_sums"]
    d.has_sm, d.shared, d.queries = p["has_sm"], p["shared"], p["queries"]
    parts.append((p["name"], d))
kube = saved["kube"]
del saved
loaded = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
t_load = time.perf_counter() - t0
cpu0 = resource.getrusage(resource.RUSAGE_SELF)
stage = {}

def fleet_usage(prometheus, *, by, mapping=None, **kw):
    t = time.perf_counter()
    data = merge_pushdown(parts)
    stage["merge_s"] = time.perf_counter() - t
    parts.clear()
    att = Attributor(mapping, kube)
    t = time.perf_counter()
    usage, daily = usage_from_pushdown(data, by=tuple(by),
        labels_for=lambda sid: att.resolve(sid.namespace, sid.pod, dict(sid.labels)))
    stage["usage_s"] = time.perf_counter() - t
    stage["rows"] = data.answers.rows if columnar else len(data.values)
    return usage, daily, dict(data.fleet_util_pct), {"mode": "replayed answers"}

F.fleet_usage = fleet_usage
import os
prof = None
if os.environ.get("BENCH_PROFILE"):
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
t = time.perf_counter()
r = F.audit_fleet(prometheus="http://replay", start_s=start, end_s=end, step_s=step,
                  by=("team",), pricing={"price": "1.00"})
wall = time.perf_counter() - t
if prof is not None:
    import pstats
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumtime").print_stats(45)
ru = resource.getrusage(resource.RUSAGE_SELF)
f = r.extra["fleet"]
print(json.dumps({"wall_s": wall, "load_s": t_load, "rss_loaded_mib": loaded,
                  "rss_mib": int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024,
                  "cpu_s": ru.ru_utime + ru.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
                  "gpu_hours": f["total"]["gpu_hours"], "idle_h": f["total"]["phase_hours"]["idle"],
                  "cost_usd": f["total"]["cost_usd"], **stage}))
"""


def capture(keep: Path, gpus: int, days: float, step: int, out: Path) -> None:
    """Fetch every store's pushdown answers as ``audit_fleet`` does; save them."""
    from fleetgen import make_fleet, run_prometheus, run_victoria_metrics

    from gpuaudit.classify.pushdown import chunk_grid, pull_aggregates
    from gpuaudit.measure.fleet.dcgm import series_id
    from gpuaudit.measure.fleet.prometheus import PromClient, pod_labels

    fleet = make_fleet(nodes=max(4, gpus // 4), gpus_per_node=4, hours=days * 24,
                       step_s=step, seed=3, segment_hours=12.0)
    start = (fleet.start_s // step + 1) * step
    end = (fleet.end_s // step) * step
    chunks = chunk_grid(start, end, step, 86400.0)
    kinds = ("prometheus", "prometheus", "victoria-metrics", "victoria-metrics")
    parts, kube = [], {}
    with contextlib.ExitStack() as stack:
        for i, kind in enumerate(kinds):
            run = run_prometheus if kind == "prometheus" else run_victoria_metrics
            url = stack.enter_context(run(keep / f"store{i}"))
            c = PromClient(url)
            d = pull_aggregates(c, identify=series_id, start_s=start, end_s=end, step_s=step,
                                chunks=chunks, fleet=True, fleet_start_s=start)
            kube.update(pod_labels(c, start_s=start, end_s=end))
            parts.append({"name": f"s{i}", "ids": d.ids, "chunks": d.chunks,
                          "step_s": d.step_s, "key": d.answers.key, "cols": d.answers.cols,
                          "nchunks": d.answers.nchunks, "origin": d.origin,
                          "fleet_util_sums": d.fleet_util_sums, "has_sm": d.has_sm,
                          "shared": d.shared, "queries": d.queries})
    with open(out, "wb") as f:
        pickle.dump({"parts": parts, "kube": kube, "start": start, "end": end, "step": step},
                    f)


def scale(src: Path, k: int, out: Path) -> None:
    """``k`` copies of every series under new GPU / host / pod names, in both layouts."""
    import dataclasses

    import numpy as np

    with open(src, "rb") as f:
        saved = pickle.load(f)

    def rename(x: str | None, r: int) -> str | None:
        return x if x is None or r == 0 else f"{x}-r{r}"

    parts_c, parts_r = [], []
    for p in saved["parts"]:
        n = len(p["ids"])
        nch = p["nchunks"]
        ids = [dataclasses.replace(sid, gpu_uuid=rename(sid.gpu_uuid, r),
                                   host=rename(sid.host, r), pod=rename(sid.pod, r))
               for r in range(k) for sid in p["ids"]]
        code, chunk = p["key"] // nch, p["key"] % nch
        key = np.concatenate([(code + r * n) * nch + chunk for r in range(k)])
        cols = {name: np.tile(c, k) for name, c in p["cols"].items()}
        meta = {x: p[x] for x in ("name", "chunks", "step_s", "origin", "fleet_util_sums",
                                  "has_sm", "shared", "queries")}
        meta["fleet_util_sums"] = {lab: (s * k, c * k) for lab, (s, c) in
                                   p["fleet_util_sums"].items()}
        parts_c.append({**meta, "ids": ids, "key": key, "cols": cols})
        rows = {}
        names = list(cols)
        for j in range(key.shape[0]):
            v = {nm: float(cols[nm][j]) for nm in names if cols[nm][j] == cols[nm][j]}
            rows[(int(key[j] // nch), int(key[j] % nch))] = v
        parts_r.append({**meta, "ids": ids, "rows": rows})
    kube = {(ns, rename(pod, r)): labels for r in range(k)
            for (ns, pod), labels in saved["kube"].items()}
    for suffix, parts in ((".columns.pkl", parts_c), (".rows.pkl", parts_r)):
        with open(str(out) + suffix, "wb") as f:
            pickle.dump({"parts": parts, "kube": kube}, f, protocol=5)
    with open(str(out) + ".json", "w") as f:
        json.dump({"start": saved["start"], "end": saved["end"], "step": saved["step"],
                   "rows": int(sum(p["key"].shape[0] for p in parts_c)),
                   "series": int(sum(len(p["ids"]) for p in parts_c))}, f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, required=True, help="bench_fleet_shards --keep DIR")
    ap.add_argument("--gpus", type=int, default=250)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--step", type=int, default=15)
    ap.add_argument("--scale", type=int, default=40)
    ap.add_argument("--base", type=Path, default=None, help="src/ of another tree")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    cap = args.keep / "answers.pkl"
    if not cap.exists():
        t = time.perf_counter()
        capture(args.keep, args.gpus, args.days, args.step, cap)
        print(f"captured the 4 stores' answers in {time.perf_counter() - t:.1f} s")
    scaled = args.keep / f"answers_x{args.scale}"
    if not Path(str(scaled) + ".json").exists():
        scale(cap, args.scale, scaled)
    meta = json.loads(Path(str(scaled) + ".json").read_text())
    print(f"{args.gpus} GPUs x {args.scale} = {args.gpus * args.scale} GPUs x {args.days:g} d: "
          f"{meta['series']} series, {meta['rows']} series-chunk rows over the 4 stores")
    trees = [("this tree", None)] + ([("base", args.base)] if args.base else [])
    walls: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for name, src in trees:
            env = dict(os.environ)
            if src is not None:
                env["PYTHONPATH"] = str(src.resolve())
            load = os.getloadavg()[0]
            out = subprocess.run([sys.executable, "-c", CHILD, str(scaled), str(meta["start"]),
                                  str(meta["end"]), str(meta["step"])], env=env,
                                 capture_output=True, text=True, timeout=3600)
            if out.returncode:
                sys.exit(out.stderr[-3000:])
            if os.environ.get("BENCH_PROFILE"):
                print(out.stderr[-12000:])
            r = json.loads(out.stdout.strip().splitlines()[-1])
            walls.setdefault(name, []).append(r["wall_s"])
            print(f"[{name}] after-fetch wall {r['wall_s']:.1f} s (merge {r['merge_s']:.1f} s, "
                  f"usage {r['usage_s']:.1f} s), CPU {r['cpu_s']:.1f} s, peak RSS "
                  f"{r['rss_mib']:.0f} MiB (answers loaded: {r['rss_loaded_mib']:.0f} MiB, "
                  f"{r['load_s']:.1f} s); GPU-h {r['gpu_hours']:.1f}, idle-h {r['idle_h']:.1f}, "
                  f"cost {r['cost_usd']} USD (load {load:.2f})", flush=True)
    for name, ws in walls.items():
        ws.sort()
        print(f"{name}: min {ws[0]:.1f} s, median {ws[len(ws) // 2]:.1f} s")


if __name__ == "__main__":
    main()
