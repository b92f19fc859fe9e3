"""Host CPU from node_exporter beside dcgm-exporter (issue 21), against a real Prometheus
holding backfilled ``node_cpu_seconds_total`` and ``node_uname_info``: the raw pull puts each
node's busy share on its GPUs' rows (joined by dcgm-exporter's ``Hostname`` = node_uname_info's
``nodename``), equal to the truth; the pushdown gives the same per-GPU means, idle and busy
apart; a fleet without node_exporter leaves the CPU null."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from fleetgen import Fleet, backfill, make_fleet, run_prometheus

from gpuaudit.classify import classify
from gpuaudit.classify.pushdown import pull_aggregates, usage_from_pushdown
from gpuaudit.measure.fleet.dcgm import series_id
from gpuaudit.measure.fleet.prometheus import PromClient, PrometheusSource, host_keys


@pytest.fixture(scope="module")
def cpu_fleet() -> Fleet:
    fleet = make_fleet(nodes=2, gpus_per_node=2, hours=3, step_s=15, seed=5, special=False)
    hosts = sorted({s.host for s in fleet.series})
    fleet.node_cpu = {hosts[0]: 0.1, hosts[1]: 0.6}
    return fleet


@pytest.fixture(scope="module")
def cpu_prom(cpu_fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("tsdb_cpu") / "data"
    backfill(cpu_fleet, data)
    with run_prometheus(data) as url:
        yield url


def _truth(fleet: Fleet) -> pa.Table:
    """The ground truth with each row's host CPU: irate over the last two scrapes is the
    busy share of the interval ending at the row (none at the very first scrape)."""
    t = fleet.sample_table()
    ts = t.column("ts").cast(pa.int64()).to_numpy() // 1_000_000_000
    hosts = t.column("host").cast(pa.string()).to_pylist()
    cpu = np.array([100.0 * fleet.node_busy(h, np.array([x]))[0] for h, x in zip(hosts, ts)])
    cpu[ts == fleet.start_s] = np.nan
    idx = t.schema.get_field_index("host_cpu_util_pct")
    return t.set_column(idx, t.schema.field(idx),
                        pa.array(cpu, type=pa.float32(), mask=np.isnan(cpu)))


def test_raw_pull_joins_node_cpu_to_the_gpus_of_its_node(cpu_prom, cpu_fleet) -> None:
    src = PrometheusSource(PromClient(cpu_prom), start_s=cpu_fleet.start_s,
                           end_s=cpu_fleet.end_s, step_s=cpu_fleet.step_s)
    raw = classify(src, by=["pod"], cap_intervals=1.0)
    truth = classify(_truth(cpu_fleet), by=["pod"], cap_intervals=1.0,
                     interval_s=cpu_fleet.step_s)
    want = {s.gpu_uuid: s for s in truth.series}
    assert len(raw.series) == 4
    for s in raw.series:
        w = want[s.gpu_uuid]
        assert w.host_cpu_util_pct is not None
        assert s.host_cpu_util_pct == pytest.approx(w.host_cpu_util_pct, abs=1e-3)
        for f in ("host_cpu_util_pct_while_idle", "host_cpu_util_pct_while_busy"):
            got, exp = getattr(s, f), getattr(w, f)
            assert (got is None) == (exp is None), f
            if exp is not None:
                assert got == pytest.approx(exp, abs=1e-3), f
        assert s.proc_cpu_util_pct is None  # no process tree in a fleet
    by_host = {s.host: s.host_cpu_util_pct for s in raw.series}
    low, high = sorted(by_host.values())  # type: ignore[type-var]
    assert low == pytest.approx(10 + 15, abs=1) and high == pytest.approx(60 + 15, abs=1)
    assert not any("host CPU" in n.reason for n in src.notes)


def test_pushdown_equals_the_raw_pull(cpu_prom, cpu_fleet) -> None:
    c = PromClient(cpu_prom)
    data = pull_aggregates(c, identify=series_id, start_s=cpu_fleet.start_s,
                           end_s=cpu_fleet.end_s, step_s=cpu_fleet.step_s)
    usage, _ = usage_from_pushdown(data, by=("pod",))
    src = PrometheusSource(PromClient(cpu_prom), start_s=cpu_fleet.start_s,
                           end_s=cpu_fleet.end_s, step_s=cpu_fleet.step_s)
    raw = {s.gpu_uuid: s for s in classify(src, by=["pod"], cap_intervals=1.0).series}
    for s in usage.series:
        r = raw[s.gpu_uuid]
        for f in ("host_cpu_util_pct", "host_cpu_util_pct_while_idle",
                  "host_cpu_util_pct_while_busy"):
            got, exp = getattr(s, f), getattr(r, f)
            assert (got is None) == (exp is None), (s.gpu_uuid, f)
            if exp is not None:
                assert got == pytest.approx(exp, abs=1e-3), (s.gpu_uuid, f)


def test_without_node_exporter_the_cpu_is_null(prom, fleet) -> None:
    """The shared fleet has no node_exporter: CPU null on both paths, never 0."""
    c = PromClient(prom)
    end = fleet.start_s + 3 * 3600
    data = pull_aggregates(c, identify=series_id, start_s=fleet.start_s, end_s=end,
                           step_s=fleet.step_s)
    usage, _ = usage_from_pushdown(data, by=("pod",))
    assert all(s.host_cpu_util_pct is None for s in usage.series)
    src = PrometheusSource(PromClient(prom), start_s=fleet.start_s, end_s=end,
                           step_s=fleet.step_s)
    raw = classify(src, by=["pod"], cap_intervals=1.0)
    assert all(s.host_cpu_util_pct is None for s in raw.series)


def test_host_keys() -> None:
    assert host_keys({"instance": "10.0.0.5:9100", "nodename": "gpu-1.ec2.internal"}) == [
        "gpu-1.ec2.internal", "gpu-1", "10.0.0.5", "10.0.0.5:9100"]
    assert host_keys({"instance": "[fd00::1]:9100"})[0] == "fd00::1"
    assert host_keys({"instance": "node-a"}) == ["node-a", "node-a"]
