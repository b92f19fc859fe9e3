"""The live sampler: a deadline-scheduled background thread reading a backend into Arrow.

Tick ``k`` is due at ``start + k * interval`` on the monotonic clock, so the rate does not
drift with the time each tick takes (a ``sleep(interval)`` loop runs slow by exactly that).
A tick that starts more than a quarter interval after its deadline counts as *late*; when a
tick overruns a whole interval, the deadlines it covered are skipped and counted as *missed*.
Timestamps are wall-clock UTC anchored once and advanced by the monotonic clock, so they
never run backwards when NTP steps the clock.

Each tick writes one row per device into preallocated NumPy column buffers. Every
``flush_s`` seconds the full buffer is handed to a writer thread (double buffering: the
sampling thread never waits on disk), which builds one Arrow record batch and gives it to the
sink: a :class:`~gpuaudit.measure.live.recorder.Recorder` (journal + Parquet) or memory.

Faults never reach the workload: a lost GPU (``NVML_ERROR_GPU_IS_LOST``) becomes an event and
the other GPUs go on; any other exception in the sampling thread is recorded as an event and
sampling stops cleanly; :meth:`Sampler.stop` waits a bounded time, so a hung driver call
cannot hang the caller.

``Sampler(..., process=True)`` (or ``process=None`` at :data:`PROCESS_MIN_HZ` and above)
builds a :class:`~gpuaudit.measure.live.sampler_process.ProcessSampler` instead: the same
interface, with the backend, this deadline loop and the recorder in a separate Python
process, so a GIL-bound workload cannot delay the ticks.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from gpuaudit.errors import InputError
from gpuaudit.measure.live.cpu import CpuMeter, CpuReader, PsutilCpu
from gpuaudit.measure.live.nvml import INT_COLUMNS, READ_COLUMNS, Device, GpuLostError, Reading
from gpuaudit.measure.live.recorder import Extras, Recorder, iso_utc, read_recording
from gpuaudit.schema import SAMPLE_SCHEMA, Recording, build_table
from gpuaudit.validate import FLUSH_S, SAMPLING_INTERVAL_S, check_output_path

__all__ = ["PROCESS_MIN_HZ", "Backend", "BackendSpec", "Sampler", "SamplerStats",
           "wants_process"]

#: CPU beside the GPUs (measure.live.cpu): one host reading per tick, on every device's row
_CPU_COLS = ("host_cpu_util_pct", "proc_cpu_util_pct")
_FLOAT_COLS = (*(c for c in READ_COLUMNS if c not in INT_COLUMNS), *_CPU_COLS)
_INT_COLS = tuple(c for c in READ_COLUMNS if c in INT_COLUMNS)
_F_IDX = {c: i for i, c in enumerate(_FLOAT_COLS)}
_I_IDX = {c: i for i, c in enumerate(_INT_COLS)}
_LATENESS_RING = 1 << 16
_MAX_SLEEP_S = 0.2  # bounds how long stop() waits for the sampling thread to notice
#: The CPU is read at most this often (a process-tree walk reads /proc for every process on
#: the host, ~ms); each reading fills the rows sampled since the previous one, which it covers.
CPU_INTERVAL_S = 0.5

#: With ``process=None``, rates at or above this sample in a separate process: at 100 Hz an
#: in-process thread loses ~5 % of its ticks to a GIL-busy main thread (docs/benchmarks.md).
PROCESS_MIN_HZ = 50.0


class Backend(Protocol):
    """What a sampler needs from a measurement backend (see :class:`NvmlBackend`)."""

    source: str
    warnings: list[str]
    notes: list[str]

    def open(self) -> list[Device]: ...

    def read(self, device: Device) -> Reading: ...

    def close(self) -> None: ...


#: A backend, or a zero-argument callable that builds one (called where sampling runs).
BackendSpec = Backend | Callable[[], Backend]


def wants_process(process: bool | None, interval_s: float) -> bool:
    """Whether to sample in a separate process: as asked, or (None) from the rate."""
    if process is None:
        return interval_s > 0 and 1.0 / interval_s >= PROCESS_MIN_HZ
    return bool(process)


def _picklable(obj: object) -> str | None:
    """None if ``obj`` can be sent to another process, else why not."""
    try:
        pickle.dumps(obj)
    except Exception as exc:  # pickling raises anything: TypeError, AttributeError, ...
        return f"{type(exc).__name__}: {exc}"
    return None


_warm = False


def _warm_up() -> None:
    """Build one throw-away batch, once per process: pyarrow imports pandas on its first
    array from NumPy (~360 modules, ~0.15 s of CPU), which would otherwise land in the
    writer thread at the first flush and hold the GIL and the import lock over ticks."""
    global _warm
    if _warm:
        return
    s = Sampler(_Deferred(), interval_s=1.0)
    s.devices = [Device("GPU-warm-up", 0, None)]
    buf = _Buffer(1)
    buf.add(time.time_ns(), 0, {})
    s._build(buf)
    _warm = True


class _Deferred:
    """Stands in for a backend given as a factory until :meth:`Sampler.start` builds it."""

    source = "nvml"

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.notes: list[str] = []

    def open(self) -> list[Device]:
        raise RuntimeError("backend not built yet")

    def read(self, device: Device) -> Reading:
        raise RuntimeError("backend not built yet")

    def close(self) -> None:
        pass


class Sink(Protocol):
    def write(self, batch: pa.RecordBatch | None, extras: Extras | None = None) -> None: ...


class _MemorySink:
    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self._lock = threading.Lock()

    def write(self, batch: pa.RecordBatch | None, extras: Extras | None = None) -> None:
        if batch is not None and batch.num_rows:
            with self._lock:
                self.batches.append(batch)

    def drain(self) -> list[pa.RecordBatch]:
        with self._lock:
            out, self.batches = self.batches, []
        return out


@dataclass(frozen=True)
class SamplerStats:
    """How the sampling went: ticks, rate, lateness (seconds), CPU seconds used.

    ``cpu_s`` is the sampling and writer threads' CPU time; ``process_cpu_s`` (process mode
    only) is the whole sampling process's since it started sampling (all its threads; its
    interpreter start-up and imports, ~0.3-0.5 s of CPU once, excluded).
    """

    ticks: int
    late: int
    missed: int
    elapsed_s: float
    rate_hz: float
    lateness_p50_s: float
    lateness_p99_s: float
    lateness_max_s: float
    cpu_s: float
    rows: int
    process_cpu_s: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class _Buffer:
    """Column buffers for up to ``cap`` rows; NaN marks a value that was not read."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.n = 0
        self.ts = np.empty(cap, dtype=np.int64)
        self.dev = np.empty(cap, dtype=np.int32)
        self.f = np.full((len(_FLOAT_COLS), cap), np.nan)
        self.i = np.zeros((len(_INT_COLS), cap), dtype=np.int64)
        self.iv = np.zeros((len(_INT_COLS), cap), dtype=bool)

    def add(self, ts_ns: int, dev: int, reading: Reading) -> None:
        r = self.n
        self.ts[r] = ts_ns
        self.dev[r] = dev
        for key, value in reading.items():
            if value is None:
                continue
            j = _F_IDX.get(key)
            if j is not None:
                self.f[j, r] = value
            else:
                k = _I_IDX[key]
                self.i[k, r] = value
                self.iv[k, r] = True
        self.n = r + 1


