"""Which ranks had not reached a collective that timed out (or that lost a peer): a roll call in
the store.

A collective cannot say who is missing (it completes, or not), so a rank whose call passed its
deadline said only that it timed out: with a hundred ranks, the one to look at was anyone's
guess.  StragglAR's rounds, and the header check on gloo (a message to and from each peer), name
the peer they waited for; this names the ranks that never reached the call for the collectives
that cannot: the hooks' all_reduce of the engine on the host (:mod:`stragglar.ddp.engine_allreduce`)
and the header check's all_gather on NCCL (:func:`stragglar.runtime.torch_dist.gather_headers`).

The process group's store (its rendezvous store: a TCPStore, or a FileStore) keeps a key per call
of one collective on a group, which every rank numbers alike (a group runs its collectives in one
order on every rank), in a namespace of the group's and the collective's (a later group, or
state, never reads an earlier one's keys).  A rank appends its number to a call's key once the
call has run :data:`MARK` seconds, never sooner: a call that completes in time, the happy path,
writes nothing.  A rank whose call passes its deadline appends its own and reads the key for as
long as a rank that had reached the call by that deadline takes to append to it (:data:`MARK`, or
the deadline if sooner, and :data:`LAG`); the ranks it never finds there had not reached the call
when this rank gave up.  A rank that is merely late, in the call by then, has appended by then;
one that reached it later is named, and had not reached it; so is one whose call failed at once
(a lost peer), which notes it too.  A call that completes deletes its key only once every rank
that may still read it is done (:data:`KEEP` seconds later, at a later call's completion):
deleted at once, it took the other ranks' notes with it, and a rank still reading named them all.

A TCPStore's client waits for its host without bound: a host that is stopped, or cut off, answers
no operation, whatever the store's timeout says (``wait`` times out, then waits for the host to
acknowledge the cancel).  So the store is used from a thread of the roll call's own, on a
connection of its own (torch's client, which new groups need, is never held by it), and each
operation is waited for :data:`BOUND` seconds at most: a roll call that does not answer in time
says nothing (the error is then the one without names), and once one has not answered, none is
asked again (its thread may never come back).  A call that loses its connection to a peer is
rolled too (gloo's error names the peer's address, not its rank): the ranks not found then had not
reached the call, or had left it (a rank that died in the call before noting it is not told apart
from one that never came).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import torch.distributed as dist
from torch.distributed import FileStore, PrefixStore, TCPStore  # type: ignore[attr-defined, unused-ignore]

from stragglar.runtime.header import ranks_in_words

__all__ = ["BOUND", "KEEP", "LAG", "MARK", "RollCall", "of_headers", "with_absent"]

MARK = 1.0  # seconds a call runs before its rank notes that it reached it: the happy path is sooner
LAG = 2.0  # seconds a note may take to reach the store and show there: a round trip, and a busy
# machine's scheduling (a rank named absent that was in the call would be a false claim)
BOUND = 1.0  # seconds a store operation may take before the roll call is given up
POLL = 0.05  # seconds between two reads of a call's key
# seconds a completed call's key is kept: a rank whose deadline passed as the others completed
# reads it that long at most (MARK and LAG, and each operation's BOUND)
KEEP = MARK + LAG + 4 * BOUND
BACKLOG = 64  # tasks waiting for the roll call's thread past which its store is taken for silent
NAMESPACE = "stragglar/roll-call"
LOG = logging.getLogger("stragglar")

T = TypeVar("T")
Task = tuple[Callable[[Any], Any], "Future[Any]"]


class RollCall:
    """The roll call of one group's calls of one collective: ``rank`` of ``size`` ranks, its keys
    under ``namespace`` in ``store`` (the process group's; a TCPStore is reached on a connection
    of the roll call's own, made on first use).  Made with :meth:`of`."""

    def __init__(self, store: Any, namespace: str, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.calls = 0  # the calls begun on the group, numbered alike on every rank
        self._base, self._namespace = store, namespace
        self._noted: set[int] = set()  # the calls this rank has appended to (the thread's alone)
        self._asked: set[int] = set()  # the calls a note was asked for, to delete once they complete
        self._kept: collections.deque[tuple[float, int]] = collections.deque()  # (when to delete, call)
        self._closed = False
        self._lock = threading.Lock()
        self._tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.broken = False  # an operation took longer than BOUND: no roll call is asked again

    @classmethod
    def of(cls, group: Any, collective: str) -> RollCall | None:
        """The roll call of ``group``'s calls of one ``collective`` (``engine``: the hooks'
        all_reduce, ``headers``: the header check's gathers; each numbered apart), in the default
        process group's store; None where there is none to use (no default store, or one that is
        neither a TCPStore nor a FileStore, whose bounds this module does not know)."""
        try:
            store = dist.distributed_c10d._get_default_store()
            underlying = type(getattr(store, "_underlying_non_prefix_store", store))
            name = group.group_name
        except Exception:  # torch without the private accessors: no names, as before
            return None
        if not issubclass(underlying, (TCPStore, FileStore)):
            return None
        namespace = f"{NAMESPACE}/{collective}/{name}"
        return cls(store, namespace, dist.get_rank(group), dist.get_world_size(group))

    def begin(self) -> int:
        """The number of the call about to be issued (from 1): every rank's k-th call is the same."""
        self.calls += 1
        return self.calls

    def mark(self, call: int) -> None:
        """Note, in the roll call's thread, that this rank reached ``call``, which has run
        :data:`MARK` seconds; returns at once (a deadline's or a timer's thread calls it)."""
        with self._lock:
            self._asked.add(call)
        self._submit(lambda store: self._note(store, call))

    def completed(self, call: int) -> None:
        """``call`` completed: its key, if this rank wrote one, is deleted :data:`KEEP` seconds
        later (a rank that gave up on it may still be reading it), with those of earlier calls
        whose time has come (in the roll call's thread)."""
        now = time.monotonic()
        with self._lock:
            if call in self._asked:
                self._asked.discard(call)
                self._kept.append((now + KEEP, call))
            due = []
            while self._kept and self._kept[0][0] <= now:
                due.append(self._kept.popleft()[1])
        if due:
            self._submit(lambda store: self._forget(store, due))

    def absent(self, call: int, seconds: float) -> list[int] | None:
        """The ranks that had not reached ``call``, whose deadline of ``seconds`` has just passed
        on this rank: those not in its key once every rank that reached it by now has had the time
        to note it (sooner if every rank is there).  None: the store did not answer in time."""
        look = time.monotonic() + min(MARK, seconds) + LAG
        if self._ask(lambda store: self._note(store, call)) is None:
            return None
        others = [r for r in range(self.size) if r != self.rank]
        there: set[int] = set()  # every note read: a note is never taken back while this reads
        while True:
            read = self._ask(lambda store: self._read(store, call))
            if read is None:
                return None
            there |= read
            missing = [r for r in others if r not in there]
            if not missing or time.monotonic() >= look:
                return missing
            time.sleep(POLL)

    def close(self) -> None:
        """End the roll call's thread once it is done with what it was asked (it ends with the
        process if the store never answers it); nothing is asked of it afterwards (a deadline or
        a reminder that comes later gives no names)."""
        with self._lock:
            self._closed = True
            if self._thread is not None:
                self._tasks.put(None)
                self._thread = None

    def _note(self, store: Any, call: int) -> bool:
        if call not in self._noted:
            store.append(str(call), f"{self.rank},")
            self._noted.add(call)
        return True  # noted (None is a roll call that did not answer)

    def _forget(self, store: Any, calls: list[int]) -> None:
        for call in calls:
            store.delete_key(str(call))
            self._noted.discard(call)

    def _read(self, store: Any, call: int) -> set[int]:
        # compare_set with an expected value no key holds reads without writing, and without
        # waiting for a key that is not there (get would, for the store's timeout)
        found = bytes(store.compare_set(str(call), "\0", "\0"))
        if found == b"\0":
            return set()
        return {int(r) for r in found.decode().split(",") if r}

    def _ask(self, task: Callable[[Any], T]) -> T | None:
        """``task``'s result, from the roll call's thread; None if it failed or took longer than
        :data:`BOUND` (then the roll call is broken: its thread may be waiting for the host)."""
        future = self._submit(task)
        if future is None:
            return None
        try:
            return future.result(timeout=BOUND)
        except FutureTimeout:
            self.broken = True
            LOG.warning("the store did not answer the roll call within %g s: ranks not named", BOUND)
        except Exception as e:  # the store's own error: no names, the timeout is still said
            LOG.warning("the roll call failed: %s", e)
        return None

    def _submit(self, task: Callable[[Any], T]) -> Future[T] | None:
        if self.broken or self._tasks.qsize() > BACKLOG:  # a store that answers nothing: drop it
            self.broken = True
            return None
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                return None
            if self._thread is None:
                thread = threading.Thread(
                    target=self._run, args=(self._tasks,), name="stragglar-roll-call", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError:  # no thread to be had (a limit, the interpreter ending): no names
                    self.broken = True
                    return None
                self._thread = thread
            self._tasks.put((task, future))
        return future

    def _run(self, tasks: queue.SimpleQueue[Task | None]) -> None:
        store = None  # the roll call's own (a TCPStore's connection closes with it)
        while (item := tasks.get()) is not None:
            task, future = item
            try:
                if store is None:
                    store = _own(self._base, self._namespace)
                future.set_result(task(store))
            except Exception as e:
                future.set_exception(e)


def with_absent(detail: str, absent: Sequence[int], timed_out: bool) -> tuple[str, int | None]:
    """A failure's ``detail`` with the ranks a roll call found ``absent`` said after it (none: as
    it is), and the peer to blame, the first of them.  After a timeout they had not reached the
    call; after a lost peer they had not reached it or had left it (a rank that died in the call
    before it noted itself is not told apart from one that never came)."""
    if not absent:
        return detail, None
    gone = "had not reached it" if timed_out else "had not reached it or had left it"
    return f"{detail}; {ranks_in_words(absent)} {gone}", min(absent)


def _own(store: Any, namespace: str) -> Any:
    """``store`` under ``namespace``, on a connection of its own if it is a TCPStore (its clone:
    a new client of the same host, under the same prefixes); a FileStore's operations wait for
    no host, and a second FileStore of the same file would count itself in the file's users."""
    if isinstance(getattr(store, "_underlying_non_prefix_store", store), TCPStore):
        store = store.clone()
    return PrefixStore(namespace, store)


_of_headers: weakref.WeakKeyDictionary[Any, RollCall | None] = weakref.WeakKeyDictionary()
_of_headers_lock = threading.Lock()


def of_headers(group: Any) -> RollCall | None:
    """The roll call of the header checks' gathers on ``group`` (None: the world), made once per
    group and closed when the group goes; None where there is no store to use."""
    group = dist.group.WORLD if group is None else group
    with _of_headers_lock:
        if group not in _of_headers:
            roll = _of_headers[group] = RollCall.of(group, "headers")
            if roll is not None:
                weakref.finalize(group, roll.close)
        return _of_headers[group]
