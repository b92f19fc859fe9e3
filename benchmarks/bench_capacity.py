"""Capacity planning at fleet scale: profiles + MIG / MPS / time-slicing simulation.

    .venv/bin/python benchmarks/bench_capacity.py --gpus 1000 --days 30 [--baseline] [--cli]

Input, **synthetic**: ``--gpus`` H100s for ``--days`` at one sample a minute (43.2M rows for
1,000 x 30 days), each GPU one of five shapes (idle, diurnal inference, steady half-busy,
bursty, saturated) with noise and a memory footprint, four namespaces, written once as a
gpuaudit Parquet recording under ``benchmarks/_work/`` (GPUs interleaved per minute as a
sampler writes them).

Measured in a fresh process: open the file, build the workload profiles at 1-minute steps
(:func:`gpuaudit.capacity.profiles.build_profiles`) and simulate all three policies onto H100
(:func:`gpuaudit.capacity.simulate.simulate`); wall time per stage and peak RSS (``ru_maxrss``).
``--cli`` also times the whole user command ``gpuaudit simulate FILE --policy all --gpu-model
H100 --format json -o /dev/null`` (with the audit's recommendations: a second pass).

``--plan-cost N [--baseline-src DIR]``: only the whole command with and without its plan, N
times each, interleaved (and the gpuaudit of DIR, a baseline checkout, between them).

``--baseline``: the replay done the obvious way, a Python loop over the steps (``bincount`` of
the co-located demand per step, vectorised over GPUs only), on the first day and scaled to the
whole window; it must give the same contention as the vectorised replay on that day.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

WORK = Path(__file__).parent / "_work"
T0 = 1_767_225_600  # 2026-01-01T00:00:00Z


def make_file(gpus: int, days: int, path: Path, seed: int = 5) -> None:
    from gpuaudit.schema import SAMPLE_SCHEMA, build_table

    rng = np.random.default_rng(seed)
    steps = days * 1440
    kind = rng.integers(0, 5, gpus)
    level = rng.uniform(5, 60, gpus)
    mem = rng.uniform(2_000, 70_000, gpus)
    ns = np.array(["team-vision", "team-nlp", "team-recsys", "sandbox"])[rng.integers(0, 4, gpus)]
    uuids = np.array([f"GPU-{i:08x}-0000-4000-8000-{i:012x}" for i in range(gpus)])
    per_group = max(1, 1_000_000 // gpus)
    meta = {b"gpuaudit.version": b"0.1.0", b"gpuaudit.interval_s": b"60",
            b"gpuaudit.source": b"synthetic",
            b"gpuaudit.origin": b"SYNTHETIC capacity benchmark fleet (benchmarks/bench_capacity.py)"}
    writer = pq.ParquetWriter(path, SAMPLE_SCHEMA.with_metadata(meta), compression="zstd")
    try:
        for a in range(0, steps, per_group):
            b = min(steps, a + per_group)
            t = np.arange(a, b)
            hour = (t * 60 // 3600) % 24
            diurnal = 0.5 + 0.5 * np.sin((hour - 6) / 24 * 2 * np.pi)
            u = np.empty((b - a, gpus), np.float32)
            noise = rng.normal(0, 3, (b - a, gpus))
            u[:] = np.where(kind == 0, 1.0, 0.0) + noise.clip(0)
            u += np.where(kind == 1, level, 0) * diurnal[:, None]
            u += np.where(kind == 2, level, 0)
            u += np.where(kind == 3, 100.0, 0) * (rng.random((b - a, gpus)) < 0.3)
            u += np.where(kind == 4, 95.0, 0)
            np.clip(np.round(u), 0, 100, out=u)  # NVML reports whole percents
            m = (mem[None, :] * (0.9 + 0.1 * rng.random((b - a, gpus)))).astype(np.float32)
            n = (b - a) * gpus
            ts = ((T0 + np.repeat(t, gpus) * 60) * 1_000_000_000).astype(np.int64)
            table = build_table({
                "ts": pa.array(ts, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
                "host": pa.DictionaryArray.from_arrays(
                    np.tile(np.arange(gpus, dtype=np.int32) // 8, b - a),
                    pa.array([f"node-{i}" for i in range((gpus + 7) // 8)])),
                "gpu_uuid": pa.DictionaryArray.from_arrays(
                    np.tile(np.arange(gpus, dtype=np.int32), b - a), pa.array(uuids)),
                "gpu_model": pa.DictionaryArray.from_arrays(
                    np.zeros(n, np.int32), pa.array(["NVIDIA H100 80GB HBM3"])),
                "util_gpu_pct": pa.array(u.reshape(-1)),
                "mem_used_mib": pa.array(m.reshape(-1)),
                "mem_total_mib": pa.array(np.full(n, 81_559.0, np.float32)),
                "namespace": pa.array(np.tile(ns, b - a)),
            })
            writer.write_table(table.replace_schema_metadata(meta))
    finally:
        writer.close()


def baseline_replay(d: np.ndarray, gpu_of: np.ndarray, gpus: int) -> float:
    """Contention share with a Python loop over the steps: one bincount per step."""
    over = 0
    for t in range(d.shape[1]):
        load = np.bincount(gpu_of, weights=d[:, t], minlength=gpus)
        over += int((load > 1.0 + 1e-6).sum())
    return over / (gpus * d.shape[1])


def naive_replay(d: np.ndarray, gpu_of: np.ndarray, gpus: int) -> float:
    """The same with Python loops over steps and workloads (what the issue rules out)."""
    members: list[list[int]] = [[] for _ in range(gpus)]
    for w, g in enumerate(gpu_of.tolist()):
        members[g].append(w)
    rows = d.tolist()
    over = 0
    for t in range(d.shape[1]):
        for ws in members:
            if sum(rows[w][t] for w in ws) > 1.0 + 1e-6:
                over += 1
    return over / (gpus * d.shape[1])


def run(path: Path, baseline: bool) -> dict[str, object]:
    from gpuaudit._heap import keep_freed_memory

    keep_freed_memory()
    from gpuaudit.capacity.profiles import build_profiles
    from gpuaudit.capacity.simulate import _demand, _replay, _vector_pack, simulate
    from gpuaudit.measure.files import open_samples
    from gpuaudit.price.catalog import resolve_rate

    out: dict[str, object] = {}
    t0 = time.perf_counter()
    prof = build_profiles(open_samples(path), step_s=60)
    t1 = time.perf_counter()
    rate = resolve_rate("H100")
    results = {}
    sim = simulate(prof, policies=("mig", "mps", "timeslice"), target_model="H100",
                   target_rate=rate, today_rates={"NVIDIA H100 80GB HBM3": rate})
    for r in sim.totals:
        pol = r.policy
        results[pol] = {"gpus_today": r.gpus_today, "gpus_needed": r.gpus_needed,
                        "lower_bound": r.lower_bound,
                        "contention": round(r.contention_step_share, 5),
                        "saved_monthly_usd": str(r.monthly_saved_usd)}
    t2 = time.perf_counter()
    out.update(workloads=len(prof), steps=prof.steps, profiles_s=round(t1 - t0, 2),
               simulate_s=round(t2 - t1, 2), total_s=round(t2 - t0, 2),
               results=results)
    if baseline:
        rows = np.arange(len(prof))
        scale = np.ones(len(prof))
        day = slice(0, min(1440, prof.steps))
        d = _demand(prof, rows, False, scale)
        from gpuaudit.capacity.profiles import row_percentiles

        p95 = np.nan_to_num(row_percentiles(d, (95,))[0])
        peak = np.nanmax(prof.mem_mib, axis=1) * 1.1
        gpu_of = _vector_pack(peak, p95, 80 * 1e9 / 2**20, 4)
        gpus = int(gpu_of.max()) + 1
        dd = np.ascontiguousarray(d[:, day])
        a = time.perf_counter()
        base = baseline_replay(dd, gpu_of, gpus)
        b = time.perf_counter()
        _u, vec, _t = _replay(dd, gpu_of, gpus)
        c = time.perf_counter()
        hour = np.ascontiguousarray(d[:, :60])
        n0 = time.perf_counter()
        naive = naive_replay(hour, gpu_of, gpus)
        n1 = time.perf_counter()
        _u, vec_h, _t = _replay(hour, gpu_of, gpus)
        factor = prof.steps / dd.shape[1]
        out["baseline"] = {"steps": dd.shape[1], "loop_s": round(b - a, 3),
                           "vectorised_s": round(c - b, 3),
                           "loop_scaled_to_window_s": round((b - a) * factor, 1),
                           "vectorised_scaled_to_window_s": round((c - b) * factor, 2),
                           "same_contention": abs(base - vec) < 1e-12,
                           "naive_loops_60_steps_s": round(n1 - n0, 3),
                           "naive_scaled_to_window_s": round((n1 - n0) * prof.steps / 60, 1),
                           "naive_same_contention": abs(naive - vec_h) < 1e-12}
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def _vm_hwm_mib(pid: int) -> float | None:
    """The process's peak resident set (``VmHWM`` in /proc/PID/status), MiB; None once it
    has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _cli(path: Path, plan: bool, src: str | None) -> dict[str, float]:
    """``gpuaudit simulate`` as a user runs it, a fresh process: wall and CPU (with any
    worker it starts) from ``wait4``; peak RSS as each process's own ``VmHWM`` (the kernel's
    high-water mark, polled every 20 ms until it exits; ``wait4``'s ``ru_maxrss`` can carry
    the forking parent's resident set into the child's): the command's, and the largest of
    any worker process it starts."""
    gpuaudit = str(Path(sys.executable).with_name("gpuaudit"))
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    cmd = [gpuaudit, "simulate", str(path), "--policy", "all", "--gpu-model", "H100",
           "--format", "json", "-o", os.devnull, *([] if plan else ["--no-plan"])]
    import tempfile

    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        hwm: dict[int, float] = {}
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            for p in (proc.pid, *_children(proc.pid)):
                v = _vm_hwm_mib(p)
                if v is not None:
                    hwm[p] = max(hwm.get(p, 0.0), v)
            time.sleep(0.02)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        if status != 0:
            err.seek(0)
            raise SystemExit(f"{cmd} failed: {err.read().decode()[-2000:]}")
    workers = [v for p, v in hwm.items() if p != proc.pid]
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime,
            "rss_mib": hwm.get(proc.pid, 0.0), "worker_rss_mib": max(workers, default=0.0),
            "ru_maxrss_mib": ru.ru_maxrss / 1024}


