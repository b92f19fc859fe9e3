"""Reports are written whole or not at all (issue 22 item 5), and `-o -` is stdout for every
report format (issue 26)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).parents[2] / "src" / "gpuaudit" / "data" / "nanogpt_8xh100.parquet"
GPUAUDIT = [sys.executable, "-c", "import sys; from gpuaudit.cli import main; sys.exit(main())"]


def _run(*args: str, fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([*GPUAUDIT, *args], capture_output=True, text=True, timeout=300,
                          preexec_fn=limit)


@pytest.mark.parametrize("command", [
    ["report", str(DEMO), "--price", "2", "--format", "json"],
    ["alerts"],
    ["grafana"],
])
def test_a_failed_write_leaves_the_previous_file_and_no_traceback(tmp_path: Path,
                                                                 command: list[str]) -> None:
    out = tmp_path / "out.txt"
    out.write_text("the previous report\n")
    p = _run(*command, "-o", str(out), fsize=1024)  # `ulimit -f 1`: every report is larger
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error:") and "Traceback" not in p.stderr
    assert "File too large" in p.stderr and "left as it was" in p.stderr
    assert out.read_text() == "the previous report\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.txt"]  # no temporary left


def test_dev_full_is_a_clear_error_and_is_not_replaced() -> None:
    p = _run("alerts", "-o", "/dev/full")
    assert p.returncode == 2
    assert "No space left on device" in p.stderr and "Traceback" not in p.stderr
    assert Path("/dev/full").is_char_device()


@pytest.mark.parametrize("fmt", ["json", "markdown", "html", "terminal"])
def test_dash_is_stdout(tmp_path: Path, fmt: str) -> None:
    p = subprocess.run([*GPUAUDIT, "report", str(DEMO), "--price", "2", "--format", fmt, "-o",
                        "-"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "-").exists()
    if fmt == "json":
        assert json.loads(p.stdout)["schema"] == "gpuaudit.report"
    else:
        assert len(p.stdout) > 500


def test_a_successful_write_keeps_the_file_mode(tmp_path: Path) -> None:
    out = tmp_path / "rules.yml"
    out.write_text("old")
    os.chmod(out, 0o640)
    assert _run("alerts", "-o", str(out)).returncode == 0
    assert (out.stat().st_mode & 0o777) == 0o640
    assert "groups:" in out.read_text()


def test_a_recording_cannot_go_to_stdout(tmp_path: Path) -> None:
    from gpuaudit.errors import InputError
    from gpuaudit.measure.live.recorder import Recorder

    with pytest.raises(InputError, match="cannot go to stdout"):
        Recorder("-", interval_s=1.0, origin="t", start_ns=0)
