"""The exporter under faults (issue 22 item 8, item 7's --by collision): a busy port or a host
that does not resolve is `error:` and exit 2, a silent or half-open client is dropped after
the read timeout, a client that hangs up prints no traceback. Against the real server."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest

from gpuaudit.cli import main
from gpuaudit.errors import InputError
from gpuaudit.integrate.exporter import ExporterState, label_names, serve

CSV = Path(__file__).parents[1] / "data" / "html_report" / "nanogpt_8xh100_head.csv"


def test_busy_port_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc = main(["exporter", "--source", str(CSV), "--gpu-model", "H100", "--listen",
                   f"127.0.0.1:{port}", "--duration", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "port is in use" in err and "Traceback" not in err


def test_unresolvable_host_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["exporter", "--source", str(CSV), "--gpu-model", "H100", "--listen",
               "no-such-host.invalid:9402", "--duration", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot resolve the host" in err and "Traceback" not in err


def test_a_silent_client_is_dropped_after_the_read_timeout() -> None:
    server = serve(ExporterState(), "127.0.0.1", 0, read_timeout_s=0.5)
    try:
        port = server.server_address[1]
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(b"GET /metrics HTTP/1.1\r\n")  # half a request, then nothing
            c.settimeout(10)
            t0 = time.monotonic()
            assert c.recv(1024) == b""  # the server closed it
            assert time.monotonic() - t0 < 9
    finally:
        server.shutdown()
        server.server_close()


def test_a_client_that_hangs_up_prints_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    server = serve(ExporterState(), "127.0.0.1", 0)
    try:
        port = server.server_address[1]
        for _ in range(5):
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(b"GET /metr")
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()  # RST mid-request
        time.sleep(0.5)
        import httpx

        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    finally:
        server.shutdown()
        server.server_close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err


def test_by_keys_that_collide_as_label_names_are_refused() -> None:
    with pytest.raises(InputError, match="both become the Prometheus label 'a_b'"):
        label_names(("label:a-b", "label:a_b"))
    assert label_names(("label:a-b", "label:c")) == ("a_b", "c")


PROM_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
               "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def _state() -> ExporterState:
    from decimal import Decimal

    from gpuaudit.api import audit

    state = ExporterState(("label:team",))
    state.add(audit(CSV, price=Decimal("2"), gpu_model="H100"), duration_s=0.5)
    return state


def test_openmetrics_negotiation_and_gzip(tmp_path: Path) -> None:
    """Prometheus' own Accept header gets OpenMetrics (parsed by prometheus_client's parser),
    a plain scraper the text format, each gzipped when asked; both carry the same samples."""
    import gzip
    import shutil
    import subprocess

    import httpx
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
    from prometheus_client.parser import text_string_to_metric_families as text_parse

    server = serve(_state(), "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        om = httpx.get(url, headers={"Accept": PROM_ACCEPT}, timeout=10)
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        assert om.text.rstrip().endswith("# EOF")
        om_fams = {f.name: f for f in om_parse(om.text)}
        text = httpx.get(url, timeout=10)
        assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
        text_fams = {f.name: f for f in text_parse(text.text)}
        # the same cost samples in both formats (OpenMetrics names counters without _total)
        om_cost = sorted(s.value for s in om_fams["gpuaudit_cost_dollars"].samples
                         if s.name.endswith("_total"))
        text_cost = sorted(s.value for s in text_fams["gpuaudit_cost_dollars"].samples)
        assert om_cost == text_cost and om_cost
        raw = httpx.get(url, headers={"Accept-Encoding": "gzip", "Accept": PROM_ACCEPT},
                        timeout=10)
        assert raw.headers.get("content-encoding") == "gzip"
        assert raw.text == om.text  # httpx inflates it: the same document
        with httpx.stream("GET", url, headers={"Accept-Encoding": "gzip"}, timeout=10) as r:
            body = b"".join(r.iter_raw())
        assert gzip.decompress(body).decode() == text.text
        promtool = shutil.which("promtool")
        assert promtool is not None, "promtool is installed by scripts/test"
        (tmp_path / "m.txt").write_text(text.text)
        check = subprocess.run([promtool, "check", "metrics"], input=text.text,
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        server.shutdown()
        server.server_close()


def test_scrape_connections_disable_nagle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Headers and body are two writes: with Nagle on, a keep-alive scraper waited for its
    own delayed ACK (~40 ms) on every scrape. The server's side of each connection has
    TCP_NODELAY."""
    import httpx

    from gpuaudit.integrate import exporter as ex

    seen: list[int] = []
    real = ex._Handler.setup

    def setup(self: ex._Handler) -> None:
        real(self)
        seen.append(self.request.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(ex._Handler, "setup", setup)
    server = serve(ExporterState(), "127.0.0.1", 0)
    try:
        with httpx.Client() as c:  # keep-alive: one connection, several scrapes
            for _ in range(3):
                assert c.get(f"http://127.0.0.1:{server.server_address[1]}/metrics",
                             timeout=10).status_code == 200
    finally:
        server.shutdown()
        server.server_close()
    assert seen and all(v != 0 for v in seen)
