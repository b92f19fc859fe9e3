"""The sampler in a separate process: rate under a GIL-busy parent, marks and counters
arrive, a killed or hung child never hurts the caller and loses at most one flush."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.errors import InputError, SourceUnavailableError
from gpuaudit.measure.live.fake_nvml import FakeNvml
from gpuaudit.measure.live.nvml import NvmlBackend
from gpuaudit.measure.live.recorder import (
    JOURNAL_SUFFIX,
    Extras,
    read_recording,
    recover_recording,
)
from gpuaudit.measure.live.sampler import Sampler
from gpuaudit.measure.live.sampler_child import apply_message
from gpuaudit.measure.live.sampler_process import ProcessSampler
from gpuaudit.monitor import Monitor
from gpuaudit.schema import validate

TWO = {"gpus": [{"gpm": True, "pattern": {"kind": "square", "period_s": 0.2}}, {}]}


def _wait(pred: Any, limit_s: float = 30.0) -> None:
    end = time.monotonic() + limit_s
    while not pred() and time.monotonic() < end:
        time.sleep(0.01)
    assert pred(), "condition not reached"


def _per_gpu(rec: Any) -> dict[str, int]:
    counts = rec.table.group_by("gpu_uuid").aggregate([("ts", "count")])
    return dict(zip(counts.column("gpu_uuid").cast("string").to_pylist(),
                    counts.column("ts_count").to_pylist()))


def pid_backend() -> NvmlBackend:
    """A factory (module level, so it pickles by name) whose backend says where it ran."""
    backend = FakeNvml.backend({"gpus": [{}]})
    backend.source = f"fake-in-pid-{os.getpid()}"  # type: ignore[misc]
    return backend


def broken_factory() -> NvmlBackend:
    raise RuntimeError("factory exploded")


def test_process_mode_records_rows_marks_and_counters(tmp_path: Path) -> None:
    out = tmp_path / "p.parquet"
    s = Sampler(FakeNvml.backend({"gpus": [{"gpm": True}, {"mig": [{}]}]}), interval_s=0.01,
                flush_s=0.1, output=out, labels={"team": "vision"}, process=True)
    assert isinstance(s, ProcessSampler)
    s.start()
    assert s.pid != os.getpid() and len(s.devices) == 3
    for k in range(50):
        s.step(samples=8, tokens=100)
        if k % 10 == 0:
            s.mark(f"m{k}")
    _wait(lambda: s.stats().ticks >= 20)
    s.mark("last")  # right before stop: must still arrive
    rec = s.stop()
    assert not s.running
    validate(rec.table, source="test")
    stats = s.stats()
    assert rec.table.num_rows == stats.rows == stats.ticks * 3 > 0
    assert stats.process_cpu_s is not None and stats.process_cpu_s > 0
    assert set(_per_gpu(rec)) == {d.uuid for d in s.devices}
    assert all(dict(x) == {"team": "vision"} for x in rec.table.column("labels").to_pylist())
    marks = json.loads(rec.meta["marks"])
    assert [m[1] for m in marks] == ["m0", "m10", "m20", "m30", "m40", "last"]
    ts = rec.table.column("ts").cast("int64")
    first, last = pc.min(ts).as_py(), pc.max(ts).as_py()
    assert all(first - 10**9 < m[0] < last + 10**9 for m in marks)  # one clock
    assert json.loads(rec.meta["counters"]) == {"steps": 50, "samples": 400, "tokens": 5000}
    assert out.exists() and not Path(str(out) + JOURNAL_SUFFIX).exists()
    assert read_recording(out).table.num_rows == rec.table.num_rows
    assert s.stop() is rec  # idempotent


def test_in_memory_process_mode_leaves_no_files() -> None:
    s = Sampler(FakeNvml.backend(TWO), interval_s=0.01, process=True).start()
    tmp = s._tmpdir  # type: ignore[attr-defined]
    assert tmp is not None and Path(tmp).exists()
    _wait(lambda: s.stats().ticks >= 5)
    rec = s.stop()
    assert rec.table.num_rows >= 10 and not Path(tmp).exists()


def test_rate_held_with_a_gil_busy_main_thread() -> None:
    hz, spin_s = 100.0, 2.0
    s = Sampler(FakeNvml.backend(TWO), interval_s=1 / hz, process=True).start()
    x = 0
    end = time.monotonic() + spin_s
    while time.monotonic() < end:  # pure Python: holds the GIL between switch intervals
        for i in range(1000):
            x += i * i
    rec = s.stop()
    counts = _per_gpu(rec)
    # sample counts, not speed: >= 80 % of the ticks the spin alone spans
    assert len(counts) == 2 and min(counts.values()) >= 0.8 * spin_s * hz, counts


def test_child_sigkill_loses_at_most_one_flush_and_is_recoverable(tmp_path: Path) -> None:
    out = tmp_path / "k.parquet"
    flush_s = 0.2
    s = Sampler(FakeNvml.backend(TWO), interval_s=0.01, flush_s=flush_s, output=out,
                process=True).start()
    s.mark("before")
    s.step(3)
    _wait(lambda: s.stats().rows >= 100)
    assert s.pid is not None
    kill_ns = time.time_ns()
    os.kill(s.pid, signal.SIGKILL)
    _wait(lambda: not s.running)
    s.mark("after")  # the caller goes on as if nothing happened
    s.step(2)
    early = recover_recording(out)  # readable before anyone finalises it
    assert early.table.num_rows > 0 and "recovered" in early.notes[0].reason
    rec = s.stop()
    assert any("SIGKILL" in e for e in rec.events), rec.events
    last_ns = pc.max(rec.table.column("ts").cast("int64")).as_py()
    # the journal is fsynced every flush_s; allow scheduling slack on a loaded machine
    assert kill_ns - last_ns <= (flush_s + 1.0) * 1e9
    assert rec.table.num_rows >= early.table.num_rows
    final = read_recording(out)  # the parent finalised the journal
    assert [m[1] for m in json.loads(final.meta["marks"])] == ["before", "after"]
    assert json.loads(final.meta["counters"])["steps"] == 5
    assert any("SIGKILL" in e for e in final.events)
    assert not Path(str(out) + JOURNAL_SUFFIX).exists()


def test_hung_child_is_killed_and_stop_returns(tmp_path: Path) -> None:
    out = tmp_path / "h.parquet"
    s = Sampler(FakeNvml.backend(TWO), interval_s=0.01, flush_s=0.1, output=out,
                stop_timeout_s=0.5, process=True).start()
    _wait(lambda: s.stats().rows >= 20)
    assert s.pid is not None
    os.kill(s.pid, signal.SIGSTOP)
    try:
        s.mark("while hung")
        rec = s.stop()
    finally:
        if s._proc is not None and s._proc.poll() is None:  # type: ignore[attr-defined]
            os.kill(s.pid, signal.SIGKILL)
    assert any("sent nothing" in e and "SIGKILL" in e for e in rec.events), rec.events
    assert rec.table.num_rows > 0
    assert "while hung" in rec.meta["marks"]


def test_unpicklable_backend_is_an_input_error_or_a_thread() -> None:
    backend = FakeNvml.backend(TWO)
    backend.lock = threading.Lock()  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="cannot be sent"):
        Sampler(backend, interval_s=0.01, process=True).start()
    auto = Sampler(backend, interval_s=0.01, process=None)  # 100 Hz: would be a process
    assert type(auto) is Sampler
    assert any("cannot be sent" in n for n in auto.extras.notes)
    assert type(Sampler(FakeNvml.backend(TWO), interval_s=0.01, process=None)) is \
        ProcessSampler
    assert type(Sampler(FakeNvml.backend(TWO), interval_s=0.1, process=None)) is Sampler


def test_factory_is_called_in_the_child() -> None:
    s = Sampler(pid_backend, interval_s=0.01, process=True).start()
    _wait(lambda: s.stats().ticks >= 3)
    rec = s.stop()
    assert rec.source == f"fake-in-pid-{s.pid}" and s.pid != os.getpid()
    assert rec.table.num_rows > 0


def test_start_failures_surface_as_errors_and_monitor_runs_unmeasured(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SourceUnavailableError, match="libnvidia-ml"):
        Sampler(FakeNvml.backend({"missing": ["nvmlInit"]}), interval_s=0.01,
                process=True).start()
    with pytest.raises(SourceUnavailableError, match="factory exploded"):
        Sampler(broken_factory, interval_s=0.01, process=True).start()
    ran = []
    with Monitor(hz=100, process=True, backend=FakeNvml.backend({"missing": ["nvmlInit"]})):
        ran.append(1)
    assert ran and "nothing will be sampled" in capsys.readouterr().err


def test_monitor_process_mode_marks_and_report(tmp_path: Path) -> None:
    with Monitor({"project": "resnet"}, hz=100, output=tmp_path / "m.parquet",
                 backend=FakeNvml.backend(TWO)) as m:  # hz=100: a process by default
        assert isinstance(m._sampler, ProcessSampler)
        for _ in range(4):
            m.step(samples=16)
        m.mark("epoch 1")
        _wait(lambda: m.stats.ticks >= 10)
    rec = m.recording
    assert rec is not None and rec.table.num_rows > 0
    assert json.loads(rec.meta["counters"]) == {"steps": 4, "samples": 64, "tokens": None}
    assert "epoch 1" in rec.meta["marks"]
    assert isinstance(m.report(), str)


_SCRIPT = """
import os, signal, sys, time
from gpuaudit.measure.live.fake_nvml import FakeNvml
import gpuaudit.monitor as mon
m = mon.Monitor(hz=100, output=sys.argv[1], flush_s=0.1, process=True,
                backend=FakeNvml.backend({{"gpus": [{{}}]}}))
