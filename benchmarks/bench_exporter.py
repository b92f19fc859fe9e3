"""Load test of ``gpuaudit exporter`` on loopback: N concurrent scrapers for a bounded time.

    .venv/bin/python benchmarks/bench_exporter.py [--scrapers 100] [--seconds 20] [--gpus 64]
        [--interval 1.0]     # seconds between one scraper's scrapes; 0 = back to back

The exporter runs in its own process (as in production) serving a synthetic fleet (``--gpus``
GPUs, 4 teams, 7 namespaces, 1 h at 10 s) audited through the real pipeline. This process
runs ``--scrapers`` threads, each with its own keep-alive httpx client, scraping /metrics
every ``--interval`` seconds (Prometheus scrapes every 15-60 s; 1 s is 15x harsher), all
starting together. Errors: non-200, transport errors, or a body of the wrong length.
Goal: p99 < 50 ms, zero errors.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from gpuaudit.api import audit
from gpuaudit.integrate.exporter import ExporterState, serve
from gpuaudit.schema import build_table


def fleet(gpus: int, samples: int = 360, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    t0 = np.datetime64("2025-06-01T00:00:00", "ns").astype(np.int64)
    ts = t0 + np.arange(samples, dtype=np.int64) * 10_000_000_000
    n = gpus * samples
    teams = np.array(["vision", "nlp", "serving", "research"])
    team_of = teams[np.arange(gpus) % 4]
    labels = pa.array([[("team", t)] for t in np.tile(team_of, samples)],
                      type=pa.map_(pa.string(), pa.string()))
    return build_table({
        "ts": pa.array(np.repeat(ts, gpus), pa.timestamp("ns", tz="UTC")),
        "host": [f"node-{i // 8}" for i in np.tile(np.arange(gpus), samples)],
        "gpu_uuid": [f"GPU-{i:05d}" for i in np.tile(np.arange(gpus), samples)],
        "gpu_model": ["NVIDIA H100 80GB HBM3"] * n,
        "util_gpu_pct": rng.uniform(0, 100, n).astype(np.float32),
        "namespace": [f"ns-{i % 7}" for i in np.tile(np.arange(gpus), samples)],
        "labels": labels,
    })


def _serve(gpus: int, conn: Any) -> None:
    state = ExporterState(("namespace", "team"))
    t0 = time.perf_counter()
    state.add(audit(fleet(gpus), by=("namespace", "team"), price="2.50"))
    server = serve(state, "127.0.0.1", 0)
    conn.send((server.server_address[1], time.perf_counter() - t0))
    conn.recv()  # until the parent says stop
    server.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapers", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    parent, child = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=_serve, args=(args.gpus, child), daemon=True)
    proc.start()
    port, audit_s = parent.recv()
    url = f"http://127.0.0.1:{port}/metrics"
    body = httpx.get(url).text
    series = sum(len(f.samples) for f in text_string_to_metric_families(body))
    lat: list[list[float]] = [[] for _ in range(args.scrapers)]
    errors = [0] * args.scrapers
    start = threading.Barrier(args.scrapers + 1)
    stop_at = [0.0]

    def scraper(i: int) -> None:
        with httpx.Client(timeout=10) as client:
            start.wait()
            # spread first scrapes over one interval, then keep each scraper's own beat
            nxt = time.perf_counter() + args.interval * i / args.scrapers
            while time.perf_counter() < stop_at[0]:
                if args.interval > 0:
                    time.sleep(max(0.0, nxt - time.perf_counter()))
                    nxt += args.interval
                t = time.perf_counter()
                try:
                    r = client.get(url)
                    ok = r.status_code == 200 and len(r.content) == len(body.encode())
                except httpx.HTTPError:
                    ok = False
                lat[i].append(time.perf_counter() - t)
                if not ok:
                    errors[i] += 1

    threads = [threading.Thread(target=scraper, args=(i,)) for i in range(args.scrapers)]
    for th in threads:
        th.start()
    stop_at[0] = time.perf_counter() + args.seconds
    start.wait()
    for th in threads:
        th.join()
    parent.send("stop")
    proc.join(10)
    all_lat = np.array([x for row in lat for x in row]) * 1000
    print(f"cpus={os.cpu_count()} gpus={args.gpus} series={series} body={len(body)} B "
          f"audit={audit_s:.2f} s scrapers={args.scrapers} interval={args.interval:g} s "
          f"seconds={args.seconds:g}")
    print(f"requests={all_lat.size} rps={all_lat.size / args.seconds:.0f} errors={sum(errors)} "
          f"p50={np.percentile(all_lat, 50):.1f} ms p90={np.percentile(all_lat, 90):.1f} ms "
          f"p99={np.percentile(all_lat, 99):.1f} ms max={all_lat.max():.1f} ms")


if __name__ == "__main__":
    main()
