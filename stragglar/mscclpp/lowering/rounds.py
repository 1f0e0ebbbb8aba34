"""Lowering stage 1: what every GPU does in every round, as puts into peers' scratch and local reductions.

A schedule round is synchronous: every transfer reads the state from the start of the round.  On
MSCCL++ memory channels a transfer ``s -> d`` of chunk ``c`` becomes

* on ``s``: a one-sided ``put`` of its chunk ``c`` into a scratch slot of ``d`` reserved for this
  transfer alone, then a ``signal`` to ``d``;
* on ``d``: a ``wait`` for that signal, then a local ``re`` (reduce: ``c += slot``) or ``copy``.

Each GPU runs its rounds in order and, inside a round, issues all its puts and signals before any
of its waits.  Putting into scratch, never into the peer's live chunk, is what makes the StragglAR
exchange safe: both ends read their own chunk ``c`` for the put before either overwrites it, so
there is no write-after-read hazard and no extra handshake.  Because a slot is written once per
execution, scratch is never reused inside an execution either; across executions a writer first
waits for the receiver's *ready* signal (see :mod:`stragglar.mscclpp.lowering.threadblocks`).

Consecutive chunks sent in one round to one peer with the same operation become one run (one put,
one reduce/copy of ``count`` chunks) on consecutive slots.  The number of chunks is whatever the
schedule says: nothing here assumes ``num_chunks == num_ranks - 1``.

>>> from stragglar.synth import synthesize
>>> p = build_programs(synthesize("stragglar", 3))
>>> work = p.gpus[2].rounds[p.num_rounds - 3]  # the straggler's first exchange
>>> work.sends  # into GPU 0's slot 1 (slot 0 got GPU 1's reduce-scatter chunk)
(Run(peer=0, chunk=0, slot=1, count=1, reduce=True),)
>>> work.receives
(Run(peer=0, chunk=0, slot=0, count=1, reduce=True),)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from stragglar.schedule import Op, Schedule

__all__ = ["GpuProgram", "Programs", "RoundWork", "Run", "build_programs"]


@dataclass(frozen=True, slots=True)
class Run:
    """``count`` consecutive chunks from ``chunk`` on, carried in scratch slots ``slot`` on of the receiver.

    In a send ``peer`` is the receiver, in a receive the sender; ``reduce`` says whether the
    receiver adds the data (``re``) or replaces its chunk with it (``copy``).
    """

    peer: int
    chunk: int
    slot: int
    count: int
    reduce: bool


@dataclass(frozen=True, slots=True)
class RoundWork:
    """One GPU's part of one round: the runs it sends and the runs it receives."""

    sends: tuple[Run, ...]
    receives: tuple[Run, ...]


@dataclass(frozen=True, slots=True)
class GpuProgram:
    """One GPU's rounds (``None`` where it is idle) and the scratch slots it needs."""

    gpu: int
    rounds: tuple[RoundWork | None, ...]
    scratch_chunks: int


@dataclass(frozen=True, slots=True)
class Programs:
    """Every GPU's program over the schedule's rounds, numbered globally across phases.

    ``first_write[(s, d)]`` is the round of the first put of ``s`` into ``d``: ``d`` must signal
    that it is ready before that put may land (it may still be using its scratch for the previous
    execution, and a straggler's kernel starts late).
    """

    algorithm: str
    num_gpus: int
    num_chunks: int
    straggler: int | None
    num_rounds: int
    gpus: tuple[GpuProgram, ...]
    first_write: dict[tuple[int, int], int]


def _runs(chunks: list[int], first_slot: int, peer: int, reduce: bool) -> list[Run]:
    """Split sorted chunk indices into maximal runs of consecutive chunks on consecutive slots."""
    runs: list[Run] = []
    slot = first_slot
    for chunk in chunks:
        last = runs[-1] if runs else None
        if last is not None and last.chunk + last.count == chunk:
            runs[-1] = Run(peer, last.chunk, last.slot, last.count + 1, reduce)
        else:
            runs.append(Run(peer, chunk, slot, 1, reduce))
        slot += 1
    return runs


def build_programs(schedule: Schedule) -> Programs:
    """Turn the schedule's rounds into per-GPU send and receive runs with their scratch slots.

    Slots of a receiver are numbered in (round, sender, operation, chunk) order, so both ends
    compute the same slot for a transfer without talking to each other.
    """
    n = schedule.num_ranks
    rounds = [rnd for phase in schedule.phases for rnd in phase.rounds]
    sends: list[list[list[Run]]] = [[[] for _ in rounds] for _ in range(n)]
    receives: list[list[list[Run]]] = [[[] for _ in rounds] for _ in range(n)]
    next_slot = [0] * n
    first_write: dict[tuple[int, int], int] = {}
    for r, rnd in enumerate(rounds):
        grouped: dict[tuple[int, int, bool], list[int]] = defaultdict(list)
        for t in rnd:
            grouped[(t.dst, t.src, t.op is Op.REDUCE)].append(t.chunk)
        for (dst, src, reduce), chunks in sorted(
            grouped.items(), key=lambda kv: (kv[0][0], kv[0][1], not kv[0][2])
        ):
            runs = _runs(sorted(chunks), next_slot[dst], src, reduce)
            next_slot[dst] += len(chunks)
            receives[dst][r].extend(runs)
            sends[src][r].extend(Run(dst, x.chunk, x.slot, x.count, reduce) for x in runs)
            first_write.setdefault((src, dst), r)
    gpus = tuple(
        GpuProgram(
            gpu=g,
            rounds=tuple(
                RoundWork(tuple(sends[g][r]), tuple(receives[g][r]))
                if sends[g][r] or receives[g][r]
                else None
                for r in range(len(rounds))
            ),
            scratch_chunks=next_slot[g],
        )
        for g in range(n)
    )
    return Programs(
        algorithm=schedule.algorithm,
        num_gpus=n,
        num_chunks=schedule.num_chunks,
        straggler=schedule.straggler,
        num_rounds=len(rounds),
        gpus=gpus,
        first_write=first_write,
    )
