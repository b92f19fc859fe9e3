"""`gpuaudit run` / `gpuaudit sample` as a user runs them: a real process, the real pynvml,
the fake libnvidia-ml.so.1 on LD_LIBRARY_PATH."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuaudit.measure.live.fake_nvml import SCENARIO_ENV, build_fake_library
from gpuaudit.measure.live.recorder import JOURNAL_SUFFIX, read_recording, recover_recording

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for the fake "
                                "libnvidia-ml")

GPUAUDIT = [sys.executable, "-c", "import sys; from gpuaudit.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_library(tmp_path_factory.mktemp("fakenvml")).parent


def _env(libdir: Path, tmp: Path, scenario: dict) -> dict[str, str]:
    path = tmp / "scenario.json"
    path.write_text(json.dumps(scenario))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{libdir}:{env.get('LD_LIBRARY_PATH', '')}"
    env[SCENARIO_ENV] = str(path)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


TWO_GPUS = {"gpus": [{"gpm": True, "pattern": {"kind": "square", "period_s": 0.1}}, {}]}


def test_run_passes_exit_code_and_records(libdir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.parquet"
    p = subprocess.run(
        [*GPUAUDIT, "run", "--hz", "50", "--label", "team=vision", "--label", "project=resnet",
         "--record", str(out), "--", sys.executable, "-c",
         "import time, sys; time.sleep(0.5); print('child ran'); sys.exit(3)"],
        env=_env(libdir, tmp_path, TWO_GPUS), capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    assert "child ran" in p.stdout
    rec = read_recording(out)
    assert rec.table.num_rows > 0 and rec.source == "nvml"
    assert set(rec.table.column("gpu_index").to_pylist()) == {0, 1}
    assert dict(rec.table.column("labels")[0].as_py()) == {"team": "vision",
                                                            "project": "resnet"}
    assert str(out) in p.stderr


def test_run_honours_cuda_visible_devices(libdir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.parquet"
    env = _env(libdir, tmp_path, TWO_GPUS)
    env["CUDA_VISIBLE_DEVICES"] = "GPU-fa4e0000-0000-4000-8000-000000000001"
    p = subprocess.run([*GPUAUDIT, "run", "--hz", "50", "--record", str(out), "--no-report",
                        "--", sys.executable, "-c", "import time; time.sleep(0.3)"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert set(read_recording(out).table.column("gpu_index").to_pylist()) == {1}


def test_run_without_driver_still_runs_the_job(libdir: Path, tmp_path: Path) -> None:
    p = subprocess.run([*GPUAUDIT, "run", "--record", str(tmp_path / "x.parquet"), "--",
                        sys.executable, "-c", "print('job output')"],
                       env=_env(libdir, tmp_path, {"missing": ["nvmlInit"]}),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    assert "job output" in p.stdout
    assert "nothing will be sampled" in p.stderr and "libnvidia-ml.so.1" in p.stderr


def test_run_unknown_command_is_127(libdir: Path, tmp_path: Path) -> None:
    p = subprocess.run([*GPUAUDIT, "run", "--record", str(tmp_path / "x.parquet"), "--",
                        "no-such-command-gpuaudit"], env=_env(libdir, tmp_path, TWO_GPUS),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 127 and "cannot run" in p.stderr


def test_run_forwards_sigterm(libdir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.parquet"
    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
             "print('ready', flush=True)\n"
             "time.sleep(30)\n")
    p = subprocess.Popen([*GPUAUDIT, "run", "--hz", "20", "--record", str(out), "--",
                          sys.executable, "-c", child],
                         env=_env(libdir, tmp_path, TWO_GPUS), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 7, err
    assert read_recording(out).table.num_rows > 0  # finalised after the child ended


def test_sample_sigkill_loses_at_most_one_flush(libdir: Path, tmp_path: Path) -> None:
    out = tmp_path / "idle.parquet"
    p = subprocess.Popen([*GPUAUDIT, "sample", "--hz", "50", "--flush-s", "0.1",
                          "--no-process", "-o", str(out)], env=_env(libdir, tmp_path, TWO_GPUS),
                         stderr=subprocess.PIPE, text=True)
    journal = Path(str(out) + JOURNAL_SUFFIX)
    end = time.monotonic() + 30
    while time.monotonic() < end and (not journal.exists() or journal.stat().st_size < 8000):
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert not out.exists()
    rec = recover_recording(out)
    assert rec.table.num_rows > 0
    assert rec.notes and "recovered" in rec.notes[0].reason


def test_sample_duration_writes_a_file(libdir: Path, tmp_path: Path) -> None:
    out = tmp_path / "idle.parquet"
    p = subprocess.run([*GPUAUDIT, "sample", "--duration", "0.4", "--hz", "50", "-o", str(out)],
                       env=_env(libdir, tmp_path, TWO_GPUS), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    rec = read_recording(out)
    assert rec.table.num_rows > 0
    assert "wrote" in p.stderr


def test_sample_sigkill_with_process_the_sampler_finalises(libdir: Path,
                                                           tmp_path: Path) -> None:
    """Killing `gpuaudit sample` leaves its sampling process to finish the recording."""
    out = tmp_path / "idle.parquet"
    p = subprocess.Popen([*GPUAUDIT, "sample", "--hz", "100", "--flush-s", "0.1",
                          "--process", "-o", str(out)], env=_env(libdir, tmp_path, TWO_GPUS),
                         stderr=subprocess.PIPE, text=True)
    journal = Path(str(out) + JOURNAL_SUFFIX)
    end = time.monotonic() + 30
    while time.monotonic() < end and (not journal.exists() or journal.stat().st_size < 8000):
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    end = time.monotonic() + 60
    while time.monotonic() < end and (journal.exists() or not out.exists()):
        time.sleep(0.05)
    rec = read_recording(out)
    assert rec.table.num_rows > 0
    assert any("ended without stopping" in e for e in rec.events)


def test_run_and_sample_in_a_process_with_the_real_pynvml(libdir: Path,
                                                          tmp_path: Path) -> None:
    """--process: the child loads the fake libnvidia-ml through the real pynvml."""
    env = _env(libdir, tmp_path, TWO_GPUS)
    out = tmp_path / "run.parquet"
    p = subprocess.run(
        [*GPUAUDIT, "run", "--process", "--hz", "100", "--label", "team=a", "--record",
         str(out), "--no-report", "--", sys.executable, "-c",
         "import time; time.sleep(0.5)"],
        env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rec = read_recording(out)
    assert set(rec.table.column("gpu_index").to_pylist()) == {0, 1}
    assert json.loads(rec.meta["labels"]) == {"team": "a"}
    assert rec.table.column("sm_active").null_count < rec.table.num_rows  # GPM via ctypes
    out2 = tmp_path / "sample.parquet"
    p = subprocess.run([*GPUAUDIT, "sample", "--process", "--duration", "0.5", "--hz", "20",
                        "-o", str(out2)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert read_recording(out2).table.num_rows > 0


def test_sample_process_without_driver_exits_2(libdir: Path, tmp_path: Path) -> None:
    p = subprocess.run([*GPUAUDIT, "sample", "--process", "--duration", "0.2",
                        "-o", str(tmp_path / "x.parquet")],
                       env=_env(libdir, tmp_path, {"missing": ["nvmlInit"]}),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "error:" in p.stderr and "libnvidia-ml.so.1" in p.stderr
