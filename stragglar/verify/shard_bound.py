"""Lower bounds for a straggler-aware ReduceScatter and AllGather, by SAT (z3).

StragglAR gains on an AllReduce because the straggler's port carries its data out once and the
result in once, both ways at the same time, where Ring makes it carry (N-1)/N of the buffer
each way *twice*.  Does a ReduceScatter or an AllGather alone leave anything to gain?  The
question, in the AllReduce bound's round model (:mod:`stragglar.verify.bound`): ``n`` ranks,
the straggler ``n-1``, ``C`` chunks (a multiple of ``n``; chunk ``c`` belongs to the shard of
its owner ``c mod n``), and each round every rank sends at most one chunk to one peer and
receives at most one (a round that sends ``k`` chunks to one peer counts as ``k``).  The ``n-1``
punctual ranks may do anything while the straggler is late, so the model starts them from the
most they can have:

- **ReduceScatter**: every punctual rank holds ``P`` (the sum over the punctual ranks, as an
  AllReduce among them leaves it) of every chunk; the straggler holds its whole vector, ``Q``.
  At the end each owner holds ``P`` and ``Q`` of each chunk of its shard.
- **AllGather**: every punctual rank holds every punctual rank's shard (as an AllGather among
  them leaves it); the straggler holds its own.  At the end every rank holds every chunk.

How many rounds after the straggler arrives, and how many chunks through the straggler's port
(the larger of what it sends and what it receives, the time of a full-duplex link)?  By hand:
in a ReduceScatter ``Q`` of every chunk the straggler does not own must leave it, in an AllGather
every chunk it does not own must reach it, one chunk per round: ``C (n-1)/n`` chunks through its
port, and as many rounds (in the AllGather the straggler's own shard must also spread, in
``C/n + ceil(log2 n) - 1`` rounds, never more).
Ring, which runs when everybody is there, needs ``n-1`` steps of ``C/n`` chunks: the same
``C (n-1)/n`` rounds, and as many chunks each way through every port.  z3 checks both counts.

Why an unsat answer is a proof for real schedules: map each (rank, chunk) to the parts its value
has *ever* contained: ``P`` for any punctual contribution (with the AllGather, the chunk's data),
``Q`` for the straggler's.  A part arrives only with a send from a rank whose value contained it,
so every real schedule, whatever the punctual ranks did before, gives a solution of the model
with its own sends; an owner's correct sum contains both parts.  A solution is a real schedule
too, read with ``P`` the whole punctual sum (the start above is reachable), and the tests prove
the ones z3 returns by running them on distinct values.

The chunk count is a question about no particular number of rounds, so its query drops them
(:func:`port_feasible`): ``edge`` (``s`` sends chunk ``k`` to ``d`` in some round) and ``reach``
(``r`` holds part ``p`` of chunk ``k`` by a path of at most ``h`` such sends from where it
started); every real schedule gives a solution (a rank first gets a part from a rank that had it
earlier, so the first arrivals form paths of at most ``n-1`` sends), and the straggler sends at
least as many chunks as the distinct chunks it sends, which the query counts.  So its unsat holds
for schedules of any length.

Symmetry breaking (:func:`stragglar.verify.one_port.first_in_order`): the punctual ranks start
alike, and so do the chunks within each class below, so renaming them maps schedules to
schedules.  ReduceScatter: every chunk a punctual rank owns must leave the straggler (only it has
``Q``), one per round, so they first leave in order within an owner, and owners in owner order.
AllGather: the straggler's chunks first leave it in index order, the others first reach it in
index order.

>>> shard_feasible("reduce_scatter", 4, 2).status, shard_feasible("reduce_scatter", 4, 3).status
('unsat', 'sat')
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

import z3

from stragglar.args import as_int
from stragglar.errors import InputError
from stragglar.units import count_of
from stragglar.verify.bound import BOUND_MAX_RANKS, Feasibility
from stragglar.verify.one_port import (
    Start,
    decide,
    first_in_order,
    has,
    port_load,
    sends_found,
    spread,
    transfers,
)

__all__ = [
    "COLLECTIVES",
    "SHARD_MAX_SENDS",
    "ShardBound",
    "fewest_rounds",
    "port_feasible",
    "ring_rounds",
    "shard_bound",
    "shard_feasible",
    "start_parts",
]

COLLECTIVES = {"reduce_scatter": "ReduceScatter", "all_gather": "AllGather"}  # name: title
SHARD_MAX_SENDS = 1_000_000  # send variables of a query (rounds x N x (N-1) x C): z3's memory grows with them


@dataclass(frozen=True)
class ShardBound:
    """The three queries that settle a collective for ``num_ranks`` ranks and ``num_chunks`` chunks:
    one round fewer than :func:`fewest_rounds` (unsat proves it), one chunk fewer through the
    straggler's port in any number of rounds (unsat proves it), and both figures at once (sat
    exhibits a schedule that reaches them)."""

    collective: str
    num_ranks: int
    num_chunks: int
    rounds: int
    fewer_rounds: Feasibility
    fewer_chunks: Feasibility
    reached: Feasibility

    @property
    def port_chunks(self) -> int:
        """The fewest chunks through the straggler's port, claimed: one per round, every round."""
        return self.rounds

    @property
    def ring_rounds(self) -> int:
        return ring_rounds(self.num_ranks, self.num_chunks)

    @property
    def proved(self) -> bool:
        """Both counts proved minimal and reached together."""
        queries = (self.fewer_rounds, self.fewer_chunks, self.reached)
        return [q.status for q in queries] == ["unsat", "unsat", "sat"]

    @property
    def refuted(self) -> bool:
        """z3 fitted fewer than claimed, or nothing at the claim: a finding to report."""
        return "sat" in (self.fewer_rounds.status, self.fewer_chunks.status) or self.reached.status == "unsat"

    @property
    def lines(self) -> tuple[str, ...]:
        """What z3 proved, Ring's figures beside it, and the verdict; one line when it fell short.
        Counts go through :func:`~stragglar.units.count_of`: at N = C = 2 they are 1 (``1 round``)."""
        n, c, r = self.num_ranks, self.num_chunks, self.rounds
        what = f"{COLLECTIVES[self.collective]} for {n} GPUs and {c} chunks"
        fewer_rounds, fewer_chunks = count_of(r - 1, "round"), count_of(r - 1, "chunk")
        rounds, chunks = count_of(r, "round"), count_of(r, "chunk")
        if self.fewer_rounds.status == "sat":
            return (f"z3 fits the {what} in {fewer_rounds} after the straggler arrives, fewer than claimed",)
        if self.fewer_chunks.status == "sat":
            return (
                f"z3 fits the {what} with {fewer_chunks} through the straggler's port, fewer than claimed",
            )
        if self.reached.status == "unsat":
            return (f"z3 fits no {what} in {rounds} with {chunks} through the straggler's port",)
        if not self.proved:
            spent = sum(q.seconds for q in (self.fewer_rounds, self.fewer_chunks, self.reached))
            return (f"z3 gave no answer for the {what} in {spent:.1f} s",)
        ring = self.ring_rounds
        return (
            f"proved: no {what} fits in {fewer_rounds} after the straggler arrives, nor in any number "
            f"of rounds with fewer than {chunks} ({n - 1}/{n} of the buffer) through its port "
            f"(z3: unsat in {self.fewer_rounds.seconds:.2f} s and {self.fewer_chunks.seconds:.2f} s); "
            f"z3 fits {rounds} with {chunks} ({self.reached.seconds:.2f} s)",
            f"Ring: {count_of(ring, 'round')}, {count_of(ring, 'chunk')} through the straggler's port "
            "each way",
            _verdict(COLLECTIVES[self.collective], ring - r, ring - self.port_chunks),
        )


