"""Open, start and finish the trackers a command or a monitor asked for (``--mlflow``,
``--wandb``, ``monitor(mlflow=True)``). Kept apart from :mod:`gpuaudit.integrate.trackers`,
which the tracker modules import, so no two modules import each other."""

from __future__ import annotations

from typing import Any

from gpuaudit.integrate.trackers import Tracker, TrackerSummary

__all__ = ["begin_trackers", "finish_trackers", "make_trackers"]


def make_trackers(*, mlflow: bool = False, wandb: bool = False,
                  child: bool = False) -> list[Tracker]:
    """The trackers asked for; a missing package raises :class:`MissingExtraError` now."""
    out: list[Tracker] = []
    if mlflow:
        from gpuaudit.integrate.mlflow_tracker import MlflowTracker

        out.append(MlflowTracker(child=child))
    if wandb:
        from gpuaudit.integrate.wandb_tracker import WandbTracker

        out.append(WandbTracker(child=child))
    return out


def begin_trackers(trackers: list[Tracker]) -> dict[str, str]:
    """Start or find each tracker's run; the environment a child process needs.

    A tracker that cannot be reached raises :class:`SourceUnavailableError` before any work
    starts (better than learning it after a day of training).
    """
    from gpuaudit.errors import GpuauditError, SourceUnavailableError

    env: dict[str, str] = {}
    for t in trackers:
        try:
            env.update(t.begin())
        except GpuauditError:
            raise
        except Exception as exc:
            raise SourceUnavailableError(
                f"cannot open the {t.name} run: {type(exc).__name__}: {exc}",
                fix=f"check the {t.name} settings in the environment (see "
                "docs/integrations.md), or run without this tracker") from exc
    return env


def finish_trackers(trackers: list[Tracker], summary: TrackerSummary, *, failed: bool,
                    say: Any) -> None:
    """Log ``summary`` to every tracker; a tracker's failure is said, never raised (the
    job's own result matters more than our logging)."""
    for t in trackers:
        try:
            where = t.finish(summary, failed=failed)
        except Exception as exc:
            say(f"gpuaudit: could not log to {t.name}: {type(exc).__name__}: {exc}")
        else:
            say(f"gpuaudit: logged to {where}")
