"""Helpers shared by the integration tests (imported by name: pytest puts this folder on
sys.path)."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from gpuaudit.measure.fake_nvml import SCENARIO_ENV

GPUAUDIT = [sys.executable, "-c", "import sys; from gpuaudit.cli import main; sys.exit(main())"]

#: two fake H100s: one busy in a square wave, one idle
TWO_GPUS = {"gpus": [{"gpm": True, "pattern": {"kind": "square", "period_s": 0.2}}, {}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake_gpu_env(libdir: Path, tmp: Path, scenario: dict) -> dict[str, str]:
    """The environment of a child process that loads the fake libnvidia-ml.so.1."""
    path = tmp / "scenario.json"
    path.write_text(json.dumps(scenario))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{libdir}:{env.get('LD_LIBRARY_PATH', '')}"
    env[SCENARIO_ENV] = str(path)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    for key in ("MLFLOW_RUN_ID", "WANDB_RUN_ID", "MLFLOW_EXPERIMENT_NAME"):
        env.pop(key, None)
    return env