m.start()
end = time.monotonic() + 30
while m.stats.rows < 30 and time.monotonic() < end:
    time.sleep(0.01)
{body}
"""


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(_SCRIPT.format(body=textwrap.dedent(body)))
    return path


def test_parent_exits_cleanly_when_its_sampler_dies(tmp_path: Path) -> None:
    out = tmp_path / "job.parquet"
    body = """
    os.kill(m._sampler.pid, signal.SIGKILL)
    for k in range(20):
        m.step(); time.sleep(0.01)
    m.mark("done")
    rec = m.stop()
    print("rows", rec.table.num_rows, flush=True)
    """
    p = subprocess.run([sys.executable, str(_script(tmp_path, body)), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.split()[1]) > 0
    rec = read_recording(out)
    assert any("SIGKILL" in e for e in rec.events)
    assert json.loads(rec.meta["counters"])["steps"] == 20


def test_sampler_finalises_when_its_parent_is_killed(tmp_path: Path) -> None:
    out = tmp_path / "orphan.parquet"
    body = """
    print("sampling", flush=True)
    time.sleep(60)
    """
    p = subprocess.Popen([sys.executable, str(_script(tmp_path, body)), str(out)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "sampling"
    p.kill()
    p.wait(30)
    _wait(out.exists, limit_s=60)  # the orphaned child read EOF and finalised
    _wait(lambda: not Path(str(out) + JOURNAL_SUFFIX).exists(), limit_s=10)
    rec = read_recording(out)
    assert rec.table.num_rows >= 30
    assert any("ended without stopping" in e for e in rec.events)


_ops = st.lists(st.one_of(
    st.tuples(st.just("mark"), st.text(max_size=5)),
    st.tuples(st.just("step"), st.integers(0, 5), st.none() | st.floats(0, 1e6)),
    st.tuples(st.just("send")),
), max_size=40)


class _Pipe:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, msg: Any) -> None:
        self.sent.append(msg)


@settings(max_examples=60, deadline=None)
@given(_ops)
def test_batched_link_delivers_every_mark_and_the_final_counters(ops: list[Any]) -> None:
    """Whatever the interleaving of mark/step and link sends, the child ends with the
    parent's marks (in order, once each) and counters."""
    s = ProcessSampler(FakeNvml.backend(TWO), interval_s=0.01)
    pipe = _Pipe()
    s._cmd = pipe  # type: ignore[assignment]
    for op in ops:
        if op[0] == "mark":
            s.mark(op[1])
        elif op[0] == "step":
            s.step(op[1], samples=op[2])
        else:
            s._send("x")
    s._send("stop")
    child = Extras(counters={"steps": 0, "samples": None, "tokens": None})
    stops = [apply_message(child, msg) for msg in pipe.sent]
    assert stops[-1] and not any(stops[:-1])
    assert child.marks == s.extras.marks
    assert child.counters == s.extras.counters