def _verdict(title: str, rounds: int, chunks: int) -> str:
    """``no gain: ...`` or ``gain: ...``, against Ring.

    >>> _verdict("AllGather", 0, 0)
    'no gain: a straggler-aware AllGather needs as many rounds and bytes after the straggler arrives as Ring'
    >>> _verdict("AllGather", 2, 0)
    'gain: 2 rounds and 0 chunks fewer than Ring after the straggler arrives'
    """
    if rounds <= 0 and chunks <= 0:
        return (
            f"no gain: a straggler-aware {title} needs as many rounds and bytes after the straggler "
            "arrives as Ring"
        )
    return (
        f"gain: {count_of(rounds, 'round')} and {count_of(chunks, 'chunk')} fewer than Ring after the "
        "straggler arrives"
    )


def fewest_rounds(num_ranks: int, num_chunks: int) -> int:
    """The claim z3 checks: the chunks that must leave (ReduceScatter) or reach (AllGather) the
    straggler, one per round: all but its own ``C/n``."""
    return num_chunks - num_chunks // num_ranks


def ring_rounds(num_ranks: int, num_chunks: int) -> int:
    """Ring's rounds, and chunks through each port each way: ``n-1`` steps of ``C/n`` chunks, one
    chunk a round (``stragglar.synth.ring``; the tests count them in its schedules)."""
    return (num_ranks - 1) * (num_chunks // num_ranks)


def shard_bound(
    collective: str, num_ranks: int, num_chunks: int | None = None, timeout_s: float | None = None
) -> ShardBound:
    """Ask the three queries of :class:`ShardBound`; ``timeout_s`` bounds them all together."""
    n = num_ranks
    c = n if num_chunks is None else num_chunks
    rounds = fewest_rounds(n, c)
    _checked(collective, n, c, rounds)
    deadline = None if timeout_s is None else time.perf_counter() + timeout_s

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.perf_counter())

    fewer_rounds = shard_feasible(collective, n, rounds - 1, None, left(), c)
    fewer_chunks = port_feasible(collective, n, rounds - 1, left(), c)
    reached = shard_feasible(collective, n, rounds, rounds, left(), c)
    return ShardBound(collective, n, c, rounds, fewer_rounds, fewer_chunks, reached)


