"""CPU beside the GPUs (issue 21): the meter over a scripted /proc-like reader (exact shares,
a process tree whose members come and go, pid reuse, the sampling process left out), the
thread and process samplers recording it on every device's row, and real psutil seeing a
real CPU-burning child."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaudit.measure.live.cpu import CpuMeter, FakeCpu, FakeProcess, PsutilCpu
from gpuaudit.measure.live.fake_nvml import FakeNvml
from gpuaudit.measure.live.sampler import Sampler
from gpuaudit.measure.live.sampler_process import ProcessSampler
from gpuaudit.schema import validate

TWO = {"gpus": [{"gpm": True}, {}]}


def test_first_reading_is_a_baseline_then_exact_shares() -> None:
    fake = FakeCpu(cores=8)
    fake.procs[100] = FakeProcess(ppid=1, start=5.0)
    fake.procs[101] = FakeProcess(ppid=100, start=6.0)
    m = CpuMeter(fake, root_pid=100)
    assert m.read() == (None, None)
    fake.advance(2.0, 75.0, {100: 2.0, 101: 4.0})  # 6 CPU-s of 16 in 2 s on 8 cores
    host, proc = m.read()
    assert host == pytest.approx(75.0)
    assert proc == pytest.approx(100.0 * 6.0 / 16.0)
    assert CpuMeter(fake).read() == (None, None)  # no root: the host only, and a baseline


def test_exited_child_keeps_its_time_and_a_reused_pid_is_new() -> None:
    fake = FakeCpu(cores=2)
    fake.procs[10] = FakeProcess(ppid=1, start=1.0)
    fake.procs[11] = FakeProcess(ppid=10, start=2.0, cpu_s=0.0)
    m = CpuMeter(fake, root_pid=10)
    m.read()
    fake.advance(1.0, 50.0, {11: 1.0})
    assert m.read()[1] == pytest.approx(50.0)
    del fake.procs[11]  # exits: its 1 CPU-s must not vanish (no negative share)
    fake.advance(1.0, 10.0)
    assert m.read()[1] == pytest.approx(0.0)
    fake.procs[11] = FakeProcess(ppid=10, start=9.0, cpu_s=0.5)  # pid reused: a new process
    fake.advance(1.0, 30.0)
    assert m.read()[1] == pytest.approx(25.0)


def test_the_sampling_process_is_left_out() -> None:
    fake = FakeCpu(cores=4)
    fake.procs[1] = FakeProcess(ppid=0, start=1.0)
    fake.procs[2] = FakeProcess(ppid=1, start=1.0)  # the sampler
    fake.procs[3] = FakeProcess(ppid=2, start=1.0)  # something it started
    fake.procs[4] = FakeProcess(ppid=1, start=1.0)  # a DataLoader worker
    m = CpuMeter(fake, root_pid=1, exclude_pid=2)
    m.read()
    fake.advance(1.0, 90.0, {2: 1.0, 3: 1.0, 4: 2.0})
    assert m.read()[1] == pytest.approx(50.0)


@st.composite
def lives(draw: st.DrawFn) -> list[tuple[list[tuple[int, float]], list[int], list[int]]]:
    """Steps of (burns (process, CPU-s), processes that exit, parents of new processes)."""
    return draw(st.lists(st.tuples(
        st.lists(st.tuples(st.integers(0, 30), st.floats(0.0, 3.0)), max_size=6),
        st.lists(st.integers(1, 30), max_size=2),
        st.lists(st.integers(0, 30), max_size=3)), min_size=1, max_size=25))


@settings(max_examples=60, deadline=None)
@given(lives())
def test_tree_share_accounts_for_every_cpu_second_read(steps) -> None:
    """Summed over readings, the tree's share gives back every CPU second its members had at
    their last reading (burns land before the reading, exits after it), never negative."""
    fake = FakeCpu(cores=64)
    fake.procs[1000] = FakeProcess(ppid=1, start=0.0)
    fake.procs[999] = FakeProcess(ppid=1, start=0.0)  # not in the tree: never counted
    alive = [1000]
    next_pid = 1001
    m = CpuMeter(fake, root_pid=1000)
    m.read()
    accounted = 0.0
    for burns, exits, spawns in steps:
        live_burns: dict[int, float] = {}
        for i, s in burns:
            pid = alive[i % len(alive)]
            live_burns[pid] = live_burns.get(pid, 0.0) + s
        live_burns[999] = 1.0
        fake.advance(1.0, 50.0, live_burns)
        _, proc = m.read()
        assert proc is not None and proc >= 0.0
        accounted += proc / 100.0 * 64 * 1.0
        for i in exits:
            if len(alive) > 1:
                pid = alive.pop(1 + i % (len(alive) - 1))
                # its children are re-parented to init: out of the tree from now on
                for q, p in fake.procs.items():
                    if p.ppid == pid:
                        p.ppid = 1
                        alive = [a for a in alive if a != q and not _under(fake, a, q)]
                del fake.procs[pid]
        for i in spawns:
            parent = alive[i % len(alive)]
            fake.procs[next_pid] = FakeProcess(ppid=parent, start=float(next_pid))
            alive.append(next_pid)
            next_pid += 1
    # every process that was ever in the tree, at its last reading
    expected = m._exited_s + sum(m._live.values())
    assert accounted == pytest.approx(expected, rel=1e-9, abs=1e-9)


def _under(fake: FakeCpu, pid: int, ancestor: int) -> bool:
    p = fake.procs.get(pid)
    while p is not None and p.ppid not in (0, 1):
        if p.ppid == ancestor:
            return True
        p = fake.procs.get(p.ppid)
    return False


@pytest.mark.parametrize("process", [False, True])
def test_samplers_record_the_fake_cpu_on_every_row(process: bool) -> None:
    fake = FakeCpu.steady(80.0, 30.0, root_pid=os.getpid(), cores=16)
    s = Sampler(FakeNvml.backend(TWO), interval_s=0.05, flush_s=0.2, process=process,
                cpu=fake, cpu_pid=os.getpid())
    assert isinstance(s, ProcessSampler) == process
    s.start()
    end = time.monotonic() + 30
    while s.stats().ticks < 25 and time.monotonic() < end:
        time.sleep(0.02)
    rec = s.stop()
    t = validate(rec.table, source="test")
    host = t.column("host_cpu_util_pct").to_numpy(zero_copy_only=False)
    proc = t.column("proc_cpu_util_pct").to_numpy(zero_copy_only=False)
    assert t.num_rows >= 50
    assert t.column("host_cpu_util_pct").null_count == 0, "every row has the host's CPU"
    assert np.allclose(host, 80.0) and np.allclose(proc, 30.0)


def test_no_root_no_process_share_and_cpu_off_is_null() -> None:
    s = Sampler(FakeNvml.backend(TWO), interval_s=0.05,
                cpu=FakeCpu.steady(40.0, 0.0, root_pid=1)).start()
    time.sleep(0.8)
    t = s.stop().table
    assert t.column("proc_cpu_util_pct").null_count == t.num_rows
    assert t.column("host_cpu_util_pct").null_count == 0
    s = Sampler(FakeNvml.backend(TWO), interval_s=0.05, cpu=False).start()
    time.sleep(0.3)
    t = s.stop().table
    assert t.column("host_cpu_util_pct").null_count == t.num_rows > 0


class _Broken(FakeCpu):
    def host_times(self) -> tuple[float, float]:
        if self.now_s > 2:
            raise OSError("/proc went away")
        self.now_s += 1
        return super().host_times()


def test_a_failing_reader_is_an_event_not_a_crash() -> None:
    s = Sampler(FakeNvml.backend(TWO), interval_s=0.05,
                cpu=_Broken.steady(50.0, 10.0, root_pid=os.getpid()),
                cpu_pid=os.getpid()).start()
    time.sleep(1.5)
    rec = s.stop()
    assert rec.table.num_rows > 0
    assert any("CPU reading failed" in e and "/proc went away" in e for e in rec.events)


_BURN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


@pytest.mark.parametrize("process", [False, True])
def test_real_psutil_sees_a_real_cpu_burning_child(process: bool) -> None:
    """A real child spinning one core shows in the workload's share, which never exceeds
    the host's (the host runs it and more)."""
    s = Sampler(FakeNvml.backend(TWO), interval_s=0.1, process=process, cpu=PsutilCpu(),
                cpu_pid=os.getpid()).start()
    child = subprocess.Popen([sys.executable, "-c", _BURN.format(s=2.5)])
    child.wait(60)
    time.sleep(0.6)
    t = validate(s.stop().table, source="test")
    host = t.column("host_cpu_util_pct").to_numpy(zero_copy_only=False)
    proc = t.column("proc_cpu_util_pct").to_numpy(zero_copy_only=False)
    ok = ~np.isnan(host) & ~np.isnan(proc)
    assert ok.sum() >= 10
    assert np.nanmax(proc) > 0.0
    # whole-run means: per-reading jitter between /proc/stat and the clock averages out
    ncpu = os.cpu_count() or 1
    assert float(proc[ok].mean()) <= float(host[ok].mean()) + 100.0 / ncpu * 0.1 + 2.0


def test_psutil_reader_host_times_are_cumulative() -> None:
    r = PsutilCpu()
    b1, t1 = r.host_times()
    b2, t2 = r.host_times()
    assert 0 <= b1 <= t1 and t2 >= t1 and b2 >= b1
    got = r.process(os.getpid())
    assert got is not None and got[1] > 0
    assert r.process(2**22 + 12345) is None  # beyond pid_max: gone


def test_monitor_records_cpu(tmp_path: Path) -> None:
    from gpuaudit.monitor import Monitor

    fake = FakeCpu.steady(60.0, 20.0, root_pid=os.getpid(), cores=8)
    with Monitor(hz=20, backend=FakeNvml.backend(TWO), quiet=True, process=False,
                 cpu=fake) as m:
        time.sleep(0.8)
    assert m.recording is not None
    col = m.recording.table.column("proc_cpu_util_pct")
    assert col.null_count == 0 and np.allclose(col.to_numpy(), 20.0)
