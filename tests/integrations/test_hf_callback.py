"""gpuaudit.integrate.HFCallback driving a tiny real GPT-2 (built from a config, no weights
downloaded) through transformers.Trainer on CPU torch, the fake NVML supplying GPU samples:
samples and tokens counted exactly from the batches, epochs marked, the report file, the
same weights with and without it, and the Trainer's own MLflow run (report_to="mlflow")."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from ithelpers import TWO_GPUS

from gpuaudit.measure.live.fake_nvml import FakeNvml

pytestmark = pytest.mark.integrations

N, BATCH, EPOCHS, SEQ = 12, 4, 2, 16


def _dataset() -> list[dict[str, Any]]:
    import torch

    g = torch.Generator().manual_seed(3)
    rows = []
    for i in range(N):
        ids = torch.randint(1, 50, (SEQ,), generator=g)
        mask = torch.ones(SEQ, dtype=torch.long)
        mask[SEQ - (i % 5):] = 0  # some padding, so tokens < samples x SEQ
        rows.append({"input_ids": ids, "attention_mask": mask,
                     "labels": ids.masked_fill(mask == 0, -100)})
    return rows


def _train(out: Path, callbacks: list[Any], report_to: list[str] | str = "none") -> Any:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Slow(transformers.TrainerCallback):
        def on_step_end(self, *a: Any, **k: Any) -> None:
            time.sleep(0.03)

    transformers.set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=SEQ, n_embd=16, n_layer=1,
                                       n_head=2))
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=BATCH,
                             num_train_epochs=EPOCHS, use_cpu=True, report_to=report_to,
                             save_strategy="no", logging_steps=1, seed=0,
                             disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=_dataset(),
                      callbacks=[Slow(), *callbacks])
    trainer.train()
    return model


def test_callback_counts_the_batches_without_changing_training(tmp_path: Path) -> None:
    import torch

    import gpuaudit.integrate

    cb = gpuaudit.integrate.HFCallback({"project": "tiny-gpt2"},
                                       backend=FakeNvml.backend(TWO_GPUS), hz=50, quiet=True)
    measured = _train(tmp_path / "a", [cb])
    plain = _train(tmp_path / "b", [])
    for (k, a), (_, b) in zip(measured.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), k  # bit-identical weights: no effect on the results

    tokens = EPOCHS * sum(int(r["attention_mask"].sum()) for r in _dataset())
    assert tokens < EPOCHS * N * SEQ  # padding is not counted
    assert cb.monitor.totals == {"steps": EPOCHS * N // BATCH, "samples": EPOCHS * N,
                                 "tokens": tokens}
    rec = cb.monitor.recording
    assert rec is not None and rec.table.num_rows > 0
    marks = [text for _, text in json.loads(rec.meta["marks"])]
    assert marks == ["fit start", "epoch 0", "epoch 1"]
    assert not measured._forward_pre_hooks  # the counting hook is gone after training
    html = (tmp_path / "a" / "gpuaudit-report.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html")
    doc = cb.report.to_dict()
    assert doc["cost"]["counts"]["tokens"] == str(float(tokens))
    assert "tokens" in doc["cost"]["unit_costs_usd"]


def test_callback_logs_to_the_trainers_mlflow_run(mlflow_server: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow
    import mlflow.tracking.fluent

    import gpuaudit.integrate

    # the Trainer's MLflowCallback calls mlflow.set_experiment(), a process-wide choice; put
    # it back after this test so later tests see MLflow's choice from their own environment
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf-gpuaudit")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(mlflow_server)
    cb = gpuaudit.integrate.HFCallback(backend=FakeNvml.backend(TWO_GPUS), hz=50, quiet=True)
    _train(tmp_path, [cb], report_to=["mlflow"])
    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("hf-gpuaudit")
    (run,) = client.search_runs([exp.experiment_id])  # one run: the Trainer's, shared
    m = run.data.metrics
    assert "loss" in m or "train_loss" in m  # the Trainer's own metrics, same run
    assert m["gpuaudit/samples"] == EPOCHS * N and m["gpuaudit/tokens"] > 0
    assert m["gpuaudit/usd_per_token"] > 0
    assert run.data.tags["gpuaudit.sampled"] == "true"