def shard_feasible(
    collective: str,
    num_ranks: int,
    rounds: int,
    port_chunks: int | None = None,
    timeout_s: float | None = None,
    num_chunks: int | None = None,
) -> Feasibility:
    """Decide whether ``collective`` fits in ``rounds`` rounds after the straggler arrives, with at
    most ``port_chunks`` chunks sent and at most as many received by the straggler; if so, return
    the rounds found (copies and reduces, from the start of the module docstring).

    ``timeout_s`` bounds the wall-clock time, building the model included.
    """
    n = num_ranks
    c = n if num_chunks is None else num_chunks
    _checked(collective, n, c, rounds)
    status, model, seconds = decide(_constraints(collective, n, c, rounds, port_chunks), timeout_s)
    if model is None:
        return Feasibility(status, None, seconds)
    parts = _parts(collective)
    held = [[{p for p in parts if start_parts(collective, n, r, k, p)} for k in range(c)] for r in range(n)]
    return Feasibility("sat", transfers(held, sends_found(model, n, c, rounds)), seconds)


def port_feasible(
    collective: str,
    num_ranks: int,
    port_chunks: int,
    timeout_s: float | None = None,
    num_chunks: int | None = None,
) -> Feasibility:
    """Decide whether ``collective`` can end with the straggler sending at most ``port_chunks``
    distinct chunks and receiving at most as many, in any number of rounds (the model without
    rounds of the module docstring: a "sat" has no rounds to return)."""
    n = num_ranks
    c = n if num_chunks is None else num_chunks
    _checked(collective, n, c, n - 1)  # n - 1 hops: a query the size of n - 1 rounds
    status, _, seconds = decide(_paths(collective, n, c, port_chunks), timeout_s)
    return Feasibility(status, None, seconds)


def start_parts(collective: str, n: int, rank: int, chunk: int, part: int) -> bool:
    """Whether ``rank`` holds ``part`` of ``chunk`` when the straggler (``n-1``) arrives:
    ReduceScatter ``P`` (0) at every punctual rank and ``Q`` (1) at the straggler; AllGather a
    chunk's data (0) at its owner, and the punctual ranks' chunks at every punctual rank."""
    late = n - 1
    if collective == "reduce_scatter":
        return rank != late if part == 0 else rank == late
    return (rank == late) == (chunk % n == late)


def _parts(collective: str) -> tuple[int, ...]:
    return (0, 1) if collective == "reduce_scatter" else (0,)


def _goal(collective: str, n: int, c: int) -> Iterator[tuple[int, int, int]]:
    """The (rank, chunk, part) the collective must end with: ReduceScatter each owner both parts
    of its chunks, AllGather every rank every chunk."""
    if collective == "reduce_scatter":
        return ((k % n, k, p) for k in range(c) for p in _parts(collective))
    return ((r, k, 0) for r in range(n) for k in range(c))


