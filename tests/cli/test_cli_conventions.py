"""The conventions ops and Python users expect of a command line (issue 26): NO_COLOR and
--color, -v/-q with logging, a single-valued option given twice is an error."""

from __future__ import annotations

import io
import logging
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaudit.cli import run_argv
from gpuaudit.cli.console import configure, use_color

DEMO = Path(__file__).parents[2] / "src" / "gpuaudit" / "data" / "nanogpt_8xh100.parquet"
GPUAUDIT = [sys.executable, "-c", "import sys; from gpuaudit.cli import main; sys.exit(main())"]
SGR = "\x1b["  # an ANSI escape: colour and style sequences start so


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUAUDIT, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _on_a_terminal(*args: str, env: dict[str, str], stream: str = "stdout") -> str:
    """The command's ``stream`` (stdout or stderr) as a person's terminal receives it (a
    pseudo-terminal); the other stream is discarded."""
    master, slave = pty.openpty()
    ends = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, stream: slave}
    p = subprocess.Popen([*GPUAUDIT, *args], stdout=ends["stdout"], stderr=ends["stderr"],
                         env={**os.environ, **env, "COLUMNS": "120"})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=300)
    os.close(master)
    return b"".join(chunks).decode("utf-8", "replace")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_use_color_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    configure(color="auto")
    assert use_color(_Tty()) and not use_color(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(_Tty())
    monkeypatch.setenv("NO_COLOR", "")  # empty: as if unset (no-color.org)
    assert use_color(_Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    configure(color="always")
    assert use_color(io.StringIO())
    configure(color="never")
    assert not use_color(_Tty())
    configure(color="auto")


def test_a_terminal_gets_colour_unless_no_color() -> None:
    base = {k: "" for k in ("NO_COLOR",)}
    coloured = _on_a_terminal("report", str(DEMO), "--price", "2", env=base)
    assert "gpuaudit report" in coloured and SGR in coloured
    plain = _on_a_terminal("report", str(DEMO), "--price", "2", env={"NO_COLOR": "1"})
    assert "gpuaudit report" in plain and "\x1b[1m" not in plain and "\x1b[3" not in plain


@pytest.mark.parametrize("where", ["before", "after"])
def test_color_flag_before_or_after_the_command(where: str) -> None:
    args = ["report", str(DEMO), "--price", "2"]
    always = ["--color", "always"]
    p = _run(*(always + args if where == "before" else args + always),
             env={"NO_COLOR": "1"})
    assert p.returncode == 0 and SGR in p.stdout  # an explicit flag wins over NO_COLOR
    p = _run(*args, "--color", "never")
    assert p.returncode == 0 and SGR not in p.stdout


def test_quiet_prints_nothing_but_errors(tmp_path: Path) -> None:
    p = _run("-q", "report", str(DEMO), "--price", "2", "--format", "json", "-o",
             str(tmp_path / "r.json"))
    assert p.returncode == 0 and p.stderr == ""
    p = _run("report", str(DEMO), "--price", "2", "--format", "json", "-o",
             str(tmp_path / "r.json"))
    assert "wrote json report" in p.stderr
    p = _run("report", str(tmp_path / "missing.csv"), "-q")
    assert p.returncode == 2 and "error: Invalid value for 'PATH'" in p.stderr  # errors stay


def test_verbosity_sets_the_gpuaudit_loggers(tmp_path: Path) -> None:
    out = str(tmp_path / "r.json")
    for flags, level in ((["-q"], logging.ERROR), ([], logging.WARNING),
                         (["-v"], logging.INFO), (["-vv"], logging.DEBUG)):
        assert run_argv([*flags, "report", str(DEMO), "--price", "2", "--format", "json",
                         "-o", out]) == 0
        assert logging.getLogger("gpuaudit").getEffectiveLevel() == level, flags
    configure(verbosity=0)


def test_a_format_given_twice_is_an_error() -> None:
    p = _run("report", str(DEMO), "--price", "2", "--format", "json", "--format", "html")
    assert p.returncode == 2
    assert "given 2 times (json, html): give one" in p.stderr


def _stderr_on_a_terminal(*args: str) -> str:
    return _on_a_terminal(*args, env={}, stream="stderr")


TRACE = Path(__file__).parents[1] / "data" / "traces" / "a100_1rank_ddp_nccl.json.gz"


def test_long_steps_show_progress_on_a_terminal_only() -> None:
    """trace (and bill, simulate, rightsize, report) draw a progress line on a terminal's
    stderr; nothing when stderr is a pipe or with -q."""
    assert "analysing 1 trace path" in _stderr_on_a_terminal("trace", str(TRACE), "--price",
                                                              "2")
    assert "analysing" not in _stderr_on_a_terminal("-q", "trace", str(TRACE), "--price", "2")
    p = _run("trace", str(TRACE), "--price", "2")
    assert p.returncode == 0 and "analysing" not in p.stderr


BILL = Path(__file__).parents[1] / "data" / "billing" / "focus_1.0_sample.csv"


@pytest.mark.parametrize("formats", [("json", "markdown"), ("focus", "cur")])
def test_bill_two_formats_of_one_kind_is_an_error(formats: tuple[str, str]) -> None:
    # bill's --format takes one bill format and one report format; two of a kind kept the last
    p = _run("bill", str(BILL), "--telemetry", str(DEMO), "--format", formats[0], "--format",
             formats[1])
    assert p.returncode == 2, p.stderr
    assert f"({formats[0]}, {formats[1]}): give one" in p.stderr and "Traceback" not in p.stderr


def test_bill_compare_format_given_twice_is_an_error(tmp_path: Path) -> None:
    p = _run("bill", "compare", str(DEMO), str(DEMO), "--format", "json", "--format",
             "markdown")
    assert p.returncode == 2
    assert "given 2 times (json, markdown): give one" in p.stderr


def test_bill_parquet_to_stdout_is_refused_and_csv_goes_to_stdout(tmp_path: Path) -> None:
    base = ["bill", str(BILL), "--telemetry", str(DEMO)]
    p = subprocess.run([sys.executable, "-m", "gpuaudit.cli", *base, "--format", "parquet",
                        "-o", "-"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 2 and "cannot go to stdout" in p.stderr
    assert not (tmp_path / "-").exists()  # no file named '-'
    c = subprocess.run([sys.executable, "-m", "gpuaudit.cli", *base, "--format", "csv", "-o",
                        "-"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert c.returncode == 0 and c.stdout.startswith("period_start,")
    assert not (tmp_path / "-").exists()
