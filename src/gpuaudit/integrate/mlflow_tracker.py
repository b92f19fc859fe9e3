"""Log a :class:`~gpuaudit.integrate.trackers.TrackerSummary` to an MLflow run.

Which run, as MLflow itself decides: the active run of this process
(``mlflow.active_run()``), else ``MLFLOW_RUN_ID``, else a new run that
``mlflow.start_run()`` creates in the experiment MLflow picks (``MLFLOW_EXPERIMENT_NAME`` /
``MLFLOW_EXPERIMENT_ID``, else the default one). The tracking server is MLflow's own choice
too: ``MLFLOW_TRACKING_URI`` or ``mlflow.set_tracking_uri``, else MLflow's default store.
A caller holding a run elsewhere (Lightning's ``MLFlowLogger``) passes ``run_id`` and
``tracking_uri``.

What goes where (all under ``gpuaudit``): scalar metrics at step 0; time series as metrics
whose step is the training step reached at that time when steps were counted (``m.step()``,
the callbacks), so they line up beside a loss logged per step, else the whole second since the
first sample; on the training step also ``gpuaudit/step/cost_usd``, ``gpuaudit/step/gpu_hours``
(so far), ``gpuaudit/step/util_gpu_pct`` and the cumulative ``gpuaudit/step/usd_per_step``; tags ``gpuaudit.*``, and artifacts
``gpuaudit/report.html``, ``gpuaudit/report.json``, ``gpuaudit/recommendations.md`` and
``gpuaudit/recommendations.json``. Batches respect MLflow's own request limits
(``mlflow.utils.validation``: 1,000 metrics, 100 tags per ``log_batch``; 8,000 characters a
tag value).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from gpuaudit.integrate.trackers import PREFIX, TrackerSummary, require

__all__ = ["MlflowTracker"]

# MLflow's documented limits, used where mlflow.utils.validation does not say (older MLflow)
_LIMITS = {"MAX_METRICS_PER_BATCH": 1000, "MAX_PARAMS_TAGS_PER_BATCH": 100,
           "MAX_TAG_VAL_LENGTH": 5000, "MAX_ENTITY_KEY_LENGTH": 250}


def _limit(name: str) -> int:
    try:
        from mlflow.utils import validation

        return int(getattr(validation, name, _LIMITS[name]))
    except ImportError:  # pragma: no cover - mlflow without the module
        return _LIMITS[name]


class MlflowTracker:
    """Logs to one MLflow run (see the module doc for which).

    ``child=True`` (``gpuaudit run``): :meth:`begin` returns the environment that makes the
    workload's own ``mlflow.start_run()`` resume this same run.
    """

    name = "MLflow"

    def __init__(self, *, run_id: str | None = None, tracking_uri: str | None = None,
                 child: bool = False) -> None:
        self.mlflow: Any = require("mlflow", "mlflow", "logging to MLflow")
        self.run_id = run_id
        self.tracking_uri = tracking_uri
        self.child = child
        self.owned = False  # this tracker started the run, so it ends it

    def _client(self) -> Any:
        return self.mlflow.MlflowClient(tracking_uri=self.tracking_uri)

    def begin(self) -> dict[str, str]:
        """Find or start the run; the environment a child process needs to join it."""
        mlflow = self.mlflow
        if self.run_id is None:
            active = mlflow.active_run()
            env_run = os.environ.get("MLFLOW_RUN_ID")
            if active is not None:
                self.run_id = active.info.run_id
            elif env_run:
                self._client().get_run(env_run)  # fails now, not after the job, if unknown
                self.run_id = env_run
            else:
                if self.tracking_uri is not None:
                    mlflow.set_tracking_uri(self.tracking_uri)
                run = mlflow.start_run(tags={f"{PREFIX}.status": "running"})
                self.run_id = run.info.run_id
                self.owned = True
        if self.tracking_uri is None:
            self.tracking_uri = mlflow.get_tracking_uri()
        env = {"MLFLOW_RUN_ID": str(self.run_id)}
        if "MLFLOW_TRACKING_URI" not in os.environ and self.tracking_uri:
            env["MLFLOW_TRACKING_URI"] = str(self.tracking_uri)
        return env

    def finish(self, summary: TrackerSummary, *, failed: bool = False) -> str:
        """Log the summary to the run; end the run if this tracker started it."""
        if self.run_id is None:
            self.begin()
        from mlflow.entities import Metric, RunTag

        client = self._client()
        run_id = str(self.run_id)
        now_ms = int(time.time() * 1000)
        key_max = _limit("MAX_ENTITY_KEY_LENGTH")
        val_max = _limit("MAX_TAG_VAL_LENGTH")
        tags = [RunTag(k[:key_max], v[:val_max]) for k, v in summary.tags.items()]
        tags.append(RunTag(f"{PREFIX}.status", "failed" if failed else "finished"))
        metrics = [Metric(k[:key_max], v, now_ms, 0) for k, v in summary.metrics.items()]
        if summary.series is not None:
            on_step = summary.series_steps
            for i, (elapsed_s, ts_ms, values) in enumerate(summary.series.rows()):
                step = int(on_step[i]) if on_step is not None else int(elapsed_s)
                metrics += [Metric(f"{PREFIX}/{k}"[:key_max], v, ts_ms, step)
                            for k, v in values.items()]
        if summary.step_series is not None:
            for step, ts_ms, values in summary.step_series.rows():
                metrics += [Metric(f"{PREFIX}/step/{k}"[:key_max], v, ts_ms, step)
                            for k, v in values.items()]
        per_batch = _limit("MAX_METRICS_PER_BATCH")
        tags_per_batch = _limit("MAX_PARAMS_TAGS_PER_BATCH")
        for i in range(0, len(tags), tags_per_batch):
            client.log_batch(run_id, tags=tags[i:i + tags_per_batch])
        for i in range(0, len(metrics), per_batch):
            client.log_batch(run_id, metrics=metrics[i:i + per_batch])
        if summary.html is not None:
            client.log_text(run_id, summary.html, f"{PREFIX}/report.html")
        if summary.report_json is not None:
            client.log_text(run_id, summary.report_json, f"{PREFIX}/report.json")
        if summary.sampled:
            client.log_text(run_id, summary.recommendations_md,
                            f"{PREFIX}/recommendations.md")
            client.log_text(run_id, json.dumps(list(summary.recommendations), indent=2),
                            f"{PREFIX}/recommendations.json")
        if self.owned:
            self.mlflow.end_run("FAILED" if failed else "FINISHED")
        return f"MLflow run {run_id} at {self.tracking_uri}"
