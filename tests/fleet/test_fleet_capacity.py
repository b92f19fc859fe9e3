"""Capacity planning against a real Prometheus: ``simulate --prometheus`` on the backfilled
dcgm-exporter fleet, and ``queue`` on kube-state-metrics series backfilled with promtool."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fleetgen import Fleet, run_prometheus

from gpuaudit.capacity.profiles import build_profiles
from gpuaudit.capacity.queue import queue_waits, wait_runs
from gpuaudit.cli import main
from gpuaudit.measure.fleet.prometheus import PromClient

T0 = 1_704_067_200  # 2024-01-01T00:00:00Z, a multiple of 60
STEPS = 180  # three hours at one minute


def test_simulate_from_prometheus_by_namespace(prom: str, fleet: Fleet, tmp_path: Path):
    out = tmp_path / "sim.json"
    rc = main(["simulate", "--prometheus", prom, "--start", str(fleet.start_s - 1),
               "--end", str(fleet.end_s), "--step", "1m", "--policy", "all",
               "--by", "namespace", "--gpu-model", "H100", "--format", "json", "-o", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    sim = doc["simulate"]
    assert sim["by"] == ["namespace"]
    assert [t["policy"] for t in sim["totals"]] == ["mig", "mps", "timeslice"]
    physical = {s.uuid.split("/")[0] for s in fleet.series}
    for t in sim["totals"]:
        assert t["gpus_today"] == len(physical)
        assert t["lower_bound_gpus"] <= t["gpus_needed"]
        assert float(t["monthly_saved_usd"]) <= float(t["monthly_today_usd"])
    groups = {g["group"]["namespace"] for g in sim["groups"]}
    # every namespace that held a GPU in the fleet is a group (None: GPUs no pod held)
    assert {s.namespace for s in fleet.series if s.namespace} <= groups
    # the history read from Prometheus is the fleet's: same workloads as the ground truth
    truth = build_profiles(fleet.sample_table(), step_s=60, by=["namespace"])
    assert sim["workloads"] == len(truth)
    assert doc["plan"]["recommendations"] is not None
    for fmt in ("markdown", "html"):
        assert main(["simulate", "--prometheus", prom, "--start", str(fleet.start_s - 1),
                     "--end", str(fleet.end_s), "--policy", "mps", "--no-plan",
                     "--format", fmt, "-o", str(tmp_path / f"s.{fmt}")]) == 0
        assert "Consolidation simulation" in (tmp_path / f"s.{fmt}").read_text()


# --------------------------------------------------------------------------- queue

#: (namespace, pod, GPUs requested per container, pending step ranges)
PODS = [
    ("team-a", "a1", [1], [(10, 40)]),
    ("team-a", "a2", [1, 1], [(50, 55)]),
    ("team-a", "cpu-only", [], [(0, 5)]),
    ("team-b", "b1", [1], [(100, 160), (170, 175)]),
]
#: (uuid, exported namespace/pod or None, utilization per step)
GPUS = [
    ("GPU-00000000-0000-0000-0000-000000000000", None, np.zeros(STEPS)),
    ("GPU-11111111-1111-1111-1111-111111111111", ("team-a", "a0"), np.full(STEPS, 80.0)),
    ("GPU-22222222-2222-2222-2222-222222222222", ("team-b", "b0"),
     np.r_[np.full(90, 2.0), np.full(STEPS - 90, 70.0)]),
]


def _pending(ranges: list[tuple[int, int]]) -> np.ndarray:
    p = np.zeros(STEPS, dtype=bool)
    for a, b in ranges:
        p[a:b] = True
    return p


def _openmetrics(path: Path) -> None:
    ts = T0 + np.arange(STEPS) * 60
    lines = ["# TYPE kube_pod_status_phase gauge"]
    for ns, pod, _req, ranges in PODS:
        pend = _pending(ranges)
        for phase, vals in (("Pending", pend), ("Running", ~pend)):
            lab = f'namespace="{ns}",pod="{pod}",phase="{phase}",uid="u-{pod}"'
            lines += [f"kube_pod_status_phase{{{lab}}} {int(v)} {t}" for v, t in zip(vals, ts)]
    lines.append("# TYPE kube_pod_container_resource_requests gauge")
    for ns, pod, req, _ranges in PODS:
        for i, n in enumerate(req):
            lab = (f'namespace="{ns}",pod="{pod}",container="c{i}",node="",'
                   'resource="nvidia_com_gpu",unit="integer"')
            lines += [f"kube_pod_container_resource_requests{{{lab}}} {n} {t}" for t in ts]
        lab = (f'namespace="{ns}",pod="{pod}",container="c0",node="",resource="cpu",'
               'unit="core"')
        lines += [f"kube_pod_container_resource_requests{{{lab}}} 1 {t}" for t in ts]
    lines.append("# TYPE DCGM_FI_DEV_GPU_UTIL gauge")
    for g, (uuid, holder, util) in enumerate(GPUS):
        lab = (f'gpu="{g}",UUID="{uuid}",modelName="NVIDIA L4",Hostname="node-1",'
               'namespace="gpu-operator",pod="nvidia-dcgm-exporter-x"')
        if holder:
            lab += f',exported_namespace="{holder[0]}",exported_pod="{holder[1]}"'
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{lab}}} {u:g} {t}" for u, t in zip(util, ts)]
    lines.append("# EOF")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def ksm_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("ksm")
    om = work / "ksm.om"
    _openmetrics(om)
    data = work / "data"
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(om),
                    str(data)], check=True, capture_output=True, timeout=600)
    with run_prometheus(data) as url:
        yield url


def _truth_minutes(ns: str) -> list[float]:
    out: list[float] = []
    for n, _pod, req, ranges in PODS:
        if n == ns and sum(req) > 0:
            out += [float(x) for x in wait_runs(_pending(ranges))]
    return out


def test_queue_waits_from_kube_state_metrics(ksm_prom: str):
    with PromClient(ksm_prom) as c:
        q = queue_waits(c, start_s=T0 - 30, end_s=T0 + STEPS * 60 - 1, step_s=60)
    by = {n.namespace: n for n in q.namespaces}
    assert set(by) == {"team-a", "team-b"}
    for ns in by:
        truth = np.asarray(_truth_minutes(ns)) * 60
        assert by[ns].waits == truth.size
        assert by[ns].p50_s == pytest.approx(float(np.percentile(truth, 50)))
        assert by[ns].p95_s == pytest.approx(float(np.percentile(truth, 95)))
        assert by[ns].max_s == pytest.approx(float(truth.max()))
    assert by["team-a"].pods == 2  # the CPU-only pod is not a GPU wait
    assert by["team-a"].pending_gpu_hours == pytest.approx((30 * 1 + 5 * 2) / 60)
    assert by["team-b"].pending_gpu_hours == pytest.approx(65 / 60)
    assert by["team-b"].idle_gpu_hours == pytest.approx(90 / 60)  # b0 idle while held
    assert by["team-a"].idle_gpu_hours == 0
    assert q.idle_unheld_gpu_hours == pytest.approx(STEPS / 60)
    assert q.idle_gpu_hours == pytest.approx((STEPS + 90) / 60)
    # the unheld GPU was idle during every minute some GPU pod waited
    waiting = _pending([(10, 40), (50, 55), (100, 160), (170, 175)])
    assert q.waiting_steps == int(waiting.sum())
    assert q.idle_unheld_while_waiting_gpu_hours == pytest.approx(waiting.sum() / 60)


def test_queue_cli(ksm_prom: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "q.json"
    assert main(["queue", "--prometheus", ksm_prom, "--start", str(T0 - 30), "--end",
                 str(T0 + STEPS * 60 - 1), "--format", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "queue" and doc["queue"]["waits"] == 4
    # the scheduling finding reaches the recommender, priced on the fleet audit of the range:
    # the unheld L4 idle during every waiting minute, all three GPUs the same model and rate,
    # so its share of observed cost is waiting minutes / observed GPU-minutes
    waiting = _pending([(10, 40), (50, 55), (100, 160), (170, 175)]).sum()
    recs = {r["id"]: r for r in doc["plan"]["recommendations"]}
    sched = recs["schedule_waiting_pods"]
    assert sched["counted"]
    assert sched["fraction"] == pytest.approx(waiting / (len(GPUS) * STEPS), abs=1e-6)
    idle_minutes = STEPS + 90  # the unheld GPU all along, b0 for its first 90 minutes
    assert sched["cap_fraction"] == pytest.approx(idle_minutes / (len(GPUS) * STEPS), abs=1e-6)
    assert doc["plan"]["findings"][0]["signal"] == "queue_idle_while_waiting_share"
    sav = doc["plan"]["savings"]
    assert float(sav["efficiency_monthly_usd"]) <= float(sav["monthly_waste_usd"])
    assert main(["queue", "--prometheus", ksm_prom, "--start", str(T0 - 30), "--end",
                 str(T0 + STEPS * 60 - 1)]) == 0
    text = capsys.readouterr().out
    assert "team-b" in text and "finding (scheduling)" in text
    assert "schedule_waiting_pods" in text
    # --no-plan: the waits alone, no fleet audit
    assert main(["queue", "--prometheus", ksm_prom, "--start", str(T0 - 30), "--end",
                 str(T0 + STEPS * 60 - 1), "--no-plan", "--format", "json", "-o", str(out)]) == 0
    assert "plan" not in json.loads(out.read_text())
    # a range with nothing pending says so
    assert main(["queue", "--prometheus", ksm_prom, "--start", str(T0 - 7200), "--end",
                 str(T0 - 3600), "--format", "json"]) == 0
    empty = json.loads(capsys.readouterr().out)
    assert "plan" not in empty
    assert any("was Pending" in n for n in empty["queue"]["notes"])
    assert any("no scheduling finding" in n for n in empty["queue"]["notes"])
    assert main(["queue", "--prometheus", "prom:9090", "--since", "1d"]) == 2


def test_simulate_from_prometheus_by_team_reads_kube_pod_labels(prom: str, fleet: Fleet,
                                                                 tmp_path: Path):
    out = tmp_path / "team.json"
    assert main(["simulate", "--prometheus", prom, "--start", str(fleet.start_s - 1),
                 "--end", str(fleet.end_s), "--policy", "timeslice", "--by", "team",
                 "--no-plan", "--format", "json", "-o", str(out)]) == 0
    groups = {g["group"]["team"] for g in json.loads(out.read_text())["simulate"]["groups"]}
    labelled = {kl["team-id"] for kl in fleet.pods.values() if kl}
    assert labelled and labelled <= groups


def test_idle_while_waiting_is_priced_per_model_at_the_audits_rates():
    """Each model's hours at that model's rate; GPUs without a modelName label are the audit's
    None key (as dcgm series without it are); a model the audit never saw is an error, not a
    guess."""
    from decimal import Decimal

    from gpuaudit.capacity.queue import QueueReport, idle_while_waiting_usd
    from gpuaudit.errors import PricingError
    from gpuaudit.price.catalog import resolve_rate

    l4, blank = resolve_rate("L4"), resolve_rate(None, price="2.00")
    q = QueueReport(url="u", start_s=0, end_s=3600, step_s=60, namespaces=(),
                    idle_gpu_hours=4.0, idle_unheld_gpu_hours=4.0,
                    idle_unheld_while_waiting_gpu_hours=3.5, waiting_steps=60,
                    idle_unheld_while_waiting_gpu_hours_by_model={"NVIDIA L4": 2.0, "": 1.5})
    usd = idle_while_waiting_usd(q, {"NVIDIA L4": l4, None: blank})
    assert usd == Decimal("2.0") * l4.usd_per_gpu_hour + Decimal("1.5") * Decimal("2.00")
    with pytest.raises(PricingError, match="'NVIDIA L4'"):
        idle_while_waiting_usd(q, {None: blank})
