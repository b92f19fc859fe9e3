"""The cost exporter's HTTP server under load, measured by wrk (a C load generator in its own
process, so the generator is not the bottleneck), beside prometheus_client's own
``start_http_server`` serving the same registry, run one after the other in one process.

    python benchmarks/bench_exporter_wrk.py --connections 100 --seconds 10

Needs Debian's ``wrk`` (``apt-get install wrk``). Prints one JSON line per server: requests
per second, latency p50/p90/p99 (ms), socket errors and non-2xx answers, and the load
average, which on a shared machine says how much the figures can be trusted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

HERE = Path(__file__).resolve().parent
CSV = HERE.parent / "tests" / "data" / "html_report" / "nanogpt_8xh100_head.csv"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    assert m, text
    v = float(m.group(1))
    return v / 1000 if m.group(2) == "us" else v * 1000 if m.group(2) == "s" else v


def wrk(url: str, connections: int, seconds: int, threads: int) -> dict[str, object]:
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s",
                          "--latency", url], capture_output=True, text=True, check=True).stdout
    lat = dict(re.findall(r"^\s+(50|90|99)%\s+(\S+)", out, re.M))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                       out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"requests_per_s": rps, "p50_ms": _ms(lat["50"]), "p90_ms": _ms(lat["90"]),
            "p99_ms": _ms(lat["99"]),
            "socket_errors": sum(int(x) for x in errors.groups()) if errors else 0,
            "non_2xx": int(non2xx.group(1)) if non2xx else 0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--connections", type=int, default=100)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("needs wrk: apt-get install wrk", file=sys.stderr)
        return 2
    sys.path.insert(0, str(HERE.parent / "src"))
    from prometheus_client import start_http_server

    from gpuaudit.api import audit
    from gpuaudit.integrate.exporter import ExporterState, serve

    state = ExporterState(("label:team",))
    state.add(audit(CSV, price=Decimal("2"), gpu_model="H100"), duration_s=0.1)
    ours = serve(state, "127.0.0.1", 0)
    theirs_port = _free_port()
    start_http_server(theirs_port, addr="127.0.0.1", registry=state.registry)
    time.sleep(0.5)
    for name, url in (("gpuaudit exporter", f"http://127.0.0.1:{ours.server_address[1]}/metrics"),
                      ("prometheus_client start_http_server",
                       f"http://127.0.0.1:{theirs_port}/metrics")):
        row = {"server": name, "connections": args.connections, "seconds": args.seconds,
               "payload_bytes": len(state.payload), **wrk(url, args.connections, args.seconds,
                                                          args.threads),
               "load_avg": os.getloadavg()}
        print(json.dumps(row), flush=True)
    ours.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
