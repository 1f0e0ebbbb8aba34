"""StragglAR AllReduce for any number of GPUs and any straggler rank.

Phase 1 (``reduce-scatter``) runs among the n-1 punctual GPUs while the straggler is late:
a ring ReduceScatter leaves GPU ``g`` with chunk ``g`` summed over them.  Phase 2
(``exchange``) starts when the straggler arrives: in round ``t < n-1`` GPU ``t`` and the
straggler swap chunk ``t`` and both add, which completes it; around those exchanges the other
GPUs copy completed chunks on.  Phase 2 needs at least
:func:`~stragglar.schedule.round_lower_bound` rounds; powers of two reach it by construction,
other sizes by a greedy search with bounded backtracking, then one more round until it fits.
Every StragglAR generator (these and the z3 one in :mod:`stragglar.synth.smt`) finds only the
copies; :func:`stragglar_schedule` assembles the phases around them.
"""

from __future__ import annotations

from collections.abc import Sequence

from stragglar.schedule import Op, Phase, Round, Schedule, Transfer, move_straggler, round_lower_bound
from stragglar.synth.ring import ring_reduce_scatter
from stragglar.synth.stragglar_greedy import greedy_copy_rounds
from stragglar.synth.stragglar_pow2 import pow2_copy_rounds
from stragglar.version import __version__

__all__ = ["Copy", "stragglar_allreduce", "stragglar_schedule"]

# Chunk placements the search may make per round count before trying one more round: enough
# for n = 1023 to reach the bound (about 14,000 placements).
SEARCH_BUDGET = 16384

Copy = tuple[int, int, int]


def stragglar_allreduce(num_ranks: int, straggler: int | None = None) -> Schedule:
    """The StragglAR schedule for ``num_ranks`` GPUs, the straggler being ``straggler`` (default n-1).

    >>> s = stragglar_allreduce(8)
    >>> s.num_chunks, s.exposed_rounds, s.metadata["lower_bound"]
    (7, 9, 9)
    """
    copies, method = _copy_rounds(num_ranks, round_lower_bound(num_ranks))
    schedule = stragglar_schedule(num_ranks, copies, method)
    return schedule if straggler is None else move_straggler(schedule, straggler)


def stragglar_schedule(num_ranks: int, copies: Sequence[Sequence[Copy]], method: str) -> Schedule:
    """The StragglAR schedule (straggler ``n-1``) whose phase-2 round ``t`` makes ``copies[t]``.

    The ring ReduceScatter among the punctual GPUs comes first; round ``t < n-1`` of phase 2 also
    holds GPU ``t``'s exchange of chunk ``t`` with the straggler.
    """
    n = num_ranks
    late = n - 1
    others = tuple(range(late))
    exchange = tuple(_exchange_round(t, late, copies[t]) for t in range(len(copies)))
    phases = [Phase("exchange", tuple(range(n)), exchange)]
    if late > 1:
        phases.insert(0, Phase("reduce-scatter", others, ring_reduce_scatter(others, others)))
    bound = round_lower_bound(n)
    metadata = {"generator": f"stragglar {__version__}", "method": method, "lower_bound": bound}
    return Schedule("stragglar", n, late, late, tuple(phases), metadata=metadata)


def _copy_rounds(n: int, bound: int) -> tuple[list[list[Copy]], str]:
    if n == 2:
        return [[]], "exchange"
    if n & (n - 1) == 0:
        return pow2_copy_rounds(n), "pow2-groups"
    num_rounds = bound
    while True:
        rounds = greedy_copy_rounds(n, num_rounds, max_attempts=4 * n + SEARCH_BUDGET)
        if rounds is not None:
            return rounds, "greedy search"
        num_rounds += 1


def _exchange_round(t: int, late: int, copies: Sequence[Copy]) -> Round:
    swap: tuple[Transfer, ...] = ()
    if t < late:
        swap = (Transfer(t, late, t, Op.REDUCE), Transfer(late, t, t, Op.REDUCE))
    return swap + tuple(Transfer(s, d, c, Op.COPY) for s, d, c in sorted(copies))
