"""Lower bounds on StragglAR's exposed rounds, by SAT (z3).

The question asked of the solver: starting from the state the ReduceScatter leaves, can ``n``
ranks finish an AllReduce in ``R`` rounds of the one-port, one-chunk-per-round model?  The
straggler is rank ``n-1`` and there are ``n-1`` chunks.  Chunk ``c`` has two *parts*: ``P``, the
sum over the ``n-1`` punctual ranks, which only rank ``c`` holds, and ``Q``, the straggler's own
data, which only the straggler holds; a copy of the chunk is complete when it has both.  Every
other value is junk that a complete chunk must not contain.  For the ring ReduceScatter this
loses nothing: each of its leftovers of chunk ``c`` contains the ring's first contribution, so a
correct sum holds exactly one of them, and only ``P`` has all the punctual contributions.

Variables come from small named factories, SCCL-style: :func:`_has` (after ``t`` rounds rank
``r``'s chunk ``c`` contains ``part``) and :func:`_send` (in round ``t`` rank ``s`` sends chunk
``c`` to ``d``); z3 identifies variables by name, so nothing is created ahead of its use.
Per round each rank sends at most one chunk to one peer and receives at most one.  A receive
may add the parts it carries; nothing is forced, and the schedule found need not follow the
paper's exchange order: any copy or reduce, by any rank, of full or partial chunks is allowed.

Why an unsat answer is a proof for real schedules: map a real value to the set of parts it
holds once, or to the empty set if it holds junk or something twice (it is then wrong for good,
as sums only grow).  A copy then gives the destination a subset of what the model's union gives
it, and so does a reduce, so any real schedule of ``R`` rounds yields a satisfying assignment.

Symmetry breaking keeps this true and is what makes the solver fast (N = 8 in 0.1 s instead of
one to three minutes): renaming punctual rank ``g`` and chunk ``g`` together maps schedules to
schedules.  Every chunk must leave the straggler at least once (only it holds ``Q``) and the
straggler sends one chunk per round, so the chunks leave it for the first time in distinct
rounds; after renaming they do so in index order, which the model requires.

>>> phase2_feasible(4, 3).status, phase2_feasible(4, 4).status
('unsat', 'sat')
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import z3

from stragglar.errors import InputError
from stragglar.schedule import Op, Round, Transfer, round_lower_bound

__all__ = ["BOUND_MAX_RANKS", "Feasibility", "LowerBound", "phase2_feasible", "prove_lower_bound"]

BOUND_MAX_RANKS = 24  # the model grows as N^4: N = 16 took 640 s, N = 40 needed 7 GB to build

_PARTS = (0, 1)  # P (the punctual ranks' sum) and Q (the straggler's data)


class Feasibility(NamedTuple):
    """The solver's answer: "sat" with the phase-2 rounds found (straggler ``n-1``, after the
    ReduceScatter that leaves punctual rank ``c`` with chunk ``c``), "unsat", or "unknown" when it
    ran out of time."""

    status: str
    exchange: tuple[Round, ...] | None
    seconds: float


@dataclass(frozen=True)
class LowerBound:
    """The query "can phase 2 take R*(n) - 1 rounds?"; "unsat" proves R*(n) a lower bound."""

    num_ranks: int
    bound: int  # R*(n)
    status: str
    seconds: float
    exchange: tuple[Round, ...] | None  # only if the solver beat R*(n): a result to verify and report

    @property
    def proved(self) -> bool:
        return self.status == "unsat"

    @property
    def summary(self) -> str:
        """One line: proved, beaten (a finding to report), or undecided."""
        n, fewer = self.num_ranks, f"{self.bound - 1} rounds"
        if self.proved:
            return (
                f"proved: no phase 2 for {n} GPUs fits in {fewer}, so R*({n}) = {self.bound} "
                f"is optimal (z3: unsat in {self.seconds:.2f} s)"
            )
        if self.exchange is not None:
            return f"z3 found a phase 2 for {n} GPUs in {fewer}, below R*({n})"
        return f"z3 gave no answer for {n} GPUs in {self.seconds:.1f} s (status {self.status})"


def prove_lower_bound(num_ranks: int, timeout_s: float | None = None) -> LowerBound:
    """Ask the solver for a phase 2 with one round fewer than R*(n); unsat proves R*(n) optimal."""
    bound = round_lower_bound(num_ranks)
    answer = phase2_feasible(num_ranks, bound - 1, timeout_s)
    if answer.exchange is not None:
        warnings.warn(f"z3 fits phase 2 for {num_ranks} GPUs in {bound - 1} rounds, below R*", stacklevel=2)
    return LowerBound(num_ranks, bound, answer.status, answer.seconds, answer.exchange)


def phase2_feasible(num_ranks: int, rounds: int, timeout_s: float | None = None) -> Feasibility:
    """Decide whether phase 2 fits in ``rounds`` rounds; if so, return the rounds found.

    ``timeout_s`` bounds the wall-clock time, building the model included.
    """
    n = num_ranks
    if not 2 <= n <= BOUND_MAX_RANKS or rounds < 0:
        raise InputError(
            f"need 2 to {BOUND_MAX_RANKS} GPUs and no negative rounds, got {n} GPUs, {rounds} rounds"
        )
    start = time.perf_counter()
    deadline = None if timeout_s is None else start + timeout_s
    solver = z3.Solver()
    for constraint in _constraints(n, rounds):
        solver.add(constraint)
        if deadline is not None and time.perf_counter() > deadline:
            return Feasibility("unknown", None, time.perf_counter() - start)  # out of time while building
    if deadline is not None:
        solver.set("timeout", max(1, round((deadline - time.perf_counter()) * 1000)))
    verdict = solver.check()
    seconds = time.perf_counter() - start
    if verdict != z3.sat:
        return Feasibility("unsat" if verdict == z3.unsat else "unknown", None, seconds)
    model = solver.model()
    chosen = [
        [(s, d, c) for s, d, c in _triples(n) if _true(model, _send(t, s, d, c))] for t in range(rounds)
    ]
    return Feasibility("sat", _exchange(n, chosen), seconds)


def _triples(n: int) -> Iterator[tuple[int, int, int]]:
    """Every (src, dst, chunk) a send may have."""
    return ((s, d, c) for s in range(n) for d in range(n) if s != d for c in range(n - 1))


def _has(n: int, t: int, rank: int, chunk: int, part: int) -> z3.BoolRef:
    """After ``t`` rounds ``rank``'s ``chunk`` contains ``part`` (P = 0, Q = 1); fixed at ``t = 0``."""
    if t == 0:
        return z3.BoolVal(rank == chunk if part == 0 else rank == n - 1)
    return z3.Bool(f"has_{t}_{rank}_{chunk}_{part}")


