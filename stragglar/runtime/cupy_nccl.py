"""CuPy + NCCL transport: one NCCL group per round on one stream.

NCCL calls take raw device pointers and element counts.  The reductions after a round are CuPy
kernels on the same stream, so they run after the round's transfers without a host wait; the host
waits once, at the end, with a deadline, and aborts the communicator when a peer never answers
(NCCL itself would wait forever).  ``nccl`` and the stream are injectable so the transport is
tested on CPU against a fake NCCL over NumPy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from stragglar.runtime.engine import Array, RankError, describe
from stragglar.runtime.program import BoundStep, Plan

__all__ = ["NcclGroup", "NcclTransport", "pointer"]


@dataclass
class NcclGroup:
    """An NCCL communicator with what runs it: ``nccl`` (default ``cupy.cuda.nccl``) and
    ``stream`` (default the current CuPy stream; needs ``ptr``, ``done`` and ``with``)."""

    comm: Any
    nccl: Any = None
    stream: Any = None

    def resolved(self) -> NcclGroup:
        if self.nccl is not None and self.stream is not None:
            return self
        import cupy
        from cupy.cuda import nccl

        return NcclGroup(self.comm, self.nccl or nccl, self.stream or cupy.cuda.get_current_stream())


def pointer(view: Array) -> int:
    """Address of a view's first element: CuPy ``data.ptr``, NumPy ``ctypes.data``."""
    ptr = getattr(view.data, "ptr", None)
    return int(ptr) if ptr is not None else int(view.ctypes.data)


class NcclTransport:
    def __init__(self, plan: Plan, group: NcclGroup, dtype: str, timeout: float | None) -> None:
        self.plan = plan
        self.group = group
        self.timeout = timeout
        name = f"NCCL_{dtype.upper()}"
        if not hasattr(group.nccl, name):
            raise TypeError(f"this NCCL build has no {dtype}")
        self.dtype = getattr(group.nccl, name)
        self.last: BoundStep | None = None

    def exchange(self, step: BoundStep, sends: list[Array], recvs: list[Array]) -> None:
        nccl, comm, stream = self.group.nccl, self.group.comm, self.group.stream.ptr
        nccl.groupStart()
        try:
            for m, view in zip(step.recvs, recvs, strict=True):
                comm.recv(pointer(view), m.size, self.dtype, m.peer, stream)
            for m, view in zip(step.sends, sends, strict=True):
                comm.send(pointer(view), m.size, self.dtype, m.peer, stream)
        finally:
            nccl.groupEnd()
        self.last = step

    def finish(self) -> None:
        """Wait for the stream; on timeout abort the communicator so no rank hangs."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while not self.group.stream.done:
            self.group.comm.check_async_error()
            if deadline is not None and time.monotonic() > deadline:
                self.group.comm.abort()
                where = describe(self.plan, self.last) if self.last else f"rank {self.plan.rank}"
                raise RankError(f"allreduce timed out after {self.timeout} s; last round issued: {where}")
            time.sleep(1e-4)
