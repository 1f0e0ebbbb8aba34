"""CuPy + NCCL transport: one NCCL group per round on one stream.

NCCL calls take raw device pointers and element counts.  The reductions after a round are CuPy
kernels on the same stream, so they run after the round's transfers without a host wait; the host
waits once, at the end, with a deadline, and aborts the communicator when a peer never answers
(NCCL itself would wait forever).  ``nccl`` and the stream are injectable so the transport is
tested on CPU against a fake NCCL over NumPy.

A message of several chunks (a chunked schedule's early rounds send up to C/(N-1) of them to one
peer) is packed with one gather kernel and landed with one landing kernel
(:class:`FusedPacking`, :mod:`~stragglar.runtime.kernels`), not a copy and an add per chunk.

The rounds of a CuPy array replay from a CUDA graph after their first call (:class:`CupyGraphs`,
:mod:`~stragglar.runtime.graphs`; NCCL 2.9.6 and later can be captured, an older one never is:
:func:`uncapturable`).  A capture needs
a stream other than CUDA's legacy default one, so a group given no stream runs on a stream of its
own (one per thread and device), after the work queued on the caller's current stream.

:class:`NcclEngine` is what :func:`~stragglar.runtime.allreduce` runs a call on an
:class:`NcclGroup` on (:class:`~stragglar.runtime.engines.Engine`): the group's stream, the
header gather, the transport, the graphs, the packing and the NCCL version check above.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stragglar.errors import InputError
from stragglar.runtime.arrays import Array, data_address, dtype_name, library_of
from stragglar.runtime.clock import poll
from stragglar.runtime.failures import RankError, checking_error, first_line, step_error
from stragglar.runtime.graphs import nccl_uncapturable
from stragglar.runtime.interpreter import Packing, Transport, apply, send_view
from stragglar.runtime.kernels import Rows, kernels, launch, upload, words
from stragglar.runtime.plans import cached
from stragglar.runtime.program import BoundMessage, BoundStep, Plan

__all__ = [
    "CupyGraphs",
    "FusedPacking",
    "NcclEngine",
    "NcclGroup",
    "NcclTransport",
    "fused_packing",
    "gather_headers",
    "nccl_dtype",
    "uncapturable",
]


# The calls the transport makes on a communicator: what NcclGroup checks its comm has.
_COMMUNICATOR = ("rank_id", "size", "send", "recv", "allGather", "check_async_error", "abort")


@dataclass
class NcclGroup:
    """An NCCL communicator with what runs it: ``nccl`` (default ``cupy.cuda.nccl``) and
    ``stream`` (needs ``ptr``, ``done`` and ``with``; the work queued on it comes first).  Without
    a stream the rounds run on one of this thread's own, after the work queued on the caller's
    current CuPy stream: a CUDA graph cannot capture CUDA's legacy default stream."""

    comm: Any
    nccl: Any = None
    stream: Any = None

    def __post_init__(self) -> None:
        # A wrong comm (a torch group, None) would otherwise fail deep in the first call, with
        # Python's own AttributeError; what the transport calls on it is what is checked.
        lacking = [name for name in _COMMUNICATOR if not callable(getattr(self.comm, name, None))]
        if lacking:
            raise InputError(
                f"NcclGroup needs an NCCL communicator (cupy.cuda.nccl.NcclCommunicator), got "
                f"{type(self.comm).__name__}, which has no {', '.join(lacking)}"
            )

    def resolved(self) -> NcclGroup:
        if self.nccl is not None and self.stream is not None:
            return self
        import cupy
        from cupy.cuda import nccl

        stream = self.stream
        if stream is None:
            stream = _own_stream(cupy)
            stream.wait_event(cupy.cuda.get_current_stream().record())
        return NcclGroup(self.comm, self.nccl or nccl, stream)


_streams = threading.local()


def _own_stream(cupy: Any) -> Any:
    """This thread's stream on the current device (a thread's calls run one at a time, and two
    threads' calls must not queue behind each other on one stream: NCCL would deadlock them)."""
    streams: dict[int, Any] = _streams.__dict__.setdefault("by_device", {})
    device = int(cupy.cuda.Device().id)
    if device not in streams:
        streams[device] = cupy.cuda.Stream(non_blocking=True)
    return streams[device]


@dataclass(frozen=True)
class Captured:
    """A graph, the device memory its kernels were captured on, and the work captured (which
    holds what else the graph reads when it runs: a :class:`FusedPacking`'s tables)."""

    graph: Any
    memory: tuple[Any, ...]
    work: Callable[[], object]


