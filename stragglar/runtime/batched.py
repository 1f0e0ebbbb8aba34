"""Loopback rounds as tables: each round a gather and a landing, for a GPU to launch as two
kernels (and a CUDA graph to replay) instead of ~3N small ones.

Every rank's buffer lays its chunks out alike (:class:`~stragglar.runtime.layout.Layout`), so a
received piece of a chunk comes from the same element range of the peer's buffer.  A round is
synchronous (every transfer reads the state from before the round), so it runs in two stages:

- **gather**: every piece any rank receives is copied from its sender's buffer into one round
  buffer, in a fixed order (rows ``(src_rank, src_start, length, slot)``);
- **land**: each piece lands in its receiver's buffer from the round buffer (rows ``(dst_rank,
  dst_start, length, slot)``): copied, or for a reduction added to the receiver's value in place,
  the interpreter's ``buffer += received`` with the same operands, so results are bit for bit the
  interpreter's, floats included.  A proved schedule lands at most one piece on an element per
  round (a rank hears one peer per round), so a round needs no ordering inside a stage.

The gather must finish before the landing starts (a rank may send a chunk and receive into it in
one round), which is why a round is two stages and not one.  The tables are built once per
(schedule, element count) and executed by a backend: NumPy here (the reference of what the tables
mean, slow and exact), CuPy kernels on a GPU (:mod:`~stragglar.runtime.loopback_gpu`).  A backend
reaches the buffers through a *binding* set before each call, so a captured graph of the launches
replays on new buffers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from stragglar.runtime.arrays import Array
from stragglar.runtime.clock import Timeline, sleep_until
from stragglar.runtime.program import Plan

__all__ = [
    "Backend",
    "BatchedPlan",
    "HostBackend",
    "RoundTable",
    "Stages",
    "batched_plan",
    "run_batched",
    "run_rounds",
]


@dataclass(frozen=True)
class RoundTable:
    """One round: ``gather`` rows ``(src_rank, src_start, length, slot)`` fill the round buffer
    (``size`` elements) from the senders; ``land`` rows ``(dst_rank, dst_start, length, slot)``
    put them in the receivers' buffers: slots below ``reduced`` are reductions (added to the
    receiver's values first), the rest copies."""

    round: int
    phase: int
    gather: np.ndarray
    land: np.ndarray
    reduced: int
    size: int
    ranks: frozenset[int]


@dataclass(frozen=True)
class BatchedPlan:
    """Every round of a schedule bound to ``count`` elements per rank; ``joins`` is the index (in
    :attr:`rounds`) of the first round the late rank takes part in (``len(rounds)``: none);
    ``ends[rank][phase]``: whether the rank's last round of the phase comes before ``joins``
    (None: it has none), what a call's timelines are made of."""

    num_ranks: int
    count: int
    num_phases: int
    late_rank: int
    rounds: tuple[RoundTable, ...]
    joins: int
    ends: tuple[tuple[bool | None, ...], ...]

    @property
    def scratch(self) -> int:
        """Elements of round buffer the largest round needs."""
        return max((t.size for t in self.rounds), default=0)

    @property
    def launches(self) -> int:
        """Kernels an eager call launches: per round that moves data a gather and a landing."""
        return sum(2 for t in self.rounds if t.size)


def batched_plan(plans: Sequence[Plan], late_rank: int) -> BatchedPlan:
    """The tables of ``plans`` (one bound plan per rank, one schedule and count): what the
    reference interpreter (:func:`~stragglar.runtime.local.run_local`) does, round by round."""
    by_round: dict[int, list[tuple[int, Any]]] = {}
    for plan in plans:
        for step in plan.steps:
            by_round.setdefault(step.round, []).append((plan.rank, step))
    tables = [_round_table(rnd, sorted(by_round[rnd], key=lambda item: item[0])) for rnd in sorted(by_round)]
    joins = next((i for i, t in enumerate(tables) if late_rank in t.ranks), len(tables))
    count = plans[0].layout.count if plans else 0
    phases = len(plans[0].program.phases) if plans else 0
    ends: list[list[bool | None]] = [[None] * phases for _ in plans]
    for index, table in enumerate(tables):
        for rank in table.ranks:
            ends[rank][table.phase] = index < joins
    frozen = tuple(tuple(row) for row in ends)
    return BatchedPlan(len(plans), count, phases, late_rank, tuple(tables), joins, frozen)


