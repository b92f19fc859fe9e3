"""gpuaudit trace vs HolisticTraceAnalysis 0.5.0: time and peak RSS, side by side.

``--whole`` (issue 27) measures what a user runs, whole processes: ``gpuaudit trace PATH
--hta-compat --price 2.5 -o /dev/null`` (load, analysis, classify, price, recommend, the
terminal report) against ``hta_compare.py PATH`` in HTA's venv (import, load, the temporal,
idle and kernel-type breakdowns), interleaved run by run (ours, HTA, ours, HTA, ...), each
under ``/usr/bin/time -f %M`` for its peak RSS; min and median of ``--reps`` runs. Run it
under ``flock /work/bench.lock`` on a shared machine. ``--big-mb N`` sets the synthetic
trace's size (default 500; issue 27 compares at 106).

Each measurement runs in a fresh process; the figure is the median of ``--reps`` runs.
``total_s`` is load + temporal, idle and kernel-type breakdowns inside the process (imports
excluded for both tools); ``wall_s`` is the whole process; ``rss_mb`` its peak RSS
(``wait4`` rusage). HTA runs from its own venv (``benchmarks/_work/hta-venv``,
``pip install HolisticTraceAnalysis==0.5.0``); it is never a gpuaudit dependency.

    .venv/bin/python benchmarks/bench_traces.py [--reps 3] [--big] [--flops] [--shapes]

``--flops`` also builds a SYNTHETIC copy of the V100 trace with ``args.flops`` on every CPU
operator (the worst case for the FLOP path: every ``cpu_op`` kept) and measures gpuaudit on it.
``--shapes`` builds a SYNTHETIC copy where every CPU operator is an ``aten::mm`` with ``Input
Dims`` and no ``args.flops`` (as torch 2.x exports them): the worst case for counting FLOPs
from input shapes (every ``cpu_op`` kept and its count computed).
``--big`` also builds a ~500 MB SYNTHETIC trace (the V100 trace repeated in time, plain JSON) in
benchmarks/_work and measures gpuaudit on it (HTA is not run on it). The gpuaudit child checks
that neither pyarrow, DuckDB nor pandas was imported on the trace path.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / "_work"
DATA = ROOT / "tests" / "data" / "traces"
HTA_PY = WORK / "hta-venv" / "bin" / "python"
PY = sys.executable

OURS = r"""
import json, sys, time
t0 = time.perf_counter()
from gpuaudit.traces.loader import load_traces
from gpuaudit.traces.analysis import analyze
import numpy  # the trace path imports neither pyarrow nor duckdb; imports are excluded for both tools
t1 = time.perf_counter()
tr = load_traces([sys.argv[1]])
t2 = time.perf_counter()
a = analyze(tr)
t3 = time.perf_counter()
heavy = [m for m in ("pyarrow", "duckdb", "pandas") if m in sys.modules]
assert not heavy, f"the trace path imported {heavy}"
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "total_s": t3 - t1,
                  "events": sum(r.gpu.size for r in tr.ranks),
                  "flop_ops": sum(r.flop_ops.size for r in tr.ranks
                                  if hasattr(r, "flop_ops"))}))
