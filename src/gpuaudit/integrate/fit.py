"""The framework-neutral half of the training callbacks: one measured fit.

:class:`FitAudit` starts a :class:`~gpuaudit.monitor.Monitor` when a fit starts, takes
marks (epochs) and counts (steps, samples, tokens read off each batch), and at fit end stops
sampling, writes the report file, prints the terminal report on stderr and logs to the
trackers asked for. The Lightning and Hugging Face callbacks
(:mod:`gpuaudit.integrate.lightning_callback`, :mod:`gpuaudit.integrate.hf_callback`) only
translate their framework's hooks into these calls, and only on rank 0.

Nothing here touches the model, the optimizer, the batch or any random state: the training
loop's results are the same with and without it. Token counts are kept on the batch's own
device and read once at the end, so counting never forces a device synchronisation per step.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["BatchCounter", "FitAudit", "count_batch"]

#: ``count(batch) -> (samples, tokens)``; either may be None when unknown
BatchCounter = Callable[[Any], "tuple[Any, Any]"]


def _leading(x: Any) -> int | None:
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) >= 1:
        return int(shape[0])
    return None


def count_batch(batch: Any) -> tuple[int | None, Any]:
    """(samples, tokens) in a batch, read from its shape, never guessed.

    A mapping with ``input_ids`` (a tokenizer's output, Hugging Face's batches): samples are
    its rows; tokens are ``attention_mask.sum()`` (padding excluded) or else every position
    of ``input_ids``. Tokens come back as a tensor when they need a reduction (kept on the
    device; :class:`FitAudit` reads it once). Otherwise samples are the leading dimension of
    the batch, or of its first tensor (a ``(inputs, targets)`` pair), and tokens are None.
    """
    if isinstance(batch, Mapping) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__")):
        keys = list(batch.keys())
        if "input_ids" in keys:
            ids = batch["input_ids"]
            mask = batch["attention_mask"] if "attention_mask" in keys else None
            samples = _leading(ids)
            if mask is not None and hasattr(mask, "sum"):
                return samples, mask.sum()
            numel = getattr(ids, "numel", None)
            return samples, int(numel()) if callable(numel) else None
        for k in keys:
            n = _leading(batch[k])
            if n is not None:
                return n, None
        return None, None
    if isinstance(batch, (list, tuple)):
        for item in batch:
            if isinstance(item, (Mapping, list, tuple)) or hasattr(item, "keys"):
                return count_batch(item)
            n = _leading(item)
            if n is not None:
                return n, None
        return None, None
    return _leading(batch), None


class FitAudit:
    """One measured fit (see the module doc). Create it on every rank; only the rank given
    as ``is_zero=True`` to :meth:`start` measures.

    ``report_path``: where the report is written at fit end (format from the suffix:
    ``.html``, ``.json``, ``.md``; None: the framework's output folder /
    ``gpuaudit-report.html``). ``count``: your own ``count(batch) -> (samples, tokens)``.
    ``monitor_kwargs``: :class:`~gpuaudit.monitor.Monitor` arguments (``hz``, ``output``,
    ``backend``, ``pricing``, ...).
    """

    def __init__(self, labels: Mapping[str, str] | None = None, *,
                 report_path: str | Path | None = None, count: BatchCounter | None = None,
                 quiet: bool = False, **monitor_kwargs: Any) -> None:
        self.labels = dict(labels or {})
        self.report_path = None if report_path is None else Path(report_path)
        self.count = count or count_batch
        self.quiet = quiet
        self.monitor_kwargs = monitor_kwargs
        self.monitor: Any = None
        self.report: Any = None  # the gpuaudit.api.Report at fit end (None if unmeasured)
        self.written: Path | None = None
        self.world_size = 1
        self._tokens: Any = None  # running sum, possibly a device tensor
        self._tokens_counted = False

    @property
    def active(self) -> bool:
        return self.monitor is not None

    def start(self, *, is_zero: bool, world_size: int = 1, default_dir: str | Path = ".",
              trackers: Sequence[Any] = (), mlflow: bool = False, wandb: bool = False) -> None:
        if not is_zero or self.monitor is not None:
            return
        from gpuaudit.monitor import Monitor

        self.world_size = max(1, int(world_size))
        if self.report_path is None:
            self.report_path = Path(default_dir) / "gpuaudit-report.html"
        self.monitor = Monitor(self.labels, quiet=self.quiet, mlflow=mlflow, wandb=wandb,
                               trackers=trackers, **self.monitor_kwargs)
        self.monitor.start()
        self.monitor.mark("fit start")

    def mark(self, text: str) -> None:
        if self.monitor is not None:
            self.monitor.mark(text)

    def batch(self, batch: Any) -> None:
        """Count one step and what its batch holds (rank 0's batch times the world size)."""
        if self.monitor is None:
            return
        samples, tokens = self.count(batch)
        if tokens is not None:
            self._tokens = tokens if self._tokens is None else self._tokens + tokens
            self._tokens_counted = True
        n = None if samples is None else samples * self.world_size
        self.monitor.step(1, samples=n)

    def end(self, *, failed: bool = False) -> None:
        """Stop sampling, add the token count, write the report, log to the trackers."""
        m = self.monitor
        if m is None or m.recording is not None:
            return
        if self._tokens_counted:
            total = self._tokens
            tokens = float(total.item() if hasattr(total, "item") else total)
            m.step(0, tokens=tokens * self.world_size)
        m.stop(failed=failed)
        self._write_report()

    def _write_report(self) -> None:
        m = self.monitor
        rec = m.recording
        def say(text: str) -> None:
            if not self.quiet:
                print(text, file=sys.stderr)

        try:
            if rec is None or rec.table.num_rows == 0:
                say(f"gpuaudit: nothing sampled: {m.unavailable or 'no samples were taken'}")
                return
            from gpuaudit.api import audit
            from gpuaudit.monitor import counts_from

            pricing = dict(m.pricing)
            pricing.setdefault("counts", counts_from(rec))
            self.report = audit(rec, **pricing)
            path = self.report_path or Path("gpuaudit-report.html")
            fmt = {".json": "json", ".md": "markdown", ".txt": "terminal"}.get(
                path.suffix.lower(), "html")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.report.render(fmt))
            self.written = path
            say(self.report.render("terminal").rstrip("\n"))
            say(f"gpuaudit: report written to {path}")
        except Exception as exc:  # the fit's own result matters more than our report
            say(f"gpuaudit: report failed: {type(exc).__name__}: {exc}")
