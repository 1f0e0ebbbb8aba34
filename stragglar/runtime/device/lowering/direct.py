"""Which transfers may skip the inbox: the ones the schedule's own messages already order.

A staged transfer moves each element twice (into the receiver's inbox, then into its chunk); a
direct one once (:mod:`~stragglar.runtime.device.table`).  A *push* writes the receiver's chunk
at the sender's time, so every earlier use of that chunk must already be done by then: the
receiver's own reads (its sends of the chunk) and writes (its landings into it), and any peer's
read of it.  A *pull* reads the sender's chunk at the receiver's time, so every later write of
that chunk (the sender's landings, a peer's push) must wait for it.  Neither adds a flag: a
transfer is made direct only where the flags the schedule raises anyway order those pairs.

*Events.*  Each rank's round ``k`` is two events: its sends (puts, pushes and the flags after
them) and its receives (waits and landings), in that order.  A message from ``s`` to ``r`` in
round ``k`` orders ``s``'s sends before ``r``'s receives (``r`` waits for ``s``'s flag), and a
rank's events follow each other.  One event is *before* another when a chain of these links
leads from it to the other; a vector clock per event (the latest event of each rank before it)
answers that, swept round by round with one clock per rank in memory.

*Both ways at once.*  Whether a peer reads a chunk at its own receives (a pull) or the owner at its
sends (a put or a push) depends on that peer's transfer's choice, and a write into a chunk
happens at the sender's sends (a push) or the receiver's receives (staged or pulled).  The
conditions below hold for either choice of every other transfer (the earlier of two possible
times for a later access, the later one for an earlier access), so each transfer is decided on
its own and the choices never undo each other.  The prover checks the result access by access,
knowing nothing of this.

A copy is pushed where it can be, else pulled where it can be; a sum is pulled or staged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from stragglar.runtime.program import RankProgram

__all__ = ["Landing", "Transfer", "landings"]

SENDS, RECEIVES = 0, 1  # a round's two events on a rank, in their order


class Landing(Enum):
    """How one transfer moves: through the receiver's inbox, or straight between buffers."""

    STAGED = "staged"
    PUSH = "push"
    PULL = "pull"


@dataclass(frozen=True, slots=True)
class Transfer:
    """One chunk moved in one round: ``sender``'s chunk ``chunk`` to ``receiver``, in round
    ``round`` (across phases), added (``reduce``) or copied."""

    sender: int
    receiver: int
    round: int
    chunk: int
    reduce: bool


Event = tuple[int, int, int]  # (rank, round, SENDS or RECEIVES)
Order = tuple[Event, Event]  # the first must be before the second


def landings(programs: Sequence[RankProgram]) -> dict[Transfer, Landing]:
    """Every transfer of the rank programs (one per rank, in rank order) with how it lands."""
    transfers = _transfers(programs)
    into: defaultdict[tuple[int, int], list[Transfer]] = defaultdict(list)  # (rank, chunk) -> in
    out_of: defaultdict[tuple[int, int], list[Transfer]] = defaultdict(list)  # (rank, chunk) -> out
    for t in transfers:
        into[(t.receiver, t.chunk)].append(t)
        out_of[(t.sender, t.chunk)].append(t)
    pushes = {t: _push_orders(t, into, out_of) for t in transfers if not t.reduce}
    pulls = {t: _pull_orders(t, into) for t in transfers}
    wanted = {order for orders in (*pushes.values(), *pulls.values()) if orders for order in orders}
    held = _held(programs, wanted)
    chosen: dict[Transfer, Landing] = {}
    for t in transfers:
        push, pull = pushes.get(t), pulls[t]
        if push is not None and push <= held:
            chosen[t] = Landing.PUSH
        elif pull is not None and pull <= held:
            chosen[t] = Landing.PULL
        else:
            chosen[t] = Landing.STAGED
    return chosen


def _transfers(programs: Sequence[RankProgram]) -> list[Transfer]:
    found = []
    for p in programs:
        for step in p.steps:
            for m in step.recvs:
                adds = m.reduce or (False,) * len(m.chunks)
                found += [
                    Transfer(m.peer, p.rank, step.round, c, a) for c, a in zip(m.chunks, adds, strict=True)
                ]
    return found


def _push_orders(
    t: Transfer, into: dict[tuple[int, int], list[Transfer]], out_of: dict[tuple[int, int], list[Transfer]]
) -> frozenset[Order] | None:
    """What must be before ``t``'s push (the sender's sends of its round), or None: never."""
    push: Event = (t.sender, t.round, SENDS)
    orders: set[Order] = set()
    for other in into[(t.receiver, t.chunk)]:
        if other.round == t.round and other != t:
            return None  # two writes of the chunk in one round: only the receiver can order them
        if other.round < t.round:  # an earlier write, landed at the receiver's receives at the latest
            orders.add(((t.receiver, other.round, RECEIVES), push))
    for read in out_of[(t.receiver, t.chunk)]:
        if read.round <= t.round:  # an earlier or same-round read: by its owner, or pulled by a peer
            orders.add(((t.receiver, read.round, SENDS), push))
            orders.add(((read.receiver, read.round, RECEIVES), push))
    return frozenset(orders)


def _pull_orders(t: Transfer, into: dict[tuple[int, int], list[Transfer]]) -> frozenset[Order]:
    """What must be after ``t``'s pull (the receiver's receives of its round): every later write
    of the sender's chunk, at the writer's sends at the earliest (a push)."""
    pull: Event = (t.receiver, t.round, RECEIVES)
    return frozenset(
        (pull, (w.sender, w.round, SENDS)) for w in into[(t.sender, t.chunk)] if w.round >= t.round
    )


def _held(programs: Sequence[RankProgram], wanted: set[Order]) -> set[Order]:
    """The orders of ``wanted`` that the messages and each rank's row order make, by one sweep
    of vector clocks over the rounds (clock[r][q]: the latest event of rank q before rank r's
    current one, as 2 * round + phase; -1: none)."""
    n = len(programs)
    rounds = 1 + max((s.round for p in programs for s in p.steps), default=-1)
    senders: defaultdict[tuple[int, int], set[int]] = defaultdict(set)  # (receiver, round) -> senders
    for p in programs:
        for step in p.steps:
            for m in step.recvs:
                senders[(p.rank, step.round)].add(m.peer)
    asked: defaultdict[Event, list[Order]] = defaultdict(list)  # keyed by the later event
    for order in wanted:
        asked[order[1]].append(order)
    held: set[Order] = set()
    clock = np.full((n, n), -1, dtype=np.int64)
    for k in range(rounds):
        for phase in (SENDS, RECEIVES):
            if phase == RECEIVES:
                before = clock.copy()  # every rank's sends of this round
                for r in range(n):
                    for s in senders.get((r, k), ()):
                        np.maximum(clock[r], before[s], out=clock[r])
            clock[np.arange(n), np.arange(n)] = 2 * k + phase
            for r in range(n):
                for order in asked.get((r, k, phase), ()):
                    rank, first_round, first_phase = order[0]
                    if clock[r, rank] >= 2 * first_round + first_phase:
                        held.add(order)
    return held
