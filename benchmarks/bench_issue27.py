"""Issue 27's rows in one run: each command a user runs, whole process, beside its peer.

    flock /work/bench.lock .venv/bin/python benchmarks/bench_issue27.py [--reps 5] \
        [--rows help,trace,report,bill,simulate]

Each row runs gpuaudit's command and its peer alternately (the order swapped every round,
one warm-up of each first), every run a fresh process under ``/usr/bin/time -f '%U %S
%M'``: CPU (user + sys, the waited-for workers included) and peak RSS (the largest of the
process and its waited-for children); the wall from this script's clock, to the
millisecond. It prints one Markdown table: min / median wall, median CPU, largest RSS, the
peer's wall over ours (min / median) and our largest RSS over the peer's.

The rows and their peers (issue 27's table):

- ``help``: ``gpuaudit --help`` / ``nvitop --help`` (nvitop 1.7.2);
- ``trace``: ``gpuaudit trace DIR --hta-compat --price 2.5 -o /dev/null`` on each real trace
  and the 106 MB SYNTHETIC one (``bench_traces.py --big --big-mb 106`` builds it) /
  HolisticTraceAnalysis 0.5.0 (``hta_compare.py``: load and the temporal, idle and
  kernel-type breakdowns);
- ``report``: ``gpuaudit report fleet_1000gpu_28h_1hz.parquet --provider aws --format json``
  (100.8M SYNTHETIC samples, ``bench_classify.py``) / the same phase shares as one DuckDB SQL
  query (``bench_classify.DUCKDB_CHILD``);
- ``bill``: ``gpuaudit bill`` of 10M FOCUS lines over 43.2M samples (``bench_bill.py``'s
  SYNTHETIC inputs) / the plain pandas join of the same (``bench_bill.PANDAS_CHILD``);
- ``simulate``: ``gpuaudit simulate`` of 1,000 GPUs x 30 days with its plan / the same
  command with ``--no-plan`` (the recording read once; the goal is the plan's cost).

The peers run from their own venvs, never gpuaudit's: HTA's (``benchmarks/_work/hta-venv``,
``pip install HolisticTraceAnalysis==0.5.0``) and ``benchmarks/_work/peer-venv`` (``pip
install nvitop==1.7.2 pandas duckdb pyarrow``). The fleet and sampler rows need servers and
a fake NVML library: ``bench_fleet_shards.py`` and ``bench_sampler.py --cli`` run them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_bill  # noqa: E402
import bench_classify  # noqa: E402
import bench_traces  # noqa: E402

ROOT = HERE.parent
WORK = HERE / "_work"
PY = sys.executable
GPUAUDIT = str(Path(PY).with_name("gpuaudit"))
PEER_PY = WORK / "peer-venv" / "bin" / "python"
HTA_PY = WORK / "hta-venv" / "bin" / "python"


@dataclass(frozen=True)
class Run:
    wall_s: float
    cpu_s: float
    rss_mib: float


@dataclass(frozen=True)
class Row:
    name: str
    ours: list[str]
    peer_name: str
    peer: list[str]
    goal: str


def timed(cmd: list[str]) -> Run:
    """One whole process under GNU time (CPU, RSS; the wall from this clock, to the
    millisecond); its stdout discarded, a failure raised."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "TIME %e %U %S %M", *cmd],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{cmd} failed ({p.returncode}): {p.stderr[-2000:]}")
    line = next(ln for ln in reversed(p.stderr.splitlines()) if ln.startswith("TIME "))
    _, user, sys_s, kib = (float(x) for x in line.split()[1:])
    return Run(wall, user + sys_s, kib / 1024)


