"""Lowering stage 3: order every chunk access within a GPU with the fewest dependencies.

Thread blocks (TBs) of one GPU run concurrently, so a step that touches a chunk written or read
by another TB of its GPU must wait for that access: a dependency (``depid``/``deps``) on the
step, ``nop`` steps before it when it needs several, and ``hasdep`` on each step waited for (only
those signal).  Each TB keeps what is known to happen before its next step (a vector clock over
TBs); a dependency already implied through other dependencies is skipped.

Operations come in issue order from stage 2.  The copies back from scratch go on a local TB of
their GPU, a new one whenever the current one would pass the step limit.

No deadlock, for any FIFO capacity >= 1.  Give each send its (instance, round, chunk, 0) and each
receive its (instance, round, chunk, 1).  Every wait goes to a smaller key: a receive waits for
its send; a send waits for room, freed by the receive of an earlier item of its FIFO;
dependencies point to earlier rounds, or, in-round, from a one-chunk receive of chunk c to the
one-chunk send of chunk c; the final copies wait for everything and nothing waits for them.  TB
programs are sorted by key, so in any stuck state the TB blocked at the smallest key would wait
for a smaller one.  :mod:`stragglar.msccl.prover` re-proves the written file independently.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from stragglar.msccl.lowering.threadblocks import Assignment, Fifo, Loc, Operation, ThreadBlock
from stragglar.msccl.vocabulary import MAX_STEPS, Operands

__all__ = ["Programs", "Step", "order"]

Clock = dict[ThreadBlock, int]  # TB -> the last of its steps known to have happened


@dataclass
class Step:
    """A step being placed; ``hasdep`` turns on when a later step comes to wait for it."""

    operands: Operands
    dep: tuple[ThreadBlock, int] | None = None
    hasdep: bool = False


NOP = Operands("nop", "i", -1, "i", -1, 0)


@dataclass
class Programs:
    """Stage 3's result: every TB's steps (local TBs for the copies back added to ``tbs``) and, per
    TB, the position of each FIFO item it carries."""

    tbs: list[ThreadBlock]
    steps: defaultdict[ThreadBlock, list[Step]] = field(default_factory=lambda: defaultdict(list))
    items: defaultdict[ThreadBlock, list[tuple[int, Fifo, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )


class _Orderer:
    def __init__(self, assignment: Assignment) -> None:
        self.programs = Programs(list(assignment.tbs))
        self.last_write: dict[Loc, tuple[ThreadBlock, int]] = {}
        self.readers: defaultdict[Loc, dict[ThreadBlock, int]] = defaultdict(dict)
        self.known: dict[ThreadBlock, Clock] = {}
        self.known_at: defaultdict[ThreadBlock, dict[int, Clock]] = defaultdict(dict)
        self.local: dict[int, ThreadBlock] = {}

    def place(self, op: Operation) -> None:
        tb = op.tb if op.tb is not None else self._local_tb(op)
        step = Step(op.operands)
        pos = self._add(tb, step, op.reads, op.writes)
        if op.item is not None:
            self.programs.items[tb].append((pos, *op.item))

    def _local_tb(self, op: Operation) -> ThreadBlock:
        tb = self.local.get(op.gpu)
        if (
            tb is None
            or len(self.programs.steps[tb]) + max(1, len(self._deps(tb, op.reads, op.writes))) > MAX_STEPS
        ):
            tb = self.local[op.gpu] = ThreadBlock(op.gpu, -1, -1, 0, len(self.programs.tbs))
            self.programs.tbs.append(tb)
        return tb

    def _deps(
        self, tb: ThreadBlock, reads: tuple[Loc, ...], writes: tuple[Loc, ...]
    ) -> list[tuple[ThreadBlock, int]]:
        """The fewest dependencies that order this step after every conflicting access by another TB."""
        wanted: dict[ThreadBlock, int] = {}
        for loc in reads + writes:
            last = self.last_write.get(loc)
            if last is not None and last[0] is not tb:
                wanted[last[0]] = max(wanted.get(last[0], -1), last[1])
        for loc in writes:
            for other, pos in self.readers[loc].items():
                if other is not tb:
                    wanted[other] = max(wanted.get(other, -1), pos)
        known = self.known.get(tb, {})
        needed = [(u, p) for u, p in wanted.items() if known.get(u, -1) < p]
        return sorted(
            (
                (u, p)
                for u, p in needed
                if not any(self.known_at[v][q].get(u, -1) >= p for v, q in needed if v is not u)
            ),
            key=lambda d: (d[0].order, d[1]),
        )

    def _add(self, tb: ThreadBlock, step: Step, reads: tuple[Loc, ...], writes: tuple[Loc, ...]) -> int:
        """Append ``step`` (after one nop per extra dependency) and record its accesses; its position."""
        steps = self.programs.steps[tb]
        deps = self._deps(tb, reads, writes)
        for dep in deps[:-1]:
            steps.append(Step(NOP, dep))
        step.dep = deps[-1] if deps else None
        steps.append(step)
        pos = len(steps) - 1
        clock = self.known.get(tb, {})
        if deps:
            clock = dict(clock)
            for u, p in deps:
                self.programs.steps[u][p].hasdep = True
                for v, q in [*self.known_at[u][p].items(), (u, p)]:
                    if clock.get(v, -1) < q:
                        clock[v] = q
        self.known[tb] = self.known_at[tb][pos] = clock
        for loc in reads:
            self.readers[loc][tb] = pos
        for loc in writes:
            self.last_write[loc] = (tb, pos)
            self.readers[loc] = {}
        return pos


def order(assignment: Assignment) -> Programs:
    """Place stage 2's operations in issue order, with the dependencies that order them."""
    orderer = _Orderer(assignment)
    for op in assignment.operations:
        orderer.place(op)
    return orderer.programs
