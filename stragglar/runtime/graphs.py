"""Replay a bound plan's rounds from CUDA graphs: launching a round's kernels from Python costs
100-200 us of host time per round, a graph replay a few microseconds for all of them.  (The
device engine's loopback replays its launch of every rank's kernel the same way.)

A :class:`Replayer` runs pieces of work (a plan's round range: the rounds before the late rank
joins and the rest, its sleep on the host between two graphs), each named by a key.  The first
call of a key runs eagerly (it compiles and loads kernels and connects NCCL peers, which a
capture may not do); the second captures the work into a graph and replays it; later calls
replay.  The key must name all a graph bakes in: the loopback's graphs read the buffers through
a pointer table written before each call, so its key is the plan, size and dtype; a graph of NCCL
rounds writes the buffer it was captured on, so the buffer's address is in its key.  If a
capture fails, work runs eagerly from then on and the replayer says why once, as a warning:
slower, never wrong.

A graph that captured NCCL calls holds their communicator: NCCL will not destroy it while the
graph lives, so ``destroy_process_group()`` would wait forever (seen on an H200, NCCL 2.28).  The
key of work on a communicator starts with it (the process group or CuPy communicator), and
:func:`release` drops the graphs on one, or all, before it goes.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol

__all__ = ["Capturing", "Replayer", "StreamGraphs", "nccl_uncapturable", "release", "shared"]


class Capturing(Protocol):
    """Where graphs are made: ``capture(work)`` records what ``work`` launches (without running
    it) and returns the graph; ``replay`` launches a graph; ``synchronize`` waits until the device
    has run every graph launched (before any is dropped)."""

    def capture(self, work: Callable[[], object]) -> Any: ...

    def replay(self, graph: Any) -> None: ...

    def synchronize(self) -> None: ...


class StreamGraphs:
    """:class:`Capturing` on one CuPy stream: work captured from it (and the streams it forks to),
    graphs replayed on it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def capture(self, work: Callable[[], object]) -> Any:
        self.stream.begin_capture()
        try:
            work()
        finally:
            graph = self.stream.end_capture()
        return graph

    def replay(self, graph: Any) -> None:
        graph.launch(stream=self.stream)

    def synchronize(self) -> None:
        self.stream.synchronize()


class Replayer:
    """Runs each piece of work, named by a key that says everything it launches on (a plan's
    round range, element count, dtype, buffers): eagerly the first time, from a graph after
    (``graphs=False``: always eagerly).  Threads may share one (the DDP hook's two workers): its
    books are kept under a lock, but the work, a capture and a replay run outside it, since a
    rank's eager work can wait for a peer's, and the peer for this rank's other thread."""

    def __init__(
        self, device: Capturing, graphs: bool = True, limit: int = 64, work: str = "the rounds"
    ) -> None:
        self.device = device
        self.graphs = graphs
        self.work = work  # what the graphs hold, in the warning of a failed capture
        self.limit = limit  # graphs kept (each holds its own device memory), least recently used go
        self.seen: OrderedDict[Hashable, None] = OrderedDict()
        self.captured: OrderedDict[Hashable, Any] = OrderedDict()
        self.failure: str | None = None
        self.lock = threading.Lock()

    def __call__(
        self, key: Hashable, work: Callable[[], object], refusal: Callable[[], str | None] | None = None
    ) -> None:
        """Run ``work`` for ``key``; ``refusal`` says, when a capture is due, why none may be made
        (None: it may), asked then and not at every call."""
        with self.lock:
            graph = self.captured.get(key) if self.graphs else None  # off: no replay of an old one
            if graph is not None:
                self.captured.move_to_end(key)
            eager = graph is None and (not self.graphs or self.failure is not None or key not in self.seen)
            if eager:
                _remember(self.seen, key, None, self.limit)
        if graph is not None:
            self.device.replay(graph)
            return
        why = None if eager or refusal is None else refusal()
        if why is not None:
            self.refuse(why)
        if eager or why is not None:
            work()
            return
        try:
            graph = self.device.capture(work)
        except Exception as e:  # any capture failure: the work still runs, eagerly
            self.refuse(f"{type(e).__name__}: {e}".splitlines()[0])
            work()
            return
        with self.lock:
            _remember(self.captured, key, graph, self.limit)
        self.device.replay(graph)

    def release(self, owner: object = None) -> int:
        """Drop the graphs, and forget the keys, of work on ``owner`` (the first item of their
        keys; None: every graph), once the device has run those launched; how many graphs went.
        A key called again runs eagerly first, as a new one."""
        with self.lock:
            if not _keys_on(self.captured, owner):
                self._forget(owner)
                return 0
        self.device.synchronize()
        with self.lock:
            gone = _keys_on(self.captured, owner)  # again: another thread may have captured since
            for key in gone:
                del self.captured[key]
            self._forget(owner)
        return len(gone)

    def _forget(self, owner: object) -> None:
        for key in _keys_on(self.seen, owner):
            del self.seen[key]

    def refuse(self, why: str) -> None:
        """Capture nothing from now on (a failed capture, or one known to fail): remember the first
        reason and say it, once however many threads fail at once."""
        with self.lock:
            first, self.failure = self.failure is None, self.failure or why
        if first:
            warnings.warn(
                f"stragglar: could not capture {self.work} in a CUDA graph ({why}); "
                "they run eagerly (slower, same results)",
                RuntimeWarning,
                stacklevel=3,
            )


CAPTURABLE_NCCL = (2, 9, 6)  # the first NCCL whose calls a CUDA graph can capture


def nccl_uncapturable(version: tuple[int, int, int]) -> str | None:
    """Why an NCCL of ``version`` cannot be captured in a CUDA graph, or None.  An older NCCL's
    capture may seem to succeed and its replay hang (every call would then end at its timeout)."""
    if version >= CAPTURABLE_NCCL:
        return None
    return f"NCCL {'.'.join(map(str, version))} cannot be captured: 2.9.6 and later can"


def _keys_on(keys: Iterable[Hashable], owner: object) -> list[Hashable]:
    """The keys of work on ``owner`` (None: all of them): those whose first item it is (see the
    module's notes)."""
    return [k for k in keys if owner is None or (isinstance(k, tuple) and k and k[0] is owner)]


def _remember(cache: OrderedDict[Hashable, Any], key: Hashable, value: Any, limit: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)


_shared: dict[Callable[[], Capturing], Replayer] = {}
_shared_lock = threading.Lock()


def shared(kind: Callable[[], Capturing]) -> Replayer:
    """This process's one replayer of graphs made by ``kind`` (a class), so that a failed capture
    is said once and that kind's rounds run eagerly from then on."""
    with _shared_lock:
        replayer = _shared.get(kind)
        if replayer is None:
            replayer = _shared[kind] = Replayer(kind())
        return replayer


def release(owner: object = None) -> int:
    """Drop the shared replayers' graphs on ``owner`` (None: all of them); how many went."""
    with _shared_lock:
        replayers = list(_shared.values())
    return sum(replayer.release(owner) for replayer in replayers)
