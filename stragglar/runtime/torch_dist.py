"""torch.distributed point-to-point transport (gloo on CPU, NCCL on GPU).

Gloo: every irecv of the round is posted before any isend, with the round as tag, then all are
waited with a timeout (``batch_isend_irecv`` is a plain loop on gloo and can hang).  NCCL: one
``batch_isend_irecv`` per round, which NCCL runs as one group; it ignores tags and matches in issue
order, which is the same on both ends.  A failure names the peer whose receive or send did not
complete (:class:`~stragglar.runtime.failures.RankError`).

Waiting with a timeout blocks the host: on NCCL too, where ``wait(timeout)`` polls until the work
is done.  A caller that must not block (a DDP hook issuing rounds on a side stream) asks for
``stream_ordered``: on NCCL each round's works are then waited without a timeout, which only makes
the current CUDA stream wait for them, so the host issues every round at once and the reductions
after a round queue behind it on the stream.  A dead peer is then caught by the process group's
own timeout (NCCL's watchdog), not by ``timeout``.  Stream-ordered rounds on CUDA tensors replay
from CUDA graphs after their first call (:class:`CudaGraphs`, :mod:`~stragglar.runtime.graphs`):
a graph writes the buffer it was captured on, so its key names the buffer's address, size and
dtype, the plan and its round range, the group, the tag and the late rank.

:class:`TorchEngine` is what :func:`~stragglar.runtime.allreduce` runs a torch tensor's call on
(:class:`~stragglar.runtime.engines.Engine`): the group, the header gather, the transport, the
graphs and the NCCL version check above.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stragglar.errors import ArgumentError, InputError, described
from stragglar.runtime.arrays import Array
from stragglar.runtime.channels import HEADER_TAG, ROUNDS_PER_TAG
from stragglar.runtime.clock import poll
from stragglar.runtime.failures import CHECKING, checking_error, classify, first_line, step_error
from stragglar.runtime.graphs import nccl_uncapturable
from stragglar.runtime.interpreter import SLICE_PACKING, Packing
from stragglar.runtime.program import BoundStep, Plan
from stragglar.runtime.roll_call import MARK, RollCall, of_headers, with_absent
from stragglar.runtime.teardown import install

__all__ = [
    "CudaGraphs",
    "TorchEngine",
    "TorchTransport",
    "check_group",
    "gather_headers",
    "torch_uncapturable",
]


def check_group(group: Any, label: str, world: bool = True) -> None:
    """Refuse ``group`` (named ``label``) unless it is a torch process group (or None, the
    world, where ``world``).  ``torch.distributed.new_group`` hands the ranks it leaves out an
    int, ``GroupMember.NON_GROUP_MEMBER``: that is said as such, not as a wrong type."""
    if isinstance(group, dist.ProcessGroup) or (world and group is None):
        return
    if type(group) is int and group == dist.GroupMember.NON_GROUP_MEMBER:
        rank = f"rank {dist.get_rank()}" if dist.is_initialized() else "this rank"
        raise InputError(
            f"{label} is GroupMember.NON_GROUP_MEMBER: {rank} is not in that group (new_group gives "
            "that to the ranks it leaves out); only the group's ranks may use it"
        )
    kind = "a torch process group or None (the world)" if world else "a torch process group this rank is in"
    raise ArgumentError(f"{label} must be {kind}, got {described(group)} ({type(group).__name__})")


class TorchTransport:
    """Moves a rank's rounds over ``group`` (None: the default group); ``stream_ordered``: see above
    (NCCL only: gloo has no streams, and ``allreduce`` refuses it there)."""

    def __init__(self, plan: Plan, group: Any, timeout: float | None, stream_ordered: bool = False) -> None:
        self.plan = plan
        self.group = group
        self.nccl = dist.get_backend(group) == "nccl"
        host_wait = not (self.nccl and stream_ordered)
        self.timeout = timedelta(seconds=timeout) if timeout is not None and host_wait else None
        self.ranks = [
            dist.get_global_rank(group, r) if group is not None else r for r in range(plan.program.num_ranks)
        ]

    def exchange(self, step: BoundStep, sends: list[torch.Tensor], recvs: list[torch.Tensor]) -> None:
        # works come back in the order posted: this step's receives, then its sends
        blame: list[tuple[int | None, str]] = [(m.peer, "waiting for") for m in step.recvs]
        blame += [(m.peer, "sending to") for m in step.sends]
        if self.nccl:  # one NCCL group: no single peer to blame
            blame = [(None, "waiting for")] * len(blame)
        peer: int | None = None
        waiting = "waiting for"
        posted: list[Any] = []  # gloo's works as they are posted: a post that fails names its peer
        try:
            works = self._post(step, sends, recvs, posted)
            for i, work in enumerate(works):
                peer, waiting = blame[i] if i < len(blame) else (None, "waiting for")
                ok = work.wait(self.timeout) if self.timeout is not None else work.wait()
                if ok is False:
                    raise TimeoutError("no answer within the timeout")
        except Exception as e:  # the engines raise RuntimeError, DistBackendError or TimeoutError
            if peer is None and not self.nccl and len(posted) < len(blame):  # a post failed
                peer, waiting = blame[len(posted)]  # (a dead peer's socket: gloo says "closed by peer")
            raise step_error(self.plan, step, e, peer, waiting) from e

    def _post(
        self, step: BoundStep, sends: list[torch.Tensor], recvs: list[torch.Tensor], posted: list[Any]
    ) -> list[Any]:
        """The step's works, receives first; on gloo each is appended to ``posted`` as it is posted."""
        g, ranks = self.group, self.ranks
        if self.nccl:
            ops = [
                dist.P2POp(dist.irecv, t, ranks[m.peer], g, m.tag)
                for m, t in zip(step.recvs, recvs, strict=True)
            ]
            ops += [
                dist.P2POp(dist.isend, t, ranks[m.peer], g, m.tag)
                for m, t in zip(step.sends, sends, strict=True)
            ]
            return list(dist.batch_isend_irecv(ops))
        for m, t in zip(step.recvs, recvs, strict=True):
            posted.append(dist.irecv(t, ranks[m.peer], g, m.tag))
        for m, t in zip(step.sends, sends, strict=True):
            posted.append(dist.isend(t, ranks[m.peer], g, m.tag))
        return posted

    def finish(self) -> None:
        """Nothing queued: every round was waited for."""


