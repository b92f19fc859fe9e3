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

from typing import TYPE_CHECKING

# Entry points whose module has the function's name are bound here, after their module is
# imported (a later `import gpuaudit.api.bill` rebinds nothing); each keeps its heavy imports
# (pyarrow, DuckDB) inside the functions, so `import gpuaudit.api.trace` stays light (issue
# 27). The fleet and queue audits load on first use.
from gpuaudit.api.audit import audit
from gpuaudit.api.bill import BillReport, bill, compare_bills
from gpuaudit.api.compose import CapacityReport, Report, assemble, open_source, rates_for
from gpuaudit.api.rightsize import rightsize
from gpuaudit.api.simulate import simulate
from gpuaudit.api.trace import KernelSummary, kernel_summary, trace

if TYPE_CHECKING:
    from gpuaudit.api.fleet import audit_fleet, fleet_usage, local_kpis
    from gpuaudit.api.queue import QueueAudit, audit_queue

__all__ = ["BillReport", "CapacityReport", "KernelSummary", "QueueAudit", "Report", "assemble",
           "audit", "audit_fleet", "audit_queue", "bill", "compare_bills", "fleet_usage",
           "kernel_summary", "local_kpis", "open_source", "rates_for", "rightsize", "simulate",
           "trace"]

_LAZY = {"audit_fleet": "gpuaudit.api.fleet", "fleet_usage": "gpuaudit.api.fleet",
         "local_kpis": "gpuaudit.api.fleet", "QueueAudit": "gpuaudit.api.queue",
         "audit_queue": "gpuaudit.api.queue"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuaudit.api' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
