"""A deadline for the engine's own all_reduce on the host: the hook's ``timeout`` bounds it as it
bounds StragglAR's rounds.

DDP's default hook waits for gloo's all_reduce as long as the process group allows (30 minutes
by default), so under ``policy="auto"`` a silent peer held every rank for that long, although the
state says ``timeout``.  One thread per process watches the deadlines of the all_reduces in
flight and fails the Future that DDP (or FSDP) waits on when its deadline passes first; the
all_reduce's own completion settles it otherwise.  Each Future is settled once, by whichever
comes first.  CUDA buffers are not watched here: their Futures carry CUDA streams, and NCCL's own
watchdog ends a collective at the process group's timeout.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Settled", "bounded", "watch"]


class Settled:
    """A torch Future that is given its outcome once: a value, or the first exception."""

    def __init__(self) -> None:
        self.future: torch.futures.Future[Any] = torch.futures.Future()
        self._lock = threading.Lock()

    def settle(self, value: Any = None, error: BaseException | None = None) -> bool:
        """Give the Future ``value`` (or ``error``) unless it has its outcome; whether it took it."""
        with self._lock:
            if self.future.done():
                return False
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(value)
            return True


class _Watcher:
    """The thread: it sleeps until the earliest deadline, then fails what is still unsettled.
    Settled entries leave the top of the heap whenever it wakes (at each new entry), so with one
    timeout, whose deadlines come in the order the calls were made, it holds about the calls in
    flight, not every call of the last ``timeout`` seconds.  A forked child starts afresh: the
    parent's thread is not in it."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Settled, Callable[[], BaseException]]] = []
        self._order = itertools.count()  # ties in the heap never compare the Futures
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, outcome: Settled, seconds: float, error: Callable[[], BaseException]) -> None:
        with self._wake:
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._order), outcome, error))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stragglar-deadlines", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._heap and self._heap[0][2].future.done():
                    heapq.heappop(self._heap)  # settled: nothing to watch
                if not self._heap:
                    self._wake.wait()
                    continue
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                _, _, outcome, error = heapq.heappop(self._heap)
            outcome.settle(error=error())


_WATCHER = _Watcher()


def _forked() -> None:
    global _WATCHER
    _WATCHER = _Watcher()


os.register_at_fork(after_in_child=_forked)


def watch(outcome: Settled, seconds: float, error: Callable[[], BaseException]) -> None:
    """Fail ``outcome`` with ``error()`` if it is not settled within ``seconds``."""
    _WATCHER.watch(outcome, seconds, error)


def bounded(
    engine: torch.futures.Future[Any],
    result: Callable[[torch.futures.Future[Any]], Any],
    seconds: float,
    error: Callable[[], BaseException],
) -> tuple[torch.futures.Future[Any], Callable[[torch.futures.Future[Any]], None]]:
    """A Future of ``result(engine)`` once ``engine`` completes (its error if ``result`` raises),
    or of ``error()`` if that takes more than ``seconds``; and ``engine``'s last callback, which
    does nothing and which only ``engine`` refers to, so that a weak reference to it tells when
    ``engine``'s completing thread has let go of its callbacks
    (:func:`~stragglar.ddp.probe.let_go`).  ``result`` would not tell: an error it raises keeps
    it alive (its traceback's frames hold their functions, and their callers' frames)."""
    outcome = Settled()

    def settled(future: torch.futures.Future[Any]) -> None:
        try:
            value = result(future)
        except Exception as e:  # a peer lost: the engine's own error
            outcome.settle(error=e)
            return
        outcome.settle(value)

    def last(_: torch.futures.Future[Any]) -> None:
        """Nothing: its end tells that the engine's thread is done with the callbacks."""

    engine.add_done_callback(settled)
    engine.add_done_callback(last)
    watch(outcome, seconds, error)
    return outcome.future, last
