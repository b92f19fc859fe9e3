"""gpuaudit.integrate.LightningCallback driving a tiny real model on CPU torch, the fake NVML
supplying GPU samples: counts, marks, the report file, the same weights with and without it,
the trainer's own MLFlowLogger run, and rank 0 only under a real 2-process DDP run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from ithelpers import TWO_GPUS

from gpuaudit.measure.live.fake_nvml import FakeNvml

pytestmark = pytest.mark.integrations

N, BATCH, EPOCHS = 64, 16, 2

MODEL = '''
import time
import torch
import lightning as L

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.2), torch.nn.Linear(16, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(0.03)  # long enough for the 50 Hz sampler to see each step
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

def loader(n, batch):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch,
                                       shuffle=True)
'''


def _ns() -> dict[str, Any]:
    ns: dict[str, Any] = {}
    exec(MODEL, ns)
    return ns


def _fit(tmp: Path, callbacks: list[Any], logger: Any = False) -> Any:
    import lightning as L

    ns = _ns()
    L.seed_everything(0, workers=True)
    model = ns["Tiny"]()
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, logger=logger,
                        callbacks=callbacks, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp), deterministic=True, log_every_n_steps=1)
    trainer.fit(model, ns["loader"](N, BATCH))
    return model


def test_callback_measures_without_changing_training(tmp_path: Path) -> None:
    import torch

    import gpuaudit.integrate

    cb = gpuaudit.integrate.LightningCallback({"team": "vision"}, backend=FakeNvml.backend(TWO_GPUS),
                                              hz=50, quiet=True)
    measured = _fit(tmp_path / "a", [cb])
    plain = _fit(tmp_path / "b", [])
    for (k, a), (_, b) in zip(measured.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), k  # bit-identical weights: no effect on the results

    steps = EPOCHS * N // BATCH
    assert cb.monitor.totals == {"steps": steps, "samples": EPOCHS * N, "tokens": None}
    rec = cb.monitor.recording
    assert rec is not None and rec.table.num_rows > 0
    marks = [text for _, text in json.loads(rec.meta["marks"])]
    assert marks == ["fit start", "epoch 0", "epoch 1"]
    assert json.loads(rec.meta["counters"])["samples"] == EPOCHS * N
    assert dict(rec.table.column("labels")[0].as_py()) == {"team": "vision"}
    report = tmp_path / "a" / "gpuaudit-report.html"
    assert report.read_text().lstrip().lower().startswith("<!doctype html")
    doc = cb.report.to_dict()
    assert doc["cost"]["counts"]["samples"] == str(float(EPOCHS * N))
    assert "samples" in doc["cost"]["unit_costs_usd"]


def test_callback_logs_to_the_trainers_mlflow_run(mlflow_server: str, tmp_path: Path) -> None:
    import mlflow
    from lightning.pytorch.loggers import MLFlowLogger

    import gpuaudit.integrate

    logger = MLFlowLogger(experiment_name="lightning-gpuaudit", tracking_uri=mlflow_server)
    cb = gpuaudit.integrate.LightningCallback(backend=FakeNvml.backend(TWO_GPUS), hz=50,
                                              quiet=True, report_path=tmp_path / "r.json")
    _fit(tmp_path, [cb], logger=logger)
    run = mlflow.MlflowClient(tracking_uri=mlflow_server).get_run(logger.run_id)
    m = run.data.metrics
    assert "train_loss" in m  # Lightning's own metric, same run
    assert m["gpuaudit/samples"] == EPOCHS * N and m["gpuaudit/steps"] == EPOCHS * N // BATCH
    assert m["gpuaudit/usd_per_sample"] > 0
    assert run.data.tags["gpuaudit.sampled"] == "true"
    assert json.loads((tmp_path / "r.json").read_text())["schema"] == "gpuaudit.report"


DDP = '''
import json, sys
import lightning as L
import gpuaudit.integrate
from gpuaudit.measure.live.fake_nvml import FakeNvml
{model}
if __name__ == "__main__":
    out = sys.argv[1]
    L.seed_everything(0)
    cb = gpuaudit.integrate.LightningCallback(
        backend=FakeNvml.backend({scenario}), hz=50, process=False, report_path=out + "/report.html")
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp",
                        logger=False, callbacks=[cb], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=out)
    trainer.fit(Tiny(), loader({n}, {batch}))
    totals = cb.monitor.totals if cb.monitor is not None else None
    print("RANK", trainer.global_rank, "MEASURED", json.dumps(totals), flush=True)
'''


def test_ddp_rank_zero_only(tmp_path: Path) -> None:
    script = tmp_path / "ddp_train.py"
    script.write_text(textwrap.dedent(DDP).format(model=MODEL, scenario=repr(TWO_GPUS), n=N,
                                                  batch=BATCH))
    p = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                       text=True, timeout=540, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = sorted(ln for ln in p.stdout.splitlines() if ln.startswith("RANK"))
    assert len(lines) == 2, p.stdout
    # rank 0 measured: its N / 2 samples per epoch times the world size of 2; rank 1 did not
    assert lines[0] == f'RANK 0 MEASURED {json.dumps({"steps": N // 2 // BATCH, "samples": N, "tokens": None})}'
    assert lines[1] == "RANK 1 MEASURED null"
    assert p.stderr.count("gpuaudit: report written to") == 1
    assert (tmp_path / "report.html").exists()


def test_callback_logs_to_the_trainers_wandb_run(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb
    from ithelpers import wandb_runs
    from lightning.pytorch.loggers import WandbLogger

    import gpuaudit.integrate

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    logger = WandbLogger(project="lightning-gpuaudit", save_dir=str(tmp_path), offline=True)
    cb = gpuaudit.integrate.LightningCallback(backend=FakeNvml.backend(TWO_GPUS), hz=50,
                                              quiet=True)
    try:
        _fit(tmp_path, [cb], logger=logger)
        run_id = logger.experiment.id
    finally:
        wandb.finish()  # the logger's run is Lightning's and the user's to end, not ours
    (run,) = wandb_runs(tmp_path, run_id)
    assert any("train_loss" in h for h in run.history)  # Lightning's own metric, same run
    s = run.summary
    assert s["gpuaudit/samples"] == EPOCHS * N and s["gpuaudit/steps"] == EPOCHS * N // BATCH
    assert s["gpuaudit/sampled"] is True and float(s["gpuaudit/cost_usd"]) > 0  # type: ignore[arg-type]
    assert any(a.type == "gpuaudit-report" for a in run.of("artifact"))
