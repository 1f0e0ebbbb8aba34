"""The AllReduce across processes: one rank's part, on torch.distributed or CuPy/NCCL.

Each rank runs its own plan of the schedule; the ranks meet only through the transport.  So before
a call's rounds every rank can check that all ranks run the same AllReduce
(:mod:`stragglar.runtime.header`: the same schedule, dtype, element count, tag, late rank and
rounds), and all raise the same :class:`~stragglar.runtime.header.MismatchError` instead of summing
wrong.  Which calls check, and which may run at once, is the channels' rule
(:mod:`stragglar.runtime.channels`): a check needs the late rank too, so it runs only where the
ranks could otherwise disagree unseen.

A call runs on an :class:`~stragglar.runtime.engines.Engine`: what one group of torch.distributed
(:class:`~stragglar.runtime.torch_dist.TorchEngine`) or CuPy/NCCL
(:class:`~stragglar.runtime.cupy_nccl.NcclEngine`) offers, the header gather, a transport for the
rounds, the packing, the graphs and the check that they may be captured
(:mod:`stragglar.runtime.engines`).  :func:`allreduce` takes its steps once for all of them: check
the arguments, pick the engine (:func:`~stragglar.runtime.engines.engine_for`), inspect the buffer
into a header, check the header on the call's channel, run the rounds (eagerly, or replayed from a
CUDA graph).  A rank whose own data cannot take part still sends its header, and raises its error
after the gather (:mod:`stragglar.runtime.refusals`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any, Literal, overload

from stragglar.args import MAX_DELAY, MAX_TIMEOUT, as_flag, as_seconds
from stragglar.errors import ArgumentError, InputError, described
from stragglar.runtime.arrays import Array, dtype_name, flat_view
from stragglar.runtime.channels import ROUNDS_PER_TAG, Channels, as_tag
from stragglar.runtime.clock import Timeline
from stragglar.runtime.cupy_nccl import NcclEngine, NcclGroup
from stragglar.runtime.device.buffers import (
    address_of,
    check_device_buffer,
    check_not_capturing,
    launcher,
    queued_work_done,
)
from stragglar.runtime.device.group import DeviceCall, DeviceWork, Gather
from stragglar.runtime.device.shared import Registration, register, registered
from stragglar.runtime.device.states import States, forget, forget_group, states_for
from stragglar.runtime.engines import Engine, engine_for, engine_for_call
from stragglar.runtime.graphs import release, shared
from stragglar.runtime.header import Problem, agree, inspect_call, make_header
from stragglar.runtime.interpreter import run_rank, run_rank_replayed
from stragglar.runtime.plans import late_rank_for, plan_for
from stragglar.runtime.refusals import check_engine, check_rounds, device_problem
from stragglar.runtime.teardown import before_destroy
from stragglar.verify import Proof, require_proof

__all__ = ["Engine", "allreduce", "engine_for", "register_buffer", "release_graphs"]

_channels = Channels()


@overload
def allreduce(
    data: Any,
    proof: Proof,
    group: Any = ...,
    straggler_delay: float = ...,
    *,
    timeout: float | None = ...,
    tag: int = ...,
    late_rank: int | None = ...,
    stream_ordered: bool = ...,
    rounds: tuple[int, int | None] | None = ...,
    lockstep: bool = ...,
    graphs: bool | None = ...,
    engine: str = ...,
    async_op: Literal[False] = ...,
) -> Timeline: ...


@overload
def allreduce(
    data: Any,
    proof: Proof,
    group: Any = ...,
    straggler_delay: float = ...,
    *,
    timeout: float | None = ...,
    tag: int = ...,
    late_rank: int | None = ...,
    lockstep: bool = ...,
    engine: str = ...,
    async_op: Literal[True],
) -> DeviceWork: ...


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
    engine: str = "rounds",
    async_op: bool = False,
) -> Timeline | DeviceWork:
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
    setups alternate, and the guarantee is the caller's, as it is for NCCL's collectives: ranks
    that break it with setups each checked before (one brings float32 where another brings int32)
    are not told apart, and sum mixed buffers, or wait until their timeout, or (gloo, sizes that
    differ) end the process.
    Raises :class:`~stragglar.runtime.RankError` when a peer dies or does not answer within
    ``timeout`` seconds (at most a day; ``timeout`` plus ``straggler_delay`` for a wait that may
    include the late rank's delay; None: stragglar sets no bound of its own, and the
    group's own timeout, or the device engine's day, ends a wait), and
    :class:`~stragglar.runtime.ArgumentError` (a TypeError) or ``InputError`` for bad arguments.
    Options that do not fit are refused at once; what only this rank's data brings (a buffer it
    cannot write or send, data that is no torch tensor on a torch group, a buffer off the GPU for
    ``engine="device"``) is raised after the header's gather, where its header names the problem:
    on a call that checks (a channel's first, or one whose setup changed), its peers raise a
    ``MismatchError`` naming this rank in the same call instead of waiting for it; on a channel
    whose peers keep their setup and do not check, this rank checks alone and every rank fails by
    its timeout, never summing mixed buffers (:mod:`stragglar.runtime.refusals`).

    ``stream_ordered`` (torch tensors on an NCCL group): wait for each round on the current CUDA
    stream instead of the host, so the call returns once every round is queued; ``timeout`` then
    bounds only the header check, and the process group's own timeout catches a dead peer
    (:mod:`stragglar.runtime.torch_dist`).

    Stream-ordered rounds on CUDA tensors, and the rounds of a CuPy array on an NcclGroup, replay
    from a CUDA graph after their first call, keyed by the buffer's address, size and dtype, the
    schedule, round range, group, tag and late rank (the late rank's sleep, the header check and
    an NcclGroup's final wait stay outside the graph); a failed capture warns once and the rounds
    run eagerly.  ``graphs=False`` turns graphs off; ``graphs`` applies to those calls only.

    ``engine="device"`` runs this rank's whole part as one kernel launch on a CuPy array or a
    torch CUDA tensor, reaching the peers' memory through CUDA IPC handles exchanged once over
    the group (:mod:`~stragglar.runtime.device.group`), with direct transfers between the ranks'
    buffers where the buffer is registered (:func:`register_buffer`), else every transfer staged
    through the receiver's inbox; ``stream_ordered``, ``rounds`` and
    ``graphs`` apply to the default engine, ``"rounds"``, only.  ``async_op=True`` (the device
    engine only) returns once this rank's kernel is launched, with a
    :class:`~stragglar.runtime.device.group.DeviceWork` whose ``wait()`` waits for it and checks
    every rank's words: the buffer holds the sum only after it, and every rank must wait for
    every work, in the same order.  So calls on several buffers can run at once (each its own
    buffer; a second call on the same buffer and setup before the first's wait is refused).  The
    late rank sleeps its ``straggler_delay`` in each launch, so launches in a row on one thread
    arrive one delay after another: to make every call late by ``d`` from a common start, pass
    each what is left of ``d`` (as the DDP hook does for a step's buckets).

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
    if graphs is not None:
        as_flag(graphs, "graphs")
    part = check_rounds(rounds, proof)
    as_flag(async_op, "async_op")
    on_device = check_engine(engine, stream_ordered, rounds, graphs, async_op)
    # what only this rank's data brings is said after the gather (stragglar.runtime.refusals)
    runner, own = engine_for_call(
        data, group, stream_ordered, graphs, device_problem(data) if on_device else None
    )
    try:
        late_rank = late_rank_for(proof.schedule, late_rank, runner.size)
    except (ArgumentError, InputError):  # this rank's own problem came first, as it always did
        if own is None:
            raise
        raise own.error from None
    with runner.stream:
        if own is None:
            flat, header, problem = inspect_call(data, proof, tag, late_rank, part, runner.sendable)
        else:
            flat, problem = None, own.error
            header = make_header(proof, None, None, tag, late_rank, own.problem, part)
        registration = registered(runner.owner, flat) if on_device and flat is not None else None
        header = header._replace(
            on_device=int(on_device), registered=0 if registration is None else registration.number
        )
        channel = runner.channel(tag)
        device = None
        if on_device and flat is not None and problem is None:
            try:
                device = _device_call(runner, flat, proof, late_rank, delay, wait, channel, registration)
            except InputError as e:  # no CuPy: said after the gather, as any problem of this rank
                problem, header = e, header._replace(problem=Problem.NO_DEVICE_CALL)
            else:
                broken = device.refusal()  # a broken setup or buffer: refused before the gather (refusals.py)
                if broken is not None:
                    raise broken
        # the header is all-gathered where the channel says so, and this rank's own problem raised
        # after the gather, so that its peers raise theirs rather than wait for it
        with ExitStack() as held:
            try:
                call = held.enter_context(_channels.enter(runner.owner, channel, header, lockstep=lockstep))
            except InputError as busy:  # another call holds the channel: this rank's own problem first
                if problem is not None:
                    raise problem from busy
                raise
            if call.must_check:
                try:
                    gathered = runner.gather(header, data if flat is None else flat, wait, channel)
                except Exception as e:  # any failure of the gather (peers that did not check, say):
                    if problem is not None:  # this rank's own problem is what its caller must hear
                        raise problem from e
                    raise
                agree(header, gathered, runner.size)
                if problem is None:
                    call.agreed()
            if problem is not None:
                raise problem
            if device is not None:
                if async_op:
                    return device.launch(_gather_on(runner, flat, tag, _plus(wait, delay)))
                return device.run()
            return _run_rounds(runner, flat, proof, tag, part, late_rank, delay, wait, graphs)


def register_buffer(data: Any, group: Any = None, *, timeout: float | None = 300.0) -> Registration:
    """Register this rank's device buffer ``data`` (a CuPy array with an :class:`NcclGroup`, or a
    torch CUDA tensor on ``group``, default the world) for ``allreduce(data, ...,
    engine="device")``: every rank calls it, in the same order, and each rank's buffer is opened in
    every peer's process once (CUDA IPC), so that the calls on it move chunks straight between the
    ranks' buffers wherever the schedule allows it, not through the receiver's inbox (a second
    copy).  Returns the :class:`~stragglar.runtime.device.shared.Registration`: it keeps the buffer
    alive until it is closed (``close()``, or ``with``), on every rank; a call on any other buffer
    runs staged.  Every rank raises an error (the rank at fault says why) if any rank cannot
    register (a buffer in memory CUDA IPC cannot share: an expandable segment of torch's
    allocator, a stream-ordered pool; a peer's buffer it cannot open), if the ranks' buffers
    differ in dtype or element count, or if a peer does not answer within ``timeout`` seconds.
    Register while no call runs on the group, as with any collective.  On a torch group
    ``destroy_process_group()`` closes what is still open on it first."""
    wait = None if timeout is None else as_seconds(timeout, "timeout", positive=True)
    check_device_buffer(data)  # refused at once, before the registration's gather (allreduce's: after)
    check_not_capturing(data)
    runner = engine_for(data, group, False, None, action="register")
    cupy = launcher()
    flat, refusal = None, None
    try:
        flat = flat_view(data)
    except (InputError, TypeError) as e:  # not contiguous, a dtype nothing here sums: said after the gather
        refusal = str(e)

    def gather(values: Sequence[int]) -> list[tuple[int, ...]]:
        # on gloo, tag 0's channel: messages on the host (gloo gathers no CUDA tensors)
        return runner.gather(values, data if flat is None else flat, wait, runner.channel(0))

    with runner.stream:
        registration = register(cupy, runner.owner, runner.rank, flat, gather, refusal)
    if not isinstance(group, NcclGroup):  # a torch group: closed before torch destroys the group
        before_destroy(registration, (runner.owner,), Registration.close)
    return registration


def release_graphs(group: Any = None) -> int:
    """Drop the CUDA graphs of NCCL rounds this process captured: those on ``group`` (a torch
    process group or an :class:`NcclGroup`), or all of them (None); returns how many went.  The
    device engine's states on the group (an inbox about each buffer's size, and the peers' memory
    opened) go too.

    NCCL will not destroy a communicator while a CUDA graph that captured its calls lives, so a
    CuPy communicator's ``destroy`` after graphed calls would wait forever: call this first, on
    every rank.  ``torch.distributed.destroy_process_group()`` calls it by itself first
    (:mod:`stragglar.runtime.teardown`).  It waits until the device has run the graphs already
    launched, which need every peer's too, so call it where every rank has made the same calls
    (the end of a run).  Later calls on the group run eagerly once, then capture again.
    """
    if group is not None and not isinstance(group, NcclGroup):
        torch = sys.modules.get("torch")  # never imported here: a torch group means it is loaded
        if torch is None or not isinstance(group, torch.distributed.ProcessGroup):
            raise ArgumentError(  # anything else released nothing, and said 0
                "group must be a torch process group, an NcclGroup or None (every group), got "
                f"{described(group)} ({type(group).__name__})"
            )
    owner = group.comm if isinstance(group, NcclGroup) else group
    forget_group(owner)  # None: every group's
    return release(owner)


def _run_rounds(
    engine: Engine,
    flat: Array,
    proof: Proof,
    tag: int,
    part: tuple[int, int | None],
    late_rank: int,
    delay: float,
    wait: float | None,
    graphs: bool | None,
) -> Timeline:
    """This rank's rounds ``part`` on ``engine``: replayed from a CUDA graph where the engine names
    the buffer (:meth:`Engine.buffer`) and ``graphs`` is not False, else eagerly."""
    plan = plan_for(proof, engine.rank, int(flat.shape[0]), tag * ROUNDS_PER_TAG)
    transport = engine.transport(plan, flat, _plus(wait, delay))
    buffer = engine.buffer(flat, plan)
    if buffer is None:
        return run_rank(flat, plan, transport, delay, late_rank, part)
    fingerprint = proof.schedule.fingerprint
    packing = engine.packing(plan, flat, (fingerprint, engine.rank, tag, buffer))
    if graphs is False:
        return run_rank(flat, plan, transport, delay, late_rank, part, packing)
    key = (engine.owner, fingerprint, engine.rank, buffer, tag, part, late_rank)
    replay = functools.partial(shared(engine.capturing), refusal=engine.uncapturable)
    return run_rank_replayed(flat, plan, transport, replay, key, delay, late_rank, part, packing)


def _device_call(
    runner: Engine,
    flat: Array,
    proof: Proof,
    late_rank: int,
    delay: float,
    wait: float | None,
    channel: int | None,
    registration: Registration | None,
) -> DeviceCall:
    """This rank's whole part as one kernel launch (:mod:`~stragglar.runtime.device.group`), the
    IPC handles and each call's error words gathered over ``runner``'s group; with direct
    transfers on a ``registration``'s buffer, staged through the inboxes on any other.  It runs
    on the buffer's GPU, whichever GPU the calling thread has current."""
    from stragglar.runtime.device import program_for_call

    cupy = launcher()
    count, dtype, fingerprint = int(flat.shape[0]), dtype_name(flat), proof.schedule.fingerprint
    # proved before its first launch
    program = program_for_call(proof, registration is not None, count, dtype)
    pointer, device = address_of(flat)
    queued_work_done(flat, device)

    def gather(values: Sequence[int]) -> list[tuple[int, ...]]:
        return runner.gather(values, flat, _plus(wait, delay), channel)

    timeout = MAX_TIMEOUT + delay if wait is None else wait + delay  # a device wait is always bounded
    return DeviceCall(
        cupy,
        _device_states(runner, channel),
        program,
        fingerprint,
        runner.rank,
        pointer,
        count,
        dtype,
        device,
        delay,
        late_rank,
        timeout,
        gather,
        registration,
    )


