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
>>> v = check(Schedule("demo", 2, 1, None, (Phase("exchange", (0, 1), (swap, swap)),)))
>>> v.kind, v.round, v.rank, v.chunk
('duplicate', 1, 1, 0)
>>> for part in v.message.split(": ", 1)[1].split("; "):
...     print(part)
transfer 0->1 chunk 0 (reduce) gives rank 1 contributions of ranks [0, 1] twice in chunk 0
the doubled value survives in rank 1 chunk 0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, TypeVar

from stragglar.schedule import Op, Round, Schedule, Transfer

__all__ = ["Proof", "VerificationError", "Violation", "Where", "bit_list", "check", "prove"]

_SHOWN_RANKS = 8
_P = TypeVar("_P", bound="Proof")
_COPY, _REDUCE = Op.COPY, Op.REDUCE


@dataclass(frozen=True)
class Violation:
    """Why a schedule is not a correct AllReduce, located where it first goes wrong.

    ``phase``, ``phase_name``, ``round`` and ``transfer`` locate the offending
    transfer; for a ``"missing"`` contribution, found in the final state, they
    locate the last write of the incomplete value (None if it was never written).
    """

    kind: str
    phase: int | None
    phase_name: str | None
    round: int | None
    transfer: Transfer | None
    rank: int
    chunk: int
    message: str

    def __str__(self) -> str:
        return self.message


class VerificationError(Exception):
    """Raised by :func:`prove`; ``.violation`` says what went wrong and where."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(violation.message)
        self.violation = violation


@dataclass(frozen=True)
class Proof:
    """Evidence that a schedule is a correct AllReduce, with the sizes that were proved."""

    num_ranks: int
    num_chunks: int
    num_rounds: int
    straggler_rounds: int
    num_transfers: int

    @classmethod
    def of(cls: type[_P], schedule: Schedule, **extra: Any) -> _P:
        """The proof for ``schedule``'s sizes; ``extra`` fills a subclass's own fields."""
        sizes = (schedule.num_ranks, schedule.num_chunks, schedule.num_rounds, schedule.straggler_rounds)
        return cls(*sizes, schedule.num_transfers, **extra)

    @property
    def summary(self) -> str:
        rounds = _count(self.num_rounds, "round")
        if self.straggler_rounds != self.num_rounds:
            rounds = (
                f"{_count(self.straggler_rounds, 'round')} after the straggler ({self.num_rounds} in all)"
            )
        return (
            f"proved: allreduce over {_count(self.num_ranks, 'rank')}, {_count(self.num_chunks, 'chunk')}, "
            f"{rounds}, {_count(self.num_transfers, 'transfer')}"
        )


@dataclass(frozen=True)
class Where:
    """A round's place in a schedule, as every verifier's messages name it."""

    phase: int
    name: str
    round: int

    def __str__(self) -> str:
        return f"phase {self.phase} {self.name!r} round {self.round}"


def prove(schedule: Schedule) -> Proof:
    """Return a :class:`Proof` that ``schedule`` is a correct AllReduce.

    Raises :class:`VerificationError`; use :func:`check` to get the violation without raising.
    """
    violation = check(schedule)
    if violation is not None:
        raise VerificationError(violation)
    return Proof.of(schedule)


def check(schedule: Schedule) -> Violation | None:
    """Return the first violation in execution order, or None if ``schedule`` is a correct AllReduce.

    Within a round the structural rules are checked before any data moves, so a
    round breaking both reports the structural violation.
    """
    if schedule.collective != "allreduce":
        raise ValueError(f"can only verify allreduce schedules, not {schedule.collective!r}")
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
        src, dst, chunk = t.src, t.dst, t.chunk
        if not (
            0 <= src < n
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
            return _at(where, t, "port", src, f"makes rank {src} send to a second peer (rank {peer})")
        peer = receives.setdefault(dst, src)
        if peer != src:
            return _at(where, t, "port", dst, f"makes rank {dst} receive from a second peer (rank {peer})")
        key = dst * c + chunk
        if key in written:
            return _at(where, t, "double-write", dst, f"writes rank {dst} chunk {chunk} twice in one round")
        written.add(key)
    return None


def _bad_transfer(t: Transfer, where: Where, n: int, c: int, members: Collection[int]) -> Violation:
    """Explain why a single transfer is malformed (slow path of :func:`_check_structure`)."""
    for rank in (t.src, t.dst):
        if not 0 <= rank < n:
            return _at(where, t, "range", rank, f"names rank {rank}, outside 0..{n - 1}")
    if not 0 <= t.chunk < c:
        return _at(where, t, "range", t.dst, f"writes rank {t.dst} chunk {t.chunk}, outside 0..{c - 1}")
    if t.src == t.dst:
        return _at(where, t, "self", t.src, f"sends rank {t.src} chunk {t.chunk} to itself")
    if not isinstance(t.op, Op):
        return _at(where, t, "op", t.dst, f"has unknown op {t.op!r} for rank {t.dst}")
    rank = t.src if t.src not in members else t.dst
    return _at(where, t, "membership", rank, f"involves rank {rank}, which is not in this phase")


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
                doubled.append(_at(where, t, "duplicate", t.dst, what))
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
        return Violation("missing", None, None, None, None, rank, chunk, f"{missing} (never written)")
    where, rnd = done[last[key]]
    t = next(t for t in rnd if t.dst == rank and t.chunk == chunk)
    origin = f"last written in {where} by {t.src}->{t.dst} chunk {t.chunk} {t.op.value}"
    return Violation("missing", where.phase, where.name, where.round, t, rank, chunk, f"{missing} ({origin})")


def _at(where: Where, t: Transfer, kind: str, rank: int, what: str) -> Violation:
    """A violation caused by transfer ``t``; ``what`` completes the sentence naming it."""
    op = t.op.value if isinstance(t.op, Op) else repr(t.op)
    message = f"{where}: transfer {t.src}->{t.dst} chunk {t.chunk} ({op}) {what}"
    return Violation(kind, where.phase, where.name, where.round, t, rank, t.chunk, message)


def _contributions(mask: int) -> str:
    """Name the ranks in ``mask``, shortened to the first few when there are many."""
    if mask.bit_count() == 1:
        return f"contribution of rank {mask.bit_length() - 1}"
    return f"contributions of ranks {bit_list(mask)}"


def bit_list(mask: int, shown: int = _SHOWN_RANKS) -> str:
    """``[0, 3, 5]``: the set bits of ``mask``, the first ``shown`` of them and a count of the rest.

    >>> bit_list(0b101001), bit_list((1 << 12) - 1, shown=3)
    ('[0, 3, 5]', '[0, 1, 2, ... (9 more)]')
    """
    names: list[str] = []
    while mask and len(names) < shown:
        low = mask & -mask
        names.append(str(low.bit_length() - 1))
        mask ^= low
    more = f", ... ({mask.bit_count()} more)" if mask else ""
    return f"[{', '.join(names)}{more}]"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
