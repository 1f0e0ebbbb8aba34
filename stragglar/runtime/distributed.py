"""The AllReduce across processes: one rank's part, on torch.distributed or CuPy/NCCL.

Each rank runs its own plan of the schedule; the ranks meet only through the transport.  So before
a call's rounds every rank can check that all ranks run the same AllReduce
(:mod:`stragglar.runtime.header`: the same schedule, dtype, element count, tag, late rank and
rounds), and all raise the same :class:`~stragglar.runtime.header.MismatchError` instead of summing
wrong.  Which calls check, and which may run at once, is the channels' rule
(:mod:`stragglar.runtime.channels`): a check needs the late rank too, so it runs only where the
ranks could otherwise disagree unseen.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stragglar.args import MAX_DELAY, as_flag, as_int, as_seconds
from stragglar.errors import ArgumentError, InputError, described
from stragglar.runtime.channels import ROUNDS_PER_TAG, Channels, as_tag
from stragglar.runtime.cupy_nccl import NcclGroup
from stragglar.runtime.engine import (
    Timeline,
    check_summable,
    dtype_name,
    flat_view,
    in_place_refusal,
    late_rank_for,
    library_of,
    run_rank,
    run_rank_replayed,
)
from stragglar.runtime.graphs import release, shared
from stragglar.runtime.header import Header, MismatchError, make_header, mismatch
from stragglar.runtime.plans import plan_for
from stragglar.verify import Proof, require_proof

__all__ = ["allreduce", "release_graphs"]

_channels = Channels()


def allreduce(
    data: Any,
    proof: Proof,
    group: Any = None,
    straggler_delay: float = 0.0,
    *,
    timeout: float | None = 300.0,
    tag: int = 0,
    late_rank: int | None = None,
    stream_ordered: bool = False,
    rounds: tuple[int, int | None] | None = None,
    lockstep: bool = False,
    graphs: bool | None = None,
) -> Timeline:
    """Sum this rank's ``data`` over the ranks in place, following the proved schedule.

    ``data`` is a torch tensor (``group``: a torch process group, default the world) or a
    NumPy/CuPy array with an :class:`NcclGroup`.  The late rank (``late_rank``, default the
    schedule's straggler, else the last rank) sleeps ``straggler_delay`` seconds (at most an hour)
    first; the others start the rounds without it at once.  Returns this rank's timeline.

    ``tag`` (0 to :data:`~stragglar.runtime.channels.MAX_TAG`) is the call's channel: concurrent
    calls on one group need distinct tags (on NCCL, which matches messages by order, they need
    distinct groups), and a call whose tag is in use by another call of this process is refused
    before any data moves (the call that holds it fails as it ends: the ranks may have raced the
    other way).  A call all-gathers a small header, and every rank raises the same
    :class:`MismatchError` if the ranks disagree on the schedule, dtype, element count, tag, late
    rank or rounds (instead of computing a wrong sum), on its channel's first call and whenever the
    channel's setup changes (:mod:`stragglar.runtime.channels`); a channel that repeats one setup
    checks once.  ``lockstep=True`` is for callers that guarantee every rank makes the same calls on
    the group in the same order (the DDP hook): a setup is then checked once per group however
    setups alternate.  Raises :class:`~stragglar.runtime.RankError` when a peer dies or does not
    answer within ``timeout`` seconds (at most a day; ``timeout`` plus ``straggler_delay`` for a wait that may
    include the late rank's delay), and :class:`~stragglar.runtime.ArgumentError` (a TypeError) or
    ``InputError`` for bad arguments.

    ``stream_ordered`` (torch tensors on an NCCL group): wait for each round on the current CUDA
    stream instead of the host, so the call returns once every round is queued; ``timeout`` then
    bounds only the header check, and the process group's own timeout catches a dead peer
    (:mod:`stragglar.runtime.torch_dist`).

    Stream-ordered rounds on CUDA tensors, and the rounds of a CuPy array on an NcclGroup, replay
    from a CUDA graph after their first call, keyed by the buffer's address, size and dtype, the
    schedule, round range, group, tag and late rank (the late rank's sleep, the header check and
    an NcclGroup's final wait stay outside the graph); a failed capture warns once and the rounds
    run eagerly.  ``graphs=False`` turns graphs off; ``graphs`` applies to those calls only.

    ``rounds=(first, stop)`` runs only the schedule's rounds ``first`` to ``stop - 1`` (stop None:
    to the end), on every rank; the buffer holds a partial result in between.  Calls over
    consecutive ranges, in order, compute the sum; :func:`~stragglar.runtime.rounds_without` says
    which first rounds the late rank has no part in.  The late rank sleeps ``straggler_delay`` in
    the call that holds its first round.
    """
    require_proof(proof)
    delay = as_seconds(straggler_delay, "straggler_delay", maximum=MAX_DELAY)
    wait = None if timeout is None else as_seconds(timeout, "timeout", positive=True)
    tag = as_tag(tag, proof.num_rounds)
    as_flag(lockstep, "lockstep")
    as_flag(stream_ordered, "stream_ordered")
    check_summable(data, "allreduce")
    if graphs is not None:
        as_flag(graphs, "graphs")
    part = _check_rounds(rounds, proof)
    if isinstance(group, NcclGroup):
        from stragglar.runtime.cupy_nccl import (
            CupyGraphs,
            NcclTransport,
            fused_packing,
            nccl_dtype,
            pointer,
            uncapturable,
        )
        from stragglar.runtime.cupy_nccl import gather_headers as gather_nccl

        if stream_ordered:
            raise InputError(
                "stream_ordered applies to torch tensors on an NCCL process group: an NcclGroup's "
                "rounds already run on its stream"
            )
        on_gpu = library_of(data) == "cupy"
        if graphs is not None and not on_gpu:
            raise InputError("graphs applies to CuPy arrays on an NcclGroup: these rounds have no CUDA graph")
        nccl = group.resolved()
        rank, size = nccl.comm.rank_id(), nccl.comm.size()
        late_rank = late_rank_for(proof.schedule, late_rank, size)
        with nccl.stream:
            flat, header, problem = _inspect(
                data, proof, tag, late_rank, part, lambda dtype: nccl_dtype(nccl, dtype)
            )

            def gather_from_nccl() -> list[tuple[int, ...]]:
                return gather_nccl(nccl, flat if flat is not None else data, header, wait)

            def run_on_nccl() -> Timeline:
                plan = plan_for(proof, rank, int(flat.shape[0]), tag * ROUNDS_PER_TAG)
                transport = NcclTransport(plan, nccl, dtype_name(flat), _plus(wait, delay))
                if not on_gpu:
                    return run_rank(flat, plan, transport, delay, late_rank, part)
                buffer = (pointer(flat), plan.layout.count, dtype_name(flat), int(flat.device.id))
                packing = fused_packing(plan, flat, (proof.schedule.fingerprint, rank, tag, buffer))
                if graphs is False:
                    return run_rank(flat, plan, transport, delay, late_rank, part, packing)
                key = (nccl.comm, proof.schedule.fingerprint, rank, buffer, tag, part, late_rank)
                replay = functools.partial(shared(CupyGraphs), refusal=lambda: uncapturable(nccl))
                return run_rank_replayed(flat, plan, transport, replay, key, delay, late_rank, part, packing)

            check = _Check(header, problem, gather_from_nccl, size, lockstep)
            return _checked_run(nccl.comm, None, check, run_on_nccl)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        import torch.distributed as dist

        from stragglar.runtime.torch_dist import CudaGraphs, TorchTransport, torch_uncapturable
        from stragglar.runtime.torch_dist import gather_headers as gather_torch

        if graphs is not None and not stream_ordered:
            raise InputError(
                "graphs applies to stream-ordered rounds (stream_ordered=True on an NCCL group) "
                "and to CuPy arrays on an NcclGroup"
            )

        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise ArgumentError(
                f"group must be a torch process group or None (the world), got {described(group)} "
                f"({type(group).__name__})"
            )
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
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        late_rank = late_rank_for(proof.schedule, late_rank, size)
        flat, header, problem = _inspect(data, proof, tag, late_rank, part)
        identity = group if group is not None else dist.group.WORLD
        channel = None if dist.get_backend(group) == "nccl" else tag  # NCCL ignores tags

        def gather_from_torch() -> list[tuple[int, ...]]:
            return gather_torch(header, group, data.device, rank, wait)

        def run_on_torch() -> Timeline:
            plan = plan_for(proof, rank, int(flat.shape[0]), tag * ROUNDS_PER_TAG)
            moves = TorchTransport(plan, group, _plus(wait, delay), stream_ordered)
            if stream_ordered and flat.is_cuda and graphs is not False:
                buffer = (flat.data_ptr(), plan.layout.count, str(flat.dtype), str(flat.device))
                key = (identity, proof.schedule.fingerprint, rank, buffer, tag, part, late_rank)
                replay = functools.partial(shared(CudaGraphs), refusal=torch_uncapturable)
                return run_rank_replayed(flat, plan, moves, replay, key, delay, late_rank, part)
            return run_rank(flat, plan, moves, delay, late_rank, part)

        check = _Check(header, problem, gather_from_torch, size, lockstep)
        return _checked_run(identity, channel, check, run_on_torch)
    raise ArgumentError(
        f"cannot allreduce a {type(data).__name__} across processes: pass a torch tensor, or an array "
        "with an NcclGroup (allreduce_local takes one array per rank)"
    )


def release_graphs(group: Any = None) -> int:
    """Drop the CUDA graphs of NCCL rounds this process captured: those on ``group`` (a torch
    process group or an :class:`NcclGroup`), or all of them (None); returns how many went.

    NCCL will not destroy a communicator while a CUDA graph that captured its calls lives, so
    ``torch.distributed.destroy_process_group()`` (or a CuPy communicator's ``destroy``) after
    graphed calls would wait forever: call this first, on every rank.  It waits until the device
    has run the graphs already launched, which need every peer's too, so call it where every rank
    has made the same calls (the end of a run).  Later calls on the group run eagerly once, then
    capture again.  The launcher of ``stragglar run``/``bench`` and the DDP example call it.
    """
    return release(group.comm if isinstance(group, NcclGroup) else group)


@dataclass(frozen=True)
class _Check:
    """What a call's header check needs: this rank's header and own ``problem`` (None: none), how
    to all-gather every rank's header, the group's size, and whether the caller is in lockstep."""

    header: Header
    problem: Exception | None
    gather: Callable[[], Sequence[Sequence[int]]]
    size: int
    lockstep: bool


def _checked_run(group: Any, channel: int | None, check: _Check, start: Callable[[], Timeline]) -> Timeline:
    """Run the call on its channel (:mod:`stragglar.runtime.channels`): refused if the channel is
    busy, its header all-gathered first where the channel says so, and this rank's own problem
    raised after the gather, so that its peers raise theirs rather than wait for it."""
    with _channels.enter(group, channel, check.header, lockstep=check.lockstep) as call:
        if call.must_check:
            _agree(check.header, check.gather(), check.size)
            if check.problem is None:
                call.agreed()
        if check.problem is not None:
            raise check.problem
        return start()


def _check_rounds(rounds: Any, proof: Proof) -> tuple[int, int | None]:
    """``rounds`` as (first, stop), both within the schedule's rounds (stop None: to the end)."""
    if rounds is None:
        return 0, None
    if not isinstance(rounds, tuple) or len(rounds) != 2:
        raise ArgumentError(f"rounds must be a pair (first, stop), got {described(rounds)}")
    total = proof.num_rounds
    first = as_int(rounds[0], "rounds[0]", minimum=0)
    stop = None if rounds[1] is None else as_int(rounds[1], "rounds[1]", minimum=0)
    if first > (total if stop is None else stop) or (stop is not None and stop > total):
        raise InputError(f"rounds must satisfy 0 <= first <= stop <= {total} (the schedule's), got {rounds}")
    return first, stop


def _plus(timeout: float | None, delay: float) -> float | None:
    return None if timeout is None else timeout + delay


def _inspect(
    data: Any,
    proof: Proof,
    tag: int,
    late_rank: int,
    rounds: tuple[int, int | None],
    sendable: Callable[[str], object] = lambda _: None,
) -> tuple[Any, Header, Exception | None]:
    """(the flat view or None, this rank's header, the error this rank must raise or None)."""
    header = functools.partial(make_header, proof, tag=tag, late_rank=late_rank, rounds=rounds)
    refusal = in_place_refusal(data)
    if refusal is not None:
        return None, header(None, None, problem=4), InputError(refusal)
    try:
        flat = flat_view(data)
    except TypeError as e:  # a dtype nothing here supports
        return None, header(None, None, problem=1), e
    except InputError as e:  # not contiguous
        return None, header(None, None, problem=2), e
    dtype = dtype_name(flat)
    try:
        sendable(dtype)
    except TypeError as e:  # e.g. an NCCL build without bfloat16
        return None, header(dtype, None, problem=3), e
    return flat, header(dtype, int(flat.shape[0])), None


def _agree(mine: Header, gathered: Sequence[Sequence[int]], size: int) -> None:
    """Raise the same MismatchError on every rank unless every header equals this rank's.

    A rank with a problem of its own raises its own error after the gather instead."""
    headers = [Header(*h) for h in gathered]
    reason = mismatch(headers, size)
    if reason is not None and not mine.problem:
        raise MismatchError(reason)
