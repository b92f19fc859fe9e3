"""Log a :class:`~gpuaudit.integrate.trackers.TrackerSummary` to a Weights & Biases run.

Which run: the active run of this process (``wandb.run``), else the run ``wandb.init``
makes from the environment as W&B does (``WANDB_RUN_ID``, ``WANDB_PROJECT``,
``WANDB_ENTITY``, ``WANDB_MODE=offline`` ...), resumed when it exists. For ``gpuaudit run``
(``child=True``) the workload owns the run while it runs: gpuaudit picks the run id
(``WANDB_RUN_ID`` or a fresh one), hands it to the workload with ``WANDB_RESUME=allow`` so
the workload's own ``wandb.init()`` joins it, and resumes the same run after the workload
ended to add its numbers. Offline mode works the same way (``wandb sync`` merges the parts).

What goes where: scalars into the run summary under ``gpuaudit/...``; tags and labels into
the run config under ``gpuaudit`` (and the run tag ``gpuaudit-not-sampled`` when nothing was
sampled); time series as history rows against their own x-axis ``gpuaudit/elapsed_s``
(``define_metric``), so they never fight the workload's steps; when steps were counted
(``m.step()``, the callbacks), cost and GPU-hours so far, utilisation and the cumulative
cost per step against the x-axis ``gpuaudit/train_step`` (the training step), with the
series' own rows carrying it too, so a chart of the loss per step can use the same axis; the recommendations as a
``wandb.Table`` (``gpuaudit/recommendations``); the HTML report as a ``wandb.Html`` panel
(``gpuaudit/report``) and, with the JSON report and the recommendations, as the artifact
``gpuaudit-report-<run id>`` of type ``gpuaudit-report``. Points per series stay far under
W&B's guidance (fewer than 100,000 logged points per scalar metric).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from gpuaudit.integrate.trackers import PREFIX, TrackerSummary, require

__all__ = ["WANDB_MAX_POINTS", "WandbTracker"]

#: W&B's guidance: fewer than 100,000 logged points per scalar metric (docs, "limits").
WANDB_MAX_POINTS = 100_000


def _next_second() -> None:
    """Wait for the next wall-clock second before resuming the workload's run.

    W&B names a run's local folder ``(offline-)run-<YYYYMMDD_HHMMSS>-<id>`` at ``init``: a
    resume of the same id within the second the workload's own ``init`` ran would share that
    folder and overwrite the workload's ``run-<id>.wandb`` (seen with a sub-second workload).
    The workload has ended, so its ``init`` lies before now; the next second is safe.
    """
    import math
    import time

    now = time.time()
    time.sleep(math.floor(now) + 1.0 - now + 0.01)


def _new_run_id() -> str:
    """A run id in W&B's own form: 8 characters of [a-z0-9]."""
    import secrets
    import string

    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbTracker:
    """Logs to one W&B run (see the module doc for which)."""

    name = "W&B"

    def __init__(self, *, run: Any = None, child: bool = False) -> None:
        self.wandb: Any = require("wandb", "wandb", "logging to Weights & Biases")
        self.run = run
        self.child = child
        self.run_id: str | None = None
        self.owned = False

    def begin(self) -> dict[str, str]:
        """Find or start the run (in process), or choose the id a child joins."""
        wandb = self.wandb
        if self.run is None and not self.child and wandb.run is not None:
            self.run = wandb.run
        if self.run is not None:
            self.run_id = str(self.run.id)
            return {}
        if self.child:
            self.run_id = os.environ.get("WANDB_RUN_ID") or _new_run_id()
            return {"WANDB_RUN_ID": self.run_id, "WANDB_RESUME": "allow"}
        self.run = wandb.init(resume="allow")
        self.run_id = str(self.run.id)
        self.owned = True
        return {}

    def finish(self, summary: TrackerSummary, *, failed: bool = False) -> str:
        """Log the summary; finish the run if this tracker started it."""
        wandb = self.wandb
        if self.run is None:
            if self.run_id is None:
                self.begin()
            if self.run is None:  # child mode: resume the run the workload used
                _next_second()
                self.run = wandb.init(id=self.run_id, resume="allow")
                self.owned = True
        run = self.run
        p = PREFIX
        run.config.update({p: dict(summary.tags)}, allow_val_change=True)
        if not summary.sampled:
            run.tags = (*tuple(run.tags or ()), f"{p}-not-sampled")
        run.summary.update(dict(summary.metrics))
        run.summary.update({f"{p}/sampled": summary.sampled})
        if summary.series is not None and len(summary.series):
            x = f"{p}/elapsed_s"
            run.define_metric(x, hidden=False)
            for name in summary.series.columns:
                run.define_metric(f"{p}/{name}", step_metric=x)
            on_step = summary.series_steps
            for i, (elapsed_s, _ts_ms, values) in enumerate(summary.series.rows()):
                if i >= WANDB_MAX_POINTS:
                    break
                row: dict[str, Any] = {x: elapsed_s}
                if on_step is not None:
                    row[f"{p}/train_step"] = int(on_step[i])
                run.log({**row, **{f"{p}/{k}": v for k, v in values.items()}})
        if summary.step_series is not None and len(summary.step_series):
            xs = f"{p}/train_step"
            run.define_metric(xs, hidden=False)
            for name in summary.step_series.columns:
                run.define_metric(f"{p}/step/{name}", step_metric=xs)
            for i, (step, _ts_ms, values) in enumerate(summary.step_series.rows()):
                if i >= WANDB_MAX_POINTS:
                    break
                run.log({xs: step, **{f"{p}/step/{k}": v for k, v in values.items()}})
        final: dict[str, Any] = {}
        if summary.recommendations:
            cols = list(summary.recommendations[0])
            final[f"{p}/recommendations"] = wandb.Table(
                columns=cols, data=[[r[c] for c in cols] for r in summary.recommendations])
        if summary.html is not None:
            final[f"{p}/report"] = wandb.Html(summary.html, inject=False)
        if final:
            run.log(final)
        if summary.html is not None or summary.report_json is not None:
            art = wandb.Artifact(f"{p}-report-{run.id}", type=f"{p}-report")
            with tempfile.TemporaryDirectory(prefix="gpuaudit-wandb-") as tmp:
                files = {"report.html": summary.html, "report.json": summary.report_json,
                         "recommendations.md": summary.recommendations_md or None,
                         "recommendations.json": json.dumps(list(summary.recommendations),
                                                            indent=2)}
                for name, text in files.items():
                    if text is None:
                        continue
                    path = Path(tmp) / name
                    path.write_text(text)
                    art.add_file(str(path), name=name)
                run.log_artifact(art)
        where = f"W&B run {run.id} ({getattr(run, 'project', None) or 'default project'}"
        where += ", offline)" if getattr(run.settings, "mode", "") == "offline" else ")"
        if self.owned:
            run.finish(exit_code=1 if failed else 0)
        return where
