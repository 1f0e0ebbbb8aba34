"""Symbolic chunk-state simulation: prove that a schedule computes an AllReduce.

Each (rank, chunk) holds the *set* of ranks whose contribution it contains, as
an int bitmask, so one run covers every possible input and costs a few big-int
operations per transfer (a 1024-rank schedule with millions of transfers takes
seconds).  ``copy`` assigns the set and ``reduce`` unions it.  A reduce whose
operands share a contributor counts it twice; sums only grow, so that value stays
wrong until a copy overwrites it.  Such a value is marked with the place of its
first duplicate and the mark travels with copies and reductions: if a marked value
survives to the end, that place is reported; if copies overwrite every marked
value, the schedule is correct and is accepted (the simulator is exact both ways).

>>> from stragglar.schedule import Op, Phase, Schedule, Transfer
>>> swap = (Transfer(0, 1, 0, Op.REDUCE), Transfer(1, 0, 0, Op.REDUCE))
>>> s = Schedule("demo", 2, 1, None, (Phase("exchange", (0, 1), (swap,)),))
>>> prove(s).summary
'proved: allreduce over 2 ranks, 1 chunk, 1 round, 2 transfers'
>>> v = find_violation(Schedule("demo", 2, 1, None, (Phase("exchange", (0, 1), (swap, swap)),)))
>>> str(v.kind), v.round, v.rank, v.chunk
('duplicate', 1, 1, 0)
>>> for part in v.message.split(": ", 1)[1].split("; "):
...     print(part)
transfer 0->1 chunk 0 (reduce) gives rank 1 contributions of ranks [0, 1] twice in chunk 0
the doubled value survives in rank 1 chunk 0
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection

from stragglar.errors import InputError
from stragglar.schedule import Op, Round, Schedule, Transfer
from stragglar.verify.report import (
    Kind,
    Proof,
    VerificationError,
    Violation,
    Where,
    bit_list,
    check_header,
    check_transfer,
    chunk_range_violation,
    double_write_violation,
    duplicate_at,
    issue_proof,
    membership_violation,
    op_violation,
    origin,
    port_violation,
    rank_range_violation,
    self_violation,
)

__all__ = ["find_violation", "prove"]

_COPY, _REDUCE = Op.COPY, Op.REDUCE


def prove(schedule: Schedule) -> Proof:
    """Return a :class:`Proof` that ``schedule`` is a correct AllReduce.

    Raises :class:`VerificationError`; use :func:`find_violation` to get the violation without raising.
    """
    start = time.perf_counter()
    violation = find_violation(schedule)
    if violation is not None:
        raise VerificationError(violation)
    return issue_proof(schedule, "simulator", time.perf_counter() - start)


def find_violation(schedule: Schedule) -> Violation | None:
    """Return the first violation in execution order, or None if ``schedule`` is a correct AllReduce.

    Within a round the structural rules are checked before any data moves, so a
    round breaking both reports the structural violation.
    """
    if check_header(schedule).collective != "allreduce":
        raise InputError(f"can only verify allreduce schedules, not {schedule.collective!r}")
    n, c = schedule.num_ranks, schedule.num_chunks
    masks = _initial_masks(n, c)
    last = [-1] * len(masks)  # index into `done` of the round that last wrote each value
    done: list[tuple[Where, Round]] = []
    doubled: list[Violation] = []  # a value marked -(i+1) holds the duplicate doubled[i]
    for pi, phase in enumerate(schedule.phases):
        members = frozenset(phase.ranks)
        for ri, rnd in enumerate(phase.rounds):
            where = Where(pi, phase.name, ri)
            violation = _check_structure(rnd, where, n, c, members)
            if violation is not None:
                return violation
            _apply(rnd, where, masks, last, len(done), c, doubled)
            done.append((where, rnd))
    return _check_final(masks, last, done, doubled, n, c)


def _initial_masks(n: int, c: int) -> list[int]:
    """Flat state, index ``rank * c + chunk``: rank ``r`` starts with ``{r}`` in every chunk."""
    masks: list[int] = []
    for r in range(n):
        masks += [1 << r] * c
    return masks


def _check_structure(rnd: Round, where: Where, n: int, c: int, members: Collection[int]) -> Violation | None:
    """Check the one-port model and that no value is written twice in the round."""
    sends: dict[int, int] = {}
    receives: dict[int, int] = {}
    written: set[int] = set()
    for t in rnd:
        if type(t) is not Transfer:
            check_transfer(t, where)
        src, dst, chunk = t.src, t.dst, t.chunk
        if not (
            type(src) is int
            and type(dst) is int
            and type(chunk) is int
            and 0 <= src < n
            and 0 <= dst < n
            and 0 <= chunk < c
            and src != dst
            and src in members
            and dst in members
            and (t.op is _COPY or t.op is _REDUCE)
        ):
            return _bad_transfer(t, where, n, c, members)
        peer = sends.setdefault(src, dst)
        if peer != dst:
            return port_violation(where, t, sending=True, other_peer=peer)
        peer = receives.setdefault(dst, src)
        if peer != src:
            return port_violation(where, t, sending=False, other_peer=peer)
        key = dst * c + chunk
        if key in written:
            return double_write_violation(where, t)
        written.add(key)
    return None


def _bad_transfer(t: Transfer, where: Where, n: int, c: int, members: Collection[int]) -> Violation:
    """Explain why a single transfer is malformed (slow path of :func:`_check_structure`)."""
    check_transfer(t, where)
    for rank in (t.src, t.dst):
        if not 0 <= rank < n:
            return rank_range_violation(where, t, rank, n)
    if not 0 <= t.chunk < c:
        return chunk_range_violation(where, t, c)
    if t.src == t.dst:
        return self_violation(where, t)
    if not isinstance(t.op, Op):
        return op_violation(where, t)
    return membership_violation(where, t, members)


def _apply(
    rnd: Round,
    where: Where,
    masks: list[int],
    last: list[int],
    index: int,
    c: int,
    doubled: list[Violation],
) -> None:
    """Run one synchronous round: every transfer reads the values from before the round.

    A reduce that counts a contribution twice records the duplicate in ``doubled`` and
    writes its mark (a negative number) instead of a set.
    """
    writes: list[tuple[int, int]] = []
    for t in rnd:
        key = t.dst * c + t.chunk
        value = masks[t.src * c + t.chunk]
        if t.op is _REDUCE:
            old = masks[key]
            if value < 0 or old < 0:
                value = min(value, old)
            elif value & old:
                what = f"gives rank {t.dst} {_contributions(value & old)} twice in chunk {t.chunk}"
                doubled.append(duplicate_at(where, t, what))
                value = -len(doubled)
            else:
                value |= old
        writes.append((key, value))
    for key, value in writes:
        masks[key] = value
        last[key] = index


def _check_final(
    masks: list[int],
    last: list[int],
    done: list[tuple[Where, Round]],
    doubled: list[Violation],
    n: int,
    c: int,
) -> Violation | None:
    """Check that every rank ends with every contribution exactly once.

    A surviving duplicate is reported where it first arose (the earliest one that survives);
    an incomplete value is reported with the place that last wrote it.
    """
    full = (1 << n) - 1
    if masks.count(full) == len(masks):
        return None
    if min(masks) < 0:
        first = max(mask for mask in masks if mask < 0)
        rank, chunk = divmod(masks.index(first), c)
        cause = doubled[-first - 1]
        survives = f"; the doubled value survives in rank {rank} chunk {chunk}"
        return dataclasses.replace(cause, message=cause.message + survives)
    key = next(i for i, mask in enumerate(masks) if mask != full)
    rank, chunk = divmod(key, c)
    missing = f"final state: rank {rank} chunk {chunk} lacks {_contributions(full & ~masks[key])}"
    if last[key] < 0:
        return Violation(Kind.MISSING, None, None, None, None, rank, chunk, f"{missing} (never written)")
    where, rnd = done[last[key]]
    t = next(t for t in rnd if t.dst == rank and t.chunk == chunk)
    message = f"{missing} ({origin(where, t)})"
    return Violation(Kind.MISSING, where.phase, where.name, where.round, t, rank, chunk, message)


def _contributions(mask: int) -> str:
    """Name the ranks in ``mask``, shortened to the first few when there are many."""
    if mask.bit_count() == 1:
        return f"contribution of rank {mask.bit_length() - 1}"
    return f"contributions of ranks {bit_list(mask)}"