def rows(names: set[str], out_dir: Path) -> list[Row]:
    out = str(out_dir / "out.json")
    found: list[Row] = []
    if "help" in names:
        found.append(Row("`gpuaudit --help`", [GPUAUDIT, "--help"],
                         "nvitop 1.7.2 `--help`", [str(PEER_PY.with_name("nvitop")), "--help"],
                         "<= nvitop"))
    if "trace" in names:
        traces = [(n, bench_traces.trace_dir(n)) for n in (
            "a100_1rank_ddp_nccl.json.gz", "v100_1rank_ns_resolution.json.gz", "two_ranks")]
        big = bench_traces.build_big(106)
        traces.append((f"{big.name} (**synthetic**, 106 MB)", bench_traces.dir_of(big)))
        for n, path in traces:
            found.append(Row(f"`trace` {n}",
                             [GPUAUDIT, "trace", str(path), "--hta-compat", "--price", "2.5",
                              "-o", os.devnull],
                             "HTA 0.5.0", [str(HTA_PY), str(HERE / "hta_compare.py"), str(path)],
                             ">= 20x HTA at <= 1/4 of its RSS"))
    if "report" in names:
        rec = WORK / "fleet_1000gpu_28h_1hz.parquet"
        found.append(Row("`report`, 100.8M samples (**synthetic**)",
                         [GPUAUDIT, "report", str(rec), "--provider", "aws", "--format", "json",
                          "-o", out],
                         "DuckDB SQL of the same shares",
                         [str(PEER_PY), "-c", bench_classify.DUCKDB_CHILD, str(rec)], "<= 3 s"))
    if "bill" in names:
        bill, tel = WORK / "bill_focus_10m.parquet", WORK / "bill_telemetry_1000gpu_30d_1m.parquet"
        found.append(Row("`bill`, 10M lines x 43.2M samples (**synthetic**)",
                         [GPUAUDIT, "bill", str(bill), "--telemetry", str(tel), "--by",
                          "namespace", "--format", "json", "-o", out],
                         "pandas join", [str(PEER_PY), "-c", bench_bill.PANDAS_CHILD, str(bill),
                                         str(tel)], "<= 10 s"))
    if "simulate" in names:
        cap = WORK / "capacity_1000x30d.parquet"
        cmd = [GPUAUDIT, "simulate", str(cap), "--policy", "all", "--gpu-model", "H100",
               "--format", "json", "-o", out]
        found.append(Row("`simulate`, 1,000 GPUs x 30 d, with its plan (**synthetic**)", cmd,
                         "the same, `--no-plan`", [*cmd, "--no-plan"], "the plan costs < 10 %"))
    for row in found:
        for exe in (row.ours[0], row.peer[0]):
            if not Path(exe).exists():
                raise SystemExit(f"{exe} is missing: see this script's docstring for the venvs "
                                 "and the benchmarks that write the inputs")
    return found


def measure(row: Row, reps: int) -> tuple[list[Run], list[Run]]:
    timed(row.ours)
    timed(row.peer)
    ours: list[Run] = []
    peer: list[Run] = []
    for i in range(reps):
        pair = ((row.ours, ours), (row.peer, peer))
        for cmd, runs in pair if i % 2 == 0 else pair[::-1]:
            runs.append(timed(cmd))
    return ours, peer


def cell(runs: list[Run]) -> str:
    walls = [r.wall_s for r in runs]
    digits = 3 if min(walls) < 1 else 2
    return (f"{min(walls):.{digits}f} / {statistics.median(walls):.{digits}f} s, "
            f"CPU {statistics.median(r.cpu_s for r in runs):.2f} s, "
            f"{max(r.rss_mib for r in runs):.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rows", default="help,trace,report,bill,simulate")
    args = ap.parse_args()
    subprocess.run([PY, "-m", "compileall", "-q", str(ROOT / "src")], check=True,
                   stdout=subprocess.DEVNULL)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "?")
    print(f"machine: {os.cpu_count()} cores, {cpu}; load before "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print("| row | gpuaudit wall min / median, CPU median, peak RSS | peer | peer wall min / "
          "median, CPU median, peak RSS | peer / gpuaudit wall (min / median), RSS ratio | "
          "goal |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows(set(args.rows.split(",")), Path(tmp)):
            ours, peer = measure(row, args.reps)
            ratio_min = min(r.wall_s for r in peer) / min(r.wall_s for r in ours)
            ratio_med = (statistics.median(r.wall_s for r in peer)
                         / statistics.median(r.wall_s for r in ours))
            rss = max(r.rss_mib for r in ours) / max(r.rss_mib for r in peer)
            print(f"| {row.name} | {cell(ours)} | {row.peer_name} | {cell(peer)} | "
                  f"{ratio_min:.2f}x / {ratio_med:.2f}x, RSS {rss:.2f} | {row.goal} |",
                  flush=True)
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
