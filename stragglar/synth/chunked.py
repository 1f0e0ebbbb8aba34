"""Chunked StragglAR: ``C >= N - 1`` chunks, round-optimal exchange phases by construction.

The model (issue 14): ``N`` ranks, the straggler is rank ``N - 1``, chunk ``c`` is owned by
punctual rank ``o(c) = c mod (N - 1)`` (a balanced assignment: each owns ``floor`` or ``ceil`` of
``C / (N - 1)``), and after the hidden ReduceScatter among the punctual ranks chunk ``c`` is summed
over them at its owner.  In exchange round ``c < C`` the owner and the straggler swap chunk ``c``
and add, which completes it at both; every other transfer copies a complete chunk from a holder
to a rank that lacks it.  Each rank sends at most one chunk to one peer and receives at most one
per round, so the exchange keeps both ports of both ranks busy.

**Lower bound** (:func:`chunked_lower_bound`): the straggler completes one chunk per round, so
the last one is complete at two ranks after round ``C - 1`` and needs ``ceil(log2 N) - 1``
doublings: ``C + ceil(log2 N) - 1`` rounds.

**Construction** (``N >= 4``): every punctual rank follows one cyclic walk, shifted by its
index, for the exchange rounds (:mod:`stragglar.synth.chunked_steady`), and the ``L - 1`` rounds
after the last exchange finish on a hypercube of single ranks or small units
(:mod:`stragglar.synth.chunked_tail`).  It meets the bound for every ``C >= N - 1`` and every
``N`` from 4 to 1024 checked (all of them for ``C = N - 1``; every ``C`` up to 256 for
``N <= 64``; powers of two up to ``C = 4096``), in time linear in the number of copies plus a
small z3 model for sizes that are not powers of two.  For 28 sizes just above a power of two
(65, 129-131, 257-263, 513-529) no unit structure exists and the tail is found by a bounded
greedy search instead, which met the bound on every one of them.

**N = 2**: the exchanges alone, ``C`` rounds (the bound).  **N = 3** cannot meet the bound for
``C > 2`` and needs exactly ``C + ceil(C / 2)`` rounds (:func:`chunked_optimum`).  Proof: in an
exchange round the owner and the straggler have both ports busy, so the third rank has nobody
to receive from; no copy happens before round ``C``.  Then rank 0 lacks the chunks rank 1 owns
and vice versa, ``ceil(C / 2)`` of them for one of the two, and a rank receives one chunk per
round.  The schedule: after the exchanges, per round the straggler sends rank 1 one of its
missing chunks while rank 1 sends rank 0 one of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from stragglar import __version__
from stragglar.schedule import Op, Phase, Round, Schedule, Transfer, move_straggler
from stragglar.synth.chunked_steady import steady_rounds
from stragglar.synth.chunked_tail import tail_rounds, walk_for
from stragglar.synth.ring import ring_reduce_scatter

__all__ = [
    "ChunkedRounds",
    "chunk_owners",
    "chunked_copy_rounds",
    "chunked_lower_bound",
    "chunked_optimum",
    "chunked_stragglar_allreduce",
    "owner_reduce_scatter",
]

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
        return chunked_lower_bound(self.num_ranks, self.num_chunks)


def chunked_lower_bound(num_ranks: int, num_chunks: int) -> int:
    """``C + ceil(log2 N) - 1``: exchange rounds no schedule of this kind can beat.

    >>> chunked_lower_bound(8, 7), chunked_lower_bound(8, 256), chunked_lower_bound(2, 5)
    (9, 258, 5)
    """
    _check_sizes(num_ranks, num_chunks)
    return num_chunks + max(1, (num_ranks - 1).bit_length()) - 1


def chunked_optimum(num_ranks: int, num_chunks: int) -> int:
    """The fewest exchange rounds possible: the bound, except ``C + ceil(C / 2)`` for ``N = 3``.

    >>> chunked_optimum(3, 2), chunked_optimum(3, 6), chunked_optimum(3, 7), chunked_optimum(12, 40)
    (3, 9, 11, 43)
    """
    if num_ranks == 3:
        _check_sizes(num_ranks, num_chunks)
        return num_chunks + (num_chunks + 1) // 2
    return chunked_lower_bound(num_ranks, num_chunks)


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
        return ChunkedRounds(n, c, owners, _three_rank_rounds(c), "three ranks")
    walk = walk_for(n)
    rounds = steady_rounds(walk, c) + tail_rounds(walk, c)
    method = {0: "cyclic hypercube", None: "cyclic, searched tail"}.get(
        walk.level, f"cyclic units (level {walk.level})"
    )
    return ChunkedRounds(n, c, owners, tuple(tuple(sorted(r)) for r in rounds), method)


def _three_rank_rounds(num_chunks: int) -> tuple[tuple[Copy, ...], ...]:
    """N = 3 (see the module docstring): nothing moves until the exchanges end, then two copies
    a round: the straggler fills rank 1's even chunks, rank 1 passes rank 0 its odd ones."""
    evens, odds = list(range(0, num_chunks, 2)), list(range(1, num_chunks, 2))
    after = [((2, 1, e),) + (((1, 0, odds[i]),) if i < len(odds) else ()) for i, e in enumerate(evens)]
    return ((),) * num_chunks + tuple(after)


