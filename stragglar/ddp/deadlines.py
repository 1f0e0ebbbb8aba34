"""A deadline for the engine's own all_reduce on the host: the hook's ``timeout`` bounds it as it
bounds StragglAR's rounds.

DDP's default hook waits for gloo's all_reduce as long as the process group allows (30 minutes
by default), so under ``policy="auto"`` a silent peer held every rank for that long, although the
state says ``timeout``.  One thread per process watches the deadlines of the all_reduces in
flight and fails the Future that DDP (or FSDP) waits on when its deadline passes first; the
all_reduce's own completion settles it otherwise.  Each Future is settled once, by whichever
comes first; a deadline that passes claims it at once, and gives it its error from a thread of its
own, which may take a moment to say it (the roll call of :mod:`stragglar.runtime.roll_call`) without
holding up the other deadlines, nor letting the call's own end settle it meanwhile.  The thread
also reminds a call that has run a while (:func:`remind`).  CUDA buffers are not watched here:
their Futures carry CUDA streams, and NCCL's own watchdog ends a collective at the process group's
timeout.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Settled", "bounded", "remind", "watch"]

LOG = logging.getLogger("stragglar")


class Settled:
    """A torch Future that is given its outcome once: a value, or the first exception; or, once
    claimed, the claimant's alone."""

    def __init__(self) -> None:
        self.future: torch.futures.Future[Any] = torch.futures.Future()
        self._lock = threading.Lock()
        self._claimed = False

    def claim(self) -> bool:
        """Keep the outcome for the caller, who settles it with ``claimed``: whether it was free."""
        with self._lock:
            if self.future.done() or self._claimed:
                return False
            self._claimed = True
            return True

    def settle(self, value: Any = None, error: BaseException | None = None, claimed: bool = False) -> bool:
        """Give the Future ``value`` (or ``error``) unless it has its outcome, or another claimed
        it; whether it took it."""
        with self._lock:
            if self.future.done() or (self._claimed and not claimed):
                return False
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(value)
            return True


class _Watcher:
    """The thread: it sleeps until the earliest time, then runs its action if the Future is still
    unsettled.  Settled entries leave the top of the heap whenever it wakes (at each new entry),
    so with one timeout, whose deadlines come in the order the calls were made, it holds about the
    calls in flight, not every call of the last ``timeout`` seconds.  A forked child starts
    afresh: the parent's thread is not in it."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, torch.futures.Future[Any], Callable[[], None]]] = []
        self._order = itertools.count()  # ties in the heap never compare the Futures
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def at(self, future: torch.futures.Future[Any], seconds: float, action: Callable[[], None]) -> None:
        with self._wake:
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._order), future, action))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stragglar-deadlines", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._heap and self._heap[0][2].done():
                    heapq.heappop(self._heap)  # settled: nothing to watch
                if not self._heap:
                    self._wake.wait()
                    continue
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                _, _, future, action = heapq.heappop(self._heap)
            if not future.done():
                try:
                    action()
                except Exception:  # the one thread that ends every deadline must outlive a failed one
                    LOG.exception("a deadline's action failed")


_WATCHER = _Watcher()


def _forked() -> None:
    global _WATCHER
    _WATCHER = _Watcher()


os.register_at_fork(after_in_child=_forked)


def watch(outcome: Settled, seconds: float, error: Callable[[], BaseException]) -> None:
    """Fail ``outcome`` with ``error()`` if it is not settled within ``seconds``: claimed then,
    and failed from a thread of its own (``error`` may wait, bounded, for what it says)."""

    def passed() -> None:
        if outcome.claim():
            _fail_claimed(outcome, error)

    _WATCHER.at(outcome.future, seconds, passed)


def _fail_claimed(outcome: Settled, error: Callable[[], BaseException]) -> None:
    """Fail ``outcome``, claimed by the caller, with ``error()``, said from a thread of its own."""

    def failed() -> None:
        try:
            said = error()
        except BaseException as e:  # a bug in saying it must not leave the Future unsettled
            said = e
        outcome.settle(error=said, claimed=True)

    try:
        threading.Thread(target=failed, name="stragglar-deadline", daemon=True).start()
    except RuntimeError:  # no thread to be had (a limit, the interpreter ending): said here
        failed()


def remind(future: torch.futures.Future[Any], seconds: float, action: Callable[[], None]) -> None:
    """Call ``action()`` if ``future`` is not done within ``seconds``, in the watching thread: it
    must return at once."""
    _WATCHER.at(future, seconds, action)


def bounded(
    engine: torch.futures.Future[Any],
    result: Callable[[torch.futures.Future[Any]], Any],
    seconds: float,
    error: Callable[[], BaseException],
    in_time: Callable[[], None] | None = None,
    failed: Callable[[BaseException], BaseException] | None = None,
) -> tuple[torch.futures.Future[Any], Callable[[torch.futures.Future[Any]], None]]:
    """A Future of ``result(engine)`` once ``engine`` completes (its error if ``result`` raises),
    or of ``error()`` if that takes more than ``seconds``; and ``engine``'s last callback, which
    does nothing and which only ``engine`` refers to, so that a weak reference to it tells when
    ``engine``'s completing thread has let go of its callbacks
    (:func:`~stragglar.ddp.probe.let_go`).  ``result`` would not tell: an error it raises keeps
    it alive (its traceback's frames hold their functions, and their callers' frames).
    ``in_time``: called once ``result``'s value settled the Future (not a failure, nor a value
    that came after the deadline had claimed it: reading the Future would raise its error in the
    callback, and add its frames to the error's traceback).  ``failed``: what the error that
    ``result`` raised (a peer lost: the engine's own) is said as, which may wait, bounded, as
    ``error`` may (the outcome is claimed, and said from a thread of its own, as a deadline's)."""
    outcome = Settled()

    def settled(future: torch.futures.Future[Any]) -> None:
        try:
            value = result(future)
        except Exception as e:  # a peer lost: the engine's own error
            if failed is not None and outcome.claim():
                _fail_claimed(outcome, functools.partial(failed, e))  # e is unbound after the block
            else:
                outcome.settle(error=e)
            return
        if outcome.settle(value) and in_time is not None:
            in_time()

    def last(_: torch.futures.Future[Any]) -> None:
        """Nothing: its end tells that the engine's thread is done with the callbacks."""

    engine.add_done_callback(settled)
    engine.add_done_callback(last)
    watch(outcome, seconds, error)
    return outcome.future, last
