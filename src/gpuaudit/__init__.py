"""gpuaudit: where GPU time goes, what it costs, and what to change.

The pipeline runs one way: measure -> classify -> price -> recommend -> report. Each stage
is callable on its own; the entry points compose them, one typed function per CLI command
(docs/python-api.md): :func:`audit`, :func:`audit_fleet`, :func:`audit_queue`, :func:`bill`,
:func:`rightsize`, :func:`simulate`, :func:`trace`, :func:`kernel_summary`, :func:`monitor`.

``import gpuaudit`` stays light: each name loads its module on first use (``__getattr__``);
type checkers see the real types through the ``TYPE_CHECKING`` imports below. Every error
the API raises for bad input is an :class:`~gpuaudit.errors.InputError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    # from the defining modules: gpuaudit.api.audit (the module) and gpuaudit.api.audit (the
    # function it re-exports) share a name, which type checkers resolve to the module
    from gpuaudit.api.audit import audit
    from gpuaudit.api.bill import BillReport, bill
    from gpuaudit.api.compose import CapacityReport, Report
    from gpuaudit.api.fleet import audit_fleet
    from gpuaudit.api.queue import QueueAudit, audit_queue
    from gpuaudit.api.rightsize import rightsize
    from gpuaudit.api.simulate import simulate
    from gpuaudit.api.trace import KernelSummary, kernel_summary, trace
    from gpuaudit.errors import GpuauditError, InputError, PricingError
    from gpuaudit.monitor import Monitor, monitor, monitored

__all__ = ["BillReport", "CapacityReport", "GpuauditError", "InputError", "KernelSummary",
           "Monitor", "PricingError", "QueueAudit", "Report", "__version__", "audit",
           "audit_fleet", "audit_queue", "bill", "kernel_summary", "monitor", "monitored",
           "rightsize", "simulate", "trace"]

_LAZY = {"monitor": "gpuaudit.monitor", "monitored": "gpuaudit.monitor",
         "Monitor": "gpuaudit.monitor",
         "GpuauditError": "gpuaudit.errors", "InputError": "gpuaudit.errors",
         "PricingError": "gpuaudit.errors",
         **{name: "gpuaudit.api" for name in (
             "BillReport", "CapacityReport", "KernelSummary", "QueueAudit", "Report", "audit",
             "audit_fleet", "audit_queue", "bill", "kernel_summary", "rightsize", "simulate",
             "trace")}}


def __getattr__(name: str) -> object:
    # load the pipeline and the sampler only when used, keeping `import gpuaudit` light
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuaudit' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # replaces the submodule attribute the import just set
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
