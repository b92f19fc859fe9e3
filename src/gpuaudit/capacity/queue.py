"""Queue waits: how long pods that request GPUs wait in Pending, beside the GPUs idle meanwhile.

From kube-state-metrics in Prometheus, through any client with chunked range queries
(``RangeClient``; the CLI passes :class:`gpuaudit.measure.fleet.prometheus.PromClient`, since a
stage never imports a source):

- ``kube_pod_status_phase{phase="Pending"} == 1``: the steps each pod spends pending;
- ``kube_pod_container_resource_requests{resource="nvidia_com_gpu"}`` (summed over a pod's
  containers): the GPUs it asks for. Only pods asking for at least one GPU count.

A *wait* is one unbroken run of pending steps of one pod; its length is the number of steps x
the step (so waits are resolved to the step: ``--step``, default 1 minute). Per namespace:
the number of waits, p50 / p95 / max wait, and the GPU-hours asked for while waiting.

Beside them, from dcgm-exporter: GPUs idle (utilization below 10 %) per step, and of those the
ones no pod holds (no ``exported_pod``/``pod`` workload label). Idle GPU-hours no one held
while GPU pods waited are a scheduling finding (quotas, node selectors, fragmentation or MIG
layouts keep work from capacity that exists).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol

import numpy as np

from gpuaudit.classify.usage import IDLE_BELOW_PCT
from gpuaudit.errors import InputError, PricingError
from gpuaudit.price.catalog import Rate
from gpuaudit.promql import fresh

__all__ = ["NamespaceWaits", "QueueReport", "idle_while_waiting_usd", "queue_waits", "wait_runs"]

PENDING = ('(max by (namespace, pod) (kube_pod_status_phase{phase="Pending"}) == 1) '
           '* on (namespace, pod) group_left() '
           '(sum by (namespace, pod) '
           '(kube_pod_container_resource_requests{resource="nvidia_com_gpu"}) > 0)')


class RangeSeries(Protocol):
    """One series of a range answer: labels, timestamps (ns) and values."""

    @property
    def labels(self) -> dict[str, str]: ...

    @property
    def ts_ns(self) -> np.ndarray: ...

    @property
    def values(self) -> np.ndarray: ...


class RangeClient(Protocol):
    """What queue waits need of a Prometheus client: chunked range queries and its URL."""

    url: str

    def query_range(self, expr: str, start_s: float, end_s: float, step_s: float
                    ) -> Iterable[Sequence[RangeSeries]]: ...


def _idle_expr(step_s: float) -> str:
    u = fresh("DCGM_FI_DEV_GPU_UTIL", step_s)
    return (f"count by (exported_pod, pod, exported_namespace, modelName) "
            f"({u} < {IDLE_BELOW_PCT:g})")


@dataclass(frozen=True)
class NamespaceWaits:
    namespace: str
    waits: int
    pods: int
    p50_s: float
    p95_s: float
    max_s: float
    pending_gpu_hours: float
    idle_gpu_hours: float  # GPUs this namespace's pods held while idle, same period


@dataclass(frozen=True)
class QueueReport:
    url: str
    start_s: float
    end_s: float
    step_s: float
    namespaces: tuple[NamespaceWaits, ...]
    idle_gpu_hours: float
    idle_unheld_gpu_hours: float
    idle_unheld_while_waiting_gpu_hours: float
    waiting_steps: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: ``idle_unheld_while_waiting_gpu_hours`` split by GPU model (dcgm-exporter's
    #: ``modelName``; "" where the label is missing), to price them at each model's rate
    idle_unheld_while_waiting_gpu_hours_by_model: Mapping[str, float] = field(
        default_factory=dict)
    #: whether dcgm-exporter reported any idle GPU in the range (no: no scheduling finding)
    saw_dcgm: bool = True

    @property
    def total_waits(self) -> int:
        return sum(n.waits for n in self.namespaces)


def wait_runs(pending: np.ndarray) -> np.ndarray:
    """Lengths (in steps) of the unbroken True runs of a boolean series."""
    x = np.r_[False, pending.astype(bool), False].astype(np.int8)
    d = np.diff(x)
    return np.flatnonzero(d == -1) - np.flatnonzero(d == 1)


def _grid(ts_ns: np.ndarray, values: np.ndarray, start_s: float, step_s: float, steps: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """Step indices of a range result's points inside the grid, and their values."""
    idx = np.round((ts_ns / 1e9 - start_s) / step_s).astype(np.int64)
    keep = (idx >= 0) & (idx < steps)
    return idx[keep], values[keep]