"""


def run_whole(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one whole process, RSS from GNU time (whose own
    few MiB are all a child inherits, unlike a fork of this driver)."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "RSS_KB %M", *cmd], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({p.returncode}): {p.stderr[-2000:]}")
    rss_kb = int(next(ln for ln in p.stderr.splitlines()[::-1] if ln.startswith("RSS_KB "))
                 .split()[1])
    return wall, rss_kb / 1024


def whole(paths: list[tuple[str, Path]], reps: int, baseline: Path | None = None,
          hta_runs: bool = True) -> None:
    """The interleaved whole-process comparison (see the module docstring); ``baseline``: a
    ``src`` folder of another gpuaudit (e.g. main before a change), run the same way beside."""
    gpuaudit = str(Path(PY).with_name("gpuaudit"))
    # bytecode as `pip install` leaves it (HTA's venv has its own): with
    # PYTHONDONTWRITEBYTECODE set, an editable checkout would compile every module each run
    for src in (ROOT / "src", *([baseline] if baseline else [])):
        subprocess.run([PY, "-m", "compileall", "-q", str(src)], check=True,
                       stdout=subprocess.DEVNULL)
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f}; nproc {os.cpu_count()}")
    print("| trace | gpuaudit wall min / median | RSS min / median | HTA 0.5.0 wall min / "
          "median | RSS min / median | speed-up (min / median) | RSS ratio (median) |")
    print("|---|---|---|---|---|---|---|")
    for name, d in paths:
        ours_cmd = [gpuaudit, "trace", str(d), "--hta-compat", "--price", "2.5", "-o",
                    "/dev/null"]
        hta_cmd = [str(HTA_PY), str(ROOT / "benchmarks" / "hta_compare.py"), str(d)]
        base_cmd = ["env", f"PYTHONPATH={baseline}", PY, "-c",
                    "import sys; from gpuaudit.cli import main; sys.exit(main())",
                    *ours_cmd[1:]] if baseline else None
        ours: list[tuple[float, float]] = []
        hta: list[tuple[float, float]] = []
        base: list[tuple[float, float]] = []
        with_hta = hta_runs and HTA_PY.exists()
        run_whole(ours_cmd)  # warm the page cache for both
        if with_hta:
            run_whole(hta_cmd)
        for _ in range(reps):
            ours.append(run_whole(ours_cmd))
            if with_hta:
                hta.append(run_whole(hta_cmd))
            if base_cmd:
                base.append(run_whole(base_cmd))

        def mm(xs: list[float]) -> tuple[float, float]:
            return min(xs), statistics.median(xs)

        ow, orss = mm([w for w, _ in ours]), mm([r for _, r in ours])
        row = (f"| {name} | {ow[0]:.3f} / {ow[1]:.3f} s | {orss[0]:.0f} / {orss[1]:.0f} MiB")
        if hta:
            hw, hrss = mm([w for w, _ in hta]), mm([r for _, r in hta])
            row += (f" | {hw[0]:.3f} / {hw[1]:.3f} s | {hrss[0]:.0f} / {hrss[1]:.0f} MiB | "
                    f"{hw[0] / ow[0]:.1f}x / {hw[1] / ow[1]:.1f}x | {orss[1] / hrss[1]:.2f} |")
        else:
            row += " | not run | | | |"
        if base:
            bw, brss = mm([w for w, _ in base]), mm([r for _, r in base])
            row += (f" baseline {bw[0]:.3f} / {bw[1]:.3f} s, {brss[0]:.0f} / {brss[1]:.0f} MiB "
                    f"(HTA / baseline {hw[0] / bw[0]:.1f}x / {hw[1] / bw[1]:.1f}x) |"
                    if hta else f" baseline {bw[0]:.3f} / {bw[1]:.3f} s, {brss[0]:.0f} / "
                    f"{brss[1]:.0f} MiB |")
        print(row, flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f}")


PHASES = r"""
import json, sys, time
T = time.process_time
t0 = T()
import click
t1 = T()
import msgspec, numpy
t2 = T()
import gpuaudit.cli, gpuaudit.cli.options, gpuaudit.cli.trace
t3 = T()
import gpuaudit.traces.flops, gpuaudit.traces.loader, gpuaudit.traces.windows
from gpuaudit.api.compose import assemble, rates_for
from gpuaudit.api.trace import _parts
from gpuaudit.classify.columns import SeriesColumns, classify_columns
from gpuaudit.traces.analysis import AnalysisOptions, analyze
from gpuaudit.traces.loader import load_traces
from gpuaudit.traces.windows import busy_series
t4 = T()
import gpuaudit.report.terminal
t5 = T()
p = sys.argv[1]
tr = load_traces([p]); t6 = T()
opt = AnalysisOptions(hta_compat=True)
analyze(tr, opt); busy_series(tr, window_s=0.1, options=opt); t7 = T()
parts = _parts([p], hta_compat=True, include_last_step=False, window_ms=100.0, gpu_model=None)
t8 = T()
u = classify_columns([SeriesColumns(s.gpu_uuid, s.host, s.gpu_model, None, s.ts_ns, s.util_pct,
                                    s.end_ns) for s in parts.series], interval_s=0.1,
                     source="trace", origin="o", notes=parts.notes, findings=parts.evidence)
t9 = T()
rep = assemble(u, rates_for(u, price="2.5"), findings=parts.evidence, extra={"trace": parts.extra})
t10 = T()
rep.render("terminal"); t11 = T()
print(json.dumps({"import click": t1 - t0, "import numpy + msgspec": t2 - t1,
                  "import the CLI": t3 - t2, "import the pipeline": t4 - t3,
                  "import rich + terminal report": t5 - t4, "load": t6 - t5,
                  "analysis + busy/idle series": t7 - t6, "classify": t9 - t8,
                  "price + recommend": t10 - t9, "render": t11 - t10}))
