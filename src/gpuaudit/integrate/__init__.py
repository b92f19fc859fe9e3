"""integrate stage: gpuaudit talking to other tools.

Grafana dashboards, Prometheus alert rules and the exporter (``grafana``, ``alerts``,
``exporter``); experiment trackers (``trackers``, ``mlflow_tracker``, ``wandb_tracker``) and
training-framework callbacks::

    trainer = L.Trainer(callbacks=[gpuaudit.integrate.LightningCallback()])
    trainer = transformers.Trainer(..., callbacks=[gpuaudit.integrate.HFCallback()])

The callbacks load their framework only when asked for (a missing one raises
:class:`~gpuaudit.errors.MissingExtraError` naming the extra), so importing this package stays
light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuaudit.integrate.hf_callback import HFCallback
    from gpuaudit.integrate.lightning_callback import LightningCallback

__all__ = ["HFCallback", "LightningCallback"]

_LAZY = {"LightningCallback": "gpuaudit.integrate.lightning_callback",
         "HFCallback": "gpuaudit.integrate.hf_callback"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuaudit.integrate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
