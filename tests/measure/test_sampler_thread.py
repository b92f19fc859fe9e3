"""Sampler: rows and nulls as read, per-GPU time order, faults contained, marks and counters."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.measure.live.fake_nvml import FakeNvml
from gpuaudit.measure.live.nvml import READ_COLUMNS, Device, GpuLostError
from gpuaudit.measure.live.sampler import Sampler, _Buffer
from gpuaudit.monitor import Monitor, monitored
from gpuaudit.schema import validate


def _wait_ticks(s: Sampler, n: int, limit_s: float = 10.0) -> None:
    end = time.monotonic() + limit_s
    while s.stats().ticks < n and time.monotonic() < end:
        time.sleep(0.005)


class ScriptedBackend:
    """A backend whose readings and failures the test chooses."""

    source = "test"

    def __init__(self, devices: int = 2, fail: BaseException | None = None,
                 hang: threading.Event | None = None, delay_s: float = 0.0) -> None:
        self.devs = [Device(f"GPU-{i}", i, "T") for i in range(devices)]
        self.fail = fail
        self.hang = hang
        self.delay_s = delay_s
        self.warnings: list[str] = []
        self.notes: list[str] = []
        self.reads = 0

    def open(self) -> list[Device]:
        return self.devs

    def read(self, device: Device) -> dict[str, Any]:
        self.reads += 1
        if self.hang is not None:
            self.hang.wait()
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail is not None and self.reads > 4:
            raise self.fail
        return {"util_gpu_pct": float(self.reads % 101), "power_w": None}

    def close(self) -> None:
        pass


def test_rows_are_per_device_in_time_order_and_valid(tmp_path: Path) -> None:
    s = Sampler(FakeNvml.backend({"gpus": [{"gpm": True}, {"mig": [{}]}]}), interval_s=0.005,
                flush_s=0.02, output=tmp_path / "r.parquet", labels={"team": "vision"})
    s.start()
    _wait_ticks(s, 30)
    rec = s.stop()
    t = rec.table
    stats = s.stats()
    assert t.num_rows == stats.ticks * 3 == stats.rows
    validate(t, source="test")  # strict order per GPU, ranges
    assert set(pc.unique(t.column("gpu_uuid").cast("string")).to_pylist()) == {
        d.uuid for d in s.devices}
    labels = t.column("labels").to_pylist()
    assert all(dict(x) == {"team": "vision"} for x in labels)
    assert json.loads(rec.meta["sampler"])["ticks"] == stats.ticks


def test_internal_error_stops_sampling_and_is_recorded() -> None:
    s = Sampler(ScriptedBackend(fail=RuntimeError("boom")), interval_s=0.002)
    s.start()
    s._thread.join(5)  # type: ignore[union-attr]  # it stops by itself
    rec = s.stop()     # and stop() neither raises nor hangs
    assert any("internal error" in e and "boom" in e for e in rec.events)
    assert rec.table.num_rows == 4  # two whole ticks before the failing read


def test_hung_backend_cannot_hang_stop() -> None:
    gate = threading.Event()
    s = Sampler(ScriptedBackend(hang=gate), interval_s=0.01, stop_timeout_s=0.2)
    s.start()
    time.sleep(0.05)
    rec = s.stop()
    gate.set()
    assert any("did not stop" in e for e in rec.events)


def test_overrun_ticks_are_counted_missed_not_queued() -> None:
    s = Sampler(ScriptedBackend(devices=1, delay_s=0.03), interval_s=0.01)
    s.start()
    _wait_ticks(s, 4)
    s.stop()
    st_ = s.stats()
    assert st_.missed >= st_.ticks - 1 > 0  # each tick covers >= 3 deadlines


def test_gpu_lost_only_drops_that_gpu() -> None:
    class LosesOne(ScriptedBackend):
        def read(self, device: Device) -> dict[str, Any]:
            r = super().read(device)
            if device.index == 1 and self.reads > 6:
                raise GpuLostError("GPU is lost", code=15, call="x")
            return r

    s = Sampler(LosesOne(devices=2), interval_s=0.002)
    s.start()
    _wait_ticks(s, 20)
    rec = s.stop()
    counts = rec.table.group_by("gpu_uuid").aggregate([("ts", "count")])
    d = dict(zip(counts.column("gpu_uuid").cast("string").to_pylist(),
                 counts.column("ts_count").to_pylist()))
    assert d["GPU-1"] < d["GPU-0"]
    assert len(rec.events) == 1 and "GPU-1" in rec.events[0]


def test_marks_steps_and_totals() -> None:
    with Monitor({"project": "resnet"}, hz=200,
                 backend=FakeNvml.backend({"gpus": [{}]})) as m:
        for _ in range(5):
            m.step(samples=32, tokens=1000)
        m.mark("epoch 1")
    assert m.totals == {"steps": 5, "samples": 160, "tokens": 5000}
    rec = m.recording
    assert rec is not None
    assert json.loads(rec.meta["counters"]) == {"steps": 5, "samples": 160, "tokens": 5000}
    assert [x[1] for x in json.loads(rec.meta["marks"])] == ["epoch 1"]
    assert isinstance(m.report(), str)


def test_monitor_without_gpu_runs_the_block(capsys: pytest.CaptureFixture[str]) -> None:
    ran = []
    with Monitor(backend=FakeNvml.backend({"missing": ["nvmlInit"]})) as m:
        ran.append(1)
        m.step()
    assert ran and m.recording is None
    assert "nothing will be sampled" in capsys.readouterr().err
    assert "nothing sampled" in m.report()


def test_monitored_decorator_keeps_the_result(capsys: pytest.CaptureFixture[str]) -> None:
    @monitored({"team": "x"}, hz=100, backend=FakeNvml.backend({"gpus": [{}]}))
    def work(n: int) -> int:
        time.sleep(0.05)
        return n * 2

    assert work(21) == 42
    assert work.gpuaudit_monitor.recording.table.num_rows > 0  # type: ignore[attr-defined]
    assert "gpuaudit" in capsys.readouterr().err


_values = st.one_of(st.none(), st.floats(0, 100, allow_nan=False))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.dictionaries(
    st.sampled_from([c for c in READ_COLUMNS if c not in ("clocks_event_reasons",
                                                          "ecc_dbe_total")]), _values)),
    min_size=1, max_size=30), st.lists(st.none() | st.integers(0, 2**40), min_size=1,
                                       max_size=1))
def test_buffer_keeps_every_value_and_every_null(rows: list, ecc: list) -> None:
    s = Sampler(ScriptedBackend(devices=3), interval_s=1.0)
    s.devices = ScriptedBackend(devices=3).devs
    buf = _Buffer(len(rows))
    for k, (dev, reading) in enumerate(rows):
        buf.add(1_700_000_000_000_000_000 + k, dev, {**reading, "ecc_dbe_total": ecc[0]})
    batch = s._build(buf)
    assert batch is not None and batch.num_rows == len(rows)
    for col in READ_COLUMNS:
        if col == "clocks_event_reasons":
            continue
        got = batch.column(col).to_pylist()
        want = [(r if col != "ecc_dbe_total" else {**r, col: ecc[0]}).get(col)
                for _, r in rows]
        for g, w in zip(got, want):
            assert (g is None) == (w is None), col
            if w is not None:
                assert g == pytest.approx(w, rel=1e-6, abs=1e-6)
    assert np.array_equal(batch.column("gpu_index").to_numpy(), [d for d, _ in rows])
