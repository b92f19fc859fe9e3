"""`gpuaudit run` records the wrapped command's CPU beside the GPUs (issue 21): a real process
spinning a core, the real psutil, the real pynvml over the fake libnvidia-ml.so.1; `gpuaudit
sample` has no workload, so only the host's CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuaudit.measure.live.fake_nvml import SCENARIO_ENV, build_fake_library
from gpuaudit.measure.live.recorder import read_recording

GPUAUDIT = [sys.executable, "-c", "import sys; from gpuaudit.cli import main; sys.exit(main())"]
BURN = ("import time, multiprocessing as mp\n"
        "def spin(s):\n"
        "    end = time.monotonic() + s\n"
        "    while time.monotonic() < end:\n"
        "        pass\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=spin, args=(2.0,))\n"  # a grandchild
        "    p.start(); spin(1.0); p.join()\n")


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_library(tmp_path_factory.mktemp("fakenvml")).parent


def _env(libdir: Path, tmp: Path) -> dict[str, str]:
    path = tmp / "scenario.json"
    path.write_text(json.dumps({"gpus": [{"gpm": True}, {}]}))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{libdir}:{env.get('LD_LIBRARY_PATH', '')}"
    env[SCENARIO_ENV] = str(path)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@pytest.mark.parametrize("mode", ["--no-process", "--process"])
def test_run_records_the_command_tree_cpu(libdir: Path, tmp_path: Path, mode: str) -> None:
    out = tmp_path / "run.parquet"
    script = tmp_path / "burn.py"
    script.write_text(BURN)
    p = subprocess.run([*GPUAUDIT, "run", mode, "--hz", "10", "--record", str(out),
                        "--no-report", "--", sys.executable, str(script)],
                       env=_env(libdir, tmp_path), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    t = read_recording(out).table
    host = t.column("host_cpu_util_pct").to_numpy(zero_copy_only=False)
    proc = t.column("proc_cpu_util_pct").to_numpy(zero_copy_only=False)
    ok = ~np.isnan(host) & ~np.isnan(proc)
    assert ok.sum() > 0, "CPU recorded beside the GPUs"
    assert np.nanmax(proc) > 0.0  # the spinning child and grandchild show up
    ncpu = os.cpu_count() or 1
    assert float(proc[ok].mean()) <= float(host[ok].mean()) + 100.0 / ncpu * 0.1 + 2.0


def test_sample_records_the_host_only(libdir: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    p = subprocess.run([*GPUAUDIT, "sample", "--duration", "1.5", "--hz", "10", "-o", str(out)],
                       env=_env(libdir, tmp_path), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    t = read_recording(out).table
    assert t.column("proc_cpu_util_pct").null_count == t.num_rows
    assert t.column("host_cpu_util_pct").null_count < t.num_rows
