"""The tail of chunked StragglAR: the ``L - 1`` rounds after the last exchange.

At round ``C`` every punctual rank holds two of the ages ``1..top`` (its walk state, see
:mod:`stragglar.synth.chunked_steady`; age ``a`` is chunk ``C - a``) and misses the other
``L - 1``; the straggler holds everything and is free to send.  ``L - 1`` rounds are left, so
every punctual rank must receive in every round.

**Hypercube (powers of two).**  Put the straggler at node 0 of an ``L``-cube and a rank holding
age ``t`` at a node ``y`` with ``bitlength(y) = t`` (the walk has ``2**(t-1)`` of them).  Round
``u`` pairs the nodes across dimension ``k = L-1-u``: the upper node sends age ``k + 1`` and the
lower node sends ``age(y mod 2**k)`` (``age(0) = 1``).  Before each round every sub-cube of
dimension ``k + 1`` looks like the whole cube one size down: its node ``p`` holds
``age(p)`` and every age above ``k + 1``; the swap gives both halves that shape for ``k``, so
after ``L - 1`` rounds everyone holds everything.

**Units (other sizes).**  For ``2**(L-1) < n < 2**L`` the same cube on ``D = L - level`` dimensions
is run by *units*: a unit is one rank or a few ranks that together hold the node's age and the
``level + 1`` oldest ages, and each of its ranks misses ``level`` of them on top of what the node
misses.  In a cube round the unit receives one chunk (one member takes it) and sends one
(a member that holds it); every other member receives a chunk it lacks from a fellow member, so
each member still receives once per round and still misses ``level`` of the unit's chunks.  After
the ``D - 1`` cube rounds the unit holds everything and its members swap the rest in ``level``
more rounds; ``D - 1 + level = L - 1``.  Lone ranks (level 1) miss one of the two oldest ages and
swap it with a lone rank missing the other one in the last round (the straggler serves one
left over).  Which member does what is a tiny search per unit (:func:`_unit_plan`); for pairs
with complementary holdings it always succeeds, as the receiver can always hand its partner
one of the partner's missing chunks.  How many units of each kind exist comes with the walk
(the integer model chooses the steady state so that its population splits this way).

**Search (63 sizes up to 2048).**  Where no unit split exists (sizes just above a power of two
from 65 on), the tail is found round by round by a min-cost-flow greedy (:func:`_searched_tail`), and
:func:`walk_for` moves on to the next walk of :func:`candidate_walks` should it fail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from stragglar.synth.chunked_steady import Held, Unit, Walk, candidate_walks

__all__ = ["tail_rounds", "walk_for"]

Copy = tuple[int, int, int]  # (src, dst, chunk)
Move = tuple[int, int, int]  # (src, dst, age): unit members, or positions in a searched tail
STRAGGLER = -1


@dataclass(frozen=True)
class _Turn:
    """A unit's part of one tail round: who takes the chunk coming in and who sends one out."""

    taker: int
    giver: int
    moves: tuple[Move, ...]


def _age(position: int) -> int:
    return max(1, position.bit_length())


@cache
def walk_for(num_ranks: int) -> Walk:
    """The first of :func:`candidate_walks` whose tail can be built (``num_ranks >= 4``).

    A walk without units needs a searched tail: every candidate is tried with the fast search
    on groups of ranks before any is tried with the slow search per rank.  Raises ValueError if
    none can (not seen for any size up to 1024).
    """
    for by_rank in (False, True):
        for walk in candidate_walks(num_ranks):
            if _unit_plans(walk) is not None or _searched_tail(walk, by_rank) is not None:
                return walk
    raise ValueError(f"no chunked StragglAR schedule found for {num_ranks} GPUs")


