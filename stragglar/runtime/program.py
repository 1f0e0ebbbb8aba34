"""Compile a schedule once into per-rank programs, then bind them to a buffer layout.

A :class:`RankProgram` lists, for each round a rank takes part in, the messages it sends and
receives: all chunks a round moves between the same two ranks travel as one message.  The
schedule's rounds are synchronous (every transfer reads the state from before the round), but
transports overlap sends with receives, so a received chunk lands in place only when it is a copy
of a chunk this rank does not send in the same round; everything else (every reduce, every chunk
also being sent) lands in scratch and is applied after the round.  :func:`bind` turns chunks into
element ranges; messages that turn out empty are dropped, identically on both ends.

>>> from stragglar.synth import synthesize
>>> p = compile_schedule(synthesize("stragglar", 3))[2]  # the runtime compiles proved schedules only
>>> [(s.round, s.sends[0].peer, s.sends[0].chunks, [m.in_place for m in s.recvs]) for s in p.steps]
[(1, 0, (0,), [False]), (2, 1, (1,), [False]), (3, 1, (0,), [])]
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

from stragglar.errors import InputError
from stragglar.runtime.layout import Layout
from stragglar.schedule import Op, Schedule

__all__ = ["BoundMessage", "BoundStep", "Message", "Plan", "RankProgram", "Step", "bind", "compile_schedule"]


@dataclass(frozen=True, slots=True)
class Message:
    """Chunks (ascending) moved between this rank and ``peer`` in one round; ``tag`` is the round."""

    peer: int
    tag: int
    chunks: tuple[int, ...]
    reduce: tuple[bool, ...] = ()
    in_place: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    """One round as seen by one rank."""

    round: int
    phase: int
    sends: tuple[Message, ...]
    recvs: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class RankProgram:
    """One rank's steps; ``phase_starts[i]`` is the index of phase ``i``'s first round among all
    rounds (a step's ``round`` counts across phases, messages name rounds within their phase).
    ``late_rank`` is the schedule's (:attr:`~stragglar.schedule.Schedule.late_rank`): the rank a
    plan waits for unless the caller names another."""

    rank: int
    num_ranks: int
    num_chunks: int
    late_rank: int
    phases: tuple[str, ...]
    steps: tuple[Step, ...]
    phase_starts: tuple[int, ...] = ()

    def phase_round(self, round_index: int, phase: int) -> int:
        """``round_index`` (across phases) as a round number within ``phase``."""
        return round_index - (self.phase_starts[phase] if self.phase_starts else 0)


def compile_schedule(schedule: Schedule) -> tuple[RankProgram, ...]:
    """One program per rank (the runtime's entry points accept proved schedules only)."""
    if schedule.collective != "allreduce":
        raise InputError(f"can only run allreduce schedules, not {schedule.collective!r}")
    steps: list[list[Step]] = [[] for _ in range(schedule.num_ranks)]
    round_index = 0
    for phase_index, phase in enumerate(schedule.phases):
        for rnd in phase.rounds:
            out: dict[int, dict[int, list[tuple[int, bool]]]] = defaultdict(lambda: defaultdict(list))
            into: dict[int, dict[int, list[tuple[int, bool]]]] = defaultdict(lambda: defaultdict(list))
            for t in rnd:
                out[t.src][t.dst].append((t.chunk, False))
                into[t.dst][t.src].append((t.chunk, t.op is Op.REDUCE))
            for rank in sorted(out.keys() | into.keys()):
                sent = {chunk for chunks in out[rank].values() for chunk, _ in chunks}
                sends = tuple(
                    _message(peer, round_index, out[rank][peer], sent) for peer in sorted(out[rank])
                )
                recvs = tuple(
                    _message(peer, round_index, into[rank][peer], sent) for peer in sorted(into[rank])
                )
                steps[rank].append(Step(round_index, phase_index, sends, recvs))
            round_index += 1
    names = tuple(p.name for p in schedule.phases)
    starts = tuple(itertools.accumulate((len(p.rounds) for p in schedule.phases[:-1]), initial=0))
    n, c, late_rank = schedule.num_ranks, schedule.num_chunks, schedule.late_rank
    return tuple(RankProgram(r, n, c, late_rank, names, tuple(steps[r]), starts) for r in range(n))


def _message(peer: int, tag: int, items: list[tuple[int, bool]], sent: set[int]) -> Message:
    items.sort()
    chunks = tuple(chunk for chunk, _ in items)
    reduce = tuple(r for _, r in items)
    contiguous = chunks == tuple(range(chunks[0], chunks[0] + len(chunks)))
    in_place = contiguous and not any(reduce) and not sent.intersection(chunks)
    return Message(peer, tag, chunks, reduce, in_place)


@dataclass(frozen=True, slots=True)
class BoundMessage:
    """A message in elements.  ``pieces`` are ``(start, stop, reduce)`` buffer ranges in message
    order; ``direct`` is the buffer range the transport may use as is, else the message goes through
    ``work[staging : staging + size]``."""

    peer: int
    tag: int
    size: int
    pieces: tuple[tuple[int, int, bool], ...]
    direct: tuple[int, int] | None
    staging: int


@dataclass(frozen=True, slots=True)
class BoundStep:
    round: int
    phase: int
    sends: tuple[BoundMessage, ...]
    recvs: tuple[BoundMessage, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """A rank program bound to a buffer: what a transport executes.  ``work_size`` is the
    scratch (received reduces, chunks also being sent) plus packing space the largest round needs."""

    program: RankProgram
    layout: Layout
    steps: tuple[BoundStep, ...]
    work_size: int

    @property
    def rank(self) -> int:
        return self.program.rank


def bind(program: RankProgram, count: int, tag_base: int = 0) -> Plan:
    """Bind ``program`` to a ``count``-element buffer; tags become ``tag_base + round``."""
    layout = Layout.even(count, program.num_chunks)
    steps: list[BoundStep] = []
    work_size = 0
    for step in program.steps:
        used = 0
        bound: list[list[BoundMessage]] = [[], []]
        for out, messages in zip(bound, (step.sends, step.recvs), strict=True):
            for m in messages:
                bm = _bind_message(m, layout, tag_base, used, is_send=out is bound[0])
                if bm.size:
                    out.append(bm)
                    used += 0 if bm.direct else bm.size
        work_size = max(work_size, used)
        if bound[0] or bound[1]:
            steps.append(BoundStep(step.round, step.phase, tuple(bound[0]), tuple(bound[1])))
    return Plan(program, layout, tuple(steps), work_size)


def _bind_message(m: Message, layout: Layout, tag_base: int, staging: int, is_send: bool) -> BoundMessage:
    reduce = m.reduce or (False,) * len(m.chunks)
    pieces = tuple((*layout.bounds[c], r) for c, r in zip(m.chunks, reduce, strict=True))
    size = sum(stop - start for start, stop, _ in pieces)
    contiguous = all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    direct = (pieces[0][0], pieces[-1][1]) if contiguous and (is_send or m.in_place) else None
    return BoundMessage(m.peer, tag_base + m.tag, size, pieces, direct, 0 if direct else staging)
