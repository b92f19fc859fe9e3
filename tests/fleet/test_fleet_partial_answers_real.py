"""A real Prometheus that answers from a long-term store behind it (``remote_read``): while
that store is up the audit sees the whole fleet; when it is down, Prometheus still answers
200 with what it holds itself and a warning. The audit must not take that for the fleet:
an error naming the store and the warning, or with ``allow_partial`` the part it holds and a
note. (The same holds for Thanos Query and VictoriaMetrics cluster, which the client also
asks to refuse partial answers: tests/fleet/test_fleet_partial_answers.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetgen import Fleet, backfill, free_port, run_prometheus, team_report

from gpuaudit.errors import SourceUnavailableError


@pytest.fixture(scope="module")
def halves(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The fleet's first node in one TSDB (the front Prometheus), the rest in another (the
    long-term store behind it)."""
    hosts = fleet.hosts()
    root = tmp_path_factory.mktemp("partial")
    front, back = root / "front", root / "back"
    backfill(fleet.subset(set(hosts[:1])), front)
    backfill(fleet.subset(set(hosts[1:])), back)
    return front, back




def _partial_notes(report: dict) -> list:  # type: ignore[type-arg]
    return [n for n in report["source"]["notes"] if "partial answers" in n["reason"]]


def _gpu_hours(report: dict) -> float:  # type: ignore[type-arg]
    fleet = report["extra"]["fleet"]
    return sum(e["gpu_hours"] for e in fleet["showback"]) + \
        fleet.get("unallocated", {}).get("gpu_hours", 0.0)


def test_a_store_behind_prometheus_down_is_an_error_not_a_smaller_fleet(
        halves: tuple[Path, Path], fleet: Fleet, prom: str) -> None:
    front, back = halves
    whole = team_report(prom, fleet)
    with run_prometheus(back) as back_url:
        with run_prometheus(front, remote_read=(f"{back_url}/api/v1/read",)) as url:
            assert team_report(url, fleet) == whole  # the store behind it up: the whole fleet
    with run_prometheus(front) as url:
        held = team_report(url, fleet)  # what the front holds itself
    assert _gpu_hours(held) < _gpu_hours(whole)
    dead = f"http://127.0.0.1:{free_port()}/api/v1/read"
    with run_prometheus(front, remote_read=(dead,)) as url:
        with pytest.raises(SourceUnavailableError) as e:
            team_report(url, fleet, client_kwargs={"retries": 1, "backoff_s": 0.01})
        assert "partial data" in e.value.what and "connection refused" in e.value.what
        assert (e.value.fix or "").count("--allow-partial") == 1
        kept = team_report(url, fleet, allow_partial=True)
    notes = _partial_notes(kept)
    assert notes and all(dead in n["reason"] for n in notes), kept["source"]["notes"]
    kept["source"]["notes"] = [n for n in kept["source"]["notes"] if n not in notes]
    assert kept == held  # what it answered, and a note saying what is missing