def owner_reduce_scatter(owners: tuple[int, ...], ranks: tuple[int, ...]) -> tuple[Round, ...]:
    """Ring ReduceScatter over ``ranks`` after which ``ranks[o]`` holds every chunk ``c`` with
    ``owners[c] == o`` summed over ``ranks``: the ring of :func:`ring_reduce_scatter` on blocks,
    block ``o`` being the chunks owned by ``ranks[o]``, sent as several chunks per message.

    >>> [[(t.src, t.dst, t.chunk) for t in r] for r in owner_reduce_scatter((0, 1, 0), (0, 1))]
    [[(0, 1, 1), (1, 0, 0), (1, 0, 2)]]
    """
    blocks: list[list[int]] = [[] for _ in ranks]
    for chunk, owner in enumerate(owners):
        blocks[owner].append(chunk)
    ring = ring_reduce_scatter(ranks, range(len(ranks)))
    return tuple(
        tuple(Transfer(t.src, t.dst, c, Op.REDUCE) for t in rnd for c in blocks[t.chunk]) for rnd in ring
    )


def chunked_stragglar_allreduce(num_ranks: int, num_chunks: int, straggler: int | None = None) -> Schedule:
    """The chunked StragglAR schedule: a hidden owner ReduceScatter, then the exchange phase.

    >>> s = chunked_stragglar_allreduce(6, 20)
    >>> s.num_chunks, s.straggler_rounds, s.metadata["lower_bound"]
    (20, 22, 22)
    """
    plan = chunked_copy_rounds(num_ranks, num_chunks)
    late = num_ranks - 1
    exchange: list[Round] = []
    for t, copies in enumerate(plan.rounds):
        swap: tuple[Transfer, ...] = ()
        if t < num_chunks:
            owner = plan.owners[t]
            swap = (Transfer(owner, late, t, Op.REDUCE), Transfer(late, owner, t, Op.REDUCE))
        exchange.append(swap + tuple(Transfer(s, d, c, Op.COPY) for s, d, c in copies))
    phases = [Phase("exchange", tuple(range(num_ranks)), tuple(exchange))]
    if late > 1:
        others = tuple(range(late))
        phases.insert(0, Phase("reduce-scatter", others, owner_reduce_scatter(plan.owners, others)))
    metadata = {
        "generator": f"stragglar {__version__}",
        "method": plan.method,
        "lower_bound": plan.lower_bound,
        "optimum": chunked_optimum(num_ranks, num_chunks),
    }
    schedule = Schedule("stragglar-chunked", num_ranks, num_chunks, late, tuple(phases), metadata=metadata)
    return schedule if straggler is None else move_straggler(schedule, straggler)


def _check_sizes(num_ranks: int, num_chunks: int) -> None:
    if num_ranks < 2:
        raise ValueError(f"chunked StragglAR needs at least 2 ranks, got {num_ranks}")
    if num_chunks < num_ranks - 1:
        raise ValueError(f"need at least N - 1 = {num_ranks - 1} chunks, got {num_chunks}")
