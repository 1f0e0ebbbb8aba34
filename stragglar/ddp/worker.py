"""Reducing buckets off the caller's path: two worker threads per process group, side streams on CUDA.

DDP calls its hook during backward, as each bucket becomes ready; its value is that the bucket's
AllReduce overlaps the rest of backward.  So the hook only hands the bucket to a
:class:`BucketWorker` and returns a Future, and the worker runs the rounds, then completes it.

* Two threads per process group, each with a group of its own, run every bucket in two stages:
  the first runs the schedule's rounds that the late rank takes no part in (StragglAR's
  ReduceScatter among the punctual ranks), the second the rest.  So while the straggler is away
  the punctual ranks reduce-scatter every bucket that is ready, not only the first: with one
  thread, bucket 2's first rounds would wait behind bucket 1's last, which wait for the straggler.
  Each thread runs the buckets in the order they were handed in, so every rank issues the same
  operations on each group in the same order (the calls are ``lockstep``: each setup's header is
  checked once, however the buckets' setups alternate, so no bucket's first stage waits for the
  late rank's check), and a bucket's messages (its channel is its number) never meet another's;
  the first stage never waits for the second, so the two cannot deadlock.
  Nothing else may issue on those groups: the hook uses groups of its own
  (:func:`dedicated_group`), never DDP's.
* A failure is set on the bucket's Future (DDP raises it from backward), and every later bucket
  fails at once with the same error instead of waiting for peers that are gone: after a failed
  round the group's message streams are no longer in step.
* Buckets the policy gives to the engine's all_reduce do not come here: the hook issues them on
  DDP's own group, asynchronously, as DDP's default hook does (the engine runs them on its own
  threads or streams; a Python thread in between only adds latency).
* On CUDA (:class:`~stragglar.ddp.orders.StreamOrder`) each stage runs on a side stream of its
  own: the first after an event the caller recorded on its stream when the gradients were ready,
  the second after an event the first recorded after its rounds.  No round waits on the host
  (:func:`~stragglar.runtime.allreduce` with ``stream_ordered``), and the Future is a CUDA Future
  completed with the second side stream current: DDP's stream waits for it only when it reads the
  result.  One thread queues both stages of each bucket in turn: NCCL asks that operations on
  different communicators be issued in the same order on every rank (two threads would interleave
  them by timing), and since queuing does not wait, a later bucket's first stage still runs on
  the device while an earlier bucket's second stage waits for the straggler.  On CPU
  (:class:`~stragglar.ddp.orders.HostOrder`) the rounds block, so there each stage has its
  thread.  (How stages are ordered and timed: :mod:`stragglar.ddp.orders`.)
* On the device engine a bucket is one kernel launch a rank.  The first thread launches it, the
  second waits for it (the engine gathers every rank's words over the second group), so while
  one bucket's kernels wait for the straggler the next bucket's are launched and run their hidden
  phase.  A call that may gather over the first group (a bucket's registration, a setup's first
  call, a staged call) runs whole on the first thread, once the second has waited for every
  call before it: every rank then issues its collectives on the two groups in one order, as
  NCCL asks.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stragglar.ddp.orders import Order, Watch
from stragglar.ddp.probe import Stopwatch
from stragglar.errors import InputError
from stragglar.model.policy import STRAGGLAR
from stragglar.runtime import MAX_TAG, RankError, Registration, allreduce, register_buffer, rounds_without
from stragglar.verify import Proof

__all__ = ["BucketWorker", "InFlight", "Job", "Reducer", "dedicated_group", "global_ranks", "named_globally"]

DEVICE = "device"  # the engine that runs a bucket's whole AllReduce as one kernel launch a rank
LOG = logging.getLogger("stragglar")


@dataclass(frozen=True, slots=True)
class Job:
    """One bucket to average with a schedule: where its gradients are, whom to tell."""

    buffer: torch.Tensor
    bucket: int
    proof: Proof
    late_rank: int | None  # None: the schedule's (its straggler, else the last rank)
    chunks: int  # the schedule's chunk count where not the algorithm's own, else 0 (for the policy)
    order: Order
    ready: Any  # the event after the gradients (CUDA), None on CPU
    future: torch.futures.Future[torch.Tensor]
    divisor: int | None = None  # what the sum is divided by (None: the world size, to average)
    kept: bool = False  # the caller keeps this buffer from step to step: the device engine registers it
    # run on the hook's caller's thread (FSDP's hook, asynchronous=False): its rounds never replay
    # from a graph, whose capture synchronizes the device and would stall the caller there
    on_caller: bool = False
    # when the hook handed the bucket over (time.perf_counter): a rank made late on purpose arrives
    # at this bucket ``straggler_delay`` after it, not a delay after its previous bucket's end
    handed: float = field(default_factory=time.perf_counter)

    def split(self) -> int:
        """The first stage's rounds: those the late rank takes no part in (0 for Ring)."""
        return rounds_without(self.proof, self.late_rank)


