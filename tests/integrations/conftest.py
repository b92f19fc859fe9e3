"""Fixtures for the tracker and framework integration tests (the `integrations` marker).

These need the heavy optional packages (mlflow, wandb, lightning, transformers, CPU torch)
and run in their own venv, `.venv-integrations`, as the second step of `scripts/test`; the
core run deselects them (see pyproject's pytest addopts). Every module here carries
``pytestmark = pytest.mark.integrations`` and imports the heavy packages inside its tests, so
the core venv can collect (and deselect) them without those packages.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ithelpers import free_port

from gpuaudit.measure.live.fake_nvml import build_fake_library


@pytest.fixture(scope="session", autouse=True)
def tracker_files_out_of_the_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """W&B (offline) and MLflow's default store write under a temporary folder, never into
    the checkout: W&B reads WANDB_DIR once per process, so it is set before any test runs,
    and the working directory (MLflow's default ./mlruns or mlflow.db) is a temporary one."""
    import os

    root = tmp_path_factory.mktemp("trackers")
    saved = {k: os.environ.get(k) for k in ("WANDB_DIR", "WANDB_MODE", "WANDB_SILENT")}
    os.environ.update({"WANDB_DIR": str(root), "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    cwd = os.getcwd()
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server (SQLite store, served artifacts) on 127.0.0.1."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, cwd=root)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not start:\n"
                                   + (root / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        yield uri
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled fake libnvidia-ml.so.1 (a child process loads it via LD_LIBRARY_PATH)."""
    return build_fake_library(tmp_path_factory.mktemp("fakenvml")).parent
