"""Sampler overhead and timing: gpuaudit's deadline-scheduled thread vs a plain sleep loop.

Both read the same pure-Python fake NVML (2 GPUs, GPM on: 14 NVML calls per GPU per tick)
through the same backend, so the difference is the scheduling alone. The plain loop is what
nvitop/gpustat-style pollers do: ``read(); time.sleep(period)``.

``gpuaudit-proc`` is the same sampler in a separate process (``Sampler(..., process=True)``,
the default of ``monitor``/``run``/``sample`` at >= 50 Hz): its GIL is not the main thread's.

Measured per configuration (rate x main thread idle or GIL-busy):
  * achieved rate (ticks / elapsed),
  * tick interval error |dt - period| p50 / p99 (from consecutive tick timestamps),
  * CPU share of one core used by the sampling threads (thread CPU time / wall time); for
    gpuaudit-proc the whole sampling process's CPU since it started sampling.

    .venv/bin/python benchmarks/bench_sampler.py            # ~100 s
    .venv/bin/python benchmarks/bench_sampler.py --seconds 2  # quick look
    .venv/bin/python benchmarks/bench_sampler.py --rates 100 --repeat 3  # the spread

``--cli`` measures the command a user runs instead: ``gpuaudit sample --hz 10`` as a whole
process (``--process`` and ``--no-process``), the real nvidia-ml-py binding loading the C
fake libnvidia-ml (fakenvml.c, built here with gcc; the same 2-GPU scenario). CPU = every
thread of the command's process and of its sampling process, from /proc/<pid>/task/*/schedstat
(ns), over a steady window that starts 1 s after the command says it is sampling and ends
before it stops (start-up, imports and the final Parquet write left out). ``--baseline SRC``
runs another checkout's ``src`` (``git archive main src | tar -x -C DIR``) interleaved with
this one, run by run::

    .venv/bin/python benchmarks/bench_sampler.py --cli --seconds 20 --repeat 5 \
        --baseline /tmp/base/src

``--reads N`` times the read path alone (N reads of both GPUs, ``--rounds`` times, min);
``--reads N --rounds 1`` under ``valgrind --tool=callgrind`` (minus ``--reads 0``) counts its
instructions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from gpuaudit.measure.live.fake_nvml import FakeNvml
from gpuaudit.measure.live.sampler import Sampler

SCENARIO = {"gpus": [{"gpm": True, "pattern": {"kind": "square", "period_s": 1.0}},
                     {"gpm": True, "pattern": {"kind": "sawtooth", "period_s": 3.0}}]}


def busy(stop: threading.Event) -> None:
    """A GIL-holding main thread: pure-Python arithmetic, as a tokenizer or a data loader."""
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i * i


def measure(kind: str, hz: float, seconds: float, gil_busy: bool) -> dict[str, float]:
    stop = threading.Event()
    ticks_ns: list[int] = []
    cpu = [0.0]
    period = 1.0 / hz
    if kind.startswith("gpuaudit"):
        sampler = Sampler(FakeNvml.backend(SCENARIO), interval_s=period,
                          process=kind == "gpuaudit-proc")
        sampler.start()
    else:
        backend = FakeNvml.backend(SCENARIO)
        devices = backend.open()

        def loop() -> None:
            c0 = time.thread_time()
            while not stop.is_set():
                ticks_ns.append(time.monotonic_ns())
                for d in devices:
                    backend.read(d)
                time.sleep(period)
            cpu[0] = time.thread_time() - c0

        th = threading.Thread(target=loop, daemon=True)
        th.start()
    t0 = time.monotonic()
    if gil_busy:
        busy_stop = threading.Event()
        timer = threading.Timer(seconds, busy_stop.set)
        timer.start()
        busy(busy_stop)
    else:
        time.sleep(seconds)
    wall = time.monotonic() - t0
    if kind.startswith("gpuaudit"):
        rec = sampler.stop()
        stats = sampler.stats()
        first = rec.table.column("gpu_uuid").cast("string").to_numpy(zero_copy_only=False)
        ts = rec.table.column("ts").cast("int64").to_numpy()
        t = ts[first == first[0]]
        cpu_s = stats.process_cpu_s if stats.process_cpu_s is not None else stats.cpu_s
        elapsed = stats.elapsed_s
    else:
        stop.set()
        th.join()
        backend.close()
        t = np.array(ticks_ns)
        cpu_s = cpu[0]
        elapsed = (t[-1] - t[0]) / 1e9 if len(t) > 1 else wall
    dt = np.diff(t) / 1e9
    err = np.abs(dt - period)
    return {
        "rate_hz": (len(t) - 1) / ((t[-1] - t[0]) / 1e9) if len(t) > 1 else 0.0,
        "err_p50_ms": float(np.percentile(err, 50) * 1e3),
        "err_p99_ms": float(np.percentile(err, 99) * 1e3),
        "cpu_pct": 100.0 * cpu_s / max(elapsed, 1e-9),
    }


def _task_cpu_ns(pid: int) -> int:
    """CPU time of every live thread of ``pid`` (ns; /proc schedstat, not 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just ended
    return total


def measure_cli(src: str, process: bool, window_s: float, libdir: str,
                scenario: str) -> tuple[float, float]:
    """``gpuaudit sample --hz 10`` run whole from checkout ``src``: (command process %,
    sampling process %) of one core over the steady window."""
    import psutil

    with tempfile.TemporaryDirectory(prefix="bench-sample-") as tmp:
        env = dict(os.environ, PYTHONPATH=src, GPUAUDIT_FAKE_NVML_SCENARIO=scenario,
                   LD_LIBRARY_PATH=f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}")
        cmd = [sys.executable, "-m", "gpuaudit", "sample", "--hz", "10",
               "--duration", f"{window_s + 3.0:g}", "-o", f"{tmp}/s.parquet",
               "--process" if process else "--no-process"]
        p = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
        assert p.stderr is not None
        line = p.stderr.readline()
        if "sampling" not in line:
            p.kill()
            raise RuntimeError(f"gpuaudit sample did not start: {line}{p.stderr.read()}")
        pids = [p.pid] + [c.pid for c in psutil.Process(p.pid).children()]
        if len(pids) != (2 if process else 1):
            raise RuntimeError(f"expected {'a' if process else 'no'} sampling process: {pids}")
        time.sleep(1.0)
        a = [_task_cpu_ns(x) for x in pids]
        t0 = time.monotonic_ns()
        time.sleep(window_s)
        b = [_task_cpu_ns(x) for x in pids]
        wall = time.monotonic_ns() - t0
        p.communicate(timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"gpuaudit sample exited {p.returncode}")
    pct = [100.0 * (y - x) / wall for x, y in zip(a, b)]
    return pct[0], (pct[1] if process else 0.0)


def main_cli(args: argparse.Namespace) -> None:
    from gpuaudit.measure.live.fake_nvml import build_fake_library

    here = str(Path(__file__).resolve().parents[1] / "src")
    srcs = {"this": here}
    if args.baseline:
        srcs = {"baseline": str(Path(args.baseline).resolve()), **srcs}
    with tempfile.TemporaryDirectory(prefix="bench-fakenvml-") as tmp:
        libdir = str(build_fake_library(tmp).parent)
        scenario = f"{tmp}/scenario.json"
        Path(scenario).write_text(json.dumps(SCENARIO))
        results: dict[tuple[str, bool], list[tuple[float, float]]] = {}
        for r in range(args.repeat):
            for name, src in srcs.items():  # interleaved: each run of each, in turn
                for process in (True, False):
                    got = measure_cli(src, process, args.seconds, libdir, scenario)
                    results.setdefault((name, process), []).append(got)
                    print(f"run {r + 1} {name:<9}{'--process' if process else '--no-process':<14}"
                          f"command {got[0]:.3f} %  sampling process {got[1]:.3f} %  "
                          f"total {sum(got):.3f} %  (load {os.getloadavg()[0]:.2f})",
                          flush=True)
    print(f"\n{'code':<10}{'mode':<14}{'total min %':>12}{'median %':>10}"
          f"{'command med':>13}{'sampler med':>13}")
    for (name, process), runs in results.items():
        tot = [sum(x) for x in runs]
        print(f"{name:<10}{'--process' if process else '--no-process':<14}{min(tot):>12.3f}"
              f"{statistics.median(tot):>10.3f}{statistics.median(x[0] for x in runs):>13.3f}"
              f"{statistics.median(x[1] for x in runs):>13.3f}")


def main_reads(n: int, rounds: int) -> None:
    """``n`` reads of every GPU through the real binding and the C fake, ``rounds`` times:
    the read path alone, hot caches (min thread CPU per read of all GPUs)."""
    from gpuaudit.measure.live.fake_nvml import SCENARIO_ENV, build_fake_library
    from gpuaudit.measure.live.nvml import NvmlBackend, load_library

    with tempfile.TemporaryDirectory(prefix="bench-fakenvml-") as tmp:
        lib = build_fake_library(tmp)
        Path(f"{tmp}/scenario.json").write_text(json.dumps(SCENARIO))
        os.environ[SCENARIO_ENV] = f"{tmp}/scenario.json"
        load_library(str(lib))
        backend = NvmlBackend(visible=None)
        devices = backend.open()
        for d in devices:  # the probe read
            backend.read(d)
        best = float("inf")
        for _ in range(rounds):
            c0 = time.thread_time()
            for _ in range(n):
                for d in devices:
                    backend.read(d)
            best = min(best, (time.thread_time() - c0) / max(n, 1))
        backend.close()
    if n:
        print(f"read of {len(devices)} GPUs: {best * 1e6:.1f} us (min of {rounds} x {n})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds per configuration")
    ap.add_argument("--rates", default="10,100", help="comma-separated target rates, Hz")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each configuration")
    ap.add_argument("--cli", action="store_true",
                    help="measure the whole `gpuaudit sample --hz 10` command instead")
    ap.add_argument("--baseline", default=None, metavar="SRC",
                    help="with --cli: another checkout's src/ to run interleaved")
    ap.add_argument("--reads", type=int, default=None, metavar="N",
                    help="time N reads of both GPUs through the real binding and the C fake")
    ap.add_argument("--rounds", type=int, default=9, help="with --reads: rounds (min kept)")
    args = ap.parse_args()
    if args.reads is not None:
        main_reads(args.reads, args.rounds)
        return
    if args.cli:
        main_cli(args)
        return
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, switch interval 5 ms")
    measure("gpuaudit", 50.0, 1.0, False)  # warm-up: imports, first Arrow build
    measure("sleep-loop", 50.0, 1.0, False)
    measure("gpuaudit-proc", 50.0, 1.0, False)
    print(f"{'config':<24}{'impl':<14}{'rate Hz':>9}{'err p50 ms':>12}{'err p99 ms':>12}"
          f"{'CPU %':>8}")
    for hz in (float(x) for x in args.rates.split(",")):
        for gil in (False, True):
            for kind in ("gpuaudit", "gpuaudit-proc", "sleep-loop") * args.repeat:
                r = measure(kind, hz, args.seconds, gil)
                cfg = f"{hz:g} Hz, main {'GIL-busy' if gil else 'idle'}"
                print(f"{cfg:<24}{kind:<14}{r['rate_hz']:>9.2f}{r['err_p50_ms']:>12.3f}"
                      f"{r['err_p99_ms']:>12.3f}{r['cpu_pct']:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
