"""gpuaudit -> Weights & Biases in offline mode, read back from the run files W&B writes
(``offline-run-*/run-<id>.wandb``, parsed with W&B's own protobuf messages):
`gpuaudit.monitor(wandb=True)`, `gpuaudit run --wandb`, WANDB_RUN_ID, and a GPU-less run."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ithelpers import GPUAUDIT, TWO_GPUS, WandbRun, fake_gpu_env, wandb_runs

from gpuaudit.measure.live.fake_nvml import FakeNvml

pytestmark = pytest.mark.integrations


@pytest.fixture(scope="module")
def wandb_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Offline W&B writing under a temporary folder (W&B reads its settings once per
    process, so one folder for this module's in-process runs)."""
    root = tmp_path_factory.mktemp("wandb")
    saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_DIR", "WANDB_SILENT",
                                            "WANDB_PROJECT", "WANDB_RUN_ID")}
    os.environ.update({"WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true",
                       "WANDB_PROJECT": "gpuaudit-tests"})
    os.environ.pop("WANDB_RUN_ID", None)
    try:
        yield root
    finally:
        import wandb

        wandb.teardown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _monitor(**kwargs: Any) -> Any:
    import gpuaudit

    return gpuaudit.monitor(backend=FakeNvml.backend(TWO_GPUS), hz=50, wandb=True, quiet=True,
                            **kwargs)


def _check_audit(run: WandbRun, rec: Any, samples: float | None) -> None:
    from gpuaudit.api import audit
    from gpuaudit.monitor import counts_from

    total = audit(rec, counts=counts_from(rec)).cost.total
    s = run.summary
    assert math.isclose(float(s["gpuaudit/cost_usd"]), float(total.observed_cost), rel_tol=1e-12)
    assert math.isclose(float(s["gpuaudit/waste_usd"]), float(total.waste), rel_tol=1e-12)
    assert math.isclose(float(s["gpuaudit/effective_gpu_hours"]),
                        float(total.effective_gpu_hours), rel_tol=1e-12)
    assert s.get("gpuaudit/samples") == samples and s["gpuaudit/sampled"] is True
    shares = sum(float(s[f"gpuaudit/share_pct/{p}"])  # type: ignore[arg-type]
                 for p in ("idle", "underutilized", "productive", "compute_bound"))
    assert math.isclose(shares, 100.0, rel_tol=1e-9)
    # time series against their own x-axis, one history row per point, within the data
    rows = [h for h in run.history if "gpuaudit/elapsed_s" in h]
    assert 0 < len(rows) <= min(1000, rec.table.num_rows)
    assert all(0 <= float(h["gpuaudit/gpu0/util_gpu_pct"]) <= 100 for h in rows)  # type: ignore[arg-type]
    assert all(float(h["gpuaudit/gpu1/util_gpu_pct"]) == 0 for h in rows)  # type: ignore[arg-type]
    elapsed = [float(h["gpuaudit/elapsed_s"]) for h in rows]  # type: ignore[arg-type]
    assert elapsed == sorted(elapsed)
    steps = {m.glob_name or m.name: m.step_metric for m in run.of("metric")}
    assert steps["gpuaudit/gpu0/util_gpu_pct"] == "gpuaudit/elapsed_s"
    # recommendations table and HTML panel, and the report artifact
    final = next(h for h in run.history if "gpuaudit/report._type" in h)
    assert final["gpuaudit/report._type"] == "html-file"
    assert final["gpuaudit/recommendations._type"] == "table-file"
    arts = [a for a in run.of("artifact") if a.type == "gpuaudit-report"]
    assert len(arts) == 1 and arts[0].name == f"gpuaudit-report-{run.run_id}"
    assert {c.path for c in arts[0].manifest.contents} == {
        "report.html", "report.json", "recommendations.md", "recommendations.json"}
    config = run.config["gpuaudit"]
    assert isinstance(config, dict) and config["gpuaudit.sampled"] == "true"


def test_monitor_starts_a_run_and_the_block_logs_into_it(wandb_dir: Path) -> None:
    import wandb

    assert wandb.run is None
    with _monitor(labels={"team": "vision"}) as m:
        for _ in range(8):
            time.sleep(0.05)
            m.step(samples=32)
        assert wandb.run is not None
        run_id = wandb.run.id
        # where W&B writes this run (its settings are per process: an earlier test in the
        # same process may have set another folder)
        runs_dir = Path(wandb.run.dir).parents[1]
        wandb.log({"loss": 0.5})
    assert wandb.run is None  # started by the monitor, so finished by it
    (run,) = wandb_runs(runs_dir, run_id)
    _check_audit(run, m.recording, 256.0)
    assert any(h.get("loss") == 0.5 for h in run.history)
    assert run.config["gpuaudit"]["gpuaudit.label.team"] == "vision"  # type: ignore[index]
    # the cost on the training step (8 counted steps), against its own x-axis
    by_step = [h for h in run.history if "gpuaudit/step/cost_usd" in h]
    assert [int(h["gpuaudit/train_step"]) for h in by_step] == list(range(1, 9))  # type: ignore[call-overload]
    costs = [float(h["gpuaudit/step/cost_usd"]) for h in by_step]  # type: ignore[arg-type]
    assert costs == sorted(costs)
    assert math.isclose(costs[-1], float(run.summary["gpuaudit/cost_usd"]), rel_tol=1e-9)  # type: ignore[arg-type]
    axes = {m.glob_name or m.name: m.step_metric for m in run.of("metric")}
    assert axes["gpuaudit/step/usd_per_step"] == "gpuaudit/train_step"
    assert run.exit_code == 0 and "gpuaudit-not-sampled" not in run.tags