def test_sigterm_to_the_child_stops_and_finalises(tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    s = Sampler(FakeNvml.backend(TWO), interval_s=0.01, flush_s=0.1, output=out,
                process=True).start()
    s.mark("one")
    _wait(lambda: s.stats().ticks >= 10)
    assert s.pid is not None
    os.kill(s.pid, signal.SIGTERM)
    _wait(lambda: not s.running)
    rec = s.stop()
    assert any("SIGTERM" in e for e in rec.events), rec.events
    assert not any("SIGKILL" in e for e in rec.events)
    assert rec.table.num_rows > 0 and read_recording(out).table.num_rows == rec.table.num_rows


def test_an_idle_recording_wakes_the_link_only_for_news() -> None:
    """Issue 27 (CPU of `sample --process` at 10 Hz): with no mark or step, the parent sends
    the sampling process nothing until stop, and the child's heartbeat comes about once a
    second, not once per 0.1 s link period; a mark still reaches the child before stop."""
    s = Sampler(FakeNvml.backend(TWO), interval_s=0.1, process=True).start()
    assert isinstance(s, ProcessSampler) and s._cmd is not None
    sent: list[str] = []
    received: list[str] = []
    cmd = s._cmd
    send, handle = cmd.send, s._handle

    def spy_send(msg: Any) -> None:
        sent.append(msg[0])
        send(msg)

    def spy_handle(msg: Any) -> None:
        received.append(msg[0])
        handle(msg)

    cmd.send = spy_send  # type: ignore[method-assign]
    s._handle = spy_handle  # type: ignore[method-assign]
    try:
        time.sleep(2.5)
        idle_sent, idle_beats = list(sent), received.count("beat")
        s.mark("now")
        _wait(lambda: "x" in sent)  # the mark woke the link before any stop
    finally:
        rec = s.stop()
    assert idle_sent == [], idle_sent
    assert idle_beats <= 4, idle_beats  # ~25 at one beat per 0.1 s; a busy machine sends fewer
    assert [m[1] for m in json.loads(rec.meta["marks"])] == ["now"]