class CupyGraphs:
    """Captures with CuPy's stream capture on the current stream (the group's) and replays there.

    A graph bakes in the addresses of the scratch its rounds were captured with, and CuPy's pool
    would hand that scratch, freed after the capture, to other arrays that every replay would
    then overwrite.  So every allocation made while capturing is kept with its graph, and freed
    only with it (when the replayer drops the graph); so is the work, and with it the device
    tables made before the capture that the graph's kernels read."""

    def capture(self, work: Callable[[], object]) -> Captured:
        import cupy

        stream = cupy.cuda.get_current_stream()
        allocate = cupy.cuda.get_allocator()
        memory: list[Any] = []

        def kept(size: int) -> Any:
            block = allocate(size)
            memory.append(block)
            return block

        with cupy.cuda.using_allocator(kept):
            stream.begin_capture()
            try:
                work()
            finally:
                graph = stream.end_capture()
        return Captured(graph, tuple(memory), work)

    def replay(self, graph: Captured) -> None:
        import cupy

        graph.graph.launch(stream=cupy.cuda.get_current_stream())

    def synchronize(self) -> None:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()


def _fused_rows(m: BoundMessage) -> np.ndarray | None:
    """The row table ``(0, start, length, slot)`` of a message of several pieces that one kernel
    packs and one lands, else None: a message of one piece is one copy or one add already, and one
    whose pieces both copy and add (none in our schedules) lands piece by piece."""
    if m.direct is not None or len(m.pieces) < 2 or len({reduce for *_, reduce in m.pieces}) > 1:
        return None
    rows, slot = [], 0
    for start, stop, _ in m.pieces:
        if stop > start:
            rows.append((0, start, stop - start, slot))
            slot += stop - start
    return np.array(rows, dtype=np.int64).reshape(len(rows), 4)


class FusedPacking:
    """Packs and lands each message of several pieces of one CuPy buffer with one kernel (the
    others as the interpreter does).  The device tables, the buffer's address and each such
    message's rows, are made when the packing is, before any rounds run or are captured: an
    upload inside a capture would be replayed from host memory long since reused."""

    def __init__(self, cupy: Any, plan: Plan, flat: Array) -> None:
        tables = {m.pieces: _fused_rows(m) for step in plan.steps for m in (*step.sends, *step.recvs)}
        self.rows: dict[tuple[tuple[int, int, bool], ...], Rows] = {
            pieces: upload(cupy, rows) for pieces, rows in tables.items() if rows is not None
        }
        if self.rows:  # else nothing to compile: a schedule of one chunk per message
            self.kernels = kernels(cupy, dtype_name(flat))
            self.pointers = cupy.asarray(np.array([data_address(flat)], dtype=np.uint64))

    def _rows_for(self, m: BoundMessage) -> Rows | None:
        """The rows one kernel packs or lands ``m`` with (None: the interpreter's slices do).  A
        direct message is sent from the buffer as it is, even where a message staged elsewhere
        in the plan has the same pieces."""
        return self.rows.get(m.pieces) if m.direct is None else None

    def pack(self, flat: Array, work: Array, m: BoundMessage) -> Array:
        rows = self._rows_for(m)
        if rows is None:
            return send_view(flat, work, m)
        packed = work[m.staging : m.staging + m.size]
        launch(self.kernels.gather, self.pointers, rows, words(packed))
        return packed

    def land(self, flat: Array, work: Array, m: BoundMessage) -> None:
        rows = self._rows_for(m)
        if rows is None:
            apply(flat, work, m)
            return
        reduced = np.int64(m.size if m.pieces[0][2] else 0)  # every piece adds, or none does
        launch(self.kernels.land, self.pointers, rows, reduced, words(work[m.staging : m.staging + m.size]))


_packings: OrderedDict[Hashable, Packing] = OrderedDict()
PACKINGS = 64  # each holds a few small device tables


def fused_packing(plan: Plan, flat: Array, key: Hashable) -> Packing:
    """The packing of ``plan`` on CuPy ``flat``, cached by ``key`` (what the tables depend on: the
    plan's schedule, rank, count and tags, and the buffer's address, dtype and device)."""
    import cupy

    return cached(_packings, key, lambda: FusedPacking(cupy, plan, flat), PACKINGS)