def _device_states(runner: Engine, channel: int | None) -> States:
    """The device engine's states on ``channel`` of ``runner``'s group
    (:mod:`~stragglar.runtime.device.states`); a torch group's go before torch destroys it."""
    states, made = states_for(runner.owner, channel)
    if made and not isinstance(runner, NcclEngine):
        before_destroy(states, (runner.owner,), forget)
    return states


def _gather_on(runner: Engine, flat: Array, tag: int, timeout: float | None) -> Callable[[Any], Gather]:
    """A device call's wait's all-gather over a group: the call's own (None), or another of the
    same ranks (a torch group, or an :class:`NcclGroup`), on the call's channel there, held while
    it runs (a call that tries to take it meanwhile fails, as concurrent calls on a channel do)."""

    def gather_on(group: Any) -> Gather:
        target = runner if group is None else engine_for(flat, group, False, None, action="wait on")
        if (target.size, target.rank) != (runner.size, runner.rank):
            raise InputError(
                f"a device call's wait gathers over its own ranks: this group has {target.size} "
                f"ranks (this one rank {target.rank}), the call's {runner.size} (rank {runner.rank})"
            )
        channel = target.channel(tag)

        def gather(values: Sequence[int]) -> list[tuple[int, ...]]:
            with target.stream, _channels.hold(target.owner, channel):
                return target.gather(values, flat, timeout, channel)

        return gather

    return gather_on


def _plus(timeout: float | None, delay: float) -> float | None:
    return None if timeout is None else timeout + delay
