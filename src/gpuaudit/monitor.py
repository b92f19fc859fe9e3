"""Measure a block of Python code or a function: ``gpuaudit.monitor`` and ``gpuaudit.monitored``.

::

    with gpuaudit.monitor(labels={"team": "vision"}) as m:
        for batch in loader:
            train_step(batch)
            m.step(samples=len(batch))
    print(m.report())

    @gpuaudit.monitored(labels={"project": "resnet"})
    def train(): ...

Sampling runs in a background thread (see :mod:`gpuaudit.measure.live.sampler`), or, at 50 Hz
and above or with ``process=True``, in a separate process that owns NVML and the recording
(:mod:`gpuaudit.measure.live.sampler_process`): a GIL-bound workload cannot slow it, and a crash
or hang of the sampler cannot hurt the workload. ``m.mark``/``m.step`` only append to a list
there; a thread sends them over in batches. Measurement
never stands between a user and their job: without an NVIDIA driver or GPU the block runs
unmeasured, one line on stderr says why, and :meth:`Monitor.report` says nothing was sampled.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from gpuaudit.errors import SourceUnavailableError
from gpuaudit.schema import Recording
from gpuaudit.validate import FLUSH_S, HZ, check_output_path

__all__ = ["Monitor", "monitor", "monitored", "render_report"]

F = TypeVar("F", bound=Callable[..., Any])


def render_report(recording: Recording | None, fmt: str = "terminal", *,
                  unavailable: str | None = None, **pricing: Any) -> str:
    """The report on a recording: ``gpuaudit.api.audit(recording, **pricing).render(fmt)``.

    When nothing was sampled, a plain sentence saying why.
    """
    if recording is None or recording.table.num_rows == 0:
        why = unavailable or "no samples were taken"
        return f"gpuaudit: nothing sampled: {why}\n"
    from gpuaudit.api import audit

    if "counts" not in pricing:
        pricing["counts"] = counts_from(recording)
    result = audit(recording, **pricing)
    text: str = result.render(fmt)
    return text


def counts_from(recording: Recording) -> dict[str, float] | None:
    """Units of work the recording counted (``m.step(samples=..., tokens=...)``)."""
    import json

    raw = json.loads(recording.meta.get("counters", "{}") or "{}")
    counts = {k: float(v) for k, v in raw.items() if v}
    return counts or None


class Monitor:
    """A running measurement: counters, marks, and the recording once stopped.

    ``backend`` defaults to :class:`~gpuaudit.measure.live.nvml.NvmlBackend` (every GPU visible
    to this process). ``output`` streams the recording to a Parquet path as it is sampled;
    ``output_mode`` says what to do when that path already holds a recording: ``create``
    (default) refuses it, ``force`` replaces it, ``append`` continues it.
    ``process``: True samples in a separate process, False in a thread, None (default)
    chooses the process at ``hz >= 50`` when the backend can be sent there.
    ``cpu``: how the CPU is read (None: psutil; False: not; a
    :class:`~gpuaudit.measure.live.cpu.CpuReader` such as ``FakeCpu``): the host's CPU and
    this process's tree (this process and its descendants, DataLoader workers included; the
    sampling process left out) beside the GPUs.

    ``mlflow=True`` / ``wandb=True`` log the audit to the active run of that tracker when
    sampling stops (see docs/integrations.md); ``trackers`` passes tracker objects directly
    (:mod:`gpuaudit.integrate.trackers`). ``pricing``: :func:`gpuaudit.audit` keywords for
    the logged audit (``price``, ``provider``, ...).
    """

    def __init__(
        self,
        labels: Mapping[str, str] | None = None,
        *,
        hz: float = 10.0,
        output: str | os.PathLike[str] | None = None,
        backend: Any = None,
        flush_s: float = 5.0,
        quiet: bool = False,
        process: bool | None = None,
        mlflow: bool = False,
        wandb: bool = False,
        trackers: Sequence[Any] = (),
        pricing: Mapping[str, Any] | None = None,
        output_mode: str = "create",
        cpu: Any = None,
    ) -> None:
        hz = HZ.check(hz, "hz")
        FLUSH_S.check(flush_s, "flush_s")
        if output is not None:
            check_output_path(output, "output")
        self.labels = dict(labels or {})
        self.hz = float(hz)
        self.output = output
        self.output_mode = output_mode
        self.quiet = quiet
        self.unavailable: str | None = None
        self.recording: Recording | None = None
        self._backend = backend
        self._flush_s = flush_s
        self._process = process
        self._cpu = cpu
        self._sampler: Any = None
        self._totals: dict[str, float | None] = {"steps": 0, "samples": None, "tokens": None}
        self._marks: list[str] = []
        from gpuaudit.integrate.trackers import StepLog

        #: when the step counter reached each value (the trackers' training-step axis)
        self.step_log = StepLog()
        self.pricing = dict(pricing or {})
        self.trackers: list[Any] = list(trackers)
        if mlflow or wandb:
            from gpuaudit.integrate.tracker_runs import make_trackers

            # a missing extra raises MissingExtraError here, naming it
            self.trackers += make_trackers(mlflow=mlflow, wandb=wandb)
        self._logged = not self.trackers
        self.tracker_summary: Any = None

    def start(self) -> Monitor:
        if self.trackers:
            from gpuaudit.integrate.tracker_runs import begin_trackers

            begin_trackers(self.trackers)
        from gpuaudit.measure.live.nvml import NvmlBackend
        from gpuaudit.measure.live.sampler import Sampler

        backend = self._backend if self._backend is not None else NvmlBackend()
        sampler = Sampler(backend, interval_s=1.0 / self.hz, labels=self.labels,
                          output=self.output, flush_s=self._flush_s, process=self._process,
                          output_mode=self.output_mode,
                          cpu=self._cpu, cpu_pid=os.getpid(),
                          origin=f"live NVML sampling by gpuaudit.monitor (labels "
                          f"{self.labels or {}})")
        try:
            sampler.start()
        except SourceUnavailableError as exc:
            self.unavailable = str(exc).replace("\n", " ")
            if not self.quiet:
                print(f"gpuaudit: nothing will be sampled: {self.unavailable}",
                      file=sys.stderr)
            return self
        self._sampler = sampler
        return self

    def stop(self, *, failed: bool = False) -> Recording | None:
        """Stop sampling and finalise the recording (idempotent); then log to the trackers
        (once). ``failed``: the measured work raised (a tracker run this monitor started is
        marked failed)."""
        if self._sampler is not None and self.recording is None:
            self.recording = self._sampler.stop()
        if not self._logged:
            self._logged = True
            self._log_trackers(failed)
        return self.recording

    def _log_trackers(self, failed: bool) -> None:
        from gpuaudit.integrate.tracker_runs import finish_trackers
        from gpuaudit.integrate.trackers import nothing_sampled, summarize

        def say(text: str) -> None:
            if not self.quiet:
                print(text, file=sys.stderr)

        rec = self.recording
        counts = {k: float(v) for k, v in self._totals.items() if v}
        try:
            if rec is None or rec.table.num_rows == 0:
                why = self.unavailable or "the work ended before the first sample"
                summary = nothing_sampled(why, labels=self.labels, counts=counts)
            else:
                from gpuaudit.api import audit

                pricing = dict(self.pricing)
                pricing.setdefault("counts", counts_from(rec))
                summary = summarize(audit(rec, **pricing), labels=self.labels,
                                    recording_path=None if self.output is None
                                    else str(self.output), samples=rec.table,
                                    steps=self.step_log.arrays() if len(self.step_log)
                                    else None)
        except Exception as exc:  # the user's work matters more than our logging
            summary = nothing_sampled(f"the audit failed: {type(exc).__name__}: {exc}",
                                      labels=self.labels, counts=counts)
        self.tracker_summary = summary
        finish_trackers(self.trackers, summary, failed=failed, say=say)

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stop(failed=exc_type is not None)

    def step(self, steps: int = 1, *, samples: float | None = None,
             tokens: float | None = None) -> None:
        """Count a training/inference step and, optionally, samples and tokens in it."""
        t = self._totals
        t["steps"] = (t["steps"] or 0) + steps
        if steps:
            self.step_log.add(time.time_ns(), int(t["steps"] or 0))
        if samples is not None:
            t["samples"] = (t["samples"] or 0) + samples
        if tokens is not None:
            t["tokens"] = (t["tokens"] or 0) + tokens
        if self._sampler is not None:
            self._sampler.step(steps, samples, tokens)

    def mark(self, text: str) -> None:
        """Name this moment (``m.mark("epoch 3")``); marks are kept in the recording."""
        self._marks.append(text)
        if self._sampler is not None:
            self._sampler.mark(text)

    @property
    def totals(self) -> dict[str, float | None]:
        """Counted work: ``steps``, ``samples``, ``tokens`` (None when never given)."""
        return dict(self._totals)

    @property
    def stats(self) -> Any:
        """The sampler's :class:`~gpuaudit.measure.live.sampler.SamplerStats` (None if unmeasured)."""
        return self._sampler.stats() if self._sampler is not None else None

    def report(self, fmt: str = "terminal", **pricing: Any) -> str:
        """The audit of what was measured (stops sampling first)."""
        recording = self.stop()
        return render_report(recording, fmt, unavailable=self.unavailable, **pricing)


