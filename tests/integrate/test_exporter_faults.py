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
