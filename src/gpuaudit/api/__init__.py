"""The Python API: one typed function per entry point, each returning the report object the
CLI renders; the CLI only parses options and renders (docs/python-api.md).

- :func:`audit` (``api/audit.py``): a file, a recording or a table, through every stage;
- :func:`audit_fleet` (``api/fleet.py``): the fleet in Prometheus, per group;
- :func:`audit_queue` (``api/queue.py``): pods waiting for GPUs, with the scheduling finding;
- :func:`bill` (``api/bill.py``): the cloud bill split over measured GPU time;
- :func:`rightsize` (``api/rightsize.py``): the cheapest GPU that meets the measured need;
- :func:`simulate` (``api/simulate.py``): the history packed by MIG, MPS or time-slicing;
- :func:`trace` and :func:`kernel_summary` (``api/trace.py``): profiler traces, priced;
- :mod:`gpuaudit.api.compose`: what they share: :class:`Report`, :func:`assemble` (price ->
  diagnose -> recommend -> health, composed once), :func:`rates_for`, :func:`open_source`.

Each stage is also callable alone: :func:`gpuaudit.classify.classify`,
:func:`gpuaudit.price.price_usage`, :func:`gpuaudit.recommend.recommend`,
:func:`gpuaudit.report.render`.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuaudit.api.audit import audit
    from gpuaudit.api.bill import BillReport, bill, compare_bills
    from gpuaudit.api.compose import CapacityReport, Report, assemble, open_source, rates_for
    from gpuaudit.api.fleet import audit_fleet, fleet_usage, local_kpis
    from gpuaudit.api.queue import QueueAudit, audit_queue
    from gpuaudit.api.rightsize import rightsize
    from gpuaudit.api.simulate import simulate
    from gpuaudit.api.trace import KernelSummary, kernel_summary, trace

__all__ = ["BillReport", "CapacityReport", "KernelSummary", "QueueAudit", "Report", "assemble",
           "audit", "audit_fleet", "audit_queue", "bill", "compare_bills", "fleet_usage",
           "kernel_summary", "local_kpis", "open_source", "rates_for", "rightsize", "simulate",
           "trace"]

# Each entry point loads its module on first use, so a command imports only its own
# composition (`gpuaudit report` none of bill, fleet, simulate, trace: issue 27).
_HOME = {
    "audit": "audit", "BillReport": "bill", "bill": "bill", "compare_bills": "bill",
    "CapacityReport": "compose", "Report": "compose", "assemble": "compose",
    "open_source": "compose", "rates_for": "compose", "audit_fleet": "fleet",
    "fleet_usage": "fleet", "local_kpis": "fleet", "QueueAudit": "queue",
    "audit_queue": "queue", "rightsize": "rightsize", "simulate": "simulate",
    "KernelSummary": "trace", "kernel_summary": "trace", "trace": "trace",
}


class _Package(types.ModuleType):
    """This package, whose functions named like their modules (``audit``, ``bill``,
    ``rightsize``, ``simulate``, ``trace``) stay the functions when the import system binds
    the submodule of that name on the package, as they were when this file imported them
    all."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and _HOME.get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> object:
        home = _HOME.get(name)
        if home is None:
            raise AttributeError(f"module 'gpuaudit.api' has no attribute {name!r}")
        value = getattr(importlib.import_module(f"gpuaudit.api.{home}"), name)
        super().__setattr__(name, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted({*self.__dict__, *__all__})


sys.modules[__name__].__class__ = _Package
