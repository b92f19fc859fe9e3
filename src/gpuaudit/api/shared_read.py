"""One read of the history for ``simulate`` and ``rightsize``: the workload profiles and the
plan's audit (classify) from the same batches, on two cores.

The profiles (:class:`~gpuaudit.capacity.profiles.ProfileBuilder`) are built in the caller's
thread while a second thread classifies the same batches, handed over through a short queue:
a recording is decoded once, not once for the profiles and again for the audit. Both consumers
spend most of their time in NumPy and Arrow, which release the interpreter lock, so the two
threads run on two cores. Where the window is not known before reading (a CSV, a log), the
profiles read it first, as :func:`~gpuaudit.capacity.profiles.build_profiles` does, and
classify reads it again beside the simulation.

The audit's classify sees the same source it would alone (its interval, notes, events,
timeline window and order check are the file's), as a one-pass stream: the result is the
single-pass one, which equals the multi-process one (``gpuaudit.classify.parallel``). A
second pass classify makes (busy-onset lags, an order violation read again to name its file
row) re-reads the file.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from gpuaudit.capacity.profiles import ProfileBuilder, Profiles, build_profiles
from gpuaudit.classify import Usage, classify
from gpuaudit.schema import Recording, SampleSource

__all__ = ["profiles_and_usage"]

_END = object()
#: batches in flight between the reader and classify (each at most 524,288 rows: a Parquet
#: file's, measure.files.reader._PARQUET_CHUNK_ROWS)
_QUEUE_BATCHES = 4


class _Handover:
    """The source as classify sees it: the first ``batches()`` yields what the reader hands
    over; every other attribute, and a later ``batches()``, is the source's own. No ``split``:
    the batches are already being read, in one pass."""

    split = None

    def __init__(self, inner: SampleSource | Recording) -> None:
        self._inner = inner
        self._queue: queue.Queue[object] = queue.Queue(maxsize=_QUEUE_BATCHES)
        self._fed = False
        self.stopped = threading.Event()  # classify takes no more handed-over batches
        self.read_done = threading.Event()  # the reader is done with the source

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def checks_order(self) -> bool:
        return bool(getattr(self._inner, "checks_order", True))

    @checks_order.setter
    def checks_order(self, value: bool) -> None:
        self._inner.checks_order = value  # type: ignore[union-attr]

    def put(self, item: object) -> bool:
        """Hand a batch (or the end) over; False once classify no longer takes any."""
        while not self.stopped.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def batches(self) -> Iterator[pa.RecordBatch]:
        if self._fed:
            # a second pass: the first is over, so hand nothing more over; read the source
            # again once the reader is done with it (a file source is one reader at a time)
            self.stopped.set()
            self.read_done.wait()
            yield from self._inner.batches()
            return
        self._fed = True
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, pa.RecordBatch)
            yield item


def profiles_and_usage(
    source: SampleSource | Recording,
    *,
    step_s: float,
    by: Sequence[str] = (),
    audit: bool = True,
) -> tuple[Profiles, Future[Usage] | None]:
    """The profiles of ``source`` and, when ``audit``, the audit's usage (classify with the
    audit's defaults: no groups, the timeline) from the same read. The usage is a future:
    its classify may still run while the caller simulates."""
    if not audit:
        return build_profiles(source, step_s=step_s, by=by), None
    window = getattr(source, "ts_range_ns", None)
    if isinstance(source, Recording):
        # in memory already: nothing to share but the cores
        usage = _in_thread(source)
        return build_profiles(source, step_s=step_s, by=by), usage
    if not isinstance(window, tuple):
        # the window is known only after reading (a CSV, a log): the profiles read it into
        # memory first; classify reads it again (one reader at a time), beside the simulation
        prof = build_profiles(source, step_s=step_s, by=by)
        return prof, _in_thread(source)
    builder = ProfileBuilder(window, step_s=step_s, by=by,
                             origin=str(getattr(source, "origin", "")))
    hand = _Handover(source)
    usage = _in_thread(hand, hand.stopped)  # type: ignore[arg-type]
    feeding = True
    try:
        for batch in source.batches():
            if feeding:
                feeding = hand.put(batch)
            builder.add(batch)
    except BaseException as exc:
        hand.put(exc)
        hand.read_done.set()
        if isinstance(exc, Exception):  # not on Ctrl-C
            _wait(usage)
        raise
    hand.put(_END)
    hand.read_done.set()
    return builder.finish(), usage


def _in_thread(source: SampleSource | Recording,
               done: threading.Event | None = None) -> Future[Usage]:
    fut: Future[Usage] = Future()

    def run() -> None:
        try:
            fut.set_result(classify(source, timeline=True))
        except BaseException as exc:  # handed to the caller through the future
            fut.set_exception(exc)
        finally:
            if done is not None:
                done.set()

    threading.Thread(target=run, name="gpuaudit-plan-classify", daemon=True).start()
    return fut


def _wait(fut: Future[Usage]) -> None:
    """Let the classify thread finish (it stops at the error handed over) before raising the
    reader's own error."""
    try:
        fut.result()
    except BaseException:  # the reader's error is the one to raise
        pass