def plan_cost(path: Path, repeat: int, base_src: str | None, this_src: str | None = None
              ) -> None:
    """What the plan adds to ``gpuaudit simulate``: the command with and without it, run by
    run (and the baseline's, when given, interleaved), min and median."""
    import statistics

    cases = [(name, src, plan) for name, src in (
        *((("baseline", base_src),) if base_src else ()), ("this", this_src))
        for plan in (False, True)]
    res: dict[tuple[str, bool], list[dict[str, float]]] = {(n, p): [] for n, _s, p in cases}
    for _ in range(repeat):
        for name, src, plan in cases:
            load = os.getloadavg()[0]
            r = _cli(path, plan, src)
            r["load_before"] = load
            r["load_after"] = os.getloadavg()[0]
            res[(name, plan)].append(r)
            print(f"{name:8s} {'plan   ' if plan else 'no-plan'} wall {r['wall_s']:6.2f} s  "
                  f"cpu {r['cpu_s']:6.1f} s  VmHWM {r['rss_mib']:5.0f} MiB (workers "
                  f"{r['worker_rss_mib']:.0f}; ru_maxrss {r['ru_maxrss_mib']:.0f})  load before "
                  f"{load:.2f}, after {r['load_after']:.2f}", flush=True)
    for (name, plan), rs in res.items():
        walls = sorted(r["wall_s"] for r in rs)
        cpus = ", ".join(f"{r['cpu_s']:.1f}" for r in rs)
        print(f"{name:8s} {'plan   ' if plan else 'no-plan'} wall min {walls[0]:.2f} median "
              f"{statistics.median(walls):.2f} s (runs {', '.join(f'{w:.2f}' for w in walls)})"
              f"; cpu median {statistics.median(r['cpu_s'] for r in rs):.1f} s (runs "
              f"{cpus}); peak VmHWM "
              f"{max(r['rss_mib'] for r in rs):.0f} MiB")
    for name in dict.fromkeys(n for n, _p in res):
        a = [r["wall_s"] for r in res[(name, False)]]
        b = [r["wall_s"] for r in res[(name, True)]]
        print(f"{name}: the plan adds {min(b) / min(a) - 1:+.0%} (min) "
              f"{statistics.median(b) / statistics.median(a) - 1:+.0%} (median)")
    print("load average after:", os.getloadavg())