def _send(t: int, src: int, dst: int, chunk: int) -> z3.BoolRef:
    """In round ``t`` ``src`` sends ``chunk`` to ``dst``."""
    return z3.Bool(f"send_{t}_{src}_{dst}_{chunk}")


def _constraints(n: int, rounds: int) -> Iterator[z3.BoolRef]:
    chunks, peers = range(n - 1), range(n)
    for t in range(rounds):
        for r in peers:  # one port each way, one chunk: at most one send and one receive per rank
            yield z3.AtMost(*(_send(t, r, d, c) for d in peers if d != r for c in chunks), 1)
            yield z3.AtMost(*(_send(t, s, r, c) for s in peers if s != r for c in chunks), 1)
        for d in peers:
            for c in chunks:
                for p in _PARTS:
                    arrives = [z3.And(_send(t, s, d, c), _has(n, t, s, c, p)) for s in peers if s != d]
                    yield z3.Implies(_has(n, t + 1, d, c, p), z3.Or(_has(n, t, d, c, p), *arrives))
                    yield z3.Implies(_has(n, t, d, c, p), _has(n, t + 1, d, c, p))
    for r in peers:
        for c in chunks:
            yield z3.And(*(_has(n, rounds, r, c, p) for p in _PARTS))
    yield from _first_sends_in_chunk_order(n, rounds)


def _first_sends_in_chunk_order(n: int, rounds: int) -> Iterator[z3.BoolRef]:
    """If the straggler has sent chunk c+1 by round t, it had sent chunk c by round t-1."""
    late = n - 1
    sent: list[z3.BoolRef] = [z3.BoolVal(False)] * late  # by the round before
    for t in range(rounds):
        now = [z3.Or(sent[c], *(_send(t, late, d, c) for d in range(late))) for c in range(late)]
        yield from (z3.Implies(now[c + 1], sent[c]) for c in range(late - 1))
        sent = now


def _true(model: z3.ModelRef, var: z3.BoolRef) -> bool:
    return bool(z3.is_true(model.eval(var, model_completion=True)))


def _exchange(n: int, chosen: list[list[tuple[int, int, int]]]) -> tuple[Round, ...]:
    """The solver's rounds with each send made a copy, a reduce or nothing.

    The parts are followed exactly here (the model may lag behind them): a send that brings
    nothing new is dropped, one that brings a superset is a copy (whatever the destination
    held is overwritten), and one that brings the other part is a reduce.
    """
    late = n - 1
    parts = [[{0} if r == c else {1} if r == late else set() for c in range(late)] for r in range(n)]
    exchange: list[Round] = []
    for sends in chosen:
        moves = [(s, d, c) for s, d, c in sends if not parts[s][c] <= parts[d][c]]
        ops = [Op.COPY if parts[d][c] <= parts[s][c] else Op.REDUCE for s, d, c in moves]
        exchange.append(tuple(Transfer(s, d, c, op) for (s, d, c), op in zip(moves, ops, strict=True)))
        for d, c, after in [(d, c, parts[d][c] | parts[s][c]) for s, d, c in moves]:  # a synchronous round
            parts[d][c] = after
    return tuple(exchange)
