"""CPU beside the GPUs (issue 21): the host's CPU and the measured workload's process tree.

:class:`CpuMeter` turns cumulative CPU times into the sample table's ``host_cpu_util_pct`` and
``proc_cpu_util_pct``, both percent of ALL the host's cores over the time since its previous
reading:

- host: ``psutil.cpu_times()`` (``/proc/stat``'s first line, every core summed): busy is every
  mode but ``idle`` and ``iowait`` (a CPU waiting on I/O runs nothing), the same split the fleet
  path takes from node_exporter's ``node_cpu_seconds_total``;
- process tree: the root pid and all its descendants (``Process.children(recursive=True)``),
  each one's ``cpu_times()`` user + system. A process is known by (pid, start time), so a
  reused pid is a new process. One that exits keeps the CPU time last read from it (its
  share never vanishes, and the tree's total never runs backwards); what it spent after
  that last reading and before it exited is not seen (at most one interval per short-lived
  process). ``exclude_pid`` (the separate sampling process) and its descendants are left out.

The reading goes through a :class:`CpuReader` seam, as NVML goes through a backend:
:class:`PsutilCpu` reads the machine, :class:`FakeCpu` is a scripted host and process table for
tests (and for users testing their own integrations). A reader's failure is never the
workload's: the sampler records it as an event and the columns stay null.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["CpuMeter", "CpuReader", "FakeCpu", "FakeProcess", "PsutilCpu"]


class CpuReader(Protocol):
    """Cumulative CPU times, as ``/proc`` has them."""

    def host_times(self) -> tuple[float, float]:
        """(busy seconds, total seconds) summed over every core since boot."""
        ...

    def cpu_count(self) -> int:
        """Logical CPUs of the host."""
        ...

    def monotonic_s(self) -> float:
        """A monotonic clock in seconds (the interval a process's CPU time is divided by)."""
        ...

    def process(self, pid: int) -> tuple[float, float] | None:
        """(start time, user + system CPU seconds) of ``pid``; None once it is gone."""
        ...

    def descendants(self, pid: int) -> list[int]:
        """Every live descendant of ``pid`` (children, grandchildren, ...); [] if gone."""
        ...


class PsutilCpu:
    """:class:`CpuReader` over psutil (``/proc`` on Linux). Holds no state: it pickles into
    the sampling process."""

    def host_times(self) -> tuple[float, float]:
        import psutil

        t = psutil.cpu_times()
        d = t._asdict()
        # on Linux guest and guest_nice are already inside user and nice: not added twice
        total = sum(v for k, v in d.items() if k not in ("guest", "guest_nice"))
        idle = d.get("idle", 0.0) + d.get("iowait", 0.0)
        return total - idle, total

    def cpu_count(self) -> int:
        import psutil

        return int(psutil.cpu_count(logical=True) or os.cpu_count() or 1)

    def monotonic_s(self) -> float:
        import time

        return time.monotonic()

    def process(self, pid: int) -> tuple[float, float] | None:
        import psutil

        try:
            p = psutil.Process(pid)
            with p.oneshot():
                t = p.cpu_times()
                return p.create_time(), float(t.user + t.system)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None

    def descendants(self, pid: int) -> list[int]:
        import psutil

        try:
            return [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return []


@dataclass
class FakeProcess:
    """One process of a :class:`FakeCpu` table: parent, start time, CPU seconds so far."""

    ppid: int
    start: float
    cpu_s: float = 0.0


@dataclass
class FakeCpu:
    """A scripted host for tests: ``cores`` logical CPUs, cumulative host busy/total seconds,
    a process table (pid -> :class:`FakeProcess`) and a clock, all set by the test.

    ``steady(host_pct, proc_pct)`` makes a reader that advances by itself: each
    :meth:`host_times` call moves the clock ``step_s`` on with the host ``host_pct`` busy and
    the process ``proc_pct`` (percent of all cores) of it, so a sampling process that holds a
    pickled copy reads known figures."""

    cores: int = 4
    now_s: float = 0.0
    busy_s: float = 0.0
    total_s: float = 0.0
    procs: dict[int, FakeProcess] = field(default_factory=dict)
    step_s: float = 0.0
    host_pct: float = 0.0
    proc_pct: float = 0.0
    proc_pid: int | None = None

    @classmethod
    def steady(cls, host_pct: float, proc_pct: float, *, root_pid: int, cores: int = 4,
               step_s: float = 1.0) -> FakeCpu:
        fake = cls(cores=cores, step_s=step_s, host_pct=host_pct, proc_pct=proc_pct,
                   proc_pid=root_pid)
        fake.procs[root_pid] = FakeProcess(ppid=0, start=1.0)
        return fake

    def advance(self, dt_s: float, host_pct: float,
                proc_s: Mapping[int, float] | None = None) -> None:
        """Move time on ``dt_s`` with the host ``host_pct`` busy; add ``proc_s`` CPU seconds
        to the named processes."""
        self.now_s += dt_s
        self.total_s += dt_s * self.cores
        self.busy_s += dt_s * self.cores * host_pct / 100.0
        for pid, s in (proc_s or {}).items():
            self.procs[pid].cpu_s += s

    def host_times(self) -> tuple[float, float]:
        if self.step_s > 0:
            pid = self.proc_pid
            self.advance(self.step_s, self.host_pct,
                         {pid: self.step_s * self.cores * self.proc_pct / 100.0}
                         if pid is not None else None)
        return self.busy_s, self.total_s

    def cpu_count(self) -> int:
        return self.cores

    def monotonic_s(self) -> float:
        return self.now_s

    def process(self, pid: int) -> tuple[float, float] | None:
        p = self.procs.get(pid)
        return None if p is None else (p.start, p.cpu_s)

    def descendants(self, pid: int) -> list[int]:
        if pid not in self.procs:
            return []
        out: list[int] = []
        frontier = [pid]
        while frontier:
            parent = frontier.pop()
            kids = [q for q, p in self.procs.items() if p.ppid == parent and q != parent]
            out += kids
            frontier += kids
        return out


class CpuMeter:
    """Host and process-tree CPU busy share between successive :meth:`read` calls.

    ``root_pid`` None: the host only. The first reading sets the baseline and returns
    (None, None): a share needs an interval."""

    def __init__(self, reader: CpuReader, root_pid: int | None = None,
                 exclude_pid: int | None = None) -> None:
        self.reader = reader
        self.root_pid = root_pid
        self.exclude_pid = exclude_pid
        self.cores = max(1, int(reader.cpu_count()))
        self._host: tuple[float, float] | None = None
        self._t: float | None = None
        #: (pid, start) -> CPU seconds last read, for the live members of the tree
        self._live: dict[tuple[int, float], float] = {}
        #: CPU seconds of the members that have exited, as last read from them
        self._exited_s = 0.0
        self._tree_s: float | None = None

    def _tree_cpu_s(self) -> float:
        r, root = self.reader, self.root_pid
        assert root is not None
        pids = [root, *r.descendants(root)]
        if self.exclude_pid is not None and self.exclude_pid in pids:
            skip = {self.exclude_pid, *r.descendants(self.exclude_pid)}
            pids = [p for p in pids if p not in skip]
        now: dict[tuple[int, float], float] = {}
        for pid in pids:
            got = r.process(pid)
            if got is None:
                continue  # exited between the listing and the read: kept below if known
            key = (pid, got[0])
            now[key] = max(got[1], self._live.get(key, 0.0))
        for key, s in self._live.items():
            if key not in now:
                self._exited_s += s
        self._live = now
        return self._exited_s + sum(now.values())

    def read(self) -> tuple[float | None, float | None]:
        """(host %, process tree %) of all cores since the previous call, clipped to 0..100
        (None: no interval yet, or no root)."""
        busy, total = self.reader.host_times()
        t = self.reader.monotonic_s()
        tree = self._tree_cpu_s() if self.root_pid is not None else None
        host_pct = proc_pct = None
        if self._host is not None:
            d_total = total - self._host[1]
            if d_total > 0:
                host_pct = _clip(100.0 * (busy - self._host[0]) / d_total)
        if tree is not None and self._tree_s is not None and self._t is not None:
            dt = t - self._t
            if dt > 0:
                proc_pct = _clip(100.0 * (tree - self._tree_s) / (dt * self.cores))
        self._host, self._t, self._tree_s = (busy, total), t, tree
        return host_pct, proc_pct


def _clip(x: float) -> float:
    return min(100.0, max(0.0, x))