class Sampler:
    """Samples ``backend`` every ``interval_s`` seconds in a background thread.

    ``output`` (a path) streams to a crash-safe recording; without it, batches stay in
    memory. ``labels`` go on every row. Use :meth:`start` / :meth:`stop`, or ``with``.
    ``backend`` may be a zero-argument factory, called by :meth:`start`.

    ``process=True`` returns a :class:`~gpuaudit.measure.live.sampler_process.ProcessSampler`
    (sampling in a separate process; ``backend`` must then pickle: an unopened
    ``NvmlBackend``, ``FakeNvml.backend(...)`` or a module-level factory). ``process=None``
    chooses it at :data:`PROCESS_MIN_HZ` and above when the backend pickles.
    """

    _fallback_note: str | None = None

    def __new__(cls, backend: BackendSpec, *args: Any, process: bool | None = False,
                interval_s: float = 0.1, **kwargs: Any) -> Sampler:
        interval_s = SAMPLING_INTERVAL_S.check(interval_s, "interval_s")
        if cls is Sampler and wants_process(process, interval_s):
            why = _picklable(backend) if process is None else None
            if why is None:
                from gpuaudit.measure.live.sampler_process import ProcessSampler

                return super().__new__(ProcessSampler)
            obj = super().__new__(cls)
            obj._fallback_note = (f"sampled in a thread of the workload's process, not in a "
                                  f"separate one: the backend cannot be sent there ({why})")
            return obj
        return super().__new__(cls)

    def __init__(
        self,
        backend: BackendSpec,
        *,
        interval_s: float = 0.1,
        labels: Mapping[str, str] | None = None,
        output: str | os.PathLike[str] | None = None,
        origin: str | None = None,
        flush_s: float = 5.0,
        host: str | None = None,
        stop_timeout_s: float = 5.0,
        process: bool | None = False,
        output_mode: str = "create",
        cpu: CpuReader | bool | None = None,
        cpu_pid: int | None = None,
    ) -> None:
        interval_s = SAMPLING_INTERVAL_S.check(interval_s, "interval_s")
        flush_s = FLUSH_S.check(flush_s, "flush_s")
        if output is not None:
            check_output_path(output, "output")
        self._spec = backend
        self.backend: Backend = (backend if not callable(backend) or hasattr(backend, "open")
                                 else _Deferred())  # type: ignore[assignment]
        self.interval_s = float(interval_s)
        self.host = host or socket.gethostname()
        self.output = output
        self.output_mode = output_mode
        self.origin = origin or f"live NVML sampling on {self.host} by gpuaudit"
        self.flush_s = max(float(flush_s), self.interval_s)
        self.stop_timeout_s = stop_timeout_s
        self.extras = Extras(labels=dict(labels or {}),
                             counters={"steps": 0, "samples": None, "tokens": None})
        self.devices: list[Device] = []
        self.recording: Recording | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._writer_thread: threading.Thread | None = None
        self._queue: queue.Queue[_Buffer | None] = queue.Queue()
        self._sink: Any = None
        self._lateness = np.zeros(_LATENESS_RING)
        self._ticks = self._late = self._missed = 0
        self._cpu_s = 0.0
        self._writer_cpu_s = 0.0
        self._t_start = self._t_end = 0.0
        self._wall0_ns = self._mono0_ns = 0
        self._active: list[int] = []
        self.write_errors: list[str] = []
        # CPU beside the GPUs: ``cpu`` a CpuReader (None: psutil; False: not read);
        # ``cpu_pid`` the root of the workload's process tree (None: the host only)
        self._cpu_spec: CpuReader | None = (None if cpu is False else PsutilCpu()
                                            if cpu is None or cpu is True else cpu)
        self.cpu_pid = cpu_pid
        self._cpu: CpuMeter | None = None
        self._cpu_from = 0
        self._cpu_last = 0.0
        if self._fallback_note:
            self.extras.notes.append(self._fallback_note)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> Sampler:
        """Open the backend and start sampling; raises SourceUnavailableError if it cannot."""
        if isinstance(self.backend, _Deferred):
            self.backend = self._spec()  # type: ignore[operator]
        self.devices = self.backend.open()
        self._cpu = self._cpu_meter()
        _warm_up()
        self._active = list(range(len(self.devices)))
        self._wall0_ns = time.time_ns()
        self._mono0_ns = time.monotonic_ns()
        self.start_ns = self._wall0_ns
        if self.output is not None:
            self._sink = Recorder(self.output, interval_s=self.interval_s, origin=self.origin,
                                  source=self.backend.source, host=self.host,
                                  start_ns=self._wall0_ns, mode=self.output_mode)
        else:
            self._sink = _MemorySink()
        ticks_per_flush = max(1, math.ceil(self.flush_s / self.interval_s))
        self._cap = ticks_per_flush * max(1, len(self.devices))
        self._thread = threading.Thread(target=self._run, name="gpuaudit-sampler", daemon=True)
        self._writer_thread = threading.Thread(target=self._write_loop,
                                               name="gpuaudit-writer", daemon=True)
        self._writer_thread.start()
        self._thread.start()
        return self

    def _cpu_meter(self) -> CpuMeter | None:
        """The CPU meter, its baseline read (None: CPU not read, or the reader failed)."""
        if self._cpu_spec is None:
            return None
        me = os.getpid()
        try:
            meter = CpuMeter(self._cpu_spec, root_pid=self.cpu_pid,
                             exclude_pid=me if self.cpu_pid not in (None, me) else None)
            meter.read()
        except Exception as exc:  # measurement never stops the job: say it, go on
            self.extras.notes.append(f"CPU not recorded: reading it failed: "
                                     f"{type(exc).__name__}: {exc}")
            return None
        self._cpu_last = time.monotonic()
        return meter

    def _cpu_fill(self, buf: _Buffer) -> None:
        """Read the CPU and put it on the rows sampled since the previous reading."""
        meter = self._cpu
        if meter is None:
            return
        try:
            host, proc = meter.read()
        except Exception as exc:
            self._cpu = None
            self._event(f"CPU reading failed: {type(exc).__name__}: {exc}; the CPU columns "
                        "are null from here")
            return
        a, b = self._cpu_from, buf.n
        buf.f[_F_IDX["host_cpu_util_pct"], a:b] = np.nan if host is None else host
        buf.f[_F_IDX["proc_cpu_util_pct"], a:b] = np.nan if proc is None else proc
        self._cpu_from = b
        self._cpu_last = time.monotonic()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def drain(self) -> list[pa.RecordBatch]:
        """Take the batches sampled since the last drain (in-memory sampling only).

        For consumers that process samples as they arrive (the live exporter): what is
        drained is handed over and is not part of the Recording ``stop()`` returns, so memory
        stays bounded on a long run.
        """
        if not isinstance(self._sink, _MemorySink):
            raise InputError("drain() needs a sampler that keeps samples in memory",
                             fix="create the Sampler without output= to drain it")
        return self._sink.drain()

    def stop(self) -> Recording:
        """Stop, flush, finalise the recording and return it (idempotent)."""
        if self.recording is not None:
            return self.recording
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.stop_timeout_s)
            if self._thread.is_alive():
                self._event("the sampling thread did not stop within "
                            f"{self.stop_timeout_s:g} s (a hung NVML call?); abandoned")
                self._queue.put(None)
        if self._writer_thread is not None:
            self._writer_thread.join(self.stop_timeout_s + 10.0)
        with contextlib.suppress(Exception):
            self.backend.close()
        self.extras.sampler = self.stats().as_dict()
        self.extras.notes.extend(list(self.backend.notes) + list(self.backend.warnings))
        self.recording = self._finish()
        return self.recording

    def _finish(self) -> Recording:
        meta = {k.decode().removeprefix("gpuaudit."): v.decode()
                for k, v in self.extras.to_meta().items()}
        if isinstance(self._sink, Recorder):
            path = self._sink.close(self.extras)
            return read_recording(path)
        batches = self._sink.batches if self._sink is not None else []
        table = pa.Table.from_batches(batches, SAMPLE_SCHEMA)
        return Recording(table=table, source=self.backend.source, origin=self.origin,
                         interval_s=self.interval_s, events=tuple(self.extras.events),
                         meta={**meta, "host": self.host, "start": iso_utc(self.start_ns)})

    # -- user signals ----------------------------------------------------------------------
    def mark(self, text: str) -> None:
        """Record a named point in time (``"epoch 3"``)."""
        with self._lock:
            self.extras.marks.append((self._now_ns(), str(text)))

    def step(self, steps: int = 1, samples: float | None = None,
             tokens: float | None = None) -> None:
        """Count work done: steps, and optionally samples and tokens (unit economics)."""
        # plain numbers: a framework scalar (a tensor's .sum()) would not serialise to JSON
        # nor reach the sampling process without its framework imported there
        steps_n = int(steps)
        samples_n = None if samples is None else float(samples)
        tokens_n = None if tokens is None else float(tokens)
        with self._lock:
            c = self.extras.counters
            c["steps"] = (c["steps"] or 0) + steps_n
            if samples_n is not None:
                c["samples"] = (c["samples"] or 0) + samples_n
            if tokens_n is not None:
                c["tokens"] = (c["tokens"] or 0) + tokens_n

    def _event(self, text: str) -> None:
        with self._lock:
            self.extras.events.append(f"{iso_utc(self._now_ns())} {text}")

    def _now_ns(self) -> int:
        if not self._mono0_ns:
            return time.time_ns()
        return self._wall0_ns + (time.monotonic_ns() - self._mono0_ns)

    # -- the sampling thread ---------------------------------------------------------------
    def _run(self) -> None:
        cpu0 = time.thread_time()
        period = self.interval_s
        start = time.monotonic()
        self._t_start = start
        buf = _Buffer(self._cap)
        k = 0
        try:
            while self._active:
                deadline = start + k * period
                now = time.monotonic()
                if now < deadline:
                    # time.sleep, not Event.wait: under a GIL-busy workload every GIL
                    # re-acquisition costs up to one switch interval (5 ms), and
                    # Condition.wait re-acquires several times; sleep does once.
                    while now < deadline and not self._stop.is_set():
                        time.sleep(min(deadline - now, _MAX_SLEEP_S))
                        now = time.monotonic()
                if self._stop.is_set():
                    break
                behind = int((now - start) / period)
                if behind > k:  # a whole interval overrun: skip to the latest deadline
                    self._missed += behind - k
                    k = behind
                    deadline = start + k * period
                lateness = now - deadline
                self._lateness[self._ticks % _LATENESS_RING] = lateness
                if lateness > period / 4:
                    self._late += 1
                if buf.n + len(self._active) > buf.cap:
                    if self._cpu_from < buf.n:
                        self._cpu_fill(buf)
                    self._queue.put(buf)
                    buf = _Buffer(self._cap)
                    self._cpu_from = 0
                self._tick(buf)
                if (self._cpu is not None
                        and time.monotonic() - self._cpu_last >= CPU_INTERVAL_S - period / 2):
                    self._cpu_fill(buf)
                self._ticks += 1
                k += 1
        except BaseException as exc:
            self._event(f"sampling stopped after an internal error: {type(exc).__name__}: "
                        f"{exc}")
        finally:
            self._t_end = time.monotonic()
            if self._cpu_from < buf.n:
                self._cpu_fill(buf)
            self._queue.put(buf)
            self._queue.put(None)
            self._cpu_s = time.thread_time() - cpu0

    def _tick(self, buf: _Buffer) -> None:
        ts = self._wall0_ns + (time.monotonic_ns() - self._mono0_ns)
        for d in list(self._active):
            dev = self.devices[d]
            try:
                reading = self.backend.read(dev)
            except GpuLostError as exc:
                self._active.remove(d)
                rest = len(self._active)
                self._event(f"GPU {dev.uuid} (index {dev.index}) lost: {exc.what}; its "
                            f"samples end here, {rest} other device(s) still sampled")
                continue
            buf.add(ts, d, reading)

    # -- the writer thread -----------------------------------------------------------------
    def _write_loop(self) -> None:
        cpu0 = time.thread_time()
        while True:
            buf = self._queue.get()
            if buf is None:
                break
            try:
                batch = self._build(buf)
                with self._lock:
                    c = self.extras.counters
                    self.extras.progress.append(
                        (self._now_ns(), float(c["steps"] or 0), c["samples"], c["tokens"]))
                    self._sink.write(batch, self.extras)
            except Exception as exc:  # disk full, ...: keep sampling, say what was lost
                msg = f"writing {buf.n} rows failed: {type(exc).__name__}: {exc}"
                self.write_errors.append(msg)
                self._event(msg)
        self._writer_cpu_s = time.thread_time() - cpu0

    def _build(self, buf: _Buffer) -> pa.RecordBatch | None:
        n = buf.n
        if n == 0:
            return None
        devs = self.devices
        dev = buf.dev[:n]
        uuids = pa.array([d.uuid for d in devs], pa.string())
        models = pa.array([d.model for d in devs], pa.string())
        idx = pa.array(dev, pa.int32())
        cols: dict[str, Any] = {
            "ts": pa.array(buf.ts[:n], pa.timestamp("ns", tz="UTC")),
            "host": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                                   pa.array([self.host])),
            "gpu_uuid": pa.DictionaryArray.from_arrays(idx, uuids),
            "gpu_model": pa.DictionaryArray.from_arrays(idx, models),
            "gpu_index": np.array([d.index for d in devs], np.int16)[dev],
            "mig_profile": pa.array([d.mig_profile for d in devs], pa.string()).take(idx),
        }
        for j, name in enumerate(_FLOAT_COLS):
            v = buf.f[j, :n]
            cols[name] = pa.array(v, mask=np.isnan(v))
        for j, name in enumerate(_INT_COLS):
            cols[name] = pa.array(buf.i[j, :n], mask=~buf.iv[j, :n])
        if self.extras.labels:
            keys = list(self.extras.labels)
            vals = [self.extras.labels[k] for k in keys]
            m = len(keys)
            cols["labels"] = pa.MapArray.from_arrays(
                pa.array(np.arange(n + 1, dtype=np.int32) * m),
                pa.array(keys * n, pa.string()), pa.array(vals * n, pa.string()))
        table = build_table(cols, length=n)
        return table.combine_chunks().to_batches()[0]

    # -- statistics ------------------------------------------------------------------------
    def progress(self) -> dict[str, float | int]:
        """The cheap part of :meth:`stats` (counts, no percentiles): safe to call often."""
        end = self._t_end or time.monotonic()
        elapsed = max(0.0, end - self._t_start) if self._t_start else 0.0
        rows = getattr(self._sink, "rows", None)
        if rows is None:
            rows = sum(b.num_rows for b in getattr(self._sink, "batches", []))
        return {
            "ticks": self._ticks,
            "late": self._late,
            "missed": self._missed,
            "elapsed_s": elapsed,
            "rate_hz": (self._ticks - 1) / elapsed if elapsed > 0 and self._ticks > 1 else 0.0,
            "cpu_s": self._cpu_s + self._writer_cpu_s,
            "rows": int(rows),
        }

    def stats(self) -> SamplerStats:
        n = min(self._ticks, _LATENESS_RING)
        lat = self._lateness[:n]
        p = self.progress()
        return SamplerStats(
            ticks=int(p["ticks"]),
            late=int(p["late"]),
            missed=int(p["missed"]),
            elapsed_s=float(p["elapsed_s"]),
            rate_hz=float(p["rate_hz"]),
            lateness_p50_s=float(np.percentile(lat, 50)) if n else 0.0,
            lateness_p99_s=float(np.percentile(lat, 99)) if n else 0.0,
            lateness_max_s=float(lat.max()) if n else 0.0,
            cpu_s=float(p["cpu_s"]),
            rows=int(p["rows"]),
        )
