"""Ring collectives over any ordered list of ranks: the classic bandwidth-optimal baseline."""

from __future__ import annotations

from collections.abc import Sequence

from stragglar.schedule import Op, Phase, Round, Schedule, Transfer

__all__ = ["ring_allgather", "ring_allreduce", "ring_reduce_scatter"]


def ring_reduce_scatter(ranks: Sequence[int], chunks: Sequence[int]) -> tuple[Round, ...]:
    """Rounds after which ``ranks[i]`` holds ``chunks[i]`` summed over all of ``ranks``.

    Each chunk travels once around the ring, gathering one contribution per hop.

    >>> [[(t.src, t.dst, t.chunk) for t in r] for r in ring_reduce_scatter([0, 1, 2], [0, 1, 2])]
    [[(0, 1, 2), (1, 2, 0), (2, 0, 1)], [(0, 1, 1), (1, 2, 2), (2, 0, 0)]]
    """
    p = len(ranks)
    return tuple(
        tuple(Transfer(ranks[i], ranks[(i + 1) % p], chunks[(i - 1 - k) % p], Op.REDUCE) for i in range(p))
        for k in range(p - 1)
    )


def ring_allgather(ranks: Sequence[int], chunks: Sequence[int]) -> tuple[Round, ...]:
    """Rounds that copy ``chunks[i]``, complete at ``ranks[i]``, to every rank of the ring."""
    p = len(ranks)
    return tuple(
        tuple(Transfer(ranks[i], ranks[(i + 1) % p], chunks[(i - k) % p], Op.COPY) for i in range(p))
        for k in range(p - 1)
    )


def ring_allreduce(num_ranks: int) -> Schedule:
    """Ring AllReduce: ``num_ranks`` chunks, a ReduceScatter then an AllGather, 2(n-1) rounds.

    >>> ring_allreduce(4).num_rounds
    6
    """
    ranks = chunks = tuple(range(num_ranks))
    phases = (
        Phase("reduce-scatter", ranks, ring_reduce_scatter(ranks, chunks)),
        Phase("allgather", ranks, ring_allgather(ranks, chunks)),
    )
    return Schedule("ring", num_ranks, num_ranks, None, phases)
