"""``gpuaudit.integrate.HFCallback``: measure a Hugging Face ``transformers.Trainer`` run.

::

    trainer = transformers.Trainer(..., callbacks=[gpuaudit.integrate.HFCallback()])

Sampling starts at ``on_train_begin`` and stops at ``on_train_end``; each epoch is marked;
every optimizer step counts a step. ``TrainerCallback`` hooks never see the batch, so samples
and tokens are read off each training batch by a forward pre-hook on the model that only
reads its inputs (``input_ids``, ``attention_mask``; :func:`~gpuaudit.integrate.fit.count_batch`)
and returns nothing, leaving the forward pass unchanged; it is removed at train end. Only
the main process (``state.is_world_process_zero``) measures; counts are its batches times
``args.world_size``. The report goes to ``args.output_dir/gpuaudit-report.html`` unless
``report_path`` says otherwise.

Trackers: ``mlflow``/``wandb`` None (default) logs to the run the Trainer itself reports to
(``"mlflow"`` / ``"wandb"`` in ``args.report_to``: its integration callback has started the
run before this one runs); True always; False never.

Needs ``pip install 'gpuaudit[hf]'`` (``transformers``, ``accelerate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuaudit.integrate.fit import BatchCounter, FitAudit, count_batch
from gpuaudit.integrate.trackers import require

__all__ = ["HFCallback"]

_transformers = require("transformers", "hf", "HFCallback")


def _reports_to(args: Any, name: str) -> bool:
    report_to = getattr(args, "report_to", None) or []
    if isinstance(report_to, str):
        report_to = [report_to]
    return name in report_to or "all" in report_to


class HFCallback(_transformers.TrainerCallback):  # type: ignore[misc,name-defined]
    """Measures a ``transformers.Trainer`` run with gpuaudit (see the module doc)."""

    def __init__(self, labels: Mapping[str, str] | None = None, *,
                 report_path: str | Path | None = None, count: BatchCounter | None = None,
                 mlflow: bool | None = None, wandb: bool | None = None, quiet: bool = False,
                 **monitor_kwargs: Any) -> None:
        self.audit = FitAudit(labels, report_path=report_path, quiet=quiet, **monitor_kwargs)
        self._count = count or count_batch
        self.mlflow = mlflow
        self.wandb = wandb
        self._hook: Any = None
        # counted since the last optimizer step (tokens may be a device tensor: no sync)
        self._samples: Any = None
        self._tokens: Any = None

    @property
    def monitor(self) -> Any:
        return self.audit.monitor

    @property
    def report(self) -> Any:
        return self.audit.report

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        use_mlflow = self.mlflow if self.mlflow is not None else _reports_to(args, "mlflow")
        use_wandb = self.wandb if self.wandb is not None else _reports_to(args, "wandb")
        self.audit.count = self._count_pending
        self.audit.start(is_zero=True, world_size=getattr(args, "world_size", 1),
                         default_dir=args.output_dir, mlflow=use_mlflow, wandb=use_wandb)
        if model is not None and hasattr(model, "register_forward_pre_hook"):
            self._hook = model.register_forward_pre_hook(self._see_inputs, with_kwargs=True)

    def _see_inputs(self, module: Any, args: Any, kwargs: Any) -> None:
        """Forward pre-hook: count what a training forward pass was given; change nothing."""
        if not module.training:
            return
        s, t = self._count(kwargs if kwargs else args)
        if s is not None:
            self._samples = s if self._samples is None else self._samples + s
        if t is not None:
            self._tokens = t if self._tokens is None else self._tokens + t

    def _count_pending(self, _: Any) -> tuple[Any, Any]:
        out = (self._samples, self._tokens)
        self._samples = self._tokens = None
        return out

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.audit.mark(f"epoch {int(state.epoch or 0)}")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.audit.batch(None)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.audit.end()
