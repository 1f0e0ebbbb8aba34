"""Ring collectives over any ordered list of ranks: the classic bandwidth-optimal baseline."""

from __future__ import annotations

from collections.abc import Sequence

from stragglar.schedule import Op, Phase, Round, Schedule, Transfer, check_num_ranks

__all__ = ["ring_allgather", "ring_allreduce", "ring_reduce_scatter"]


def ring_reduce_scatter(ranks: Sequence[int], chunks: Sequence[int]) -> tuple[Round, ...]:
    """Rounds after which ``ranks[i]`` holds ``chunks[i]`` summed over all of ``ranks``.

    Each chunk travels once around the ring, gathering one contribution per hop.

    >>> [[(t.src, t.dst, t.chunk) for t in r] for r in ring_reduce_scatter([0, 1, 2], [0, 1, 2])]
    [[(0, 1, 2), (1, 2, 0), (2, 0, 1)], [(0, 1, 1), (1, 2, 2), (2, 0, 0)]]
    """
    return _ring_rounds(ranks, chunks, 1, Op.REDUCE)


def ring_allgather(ranks: Sequence[int], chunks: Sequence[int]) -> tuple[Round, ...]:
    """Rounds that copy ``chunks[i]``, complete at ``ranks[i]``, to every rank of the ring."""
    return _ring_rounds(ranks, chunks, 0, Op.COPY)


def _ring_rounds(ranks: Sequence[int], chunks: Sequence[int], lag: int, op: Op) -> tuple[Round, ...]:
    """``p - 1`` rounds in which ``ranks[i]`` sends ``chunks[(i - lag - k) % p]`` to ``ranks[i + 1]``
    in round ``k``: whole rounds built by ``map`` over rotated lists, twice as fast as a
    transfer at a time, which counts at N ~ 1000 (a million transfers)."""
    p = len(ranks)
    senders, held = list(ranks), list(chunks)
    receivers, ops = senders[1:] + senders[:1], [op] * p
    rounds = []
    for k in range(p - 1):
        shift = (lag + k) % p  # the chunk list turned right by shift: held[(i - shift) % p] at i
        sent = held[p - shift :] + held[: p - shift]
        rounds.append(tuple(map(Transfer, senders, receivers, sent, ops)))
    return tuple(rounds)


def ring_allreduce(num_ranks: int) -> Schedule:
    """Ring AllReduce: ``num_ranks`` chunks, a ReduceScatter then an AllGather, 2(n-1) rounds.

    >>> ring_allreduce(4).num_rounds
    6
    """
    n = check_num_ranks(num_ranks)
    ranks = chunks = tuple(range(n))
    phases = (
        Phase("reduce-scatter", ranks, ring_reduce_scatter(ranks, chunks)),
        Phase("allgather", ranks, ring_allgather(ranks, chunks)),
    )
    return Schedule("ring", n, n, None, phases)
