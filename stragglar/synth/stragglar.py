"""StragglAR AllReduce for any number of GPUs, any chunk count ``C >= n-1`` and any straggler.

Phase 1 (``reduce-scatter``) runs among the n-1 punctual GPUs while the straggler is late: a
ring ReduceScatter over blocks leaves chunk ``c`` summed over them at its owner ``c mod (n-1)``
(:func:`~stragglar.synth.chunked.chunk_owners`, balanced).  Phase 2 (``exchange``) starts when
the straggler arrives: in round ``t < C`` chunk ``t``'s owner and the straggler swap it and both
add, which completes it; around those exchanges the other GPUs copy completed chunks on.
Phase 2 needs at least ``C + ceil(log2 n) - 1`` rounds
(:func:`~stragglar.schedule.round_lower_bound`), and every schedule made here takes exactly that:

* ``C = n-1`` (the paper's algorithm, the default): powers of two by the paper's group
  construction (:mod:`~stragglar.synth.stragglar_pow2`), other sizes by the cyclic one;
* any ``C`` (chunked StragglAR): the cyclic construction (:mod:`~stragglar.synth.chunked`);
* ``n = 3`` cannot meet the bound with swaps once ``C > 2`` (the third rank has nobody to hear
  from during an exchange), so it uses :func:`three_rank_exchange`, which can; with ``C = 2``
  the swaps and one round of copies meet it.

Every StragglAR generator (these and the z3 one in :mod:`stragglar.synth.smt`) finds only the
copies; :func:`stragglar_schedule` assembles the phases around them.
"""

from __future__ import annotations

from collections.abc import Sequence

from stragglar.args import as_int
from stragglar.errors import InputError
from stragglar.schedule import (
    Op,
    Phase,
    Round,
    Schedule,
    Transfer,
    check_num_ranks,
    check_size,
    move_straggler,
    round_lower_bound,
)
from stragglar.synth.chunked import Copy, chunk_owners, chunked_copy_rounds
from stragglar.synth.ring import ring_reduce_scatter
from stragglar.synth.stragglar_pow2 import pow2_copy_rounds
from stragglar.version import __version__

__all__ = [
    "exchange_rounds",
    "owner_reduce_scatter",
    "stragglar_allreduce",
    "stragglar_schedule",
    "three_rank_exchange",
]


def stragglar_allreduce(
    num_ranks: int, straggler: int | None = None, num_chunks: int | None = None
) -> Schedule:
    """StragglAR for ``num_ranks`` GPUs in ``num_chunks`` chunks (default n-1, the paper's).

    >>> s = stragglar_allreduce(8)
    >>> s.num_chunks, s.exposed_rounds, s.metadata["lower_bound"], s.metadata["method"]
    (7, 9, 9, 'pow2-groups')
    >>> s = stragglar_allreduce(8, num_chunks=32)
    >>> s.num_chunks, s.exposed_rounds, s.metadata["lower_bound"]
    (32, 34, 34)
    """
    n = check_num_ranks(num_ranks)
    c = n - 1 if num_chunks is None else as_int(num_chunks, "num_chunks")
    if c < n - 1:
        raise InputError(f"StragglAR needs at least N - 1 = {n - 1} chunks, got {c}")
    check_size(n, c)
    if n == 3 or (c == n - 1 and n > 2 and n & (n - 1) == 0):
        owners = chunk_owners(n, c)
        if n == 3 and c > 2:
            exchange, method = three_rank_exchange(c), "three ranks"
        elif n == 3:  # the paper's: after both swaps, 2 gives 1 chunk 0 while 1 gives 0 chunk 1
            exchange, method = exchange_rounds(owners, [(), (), ((1, 0, 1), (2, 1, 0))]), "exchange"
        else:
            exchange, method = exchange_rounds(owners, pow2_copy_rounds(n)), "pow2-groups"
    else:
        plan = chunked_copy_rounds(n, c)
        owners = plan.owners
        exchange, method = exchange_rounds(owners, plan.rounds), plan.method
    schedule = stragglar_schedule(owners, exchange, method)
    return schedule if straggler is None else move_straggler(schedule, straggler)


