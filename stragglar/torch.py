"""A PyTorch DDP communication hook that all-reduces gradient buckets with a StragglAR schedule.

>>> import torch.distributed as dist                                   # doctest: +SKIP
>>> ddp.register_comm_hook(StragglarState(straggler=3), stragglar_hook)  # doctest: +SKIP

The hook runs the schedule's rounds before it returns and hands back a completed Future: gloo has
no futures for point-to-point work, and every bucket finishing in order keeps tags simple.
Gradients are summed, then divided by the world size, as the default hook does.  (No
``from __future__ import annotations`` here: DDP compares the hook's annotations with the classes.)
"""

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import GradBucket  # type: ignore[attr-defined, unused-ignore]

from stragglar.runtime import allreduce
from stragglar.schedule import Schedule

__all__ = ["StragglarState", "stragglar_hook"]


@dataclass
class StragglarState:
    """What the hook needs: the algorithm and straggler rank, the process group (None: world), a
    timeout in seconds, and the schedule per world size, synthesized (and verified) on first use.
    ``straggler_delay`` makes the straggler late on purpose, for experiments."""

    algorithm: str = "stragglar"
    straggler: int | None = None
    process_group: Any = None
    timeout: float = 300.0
    straggler_delay: float = 0.0
    schedules: dict[int, Schedule] = field(default_factory=dict)

    def schedule(self, world_size: int) -> Schedule:
        if world_size not in self.schedules:
            from stragglar.synth import synthesize

            self.schedules[world_size] = synthesize(self.algorithm, world_size, self.straggler)
        return self.schedules[world_size]


def stragglar_hook(state: StragglarState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket``'s gradients over the ranks with the state's schedule."""
    buffer = bucket.buffer()
    world = dist.get_world_size(state.process_group)
    schedule = state.schedule(world)
    allreduce(
        buffer,
        schedule,
        group=state.process_group,
        straggler_delay=state.straggler_delay,
        timeout=state.timeout,
        tag=bucket.index() * schedule.num_rounds,
    )
    buffer.div_(world)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
