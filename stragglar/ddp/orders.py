"""How a bucket's work is ordered after the gradients that fill it, and how it is timed.

On the host (:class:`HostOrder`) the gradients are ready when the hook is called and a stage's
rounds are done when it returns.  On CUDA (:class:`StreamOrder`) each stage of a bucket's work
runs on a side stream of its own, after an event recorded before it (the gradients', then the
first stage's), so no stage waits on the host for the one before; its timings are CUDA events
read once the device has passed them (:class:`EventWatch`), never waited for.  Whether a worker
thread runs the stages (the DDP hook) or the hook's caller does (FSDP's hook, or
``asynchronous=False``), the order is the same: on CUDA the caller's stream waits for the result
on the device, when it reads it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from stragglar.ddp.probe import Stopwatch

__all__ = ["EventWatch", "HostOrder", "HostWatch", "Order", "StreamOrder", "Watch"]


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

    def running(
        self, ready: Any, stage: int, buffer: torch.Tensor
    ) -> contextlib.AbstractContextManager[None]: ...

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
    """CPU buffers: the gradients are ready when the hook is called, a stage's rounds are done when
    it returns; the worker's threads block on each round."""

    stream_ordered = False

    def ready(self) -> None:
        return None

    def running(
        self, ready: Any, stage: int, buffer: torch.Tensor
    ) -> contextlib.AbstractContextManager[None]:
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
    """CUDA buffers: each stage of a bucket's work runs on a side stream of its own, after the
    event before it (the gradients', then the first stage's).

    ``cuda`` is :mod:`torch.cuda` (tests pass a fake with the same ``Stream``, ``Event``,
    ``current_stream``, ``stream`` and ``device``).
    """

    stream_ordered = True

    def __init__(self, device: torch.device, cuda: Any = None) -> None:
        self.cuda = torch.cuda if cuda is None else cuda
        self.device = device
        self.sides = (self.cuda.Stream(device=device), self.cuda.Stream(device=device))

    def ready(self) -> Any:
        """An event on the current stream: on the caller's, after the bucket's gradients; on the
        first stage's side stream, after its rounds."""
        event = self.cuda.Event()
        event.record(self.cuda.current_stream(self.device))
        return event

    @contextlib.contextmanager
    def running(self, ready: Any, stage: int, buffer: torch.Tensor) -> Iterator[None]:
        """``stage``'s side stream current, waiting (on the device) for ``ready``, its work on
        ``buffer`` kept from the allocator (:meth:`keep`)."""
        side = self.sides[stage]
        with self.cuda.device(self.device), self.cuda.stream(side):
            side.wait_event(ready)
            self.keep(buffer, side)
            yield

    def keep(self, buffer: torch.Tensor, side: Any) -> None:
        """Mark ``buffer`` in use on ``side``: freed by its owner while the work queued there has
        yet to run (FSDP frees each step's shard; its stream waits for the result, others need
        not), its memory goes to no other stream's tensor before that work has run."""
        buffer.record_stream(side)

    def future(self) -> torch.futures.Future[torch.Tensor]:
        """A CUDA Future: completed on the side stream, it makes its reader's stream wait for it."""
        return torch.futures.Future(devices=[self.device])

    def clock(self, after: Any = None) -> EventWatch:
        return EventWatch(self.cuda, self.device, after)
