"""Run any proved AllReduce schedule on real data: NumPy in one process, torch.distributed, or CuPy/NCCL.

Every entry point takes a :class:`~stragglar.verify.Proof`, so only proved schedules run.  Plans
are cached by the schedule's fingerprint: a DDP hook asks for one per gradient bucket per step,
and a lookup must cost microseconds, not a walk over every transfer.

>>> import numpy as np
>>> from stragglar.synth import synthesize
>>> from stragglar.verify import prove
>>> bufs = [np.arange(5, dtype=np.int64) * (r + 1) for r in range(3)]
>>> _ = allreduce_local(bufs, prove(synthesize("stragglar", 3)))
>>> bufs[2].tolist()
[0, 6, 12, 18, 24]
"""

from __future__ import annotations

import functools
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from stragglar.args import as_int, as_rank, as_seconds
from stragglar.errors import ArgumentError, InputError
from stragglar.runtime.cupy_nccl import NcclGroup
from stragglar.runtime.engine import (
    DTYPES,
    RankError,
    Timeline,
    dtype_name,
    flat_view,
    in_place_refusal,
    late_rank_for,
    run_rank,
)
from stragglar.runtime.header import CheckedHeaders, Header, MismatchError, make_header, mismatch
from stragglar.runtime.layout import Layout
from stragglar.runtime.local import run_local
from stragglar.runtime.program import Plan, RankProgram, bind, compile_schedule
from stragglar.verify import Proof, require_proof

__all__ = [
    "DTYPES",
    "ArgumentError",
    "Layout",
    "MismatchError",
    "NcclGroup",
    "RankError",
    "Timeline",
    "allreduce",
    "allreduce_local",
    "plan_for",
    "rounds_without",
]

_V = TypeVar("_V")
_lock = threading.Lock()
_programs: OrderedDict[Hashable, tuple[RankProgram, ...]] = OrderedDict()
_plans: OrderedDict[Hashable, Plan] = OrderedDict()
_checked = CheckedHeaders()


def _cached(cache: OrderedDict[Hashable, _V], key: Hashable, make: Callable[[], _V], limit: int) -> _V:
    """``cache[key]``, made on a miss; the least recently used entries go past ``limit``."""
    with _lock:
        value = cache.get(key)
        if value is not None:
            cache.move_to_end(key)
            return value
    value = make()
    with _lock:
        cache[key] = value
        while len(cache) > limit:
            cache.popitem(last=False)
    return value


def _compiled(proof: Proof) -> tuple[RankProgram, ...]:
    key = proof.schedule.fingerprint
    return _cached(_programs, key, lambda: compile_schedule(proof.schedule), 32)


def plan_for(proof: Proof, rank: int, count: int, tag_base: int = 0) -> Plan:
    """The compiled plan of ``rank`` bound to a ``count``-element buffer (cached by fingerprint)."""
    require_proof(proof)
    rank = as_rank(rank, "rank", proof.num_ranks)
    count = as_int(count, "count", minimum=0)
    tag_base = as_int(tag_base, "tag_base", minimum=0)
    programs = _compiled(proof)
    key = (proof.schedule.fingerprint, rank, count, tag_base)
    return _cached(_plans, key, lambda: bind(programs[rank], count, tag_base), 256)


def rounds_without(proof: Proof, late_rank: int | None = None) -> int:
    """How many of the schedule's first rounds ``late_rank`` takes no part in (None: the late
    rank :func:`allreduce` assumes: the schedule's straggler, else the last rank).

    The other ranks can run those rounds before the late rank arrives (StragglAR's ReduceScatter
    among the punctual ranks: ``rounds=(0, k)``, then ``rounds=(k, None)``), so a caller with
    many buffers can run that part of every one of them while the late rank is still away.

    >>> from stragglar.synth import synthesize
    >>> from stragglar.verify import prove
    >>> proof = prove(synthesize("stragglar", 4))
    >>> rounds_without(proof), rounds_without(proof, 0), proof.num_rounds
    (2, 0, 6)
    """
    require_proof(proof)
    program = _compiled(proof)[late_rank_for(proof.schedule, late_rank)]
    return program.steps[0].round if program.steps else proof.num_rounds


def _check_rounds(rounds: Any, proof: Proof) -> tuple[int, int | None]:
    """``rounds`` as (first, stop), both within the schedule's rounds (stop None: to the end)."""
    if rounds is None:
        return 0, None
    if not isinstance(rounds, tuple) or len(rounds) != 2:
        raise ArgumentError(f"rounds must be a pair (first, stop), got {rounds!r}")
    total = proof.num_rounds
    first = as_int(rounds[0], "rounds[0]", minimum=0)
    stop = None if rounds[1] is None else as_int(rounds[1], "rounds[1]", minimum=0)
    if first > (total if stop is None else stop) or (stop is not None and stop > total):
        raise InputError(f"rounds must satisfy 0 <= first <= stop <= {total} (the schedule's), got {rounds}")
    return first, stop


