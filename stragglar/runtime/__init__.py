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

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from stragglar.errors import InputError
from stragglar.runtime.cupy_nccl import NcclGroup
from stragglar.runtime.engine import DTYPES, RankError, Timeline, dtype_name, flat_view, run_rank
from stragglar.runtime.layout import Layout
from stragglar.runtime.local import run_local
from stragglar.runtime.program import Plan, RankProgram, bind, compile_schedule
from stragglar.verify import Proof, require_proof

__all__ = [
    "DTYPES",
    "Layout",
    "NcclGroup",
    "RankError",
    "Timeline",
    "allreduce",
    "allreduce_local",
    "plan_for",
]

_V = TypeVar("_V")
_lock = threading.Lock()
_programs: OrderedDict[Hashable, tuple[RankProgram, ...]] = OrderedDict()
_plans: OrderedDict[Hashable, Plan] = OrderedDict()


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


def plan_for(proof: Proof, rank: int, count: int, tag_base: int = 0) -> Plan:
    """The compiled plan of ``rank`` bound to a ``count``-element buffer (cached by fingerprint)."""
    require_proof(proof)
    key = proof.schedule.fingerprint
    programs = _cached(_programs, key, lambda: compile_schedule(proof.schedule), 32)
    return _cached(_plans, (key, rank, count, tag_base), lambda: bind(programs[rank], count, tag_base), 256)


def allreduce_local(buffers: Sequence[Any], proof: Proof, straggler_delay: float = 0.0) -> list[Timeline]:
    """Sum ``buffers`` (one array per rank, all in this process) in place, following the schedule.

    The reference executor (NumPy), and the GPU loopback with CuPy arrays on one device.  Rounds
    that need the straggler wait until ``straggler_delay`` seconds have passed.
    """
    require_proof(proof)
    count = int(flat_view(buffers[0]).shape[0]) if buffers else 0
    plans = [plan_for(proof, r, count) for r in range(proof.num_ranks)]
    return run_local(buffers, plans, straggler_delay)


def allreduce(
    data: Any,
    proof: Proof,
    group: Any = None,
    straggler_delay: float = 0.0,
    *,
    timeout: float | None = 300.0,
    tag: int = 0,
) -> Timeline:
    """Sum this rank's ``data`` over the ranks in place, following the proved schedule.

    ``data`` is a torch tensor (``group``: a torch process group, default the world) or a
    NumPy/CuPy array with an :class:`NcclGroup`.  The schedule's straggler sleeps
    ``straggler_delay`` seconds first; the others start the rounds without it at once.  ``tag``
    offsets the message tags (concurrent calls need distinct ranges of ``num_rounds``).  Returns
    this rank's timeline.  Raises :class:`RankError` when a peer dies or ``timeout`` passes.
    """
    require_proof(proof)
    flat = flat_view(data)
    if isinstance(group, NcclGroup):
        from stragglar.runtime.cupy_nccl import NcclTransport

        group = group.resolved()
        rank, size = group.comm.rank_id(), group.comm.size()
        plan = _rank_plan(proof, rank, size, int(flat.shape[0]), tag)
        with group.stream:
            return run_rank(
                flat, plan, NcclTransport(plan, group, dtype_name(flat), timeout), straggler_delay
            )
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        import torch.distributed as dist

        from stragglar.runtime.torch_dist import TorchTransport

        rank, size = dist.get_rank(group), dist.get_world_size(group)
        plan = _rank_plan(proof, rank, size, int(flat.shape[0]), tag)
        return run_rank(flat, plan, TorchTransport(plan, group, timeout), straggler_delay)
    raise TypeError(
        f"cannot allreduce a {type(data).__name__} across processes: pass a torch tensor, or an array "
        "with an NcclGroup (allreduce_local takes one array per rank)"
    )


def _rank_plan(proof: Proof, rank: int, size: int, count: int, tag: int) -> Plan:
    if size != proof.num_ranks:
        raise InputError(
            f"schedule '{proof.schedule.algorithm}' is for {proof.num_ranks} ranks, the group has {size}"
        )
    return plan_for(proof, rank, count, tag)
