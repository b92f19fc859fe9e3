"""The sampling process: ``main([CMD_FD, RES_FD])`` in a fresh interpreter.

Started by :class:`gpuaudit.measure.live.sampler_process.ProcessSampler`, never by hand. Reads
its settings and the pickled backend (or factory) from ``CMD_FD``, builds the backend here
(``NvmlBackend`` imports pynvml and calls ``nvmlInit`` in this process), runs an in-process
:class:`~gpuaudit.measure.live.sampler.Sampler` with the crash-safe recorder, applies the marks,
events and counters the parent sends (they come batched, only when there are new
ones), sends a heartbeat with its progress every ``idle_beat_s`` while sampling and every
``beat_s`` while finalising, and on ``stop``, end-of-file (the parent died) or
SIGTERM stops, finalises the Parquet recording and answers ``("done", stats)``.

SIGINT is ignored: a terminal's Ctrl-C reaches the whole foreground process group, and it
is the parent that decides when sampling ends.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuaudit.measure.live.recorder import Extras

__all__ = ["apply_message", "main"]


class _Terminated(Exception):
    pass


def _on_term(signum: int, frame: Any) -> None:
    raise _Terminated


def apply_message(extras: Extras, msg: tuple[str, list[Any], list[str],
                                             dict[str, float | None]]) -> bool:
    """Apply a parent message ``(kind, new_marks, new_events, counters)`` to the recording's
    extras; True when it asks to stop."""
    kind, marks, events, counters = msg
    extras.marks.extend((int(t), str(text)) for t, text in marks)
    extras.events.extend(events)
    extras.counters.update(counters)
    return kind == "stop"


def main(argv: list[str]) -> int:
    """Run the sampling process; the exit code says how it ended (0: finalised)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cmd = Connection(int(argv[0]), writable=False)
    res = Connection(int(argv[1]), readable=False)
    lock = threading.Lock()

    def send(msg: tuple[Any, ...]) -> bool:
        with lock:
            try:
                res.send(msg)
            except (OSError, ValueError):
                return False
        return True

    try:
        cfg: dict[str, Any] = cmd.recv()
    except (EOFError, OSError):
        return 1
    sys.path[:] = [*cfg["sys_path"], *(p for p in sys.path if p not in cfg["sys_path"])]

    import pickle

    from gpuaudit.errors import InputError, SourceUnavailableError
    from gpuaudit.measure.live.sampler import Sampler

    try:
        spec = pickle.loads(cfg["backend"])
        sampler = Sampler(spec, interval_s=cfg["interval_s"], labels=cfg["labels"],
                          output=cfg["output"], origin=cfg["origin"], flush_s=cfg["flush_s"],
                          host=cfg["host"], stop_timeout_s=cfg["stop_timeout_s"],
                          process=False, output_mode=cfg.get("output_mode", "create"),
                          cpu=pickle.loads(cfg["cpu"]) if "cpu" in cfg else None,
                          cpu_pid=cfg.get("cpu_pid"))
        sampler.start()
    except SourceUnavailableError as exc:
        send(("error", "unavailable", str(exc)))
        return 3
    except InputError as exc:
        send(("error", "input", str(exc)))
        return 2
    except BaseException as exc:  # a factory's bug, a broken pickle: say what, then exit
        send(("error", "other", f"{type(exc).__name__}: {exc}"))
        return 1
    cpu0_s = time.process_time()  # start-up and imports are not sampling overhead
    send(("ready", sampler.devices, sampler._wall0_ns, sampler._mono0_ns,
          sampler.backend.source))
    # This interpreter only samples: hand the GIL over sooner (default 5 ms) so the
    # sampling thread waits less behind the writer's Arrow build and the heartbeat.
    sys.setswitchinterval(0.001)
    done = threading.Event()
    stopping = threading.Event()
    beat_s = float(cfg.get("beat_s", 0.1))
    idle_beat_s = float(cfg.get("idle_beat_s", beat_s))

    def beat() -> None:
        # Sampling: a beat every idle_beat_s (progress for stats(); each one is a wake-up,
        # a pickle and a write, so not at the tick rate). Stopping: one at once, then every
        # beat_s, so the parent can tell a long finalisation from a hung process.
        while True:
            if stopping.is_set():
                if done.wait(beat_s):
                    return
            else:
                stopping.wait(idle_beat_s)
            progress: dict[str, Any] = dict(sampler.progress())
            progress["process_cpu_s"] = time.process_time() - cpu0_s
            if done.is_set() or not send(("beat", progress)):
                return

    threading.Thread(target=beat, name="gpuaudit-sampler-beat", daemon=True).start()
    signal.signal(signal.SIGTERM, _on_term)
    reason: str | None = None
    try:
        while True:
            msg = cmd.recv()
            with sampler._lock:
                stop = apply_message(sampler.extras, msg)
            if stop:
                break
    except (EOFError, OSError):
        reason = ("the process that started this sampler ended without stopping it "
                  "(killed?); the sampling process finalised the recording")
    except _Terminated:
        reason = "the sampling process got SIGTERM; it stopped and finalised the recording"
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stopping.set()
    if reason is not None:
        sampler._event(reason)
    sampler.stop()
    stats: dict[str, Any] = dict(sampler.stats().as_dict())
    stats["process_cpu_s"] = time.process_time() - cpu0_s
    done.set()
    send(("done", stats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