def monitor(labels: Mapping[str, str] | None = None, **kwargs: Any) -> Monitor:
    """A :class:`Monitor` to use as a context manager (see the module doc)."""
    return Monitor(labels, **kwargs)


def monitored(labels: Mapping[str, str] | None = None, *, report: bool = True,
              fmt: str = "terminal", **kwargs: Any) -> Callable[[F], F]:
    """Decorate a function so each call is measured; the report goes to stderr.

    The last call's :class:`Monitor` is ``func.gpuaudit_monitor``.
    """

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kw: Any) -> Any:
            m = Monitor(labels, **kwargs)
            wrapper.gpuaudit_monitor = m  # type: ignore[attr-defined]
            with m:
                result = func(*args, **kw)
            if report:
                try:
                    print(m.report(fmt), file=sys.stderr, end="")
                except Exception as exc:  # the report must not break the user's function
                    print(f"gpuaudit: report failed: {exc}", file=sys.stderr)
            return result

        return wrapper  # type: ignore[return-value]

    return decorate


class _CallableModule(types.ModuleType):
    """``gpuaudit.monitor`` is both this module and the function: importing the module
    (``import gpuaudit.monitor``) sets the package attribute to the module, so the module
    itself must answer ``gpuaudit.monitor(labels=...)``."""

    def __call__(self, labels: Mapping[str, str] | None = None, **kwargs: Any) -> Monitor:
        return monitor(labels, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
