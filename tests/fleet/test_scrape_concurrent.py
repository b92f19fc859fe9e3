"""`gpuaudit scrape` fetches its endpoints at once (issue 26 part 3): a slow endpoint does not
hold the others back. Evidence is the order of requests, never a timing."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pyarrow.parquet as pq

from gpuaudit.cli.scrape import scrape_to_recording

DATA = Path(__file__).parents[1] / "data" / "dcgm"
PAGE = (DATA / "l4_kops_conformance.prom").read_bytes()


class _Server:
    """One dcgm-exporter stand-in on 127.0.0.1 serving a real captured page."""

    def __init__(self, on_get: object) -> None:
        cb = on_get

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                cb()  # type: ignore[operator]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(PAGE)))
                self.end_headers()
                self.wfile.write(PAGE)

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_slow_endpoint_does_not_serialize_the_others(tmp_path: Path) -> None:
    n_fast = 3
    lock = threading.Lock()
    fast_seen: list[int] = []
    all_fast_asked = threading.Event()
    slow_saw_all_fast: list[bool] = []

    def fast() -> None:
        with lock:
            fast_seen.append(1)
            if len(fast_seen) >= n_fast:
                all_fast_asked.set()

    def slow() -> None:
        # the slow node answers only once every fast node has been asked; fetched one at a
        # time with the slow one first, the fast ones are asked only after it gives up
        slow_saw_all_fast.append(all_fast_asked.wait(timeout=20))

    servers = [_Server(slow)] + [_Server(fast) for _ in range(n_fast)]
    try:
        out = tmp_path / "fleet.parquet"
        rows = scrape_to_recording([s.url for s in servers], out, every_s=1.0, duration_s=1.0,
                                   timeout_s=60)
    finally:
        for s in servers:
            s.close()
    assert slow_saw_all_fast == [True]  # the fast ones were asked while the slow one waited
    assert len(fast_seen) == n_fast
    assert rows > 0 and pq.read_table(out).num_rows == rows  # every endpoint's rows kept
