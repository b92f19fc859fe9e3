"""Credentials never shown (issue 22 item 6): a password in the --prometheus URL reaches no
report (JSON, HTML, terminal, Markdown) and no error; a bearer token file is one line, its
content never printed, and a world-readable one gets a warning. Against the real Prometheus
of tests/fleet/conftest.py (it ignores the basic auth the URL turns into)."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest

from gpuaudit.cli import main
from gpuaudit.errors import InputError, redact
from gpuaudit.measure.fleet.prometheus import PromClient, read_token_file, split_userinfo

SECRET = "S3cr3t-pw"


def _with_password(url: str) -> str:
    return url.replace("http://", f"http://alice:{SECRET}@")


@pytest.mark.parametrize("fmt", ["json", "html", "terminal", "markdown"])
def test_password_in_the_url_reaches_no_report(prom, fleet, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"r.{fmt}"
    rc = main(["fleet", "--prometheus", _with_password(prom), "--start", str(fleet.start_s),
               "--end", str(fleet.end_s), "--price", "1", "--format", fmt, "-o", str(out),
               "--no-progress"])
    assert rc == 0
    text = out.read_text()
    assert SECRET not in text and "alice" not in text
    assert prom.removeprefix("http://") in text  # the host is still named


def test_password_in_the_url_reaches_no_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(["fleet", "--prometheus", f"http://bob:{SECRET}@127.0.0.1:{port}", "--since",
               "1h", "--step", "15s", "--retries", "0", "--timeout", "2", "--price", "1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "unavailable" in err and SECRET not in err and f"127.0.0.1:{port}" in err


def test_redact_and_split() -> None:
    assert redact(f"at http://u:{SECRET}@h:9090/x and https://tok@h2/") == \
        "at http://***@h:9090/x and https://***@h2/"
    assert redact("no url here, user@example.com") == "no url here, user@example.com"
    assert split_userinfo("http://a%40b:p%3Aw@[::1]:9090/p?q=1") == \
        ("http://[::1]:9090/p?q=1", ("a@b", "p:w"))
    assert split_userinfo("http://h:9090") == ("http://h:9090", None)
    err = InputError(f"cannot reach http://u:{SECRET}@h", where=f"http://u:{SECRET}@h/api",
                     fix=f"retry http://u:{SECRET}@h")
    assert SECRET not in str(err)
    client = PromClient(f"http://u:{SECRET}@h:9090/")
    assert client.url == "http://h:9090" and client.basic_auth == ("u", SECRET)


def test_token_file_with_two_lines_is_refused_without_showing_it(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(f"{SECRET}\nsecond-line-{SECRET}\n")
    f.chmod(0o600)
    with pytest.raises(InputError) as e:
        read_token_file(f)
    assert "2 lines" in str(e.value) and SECRET not in str(e.value)


def test_token_file_refused_before_any_request(tmp_path: Path, capsys) -> None:
    f = tmp_path / "token"
    f.write_text(f"{SECRET}\nline two\n")
    f.chmod(0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(["fleet", "--prometheus", f"http://127.0.0.1:{port}", "--since", "1h",
               "--step", "15s", "--bearer-token-file", str(f), "--price", "1",
               "--timeout", "2"])
    assert rc == 2
    err = capsys.readouterr().err
    assert SECRET not in err and "line two" not in err and "one line" in err
    assert err.count("error:") == 1


def test_token_file_one_line_with_newline_is_fine_and_world_readable_warns(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "token"
    f.write_text(f"{SECRET}\n")
    f.chmod(0o600)
    with caplog.at_level(logging.WARNING):
        assert read_token_file(f) == SECRET
    assert not caplog.records
    os.chmod(f, 0o644)
    with caplog.at_level(logging.WARNING):
        assert read_token_file(f) == SECRET
    assert "readable by every user" in caplog.text and SECRET not in caplog.text
    f.write_text("")
    with pytest.raises(InputError, match="empty"):
        read_token_file(f)
