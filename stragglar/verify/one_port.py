"""The one-port round model in z3, shared by the lower bounds of :mod:`stragglar.verify.bound`
(AllReduce) and :mod:`stragglar.verify.shard_bound` (ReduceScatter, AllGather).

In a round every rank sends at most one chunk to one peer and receives at most one chunk; a chunk
holds *parts* (sets of contributions that travel together), and a rank's chunk holds after round
``t`` what it held before or what a sender holding it sent it in round ``t``.  Which parts exist,
who holds them at the start and what the end must hold are each bound's own question; this module
has the variables and the rules they share.

Variables come from small named factories, SCCL-style: :func:`has` (after ``t`` rounds ``rank``'s
``chunk`` contains ``part``) and :func:`send` (in round ``t`` ``src`` sends ``chunk`` to ``dst``);
z3 identifies variables by name, so nothing is created ahead of its use.  The holdings only grow,
and the bounds' soundness arguments rely on that: a real value maps to the parts it has *ever*
held (or holds once), which grows the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import z3

from stragglar.schedule import Op, Round, Transfer

__all__ = [
    "Start",
    "decide",
    "first_in_order",
    "has",
    "port_load",
    "send",
    "sends_found",
    "spread",
    "transfers",
]

Start = Callable[[int, int, int], bool]  # (rank, chunk, part): held before the first round


def send(t: int, src: int, dst: int, chunk: int) -> z3.BoolRef:
    """In round ``t`` ``src`` sends ``chunk`` to ``dst``."""
    return z3.Bool(f"send_{t}_{src}_{dst}_{chunk}")


def has(start: Start, t: int, rank: int, chunk: int, part: int) -> z3.BoolRef:
    """After ``t`` rounds ``rank``'s ``chunk`` contains ``part``; fixed by ``start`` at ``t = 0``."""
    if t == 0:
        return z3.BoolVal(start(rank, chunk, part))
    return z3.Bool(f"has_{t}_{rank}_{chunk}_{part}")


def spread(n: int, c: int, rounds: int, parts: Sequence[int], start: Start) -> Iterator[z3.BoolRef]:
    """The ports (one chunk out and one in per rank and round) and how parts spread: a part is
    held after a round if it was before, or if it arrived from a sender that held it; once held,
    it stays."""
    chunks, peers = range(c), range(n)
    for t in range(rounds):
        for r in peers:
            yield z3.AtMost(*(send(t, r, d, k) for d in peers if d != r for k in chunks), 1)
            yield z3.AtMost(*(send(t, s, r, k) for s in peers if s != r for k in chunks), 1)
        for d in peers:
            for k in chunks:
                for p in parts:
                    arrives = [z3.And(send(t, s, d, k), has(start, t, s, k, p)) for s in peers if s != d]
                    yield z3.Implies(has(start, t + 1, d, k, p), z3.Or(has(start, t, d, k, p), *arrives))
                    yield z3.Implies(has(start, t, d, k, p), has(start, t + 1, d, k, p))


def port_load(n: int, c: int, rounds: int, rank: int, most: int) -> Iterator[z3.BoolRef]:
    """``rank`` sends at most ``most`` chunks in all, and receives at most ``most``: its port's
    load, the larger of the two on a full-duplex link."""
    peers = [p for p in range(n) if p != rank]
    yield z3.AtMost(*(send(t, rank, d, k) for t in range(rounds) for d in peers for k in range(c)), most)
    yield z3.AtMost(*(send(t, s, rank, k) for t in range(rounds) for s in peers for k in range(c)), most)


def first_in_order(
    n: int, rank: int, rounds: int, pairs: Sequence[tuple[int, int]], receives: bool = False
) -> Iterator[z3.BoolRef]:
    """Symmetry breaking: for each ordered pair (a, b), "if ``rank`` has sent (with ``receives``:
    received) chunk b by round t, it had sent (received) chunk a by round t-1".

    Sound where every chunk of the pairs must leave (reach) ``rank`` at least once, so their first
    sends (receives) fall in distinct rounds, and where renaming the chunks (with ranks, if need
    be) maps schedules to schedules: each bound says why its pairs are such."""
    chunks = 1 + max((b for _, b in pairs), default=0)
    peers = [p for p in range(n) if p != rank]
    moved: list[z3.BoolRef] = [z3.BoolVal(False)] * chunks  # by the round before
    for t in range(rounds):
        now_moves = [
            [send(t, p, rank, k) if receives else send(t, rank, p, k) for p in peers] for k in range(chunks)
        ]
        now = [z3.Or(moved[k], *now_moves[k]) for k in range(chunks)]
        yield from (z3.Implies(now[b], moved[a]) for a, b in pairs)
        moved = now


def decide(
    constraints: Iterator[z3.BoolRef], timeout_s: float | None
) -> tuple[str, z3.ModelRef | None, float]:
    """(status, model if sat, seconds): the constraints added one by one, so that ``timeout_s``
    bounds the wall-clock time with building the model included."""
    start = time.perf_counter()
    deadline = None if timeout_s is None else start + timeout_s
    solver = z3.Solver()
    for constraint in constraints:
        solver.add(constraint)
        if deadline is not None and time.perf_counter() > deadline:
            return "unknown", None, time.perf_counter() - start  # out of time while building
    if deadline is not None:
        solver.set("timeout", max(1, round((deadline - time.perf_counter()) * 1000)))
    verdict = solver.check()
    seconds = time.perf_counter() - start
    if verdict == z3.sat:
        return "sat", solver.model(), seconds
    return ("unsat" if verdict == z3.unsat else "unknown"), None, seconds


def sends_found(model: z3.ModelRef, n: int, c: int, rounds: int) -> list[list[tuple[int, int, int]]]:
    """The (src, dst, chunk) sends of each round in a satisfying ``model``."""
    triples = [(s, d, k) for s in range(n) for d in range(n) if s != d for k in range(c)]
    return [
        [(s, d, k) for s, d, k in triples if z3.is_true(model.eval(send(t, s, d, k), model_completion=True))]
        for t in range(rounds)
    ]


def transfers(held: list[list[set[int]]], sends: list[list[tuple[int, int, int]]]) -> tuple[Round, ...]:
    """The sends made a copy, a reduce or nothing, from the parts ``held[rank][chunk]`` at the start.

    The parts are followed exactly here (the model may lag behind them): a send that brings
    nothing new is dropped, one that brings a superset is a copy (whatever the destination
    held is overwritten), and one that brings parts the destination lacks, and none it has, is a
    reduce.  With one or two parts per chunk, these are all the cases.
    """
    parts = [[set(p) for p in row] for row in held]
    rounds: list[Round] = []
    for now in sends:
        moves = [(s, d, k) for s, d, k in now if not parts[s][k] <= parts[d][k]]
        ops = [Op.COPY if parts[d][k] <= parts[s][k] else Op.REDUCE for s, d, k in moves]
        rounds.append(tuple(Transfer(s, d, k, op) for (s, d, k), op in zip(moves, ops, strict=True)))
        for d, k, after in [(d, k, parts[d][k] | parts[s][k]) for s, d, k in moves]:  # a synchronous round
            parts[d][k] = after
    return tuple(rounds)