class CudaGraphs:
    """Captures with torch's CUDA graphs (on a capture stream of torch's own, after a device
    synchronize); a graph replays on the current stream, after the work queued on it.  The capture
    forbids unsafe CUDA calls in the capturing thread only: the DDP hook's other worker thread
    goes on with its own rounds meanwhile, which the default mode would make fail."""

    def capture(self, work: Callable[[], object]) -> Any:
        install()  # a graph of NCCL rounds must go before its group does (see teardown)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            work()
        return graph

    def replay(self, graph: Any) -> None:
        graph.replay()

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def torch_uncapturable() -> str | None:
    """Why torch's NCCL cannot be captured in a CUDA graph, or None
    (:func:`~stragglar.runtime.graphs.nccl_uncapturable`).  torch says its NCCL's version as
    (major, minor, patch), and a suffix after them where the version has one."""
    version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    major, minor, patch = (int(part) for part in version[:3])
    return nccl_uncapturable((major, minor, patch))


def gather_headers(
    header: Sequence[int],
    group: Any,
    device: Any,
    rank: int,
    timeout: float | None,
    channel: int | None = None,
    during: str = CHECKING,
) -> list[tuple[int, ...]]:
    """Every rank's ``header``, in rank order, bounded by ``timeout`` (a failure says it happened
    ``during`` that check): one all_gather on ``group``,
    or, on a ``channel`` (gloo, whose messages carry tags), a message to and from every peer with
    the channel's header tag, so that calls on other channels of the group, running beside it in
    other threads, never pair with it (an all_gather is matched by its order on the group, and
    two threads issue theirs in either order).

    NCCL's ``wait`` only orders streams, so there the host polls the work until the deadline.
    A message names the peer that did not answer; an all_gather cannot, so the ranks that had not
    reached one that failed are found by the group's roll call in the store
    (:func:`~stragglar.runtime.roll_call.of_headers`), which every rank numbers its gathers for.
    """
    size = dist.get_world_size(group)
    on = device if channel is None else "cpu"  # gloo's messages (unlike its collectives) are the host's
    mine = torch.tensor(list(header), dtype=torch.int64, device=on)
    gathered = [torch.empty_like(mine) for _ in range(size)]
    deadline = None if timeout is None else time.monotonic() + timeout
    works: list[tuple[int | None, Any]] = []  # (the peer whose header it receives, or None; work)
    at = 0  # the work waited on
    roll = of_headers(group) if channel is None else None
    call = roll.begin() if roll is not None else 0
    marker = _marker(roll, call)
    try:
        if channel is None:
            works = [(None, dist.all_gather(gathered, mine, group=group, async_op=True))]
        else:
            gathered[rank] = mine
            wire = channel * ROUNDS_PER_TAG + HEADER_TAG
            ranks = dist.get_process_group_ranks(group) if group is not None else list(range(size))
            peers = [r for r in range(size) if r != rank]
            works = [(r, dist.irecv(gathered[r], ranks[r], group, wire)) for r in peers]
            works += [(None, dist.isend(mine, ranks[r], group, wire)) for r in peers]
        nccl = dist.get_backend(group) == "nccl"
        for index, (_, work) in enumerate(works):
            at = index
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if nccl:
                if not poll(work.is_completed, left):
                    raise TimeoutError(f"no answer within {timeout:g} s")
                work.wait()
            elif left is not None:
                if work.wait(timedelta(seconds=left)) is False:
                    raise TimeoutError(f"no answer within {timeout:g} s")
            else:
                work.wait()
    except Exception as e:
        reason, silent = classify(e), _silent(works, at)
        # another peer's failure may end the wait first (gloo closes a pair that timed out): the
        # rank waited for is named all the same
        peer = silent[0] if silent else None
        if reason == "timed out" and (silent or channel is None):
            others = f" from ranks {', '.join(map(str, silent))}" if len(silent) > 1 else ""
            # timeout None: gloo's own timeout, the process group's, ended the wait
            bound = "the process group's timeout" if timeout is None else f"{timeout:g} s"
            detail = f"no answer{others} within {bound}"
        else:
            detail = first_line(e)
        if roll is not None and reason == "failed":  # of its own: in the call, not to be named
            roll.mark(call)
        elif roll is not None:
            absent = roll.absent(call, MARK if timeout is None else timeout) or []
            if absent:
                detail, peer = with_absent(detail, absent, reason == "timed out")
        raise checking_error(rank, reason, detail, peer, during) from e
    finally:
        if marker is not None:
            marker.cancel()
    if roll is not None:
        roll.completed(call)
    return [tuple(int(x) for x in t.tolist()) for t in gathered]


