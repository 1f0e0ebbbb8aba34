"""Schedule generators: StragglAR and the baselines it is measured against, all in one IR.

>>> synthesize("ring", 4).num_rounds
6
"""

from __future__ import annotations

from collections.abc import Callable

from stragglar.schedule import Schedule, move_straggler
from stragglar.synth.direct import direct_allreduce
from stragglar.synth.rhd import rhd_allreduce
from stragglar.synth.ring import ring_allreduce
from stragglar.synth.stragglar import round_lower_bound, stragglar_allreduce

__all__ = [
    "ALGORITHMS",
    "direct_allreduce",
    "rhd_allreduce",
    "ring_allreduce",
    "round_lower_bound",
    "stragglar_allreduce",
    "synthesize",
]

_GENERATORS: dict[str, Callable[[int], Schedule]] = {
    "stragglar": stragglar_allreduce,
    "ring": ring_allreduce,
    "rhd": rhd_allreduce,
    "direct": direct_allreduce,
}
ALGORITHMS = tuple(_GENERATORS)


def synthesize(algorithm: str, num_ranks: int, straggler: int | None = None) -> Schedule:
    """Generate ``algorithm``'s AllReduce schedule over ``num_ranks`` ranks.

    ``straggler`` (default: the last rank) only applies to the straggler-aware algorithms.
    Raises ValueError with a one-line reason for a bad request.
    """
    if algorithm not in _GENERATORS:
        raise ValueError(f"unknown algorithm '{algorithm}' (choose from {', '.join(ALGORITHMS)})")
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 2:
        raise ValueError(f"need at least 2 GPUs, got {num_ranks}")
    if straggler is not None and not 0 <= straggler < num_ranks:
        raise ValueError(f"straggler must be a rank in 0..{num_ranks - 1}, got {straggler}")
    schedule = _GENERATORS[algorithm](num_ranks)
    if straggler is None or schedule.straggler is None:
        if straggler is not None:
            raise ValueError(f"algorithm '{algorithm}' has no straggler; drop --straggler")
        return schedule
    return move_straggler(schedule, straggler)
