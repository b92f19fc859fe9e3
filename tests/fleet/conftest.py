"""A real Prometheus holding a small backfilled fleet history, shared by the fleet tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fleetgen import Fleet, backfill, make_fleet, run_prometheus

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(scope="session")
def fleet() -> Fleet:
    # 3 nodes x 4 L4 GPUs (one MIG-split, one time-sliced), 26 h at 15 s: two day chunks
    return make_fleet(nodes=3, gpus_per_node=4, hours=26, step_s=15, seed=11)


@pytest.fixture(scope="session")
def prom(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("tsdb") / "data"
    backfill(fleet, data)
    with run_prometheus(data) as url:
        yield url