def stragglar_schedule(owners: Sequence[int], exchange: Sequence[Round], method: str) -> Schedule:
    """The StragglAR schedule whose chunk ``c`` is owned by punctual GPU ``owners[c]``
    (:func:`~stragglar.synth.chunked.chunk_owners`, the one the exchange was built on) and whose
    phase 2 is ``exchange``; the straggler is the last GPU, ``max(owners) + 1``.

    The owner ReduceScatter among the punctual GPUs (:func:`owner_reduce_scatter`) comes first.
    """
    late = max(owners) + 1
    n, c = late + 1, len(owners)
    phases = [Phase("exchange", tuple(range(n)), tuple(exchange))]
    if late > 1:
        others = tuple(range(late))
        rs = owner_reduce_scatter(owners, others)
        phases.insert(0, Phase("reduce-scatter", others, rs))
    bound = round_lower_bound(n, c)
    metadata = {"generator": f"stragglar {__version__}", "method": method, "lower_bound": bound}
    return Schedule("stragglar", n, c, late, tuple(phases), metadata=metadata)


def exchange_rounds(owners: Sequence[int], copies: Sequence[Sequence[Copy]]) -> tuple[Round, ...]:
    """Phase 2 from its copies: round ``t < C`` also holds the owner's swap of chunk ``t`` with
    the straggler (rank ``max(owners) + 1``, the last one), both sides adding."""
    late = max(owners) + 1
    c = len(owners)
    reduce, copy = Op.REDUCE, Op.COPY
    rounds: list[Round] = []
    for t, rnd in enumerate(copies):
        transfers = (
            [Transfer(owners[t], late, t, reduce), Transfer(late, owners[t], t, reduce)] if t < c else []
        )
        transfers += [Transfer(s, d, k, copy) for s, d, k in sorted(rnd)]
        rounds.append(tuple(transfers))
    return tuple(rounds)


def owner_reduce_scatter(owners: Sequence[int], ranks: Sequence[int]) -> tuple[Round, ...]:
    """Ring ReduceScatter over ``ranks`` after which ``ranks[o]`` holds every chunk ``c`` with
    ``owners[c] == o`` summed over ``ranks``: :func:`ring_reduce_scatter` on blocks, block ``o``
    being the chunks ``ranks[o]`` owns, sent as several chunks per message.

    >>> [[(t.src, t.dst, t.chunk) for t in r] for r in owner_reduce_scatter((0, 1, 0), (0, 1))]
    [[(0, 1, 1), (1, 0, 0), (1, 0, 2)]]
    """
    blocks: list[list[int]] = [[] for _ in ranks]
    for chunk, owner in enumerate(owners):
        blocks[owner].append(chunk)
    ring = ring_reduce_scatter(ranks, range(len(ranks)))
    if list(owners) == list(range(len(ranks))):  # one chunk each (the paper's): the ring itself
        return ring
    reduce = Op.REDUCE
    return tuple(
        tuple([Transfer(t.src, t.dst, c, reduce) for t in rnd for c in blocks[t.chunk]]) for rnd in ring
    )


def three_rank_exchange(num_chunks: int) -> tuple[Round, ...]:
    """Phase 2 for 3 GPUs in ``C + 1`` rounds, the bound, for every ``C >= 2``.

    With swaps, the punctual rank outside an exchange has nobody free to hear from, so nothing
    spreads until the exchanges end and phase 2 takes ``C + ceil(C/2)`` rounds (the restricted
    SAT model in the tests proves that).  Here the straggler ``s = 2`` only *sends* its part:
    in round ``t`` it adds chunk ``t`` into its owner ``o(t) = t mod 2``, which completes it
    there; the owner of chunk ``t-1`` sends that complete chunk to ``s``, and ``o(t)`` sends
    chunk ``t-2`` to the other punctual rank.  Every rank sends once and receives once a round.
    The last chunk would need one round more, so its owner copies its punctual sum to the
    other rank in round 0 or 1 (whichever has both ports free), and in round ``C`` the
    straggler adds its part into that copy too.
    """
    c = num_chunks
    late, last = 2, c - 1
    rounds: list[list[Transfer]] = [[] for _ in range(c + 1)]
    for t in range(c + 1):
        if t < c:
            rounds[t].append(Transfer(late, t % 2, t, Op.REDUCE))
        if t >= 1:
            rounds[t].append(Transfer((t - 1) % 2, late, t - 1, Op.COPY))
        if t >= 2:
            rounds[t].append(Transfer(t % 2, (t - 1) % 2, t - 2, Op.COPY))
    owner = last % 2
    rounds[owner].append(Transfer(owner, 1 - owner, last, Op.COPY))
    rounds[c].append(Transfer(late, 1 - owner, last, Op.REDUCE))
    return tuple(tuple(r) for r in rounds)
