"""Which rank arrives last at each step, by how much, and what the engine's all_reduce costs.

One tiny all_gather per step, on a gloo group of its own, carries every rank's figures to every
rank, so all decide from the same numbers (:mod:`stragglar.model.policy`).  A rank's row is
``[valid, wait, kind_1, bytes_1, chunks_1, seconds_1, ..., kind_K, bytes_K, chunks_K, seconds_K]``:
how long it waited at the previous step's gather for the last rank, and how long it took to
reduce the previous step's buckets (the first :data:`SLOTS` of them), each with the algorithm
that reduced it (``kind``: an index in :data:`KINDS`, 0 for an empty slot) and its chunk count
(:data:`~stragglar.model.fits.Timing`).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import weakref
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from stragglar.model.fits import Timing
from stragglar.model.policy import ALLREDUCE, STRAGGLAR, latenesses
from stragglar.runtime import poll

__all__ = [
    "KINDS",
    "SLOTS",
    "GlooCall",
    "LateRankProbe",
    "Stopwatch",
    "decode",
    "encode",
    "end_calls",
    "let_go",
    "sever",
]

SLOTS = 8  # bucket timings a rank shares per step: enough sizes to fit alpha and bandwidth
SAMPLES = 2 * SLOTS  # gathered timings kept per algorithm: its last two steps, so the fits follow
# the machine's load, and a StragglAR measured long ago is measured again before it counts
KINDS = ("", ALLREDUCE, STRAGGLAR)
FIELDS = 4  # per slot: kind, bytes, chunks, seconds
ROW = 2 + FIELDS * SLOTS


GlooCall = tuple[Any, "weakref.ref[Any]"]  # gloo's work, and a weak reference to its Future's callback
SEVERED_WAIT = 2.0  # seconds to let go of calls whose group was severed: they fail at once
SEVER_TAG = 0x5E7E  # the hook's gloo groups carry collectives alone: no message ever has this tag


def let_go(calls: Sequence[GlooCall], wait: float) -> bool:
    """Wait up to ``wait`` seconds until gloo's thread is done with ``calls``: each work complete
    and its callback gone (a weak reference tells); whether it was.

    A work's Future completes before gloo's thread is done with it: after it, that thread still
    lets go of the callback, and of the work (its tensors, its copy of the caller's thread-local
    state: Python objects), taking the GIL for each.  Run as the interpreter exits (a script that
    never destroys its groups: :mod:`stragglar.runtime.teardown`), a thread still waiting for the
    GIL when finalization begins is ended inside a C++ destructor, and the process aborts
    ("terminate called without an active exception").  So the callers wait for the callbacks here,
    and keep the works themselves, so that their end comes in a thread of Python's, never in
    gloo's."""
    return poll(lambda: all(work.is_completed() and callback() is None for work, callback in calls), wait)


def sever(group: Any) -> None:
    """Close this rank's connections on the gloo ``group``: its calls still waiting there fail at
    once, and so do its peers' calls waiting on this rank, as when this process exits.

    gloo ends a call that lost a peer (a dead rank's connection reset) on that connection alone:
    the call's other peers, alive, are not told, and wait for whatever this rank no longer sends
    until the group's timeout (the state's, 300 s by default), and this rank's other calls wait
    on them alike.  Such a call then ended only when another rank exited and closed its sockets,
    which under a bare ``destroy_process_group()`` was as this rank's interpreter finalized too,
    and its end in gloo's threads there aborted the process ("terminate called after throwing an
    instance of 'gloo::IoException'", or "... without an active exception").  gloo offers no
    abort of a group, but a receive that it times out closes every connection of the group
    ("Application timeout caused pair closure"): one that no peer ever answers, waited for a
    millisecond, so severs it."""
    size = dist.get_world_size(group)
    if size < 2:
        return
    peer = dist.get_global_rank(group, (dist.get_rank(group) + 1) % size)
    # raises the timeout's error, or a closed connection's where it was severed already
    with contextlib.suppress(RuntimeError):
        work = dist.irecv(torch.zeros(1), peer, group=group, tag=SEVER_TAG)
        if work is not None:  # None only for a rank outside the group, which this is not
            work.wait(timedelta(milliseconds=1))