def tail_rounds(walk: Walk, num_chunks: int) -> list[list[Copy]]:
    """Copies of the ``L - 1`` rounds after the last exchange (round ``num_chunks`` on)."""
    m, c = len(walk.steps), num_chunks
    level = walk.level
    plans = _unit_plans(walk)
    if level is None or plans is None:
        # Searched once per walk, by position: rank r stands at position (c - r) mod m.
        searched = _searched_tail(walk, True)
        if searched is None:
            raise ValueError(f"no tail found for {m + 1} GPUs with this walk")
        return [
            [(m if s == STRAGGLER else (c - s) % m, (c - d) % m, c - age) for s, d, age in r]
            for r in searched
        ]
    units = sorted(walk.units, key=lambda u: u.token)
    dims = walk.depth - level
    pool: dict[Held, list[int]] = {}
    for rank in range(m):
        pool.setdefault(walk.steps[(c - rank) % m].held, []).append(rank)
    for ranks in pool.values():
        ranks.reverse()
    members = [[pool[h].pop() for h in unit.members] for unit in units]
    if any(pool.values()):  # pragma: no cover - the model ties units to the walk's states
        raise AssertionError("the walk's states do not split into its units")
    rounds: list[list[Copy]] = []
    for u in range(dims - 1):
        k = dims - 1 - u
        copies: list[Copy] = []
        for y in range(1 << dims):
            if not y >> k & 1:
                upper = y + (1 << k)
                src = STRAGGLER if y == 0 else members[y - 1][plans[y - 1][u].giver]
                copies.append((src, members[upper - 1][plans[upper - 1][u].taker], c - _age(y % (1 << k))))
                if y:
                    giver = members[upper - 1][plans[upper - 1][u].giver]
                    copies.append((giver, members[y - 1][plans[y - 1][u].taker], c - (k + 1)))
        for ranks, plan in zip(members, plans, strict=True):
            copies += [(ranks[s], ranks[d], c - age) for s, d, age in plan[u].moves]
        rounds.append(copies)
    for u in range(dims - 1, dims - 1 + level):
        copies = []
        for ranks, plan in zip(members, plans, strict=True):
            copies += [(ranks[s], ranks[d], c - age) for s, d, age in plan[u].moves]
        rounds.append(copies)
    if level:
        rounds[-1] += _lone_swaps(units, members, walk.top, c)
    straggler = m
    return [[(straggler if s == STRAGGLER else s, d, chunk) for s, d, chunk in r] for r in rounds]


@cache
def _unit_plans(walk: Walk) -> tuple[tuple[_Turn, ...], ...] | None:
    """Every unit's plan, units ordered by token (their cube positions); None if one has none."""
    if walk.level is None:
        return None
    units = sorted(walk.units, key=lambda u: u.token)
    dims = walk.depth - walk.level
    plans = []
    for y, unit in enumerate(units, start=1):
        plan = _unit_plan(unit.members, tuple(_external(y, dims)), walk.level, walk.top)
        if plan is None:
            return None
        plans.append(plan)
    return tuple(plans)


def _external(position: int, dims: int) -> list[tuple[int, int]]:
    """Per cube round, the age a node receives and the age it sends (0: nothing, to the straggler)."""
    out = []
    for u in range(dims - 1):
        k = dims - 1 - u
        if position >> k & 1:
            out.append((_age(position % (1 << k)), 0 if position == 1 << k else k + 1))
        else:
            out.append((k + 1, _age(position % (1 << k))))
    return out


def _lone_swaps(units: Sequence[Unit], members: Sequence[Sequence[int]], top: int, c: int) -> list[Copy]:
    """Level 1's last round for lone ranks: one missing ``top - 1`` swaps with one missing ``top``."""
    lack_before = [
        r[0] for u, r in zip(units, members, strict=True) if len(r) == 1 and u.members[0][1] == top
    ]
    lack_top = [r[0] for u, r in zip(units, members, strict=True) if len(r) == 1 and u.members[0][1] != top]
    copies: list[Copy] = []
    for a, b in zip(lack_before, lack_top, strict=False):
        copies += [(b, a, c - (top - 1)), (a, b, c - top)]
    rest = lack_before[len(lack_top) :] + lack_top[len(lack_before) :]
    if len(rest) > 1:  # pragma: no cover - the model keeps the two kinds within one of each other
        raise AssertionError("lone ranks do not pair up")
    for rank in rest:
        missing = top - 1 if rank in lack_before else top
        copies.append((STRAGGLER, rank, c - missing))
    return copies


