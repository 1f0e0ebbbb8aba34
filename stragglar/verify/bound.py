"""Lower bounds on StragglAR's exposed rounds, by SAT (z3).

The question asked of the solver: starting from the state the ReduceScatter leaves, can ``n``
ranks finish an AllReduce in ``R`` rounds of the one-port, one-chunk-per-round model?  The
straggler is rank ``n-1``; there are ``C >= n-1`` chunks (the paper's ``C = n-1`` by default),
chunk ``c`` reduced by the ReduceScatter at its owner ``c mod (n-1)``, so owners are balanced.
Chunk ``c`` has two *parts*: ``P``, the sum over the ``n-1`` punctual ranks, which only its owner
holds, and ``Q``, the straggler's own data, which only the straggler holds; a copy of the chunk is
complete when it has both.  Every other value is junk that a complete chunk must not contain.
For a ring ReduceScatter this loses nothing: each of its leftovers of chunk ``c`` contains the
ring's first contribution, so a correct sum holds exactly one of them, and only ``P`` has all
the punctual contributions.

Variables come from the small named factories of :mod:`stragglar.verify.one_port`, SCCL-style:
``has`` (after ``t`` rounds rank ``r``'s chunk ``c`` contains ``part``) and ``send`` (in round
``t`` rank ``s`` sends chunk ``c`` to ``d``).
Per round each rank sends at most one chunk to one peer and receives at most one.  A receive
may add the parts it carries; nothing is forced, and the schedule found need not follow the
paper's exchange order: any copy or reduce, by any rank, of full or partial chunks is allowed.

Why an unsat answer is a proof for real schedules: map a real value to the set of parts it
holds once, or to the empty set if it holds junk or something twice (it is then wrong for good,
as sums only grow).  A copy then gives the destination a subset of what the model's union gives
it, and so does a reduce, so any real schedule of ``R`` rounds yields a satisfying assignment.

The lower bound itself needs less: the straggler's data ``Q`` alone must reach every rank, and
the bound's argument (one chunk leaves the straggler per round, then doubling) is about ``Q``
only.  So :func:`prove_lower_bound` first asks the *relaxed* model that follows ``Q`` alone (any
real schedule gives one of its solutions, by the same mapping); its unsat proves the bound, and
with every chunk alike it is fast (N = 8 with 16 chunks in under a second).  The model with both
parts decides the rest: whether a schedule exists, and optima above the bound (N = 3).

Symmetry breaking keeps this true and is what makes the solver fast (N = 8 in 0.1 s instead of
one to three minutes).  Every chunk must leave the straggler at least once (only it holds ``Q``)
and the straggler sends one chunk per round, so the chunks leave it for the first time in
distinct rounds.  Two renamings map schedules to schedules: chunks of one owner among
themselves, and punctual ranks that own equally many chunks, together with their chunks.  So
the model may ask that chunks of one owner first leave the straggler in index order, and that
owners of equal share first see their chunks leave in owner order; for ``C = n-1`` (one chunk
each) that is every chunk in index order, and so it is in the relaxed model, where every chunk
is alike.

>>> phase2_feasible(4, 3).status, phase2_feasible(4, 4).status
('unsat', 'sat')
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import z3

from stragglar.args import as_int
from stragglar.errors import InputError
from stragglar.schedule import Round, round_lower_bound
from stragglar.units import count_of
from stragglar.verify.one_port import decide, first_in_order, has, sends_found, spread, transfers

__all__ = [
    "BOUND_MAX_CELLS",
    "BOUND_MAX_RANKS",
    "Feasibility",
    "LowerBound",
    "phase2_feasible",
    "prove_lower_bound",
]

BOUND_MAX_RANKS = 24  # the model grows as N^4: N = 16 took 495 s, N = 40 needed 7 GB to build
BOUND_MAX_CELLS = 24 * 23  # ranks x chunks: the model grows with N^2 x C x rounds

_PARTS = (0, 1)  # P (the punctual ranks' sum) and Q (the straggler's data)


class Feasibility(NamedTuple):
    """The solver's answer: "sat" with the rounds found after the straggler ``n-1`` arrives (here
    phase 2, after the ReduceScatter that leaves chunk ``c`` at rank ``c mod (n-1)``;
    :mod:`stragglar.verify.shard_bound` says where its own start), "unsat", or "unknown" when it
    ran out of time."""

    status: str
    exchange: tuple[Round, ...] | None
    seconds: float


@dataclass(frozen=True)
class LowerBound:
    """The query "can phase 2 take ``rounds`` rounds?" (default: one fewer than the bound);
    "unsat" proves ``rounds + 1`` a lower bound."""

    num_ranks: int
    num_chunks: int
    bound: int  # C + ceil(log2 n) - 1: R*(n) for C = n - 1
    rounds: int  # the number of rounds asked about
    status: str
    seconds: float
    exchange: tuple[Round, ...] | None  # only if the solver fits them: a result to verify and report
    model: str  # which model decided: "the straggler's data" (relaxed) or "both parts"

    @property
    def proved(self) -> bool:
        return self.status == "unsat"

    @property
    def below_bound(self) -> bool:
        """Whether z3 fitted phase 2 in fewer rounds than the bound: a finding to report (at or
        above the bound, a fit is the expected answer)."""
        return self.exchange is not None and self.rounds < self.bound

    @property
    def summary(self) -> str:
        """One line: proved, fitted (a finding to report when below the bound), or undecided."""
        n, c = self.num_ranks, self.num_chunks
        what = f"{n} GPUs" if c == n - 1 else f"{n} GPUs and {c} chunks"
        name = f"R*({n})" if c == n - 1 else f"{c} + ceil(log2 {n}) - 1"
        rounds = count_of(self.rounds, "round")
        if self.proved:
            if self.rounds < self.bound - 1:
                claim = f"so it needs more (lower bound {name} = {self.bound})"
            elif self.rounds == self.bound - 1:  # reached for C = n-1 by every generated schedule
                claim = f"so {name} = {self.bound} is {'optimal' if c == n - 1 else 'a lower bound'}"
            else:
                claim = f"so it needs at least {self.rounds + 1}, above {name} = {self.bound}"
            unsat = f"z3, {self.model}: unsat in {self.seconds:.2f} s"
            return f"proved: no phase 2 for {what} fits in {rounds}, {claim} ({unsat})"
        if self.exchange is not None:
            if self.below_bound:
                return f"z3 found a phase 2 for {what} in {rounds}, below {name} = {self.bound}"
            where = "at" if self.rounds == self.bound else "above"
            return (
                f"as expected, z3 fits phase 2 for {what} in {rounds}, {where} the lower bound "
                f"{name} = {self.bound} (only fewer rounds would refute it)"
            )
        return f"z3 gave no answer for {what} in {self.seconds:.1f} s (status {self.status})"


def prove_lower_bound(
    num_ranks: int, timeout_s: float | None = None, num_chunks: int | None = None, rounds: int | None = None
) -> LowerBound:
    """Ask the solver for a phase 2 of ``rounds`` rounds (default: one fewer than the bound);
    unsat proves that ``rounds + 1`` are needed.  The relaxed model goes first (see the module
    docstring); only if it fits, the model with both parts decides."""
    num_ranks = as_int(num_ranks, "num_ranks")
    chunks = num_ranks - 1 if num_chunks is None else as_int(num_chunks, "num_chunks")
    bound = round_lower_bound(num_ranks, chunks)
    asked = bound - 1 if rounds is None else rounds
    _checked(num_ranks, chunks, asked)
    start = time.perf_counter()
    relaxed = decide(_straggler_data(num_ranks, chunks, asked), timeout_s)
    if relaxed[0] == "unsat":
        return LowerBound(num_ranks, chunks, bound, asked, "unsat", relaxed[2], None, "the straggler's data")
    left = None if timeout_s is None else max(0.0, timeout_s - (time.perf_counter() - start))
    answer = phase2_feasible(num_ranks, asked, left, chunks)
    if answer.exchange is not None and asked < bound:
        warnings.warn(
            f"z3 fits phase 2 for {num_ranks} GPUs in {count_of(asked, 'round')}, below the bound",
            stacklevel=2,
        )
    seconds = time.perf_counter() - start
    return LowerBound(num_ranks, chunks, bound, asked, answer.status, seconds, answer.exchange, "both parts")


def phase2_feasible(
    num_ranks: int, rounds: int, timeout_s: float | None = None, num_chunks: int | None = None
) -> Feasibility:
    """Decide whether phase 2 fits in ``rounds`` rounds; if so, return the rounds found.

    ``timeout_s`` bounds the wall-clock time, building the model included.
    """
    n = num_ranks
    c = n - 1 if num_chunks is None else num_chunks
    _checked(n, c, rounds)
    status, model, seconds = decide(_constraints(n, c, rounds), timeout_s)
    if model is None:
        return Feasibility(status, None, seconds)
    held = [[{p for p in _PARTS if _start(n, r, k, p)} for k in range(c)] for r in range(n)]
    return Feasibility("sat", transfers(held, sends_found(model, n, c, rounds)), seconds)


def _checked(n: int, c: int, rounds: int) -> None:
    """Refuse a query too large to build, before building it."""
    as_int(n, "num_ranks")  # a bool or a float would name z3's variables apart from the rest
    as_int(c, "num_chunks")
    as_int(rounds, "rounds")
    if not 2 <= n <= BOUND_MAX_RANKS or rounds < 0:
        raise InputError(
            f"need 2 to {BOUND_MAX_RANKS} GPUs and no negative rounds, got {n} GPUs, {rounds} rounds"
        )
    if not n - 1 <= c or n * c > BOUND_MAX_CELLS:
        raise InputError(
            f"need at least {n - 1} chunks and at most {BOUND_MAX_CELLS} ranks x chunks, got {c} chunks"
        )
    most = 2 * round_lower_bound(n, c)
    if rounds > most:
        raise InputError(
            f"{rounds} rounds: ask about at most {most}, twice the bound (the model grows with the "
            "rounds, and phase 2 fits in the bound itself)"
        )


def _owner(n: int, chunk: int) -> int:
    """The punctual rank that holds ``chunk`` reduced after the ReduceScatter."""
    return chunk % (n - 1)


def _start(n: int, rank: int, chunk: int, part: int) -> bool:
    """Who holds what after the ReduceScatter: ``P`` (0) at the chunk's owner, ``Q`` (1) at the
    straggler."""
    return rank == _owner(n, chunk) if part == 0 else rank == n - 1


def _constraints(n: int, c: int, rounds: int, parts: tuple[int, ...] = _PARTS) -> Iterator[z3.BoolRef]:
    """Ports, how parts spread, every part everywhere at the end, and the symmetry breaking."""
    yield from _everywhere(n, c, rounds, parts)
    yield from first_in_order(n, n - 1, rounds, _owner_pairs(n, c))


def _straggler_data(n: int, c: int, rounds: int) -> Iterator[z3.BoolRef]:
    """The relaxed model: ``Q`` alone, every chunk alike, so all first sends in index order."""
    yield from _everywhere(n, c, rounds, (1,))
    yield from first_in_order(n, n - 1, rounds, [(a, a + 1) for a in range(c - 1)])


def _everywhere(n: int, c: int, rounds: int, parts: tuple[int, ...]) -> Iterator[z3.BoolRef]:
    """The one-port rules, and every part of every chunk at every rank after ``rounds`` rounds."""
    start = functools.partial(_start, n)
    yield from spread(n, c, rounds, parts, start)
    yield from (has(start, rounds, r, k, p) for r in range(n) for k in range(c) for p in parts)


def _owner_pairs(n: int, c: int) -> list[tuple[int, int]]:
    """Chunks of one owner in index order; owners of equal share in owner order."""
    late = n - 1
    share = [len(range(owner, c, late)) for owner in range(late)]  # chunks each punctual rank owns
    pairs = [(a, a + late) for a in range(c - late)]
    return pairs + [(a, b) for a, b in zip(range(late), range(1, late), strict=False) if share[a] == share[b]]
