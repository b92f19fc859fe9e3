"""``gpuaudit.integrate.LightningCallback``: measure a PyTorch Lightning fit.

::

    trainer = L.Trainer(callbacks=[gpuaudit.integrate.LightningCallback()])

Sampling starts at ``on_fit_start`` and stops at ``on_fit_end`` (or on an exception); each
training epoch is marked; each training batch counts a step and its samples and tokens
(:func:`~gpuaudit.integrate.fit.count_batch`). Only global rank 0 measures (it sees every
GPU of its node; counts are rank 0's batches times the world size). The report is written to
``trainer.default_root_dir/gpuaudit-report.html`` unless ``report_path`` says otherwise.

Trackers: ``mlflow``/``wandb`` None (default) logs to the trainer's own ``MLFlowLogger`` /
``WandbLogger`` run when it has one; True logs to that run or else the active / environment
run (:mod:`gpuaudit.integrate.trackers`); False never.

Needs ``pip install 'gpuaudit[lightning]'`` (``lightning``); the standalone
``pytorch_lightning`` package is used when ``lightning`` is not installed.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuaudit.integrate.fit import BatchCounter, FitAudit
from gpuaudit.integrate.trackers import require

__all__ = ["LightningCallback"]


def _callback_base() -> Any:
    try:
        return importlib.import_module("lightning.pytorch").Callback
    except ImportError:
        pass
    try:
        return importlib.import_module("pytorch_lightning").Callback
    except ImportError:
        return require("lightning.pytorch", "lightning", "LightningCallback").Callback


def _trackers(trainer: Any, mlflow: bool | None, wandb: bool | None) -> tuple[list[Any], bool, bool]:
    """Tracker objects for the trainer's own logger runs, and which trackers to find by
    environment instead."""
    found: list[Any] = []
    has_mlflow = has_wandb = False
    for logger in getattr(trainer, "loggers", None) or []:
        kind = type(logger).__name__
        if kind == "MLFlowLogger" and mlflow is not False:
            from gpuaudit.integrate.mlflow_tracker import MlflowTracker

            found.append(MlflowTracker(run_id=str(logger.run_id),
                                       tracking_uri=getattr(logger, "_tracking_uri", None)))
            has_mlflow = True
        elif kind == "WandbLogger" and wandb is not False:
            from gpuaudit.integrate.wandb_tracker import WandbTracker

            found.append(WandbTracker(run=logger.experiment))
            has_wandb = True
    return found, bool(mlflow) and not has_mlflow, bool(wandb) and not has_wandb


class _LightningCallback(_callback_base()):  # type: ignore[misc]
    """Measures a Lightning fit with gpuaudit (see the module doc)."""

    def __init__(self, labels: Mapping[str, str] | None = None, *,
                 report_path: str | Path | None = None, count: BatchCounter | None = None,
                 mlflow: bool | None = None, wandb: bool | None = None, quiet: bool = False,
                 **monitor_kwargs: Any) -> None:
        super().__init__()
        self.audit = FitAudit(labels, report_path=report_path, count=count, quiet=quiet,
                              **monitor_kwargs)
        self.mlflow = mlflow
        self.wandb = wandb

    @property
    def monitor(self) -> Any:
        return self.audit.monitor

    @property
    def report(self) -> Any:
        return self.audit.report

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.is_global_zero:
            return
        trackers, by_env_mlflow, by_env_wandb = _trackers(trainer, self.mlflow, self.wandb)
        self.audit.start(is_zero=True, world_size=trainer.world_size,
                         default_dir=trainer.default_root_dir, trackers=trackers,
                         mlflow=by_env_mlflow, wandb=by_env_wandb)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.audit.mark(f"epoch {trainer.current_epoch}")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.audit.batch(batch)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.audit.end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.audit.end(failed=True)


LightningCallback = _LightningCallback