@cache
def _unit_plan(
    held: tuple[Held, ...], external: tuple[tuple[int, int], ...], level: int, top: int
) -> tuple[_Turn, ...] | None:
    """Who does what inside a unit in each tail round, found by depth-first search (None: no way).

    ``external`` lists (age in, age out) per cube round; ``level`` rounds without outside traffic
    follow.  Every member receives exactly one missing chunk per round; the one taking the unit's
    incoming chunk is ``taker`` and the one sending its outgoing chunk is ``giver``.  The model
    does not check that its triples can do this; should one not (never seen), the tail falls
    back to the search.
    """
    if len(held) == 1:  # a lone rank is its own node; it gets its last chunk from _lone_swaps
        return tuple(_Turn(0, 0, ()) for _ in range(len(external) + level))
    return _search(tuple(frozenset(h) for h in held), external + ((0, 0),) * level, top)


def _search(
    state: tuple[frozenset[int], ...], rounds: tuple[tuple[int, int], ...], top: int
) -> tuple[_Turn, ...] | None:
    if not rounds:
        return () if all(len(h) == top for h in state) else None
    age_in, age_out = rounds[0]
    size = len(state)
    for taker in range(size) if age_in else [-1]:
        for giver in range(size) if age_out else [-1]:
            if age_out and age_out not in state[giver]:
                continue
            receivers = [i for i in range(size) if i != taker]
            senders = [i for i in range(size) if i != giver]
            for moves in _matchings(state, receivers, senders):
                after = [set(h) for h in state]
                if age_in:
                    after[taker].add(age_in)
                for _, d, age in moves:
                    after[d].add(age)
                rest = _search(tuple(frozenset(h) for h in after), rounds[1:], top)
                if rest is not None:
                    return (_Turn(taker, giver, moves), *rest)
    return None


def _matchings(
    state: tuple[frozenset[int], ...], receivers: list[int], senders: list[int]
) -> list[tuple[Move, ...]]:
    """Every way to give each receiver one chunk it lacks from a distinct sender holding it."""
    if not receivers:
        return [()]
    first, rest = receivers[0], receivers[1:]
    out: list[tuple[Move, ...]] = []
    for s in senders:
        if s == first:
            continue
        for age in sorted(state[s] - state[first]):
            for tail in _matchings(state, rest, [x for x in senders if x != s]):
                out.append(((s, first, age), *tail))
    return out


@cache
def _searched_tail(walk: Walk, by_rank: bool) -> tuple[tuple[Move, ...], ...] | None:
    """The tail for a walk without units, by position: a round-by-round min-cost-flow greedy.

    Each round is a min-cost flow in which every punctual rank receives one missing chunk.  A
    chunk that, even doubling from now on, could not reach all its ranks in the rounds left
    must go to enough ranks now (a lower bound on its flow); beyond that, chunks are preferred
    by how short their holders fall of doubling, nudged by age (``_NUDGES``).  The flow runs on
    groups of ranks holding the same ages (fast: a rank's future depends only on its holdings)
    and, if ``by_rank`` and no nudge completes, again per rank, which breaks ties differently.
    Bounded and deterministic; None if nothing completes.
    """
    for per_rank in (False, True) if by_rank else (False,):
        for nudge in _NUDGES[per_rank]:
            plan = _greedy([set(step.held) for step in walk.steps], walk.top, walk.depth - 1, nudge, per_rank)
            if plan is not None:
                return plan
    return None


