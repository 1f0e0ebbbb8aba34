"""Reducing buckets off the caller's path: one worker thread per process group, a side stream on CUDA.

DDP calls its hook during backward, as each bucket becomes ready; its value is that the bucket's
AllReduce overlaps the rest of backward.  So the hook only hands the bucket to a
:class:`BucketWorker` and returns a Future, and the worker runs the rounds, then completes it.

* One thread per process group runs the buckets in the order they were handed in, so every rank
  issues the same operations on the group in the same order, and a bucket's messages (tagged by
  bucket) never meet another's.  Nothing else may issue on that group: the hook uses a group of
  its own (:func:`dedicated_group`), never DDP's.
* A failure is set on the bucket's Future (DDP raises it from backward), and every later bucket
  fails at once with the same error instead of waiting for peers that are gone: after a failed
  round the group's message streams are no longer in step.
* Buckets the policy gives to the engine's all_reduce do not come here: the hook issues them on
  DDP's own group, asynchronously, as DDP's default hook does (the engine runs them on its own
  threads or streams; a Python thread in between only adds latency).
* On CUDA (:class:`StreamOrder`) the bucket's rounds run on one side stream, after an event the
  caller recorded on its own stream when the gradients were ready.  No round waits on the host
  (:func:`~stragglar.runtime.allreduce` with ``stream_ordered``), and the Future is a CUDA Future
  completed with the side stream current: DDP's stream waits for it only when it reads the result.
  On CPU (:class:`HostOrder`) the rounds simply block the worker thread.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from stragglar.ddp.policy import STRAGGLAR
from stragglar.ddp.probe import Stopwatch
from stragglar.runtime import allreduce
from stragglar.verify import Proof

__all__ = [
    "BucketWorker",
    "EventWatch",
    "HostOrder",
    "HostWatch",
    "Job",
    "Order",
    "Reducer",
    "StreamOrder",
    "Watch",
    "dedicated_group",
]


class Watch(Stopwatch, Protocol):
    """A stopwatch started when made; :meth:`stop` marks the end (on the host, or on the current
    stream).  Made with ``after`` (the watch of the operation queued before it on the same
    queue), it counts from the later of its start and that one's end: the time the operation
    itself took, not the time it waited in the queue."""

    def stop(self) -> None: ...


class Order(Protocol):
    """How a bucket's work is ordered after the gradients that fill it, and how it is timed."""

    stream_ordered: bool

    def ready(self) -> Any: ...

    def running(self, ready: Any) -> contextlib.AbstractContextManager[None]: ...

    def future(self) -> torch.futures.Future[torch.Tensor]: ...

    def clock(self, after: Any = None) -> Watch: ...


class HostWatch:
    """A :class:`Watch` on the host clock."""

    def __init__(self, after: HostWatch | None = None) -> None:
        self.start = time.perf_counter()
        self.end: float | None = None
        self._after = after

    def stop(self) -> None:
        self.end = time.perf_counter()
        if self._after is not None and self._after.end is not None:
            self.start = max(self.start, self._after.end)
        self._after = None  # no chain of watches

    def seconds(self) -> float | None:
        return None if self.end is None else self.end - self.start


