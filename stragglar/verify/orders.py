"""Whether every rank ends with each chunk added in one order: what floating point needs beyond a proof.

A proof (:mod:`stragglar.verify.simulate`) shows that every rank ends with every contribution to
every chunk exactly once, which makes the sums exact in exact arithmetic.  Floating-point
addition is commutative but not associative: two ranks that group the same contributions
differently end with other last bits (1e8, -1e8 and 1 in float32: 1.0 on one rank, 0.0 on
another), and replicas of a model that should stay identical drift apart.  So a value is taken
here as the tree of its additions, each addition a pair taken either way round (``a + b`` and
``b + a`` are the same bits), interned to a number (:class:`Orders`): two values are added alike
exactly when their numbers are equal.  Every schedule stragglar generates gives every rank one
order per chunk; a schedule from elsewhere that does not is still a correct AllReduce, and
``verify`` says so with a warning.  The device program's prover holds a table to its schedule's
orders (:func:`final_orders`).

>>> from stragglar.schedule import Op, Phase, Schedule, Transfer
>>> R = Op.REDUCE
>>> swap = (Transfer(0, 1, 0, R), Transfer(1, 0, 0, R))
>>> order_disagreement(Schedule("swap", 2, 1, None, (Phase("p", (0, 1), (swap,)),))) is None
True
"""

from __future__ import annotations

from collections.abc import Sequence

from stragglar.errors import shown
from stragglar.schedule import Op, Schedule, gc_paused
from stragglar.verify.report import check_header

__all__ = ["Orders", "disagreement", "final_orders", "order_disagreement"]


class Orders:
    """Orders of addition interned to numbers: ``0 .. N-1`` are the ranks' own contributions (to
    the chunk at hand: values never move between chunks), each new addition the next number."""

    def __init__(self, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self._numbers: dict[tuple[int, int], int] = {}
        self._pairs: list[tuple[int, int]] = []

    def add(self, a: int, b: int) -> int:
        """The number of ``a + b`` (the same as ``b + a``'s)."""
        pair = (a, b) if a <= b else (b, a)
        number = self._numbers.get(pair)
        if number is None:
            number = self._numbers[pair] = self.num_ranks + len(self._pairs)
            self._pairs.append(pair)
        return number

    def text(self, number: int) -> str:
        """The order as a sum of rank numbers, ``(0 + 2) + (1 + 3)``, cut where long."""
        parts: list[str] = []
        stack: list[int | str] = [number]
        while stack:  # iterative: a chain of 2,000 additions would pass Python's recursion limit
            item = stack.pop()
            if isinstance(item, str):
                parts.append(item)
            elif item < self.num_ranks:
                parts.append(str(item))
            else:
                a, b = self._pairs[item - self.num_ranks]
                stack += [")", b, " + ", a, "("]
        text = "".join(parts)
        return shown(text[1:-1] if number >= self.num_ranks else text)  # its outer pair goes


def final_orders(schedule: Schedule, orders: Orders) -> list[int]:
    """Each (rank, chunk)'s order of additions at the end of ``schedule``, index ``rank * C +
    chunk``: every transfer of a round reads the values from before the round, a reduce adds the
    source's to the destination's, a copy takes the source's (the IR's semantics, which the
    runtime's interpreter follows)."""
    n, c = check_header(schedule).num_ranks, schedule.num_chunks
    state = [rank for rank in range(n) for _ in range(c)]
    # Every reduce interns a pair for good: a million small tuples at N = 1024, whose allocation
    # set off 1,500 collections, the young pairs walked again by each and the whole schedule too
    # by the oldest (its transfers hold an Op, so they stay tracked): in `verify`, just after the
    # schedule was read, 0.6 s of these 1.8 s, and 8% of the command.  Paused, the pairs are
    # walked once, after; nothing here makes a cycle to collect.
    with gc_paused():
        for phase in schedule.phases:
            for rnd in phase.rounds:
                writes = [(t.dst * c + t.chunk, state[t.src * c + t.chunk], t.op is Op.REDUCE) for t in rnd]
                for key, value, reduce in writes:
                    state[key] = orders.add(state[key], value) if reduce else value
    return state


def order_disagreement(schedule: Schedule) -> str | None:
    """Where two ranks end with one chunk added in different orders (the first such chunk, in
    words), or None where every chunk is added alike on every rank.  Meaningful for a proved
    schedule (a wrong one disagrees in more than order)."""
    n, c = check_header(schedule).num_ranks, schedule.num_chunks
    orders = Orders(n)
    state = final_orders(schedule, orders)
    return disagreement(orders, [state[rank * c : (rank + 1) * c] for rank in range(n)], "ranks")


def disagreement(orders: Orders, ends: Sequence[Sequence[int]], holders: str) -> str | None:
    """The first chunk that two of ``ends`` (each holder's order numbers, chunk by chunk: a rank's,
    a GPU's) add in different orders, in words naming them as ``holders`` ("ranks", "gpus"); None
    where they all agree.  The one wording for the schedule's check and the executors' provers."""
    first = ends[0]
    for chunk, order in enumerate(first):
        other = next((k for k in range(1, len(ends)) if ends[k][chunk] != order), None)
        if other is not None:
            return (
                f"{holders} 0 and {other} end with chunk {chunk} added in different orders "
                f"({orders.text(order)} and {orders.text(ends[other][chunk])}): in floating "
                "point their results differ in the last bits, and replicas drift apart"
            )
    return None