def test_monitor_logs_to_the_active_run_and_leaves_it_open(wandb_dir: Path) -> None:
    import wandb

    user = wandb.init(project="gpuaudit-tests")
    try:
        user.log({"loss": 1.0})
        with _monitor() as m:
            time.sleep(0.3)
        assert wandb.run is user  # still the user's, still open
        user.log({"loss": 0.9})
        runs_dir = Path(user.dir).parents[1]
    finally:
        user.finish()
    (run,) = wandb_runs(runs_dir, user.id)
    _check_audit(run, m.recording, None)
    losses = [h["loss"] for h in run.history if "loss" in h]
    assert losses == [1.0, 0.9]  # the user's own history is untouched


def _cli(args: list[str], env: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUAUDIT, "run", "--hz", "50", "--record", str(tmp / "r.parquet"),
                           "--wandb", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp)


CHILD = ("import sys, time, wandb\n"
         "run = wandb.init()\n"
         "print('RUN_ID=' + run.id, flush=True)\n"
         "run.log({'loss': 0.5})\n"
         "time.sleep(0.5)\n"
         "run.finish()\n"
         "sys.exit(int(sys.argv[1]))\n")


def _env(libdir: Path, tmp: Path, scenario: dict[str, Any]) -> dict[str, str]:
    env = fake_gpu_env(libdir, tmp, scenario)
    env.update({"WANDB_MODE": "offline", "WANDB_DIR": str(tmp), "WANDB_SILENT": "true",
                "WANDB_PROJECT": "gpuaudit-cli"})
    return env


@pytest.mark.parametrize("exit_code", [0, 4])
def test_run_cli_joins_the_workloads_run(libdir: Path, tmp_path: Path, exit_code: int) -> None:
    p = _cli(["--label", "team=nlp", "--", sys.executable, "-c", CHILD, str(exit_code)],
             _env(libdir, tmp_path, TWO_GPUS), tmp_path)
    assert p.returncode == exit_code, p.stderr
    run_id = next(ln.split("=", 1)[1] for ln in p.stdout.splitlines()
                  if ln.startswith("RUN_ID="))
    assert f"logged to W&B run {run_id} (gpuaudit-cli, offline)" in p.stderr
    child, ours = wandb_runs(tmp_path, run_id)  # the workload's part, then gpuaudit's
    assert [h["loss"] for h in child.history if "loss" in h] == [0.5]
    assert ours.run_id == child.run_id == run_id
    assert float(ours.summary["gpuaudit/cost_usd"]) > 0  # type: ignore[arg-type]
    assert ours.summary["gpuaudit/gpus"] == 2
    config = ours.config["gpuaudit"]
    assert isinstance(config, dict)
    assert config["gpuaudit.exit_code"] == str(exit_code)
    assert config["gpuaudit.label.team"] == "nlp"
    assert ours.exit_code == (0 if exit_code == 0 else 1)


def test_run_cli_uses_wandb_run_id(libdir: Path, tmp_path: Path) -> None:
    env = _env(libdir, tmp_path, TWO_GPUS)
    env["WANDB_RUN_ID"] = "givenrun01"
    p = _cli(["--no-report", "--", sys.executable, "-c", "import time; time.sleep(0.4)"], env,
             tmp_path)
    assert p.returncode == 0, p.stderr
    (ours,) = wandb_runs(tmp_path, "givenrun01")
    assert ours.summary["gpuaudit/sampled"] is True and "gpuaudit/waste_usd" in ours.summary


def test_run_cli_without_gpu_tags_why(libdir: Path, tmp_path: Path) -> None:
    p = _cli(["--steps", "100", "--", sys.executable, "-c", CHILD, "0"],
             _env(libdir, tmp_path, {"missing": ["nvmlInit"]}), tmp_path)
    assert p.returncode == 0, p.stderr
    run_id = next(ln.split("=", 1)[1] for ln in p.stdout.splitlines()
                  if ln.startswith("RUN_ID="))
    _child, ours = wandb_runs(tmp_path, run_id)
    assert "gpuaudit-not-sampled" in ours.tags
    config = ours.config["gpuaudit"]
    assert isinstance(config, dict) and config["gpuaudit.sampled"] == "false"
    assert "libnvidia-ml.so.1" in str(config["gpuaudit.not_sampled_reason"])
    assert ours.summary["gpuaudit/sampled"] is False
    # the counted work is kept (issue 26), nothing else invented
    assert {k: v for k, v in ours.summary.items() if k.startswith("gpuaudit/")} == {
        "gpuaudit/sampled": False, "gpuaudit/steps": 100.0}