def stage_cpu(path: Path, plan: bool) -> None:
    """CPU per thread and stage (``time.thread_time`` around each) of ``gpuaudit.simulate`` on
    the file in this process, as the CLI runs it (the allocator tuned first): what the plan's
    thread spends and where, beside the main thread."""
    import threading

    from gpuaudit._heap import keep_freed_memory

    keep_freed_memory()
    import gpuaudit.api.shared_read as shared
    import gpuaudit.capacity.profiles as profiles
    import gpuaudit.capacity.simulate as replay
    from gpuaudit.api import audit as _audit  # noqa: F401  (the module, for its audit_usage)
    from gpuaudit.api import simulate
    from gpuaudit.classify import fused, passes, phases

    audit_mod = sys.modules["gpuaudit.api.audit"]
    acc: dict[str, float] = {}

    def timed(owner: object, name: str, label: str) -> None:
        real = getattr(owner, name)

        def wrapper(*a: object, **k: object) -> object:
            who = "plan" if threading.current_thread().name == "gpuaudit-plan-classify" \
                else "main"
            t = time.thread_time()
            try:
                return real(*a, **k)
            finally:
                acc[f"{who}: {label}"] = acc.get(f"{who}: {label}", 0.0) + time.thread_time() - t

        setattr(owner, name, wrapper)

    available = fused.available

    def first_available() -> bool:
        # numba is imported in the run (by the thread that meets the first large batch),
        # then the compiled loops are timed
        t = time.thread_time()
        ok = available()
        who = "plan" if threading.current_thread().name == "gpuaudit-plan-classify" else "main"
        acc[f"{who}: numba import"] = time.thread_time() - t
        fused.available = available  # type: ignore[assignment]
        if ok:
            for name in ("stream", "first_out_of_order", "max_signals"):
                timed(fused._kernel, name, f"kernel {name}")
        return ok

    fused.available = first_available  # type: ignore[assignment]
    timed(fused, "stream_batch", "fused.stream_batch (kernels + setup)")
    timed(phases._Engine, "_rows", "_Engine._rows (codes, cells, floats)")
    timed(phases._Engine, "feed", "_Engine.feed (all per batch)")
    timed(passes, "_lags", "lags from the onsets")
    timed(passes, "detect_patterns", "patterns")
    timed(profiles.ProfileBuilder, "add", "ProfileBuilder.add")
    timed(profiles.ProfileBuilder, "finish", "ProfileBuilder.finish")
    timed(replay, "simulate", "simulate (all policies)")
    timed(audit_mod, "audit_usage", "audit_usage (price, diagnose, recommend)")
    waited = [0.0]
    put = shared._Handover.put

    def timed_put(self: object, item: object) -> bool:
        t = time.perf_counter()
        try:
            return bool(put(self, item))  # type: ignore[arg-type]
        finally:
            waited[0] += time.perf_counter() - t

    shared._Handover.put = timed_put  # type: ignore[method-assign]
    load = os.getloadavg()[0]
    t0, w0, m0 = time.process_time(), time.perf_counter(), time.thread_time()
    rep = simulate(path, policy="all", gpu_model="H100", plan=plan)
    rep.render("json")
    print(f"process CPU {time.process_time() - t0:.2f} s, wall {time.perf_counter() - w0:.2f} s,"
          f" main thread CPU {time.thread_time() - m0:.2f} s, main waited handing batches over "
          f"{waited[0]:.2f} s; load before {load:.2f}, after {os.getloadavg()[0]:.2f}")
    for key, v in sorted(acc.items(), key=lambda kv: (kv[0].split(":")[0], -kv[1])):
        print(f"  {key:55s} {v:6.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--baseline", action="store_true")
    ap.add_argument("--cli", action="store_true")
    ap.add_argument("--run", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--plan-cost", type=int, default=0, metavar="N",
                    help="only the CLI with and without its plan, N times each, interleaved")
    ap.add_argument("--baseline-src", default=None, metavar="DIR",
                    help="with --plan-cost: also the gpuaudit of this src folder (e.g. main "
                    "checked out with git worktree add), interleaved run by run")
    ap.add_argument("--stage-cpu", choices=("plan", "no-plan"), default=None,
                    help="CPU per thread and stage of simulate in this process")
    ap.add_argument("--this-src", default=None, metavar="DIR",
                    help="with --plan-cost: run 'this' from this src folder (a snapshot of the "
                    "branch, so that edits made during the run do not reach it)")
    args = ap.parse_args()
    if args.run is not None:
        print(json.dumps(run(args.run, args.baseline)))
        return
    WORK.mkdir(exist_ok=True)
    path = WORK / f"capacity_{args.gpus}x{args.days}d.parquet"
    if not path.exists():
        t = time.perf_counter()
        make_file(args.gpus, args.days, path)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in "
              f"{time.perf_counter() - t:.0f} s", file=sys.stderr)
    if args.stage_cpu:
        stage_cpu(path, args.stage_cpu == "plan")
        return
    if args.plan_cost:
        plan_cost(path, args.plan_cost, args.baseline_src, args.this_src)
        return
    print("load before:", os.getloadavg(), file=sys.stderr)
    cmd = [sys.executable, __file__, "--run", str(path)] + (["--baseline"] if args.baseline else [])
    t = time.perf_counter()
    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    res["process_wall_s"] = round(time.perf_counter() - t, 2)
    res["rows"] = args.gpus * args.days * 1440
    if args.cli:
        gpuaudit = str(Path(sys.executable).with_name("gpuaudit"))
        for flag, name in (("--no-plan", "cli_no_plan_wall_s"), (None, "cli_wall_s")):
            t = time.perf_counter()
            subprocess.run([gpuaudit, "simulate", str(path), "--policy", "all", "--gpu-model",
                            "H100", "--format", "json", "-o", os.devnull,
                            *([flag] if flag else [])], check=True, capture_output=True)
            res[name] = round(time.perf_counter() - t, 2)
        # the largest child so far: the measured process and the two CLI runs (ru_maxrss:
        # may carry this parent's resident set; --plan-cost reads each process's VmHWM)
        res["max_child_rss_mib"] = round(
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    res["load_after"] = os.getloadavg()
    res["nproc"] = os.cpu_count()
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
