"""The paper's naive straggler baseline: finish without the straggler, then fold it in."""

from __future__ import annotations

from stragglar.schedule import Op, Phase, Round, Schedule, Transfer, check_num_ranks, move_straggler
from stragglar.synth.ring import ring_allgather, ring_reduce_scatter

__all__ = ["direct_allreduce"]


def direct_allreduce(num_ranks: int, straggler: int | None = None) -> Schedule:
    """Direct: the n-1 others AllReduce during the delay, then one whole-buffer exchange
    with the straggler and a binomial broadcast of the result: ceil(log2 n) exposed rounds,
    each moving the whole buffer.

    >>> s = direct_allreduce(8)
    >>> s.straggler, s.exposed_rounds
    (7, 3)
    """
    n = check_num_ranks(num_ranks)
    late = n - 1
    others = tuple(range(late))
    chunks = range(late)
    hidden = ring_reduce_scatter(others, chunks) + ring_allgather(others, chunks)
    exchange = tuple(Transfer(a, b, c, Op.REDUCE) for a, b in ((0, late), (late, 0)) for c in chunks)
    rounds: list[Round] = [exchange]
    holders, waiting = [0, late], list(range(1, late))
    while waiting:
        pairs = list(zip(holders, waiting, strict=False))
        rounds.append(tuple(Transfer(src, dst, c, Op.COPY) for src, dst in pairs for c in chunks))
        holders += [dst for _, dst in pairs]
        waiting = waiting[len(pairs) :]
    phases = [Phase("exchange-broadcast", tuple(range(n)), tuple(rounds))]
    if hidden:
        phases.insert(0, Phase("allreduce-others", others, hidden))
    schedule = Schedule("direct", n, late, late, tuple(phases))
    return schedule if straggler is None else move_straggler(schedule, straggler)