def _marker(roll: RollCall | None, call: int) -> threading.Timer | None:
    """The note, :data:`~stragglar.runtime.roll_call.MARK` seconds into a gather, that this rank
    reached ``call`` (cancelled once the gather ends; a gather that completes sooner, the happy
    path, notes nothing)."""
    if roll is None:
        return None
    marker = threading.Timer(MARK, roll.mark, (call,))
    marker.daemon = True  # never holds the interpreter's exit
    marker.start()
    return marker


def _silent(works: list[tuple[int | None, Any]], at: int) -> list[int]:
    """The peers whose header had not come when the wait on ``works[at]`` ended: its own peer
    (gloo marks a timed-out work completed) and every later one not completed yet."""
    peer = works[at][0] if at < len(works) else None
    if peer is None:
        return []
    return [peer, *(r for r, work in works[at + 1 :] if r is not None and not work.is_completed())]


_NO_STREAM = contextlib.nullcontext()  # torch's calls run on the current stream: nothing to enter


class TorchEngine:
    """A call on a torch process group (``group``; None: the world), made only once the group and
    the options fit: ``graphs`` is for stream-ordered rounds, ``stream_ordered`` for an NCCL group.
    Stream-ordered rounds on a CUDA tensor replay from a CUDA graph (:meth:`buffer`); every
    tensor's messages pack and land as the interpreter packs them."""

    capturing = CudaGraphs
    stream = _NO_STREAM

    def __init__(self, group: Any, stream_ordered: bool, graphs: bool | None) -> None:
        if graphs is not None and not stream_ordered:
            raise InputError(
                "graphs applies to stream-ordered rounds (stream_ordered=True on an NCCL group) "
                "and to CuPy arrays on an NcclGroup"
            )
        check_group(group, "group")
        if not dist.is_initialized():
            raise InputError(
                "allreduce needs a process group: call torch.distributed.init_process_group first "
                "(allreduce_local runs every rank in this process)"
            )
        if stream_ordered and dist.get_backend(group) != "nccl":
            raise InputError(
                f"stream_ordered applies to an NCCL process group, not {dist.get_backend(group)}: "
                "its waits are on the host"
            )
        self.group = group
        self.stream_ordered = stream_ordered
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.owner = group if group is not None else dist.group.WORLD

    def channel(self, tag: int) -> int | None:
        return None if dist.get_backend(self.group) == "nccl" else tag  # NCCL ignores tags

    def sendable(self, flat: Array) -> None:
        """Every dtype of :data:`~stragglar.runtime.arrays.DTYPES` travels on gloo and NCCL; a CPU
        tensor does not travel on NCCL (its gather or its first round would fail on this rank
        alone, its peers waiting until their timeout: as a header's problem, they learn of it in
        the header check)."""
        if self.channel(0) is None and not flat.is_cuda:
            raise ArgumentError(
                "a CPU tensor on an NCCL process group: NCCL sends CUDA tensors (move it to the rank's "
                "GPU, or use a gloo group)"
            )

    def gather(
        self, header: Sequence[int], like: Array, timeout: float | None, channel: int | None
    ) -> list[tuple[int, ...]]:
        device = like.device if isinstance(like, torch.Tensor) else torch.device("cpu")
        if channel is None and device.type != "cuda":
            # NCCL gathers on a GPU: a rank whose buffer is not on one (a meta or CPU tensor, data
            # that is no tensor: refused after this gather) gathers on the group's GPU (the one
            # init_process_group's device_id bound it to), else on its current one
            bound = getattr(self.owner, "bound_device_id", None)
            device = bound if bound is not None else torch.device("cuda", torch.cuda.current_device())
        return gather_headers(header, self.group, device, self.rank, timeout, channel)

    def transport(self, plan: Plan, flat: Array, timeout: float | None) -> TorchTransport:
        return TorchTransport(plan, self.group, timeout, self.stream_ordered)

    def buffer(self, flat: Array, plan: Plan) -> Hashable | None:
        if not (self.stream_ordered and flat.is_cuda):
            return None
        return (flat.data_ptr(), plan.layout.count, str(flat.dtype), str(flat.device))

    def packing(self, plan: Plan, flat: Array, tables: Hashable) -> Packing:
        return SLICE_PACKING

    def uncapturable(self) -> str | None:
        return torch_uncapturable()