_NUDGES = {False: (0, 1, 2, -1, -2, -3, 3, 10), True: (0, 1, 2)}


def _greedy(
    held: list[set[int]], top: int, num_rounds: int, nudge: int, by_rank: bool
) -> tuple[tuple[Move, ...], ...] | None:
    rounds: list[tuple[Move, ...]] = []
    total = len(held)
    for u in range(num_rounds):
        groups: dict[object, list[int]] = {}
        for r, h in enumerate(held):
            groups.setdefault(r if by_rank else tuple(sorted(h)), []).append(r)
        flow = _round_flow(groups, held, top, total, num_rounds - u, nudge)
        if flow is None:
            return None
        moves = _disaggregate(groups, flow, top)
        for _, r, age in moves:
            held[r].add(age)
        rounds.append(moves)
    return tuple(rounds)


def _round_flow(
    groups: dict[object, list[int]], held: list[set[int]], top: int, total: int, left: int, nudge: int
) -> dict[Any, dict[Any, int]] | None:
    import networkx as nx  # here, not at the top: only the searched tails need it, not every command

    graph = nx.DiGraph()
    for key, ranks in groups.items():
        h = held[ranks[0]]
        graph.add_edge("in", ("r", key), capacity=len(ranks), weight=0)
        graph.add_edge(("s", key), "out", capacity=len(ranks), weight=0)
        for age in range(1, top + 1):
            if age not in h:
                graph.add_edge(("r", key), ("c", age), capacity=len(ranks), weight=0)
    graph.add_edge(("s", STRAGGLER), "out", capacity=1, weight=0)
    for age in range(1, top + 1):
        holders = sum(age in h for h in held)
        needers = total - holders
        if not needers:
            continue
        sources = holders + 1  # and the straggler
        must = max(0, -(-(needers - sources * ((1 << (left - 1)) - 1)) // (1 << (left - 1))))
        weight = -(1000 * needers) // (sources * ((1 << left) - 1)) - nudge * (top - age)
        graph.add_edge(("c", age), ("m", age), capacity=must, weight=-(10**6))
        graph.add_edge(("c", age), ("o", age), capacity=total, weight=weight)
        graph.add_edge(("o", age), ("m", age), capacity=total, weight=0)
        graph.add_edge(("m", age), ("s", STRAGGLER), capacity=1, weight=0)
        for key, ranks in groups.items():
            if age in held[ranks[0]]:
                graph.add_edge(("m", age), ("s", key), capacity=len(ranks), weight=0)
    flow: dict[Any, dict[Any, int]] = nx.max_flow_min_cost(graph, "in", "out")
    return flow if sum(flow["in"].values()) == total else None


def _disaggregate(
    groups: dict[object, list[int]], flow: dict[Any, dict[Any, int]], top: int
) -> tuple[Move, ...]:
    """Turn group flows into moves: the ranks of a group take its receive counts in order, and
    the i-th receiver of an age gets it from the i-th sender of that age."""
    receivers: dict[int, list[int]] = {}
    senders: dict[int, list[int]] = {}
    idle = {key: list(ranks) for key, ranks in groups.items()}
    for key, ranks in groups.items():
        queue = list(ranks)
        for (_, age), amount in sorted(flow[("r", key)].items()):
            receivers.setdefault(age, []).extend(queue[:amount])
            del queue[:amount]
    for age in range(1, top + 1):
        for (_, key), amount in sorted(flow.get(("m", age), {}).items(), key=lambda kv: str(kv[0])):
            if key == STRAGGLER:
                senders.setdefault(age, []).extend([STRAGGLER] * amount)
            else:
                senders.setdefault(age, []).extend(idle[key][:amount])
                del idle[key][:amount]
    return tuple(
        (src, dst, age)
        for age in sorted(receivers)
        for dst, src in zip(receivers[age], senders[age], strict=True)
    )