def end_calls(calls: Sequence[GlooCall], group: Any, wait: float, failed: bool) -> bool:
    """Let gloo's thread let go of ``calls`` on ``group`` (:func:`let_go`): whether they ended by
    themselves (False: ``group`` was severed).

    A call that has not ended within ``wait`` seconds, or at once where a call of this rank's
    ``failed`` already (its peers may have given up theirs), is ended by severing ``group``
    (:func:`sever`): left in flight, it ended as the interpreter exited, in gloo's thread, and
    aborted the process.  A healthy end of training waits as long as before: every rank has
    posted its calls, which complete soon, and a severed group would lose a slow peer's last
    messages."""
    if let_go(calls, 0.0 if failed else wait):
        return True
    sever(group)
    let_go(calls, SEVERED_WAIT)
    return False


class Stopwatch(Protocol):
    """A timing that may resolve later (a CUDA event pair is read once the device has passed it)."""

    def seconds(self) -> float | None: ...


class LateRankProbe:
    """Which rank arrives last at each step, found without making the others wait for it.

    At each step every rank posts the all_gather and notes when it posted; the time until the
    gather completes is how long the rank would have waited for the last one (about 0 for the late
    rank itself).  Each step's gather carries the figures of the step before, and is read one step
    later, when it has surely completed: this rank has finished the AllReduce after it, which needs
    every rank to have arrived.  So the figures of step ``s`` are known at step ``s + 2``.

    ``ranks``: the global ranks probed (None: the world), those of the hook's group; only they
    make the probe's own group, so several groups' probes (HSDP's replicate groups) start apart.
    """

    def __init__(
        self, world_size: int, window: int, timeout: float, ranks: Sequence[int] | None = None
    ) -> None:
        self.world_size = world_size
        self.group = dist.new_group(  # CPU, own sockets; made by ``ranks`` alone (None: the world)
            None if ranks is None else list(ranks),
            backend="gloo",
            timeout=timedelta(seconds=timeout),
            use_local_synchronization=ranks is not None,
        )
        self.late: collections.deque[tuple[float, ...]] = collections.deque(maxlen=window)
        self.waits: tuple[float, ...] = ()  # every rank's wait at the step whose figures arrived last
        self.samples = {kind: collections.deque[Timing](maxlen=SAMPLES) for kind in KINDS[1:]}
        self._wait: float | None = None  # this rank's wait at the last step whose gather completed
        # the first gather's wait measures nothing: the ranks met just before it posted (this
        # group's making, and at a first step the hook's check of the settings, are collectives),
        # so every wait was ~0 and the trace's first row named a random rank last
        self._first = True
        self._timings: list[tuple[str, int, int, Stopwatch]] = []
        self._lock = threading.Lock()  # the worker's threads record while the caller may step
        # the posted gather: its Future (of when it completed), its outputs, when it was posted,
        # and its gloo call (the work, held: see let_go)
        self._pending: tuple[Any, list[torch.Tensor], float, GlooCall] | None = None
        self._closed: Any = None  # the last gather's work, once closed: it ends with the probe

    def record(self, algorithm: str, size_bytes: int, chunks: int, watch: Stopwatch) -> None:
        """Note how long a bucket took to reduce with ``algorithm`` in ``chunks`` chunks (0: its
        own), from any thread."""
        with self._lock:
            self._timings.append((algorithm, size_bytes, chunks, watch))

    def step(self) -> bool:
        """Call once per step, first thing; True when an earlier step's figures arrived."""
        arrived = False
        if self._pending is not None:
            done, gathered, posted, _ = self._pending
            waited = done.wait() - posted
            self._wait, self._first = (None if self._first else waited), False
            arrived = self._read([t.tolist() for t in gathered])
        gathered = [torch.zeros(ROW, dtype=torch.float64) for _ in range(self.world_size)]
        row = torch.tensor(self._row(), dtype=torch.float64)

        def completed(_: Any) -> float:
            return time.perf_counter()

        posted = time.perf_counter()
        work = dist.all_gather(gathered, row, group=self.group, async_op=True)
        call = (work, weakref.ref(completed))  # from here on, only gloo's thread holds the callback
        self._pending = (work.get_future().then(completed), gathered, posted, call)
        return arrived

    @property
    def pending(self) -> bool:
        """Whether a posted gather has not been read or closed yet (one always is, in training)."""
        return self._pending is not None

    def close(self, wait: float, failed: bool = False) -> bool:
        """Let the last posted gather complete, up to ``wait`` seconds, and drop it once gloo's
        thread has let go of it (:func:`end_calls`; the work is kept until the probe goes).
        Training ends with one in flight (each step's is read a step later), and gloo aborts the
        process when a group is destroyed with work in flight; every rank posted it already, so
        it completes at once unless a peer died: then (or at once where a step ``failed`` on this
        rank) the probe's group is severed, and a later step's gather fails there.  Whether the
        gather ended by itself (False: its group was severed)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return True
        call = pending[3]
        self._closed = call[0]
        del pending  # the callback's last reference is gloo's thread's
        return end_calls([call], self.group, wait, failed)

    def _row(self) -> list[float]:
        with self._lock:
            timings, self._timings = self._timings, []
        return encode(
            self._wait, [(kind, size, chunks, watch.seconds()) for kind, size, chunks, watch in timings]
        )

    def _read(self, rows: list[list[float]]) -> bool:
        figures = decode(rows)
        if figures is None:
            return False
        late, samples = figures
        self.waits = tuple(row[1] for row in rows)
        self.late.append(late)
        for kind, size, chunks, seconds in samples:
            self.samples[kind].append((size, chunks, seconds))
        return True


def encode(wait: float | None, timings: Sequence[tuple[str, int, int, float | None]]) -> list[float]:
    """This rank's row: its wait (None: not measured yet) and its first :data:`SLOTS` timings
    (algorithm, bytes, chunks, seconds or None when not known yet).

    >>> encode(0.25, [("allreduce", 1024, 0, 0.5), ("stragglar", 64, 8, None)])[:10]
    [1.0, 0.25, 1.0, 1024.0, 0.0, 0.5, 2.0, 64.0, 8.0, 0.0]
    >>> len(encode(None, [])) == ROW
    True
    """
    row = [0.0, 0.0] if wait is None else [1.0, wait]
    for kind, size, chunks, seconds in timings[:SLOTS]:
        row += [float(KINDS.index(kind)), float(size), float(chunks), seconds or 0.0]
    return row + [0.0] * (ROW - len(row))


def decode(
    rows: Sequence[Sequence[float]],
) -> tuple[tuple[float, ...], list[tuple[str, int, int, float]]] | None:
    """Every rank's lateness and the bucket timings, from every rank's row (None: no waits yet).

    A slot counts where ranks agree on its algorithm, size and chunks, with the fastest rank's
    time: that rank waited for nobody.

    >>> rows = [encode(0.03, [("allreduce", 8, 0, 0.004)]), encode(0.0, [("allreduce", 8, 0, 0.002)])]
    >>> late, samples = decode(rows)
    >>> [round(x, 3) for x in late], samples
    ([-0.03, 0.03], [('allreduce', 8, 0, 0.002)])
    """
    if not all(row[0] for row in rows):  # the first gather carries no waits yet
        return None
    samples = []
    for k in range(2, ROW, FIELDS):
        head = list(rows[0][k : k + 3])  # kind, bytes, chunks
        times = [row[k + 3] for row in rows if row[k + 3] > 0 and list(row[k : k + 3]) == head]
        if head[0] and times:
            samples.append((KINDS[int(head[0])], int(head[1]), int(head[2]), min(times)))
    return latenesses([row[1] for row in rows]), samples
