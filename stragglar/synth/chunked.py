"""Chunked StragglAR: ``C >= N - 1`` chunks, round-optimal exchange phases by construction.

The model (issue 14): ``N`` ranks, the straggler is rank ``N - 1``, chunk ``c`` is owned by
punctual rank ``o(c) = c mod (N - 1)`` (a balanced assignment: each owns ``floor`` or ``ceil`` of
``C / (N - 1)``), and after the hidden ReduceScatter among the punctual ranks chunk ``c`` is summed
over them at its owner.  In exchange round ``c < C`` the owner and the straggler swap chunk ``c``
and add, which completes it at both; every other transfer copies a complete chunk from a holder
to a rank that lacks it.  Each rank sends at most one chunk to one peer and receives at most one
per round, so the exchange keeps both ports of both ranks busy.

**Lower bound** (:func:`~stragglar.schedule.round_lower_bound`): the straggler completes one
chunk per round, so the last one is complete at two ranks after round ``C - 1`` and needs
``ceil(log2 N) - 1`` doublings: ``C + ceil(log2 N) - 1`` rounds.

**Construction** (``N >= 4``): every punctual rank follows one cyclic walk, shifted by its
index, for the exchange rounds (:mod:`stragglar.synth.chunked_steady`), and the ``L - 1`` rounds
after the last exchange finish on a hypercube of single ranks or small units
(:mod:`stragglar.synth.chunked_tail`).  It meets the bound for every ``C >= N - 1`` and every
``N`` checked: every ``N`` from 4 to 2048 for ``C = N - 1``, every ``C`` up to 256 for
``N <= 64``, powers of two up to ``C = 4096`` for powers of two ``N <= 1024``; in time linear in
the number of copies plus a small z3 model for sizes that are not powers of two.  For 63 sizes
just above a power of two (65, 129-131, 257-263, 513-529, 1025-1059) no unit structure exists
and the tail is found by a bounded greedy search instead, which met the bound on every one.

``N = 2`` needs no copies and ``N = 3`` no swaps (:mod:`stragglar.synth.stragglar` builds both);
the phases around these rounds are assembled there too.
"""

from __future__ import annotations

from dataclasses import dataclass

from stragglar.schedule import round_lower_bound
from stragglar.synth.chunked_steady import steady_rounds
from stragglar.synth.chunked_tail import tail_rounds, walk_for

__all__ = ["ChunkedRounds", "Copy", "chunk_owners", "chunked_copy_rounds"]

Copy = tuple[int, int, int]  # (src, dst, chunk)


@dataclass(frozen=True)
class ChunkedRounds:
    """The exchange phase: chunk owners and, per round, the copies besides the exchange.

    Round ``t < num_chunks`` also holds the exchange of chunk ``t`` between ``owners[t]`` and the
    straggler (rank ``num_ranks - 1``), which is not listed in ``rounds``.
    """

    num_ranks: int
    num_chunks: int
    owners: tuple[int, ...]
    rounds: tuple[tuple[Copy, ...], ...]
    method: str

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    @property
    def lower_bound(self) -> int:
        return round_lower_bound(self.num_ranks, self.num_chunks)


def chunk_owners(num_ranks: int, num_chunks: int) -> tuple[int, ...]:
    """``o(c) = c mod (N - 1)``: round-robin, so each punctual rank owns ``floor`` or ``ceil`` of ``C/(N-1)``.

    >>> chunk_owners(4, 5)
    (0, 1, 2, 0, 1)
    """
    _check_sizes(num_ranks, num_chunks)
    return tuple(c % (num_ranks - 1) for c in range(num_chunks))


def chunked_copy_rounds(num_ranks: int, num_chunks: int) -> ChunkedRounds:
    """Owners and copy rounds of an optimal exchange phase (see the module docstring).

    Raises ValueError for sizes out of range, or for the few ``N`` the construction lacks.

    >>> r = chunked_copy_rounds(8, 32)
    >>> r.num_rounds, r.lower_bound, r.method, sum(map(len, r.rounds))
    (34, 34, 'cyclic hypercube', 192)
    """
    owners = chunk_owners(num_ranks, num_chunks)
    n, c = num_ranks, num_chunks
    if n == 2:
        return ChunkedRounds(n, c, owners, ((),) * c, "exchange")
    if n == 3:
        raise ValueError("3 ranks cannot meet the bound with swaps: see three_rank_exchange")
    walk = walk_for(n)
    rounds = steady_rounds(walk, c) + tail_rounds(walk, c)
    method = {0: "cyclic hypercube", None: "cyclic, searched tail"}.get(
        walk.level, f"cyclic units (level {walk.level})"
    )
    return ChunkedRounds(n, c, owners, tuple(tuple(sorted(r)) for r in rounds), method)


def _check_sizes(num_ranks: int, num_chunks: int) -> None:
    if num_ranks < 2:
        raise ValueError(f"chunked StragglAR needs at least 2 ranks, got {num_ranks}")
    if num_chunks < num_ranks - 1:
        raise ValueError(f"need at least N - 1 = {num_ranks - 1} chunks, got {num_chunks}")