def allreduce_local(
    buffers: Sequence[Any], proof: Proof, straggler_delay: float = 0.0, *, late_rank: int | None = None
) -> list[Timeline]:
    """Sum ``buffers`` (one array per rank, all in this process) in place, following the schedule.

    The reference executor (NumPy), and the GPU loopback with CuPy arrays on one device.  The late
    rank (``late_rank``, default the schedule's straggler, else the last rank) arrives
    ``straggler_delay`` seconds after the start: rounds from its first one on wait until then.
    """
    require_proof(proof)
    delay = as_seconds(straggler_delay, "straggler_delay")
    late_rank = late_rank_for(proof.schedule, late_rank)
    count = int(flat_view(buffers[0]).shape[0]) if buffers else 0
    plans = [plan_for(proof, r, count) for r in range(proof.num_ranks)]
    return run_local(buffers, plans, delay, late_rank=late_rank)


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
) -> Timeline:
    """Sum this rank's ``data`` over the ranks in place, following the proved schedule.

    ``data`` is a torch tensor (``group``: a torch process group, default the world) or a
    NumPy/CuPy array with an :class:`NcclGroup`.  The late rank (``late_rank``, default the
    schedule's straggler, else the last rank) sleeps ``straggler_delay`` seconds first; the others
    start the rounds without it at once.  ``tag`` offsets the message tags (concurrent calls need
    distinct ranges of ``num_rounds``).  Returns this rank's timeline.

    The first call with a given schedule, dtype, element count, tag and late rank on a group
    all-gathers a small header, and every rank raises the same :class:`MismatchError` if the ranks
    disagree on any of them (instead of computing a wrong sum); later calls with the same plan
    skip it.  Raises :class:`RankError` when a peer dies or does not answer within ``timeout``
    seconds (``timeout`` plus ``straggler_delay`` for a wait that may include the late rank's
    delay), and :class:`ArgumentError` (a TypeError) or ``InputError`` for bad arguments.

    ``stream_ordered`` (torch tensors on an NCCL group): wait for each round on the current CUDA
    stream instead of the host, so the call returns once every round is queued; ``timeout`` then
    bounds only the first call's header check, and the process group's own timeout catches a dead
    peer (:mod:`stragglar.runtime.torch_dist`).

    ``rounds=(first, stop)`` runs only the schedule's rounds ``first`` to ``stop - 1`` (stop None:
    to the end), on every rank; the buffer holds a partial result in between.  Calls over
    consecutive ranges, in order, compute the sum; :func:`rounds_without` says which first rounds
    the late rank has no part in.  The late rank sleeps ``straggler_delay`` in the call that holds
    its first round.
    """
    require_proof(proof)
    delay = as_seconds(straggler_delay, "straggler_delay")
    wait = None if timeout is None else as_seconds(timeout, "timeout", positive=True)
    tag = as_int(tag, "tag", minimum=0)
    part = _check_rounds(rounds, proof)
    if isinstance(group, NcclGroup):
        from stragglar.runtime.cupy_nccl import NcclTransport, nccl_dtype
        from stragglar.runtime.cupy_nccl import gather_headers as gather_nccl

        group = group.resolved()
        rank, size = group.comm.rank_id(), group.comm.size()
        late_rank = late_rank_for(proof.schedule, late_rank, size)
        with group.stream:
            flat, header, problem = _inspect(
                data, proof, tag, late_rank, part, lambda dtype: nccl_dtype(group, dtype)
            )
            if (group.comm, header) not in _checked:
                _agree(header, gather_nccl(group, flat if flat is not None else data, header, wait), size)
                if problem is None:
                    _checked.add(group.comm, header)
            if problem is not None:
                raise problem
            plan = plan_for(proof, rank, int(flat.shape[0]), tag)
            transport = NcclTransport(plan, group, dtype_name(flat), _plus(wait, delay))
            return run_rank(flat, plan, transport, delay, late_rank, part)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        import torch.distributed as dist

        from stragglar.runtime.torch_dist import TorchTransport
        from stragglar.runtime.torch_dist import gather_headers as gather_torch

        rank, size = dist.get_rank(group), dist.get_world_size(group)
        late_rank = late_rank_for(proof.schedule, late_rank, size)
        flat, header, problem = _inspect(data, proof, tag, late_rank, part)
        identity = group if group is not None else dist.group.WORLD
        if (identity, header) not in _checked:
            _agree(header, gather_torch(header, group, data.device, rank, wait), size)
            if problem is None:
                _checked.add(identity, header)
        if problem is not None:
            raise problem
        plan = plan_for(proof, rank, int(flat.shape[0]), tag)
        moves = TorchTransport(plan, group, _plus(wait, delay), stream_ordered)
        return run_rank(flat, plan, moves, delay, late_rank, part)
    raise ArgumentError(
        f"cannot allreduce a {type(data).__name__} across processes: pass a torch tensor, or an array "
        "with an NcclGroup (allreduce_local takes one array per rank)"
    )


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
