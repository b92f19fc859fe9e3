"""The cost exporter: scraped over HTTP with httpx, parsed with prometheus_client's parser."""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuaudit.api import audit
from gpuaudit.errors import InputError
from gpuaudit.integrate.exporter import METRICS, ExporterState, LiveFeed, parse_listen, serve

sys.path.insert(0, str(Path(__file__).parents[1] / "report"))
from test_html_report import EVIL_POD, synthetic_table


def scrape(state: ExporterState) -> dict[str, Any]:
    server = serve(state, "127.0.0.1", 0)
    try:
        host, port = server.server_address[:2]
        r = httpx.get(f"http://{host}:{port}/metrics", timeout=10)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert httpx.get(f"http://{host}:{port}/nope", timeout=10).status_code == 404
        return {f.name: f for f in text_string_to_metric_families(r.text)}
    finally:
        server.shutdown()
        server.server_close()


def test_scrape_matches_the_audit() -> None:
    table = synthetic_table(600)
    result = audit(table, by=("namespace", "team"), price="2.50")
    state = ExporterState(("namespace", "team"))
    state.add(result, duration_s=0.5)
    fams = scrape(state)
    for name, (kind, _doc) in METRICS.items():
        base = name.removesuffix("_total") if kind == "counter" else name
        assert base in fams, name
        assert fams[base].type == kind
    cost = fams["gpuaudit_cost_dollars"].samples
    assert {s.labels["team"] for s in cost} == {"vision", "serving", '"><img src=x onerror=alert(2)>'}
    assert all(s.name == "gpuaudit_cost_dollars_total" for s in cost)
    total = sum(Decimal(repr(s.value)) for s in cost)
    assert abs(total - result.cost.total.observed_cost) < Decimal("0.000001")
    waste = sum(s.value for s in fams["gpuaudit_waste_dollars"].samples)
    assert abs(waste - float(result.cost.total.waste)) < 1e-6
    phase = fams["gpuaudit_phase_seconds"].samples
    assert {s.labels["phase"] for s in phase} == {"idle", "underutilized", "productive",
                                                 "compute_bound"}
    assert abs(sum(s.value for s in phase) - result.usage.overall().observed_s) < 1e-6
    per_ns: dict[str, float] = {}
    for s in cost:
        per_ns[s.labels["namespace"]] = per_ns.get(s.labels["namespace"], 0) + s.value
    assert per_ns["prod"] > 0 and per_ns["ml"] > 0
    assert {s.labels["gpu"] for s in cost} == {"GPU-0000", "GPU-0001", "GPU-0002"}


def test_label_values_are_escaped_in_the_exposition() -> None:
    table = synthetic_table(120)
    state = ExporterState(("pod",))
    state.add(audit(table, by=("pod",), price="1"))
    fams = scrape(state)
    pods = {s.labels["pod"] for s in fams["gpuaudit_cost_dollars"].samples}
    assert EVIL_POD in pods


def test_live_feed_counters_only_grow() -> None:
    """A fake sampler: batches arrive in an in-memory list, as the NVML sampler's do."""
    table = synthetic_table(900)
    batches = table.to_batches(max_chunksize=600)

    class FakeSampler:
        """Hands over pre-made batches through the sampler's public drain()."""

        origin, interval_s = "fake live sampler", 1.0

        class backend:
            source = "fake"

        def __init__(self) -> None:
            self.queued: list[Any] = []

        def drain(self) -> list[Any]:
            out, self.queued = self.queued, []
            return out

    sampler = FakeSampler()
    state = ExporterState(("team",))
    feed = LiveFeed(sampler, state, audit_kw={"price": "3"})
    assert feed.refresh() is False
    seen: list[float] = []
    for b in batches:
        sampler.queued.append(b)
        assert feed.refresh() is True
        seen.append(sum(float(a.cost) for a in state.totals.values()))
    assert seen == sorted(seen) and seen[0] > 0
    whole = audit(table, by=("team",), price="3").cost.total.observed_cost
    # each window's last sample stands for one interval: the sum matches to a few samples
    assert abs(seen[-1] - float(whole)) / float(whole) < 0.01


def test_live_feed_with_a_real_sampler_on_fake_nvml() -> None:
    import time

    from gpuaudit.measure.live.fake_nvml import FakeNvml
    from gpuaudit.measure.live.sampler import Sampler

    scenario = {"gpus": [{"name": "NVIDIA H100 80GB HBM3",
                          "pattern": {"kind": "square", "low": 0, "high": 100, "period_s": 0.4}},
                         {"name": "NVIDIA H100 80GB HBM3", "pattern": {"kind": "constant", "value": 40}}]}
    sampler = Sampler(FakeNvml.backend(scenario), interval_s=0.05, flush_s=0.2, process=False)
    state = ExporterState(())
    feed = LiveFeed(sampler, state, audit_kw={"price": "2"})
    sampler.start()
    try:
        time.sleep(1.0)
        assert feed.refresh() is True
        first = sum(float(a.cost) for a in state.totals.values())
        time.sleep(0.6)
        assert feed.refresh() is True
        second = sum(float(a.cost) for a in state.totals.values())
    finally:
        rec = sampler.stop()
    assert 0 < first < second
    # drained samples were handed to the exporter, not kept for the final recording
    assert rec.table.num_rows < 2 * 1.6 / 0.05


def test_listen_parsing() -> None:
    assert parse_listen("127.0.0.1:9402") == ("127.0.0.1", 9402)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen(":9402") == ("127.0.0.1", 9402)
    with pytest.raises(InputError, match="listen"):
        parse_listen("localhost")


def test_cli_needs_one_source() -> None:
    from gpuaudit.cli import main

    assert main(["exporter"]) == 2


def test_cli_serves_a_recording(tmp_path: Path) -> None:
    import socket
    import subprocess
    import time

    csv = Path(__file__).parents[1] / "data" / "html_report" / "nanogpt_8xh100_head.csv"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "gpuaudit.cli", "exporter", "--source",
                             str(csv), "--gpu-model", "H100", "--listen", f"127.0.0.1:{port}",
                             "--duration", "60"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                break
            except httpx.TransportError:
                time.sleep(0.2)
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        assert len(fams["gpuaudit_cost_dollars"].samples) == 8
    finally:
        proc.terminate()
        proc.wait(timeout=20)
