"""StragglAR AllReduce for any number of GPUs and any straggler rank.

Phase 1 (``reduce-scatter``) runs among the n-1 punctual GPUs while the straggler is late:
a ring ReduceScatter leaves GPU ``g`` with chunk ``g`` summed over them.  Phase 2
(``exchange``) starts when the straggler arrives: in round ``t < n-1`` GPU ``t`` and the
straggler swap chunk ``t`` and both add, which completes it; around those exchanges the other
GPUs copy completed chunks on.  Phase 2 needs at least :func:`round_lower_bound` rounds; powers
of two reach it by construction, other sizes by a greedy search with bounded backtracking, then
one more round until it fits.
"""

from __future__ import annotations

from stragglar import __version__
from stragglar.schedule import Op, Phase, Round, Schedule, Transfer, move_straggler
from stragglar.synth.ring import ring_reduce_scatter
from stragglar.synth.stragglar_greedy import greedy_copy_rounds
from stragglar.synth.stragglar_pow2 import pow2_copy_rounds

__all__ = ["round_lower_bound", "stragglar_allreduce"]

# Chunk placements the search may make per round count before trying one more round: enough
# for n = 1023 to reach the bound (about 14,000 placements).
SEARCH_BUDGET = 16384

Copy = tuple[int, int, int]


def round_lower_bound(num_ranks: int) -> int:
    """R*(n) = n - 2 + ceil(log2 n): phase-2 rounds no StragglAR schedule can beat.

    The straggler completes one chunk per round, so the last is done after round n-2 with two
    holders; doubling to n holders takes ceil(log2 n) - 1 more rounds.

    >>> [round_lower_bound(n) for n in (2, 3, 4, 6, 8)]
    [1, 3, 4, 7, 9]
    """
    if num_ranks < 2:
        raise ValueError(f"StragglAR needs at least 2 GPUs, got {num_ranks}")
    return num_ranks - 2 + max(1, (num_ranks - 1).bit_length())


def stragglar_allreduce(num_ranks: int, straggler: int | None = None) -> Schedule:
    """The StragglAR schedule for ``num_ranks`` GPUs, the straggler being ``straggler`` (default n-1).

    >>> s = stragglar_allreduce(8)
    >>> s.num_chunks, s.straggler_rounds, s.metadata["lower_bound"]
    (7, 9, 9)
    """
    n = num_ranks
    bound = round_lower_bound(n)
    copies, method = _copy_rounds(n, bound)
    late = n - 1
    others = tuple(range(late))
    exchange = tuple(_exchange_round(t, late, copies[t]) for t in range(len(copies)))
    phases = [Phase("exchange", tuple(range(n)), exchange)]
    if late > 1:
        phases.insert(0, Phase("reduce-scatter", others, ring_reduce_scatter(others, others)))
    metadata = {"generator": f"stragglar {__version__}", "method": method, "lower_bound": bound}
    schedule = Schedule("stragglar", n, late, late, tuple(phases), metadata=metadata)
    return schedule if straggler is None else move_straggler(schedule, straggler)


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


def _exchange_round(t: int, late: int, copies: list[Copy]) -> Round:
    swap: tuple[Transfer, ...] = ()
    if t < late:
        swap = (Transfer(t, late, t, Op.REDUCE), Transfer(late, t, t, Op.REDUCE))
    return swap + tuple(Transfer(s, d, c, Op.COPY) for s, d, c in sorted(copies))