def queue_waits(client: RangeClient, *, start_s: float, end_s: float, step_s: float = 60.0,
                namespaces: Sequence[str] = ()) -> QueueReport:
    """The wait distribution per namespace and the idle capacity beside it (module doc)."""
    if end_s <= start_s:
        raise InputError("the range is empty (--end is not after --start)",
                         fix="give --since, or --start before --end")
    start = (start_s // step_s + 1) * step_s
    end = (end_s // step_s) * step_s
    steps = round((end - start) / step_s) + 1
    pending_by_pod: dict[tuple[str, str], np.ndarray] = {}
    gpus_by_pod: dict[tuple[str, str], np.ndarray] = {}
    for res in client.query_range(PENDING, start, end, step_s):
        for r in res:
            key = (r.labels.get("namespace", ""), r.labels.get("pod", ""))
            if namespaces and key[0] not in namespaces:
                continue
            pend = pending_by_pod.setdefault(key, np.zeros(steps, dtype=bool))
            gp = gpus_by_pod.setdefault(key, np.zeros(steps))
            idx, vals = _grid(r.ts_ns, r.values, start, step_s, steps)
            pend[idx] = True
            gp[idx] = vals
    idle_all = np.zeros(steps)
    idle_unheld = np.zeros(steps)
    idle_unheld_by_model: dict[str, np.ndarray] = {}
    idle_by_ns: dict[str, float] = {}
    saw_dcgm = False
    for res in client.query_range(_idle_expr(step_s), start, end, step_s):
        for r in res:
            saw_dcgm = True
            idx, vals = _grid(r.ts_ns, r.values, start, step_s, steps)
            idle_all[idx] += vals
            pod = r.labels.get("exported_pod") or ""
            ns = r.labels.get("exported_namespace") or ""
            if not pod:
                idle_unheld[idx] += vals
                m = idle_unheld_by_model.setdefault(r.labels.get("modelName") or "",
                                                    np.zeros(steps))
                m[idx] += vals
            else:
                idle_by_ns[ns] = idle_by_ns.get(ns, 0.0) + float(vals.sum()) * step_s / 3600
    notes = []
    if not pending_by_pod:
        notes.append("no pod requesting nvidia.com/gpu was Pending in the range "
                     "(kube-state-metrics kube_pod_status_phase and "
                     "kube_pod_container_resource_requests)")
    if not saw_dcgm:
        notes.append("no idle GPU found in DCGM_FI_DEV_GPU_UTIL over the range (or no "
                     "dcgm-exporter series): idle hours are 0")
    waiting = np.zeros(steps)
    per_ns: dict[str, list[float]] = {}
    pods_ns: dict[str, int] = {}
    gpu_h_ns: dict[str, float] = {}
    for (ns, _pod), pend in pending_by_pod.items():
        runs = wait_runs(pend) * step_s
        per_ns.setdefault(ns, []).extend(float(x) for x in runs)
        pods_ns[ns] = pods_ns.get(ns, 0) + 1
        g = gpus_by_pod[(ns, _pod)]
        waiting += np.where(pend, g, 0.0)
        gpu_h_ns[ns] = gpu_h_ns.get(ns, 0.0) + float(g[pend].sum()) * step_s / 3600
    rows = []
    for ns in sorted(set(per_ns) | (set(idle_by_ns) - {""})):
        w = np.asarray(per_ns.get(ns, []))
        rows.append(NamespaceWaits(
            namespace=ns, waits=int(w.size), pods=pods_ns.get(ns, 0),
            p50_s=float(np.percentile(w, 50)) if w.size else 0.0,
            p95_s=float(np.percentile(w, 95)) if w.size else 0.0,
            max_s=float(w.max()) if w.size else 0.0,
            pending_gpu_hours=gpu_h_ns.get(ns, 0.0),
            idle_gpu_hours=idle_by_ns.get(ns, 0.0)))
    usable = np.minimum(idle_unheld, waiting)
    # the usable GPU-hours of a step are shared among the models idle then, pro rata
    share = np.divide(usable, idle_unheld, out=np.zeros(steps), where=idle_unheld > 0)
    by_model = {m: float((a * share).sum()) * step_s / 3600
                for m, a in sorted(idle_unheld_by_model.items())}
    return QueueReport(
        url=client.url, start_s=start, end_s=end, step_s=step_s, namespaces=tuple(rows),
        idle_gpu_hours=float(idle_all.sum()) * step_s / 3600,
        idle_unheld_gpu_hours=float(idle_unheld.sum()) * step_s / 3600,
        idle_unheld_while_waiting_gpu_hours=float(usable.sum()) * step_s / 3600,
        waiting_steps=int((waiting > 0).sum()), notes=tuple(notes),
        idle_unheld_while_waiting_gpu_hours_by_model={m: h for m, h in by_model.items()
                                                      if h > 0},
        saw_dcgm=saw_dcgm)


def idle_while_waiting_usd(report: QueueReport, rates: Mapping[str | None, Rate]) -> Decimal:
    """What the GPU-hours idle and unheld while GPU pods waited cost, each model's hours at
    its rate. ``rates`` are the fleet audit's of the same range, keyed as its series name the
    model: dcgm-exporter's ``modelName`` (None where the label is missing), so every model
    the idle query saw has one."""
    total = Decimal(0)
    for model, hours in report.idle_unheld_while_waiting_gpu_hours_by_model.items():
        rate = rates.get(model or None)
        if rate is None:
            raise PricingError(
                f"no rate for GPU model {model or '(no modelName label)'!r} of the idle GPUs: "
                "the fleet audit of the range did not see it",
                fix="gpuaudit queue --no-plan gives the waits alone; gpuaudit fleet audits "
                "the range")
        total += Decimal(str(hours)) * rate.usd_per_gpu_hour
    return total


def idle_while_waiting_sentence(report: QueueReport, usd: Decimal, observed_usd: Decimal) -> str:
    """The scheduling finding's sentence: the GPU-hours idle and held by no pod while GPU pods
    waited, costing ``usd`` of the ``observed_usd`` the fleet audit of the range measured."""
    from gpuaudit.units import duration

    p95 = max((n.p95_s for n in report.namespaces if n.waits), default=0.0)
    return (f"queue: {report.idle_unheld_while_waiting_gpu_hours:.1f} GPU-hours idle and held "
            f"by no pod while GPU pods waited ({report.total_waits} waits, longest p95 "
            f"{duration(p95)}): ${usd:.2f} of ${observed_usd:.2f} observed")
