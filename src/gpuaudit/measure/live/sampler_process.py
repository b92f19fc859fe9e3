"""The sampler in a separate process: the parent keeps marks and counters, the child samples.

``Sampler(backend, process=True)`` builds a :class:`ProcessSampler`. Its ``start`` runs
:func:`gpuaudit.measure.live.sampler_child.main` in a fresh interpreter (``python -c``: nothing
of the workload's ``__main__`` is imported again, unlike multiprocessing's "spawn") with two
pipes, sends it the pickled *unopened* backend (or a factory) and the settings, and waits
for it to open the backend. The child owns the backend, the deadline-scheduled sampling thread and the
crash-safe :class:`~gpuaudit.measure.live.recorder.Recorder`; its GIL is not the workload's, so a
busy workload cannot delay its ticks.

Messages (``multiprocessing.connection`` framing over the pipes, pickled tuples):

* parent -> child: first the settings and the pickled backend (a dict), then
  ``("x" | "stop", new_marks, new_events, counters)``: a link thread sends
  what :meth:`mark` / :meth:`step` collected, at most ``link_s`` after it (batched;
  ``mark``/``step`` only append under a lock and wake the link, so the workload never
  waits on the pipe; with nothing new, nothing is sent); ``stop`` also ends the recording.
* child -> parent: ``("ready", devices, wall0_ns, mono0_ns, source)`` or ``("error", kind,
  text)``; ``("beat", progress)`` every ``_IDLE_BEAT_S`` while sampling and every
  ``_BEAT_S`` once stopping; ``("done", stats)`` once finalised.

Idle, the two processes wake only for the ticks, the flushes and one heartbeat a second:
at 10 Hz a 0.1 s heartbeat and link poll used to cost as much CPU as the sampling itself.

Failure handling: a child that dies (SIGKILL, segfault in the driver) or stops answering
(no message for ``stop_timeout_s`` while stopping, or past ``finalize_timeout_s``) is killed;
the parent then finalises what the child journaled (at most one ``flush_s`` lost) with its
own marks and counters and an event naming what happened. The workload never sees an
exception: :meth:`mark`, :meth:`step` and :meth:`stop` keep working. If the *parent* dies,
the child reads end-of-file on its pipe and finalises the recording itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import gpuaudit
from gpuaudit.errors import InputError, SourceUnavailableError
from gpuaudit.measure.live.recorder import (
    JOURNAL_SUFFIX,
    read_recording,
    read_side_journal,
    recover_recording,
)
from gpuaudit.measure.live.sampler import Sampler, SamplerStats, _picklable
from gpuaudit.schema import SAMPLE_SCHEMA, Recording

__all__ = ["ProcessSampler"]

_CHILD_MODULE = "gpuaudit.measure.live.sampler_child"
_BEAT_S = 0.1  # the child's heartbeat period while it finalises (liveness during stop())
#: ... and while it samples (progress counts for stats()). Each beat wakes both processes,
#: so not at the tick rate: at 10 Hz a 0.1 s beat and link poll cost as much CPU as the
#: sampling itself (docs/benchmarks.md, "Live sampler").
_IDLE_BEAT_S = 1.0


class ProcessSampler(Sampler):
    """A :class:`Sampler` whose sampling runs in a child process (see the module doc).

    Extra settings: ``start_timeout_s`` (interpreter start, imports, ``nvmlInit``),
    ``finalize_timeout_s`` (the longest the child may take to write the Parquet file after
    sampling stopped, as long as it keeps sending heartbeats), ``link_s`` (how often marks
    and counters go to the child).
    """

    def __init__(self, backend: Any, *, start_timeout_s: float = 60.0,
                 finalize_timeout_s: float = 300.0, link_s: float = 0.1,
                 **kwargs: Any) -> None:
        super().__init__(backend, **kwargs)
        self.start_timeout_s = start_timeout_s
        self.finalize_timeout_s = finalize_timeout_s
        self.link_s = link_s
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._cmd: Connection | None = None
        self._res: Connection | None = None
        self._tmpdir: str | None = None
        self._out: Path | None = None
        self._source = "nvml"
        self._sent_marks = self._sent_events = 0
        self._sent_counters: dict[str, float | None] | None = None
        self._send_lock = threading.Lock()
        self._link_stop = threading.Event()
        self._dirty = threading.Event()  # set by mark/step/events: the link has news to send
        self._recv_lock = threading.Lock()  # one reader of the result pipe at a time
        self._link: threading.Thread | None = None
        self._beat: dict[str, Any] = {}
        self._final: dict[str, Any] | None = None
        self._gone: str | None = None  # why the child is no longer reachable
        self._last_msg = 0.0
        self._link_failed = False

    # -- start -----------------------------------------------------------------------------
    def start(self) -> ProcessSampler:
        """Start the sampling process; raises SourceUnavailableError if it cannot sample."""
        why = _picklable(self._spec)
        cpu_why = _picklable(self._cpu_spec)
        if cpu_why is not None:
            raise InputError(
                f"the CPU reader {type(self._cpu_spec).__name__} cannot be sent to the "
                f"sampling process ({cpu_why})", where="Sampler(process=True, cpu=...)",
                fix="pass a PsutilCpu, a FakeCpu or another picklable reader; or sample "
                "in-process with process=False")
        if why is not None:
            raise InputError(
                f"the backend {type(self._spec).__name__} cannot be sent to the sampling "
                f"process ({why})", where="Sampler(process=True)",
                fix="pass an unopened NvmlBackend, FakeNvml.backend(scenario) or a "
                "module-level factory function; or sample in-process with process=False")
        if self.output is None:
            self._tmpdir = tempfile.mkdtemp(prefix="gpuaudit-sampler-")
            self._out = Path(self._tmpdir) / "recording.parquet"
        else:
            self._out = Path(self.output)
            if not self._out.parent.exists():
                raise InputError(f"directory {self._out.parent} does not exist",
                                 where=str(self._out), fix="create it or choose another path")
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        # gpuaudit's own directory goes *last* on the child's path (found even when this
        # process got it from a sys.path edit, never shadowing the standard library)
        root = str(Path(gpuaudit.__file__).resolve().parent.parent)
        boot = (f"import sys; sys.path.append({root!r}); from {_CHILD_MODULE} import main; "
                "sys.exit(main(sys.argv[1:]))")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", boot, str(cmd_r), str(res_w)],
                pass_fds=(cmd_r, res_w), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL)
        except OSError as exc:
            for fd in (cmd_r, cmd_w, res_r, res_w):
                os.close(fd)
            self._cleanup()
            raise SourceUnavailableError(
                f"cannot start the sampling process ({sys.executable}): {exc}",
                fix="sample in-process with process=False (--no-process)") from exc
        os.close(cmd_r)
        os.close(res_w)
        self.pid = self._proc.pid
        self._cmd = Connection(cmd_w, readable=False)
        self._res = Connection(res_r, writable=False)
        config = {
            "sys_path": list(sys.path), "backend": pickle.dumps(self._spec),
            "interval_s": self.interval_s, "labels": dict(self.extras.labels),
            "output": str(self._out), "origin": self.origin, "flush_s": self.flush_s,
            "output_mode": self.output_mode,
            "host": self.host, "stop_timeout_s": self.stop_timeout_s, "beat_s": _BEAT_S,
            "idle_beat_s": _IDLE_BEAT_S,
            # the CPU reader and the workload's root pid (the child leaves itself out)
            "cpu": pickle.dumps(self._cpu_spec if self._cpu_spec is not None else False),
            "cpu_pid": self.cpu_pid,
        }
        try:
            self._cmd.send(config)
            msg = self._recv_until(time.monotonic() + self.start_timeout_s, {"ready", "error"})
        except OSError:
            msg = None
        if msg is None or msg[0] != "ready":
            self._abort()
            if msg is None:
                code = self._proc.returncode
                what = (f"the sampling process ended before it was ready (exit code {code})"
                        if code is not None and self._gone else
                        f"the sampling process did not start within "
                        f"{self.start_timeout_s:g} s")
                raise SourceUnavailableError(
                    what, fix="see its messages on stderr; or sample in-process with "
                    "process=False (--no-process)")
            _, kind, text = msg
            if kind == "input":
                raise InputError(text)
            if kind == "unavailable":
                raise SourceUnavailableError(text)
            raise SourceUnavailableError(f"the sampling process failed to start: {text}",
                                         fix="sample in-process with process=False")
        _, devices, self._wall0_ns, self._mono0_ns, self._source = msg
        self.devices = list(devices)
        self.start_ns = self._wall0_ns
        self._link = threading.Thread(target=self._link_loop, name="gpuaudit-sampler-link",
                                      daemon=True)
        self._link.start()
        return self

    @property
    def running(self) -> bool:
        return (self._proc is not None and self._proc.poll() is None and self._gone is None
                and self.recording is None)

    # -- the link thread -------------------------------------------------------------------
    def _link_loop(self) -> None:
        # Wakes when mark/step/an event has something new (then waits link_s more so that a
        # training loop's steps go as one message), else once per heartbeat to read it:
        # an idle recording costs one wake-up a second here, not one per link_s.
        while True:
            self._dirty.wait(_IDLE_BEAT_S)
            if self._link_stop.is_set() or self._gone is not None:
                return
            try:
                if self._dirty.is_set():
                    if self._link_stop.wait(self.link_s):
                        return  # stop() sends what is left itself
                    self._dirty.clear()
                    self._send("x")
                self._drain()
            except Exception as exc:  # a bug of ours; say it once, keep sampling
                if not self._link_failed:
                    self._link_failed = True
                    self._event(f"sending marks/counters to the sampling process failed: "
                                f"{type(exc).__name__}: {exc}")

    def _send(self, kind: str, timeout_s: float | None = None) -> bool:
        """Send new marks and events and the counters (if changed, or for ``stop``)."""
        if self._cmd is None or self._gone is not None:
            return False
        with self._lock:
            marks = self.extras.marks[self._sent_marks:]
            events = self.extras.events[self._sent_events:]
            counters = dict(self.extras.counters)
        if kind == "x" and not marks and not events and counters == self._sent_counters:
            return True
        if not self._send_lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            return False
        try:
            self._cmd.send((kind, marks, events, counters))
        except (OSError, ValueError):
            self._gone = self._gone or "its command pipe closed"
            return False
        finally:
            self._send_lock.release()
        self._sent_marks += len(marks)
        self._sent_events += len(events)
        self._sent_counters = counters
        return True

    def _handle(self, msg: Any) -> None:
        self._last_msg = time.monotonic()
        if msg[0] == "beat":
            self._beat = msg[1]
        elif msg[0] == "done":
            self._final = msg[1]

    def _drain(self) -> None:
        res = self._res
        if res is None or not self._recv_lock.acquire(blocking=False):
            return  # another thread is reading: it handles what is there
        try:
            while res.poll(0):
                self._handle(res.recv())
        except (EOFError, OSError):
            self._gone = self._gone or "it closed its pipe"
        finally:
            self._recv_lock.release()

    # -- the workload's signals: also wake the link ----------------------------------------
    def mark(self, text: str) -> None:
        super().mark(text)
        self._dirty.set()

    def step(self, steps: int = 1, samples: float | None = None,
             tokens: float | None = None) -> None:
        super().step(steps, samples, tokens)
        if not self._dirty.is_set():  # a training loop calls this often: no lock when set
            self._dirty.set()

    def _event(self, text: str) -> None:
        super()._event(text)
        self._dirty.set()

    def _recv_until(self, deadline: float, kinds: set[str],
                    silence_s: float | None = None) -> Any:
        """Read messages until one of ``kinds``; None at the deadline, after ``silence_s``
        without any message, or when the child is gone (``self._gone`` says why)."""
        with self._recv_lock:
            return self._recv_until_locked(deadline, kinds, silence_s)

    def _recv_until_locked(self, deadline: float, kinds: set[str],
                           silence_s: float | None) -> Any:
        res = self._res
        assert res is not None and self._proc is not None
        self._last_msg = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= deadline:
                return None
            if silence_s is not None and now - self._last_msg > silence_s:
                self._gone = self._gone or (f"it sent nothing for {silence_s:g} s "
                                            "(hung?) and was killed")
                return None
            try:
                if res.poll(min(0.05, deadline - now)):
                    msg = res.recv()
                    self._handle(msg)
                    if msg[0] in kinds:
                        return msg
                    continue
            except (EOFError, OSError):
                self._gone = self._gone or "it closed its pipe"
                self._proc.poll()
                return None
            if self._proc.poll() is not None and not res.poll(0):
                self._gone = self._gone or "it exited"
                return None

    # -- stop ------------------------------------------------------------------------------
    def stop(self) -> Recording:
        """Stop sampling, have the child finalise the recording, read it (idempotent).

        Never raises for a child that died or hung: what it journaled is recovered."""
        if self.recording is not None:
            return self.recording
        self._link_stop.set()
        self._dirty.set()  # wakes the link thread
        if self._link is not None:
            self._link.join(self.stop_timeout_s)
        self._drain()
        msg = self._final and ("done", self._final)
        if msg is None and self._send("stop", timeout_s=self.stop_timeout_s):
            deadline = time.monotonic() + self.stop_timeout_s + self.finalize_timeout_s
            msg = self._recv_until(deadline, {"done"},
                                   silence_s=max(self.stop_timeout_s, 20 * _BEAT_S))
        if msg is None and self._gone is None:
            self._gone = "it did not finish within its time limits and was killed"
        code = self._reap(kill=msg is None)
        if msg is not None:
            recording = self._read_final()
        else:
            recording = self._salvage(code)
        self.recording = recording
        self._cleanup()
        return recording

    def _reap(self, kill: bool) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        if not kill:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(self.stop_timeout_s)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5.0)
        return proc.returncode

    def _read_final(self) -> Recording:
        assert self._out is not None
        return read_recording(self._out)  # read into memory: a temporary file can go

    def _salvage(self, code: int | None) -> Recording:
        """Finalise what the dead child journaled, with the parent's marks and counters."""
        assert self._out is not None
        how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}" if code is not None else "could not be reaped")
        self._event(f"the sampling process (pid {self.pid}) {how}: {self._gone}; its "
                    f"samples after the last journal flush (at most {self.flush_s:g} s) are "
                    "lost")
        side = read_side_journal(self._out) or {}
        with self._lock:
            extras: dict[str, Any] = {
                "labels": dict(self.extras.labels),
                "marks": [list(m) for m in self.extras.marks],
                "counters": dict(self.extras.counters),
                "events": list(side.get("events", [])) + self.extras.events[self._sent_events:],
                "sampler": {**side.get("sampler", {}), **self._beat},
            }
        journaled = Path(str(self._out) + JOURNAL_SUFFIX).exists()
        try:
            rec = recover_recording(self._out, finalize=True, extras=extras)
        except InputError as exc:  # died before its recorder existed: nothing to recover
            return Recording(table=SAMPLE_SCHEMA.empty_table(), source=self._source,
                             origin=self.origin, interval_s=self.interval_s,
                             events=(*extras["events"], f"nothing recovered: {exc.what}"))
        if not journaled:  # it died after finalising: the file is whole, add what happened
            rec = dataclasses.replace(rec, events=(*rec.events, *self.extras.events[-1:]))
        return rec

    def _abort(self) -> None:
        self._reap(kill=True)
        self._cleanup()

    def _cleanup(self) -> None:
        for conn in (self._cmd, self._res):
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        self._cmd = self._res = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # -- statistics ------------------------------------------------------------------------
    def stats(self) -> SamplerStats:
        """The child's final statistics once stopped; before, counts from its latest
        heartbeat (at most ``_IDLE_BEAT_S`` old)."""
        if self._final is not None:
            fields = SamplerStats.__dataclass_fields__
            return SamplerStats(**{k: v for k, v in self._final.items() if k in fields})
        self._drain()  # the latest heartbeat, if one came since the link thread read
        b = self._beat
        return SamplerStats(
            ticks=int(b.get("ticks", 0)), late=int(b.get("late", 0)),
            missed=int(b.get("missed", 0)), elapsed_s=float(b.get("elapsed_s", 0.0)),
            rate_hz=float(b.get("rate_hz", 0.0)), lateness_p50_s=0.0, lateness_p99_s=0.0,
            lateness_max_s=0.0, cpu_s=float(b.get("cpu_s", 0.0)), rows=int(b.get("rows", 0)),
            process_cpu_s=b.get("process_cpu_s"))