class HostOrder:
    """CPU buffers: the gradients are ready when the hook is called; the worker blocks on each round."""

    stream_ordered = False

    def ready(self) -> None:
        return None

    def running(self, ready: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def future(self) -> torch.futures.Future[torch.Tensor]:
        return torch.futures.Future()

    def clock(self, after: Any = None) -> HostWatch:
        return HostWatch(after)


class EventWatch:
    """A :class:`Watch` of CUDA events on the current streams, read once the device has passed
    its end (never waited for: a timing not known yet is left out)."""

    def __init__(self, cuda: Any, device: torch.device, after: EventWatch | None = None) -> None:
        self.cuda, self.device = cuda, device
        self.start = cuda.Event(enable_timing=True)
        self.end = cuda.Event(enable_timing=True)
        self.start.record(cuda.current_stream(device))
        self._after = None if after is None else after.end  # an event, not the watch: no chain

    def stop(self) -> None:
        self.end.record(self.cuda.current_stream(self.device))

    def seconds(self) -> float | None:
        if not self.end.query():
            return None
        took = float(self.start.elapsed_time(self.end))
        if self._after is not None and self._after.query():
            since = float(self._after.elapsed_time(self.end))
            took = since if 0 <= since < took else took
        return took / 1e3


class StreamOrder:
    """CUDA buffers: the bucket's work runs on a side stream, after the gradients' event.

    ``cuda`` is :mod:`torch.cuda` (tests pass a fake with the same ``Stream``, ``Event``,
    ``current_stream``, ``stream`` and ``device``).
    """

    stream_ordered = True

    def __init__(self, device: torch.device, cuda: Any = None) -> None:
        self.cuda = torch.cuda if cuda is None else cuda
        self.device = device
        self.side = self.cuda.Stream(device=device)

    def ready(self) -> Any:
        """On the caller's thread: an event on its current stream, after the bucket's gradients."""
        event = self.cuda.Event()
        event.record(self.cuda.current_stream(self.device))
        return event

    @contextlib.contextmanager
    def running(self, ready: Any) -> Iterator[None]:
        """On the worker: the side stream current, waiting (on the device) for ``ready``."""
        with self.cuda.device(self.device), self.cuda.stream(self.side):
            self.side.wait_event(ready)
            yield

    def future(self) -> torch.futures.Future[torch.Tensor]:
        """A CUDA Future: completed on the side stream, it makes its reader's stream wait for it."""
        return torch.futures.Future(devices=[self.device])

    def clock(self, after: Any = None) -> EventWatch:
        return EventWatch(self.cuda, self.device, after)


@dataclass(frozen=True, slots=True)
class Job:
    """One bucket to average with a schedule: where its gradients are, whom to tell."""

    buffer: torch.Tensor
    bucket: int
    proof: Proof
    late: int | None  # the late rank (None: the schedule's straggler)
    chunks: int  # the schedule's chunk count where not the algorithm's own, else 0 (for the policy)
    order: Order
    ready: Any  # the event after the gradients (CUDA), None on CPU
    future: torch.futures.Future[torch.Tensor]


@dataclass(frozen=True)
class Reducer:
    """Averages a job's bucket over ``group`` with its schedule, then completes its Future.

    ``record`` receives how long each bucket took (algorithm, bytes, chunks, stopwatch), for the
    policy.
    """

    group: Any
    world: int
    timeout: float
    straggler_delay: float = 0.0
    record: Callable[[str, int, int, Stopwatch], None] | None = None

    def __call__(self, job: Job) -> None:
        with job.order.running(job.ready):
            watch = job.order.clock()
            allreduce(
                job.buffer,
                job.proof,
                group=self.group,
                straggler_delay=self.straggler_delay,
                timeout=self.timeout,
                tag=job.bucket * job.proof.num_rounds,
                late_rank=job.late,
                stream_ordered=job.order.stream_ordered,
            )
            watch.stop()
            if self.record is not None:
                self.record(STRAGGLAR, job.buffer.numel() * job.buffer.element_size(), job.chunks, watch)
            job.buffer.div_(self.world)
            job.future.set_result(job.buffer)


class BucketWorker:
    """A thread that runs tasks in the order submitted and fails their Futures on error.

    After one task fails, every later one fails at once with the same error.  :meth:`close` ends
    the thread after the tasks already submitted.
    """

    def __init__(self, name: str) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[[], None], torch.futures.Future[Any]] | None]
        self._tasks = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def submit(self, task: Callable[[], None], future: torch.futures.Future[Any]) -> None:
        self._tasks.put((task, future))

    def close(self) -> None:
        self._tasks.put(None)

    def _loop(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            task, future = item
            del item  # hold no bucket between tasks
            if self.error is None:
                try:
                    task()
                except Exception as e:
                    self.error = e
            if self.error is not None and not future.done():
                future.set_exception(self.error)
            del task, future


def dedicated_group(process_group: Any, timeout: float) -> Any:
    """A new group with the ranks and backend of ``process_group`` (None: the world), for the
    worker alone; every rank of ``process_group`` must call this, in the same order."""
    ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
    return dist.new_group(
        ranks,
        timeout=timedelta(seconds=timeout),
        backend=dist.get_backend(process_group),
        use_local_synchronization=process_group is not None,
    )
