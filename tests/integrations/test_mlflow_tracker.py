"""gpuaudit -> MLflow against a real tracking server on 127.0.0.1 (SQLite store, served
artifacts): `gpuaudit run --mlflow`, `gpuaudit.monitor(mlflow=True)`, MLFLOW_RUN_ID, and a
GPU-less machine. GPU samples come from the fake NVML (the compiled libnvidia-ml for the CLI,
the Python double in process)."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from ithelpers import GPUAUDIT, TWO_GPUS, fake_gpu_env

from gpuaudit.measure.live.fake_nvml import FakeNvml

pytestmark = pytest.mark.integrations


def _client(uri: str) -> Any:
    import mlflow

    return mlflow.MlflowClient(tracking_uri=uri)


def _artifact(client: Any, run_id: str, path: str, tmp: Path) -> str:
    local = client.download_artifacts(run_id, path, str(tmp))
    return Path(local).read_text()


def test_monitor_logs_to_the_active_run(mlflow_server: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    from gpuaudit.api import audit
    from gpuaudit.monitor import counts_from

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(mlflow_server)
    with mlflow.start_run() as run:
        mlflow.log_metric("loss", 0.25)
        with gpuaudit_monitor(labels={"team": "vision"}) as m:
            for _ in range(8):
                time.sleep(0.05)
                m.step(samples=32, tokens=4096)
        assert mlflow.active_run() is not None  # the user's run is still theirs
    run_id = run.info.run_id
    client = _client(mlflow_server)
    got = client.get_run(run_id)
    metrics, tags = got.data.metrics, got.data.tags
    assert got.info.status == "FINISHED" and metrics["loss"] == 0.25

    # the logged figures are the audit of the same recording, unrounded
    rec = m.recording
    assert rec is not None and rec.table.num_rows > 0
    report = audit(rec, counts=counts_from(rec))
    total = report.cost.total
    assert math.isclose(metrics["gpuaudit/cost_usd"], float(total.observed_cost), rel_tol=1e-12)
    assert math.isclose(metrics["gpuaudit/waste_usd"], float(total.waste), rel_tol=1e-12)
    assert math.isclose(metrics["gpuaudit/effective_gpu_hours"],
                        float(total.effective_gpu_hours), rel_tol=1e-12)
    assert metrics["gpuaudit/samples"] == 256 and metrics["gpuaudit/tokens"] == 8 * 4096
    assert math.isclose(metrics["gpuaudit/usd_per_sample"],
                        float(total.observed_cost / Decimal(256)), rel_tol=1e-9)
    shares = [metrics[f"gpuaudit/share_pct/{p}"]
              for p in ("idle", "underutilized", "productive", "compute_bound")]
    assert math.isclose(sum(shares), 100.0, rel_tol=1e-9)
    assert metrics["gpuaudit/share_pct/idle"] > 0  # the second fake GPU idles throughout
    assert tags["gpuaudit.sampled"] == "true" and tags["gpuaudit.label.team"] == "vision"
    assert tags["gpuaudit.gpu_models"] == "NVIDIA H100 80GB HBM3"

    # time series: one point per step second at most, within the recording's values
    util0 = client.get_metric_history(run_id, "gpuaudit/gpu0/util_gpu_pct")
    util1 = client.get_metric_history(run_id, "gpuaudit/gpu1/util_gpu_pct")
    assert 0 < len(util0) <= min(1000, rec.table.num_rows)
    assert all(0 <= p.value <= 100 for p in util0) and all(p.value == 0 for p in util1)
    power = client.get_metric_history(run_id, "gpuaudit/gpu0/power_w")
    assert len(power) == len(util0) and all(70 <= p.value <= 700 for p in power)
    # on the training step (m.step() ran 8 times), beside a loss logged per step: not seconds
    assert {p.step for p in util0} <= set(range(0, 9)) and max(p.step for p in util0) >= 6
    cost = sorted(client.get_metric_history(run_id, "gpuaudit/step/cost_usd"),
                  key=lambda p: p.step)
    assert [p.step for p in cost] == list(range(1, 9))
    values = [p.value for p in cost]
    assert values == sorted(values)
    assert math.isclose(cost[-1].value, float(total.observed_cost), rel_tol=1e-9)
    per_step = {p.step: p.value
                for p in client.get_metric_history(run_id, "gpuaudit/step/usd_per_step")}
    assert all(math.isclose(per_step[p.step], p.value / p.step, rel_tol=1e-9) for p in cost)
    hours = client.get_metric_history(run_id, "gpuaudit/step/gpu_hours")
    assert math.isclose(max(p.value for p in hours), float(total.gpu_hours), rel_tol=1e-9)

    # artifacts: the HTML report, the recommendations as Markdown and JSON
    arts = {a.path for a in client.list_artifacts(run_id, "gpuaudit")}
    assert arts == {"gpuaudit/report.html", "gpuaudit/report.json",
                    "gpuaudit/recommendations.md", "gpuaudit/recommendations.json"}
    html = _artifact(client, run_id, "gpuaudit/report.html", tmp_path)
    assert html.lstrip().lower().startswith("<!doctype html")
    md = _artifact(client, run_id, "gpuaudit/recommendations.md", tmp_path)
    top = tags["gpuaudit.top_recommendation"].split(":", 1)[0]
    assert f"| 1 | {top} |" in md


def gpuaudit_monitor(**kwargs: Any) -> Any:
    import gpuaudit

    return gpuaudit.monitor(backend=FakeNvml.backend(TWO_GPUS), hz=50, mlflow=True,
                            quiet=True, **kwargs)


def test_monitor_without_active_run_starts_and_ends_one(
        mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "gpuaudit-monitor")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(mlflow_server)
    assert mlflow.active_run() is None
    with pytest.raises(ZeroDivisionError), gpuaudit_monitor() as m:
        time.sleep(0.2)
        inside = mlflow.active_run()
        assert inside is not None  # the block's own mlflow calls land in the same run
        mlflow.log_metric("inside", 1.0)
        1 / 0  # noqa: B018
    assert mlflow.active_run() is None
    client = _client(mlflow_server)
    got = client.get_run(inside.info.run_id)
    exp = client.get_experiment(got.info.experiment_id)
    assert exp.name == "gpuaudit-monitor"  # MLflow's own experiment choice, from the env
    assert got.info.status == "FAILED" and got.data.tags["gpuaudit.status"] == "failed"
    assert got.data.metrics["inside"] == 1.0 and "gpuaudit/cost_usd" in got.data.metrics
    assert m.tracker_summary is not None and m.tracker_summary.sampled


def _run_cli(args: list[str], env: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUAUDIT, "run", "--hz", "50", "--record",
                           str(tmp / "run.parquet"), *args], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp)


CHILD = ("import mlflow, os, sys, time\n"
         "with mlflow.start_run() as r:\n"
         "    mlflow.log_metric('loss', 0.5)\n"
         "    print('RUN_ID=' + r.info.run_id, flush=True)\n"
         "    time.sleep(0.5)\n"
         "sys.exit(int(sys.argv[1]))\n")


def _child_run_id(stdout: str) -> str:
    return next(ln.split("=", 1)[1] for ln in stdout.splitlines() if ln.startswith("RUN_ID="))


@pytest.mark.parametrize("exit_code", [0, 3])
def test_run_cli_shares_the_run_with_the_workload(mlflow_server: str, libdir: Path,
                                                  tmp_path: Path, exit_code: int) -> None:
    env = fake_gpu_env(libdir, tmp_path, TWO_GPUS)
    env["MLFLOW_TRACKING_URI"] = mlflow_server
    p = _run_cli(["--mlflow", "--label", "team=vision", "--", sys.executable, "-c", CHILD,
                  str(exit_code)], env, tmp_path)
    assert p.returncode == exit_code, p.stderr
    run_id = _child_run_id(p.stdout)  # the run the workload's start_run() resumed
    assert f"logged to MLflow run {run_id}" in p.stderr
    got = _client(mlflow_server).get_run(run_id)
    m, tags = got.data.metrics, got.data.tags
    assert m["loss"] == 0.5 and m["gpuaudit/gpus"] == 2 and m["gpuaudit/cost_usd"] > 0
    assert tags["gpuaudit.exit_code"] == str(exit_code)
    assert tags["gpuaudit.label.team"] == "vision"
    assert tags["gpuaudit.recording"].endswith("run.parquet")
    assert got.info.status == ("FINISHED" if exit_code == 0 else "FAILED")


def test_run_cli_logs_to_mlflow_run_id(mlflow_server: str, libdir: Path,
                                       tmp_path: Path) -> None:
    client = _client(mlflow_server)
    exp = client.create_experiment(f"given-{tmp_path.name}")
    run = client.create_run(exp)
    env = fake_gpu_env(libdir, tmp_path, TWO_GPUS)
    env["MLFLOW_TRACKING_URI"] = mlflow_server
    env["MLFLOW_RUN_ID"] = run.info.run_id
    p = _run_cli(["--mlflow", "--no-report", "--", sys.executable, "-c",
                  "import time; time.sleep(0.4)"], env, tmp_path)
    assert p.returncode == 0, p.stderr
    got = client.get_run(run.info.run_id)
    assert got.data.tags["gpuaudit.sampled"] == "true" and "gpuaudit/waste_usd" in got.data.metrics
    assert got.info.status == "RUNNING"  # a run someone else started is left to them
    assert len(client.search_runs([exp])) == 1  # no second run


def test_run_cli_unknown_mlflow_run_id_fails_before_the_job(mlflow_server: str, libdir: Path,
                                                           tmp_path: Path) -> None:
    env = fake_gpu_env(libdir, tmp_path, TWO_GPUS)
    env["MLFLOW_TRACKING_URI"] = mlflow_server
    env["MLFLOW_RUN_ID"] = "0123456789abcdef0123456789abcdef"
    marker = tmp_path / "ran"
    p = _run_cli(["--mlflow", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                 env, tmp_path)
    assert p.returncode == 2 and p.stderr.startswith("error: cannot open the MLflow run")
    assert "fix:" in p.stderr and not marker.exists()


def test_run_cli_without_gpu_tags_why(mlflow_server: str, libdir: Path, tmp_path: Path) -> None:
    env = fake_gpu_env(libdir, tmp_path, {"missing": ["nvmlInit"]})
    env["MLFLOW_TRACKING_URI"] = mlflow_server
    p = _run_cli(["--mlflow", "--steps", "100", "--", sys.executable, "-c", CHILD, "0"], env,
                 tmp_path)
    assert p.returncode == 0, p.stderr
    run_id = _child_run_id(p.stdout)
    got = _client(mlflow_server).get_run(run_id)
    tags = got.data.tags
    assert tags["gpuaudit.sampled"] == "false"
    # the counted work is kept (issue 26): only what was counted, no invented zeros
    assert {k: v for k, v in got.data.metrics.items() if k.startswith("gpuaudit/")} == {
        "gpuaudit/steps": 100.0}
    assert "libnvidia-ml.so.1" in tags["gpuaudit.not_sampled_reason"]
    assert got.data.metrics["loss"] == 0.5 and got.info.status == "FINISHED"
