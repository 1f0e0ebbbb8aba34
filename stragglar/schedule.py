"""The schedule IR: the one data structure every other part of stragglar consumes.

A :class:`Schedule` is a list of phases; a phase is a list of synchronous rounds;
a round is a set of chunk :class:`Transfer` s.  Generators (``stragglar.synth``)
produce it, and verifiers, exporters, the cost model and the runtime read it.
The classes are frozen so that a verified schedule cannot change afterwards.

Semantics (also the JSON format's, see ``stragglar.formats.json``): rank ``r``
starts with its own contribution in every chunk.  In a round every transfer
reads the state at the start of the round; ``copy`` sets the destination's chunk
to the source's, ``reduce`` adds the source's chunk to the destination's.

>>> t = Transfer(src=0, dst=1, chunk=0, op=Op.REDUCE)
>>> s = Schedule("demo", num_ranks=2, num_chunks=1, straggler=None,
...              phases=(Phase("exchange", (0, 1), ((t, Transfer(1, 0, 0, Op.REDUCE)),)),))
>>> s.num_rounds
1
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Op", "Phase", "Round", "Schedule", "Transfer", "move_straggler", "relabel_ranks"]


class Op(str, enum.Enum):
    """What the destination does with a received chunk."""

    COPY = "copy"
    REDUCE = "reduce"


@dataclass(frozen=True, slots=True)
class Transfer:
    """One chunk sent from ``src`` to ``dst`` in one round."""

    src: int
    dst: int
    chunk: int
    op: Op = Op.COPY


Round = tuple[Transfer, ...]


@dataclass(frozen=True, slots=True)
class Phase:
    """Consecutive rounds run by a subset of the ranks.

    StragglAR's ReduceScatter is a phase without the straggler: it runs while
    the straggler is late, so its rounds are hidden behind the delay.
    """

    name: str
    ranks: tuple[int, ...]
    rounds: tuple[Round, ...]

    @property
    def num_transfers(self) -> int:
        return sum(len(r) for r in self.rounds)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A complete collective schedule over ``num_ranks`` ranks and ``num_chunks`` chunks."""

    algorithm: str
    num_ranks: int
    num_chunks: int
    straggler: int | None
    phases: tuple[Phase, ...]
    collective: str = "allreduce"
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def num_rounds(self) -> int:
        """All rounds, hidden ones included."""
        return sum(len(p.rounds) for p in self.phases)

    @property
    def straggler_rounds(self) -> int:
        """Rounds of the phases that include the straggler: the time exposed after it arrives.

        For a schedule without a straggler every round counts.
        """
        return sum(len(p.rounds) for p in self.phases if self.straggler is None or self.straggler in p.ranks)

    @property
    def num_transfers(self) -> int:
        return sum(p.num_transfers for p in self.phases)

    def transfers(self) -> Iterator[tuple[int, int, Transfer]]:
        """Yield ``(phase_index, round_index, transfer)`` in execution order."""
        for pi, phase in enumerate(self.phases):
            for ri, rnd in enumerate(phase.rounds):
                for t in rnd:
                    yield pi, ri, t


def relabel_ranks(schedule: Schedule, mapping: Sequence[int]) -> Schedule:
    """Return ``schedule`` with rank ``r`` renamed ``mapping[r]``.

    Generators build StragglAR with the straggler last; relabelling moves it to any rank.

    >>> s = Schedule("x", 2, 1, 1, (Phase("p", (0, 1), ((Transfer(0, 1, 0),),)),))
    >>> relabel_ranks(s, [1, 0]).phases[0].rounds[0][0]
    Transfer(src=1, dst=0, chunk=0, op=<Op.COPY: 'copy'>)
    """
    if sorted(mapping) != list(range(schedule.num_ranks)):
        raise ValueError(f"mapping must be a permutation of 0..{schedule.num_ranks - 1}")
    m = list(mapping)
    phases = tuple(
        Phase(
            p.name,
            tuple(m[r] for r in p.ranks),
            tuple(tuple(Transfer(m[t.src], m[t.dst], t.chunk, t.op) for t in rnd) for rnd in p.rounds),
        )
        for p in schedule.phases
    )
    straggler = None if schedule.straggler is None else m[schedule.straggler]
    return Schedule(
        schedule.algorithm,
        schedule.num_ranks,
        schedule.num_chunks,
        straggler,
        phases,
        schedule.collective,
        dict(schedule.metadata),
    )


def move_straggler(schedule: Schedule, straggler: int) -> Schedule:
    """Relabel so that the schedule's straggler becomes rank ``straggler``.

    The other ranks keep their relative order, so the result stays deterministic.

    >>> s = Schedule("x", 3, 1, 2, (Phase("p", (0, 1, 2), ((Transfer(2, 0, 0),),)),))
    >>> move_straggler(s, 0).phases[0].rounds[0][0]
    Transfer(src=0, dst=1, chunk=0, op=<Op.COPY: 'copy'>)
    """
    n = schedule.num_ranks
    if schedule.straggler is None:
        raise ValueError(f"schedule '{schedule.algorithm}' has no straggler to move")
    if not 0 <= straggler < n:
        raise ValueError(f"straggler must be a rank in 0..{n - 1}, got {straggler}")
    others = [r for r in range(n) if r != straggler]
    mapping = [0] * n
    old_others = [r for r in range(n) if r != schedule.straggler]
    for old, new in zip(old_others, others, strict=True):
        mapping[old] = new
    mapping[schedule.straggler] = straggler
    return relabel_ranks(schedule, mapping)
