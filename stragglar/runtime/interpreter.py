"""The interpreter every transport shares: run a bound plan round by round on one rank.

Buffers are NumPy, CuPy or torch arrays; the interpreter only slices them, copies into slices and
adds into slices, which all three spell the same way (:mod:`~stragglar.runtime.arrays`).  A
transport only moves one round's messages (:class:`Transport`); packing, scratch and the
reductions after the round happen here, so every engine computes exactly what the local
reference computes.  A transport's caller may pack and land with its own kernels instead (a
:class:`Packing`: the CuPy/NCCL transport's), which add the same operands, so the same bits.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

from stragglar.runtime.arrays import Array, library_of, scratch_for
from stragglar.runtime.clock import Timeline
from stragglar.runtime.plans import late_rank_for
from stragglar.runtime.program import BoundMessage, BoundStep, Plan

__all__ = [
    "SLICE_PACKING",
    "Packing",
    "SlicePacking",
    "Transport",
    "apply",
    "recv_view",
    "run_rank",
    "run_rank_replayed",
    "send_view",
]


class Transport(Protocol):
    """Moves one round's messages: every ``recvs[i]`` view filled from its peer's matching send."""

    def exchange(self, step: BoundStep, sends: list[Array], recvs: list[Array]) -> None: ...

    def finish(self) -> None: ...


def send_view(flat: Array, work: Array, m: BoundMessage) -> Array:
    """What to send for ``m``: a buffer slice, or its chunks packed into ``work`` (a torch
    tensor's in one ``cat``: one kernel on a GPU, not one per chunk)."""
    if m.direct is not None:
        return flat[m.direct[0] : m.direct[1]]
    packed = work[m.staging : m.staging + m.size]
    if len(m.pieces) > 1 and library_of(flat) == "torch":
        sys.modules["torch"].cat([flat[a:b] for a, b, _ in m.pieces], out=packed)
        return packed
    offset = m.staging
    for start, stop in ((a, b) for a, b, _ in m.pieces):
        work[offset : offset + stop - start] = flat[start:stop]
        offset += stop - start
    return packed


def recv_view(flat: Array, work: Array, m: BoundMessage) -> Array:
    if m.direct is not None:
        return flat[m.direct[0] : m.direct[1]]
    return work[m.staging : m.staging + m.size]


def apply(flat: Array, work: Array, m: BoundMessage) -> None:
    """Copy or add a message received into scratch into the buffer (after the round).  A torch
    tensor's sums land in one fused call (``_foreach_add_``: a kernel or so on a GPU, not one per
    chunk), the same ``buffer += received`` element by element, so the results are the same bits.
    (A message of several pieces that are copies is contiguous in every generated schedule, and
    so direct.)"""
    if m.direct is not None:
        return
    fused = len(m.pieces) > 1 and library_of(flat) == "torch"
    targets: list[Array] = []
    received: list[Array] = []
    offset = m.staging
    for start, stop, reduce in m.pieces:
        data = work[offset : offset + stop - start]
        if not reduce:
            flat[start:stop] = data
        elif fused:
            if stop > start:  # an empty chunk adds nothing (and some foreach kernels mind it)
                targets.append(flat[start:stop])
                received.append(data)
        else:
            flat[start:stop] += data
        offset += stop - start
    if targets:
        sys.modules["torch"]._foreach_add_(targets, received)


class Packing(Protocol):
    """How a rank's messages get in and out of its buffer: ``pack`` returns what to send for a
    message (a slice of the buffer, or its pieces packed into ``work``), ``land`` puts a received
    message in place after the round (copied, or added for a reduction)."""

    def pack(self, flat: Array, work: Array, m: BoundMessage) -> Array: ...

    def land(self, flat: Array, work: Array, m: BoundMessage) -> None: ...


class SlicePacking:
    """The interpreter's packing (:func:`send_view`, :func:`apply`): slice copies and adds, which
    every array library spells alike (a torch tensor's chunks in one ``cat`` and one fused add).
    Its methods are the functions themselves, not methods that call them: a frame less per
    message."""

    pack = staticmethod(send_view)
    land = staticmethod(apply)


SLICE_PACKING = SlicePacking()


def run_rank(
    flat: Array,
    plan: Plan,
    transport: Transport,
    straggler_delay: float = 0.0,
    late_rank: int | None = None,
    rounds: tuple[int, int | None] = (0, None),
    packing: Packing = SLICE_PACKING,
) -> Timeline:
    """Run ``plan``'s steps in ``rounds`` (first, stop; stop None: to the end) on this rank's 1-D
    buffer, its messages packed and landed by ``packing``; the late rank (``late_rank``, else the
    schedule's: :func:`late_rank_for`) first sleeps ``straggler_delay`` s in the call that holds
    its first step."""
    steps = _steps_in(plan, rounds)
    start = time.perf_counter()
    arrived = _arrive(plan, straggler_delay, late_rank, rounds)
    work = scratch_for(flat, plan.work_size)
    phase_done: list[float | None] = [None] * len(plan.program.phases)
    pack, land = packing.pack, packing.land
    for step in steps:
        sends = [pack(flat, work, m) for m in step.sends]
        recvs = [recv_view(flat, work, m) for m in step.recvs]
        transport.exchange(step, sends, recvs)
        for m in step.recvs:
            land(flat, work, m)
        phase_done[step.phase] = time.perf_counter()
    transport.finish()
    return Timeline(plan.rank, start, arrived, tuple(phase_done), time.perf_counter())


def run_rank_replayed(
    flat: Array,
    plan: Plan,
    transport: Transport,
    replay: Callable[[Hashable, Callable[[], object]], None],
    key: Hashable,
    straggler_delay: float = 0.0,
    late_rank: int | None = None,
    rounds: tuple[int, int | None] = (0, None),
    packing: Packing = SLICE_PACKING,
) -> Timeline:
    """:func:`run_rank` with its rounds run by ``replay(key, work)`` (a
    :class:`~stragglar.runtime.graphs.Replayer`), the late rank's sleep before them and the
    transport's final wait after them on the host, outside any graph (a host wait on a stream
    being captured would break the capture).  Phases end when the rounds are issued (host times,
    as on any GPU path)."""
    start = time.perf_counter()
    arrived = _arrive(plan, straggler_delay, late_rank, rounds)
    steps = _steps_in(plan, rounds)
    if steps:  # a range this rank has no part in (the late rank's first) makes no empty graph
        replay(key, lambda: run_rank(flat, plan, _Issuing(transport), 0.0, late_rank, rounds, packing))
    transport.finish()
    done = time.perf_counter()
    phases = {step.phase for step in steps}
    phase_done = tuple(done if phase in phases else None for phase in range(len(plan.program.phases)))
    return Timeline(plan.rank, start, arrived, phase_done, done)


@dataclass(frozen=True)
class _Issuing:
    """``transport`` whose rounds are issued and not waited for: the caller waits, after them."""

    transport: Transport

    def exchange(self, step: BoundStep, sends: list[Array], recvs: list[Array]) -> None:
        self.transport.exchange(step, sends, recvs)

    def finish(self) -> None:
        pass


def _steps_in(plan: Plan, rounds: tuple[int, int | None]) -> tuple[BoundStep, ...]:
    """``plan``'s steps in rounds ``first`` to ``stop - 1`` (stop None: to the end)."""
    first, stop = rounds
    if rounds == (0, None):
        return plan.steps
    return tuple(s for s in plan.steps if first <= s.round and (stop is None or s.round < stop))


def _arrive(
    plan: Plan, straggler_delay: float, late_rank: int | None, rounds: tuple[int, int | None]
) -> float:
    """When this rank arrives: the late rank sleeps ``straggler_delay`` first in the call over
    ``rounds`` that holds its first step (the call it is late to), every other call at once."""
    first, stop = rounds
    begin = plan.steps[0].round if plan.steps else 0
    holds_first = first <= begin and (stop is None or begin < stop)
    if plan.rank == late_rank_for(plan.program, late_rank) and straggler_delay > 0 and holds_first:
        time.sleep(straggler_delay)
    return time.perf_counter()