def uncapturable(group: NcclGroup) -> str | None:
    """Why ``group``'s NCCL cannot be captured in a CUDA graph, or None
    (:func:`~stragglar.runtime.graphs.nccl_uncapturable`)."""
    code = int(group.nccl.get_version())
    if code >= 10000:  # major * 10000 + minor * 100 + patch since 2.9
        return nccl_uncapturable((code // 10000, code // 100 % 100, code % 100))
    return nccl_uncapturable((code // 1000, code // 100 % 10, code % 100))  # before 2.9


def nccl_dtype(group: NcclGroup, dtype: str) -> Any:
    """NCCL's code for ``dtype``; TypeError when this NCCL build has none."""
    name = f"NCCL_{dtype.upper()}"
    if not hasattr(group.nccl, name):
        raise TypeError(f"this NCCL build has no {dtype}")
    return getattr(group.nccl, name)


def wait_stream(group: NcclGroup, timeout: float | None, on_timeout: Callable[[], RankError]) -> None:
    """Wait for the group's stream; past ``timeout`` abort the communicator (so no rank hangs on
    it) and raise ``on_timeout()``."""

    def done() -> bool:
        if group.stream.done:
            return True
        group.comm.check_async_error()  # a failed peer: NCCL's error, not a timeout
        return False

    if not poll(done, timeout):
        group.comm.abort()
        raise on_timeout()


class NcclTransport:
    def __init__(self, plan: Plan, group: NcclGroup, dtype: str, timeout: float | None) -> None:
        self.plan = plan
        self.group = group
        self.timeout = timeout
        self.dtype = nccl_dtype(group, dtype)
        self.last: BoundStep | None = None

    def exchange(self, step: BoundStep, sends: list[Array], recvs: list[Array]) -> None:
        nccl, comm, stream = self.group.nccl, self.group.comm, self.group.stream.ptr
        nccl.groupStart()
        try:
            for m, view in zip(step.recvs, recvs, strict=True):
                comm.recv(data_address(view), m.size, self.dtype, m.peer, stream)
            for m, view in zip(step.sends, sends, strict=True):
                comm.send(data_address(view), m.size, self.dtype, m.peer, stream)
        finally:
            nccl.groupEnd()
        self.last = step

    def finish(self) -> None:
        """Wait for the stream; on timeout abort the communicator so no rank hangs."""
        wait_stream(self.group, self.timeout, self._timed_out)

    def _timed_out(self) -> RankError:
        error = TimeoutError(f"no answer within {self.timeout:g} s; the last round issued did not complete")
        if self.last is not None:
            return step_error(self.plan, self.last, error)
        return RankError(
            f"allreduce failed: rank {self.plan.rank} timed out", rank=self.plan.rank, reason="timed out"
        )


def gather_headers(
    group: NcclGroup, like: Array, header: Sequence[int], timeout: float | None
) -> list[tuple[int, ...]]:
    """Every rank's ``header`` in rank order: one NCCL allGather on the group's stream, in device
    memory like ``like`` (a NumPy or CuPy array), bounded by ``timeout``."""
    rank, size, width = group.comm.rank_id(), group.comm.size(), len(header)
    host = np.asarray(header, dtype=np.int64)
    send = _device_like(like, host)
    recv = _device_like(like, np.zeros(size * width, np.int64))

    def timed_out() -> RankError:
        return checking_error(rank, "timed out", f"no answer within {timeout:g} s")

    try:
        group.comm.allGather(
            data_address(send), data_address(recv), width, nccl_dtype(group, "int64"), group.stream.ptr
        )
    except Exception as e:
        raise checking_error(rank, "failed", first_line(e)) from e
    wait_stream(group, timeout, timed_out)
    values = recv if isinstance(recv, np.ndarray) else recv.get()
    return [tuple(int(x) for x in values[r * width : (r + 1) * width]) for r in range(size)]


def _device_like(like: Array, host: np.ndarray) -> Array:
    """``host`` copied into memory of ``like``'s kind: NumPy stays NumPy, anything else is CuPy."""
    if isinstance(like, np.ndarray):
        return host.copy()
    import cupy

    return cupy.asarray(host)


class NcclEngine:
    """A call on an :class:`NcclGroup`, made only once the options fit: ``stream_ordered`` is for
    torch tensors (these rounds run on the group's stream anyway), ``graphs`` for CuPy arrays.
    The rounds of a CuPy array pack with :class:`FusedPacking` and replay from a CUDA graph
    (:meth:`buffer`); a NumPy array's (the fake NCCL's) run as the interpreter runs them."""

    capturing = CupyGraphs

    def __init__(self, data: Array, group: NcclGroup, stream_ordered: bool, graphs: bool | None) -> None:
        if stream_ordered:
            raise InputError(
                "stream_ordered applies to torch tensors on an NCCL process group: an NcclGroup's "
                "rounds already run on its stream"
            )
        self.on_gpu = library_of(data) == "cupy"
        if graphs is not None and not self.on_gpu:
            raise InputError("graphs applies to CuPy arrays on an NcclGroup: these rounds have no CUDA graph")
        self.group = group.resolved()
        self.stream = self.group.stream
        self.owner = self.group.comm
        self.rank, self.size = self.owner.rank_id(), self.owner.size()

    def channel(self, tag: int) -> int | None:
        return None  # NCCL matches messages by order: the whole group is one channel

    def sendable(self, flat: Array) -> None:
        nccl_dtype(self.group, dtype_name(flat))

    def gather(
        self, header: Sequence[int], like: Array, timeout: float | None, channel: int | None
    ) -> list[tuple[int, ...]]:
        return gather_headers(self.group, like, header, timeout)  # one channel: the whole group

    def transport(self, plan: Plan, flat: Array, timeout: float | None) -> Transport:
        return NcclTransport(plan, self.group, dtype_name(flat), timeout)

    def buffer(self, flat: Array, plan: Plan) -> Hashable | None:
        if not self.on_gpu:
            return None
        return (data_address(flat), plan.layout.count, dtype_name(flat), int(flat.device.id))

    def packing(self, plan: Plan, flat: Array, tables: Hashable) -> Packing:
        return fused_packing(plan, flat, tables)

    def uncapturable(self) -> str | None:
        return uncapturable(self.group)