"""


#: the floors of ``--floor``: what any Python command on this stack pays before its own work
FLOORS: dict[str, list[str]] = {
    "interpreter": [PY, "-c", "pass"],
    "interpreter + NumPy": [PY, "-c", "import numpy"],
    "+ the loader (read and decode, nothing else)": [
        PY, "-c", "import sys, numpy; from gpuaudit.traces.loader import load_traces; "
        "load_traces(sys.argv[1:])"],
}


def floor(paths: list[tuple[str, Path]], reps: int) -> None:
    """Issue 27's `trace` goal on the real traces against what no command on this stack can
    go below: HTA 0.5.0 (``hta_compare.py``), ``gpuaudit trace``, and the floors of
    :data:`FLOORS` (the interpreter alone, with NumPy imported, and with the trace read and
    decoded by gpuaudit's loader and nothing else), interleaved run by run, whole processes
    (wall and peak RSS by ``/usr/bin/time``); min and median of ``reps``. The goal's budget
    is HTA's min wall / 20 and HTA's median RSS / 4."""
    gpuaudit = str(Path(PY).with_name("gpuaudit"))
    print(f"load before: {os.getloadavg()[0]:.2f}; nproc {os.cpu_count()}")
    print("| trace | HTA 0.5.0 wall min / median, RSS | 20x budget, 1/4 RSS | gpuaudit trace | "
          + " | ".join(FLOORS) + " |")
    print("|---|---|---|---|" + "---|" * len(FLOORS))
    for name, d in paths:
        cmds = {"HTA": [str(HTA_PY), str(ROOT / "benchmarks" / "hta_compare.py"), str(d)],
                "ours": [gpuaudit, "trace", str(d), "--hta-compat", "--price", "2.5", "-o",
                         "/dev/null"],
                **{k: [*v, *([str(d)] if k.startswith("+") else [])]
                   for k, v in FLOORS.items()}}
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
        for c in cmds.values():
            run_whole(c)  # warm the page cache and the bytecode
        for _ in range(reps):
            for k, c in cmds.items():
                got[k].append(run_whole(c))

        def cell(k: str, got: dict[str, list[tuple[float, float]]] = got) -> str:
            w = [x for x, _ in got[k]]
            r = [x for _, x in got[k]]
            return (f"{1e3 * min(w):.0f} / {1e3 * statistics.median(w):.0f} ms, "
                    f"{statistics.median(r):.0f} MiB")

        hw = min(w for w, _ in got["HTA"])
        hr = statistics.median(r for _, r in got["HTA"])
        print(f"| {name} | {cell('HTA')} | {1e3 * hw / 20:.0f} ms, {hr / 4:.0f} MiB | "
              f"{cell('ours')} | " + " | ".join(cell(k) for k in FLOORS) + " |", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")


def phases(path: Path, reps: int) -> None:
    """CPU time per phase of `gpuaudit trace PATH --hta-compat` (``time.process_time``, each
    phase as the command runs it; fresh process per run; min of ``reps``)."""
    runs = []
    for _ in range(reps):
        out = subprocess.run([PY, "-c", PHASES, str(path)], check=True, capture_output=True,
                             text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    for k in runs[0]:
        print(f"{k:32} {1000 * min(r[k] for r in runs):7.1f} ms")
    print(f"{'total':32} {1000 * sum(min(r[k] for r in runs) for k in runs[0]):7.1f} ms")


def helper_rss(path: Path, reps: int) -> None:
    """Peak RSS (VmHWM, sampled from /proc every few ms) of `gpuaudit trace PATH` and of its
    decoding helper (gpuaudit.traces._kineto_parts), which the command's own peak leaves out."""
    gpuaudit = str(Path(PY).with_name("gpuaudit"))
    for _ in range(reps):
        proc = subprocess.Popen([gpuaudit, "trace", str(path), "--hta-compat", "--price", "2.5",
                                 "-o", "/dev/null"], stderr=subprocess.DEVNULL)
        peak = {"command": 0, "helper": 0}
        while proc.poll() is None:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        helper = b"_kineto_parts" in f.read()
                    if not helper and int(pid) != proc.pid:
                        continue
                    with open(f"/proc/{pid}/status") as f:
                        kb = next(int(x.split()[1]) for x in f if x.startswith("VmHWM"))
                except (OSError, StopIteration):
                    continue
                key = "helper" if helper else "command"
                peak[key] = max(peak[key], kb // 1024)
            time.sleep(0.003)
        print(f"command {peak['command']} MiB, helper {peak['helper']} MiB, together "
              f"{peak['command'] + peak['helper']} MiB")


def run(cmd: list[str]) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise RuntimeError(f"{cmd} failed ({status})")
    res = json.loads(out.decode().strip().splitlines()[-1])
    res["wall_s"] = wall
    res["rss_mb"] = usage.ru_maxrss / 1024
    return res


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def trace_dir(name: str) -> Path:
    """The real trace ``name`` (a file or a folder of ranks) as a directory: see dir_of."""
    return dir_of(DATA / name)


def dir_of(src: Path) -> Path:
    """HTA wants a directory of rank traces: a single file is linked into one."""
    if src.is_dir():
        return src
    d = WORK / "dirs" / src.name.split(".")[0]
    d.mkdir(parents=True, exist_ok=True)
    link = d / src.name
    if not link.exists():
        link.symlink_to(src)
    return d


def build_big(target_mb: int = 500) -> Path:
    """SYNTHETIC: the V100 trace's events repeated in time until the JSON is ~target_mb."""
    out = WORK / ("synthetic_v100_repeated.json" if target_mb == 500
                  else f"synthetic_v100_repeated_{target_mb}mb.json")
    if out.exists():
        return out
    doc = json.loads(gzip.decompress((DATA / "v100_1rank_ns_resolution.json.gz").read_bytes()))
    events = doc.pop("traceEvents")
    evs = [json.dumps(e) for e in events if e.get("ph") != "M"]
    span_us = 600_000.0
    head = json.dumps({k: v for k, v in doc.items()})[:-1]
    with open(out, "w") as fh:
        fh.write(head + ', "traceEvents": [\n')
        k = 0
        first = True
        while fh.tell() < target_mb * 1_000_000:
            shift = k * span_us
            for e in events:
                if e.get("ph") == "M":
                    continue
                e2 = dict(e)
                if "ts" in e2:
                    e2["ts"] = round(e2["ts"] + shift, 3)
                if isinstance(e2.get("args"), dict) and "correlation" in e2["args"]:
                    e2["args"] = {**e2["args"], "correlation": e2["args"]["correlation"]
                                  + k * 10_000_000}
                fh.write(("" if first else ",\n") + json.dumps(e2))
                first = False
            k += 1
        fh.write("\n]}\n")
    del evs
    return out


def build_ranks(n: int, mb: int) -> Path:
    """SYNTHETIC: a folder of ``n`` rank traces of ~``mb`` MB each (the V100 trace repeated
    in time, :func:`build_big`), each with its own ``distributedInfo.rank``."""
    out = WORK / f"synthetic_v100_{n}ranks_{mb}mb"
    if out.exists():
        return out
    one = build_big(mb)
    head = one.read_bytes()[:1 << 16]
    at = head.index(b'"traceEvents"')
    info = head.index(b'"distributedInfo"')  # the V100 trace's: rank 0 of 1
    rank = head.index(b'"rank": 0', info)
    assert rank < at
    out.mkdir(parents=True)
    for r in range(n):
        with open(out / f"rank{r}.json", "wb") as fh, open(one, "rb") as src:
            fh.write(head[:rank] + f'"rank": {r}'.encode())
            src.seek(rank + len(b'"rank": 0'))
            shutil.copyfileobj(src, fh)
    return out


def _v100_variant(name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """SYNTHETIC: the V100 trace with ``edit`` applied to every CPU operator event."""
    out = WORK / name
    if out.exists():
        return out
    WORK.mkdir(parents=True, exist_ok=True)
    doc = json.loads(gzip.decompress((DATA / "v100_1rank_ns_resolution.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op":
            edit(e)
    out.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return out


def _with_flops(e: dict[str, Any]) -> None:
    e.setdefault("args", {})["flops"] = 1_000_000_000


def _with_shapes(e: dict[str, Any]) -> None:
    e["name"] = "aten::mm"
    a = e.setdefault("args", {})
    a["Input Dims"] = [[64, 256], [256, 512]]
    a["Concrete Inputs"] = ["", ""]


def build_flops() -> Path:
    """SYNTHETIC: the V100 trace with ``args.flops`` (1e9) on every CPU operator event."""
    return _v100_variant("synthetic_v100_all_ops_flops.json.gz", _with_flops)


def build_shapes() -> Path:
    """SYNTHETIC: the V100 trace with every CPU operator an ``aten::mm`` with input shapes."""
    return _v100_variant("synthetic_v100_all_ops_shapes.json.gz", _with_shapes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--flops", action="store_true")
    ap.add_argument("--shapes", action="store_true")
    ap.add_argument("--whole", action="store_true",
                    help="whole processes as a user runs them, HTA interleaved (issue 27)")
    ap.add_argument("--big-mb", type=int, default=500)
    ap.add_argument("--phases", type=Path, default=None,
                    help="CPU time per phase of `gpuaudit trace PATH` (min of --reps)")
    ap.add_argument("--no-hta", action="store_true",
                    help="with --whole: gpuaudit (and --baseline) only")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="with --whole: the src folder of another gpuaudit to run beside")
    ap.add_argument("--ranks", type=int, default=0,
                    help="with --whole: also a SYNTHETIC folder of this many rank traces")
    ap.add_argument("--rank-mb", type=int, default=53,
                    help="with --ranks: each rank trace's size in MB")
    ap.add_argument("--only-synthetic", action="store_true",
                    help="with --whole: leave the real traces out")
    ap.add_argument("--floor", action="store_true",
                    help="the real traces: HTA, gpuaudit and what no command on this stack "
                    "goes below (the interpreter, NumPy, the loader alone), interleaved")
    ap.add_argument("--helper-rss", type=Path, default=None,
                    help="peak RSS of `gpuaudit trace PATH` and of its decoding helper")
    args = ap.parse_args()
    if args.helper_rss:
        helper_rss(args.helper_rss, args.reps)
        return
    if args.phases:
        phases(args.phases, args.reps)
        return
    if args.floor:
        floor([(n, trace_dir(n)) for n in ("a100_1rank_ddp_nccl.json.gz",
                                           "v100_1rank_ns_resolution.json.gz", "two_ranks")],
              args.reps)
        return
    if args.whole:
        paths = [] if args.only_synthetic else [
            (n, trace_dir(n)) for n in ("a100_1rank_ddp_nccl.json.gz",
                                        "v100_1rank_ns_resolution.json.gz", "two_ranks")]
        if args.ranks:
            rd = build_ranks(args.ranks, args.rank_mb)
            paths.append((f"{rd.name} ({args.ranks} x {args.rank_mb} MB, synthetic)", rd))
        if args.big:
            big = build_big(args.big_mb)
            paths.append((f"{big.name} ({big.stat().st_size / 1e6:.0f} MB, synthetic)",
                          dir_of(big)))
        whole(paths, args.reps, args.baseline, hta_runs=not args.no_hta)
        shutil.rmtree(WORK / "dirs", ignore_errors=True)
        return
    rows = []
    for name in ("a100_1rank_ddp_nccl.json.gz", "v100_1rank_ns_resolution.json.gz",
                 "two_ranks"):
        d = trace_dir(name)
        ours = median([run([PY, "-c", OURS, str(d)]) for _ in range(args.reps)])
        hta = (median([run([str(HTA_PY), str(ROOT / "benchmarks" / "hta_compare.py"),
                            str(d)]) for _ in range(args.reps)])
               if HTA_PY.exists() else None)
        rows.append((name, ours, hta))
    if args.flops:
        fl = build_flops()
        ours = median([run([PY, "-c", OURS, str(fl)]) for _ in range(args.reps)])
        rows.append((f"{fl.name} (synthetic, {ours['flop_ops']:.0f} operators with "
                     "args.flops)", ours, None))
    if args.shapes:
        sh = build_shapes()
        ours = median([run([PY, "-c", OURS, str(sh)]) for _ in range(args.reps)])
        rows.append((f"{sh.name} (synthetic, {ours['flop_ops']:.0f} operators counted from "
                     "input shapes)", ours, None))
    if args.big:
        big = build_big(args.big_mb)
        ours = median([run([PY, "-c", OURS, str(big)]) for _ in range(args.reps)])
        rows.append((f"{big.name} ({big.stat().st_size / 1e6:.0f} MB, synthetic)", ours, None))
    print("| trace | gpuaudit load / total / wall / peak RSS | HTA 0.5.0 load / total / wall /"
          " peak RSS | speed-up (total) | RSS ratio |")
    print("|---|---|---|---|---|")
    for name, o, h in rows:
        ours_s = (f"{o['load_s']:.3f} s / {o['total_s']:.3f} s / {o['wall_s']:.2f} s / "
                  f"{o['rss_mb']:.0f} MB")
        if h:
            hta_s = (f"{h['load_s']:.3f} s / {h['total_s']:.3f} s / {h['wall_s']:.2f} s / "
                     f"{h['rss_mb']:.0f} MB")
            print(f"| {name} | {ours_s} | {hta_s} | {h['total_s'] / o['total_s']:.1f}x | "
                  f"{o['rss_mb'] / h['rss_mb']:.2f} |")
        else:
            print(f"| {name} | {ours_s} | n/a | | |")
    shutil.rmtree(WORK / "dirs", ignore_errors=True)


if __name__ == "__main__":
    main()