class InFlight:
    """How many device calls the first worker thread launched that the second has not waited
    for yet; :meth:`drain` waits, bounded, until there are none."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = threading.Condition()

    def add(self) -> None:
        with self.changed:
            self.count += 1

    def done(self) -> None:
        with self.changed:
            self.count -= 1
            self.changed.notify_all()

    def drain(self, timeout: float) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: self.count == 0, timeout):
                raise TimeoutError(f"the device calls in flight did not end within {timeout:g} s")


SETTLED = 512  # setups remembered as checked: fewer than the runtime's lockstep checks remember


@dataclass(frozen=True)
class Reducer:
    """Averages a job's bucket with its schedule in two stages, then completes its Future.

    On the rounds engine, :meth:`early` runs the rounds the late rank takes no part in on
    ``groups[0]`` and returns what the second stage waits for; :meth:`late` runs the rest on
    ``groups[1]`` (the same group twice where one thread runs both).  ``record`` receives how long
    each bucket's second stage took (algorithm, bytes, chunks, stopwatch), for the policy: the part
    after the late rank arrived, the part that the cost model prices against the engine's
    AllReduce.

    On the device engine (``engine="device"``) a bucket is one call, one kernel launch on each
    rank, on ``groups[0]``: the punctual ranks' kernels run the hidden phase while the late rank's
    is not launched yet.  The first stage launches it and the second waits for it (gathering every
    rank's words over ``groups[1]``); ``record`` receives the whole call's time (the late rank's,
    from its arrival, is the fastest, the one the policy reads).  A job's buffer that the caller
    keeps (``Job.kept``: DDP's buckets) is registered on its first call
    (:func:`~stragglar.runtime.register_buffer`), so that its later calls move chunks straight
    between the ranks' buckets.  Every rank makes the same jobs in the same order, so every rank
    registers, or fails to, at the same call.  What the device engine keeps, by role:

    * ``registrations``: the buckets' registrations by bucket number, None where the buffer could
      not be registered (its calls run staged, through the receivers' inboxes) or has moved;
    * ``settled``: the setups (:meth:`_setup`) whose first call ran whole, its header checked and
      its state made, so that their later calls gather nothing over ``groups[0]`` and may be
      launched and waited for on two threads (the :data:`SETTLED` most recent);
    * ``in_flight``: the calls the first stage launched that the second has not waited for yet.
    """

    groups: tuple[Any, Any]
    world: int
    timeout: float
    straggler_delay: float = 0.0
    record: Callable[[str, int, int, Stopwatch], None] | None = None
    graphs: bool = True
    engine: str = "rounds"
    registrations: dict[int, Registration | None] = field(default_factory=dict)
    settled: OrderedDict[Hashable, None] = field(default_factory=OrderedDict)
    in_flight: InFlight = field(default_factory=InFlight)

    def __call__(self, job: Job) -> None:
        """Both stages, one after the other, on the caller's thread."""
        if self.engine == DEVICE:
            self._on_device(job)
        else:
            self.late(job, self.early(job))

    def stages(self, job: Job) -> tuple[Callable[[Any], Any], Callable[[Any], None]]:
        """The two stages as a :class:`BucketWorker` runs them: on the host each on its own
        thread; stream-ordered, both on the first thread, in turn (see the module's notes); on
        the device engine, the launch on the first and the wait on the second."""
        if self.engine == DEVICE:
            return (lambda _: self._launch(job)), functools.partial(self._wait, job)
        if job.order.stream_ordered:
            return (lambda _: self(job)), _queued
        return (lambda _: self.early(job)), functools.partial(self.late, job)

    def early(self, job: Job) -> Any:
        with job.order.running(job.ready, 0, job.buffer):
            split = job.split()
            if split:
                self._rounds(job, 0, (0, split))
            return job.order.ready()

    def late(self, job: Job, ready: Any) -> None:
        with job.order.running(ready, 1, job.buffer):
            watch = job.order.clock()
            self._rounds(job, 1, (job.split(), None))
            self._done(job, watch)

    def close(self) -> None:
        """Let go of the buckets' registrations (on every rank, as the state closes)."""
        for registration in self.registrations.values():
            if registration is not None:
                registration.close()
        self.registrations.clear()

    def _done(self, job: Job, watch: Watch) -> None:
        """The bucket is summed: stop its watch, record it, divide, complete the Future."""
        watch.stop()
        if self.record is not None:
            self.record(STRAGGLAR, job.buffer.numel() * job.buffer.element_size(), job.chunks, watch)
        divisor = self.world if job.divisor is None else job.divisor
        if divisor != 1:
            job.buffer.div_(divisor)
        job.future.set_result(job.buffer)

    def _on_device(self, job: Job) -> None:
        """A bucket's whole device call, on the caller's thread (or the first worker thread, where
        the call may gather over ``groups[0]``: see :meth:`_launch`)."""
        with job.order.running(job.ready, 0, job.buffer):
            if job.kept:
                self._register(job)
            watch = job.order.clock()
            self._device_call(job, False)
            self._done(job, watch)
            held = self.registrations.get(job.bucket)
            if held is not None:
                self.settled[self._setup(job, held)] = None
                while len(self.settled) > SETTLED:
                    self.settled.popitem(last=False)

    def _launch(self, job: Job) -> Any:
        """The first worker thread's stage: launch the bucket's kernel, and hand the work to the
        second thread to wait for (on ``groups[1]``), so that the next bucket's kernel is
        launched while this one waits for the late rank.  A call that may gather over
        ``groups[0]`` (a registration, a setup's first call, a staged call, whose state may be
        made anew) runs whole here instead, once the second thread has waited for every work
        before it: then every rank issues its collectives on the two groups in one order."""
        held = self.registrations.get(job.bucket)
        settled = (
            job.kept
            and held is not None
            and held.holds(job.buffer)
            and self._setup(job, held) in self.settled
        )
        if not settled:
            self.in_flight.drain(self.timeout)
            self._on_device(job)
            return None
        with job.order.running(job.ready, 0, job.buffer):
            watch = job.order.clock()
            work = self._device_call(job, True)
            self.in_flight.add()
            return work, watch, job.order.ready()

    def _wait(self, job: Job, handed: Any) -> None:
        """The second worker thread's stage: wait for the work :meth:`_launch` handed over (None:
        the call ran whole there), then divide and complete the Future."""
        if handed is None:
            return
        work, watch, ready = handed
        try:
            with job.order.running(ready, 1, job.buffer), global_ranks(self.groups[1]):
                work.wait(self.groups[1])
                self._done(job, watch)
        finally:
            self.in_flight.done()

    def _device_call(self, job: Job, launch_only: bool) -> Any:
        """The bucket's device call on ``groups[0]``: whole, or only launched (a work to wait for)."""
        options: dict[str, Any] = {
            "group": self.groups[0],
            "straggler_delay": self._delay(job),
            "timeout": self.timeout,
            "tag": job.bucket % (MAX_TAG + 1),
            "late_rank": job.late_rank,
            "lockstep": True,
            "engine": DEVICE,
        }
        with global_ranks(self.groups[0]):
            if launch_only:
                return allreduce(job.buffer, job.proof, async_op=True, **options)
            return allreduce(job.buffer, job.proof, **options)

    def _delay(self, job: Job) -> float:
        """What is left of ``straggler_delay`` since the bucket was handed over: the late rank
        arrives at every bucket of a step that late.  Its calls run one after the other, and a
        whole delay in each would make bucket k late by k delays (by as many on a rank's
        launches of the device engine, which sleep on one thread).  A punctual rank's
        remainder lengthens its waits by about as much as the late rank still sleeps."""
        if self.straggler_delay == 0:
            return 0.0
        return max(0.0, job.handed + self.straggler_delay - time.perf_counter())

    @staticmethod
    def _setup(job: Job, held: Registration) -> Hashable:
        """What a call's header check and device state depend on, besides its buffer."""
        return (job.bucket, job.proof.schedule.fingerprint, job.late_rank, held.number)

    def _register(self, job: Job) -> None:
        """Register a kept bucket's buffer on its first call; let go of a registration whose
        bucket has moved (its calls then run staged: where a peer's has not moved, every rank's
        call fails with a MismatchError, never a wrong sum)."""
        if job.bucket in self.registrations:
            held = self.registrations[job.bucket]
            if held is not None and not held.holds(job.buffer):
                held.close()
                self.registrations[job.bucket] = None
            return
        try:
            self.registrations[job.bucket] = register_buffer(job.buffer, self.groups[0], timeout=self.timeout)
        except InputError as e:  # raised alike on every rank: every rank runs this bucket staged
            self.registrations[job.bucket] = None
            if dist.get_rank() == 0:
                LOG.warning("device engine: bucket %d runs staged (through the inboxes): %s", job.bucket, e)

    def _rounds(self, job: Job, stage: int, rounds: tuple[int, int | None]) -> None:
        # gloo has no streams: its CUDA buffers are waited on the host, stage by stage
        ordered = job.order.stream_ordered and dist.get_backend(self.groups[stage]) == "nccl"
        with global_ranks(self.groups[stage]):
            allreduce(
                job.buffer,
                job.proof,
                group=self.groups[stage],
                straggler_delay=self._delay(job),
                timeout=self.timeout,
                tag=job.bucket % (MAX_TAG + 1),
                late_rank=job.late_rank,
                stream_ordered=ordered,
                graphs=False if ordered and (job.on_caller or not self.graphs) else None,
                rounds=rounds,
                lockstep=True,
            )


def _queued(_: Any) -> None:
    """A stream-ordered job's second stage: the first thread queued it already."""


CLOSE_WAIT = 10.0  # seconds :meth:`BucketWorker.close` waits for its threads: a bound, as every wait


class BucketWorker:
    """Threads that run tasks in stages and fail their Futures on error.

    Thread ``i`` runs stage ``i`` of every task, in the order the tasks were submitted, and hands
    what it returns to stage ``i + 1``; the task's stages complete its Future.  After one
    stage fails, every later stage of any task fails its Future at once with the same error.
    :meth:`close` ends the threads after the tasks already submitted.
    """

    def __init__(self, name: str, stages: int = 2) -> None:
        Item = tuple[Sequence[Callable[[Any], Any]], torch.futures.Future[Any], Any]
        self._inboxes: list[queue.SimpleQueue[Item | None]] = [queue.SimpleQueue() for _ in range(stages)]
        self.error: BaseException | None = None
        self.threads = [
            threading.Thread(target=self._loop, args=(i,), name=f"{name}-{i}", daemon=True)
            for i in range(stages)
        ]
        for thread in self.threads:
            thread.start()

    def submit(self, future: torch.futures.Future[Any], *stages: Callable[[Any], Any]) -> None:
        """Run ``stages`` (one per thread; the first is called with None) for ``future``."""
        if len(stages) != len(self._inboxes):
            raise ValueError(f"this worker runs {len(self._inboxes)} stages per task, got {len(stages)}")
        self._inboxes[0].put((stages, future, None))

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """End the threads after the tasks already submitted, waiting up to ``wait`` seconds for
        them.  The wait matters at exit (``close`` runs then, from the state's finalizer): a thread
        can still be inside a Future's ``set_result`` after the training loop saw the Future done,
        and a daemon thread stopped inside torch's C++ at interpreter shutdown aborts the process
        ("terminate called without an active exception": one run in three or ten, two gloo ranks,
        when the script ended without a barrier)."""
        self._inboxes[0].put(None)
        deadline = time.monotonic() + wait
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _loop(self, stage: int) -> None:
        inbox = self._inboxes[stage]
        outbox = self._inboxes[stage + 1] if stage + 1 < len(self._inboxes) else None
        while True:
            item = inbox.get()
            if item is None:
                if outbox is not None:
                    outbox.put(None)
                return
            stages, future, handed = item
            del item  # hold no bucket between tasks
            if self.error is None:
                try:
                    handed = stages[stage](handed)
                except Exception as e:
                    self.error = e
            if self.error is not None:
                if not future.done():
                    future.set_exception(self.error)
            elif outbox is not None:
                outbox.put((stages, future, handed))
            del stages, future, handed


def dedicated_group(process_group: Any, timeout: float, backend: str | None = None) -> Any:
    """A new group with the ranks and backend (or ``backend``) of ``process_group`` (None: the
    world), for one user alone; every rank of ``process_group`` must call this, in the same order."""
    ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
    return dist.new_group(
        ranks,
        timeout=timedelta(seconds=timeout),
        backend=backend or dist.get_backend(process_group),
        use_local_synchronization=process_group is not None,
    )


def named_globally(error: RankError, group: Any, others: Sequence[int] = ()) -> RankError:
    """``error`` with its rank and peer (and the ranks ``others`` it names) named by their global
    ranks too, where ``group``'s ranks (None: the world's) are not the world's (HSDP's replicate
    group, a DDP subgroup): the runtime numbers a group's ranks from 0, as its schedule does, but a
    user reads global ranks in the launcher's logs.  The error's fields stay the group's."""
    if group is None:
        return error
    members = dist.get_process_group_ranks(group)
    ranks = (error.rank, error.peer, *others)
    named = [r for r in dict.fromkeys(ranks) if r is not None and 0 <= r < len(members)]
    if all(members[r] == r for r in named):
        return error
    said = ", ".join(f"rank {r} is global rank {members[r]}" for r in named)
    return RankError(f"{error} (ranks of the hook's group: {said})", **error.fields())


@contextmanager
def global_ranks(group: Any) -> Iterator[None]:
    """A :class:`~stragglar.runtime.RankError` raised inside, :func:`named_globally` on ``group``."""
    try:
        yield
    except RankError as e:
        named = named_globally(e, group)
        if named is e:
            raise
        raise named from e