def _round_table(rnd: int, steps: list[tuple[int, Any]]) -> RoundTable:
    """Reductions first, then copies, each in the interpreter's order (by receiver, then peer)."""
    gather: list[tuple[int, int, int, int]] = []
    land: list[tuple[int, int, int, int]] = []
    slot, reduced = 0, 0
    for reductions in (True, False):
        for rank, step in steps:
            for message in step.recvs:
                for start, stop, reduce in message.pieces:
                    if reduce is reductions and stop > start:  # an empty chunk moves nothing
                        gather.append((message.peer, start, stop - start, slot))
                        land.append((rank, start, stop - start, slot))
                        slot += stop - start
        if reductions:
            reduced = slot  # the reductions' slots end here
    _check_disjoint(land, rnd)
    ranks = frozenset(rank for rank, _ in steps)
    return RoundTable(rnd, steps[0][1].phase, _rows(gather), _rows(land), reduced, slot, ranks)


def _check_disjoint(land: list[tuple[int, int, int, int]], rnd: int) -> None:
    """One stage lands a round, so no two pieces may land on one element: a proved schedule
    guarantees it (a rank receives from one peer per round, and no chunk twice)."""
    ends: dict[int, int] = {}
    for rank, start, length, _ in sorted(land):
        if start < ends.get(rank, 0):
            raise AssertionError(f"round {rnd}: two pieces land on rank {rank}'s element {start}")
        ends[rank] = start + length


def _rows(rows: Sequence[tuple[int, ...]]) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(len(rows), 4)


class Stages(Protocol):
    """What a backend launches for round ``index`` of the plan it was bound to: ``gather`` the
    pieces received into the round buffer, then ``land`` them in the receivers' buffers (adding
    the reduced slots to the receivers' values)."""

    def gather(self, index: int) -> None: ...

    def land(self, index: int) -> None: ...


def run_rounds(plan: BatchedPlan, first: int, stop: int, stages: Stages) -> None:
    """Rounds ``first`` to ``stop - 1`` of ``plan`` as stages.  Every backend runs exactly this, so
    the host tests check the order a GPU runs."""
    for index in range(first, stop):
        if plan.rounds[index].size:  # else only empty chunks (fewer elements than chunks)
            stages.gather(index)
            stages.land(index)


class HostBackend:
    """The stages on NumPy arrays: a loop over rows, exact and slow; the tests run every schedule
    through it against the reference interpreter."""

    def __init__(self) -> None:
        self.flats: Sequence[Array] = ()
        self.plan: BatchedPlan | None = None
        self.received: Any = None

    def bind(self, flats: Sequence[Array], plan: BatchedPlan) -> None:
        self.flats, self.plan = flats, plan
        if (
            self.received is None
            or self.received.shape[0] < plan.scratch
            or self.received.dtype != flats[0].dtype
        ):
            self.received = np.empty_like(flats[0], shape=(plan.scratch,))

    def run(self, plan: BatchedPlan, first: int, stop: int) -> None:
        run_rounds(plan, first, stop, self)

    def _table(self, index: int) -> RoundTable:
        assert self.plan is not None, "bind before running"
        return self.plan.rounds[index]

    def gather(self, index: int) -> None:
        for rank, start, length, slot in self._table(index).gather.tolist():
            self.received[slot : slot + length] = self.flats[rank][start : start + length]

    def land(self, index: int) -> None:
        table = self._table(index)
        for rank, start, length, slot in table.land.tolist():
            piece = self.received[slot : slot + length]
            if slot < table.reduced:
                self.flats[rank][start : start + length] += piece
            else:
                self.flats[rank][start : start + length] = piece

    def synchronize(self) -> None:
        pass


class Backend(Protocol):
    """Runs a plan's rounds on buffers it was bound to: ``bind`` before each call (cheap: pointers
    and scratch), ``run`` launches rounds ``first`` to ``stop - 1``, ``synchronize`` waits for them."""

    def bind(self, flats: Sequence[Array], plan: BatchedPlan) -> None: ...

    def run(self, plan: BatchedPlan, first: int, stop: int) -> None: ...

    def synchronize(self) -> None: ...


def run_batched(
    flats: Sequence[Array],
    plan: BatchedPlan,
    backend: Backend,
    straggler_delay: float = 0.0,
    *,
    runner: Callable[[BatchedPlan, int, int], None] | None = None,
) -> list[Timeline]:
    """AllReduce ``flats`` in place with ``plan`` on ``backend``: the rounds before the late rank
    joins at once, the rest once ``straggler_delay`` has passed (the sleep stays on the host,
    outside any graph).  ``runner`` replaces ``backend.run`` (a graph cache that replays)."""
    run = runner or backend.run
    start = time.perf_counter()
    backend.bind(flats, plan)
    run(plan, 0, plan.joins)
    early = time.perf_counter()
    arrived = sleep_until(start + straggler_delay)
    run(plan, plan.joins, len(plan.rounds))
    backend.synchronize()
    done = time.perf_counter()
    times = {None: None, True: early, False: done}  # host issue times, as the interpreter records on a GPU
    return [
        Timeline(r, start, arrived if r == plan.late_rank else start, tuple(times[e] for e in ends), done)
        for r, ends in enumerate(plan.ends)
    ]
