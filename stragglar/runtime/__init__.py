"""Run any AllReduce schedule on real data: NumPy in one process, torch.distributed, or CuPy/NCCL.

>>> import numpy as np
>>> from stragglar.synth import synthesize
>>> bufs = [np.arange(5, dtype=np.int64) * (r + 1) for r in range(3)]
>>> _ = allreduce(bufs, synthesize("stragglar", 3))
>>> bufs[2].tolist()
[0, 6, 12, 18, 24]
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

from stragglar.runtime.cupy_nccl import NcclGroup
from stragglar.runtime.engine import DTYPES, RankError, Timeline, dtype_name, flat_view, run_rank
from stragglar.runtime.layout import Layout
from stragglar.runtime.local import run_local
from stragglar.runtime.program import Plan, RankProgram, bind, compile_schedule
from stragglar.schedule import Schedule

__all__ = ["DTYPES", "Layout", "NcclGroup", "RankError", "Timeline", "allreduce", "plan_for"]


@functools.lru_cache(maxsize=32)
def _programs(schedule: Schedule) -> tuple[RankProgram, ...]:
    return compile_schedule(schedule)


@functools.lru_cache(maxsize=256)
def plan_for(schedule: Schedule, rank: int, count: int, tag_base: int = 0) -> Plan:
    """The verified, compiled and bound plan of ``rank`` (cached: DDP asks once per bucket)."""
    return bind(_programs(schedule)[rank], count, tag_base)


def allreduce(
    data: Any,
    schedule: Schedule,
    group: Any = None,
    straggler_delay: float = 0.0,
    *,
    timeout: float | None = 300.0,
    tag: int = 0,
) -> Timeline | list[Timeline]:
    """Sum ``data`` over the ranks in place, following ``schedule``.

    ``data`` is a list of arrays (one per rank: the local reference, or CuPy loopback), a torch
    tensor (``group``: a torch process group, default the world), or a NumPy/CuPy array with an
    :class:`NcclGroup`.  The schedule's straggler sleeps ``straggler_delay`` seconds first; the
    others start the rounds without it at once.  ``tag`` offsets the message tags (concurrent
    calls need distinct ranges of ``schedule.num_rounds``).  Returns this rank's timeline (a list
    for the local executor).  Raises :class:`RankError` when a peer dies or ``timeout`` passes.
    """
    if isinstance(data, Sequence):
        count = int(flat_view(data[0]).shape[0]) if data else 0
        plans = [plan_for(schedule, r, count, tag) for r in range(schedule.num_ranks)]
        return run_local(data, plans, straggler_delay)
    flat = flat_view(data)
    if isinstance(group, NcclGroup):
        from stragglar.runtime.cupy_nccl import NcclTransport

        group = group.resolved()
        rank, size = group.comm.rank_id(), group.comm.size()
        plan = _rank_plan(schedule, rank, size, int(flat.shape[0]), tag)
        with group.stream:
            return run_rank(
                flat, plan, NcclTransport(plan, group, dtype_name(flat), timeout), straggler_delay
            )
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        import torch.distributed as dist

        from stragglar.runtime.torch_dist import TorchTransport

        rank, size = dist.get_rank(group), dist.get_world_size(group)
        plan = _rank_plan(schedule, rank, size, int(flat.shape[0]), tag)
        return run_rank(flat, plan, TorchTransport(plan, group, timeout), straggler_delay)
    raise TypeError(
        f"cannot allreduce a {type(data).__name__}: pass a torch tensor, an array with an NcclGroup, "
        "or a list of arrays (one per rank)"
    )


def _rank_plan(schedule: Schedule, rank: int, size: int, count: int, tag: int) -> Plan:
    if size != schedule.num_ranks:
        raise ValueError(
            f"schedule '{schedule.algorithm}' is for {schedule.num_ranks} ranks, the group has {size}"
        )
    return plan_for(schedule, rank, count, tag)
