"""What one store-week costs the store and the client, per way of reading it: the PromQL
pushdown (a one-store ``audit_fleet`` in a fresh process: all its queries, client CPU
included), Prometheus' remote read (streamed XOR chunks), VictoriaMetrics' ``/api/v1/export``
(JSON lines, gzip and not) and ``/api/v1/export/csv``. Server CPU from /proc, bytes as received, the
client's decode time.

    .venv/bin/python benchmarks/bench_fleet_fetch.py --keep benchmarks/_work/shards_250x7d

Needs the stores built by ``bench_fleet_shards.py --keep DIR --build-only`` (same --gpus,
--days).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fleet"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_fleet_shards import KINDS, cpu_s, server_pid  # noqa: E402
from fleetgen import run_prometheus, run_victoria_metrics  # noqa: E402

from gpuaudit.measure.fleet.native import export_series, remote_read  # noqa: E402
from gpuaudit.measure.fleet.prometheus import RAW_METRICS, PromClient  # noqa: E402

PUSHDOWN = r"""
import json, resource, sys, time
from gpuaudit.api import audit_fleet
t = time.perf_counter()
r = audit_fleet(prometheus=[sys.argv[1]], start_s=float(sys.argv[2]), end_s=float(sys.argv[3]),
                step_s=15.0, by=("team",), pricing={"price": "1.00"})
ru = resource.getrusage(resource.RUSAGE_SELF)
f = r.extra["fleet"]
print(json.dumps({"wall_s": time.perf_counter() - t, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "wire": f["transfer"]["wire_bytes"], "requests": f["transfer"]["requests"]}))
"""


def one_store(i: int, kind: str, url: str, pid: int, start: int, end: int, match: str,
              ) -> None:
    """The ways of reading store ``i``'s week, each measured."""
    client = PromClient(url, timeout_s=600)

    def measure(name: str, fn: object) -> None:
        c0 = cpu_s(pid)
        p0 = time.process_time()
        t0 = time.perf_counter()
        extra = fn()  # type: ignore[operator]
        wall = time.perf_counter() - t0
        print(f"s{i} ({kind}) {name}: server CPU {cpu_s(pid) - c0:.2f} s, "
              f"client CPU {time.process_time() - p0:.2f} s, wall {wall:.2f} s, "
              f"{extra} (load {os.getloadavg()[0]:.1f})", flush=True)

    def pushdown() -> str:
        out = subprocess.run([sys.executable, "-c", PUSHDOWN, url, str(start),
                              str(end)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        return (f"child CPU {r['cpu_s']:.2f} s, {r['requests']} requests, wire "
                f"{r['wire']:,} B")

    def native() -> str:
        if kind == "prometheus":
            w0 = client.wire_bytes
            got = remote_read(client, [(
                (start - 15) * 1000, end * 1000, [("__name__", "=~", match)])])
            n = sum(s.ts_ms.shape[0] for _q, s in got)
            return (f"remote read: {len(got)} series, {n:,} samples, wire "
                    f"{client.wire_bytes - w0:,} B")
        w0, b0 = client.wire_bytes, client.body_bytes
        series = export_series(client, f'{{__name__=~"{match}"}}', start - 15, end)
        wire, body = client.wire_bytes - w0, client.body_bytes - b0
        n = sum(s.ts_ms.shape[0] for s in series)
        return (f"export JSON: {len(series)} series, {n:,} samples, wire {wire:,} B, "
                f"decoded {body:,} B")

    def plain() -> str:  # the same export, asked without gzip (what a local store saves)
        import io

        import pyarrow.json as pj
        r = client.post_raw("/api/v1/export", data={
            "match[]": f'{{__name__=~"{match}"}}', "start": str(start - 15),
            "end": str(end)}, headers={"Accept-Encoding": "identity"})
        t = pj.read_json(io.BytesIO(r.content), read_options=pj.ReadOptions(block_size=8 << 20))
        return (f"export JSON, no gzip: {t.num_rows:,} series, wire "
                f"{r.num_bytes_downloaded:,} B")

    def csv() -> str:
        import io

        import pyarrow.csv as pc
        fmt = ("__name__,UUID,Hostname,exported_pod,exported_namespace,gpu,"
               "GPU_I_ID,__value__,__timestamp__:unix_ms")
        r = client.post_raw("/api/v1/export/csv", data={
            "match[]": f'{{__name__=~"{match}"}}', "format": fmt,
            "start": str(start - 15), "end": str(end)},
            headers={"Accept-Encoding": "gzip"})
        t = pc.read_csv(io.BytesIO(r.content), read_options=pc.ReadOptions(
            column_names=fmt.split(",")))
        return (f"export CSV: {t.num_rows:,} rows, wire {r.num_bytes_downloaded:,} B, "
                f"decoded {len(r.content):,} B")

    measure("native", native)
    measure("native again", native)
    if kind != "prometheus":
        measure("export without gzip", plain)
        measure("csv", csv)
    measure("pushdown (one-store audit, fresh process)", pushdown)
    client.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, required=True)
    ap.add_argument("--stores", default="0,1,2,3")
    args = ap.parse_args()
    spec = json.loads((args.keep / "built.json").read_text())["spec"]
    start = 1_704_067_200
    end = start + int(spec["days"] * 86400) - spec["step"]
    match = "|".join(RAW_METRICS)
    with contextlib.ExitStack() as stack:
        for i in (int(x) for x in args.stores.split(",")):
            kind = KINDS[i]
            data = args.keep / f"store{i}"
            run = run_prometheus if kind == "prometheus" else run_victoria_metrics
            url = stack.enter_context(run(data))
            pid = server_pid(url.rsplit(":", 1)[1])
            one_store(i, kind, url, pid, start, end, match)


if __name__ == "__main__":
    main()
