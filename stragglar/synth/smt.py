"""StragglAR schedules found by SAT (z3): the copies of phase 2, in the paper's exchange order.

The exchanges are fixed as in every StragglAR schedule here (round ``t < n-1``: GPU ``t`` and
the straggler ``n-1`` swap chunk ``t``, which completes it at both); the solver chooses the
copies of completed chunks that spread them, one chunk per port per round, so that every GPU
holds every chunk after ``rounds`` rounds.  That is a multi-source broadcast with one new block
a round, far smaller than the general model of :mod:`stragglar.verify.bound` (no partial sums,
no reduce choices), which is why z3 settles N = 8 in a fraction of a second.  The general model
is what proves that no schedule does better; this one only has to find a good one.

Variables come from small named factories, SCCL style: :func:`_holds` (after ``t`` rounds, rank
``r`` holds chunk ``c`` complete) and :func:`_copies` (in round ``t``, ``s`` copies chunk ``c`` to
``d``); z3 identifies variables by name, so asking a factory twice gives the same variable.  They
are used only where they can be true: a chunk is copied only after its exchange.

>>> copy_rounds_status(4, 3), copy_rounds_status(4, 4)
('unsat', 'sat')
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import z3

from stragglar.errors import InputError, ResourceError
from stragglar.schedule import Schedule, move_straggler, round_lower_bound
from stragglar.synth.chunked import Copy, chunk_owners
from stragglar.synth.stragglar import exchange_rounds, stragglar_schedule
from stragglar.units import format_seconds

__all__ = ["copy_rounds_status", "smt_copy_rounds", "smt_synthesize"]


def smt_synthesize(num_ranks: int, timeout_s: float | None = None, straggler: int | None = None) -> Schedule:
    """The StragglAR schedule with the fewest phase-2 rounds z3 finds, starting at R*(n).

    Raises :class:`~stragglar.errors.ResourceError` if a query outlasts ``timeout_s`` seconds
    (wall clock, model building included, per query).
    """
    bound = round_lower_bound(num_ranks)
    owners = chunk_owners(num_ranks, num_ranks - 1)
    for rounds in range(bound, bound + num_ranks + 1):  # the greedy fits within a round or two of R*
        copies = smt_copy_rounds(num_ranks, rounds, timeout_s)
        if copies is not None:
            schedule = stragglar_schedule(owners, exchange_rounds(owners, copies), "smt")
            return schedule if straggler is None else move_straggler(schedule, straggler)
    raise RuntimeError(f"z3 found no phase 2 for {num_ranks} GPUs within {num_ranks} rounds of R*")


def copy_rounds_status(num_ranks: int, rounds: int) -> str:
    """``"sat"`` or ``"unsat"``: whether copies exist that finish phase 2 in ``rounds`` rounds."""
    return "sat" if smt_copy_rounds(num_ranks, rounds) is not None else "unsat"


def smt_copy_rounds(num_ranks: int, rounds: int, timeout_s: float | None = None) -> list[list[Copy]] | None:
    """Copies per phase-2 round finishing in ``rounds`` rounds, or None if there are none.

    Raises :class:`~stragglar.errors.ResourceError` when z3 cannot decide within ``timeout_s``
    seconds (wall clock, building the model included).
    """
    n = num_ranks
    if n < 2 or rounds < 0:
        raise InputError(f"need at least 2 GPUs and no negative rounds, got {n} GPUs, {rounds} rounds")
    deadline = None if timeout_s is None else time.perf_counter() + timeout_s
    within = "its time" if timeout_s is None else format_seconds(timeout_s)  # "1 us", not "1e-06 s"
    out_of_time = ResourceError(f"z3 did not decide {rounds} rounds for {n} GPUs within {within}")
    solver = z3.Solver()
    for constraint in _constraints(n, rounds):  # the budget is wall-clock: building the model counts
        solver.add(constraint)
        if deadline is not None and time.perf_counter() > deadline:
            raise out_of_time
    if deadline is not None:
        solver.set("timeout", max(1, round((deadline - time.perf_counter()) * 1000)))
    verdict = solver.check()
    if verdict == z3.unknown:
        raise out_of_time
    if verdict == z3.unsat:
        return None
    return _chosen(solver.model(), n, rounds)


def _holds(t: int, rank: int, chunk: int) -> z3.BoolRef:
    """After ``t`` rounds ``rank`` holds ``chunk`` complete."""
    return z3.Bool(f"holds_{t}_{rank}_{chunk}")


def _copies(t: int, src: int, dst: int, chunk: int) -> z3.BoolRef:
    """In round ``t`` ``src`` copies its complete ``chunk`` to ``dst``."""
    return z3.Bool(f"copies_{t}_{src}_{dst}_{chunk}")


def _copyable(n: int, t: int) -> range:
    """Chunks complete somewhere at the start of round ``t``: those exchanged before it."""
    return range(min(t, n - 1))


def _holding(n: int, t: int, rank: int, chunk: int) -> z3.BoolRef:
    """Whether ``rank`` holds ``chunk`` after ``t`` rounds, constant where the exchange decides it."""
    late = n - 1
    if t <= chunk:
        return z3.BoolVal(False)
    if rank in (chunk, late):
        return z3.BoolVal(True)
    return _holds(t, rank, chunk)


def _constraints(n: int, rounds: int) -> Iterator[z3.BoolRef]:
    late, ranks = n - 1, range(n)
    for t in range(rounds):
        chunks = _copyable(n, t)
        busy = {t, late} if t < late else set()
        for r in ranks:  # one port each way; the exchange uses both ports of its two ranks
            out = [_copies(t, r, d, c) for d in ranks if d != r for c in chunks]
            into = [_copies(t, s, r, c) for s in ranks if s != r for c in chunks]
            if r in busy:
                yield from (z3.Not(x) for x in out + into)
            else:
                yield from (z3.AtMost(*port, 1) for port in (out, into) if port)
        for s in ranks:
            for d in ranks:
                if s != d:
                    yield from (z3.Implies(_copies(t, s, d, c), _holding(n, t, s, c)) for c in chunks)
        for d in ranks:
            for c in range(late):
                after = _holding(n, t + 1, d, c)
                if z3.is_true(after) or z3.is_false(after):
                    continue
                arrives = [_copies(t, s, d, c) for s in ranks if s != d] if c in chunks else []
                yield after == z3.Or(_holding(n, t, d, c), *arrives)
    yield from (_holding(n, rounds, r, c) for r in ranks for c in range(late))


def _chosen(model: z3.ModelRef, n: int, rounds: int) -> list[list[Copy]]:
    """The model's copies, keeping only those that bring a chunk its receiver lacks."""
    chosen: list[list[Copy]] = []
    for t in range(rounds):
        chunks = _copyable(n, t)
        round_copies = [
            (s, d, c)
            for s in range(n)
            for d in range(n)
            if s != d
            for c in chunks
            if _true(model, _copies(t, s, d, c)) and not _true(model, _holding(n, t, d, c))
        ]
        chosen.append(round_copies)
    return chosen


def _true(model: z3.ModelRef, var: z3.BoolRef) -> bool:
    return bool(z3.is_true(model.eval(var, model_completion=True)))
