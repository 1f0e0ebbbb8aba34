"""The steady state of chunked StragglAR: one cyclic walk that every punctual rank follows.

Setting: ``m = n - 1`` punctual ranks, straggler ``m``, ``C >= m`` chunks, chunk ``c`` owned by
rank ``c mod m`` and completed by its exchange with the straggler in round ``c``.  Write
``L = ceil(log2 n)`` and ``top = L + 1``.  The *age* of chunk ``c`` in round ``t`` is ``t - c``.

**Cyclic design.**  Rank ``r`` in round ``t`` stands at *position* ``(t - r) mod m`` of a walk
of length ``m``; position 0 is its exchange.  Shifting rank, round and chunk by one maps the
schedule to itself, so it is enough to say what a rank does at each position: receive the chunk
of a given age and send the chunk of a given age.  In each round the ``m`` ranks occupy the
``m`` positions once each, so the senders and receivers of each age can be paired by position.

**States.**  A rank's state is the pair of ages in ``1..top`` whose chunks it holds at the start
of a round (chunks older than ``top`` are held by every rank).  Holding exactly two means it
misses ``L - 1`` recent chunks at every moment, which is forced: a cyclic walk wastes no receive
after the first rounds, and the ramp-up then uses up all the slack the bound leaves
(``(L - 1) m`` receives), so the tail (the ``L - 1`` rounds after the last exchange) must use
every receive too.  One round moves a state as follows: every age grows by one and the age
received joins it; the age that reaches ``top + 1`` is complete everywhere and leaves.  A rank
that lacks age ``top`` must receive it now (the walk may not let a chunk get older than ``top``
somewhere); one that holds it may receive any younger age, or exchange (the new chunk, age 0).

**Balance.**  The walk is valid when, for every age, as many positions receive it as send it:
any holder may feed any rank that lacks a chunk, so the pairing is then a perfect matching in
every round.  Finding a walk is a small integer problem over transition counts (a circulation
in the graph of states with one exchange edge and length ``m``), whose Eulerian circuits are the
walks; any circuit serves.  For a power of two it has a closed form, the paper's group model:
``2**(a-1)`` *jumps* of age ``a`` (a rank that holds the oldest ages grabs a young chunk) and fill-ins
of age ``L`` otherwise (:func:`pow2_walk`).  Other sizes are solved with z3 (:func:`candidate_walks`,
well under a second even for ``n = 1000``).

**Ramp-up.**  Truncating the infinite walk to chunks ``0..C-1`` is itself a schedule: a chunk
only ever spreads from holders that got it in earlier rounds, so dropping the copies of chunks
``< 0`` (which do not exist) removes no copy that a real chunk needs.

**Tail.**  The population at round ``C`` (the states along the walk) must admit a perfect tail;
the solver also chooses how the ranks group into *units* for :mod:`stragglar.synth.chunked_tail`
(see there), which is what makes the tail constructive.  For 63 sizes up to 2048 no unit
structure of levels 1-2 exists; they get a walk of group-model moves and a searched tail.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Held",
    "Step",
    "Unit",
    "Walk",
    "candidate_walks",
    "next_held",
    "pow2_walk",
    "steady_rounds",
]

Held = tuple[int, int]  # the two ages held among 1..top, ascending
Copy = tuple[int, int, int]  # (src, dst, chunk)
_Kind = tuple[int, tuple[Held, ...], Any]  # a unit kind of the model: token, members, how many

# Unit sizes allowed at each tail level (see chunked_tail): level 1 pairs or singles, level 2
# pairs or triples; level 0 (powers of two) has singles only.
_UNIT_SIZES = {1: (1, 2), 2: (2, 3)}
_SEARCHED = 16  # walks without units offered to the tail search before giving up


@dataclass(frozen=True)
class Step:
    """What a rank does at one position of the walk: ``recv`` 0 and ``send`` 0 at the exchange."""

    held: Held
    recv: int
    send: int


@dataclass(frozen=True)
class Unit:
    """Ranks that act as one node of the tail's hypercube: ``token`` is the node's young age."""

    token: int
    members: tuple[Held, ...]


@dataclass(frozen=True)
class Walk:
    """A cyclic walk for ``len(steps)`` punctual ranks and the unit structure of its tail.

    ``level`` is the tail level ``j``: the hypercube has ``L - j`` dimensions and the units
    finish among themselves in ``j`` rounds; None means no units, the tail is searched for.
    """

    top: int
    steps: tuple[Step, ...]
    level: int | None
    units: tuple[Unit, ...]

    @property
    def depth(self) -> int:
        """``L = ceil(log2 n)``."""
        return self.top - 1


def next_held(held: Held, recv: int, top: int) -> Held:
    """The state one round later; ``recv`` 0 is the exchange (the new chunk arrives at age 1).

    >>> next_held((2, 4), 1, 4), next_held((1, 3), 4, 4), next_held((3, 4), 0, 4)
    ((2, 3), (2, 4), (1, 4))
    """
    ages = {age + 1 for age in held} | {recv + 1}
    ages.discard(top + 1)
    p, q = sorted(ages)
    return p, q


def _receivable(held: Held, top: int) -> list[int]:
    """Ages a rank may receive (0: exchange): ``top`` if it lacks it, else any younger one."""
    if held[1] != top:
        return [top]
    return [0] + [a for a in range(1, top) if a != held[0]]


def steady_rounds(walk: Walk, num_chunks: int) -> list[list[Copy]]:
    """The copies of exchange rounds ``0..num_chunks-1``, from the walk truncated to real chunks."""
    m = len(walk.steps)
    pairs = list(_pairing(walk))
    rounds: list[list[Copy]] = []
    for t in range(num_chunks):
        rounds.append([((t - sender) % m, (t - pos) % m, t - age) for pos, sender, age in pairs if t >= age])
    return rounds


def _pairing(walk: Walk) -> Iterator[tuple[int, int, int]]:
    """``(receiver position, sender position, age)``: the i-th receiver of an age gets it from
    the i-th sender of that age, both in position order."""
    by_age: dict[int, tuple[list[int], list[int]]] = {}
    for pos, step in enumerate(walk.steps):
        if pos:
            by_age.setdefault(step.recv, ([], []))[0].append(pos)
            by_age.setdefault(step.send, ([], []))[1].append(pos)
    for age in sorted(by_age):
        receivers, senders = by_age[age]
        if len(receivers) != len(senders):  # pragma: no cover - the walk's balance guarantees it
            raise AssertionError(f"age {age}: {len(receivers)} receivers, {len(senders)} senders")
        for pos, sender in zip(receivers, senders, strict=True):
            yield pos, sender, age


def pow2_walk(num_ranks: int) -> Walk:
    """The group model for ``num_ranks = 2**L``: an exchange block and ``2**(a-1)`` jumps of age ``a``.

    ``G = (L, top)`` holds the oldest incomplete chunk.  The exchange block is G's exchange, then
    ``L - 1`` fill-ins of age ``L`` while the rank's own chunk ages (``(p, top)`` sends ``p``); a
    jump of age ``a`` is G receiving age ``a`` (G sends ``L``), then fill-ins until the grabbed
    chunk is ``L`` old.  With ``2**(a-1)`` jumps of age ``a`` every age is sent as often as it is
    received: ``(a, top)`` is visited ``2**(a-1)`` times, and the ``2**(L-1) - 1`` fill-ins of age
    ``L`` match G's ``2**(L-1)`` visits less its exchange.  Every state is a single unit (tail
    level 0: the hypercube of :mod:`stragglar.synth.chunked_tail` on all ranks).

    >>> [(s.held, s.recv, s.send) for s in pow2_walk(4).steps]
    [((2, 3), 0, 0), ((1, 3), 2, 1), ((2, 3), 1, 2)]
    """
    depth = num_ranks.bit_length() - 1
    if num_ranks < 4 or num_ranks & (num_ranks - 1):
        raise ValueError(f"pow2_walk needs a power of two >= 4, got {num_ranks}")
    top = depth + 1
    steps = [Step((depth, top), 0, 0)] + [Step((p, top), depth, p) for p in range(1, depth)]
    for a in range(1, depth):
        block = [Step((depth, top), a, depth)] + [Step((p, top), depth, p) for p in range(a + 1, depth)]
        steps += block * (1 << (a - 1))
    units = tuple(Unit(step.held[0], (step.held,)) for step in steps)
    return Walk(top, tuple(steps), 0, units)


def candidate_walks(num_ranks: int) -> Iterator[Walk]:
    """Walks for ``num_ranks >= 4``, best first: :func:`pow2_walk`; else the integer model's walk
    with tail level 1, else level 2, else up to ``_SEARCHED`` walks of group-model moves only
    whose tail is left to a search (``level`` None), each one a new solution.

    Levels 1 and 2 exist for every size up to 2048 but 63 just above a power of two (65,
    129-131, 257-263, 513-529, 1025-1059).  Every call solves afresh in its own z3 context, so the walks
    do not depend on what was solved before.
    """
    if num_ranks & (num_ranks - 1) == 0:
        yield pow2_walk(num_ranks)
        return
    m = num_ranks - 1
    top = m.bit_length() + 1
    for level, sizes in _UNIT_SIZES.items():
        found = next(_solutions(m, top, level, sizes), None)
        if found is not None:
            yield found
            break
    yield from itertools.islice(_solutions(m, top, None, ()), _SEARCHED)


def _group_move(held: Held, recv: int, top: int) -> bool:
    """Moves of the group model and early jumps, the walks whose tails the search handles well:
    G = (top-1, top) exchanges or jumps, ``(p, top)`` fills in ``top - 1`` (or jumps early one round
    before reaching G, then fills in the age it skipped one round late)."""
    depth = top - 1
    if recv == 0:
        return held == (depth, top)
    return held[1] != top or held[0] in (depth, depth - 1) or recv == depth


def _unit_types(token: int, top: int, level: int, sizes: Sequence[int]) -> list[tuple[Held, ...]]:
    """Multisets of states that together hold the unit's ages: ``token`` and the ``level + 1``
    oldest; a single must hold ``token`` itself (it sends it in the hypercube)."""
    ages = {token, *range(top - level, top + 1)}
    states = list(itertools.combinations(sorted(ages), 2))
    types: list[tuple[Held, ...]] = []
    for size in sizes:
        for combo in itertools.combinations_with_replacement(states, size):
            held = {a for s in combo for a in s}
            if held == ages or (size == 1 and token in held):
                types.append(tuple((s[0], s[1]) for s in combo))
    return types


def _solutions(m: int, top: int, level: int | None, sizes: Sequence[int]) -> Iterator[Walk]:
    """Successive walks of the integer model for tail ``level`` (None: group moves, no units)."""
    import z3  # only sizes that are not powers of two need the solver

    ctx = z3.Context()
    zero = z3.IntVal(0, ctx)
    states = [(p, q) for q in range(2, top + 1) for p in range(1, q)]
    moves = [(h, a, next_held(h, a, top)) for h in states for a in _receivable(h, top)]
    if level is None:
        moves = [mv for mv in moves if _group_move(mv[0], mv[1], top)]
    uses = [z3.Int(f"x{i}", ctx) for i in range(len(moves))]
    solver = z3.Solver(ctx=ctx)
    solver.set("random_seed", 0)
    solver.add(*[c >= 0 for c in uses])
    solver.add(z3.Sum([c for c, (_, a, _) in zip(uses, moves, strict=True) if a == 0]) == 1)
    visits: dict[Held, Any] = {}
    sends: dict[tuple[Held, int], Any] = {}
    for h in states:
        out = [c for c, mv in zip(uses, moves, strict=True) if mv[0] == h]
        inn = [c for c, mv in zip(uses, moves, strict=True) if mv[2] == h]
        visits[h] = z3.Sum([zero, *out])
        solver.add(z3.Sum([zero, *inn]) == visits[h])
        exch = [c for c, mv in zip(uses, moves, strict=True) if mv[0] == h and mv[1] == 0]
        for age in h:
            sends[h, age] = z3.Int(f"s{h[0]}_{h[1]}_{age}", ctx)
            solver.add(sends[h, age] >= 0)
        solver.add(sends[h, h[0]] + sends[h, h[1]] == visits[h] - z3.Sum([zero, *exch]))
    for age in range(1, top + 1):
        received = [c for c, mv in zip(uses, moves, strict=True) if mv[1] == age]
        senders = [v for (h, a), v in sends.items() if a == age]
        solver.add(z3.Sum([zero, *received]) == z3.Sum([zero, *senders]))
    solver.add(z3.Sum(list(visits.values())) == m)
    kinds = [] if level is None else _add_units(solver, visits, top, level, sizes, ctx)
    while solver.check() == z3.sat:
        model = solver.model()
        value = [model.eval(c).as_long() for c in uses]
        steps = _circuit(moves, value)
        if len(steps) == m:  # else the circulation fell apart into several cycles
            sent = {key: model.eval(v).as_long() for key, v in sends.items()}
            units = tuple(
                Unit(token, members)
                for token, members, var in kinds
                for _ in range(model.eval(var).as_long())
            )
            yield Walk(top, _assign_sends(steps, sent), level, units)
        solver.add(z3.Or([c != v for c, v in zip(uses, value, strict=True)]))


def _add_units(
    solver: Any, visits: dict[Held, Any], top: int, level: int, sizes: Sequence[int], ctx: Any
) -> list[_Kind]:
    """Constrain the population (the states along the walk) to split into the tail's units:
    ``2**(t-1)`` units of token ``t`` for every node age of the ``top - 1 - level`` cube."""
    import z3

    kinds: list[_Kind] = []
    for token in range(1, top - level):
        row = []
        for members in _unit_types(token, top, level, sizes):
            var = z3.Int(f"u{token}_{len(kinds)}", ctx)
            solver.add(var >= 0)
            kinds.append((token, members, var))
            row.append(var)
        solver.add(z3.Sum(row) == 1 << (token - 1))
    for h, visited in visits.items():
        # only the kinds that hold h: building a term per kind is most of the model's time
        terms = [v if k == 1 else v * k for _, members, v in kinds if (k := members.count(h))]
        solver.add(visited == z3.Sum([z3.IntVal(0, ctx), *terms]))
    if level == 1:  # the last round pairs singles lacking top-1 with singles lacking top
        lack_top = [v for _, members, v in kinds if len(members) == 1 and members[0][1] != top]
        lack_before = [v for _, members, v in kinds if len(members) == 1 and members[0][1] == top]
        gap = z3.Sum([z3.IntVal(0, ctx), *lack_top]) - z3.Sum([z3.IntVal(0, ctx), *lack_before])
        solver.add(gap <= 1, gap >= -1)
    return kinds


def _circuit(moves: Sequence[tuple[Held, int, Held]], counts: Sequence[int]) -> list[tuple[Held, int]]:
    """An Eulerian circuit of the used moves (Hierholzer), starting with the exchange move.

    Returns ``(held, recv)`` per position; shorter than the walk if the moves are disconnected.
    """
    out: dict[Held, list[tuple[int, Held]]] = {}
    start: Held | None = None
    for (held, recv, nxt), k in zip(moves, counts, strict=True):
        out.setdefault(held, []).extend([(recv, nxt)] * k)
        if recv == 0 and k:
            start = held
    if start is None:  # pragma: no cover - the model has exactly one exchange
        raise AssertionError("no exchange in the walk")
    for edges in out.values():
        edges.sort()
    stack: list[tuple[Held, int]] = [(start, -1)]
    circuit: list[tuple[Held, int]] = []
    while stack:
        held, _ = stack[-1]
        edges = out.get(held, [])
        if edges:
            recv, nxt = edges.pop()
            stack.append((nxt, recv))
        else:
            circuit.append(stack.pop())
    circuit.reverse()  # nodes with the move that entered them; shift moves back onto their source
    walk = [(circuit[i][0], circuit[i + 1][1]) for i in range(len(circuit) - 1)]
    first = next(i for i, (_, recv) in enumerate(walk) if recv == 0)
    return walk[first:] + walk[:first]


def _assign_sends(steps: Sequence[tuple[Held, int]], sends: dict[tuple[Held, int], int]) -> tuple[Step, ...]:
    """Give each visit of a state one of the ages the model sends from it, in position order."""
    left = dict(sends)
    out: list[Step] = []
    for held, recv in steps:
        send = 0
        if recv:
            send = held[0] if left.get((held, held[0]), 0) else held[1]
            left[held, send] -= 1
        out.append(Step(held, recv, send))
    return tuple(out)
