"""Schedule generators: StragglAR and the baselines it is measured against, all in one IR.

Generators import only the core (:mod:`stragglar.schedule`); what they make is proved elsewhere
(:mod:`stragglar.verify`) before anything uses it.

>>> synthesize("ring", 4).num_rounds
6
"""

from __future__ import annotations

from collections.abc import Callable

from stragglar.errors import InputError
from stragglar.schedule import Schedule, move_straggler
from stragglar.synth.direct import direct_allreduce
from stragglar.synth.rhd import rhd_allreduce
from stragglar.synth.ring import ring_allreduce
from stragglar.synth.stragglar import stragglar_allreduce

__all__ = [
    "ALGORITHMS",
    "METHODS",
    "direct_allreduce",
    "rhd_allreduce",
    "ring_allreduce",
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
METHODS = ("construct", "smt")


def synthesize(
    algorithm: str,
    num_ranks: int,
    straggler: int | None = None,
    *,
    method: str = "construct",
    timeout_s: float | None = None,
) -> Schedule:
    """Generate ``algorithm``'s AllReduce schedule over ``num_ranks`` ranks.

    ``straggler`` (default: the last rank) only applies to the straggler-aware algorithms.
    ``method="smt"`` lets z3 find StragglAR's copies (small N; ``timeout_s`` bounds each query).
    Raises :class:`~stragglar.errors.InputError` with a one-line reason for a bad request.
    """
    if algorithm not in _GENERATORS:
        raise InputError(f"unknown algorithm '{algorithm}' (choose from {', '.join(ALGORITHMS)})")
    if method not in METHODS:
        raise InputError(f"unknown method '{method}' (choose from {', '.join(METHODS)})")
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 2:
        raise InputError(f"need at least 2 GPUs, got {num_ranks}")
    if straggler is not None and not 0 <= straggler < num_ranks:
        raise InputError(f"straggler must be a rank in 0..{num_ranks - 1}, got {straggler}")
    if method == "smt":
        if algorithm != "stragglar":
            raise InputError("method smt synthesizes StragglAR schedules only")
        from stragglar.synth.smt import smt_synthesize  # z3 is slow to import: only when asked

        return smt_synthesize(num_ranks, timeout_s, straggler)
    schedule = _GENERATORS[algorithm](num_ranks)
    if straggler is None or schedule.straggler is None:
        if straggler is not None:
            raise InputError(f"algorithm '{algorithm}' has no straggler; drop --straggler")
        return schedule
    return move_straggler(schedule, straggler)