def _checked(collective: str, n: int, c: int, rounds: int) -> None:
    """Refuse a query that is not one, or too large to build, before building it."""
    as_int(n, "num_ranks")  # a bool or a float would name z3's variables apart from the rest
    as_int(c, "num_chunks")
    as_int(rounds, "rounds")
    if collective not in COLLECTIVES:
        raise InputError(f"no bound for collective {collective!r}: {', '.join(COLLECTIVES)}")
    if not 2 <= n <= BOUND_MAX_RANKS or rounds < 0:
        raise InputError(
            f"need 2 to {BOUND_MAX_RANKS} GPUs and no negative rounds, got {count_of(n, 'GPU')}, "
            f"{count_of(rounds, 'round')}"
        )
    if c < n or c % n:
        raise InputError(f"need a multiple of {n} chunks (one shard per GPU), got {count_of(c, 'chunk')}")
    if rounds * n * (n - 1) * c > SHARD_MAX_SENDS:
        raise InputError(
            f"{count_of(rounds, 'round')} of {n} GPUs and {c} chunks: at most {SHARD_MAX_SENDS:,} sends to "
            "decide (GPUs x peers x chunks x rounds); ask about fewer GPUs or chunks"
        )


def _constraints(
    collective: str, n: int, c: int, rounds: int, port_chunks: int | None
) -> Iterator[z3.BoolRef]:
    """The one-port rules, the end the collective must reach, the straggler's port load if
    capped, and the symmetry breaking of the module docstring."""
    late = n - 1
    start = functools.partial(start_parts, collective, n)
    yield from spread(n, c, rounds, _parts(collective), start)
    yield from (has(start, rounds, r, k, p) for r, k, p in _goal(collective, n, c))
    if port_chunks is not None:
        yield from port_load(n, c, rounds, late, port_chunks)
    theirs = [k for k in range(c) if k % n != late]  # the punctual ranks' chunks
    if collective == "reduce_scatter":
        pairs = [(a, a + n) for a in theirs if a + n < c] + [(o, o + 1) for o in range(late - 1)]
        yield from first_in_order(n, late, rounds, pairs)
    else:
        yield from first_in_order(n, late, rounds, [(a, a + n) for a in range(late, c - n, n)])
        yield from first_in_order(n, late, rounds, list(itertools.pairwise(theirs)), receives=True)


def _edge(src: int, dst: int, chunk: int) -> z3.BoolRef:
    """``src`` sends ``chunk`` to ``dst`` in some round."""
    return z3.Bool(f"edge_{src}_{dst}_{chunk}")


def _reach(start: Start, hops: int, rank: int, chunk: int, part: int) -> z3.BoolRef:
    """``rank`` holds ``part`` of ``chunk`` by a path of at most ``hops`` sends; ``start`` at 0."""
    if hops == 0:
        return z3.BoolVal(start(rank, chunk, part))
    return z3.Bool(f"reach_{hops}_{rank}_{chunk}_{part}")


def _moved(direction: str, chunk: int) -> z3.BoolRef:
    """The straggler sends (``out``) or receives (``in``) ``chunk`` in some round."""
    return z3.Bool(f"{direction}_{chunk}")


def _paths(collective: str, n: int, c: int, port_chunks: int) -> Iterator[z3.BoolRef]:
    """The model without rounds: parts spread along sends, each rank first reached by a path of at
    most ``n-1`` sends, the end the collective must reach, and at most ``port_chunks`` distinct
    chunks out of the straggler and as many in."""
    late, peers, chunks = n - 1, range(n), range(c)
    start = functools.partial(start_parts, collective, n)
    parts = _parts(collective)
    for h in range(n - 1):
        for d in peers:
            for k in chunks:
                for p in parts:
                    arrives = [z3.And(_edge(s, d, k), _reach(start, h, s, k, p)) for s in peers if s != d]
                    then = _reach(start, h + 1, d, k, p)
                    yield z3.Implies(then, z3.Or(_reach(start, h, d, k, p), *arrives))
    yield from (_reach(start, n - 1, r, k, p) for r, k, p in _goal(collective, n, c))
    for k in chunks:
        for other in range(late):
            yield z3.Implies(_edge(late, other, k), _moved("out", k))
            yield z3.Implies(_edge(other, late, k), _moved("in", k))
    yield z3.AtMost(*(_moved("out", k) for k in chunks), port_chunks)
    yield z3.AtMost(*(_moved("in", k) for k in chunks), port_chunks)
