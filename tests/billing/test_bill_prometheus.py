"""``gpuaudit bill --prometheus``: a real Prometheus holding a backfilled fleet, read through
the fleet audit's PromQL pushdown by the hour, gives the same split as the ground-truth
samples classified locally, and reconciles to the cent."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fleet"))

import billgen
from fleetgen import Fleet, backfill, make_fleet, run_prometheus

from gpuaudit.api import bill
from gpuaudit.cli import main
from gpuaudit.price.attribution import Attributor, attribute_table

pytestmark = pytest.mark.slow
START = 1_704_067_200  # 2024-01-01T00:00:00Z, an hour boundary
HOURS = 4


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return make_fleet(nodes=2, gpus_per_node=4, hours=HOURS, step_s=60, seed=5,
                      start_s=START)


@pytest.fixture(scope="module")
def prom(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("tsdb") / "data"
    backfill(fleet, data)
    with run_prometheus(data) as url:
        yield url


@pytest.fixture(scope="module")
def focus(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A g6.12xlarge (4 x L4, catalog price) per node per hour."""
    e = billgen.entry("aws", "g6.12xlarge")
    price = billgen.od_hourly(e)
    t0 = datetime.fromtimestamp(START, tz=timezone.utc)
    hosts = sorted({s.host for s in fleet.series})
    lines = []
    for n, host in enumerate(hosts):
        for h in range(HOURS):
            s = t0 + timedelta(hours=h)
            lines.append(billgen.Line(s, s + timedelta(hours=1), f"i-0{n}", host,
                                      "USE1-BoxUsage:g6.12xlarge", "g6.12xlarge hour",
                                      "Amazon Elastic Compute Cloud", "Usage", "Standard",
                                      Decimal(1), "Hours", price, price, price))
    sc = billgen.Scenario(lines=lines)
    d = tmp_path_factory.mktemp("b")
    billgen.write_csv(billgen.cur_rows(sc), d / "cur" / "cur-00001.csv.gz", billgen.CUR_COLUMNS)
    return billgen.write_csv(billgen.focus_rows(sc), d / "f.csv", billgen.FOCUS_COLUMNS)


def _amounts(r: Any) -> dict[str, Decimal]:
    return {ln["line"]: Decimal(ln["amount"])
            for ln in r.extra["bill"]["currencies"]["USD"]["lines"]}


def test_prometheus_split_matches_local_ground_truth(fleet: Fleet, prom: str,
                                                     focus: Path) -> None:
    remote = bill(focus, prometheus=prom, by=["team"], step_s=60.0)
    usd = remote.extra["bill"]["currencies"]["USD"]
    assert usd["reconciliation"]["difference"] == "0.00"
    assert usd["reconciliation"]["every_period_exact"]
    total = Decimal(usd["reconciliation"]["billed"])
    assert total == (billgen.od_hourly(billgen.entry("aws", "g6.12xlarge")) * 2 * HOURS
                     ).quantize(Decimal("0.01"))
    truth = attribute_table(fleet.sample_table(), Attributor(None, fleet.pods))
    local = bill(focus, telemetry=truth, by=["team"])
    a, b = _amounts(remote), _amounts(local)
    assert sum(a.values()) == sum(b.values()) == total
    assert {k for k, v in a.items() if v > 1} == {k for k, v in b.items() if v > 1}
    for k in set(a) | set(b):
        # the pushdown reads the same samples at the scrape step; shares agree to a few
        # tenths of a percent of the bill
        assert abs(a.get(k, Decimal(0)) - b.get(k, Decimal(0))) <= total * Decimal("0.01"), k
    assert any(ln["kind"] == "team" for ln in usd["lines"])


def test_cli_cur_folder_prometheus_usage_method(prom: str, focus: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's second command: a CUR folder, forced, against the fleet."""
    rc = main(["bill", str(focus.parent / "cur"), "--format", "cur", "--prometheus", prom,
               "--by", "namespace", "--method", "usage", "--step", "1m"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "AWS CUR (legacy)" in out.out and "method: usage" in out.out
    assert "each exact to the cent: yes" in out.out
    assert "team-vision" in out.out or "team-nlp" in out.out  # namespaces from the series
