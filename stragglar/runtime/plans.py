"""Compiled programs and bound plans, cached by the schedule's fingerprint, and who is late in them.

Every entry point of the runtime asks for a plan per call: a DDP hook asks for one per gradient
bucket per step, so a lookup must cost microseconds, not a walk over every transfer.  Programs
(one compile per schedule) and plans (one bind per rank, element count and tag base) are kept
in small least-recently-used caches shared by every thread.  Which rank of a plan arrives late is
answered here too, by the one function every entry point asks (:func:`late_rank_for`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from stragglar.args import as_int, as_rank
from stragglar.runtime.program import Plan, RankProgram, bind, compile_schedule
from stragglar.schedule import Schedule
from stragglar.verify import Proof, require_proof

__all__ = ["cached", "emptied", "late_rank_for", "plan_for", "rounds_without"]

_V = TypeVar("_V")
_lock = threading.Lock()
_programs: OrderedDict[Hashable, tuple[RankProgram, ...]] = OrderedDict()
_plans: OrderedDict[Hashable, Plan] = OrderedDict()


def emptied(cache: OrderedDict[Hashable, _V]) -> None:
    """Empty ``cache`` under the lock :func:`cached` takes (a lookup beside it must never see its
    entry go between finding and moving it); what goes is let go after the lock, where letting go
    waits (a device state's last kernel)."""
    with _lock:
        gone = list(cache.values())
        cache.clear()
    del gone


def cached(cache: OrderedDict[Hashable, _V], key: Hashable, make: Callable[[], _V], limit: int) -> _V:
    """``cache[key]``, made on a miss; the least recently used entries go past ``limit``.  Safe
    from any thread (a miss may be made twice, never half-stored)."""
    with _lock:
        value = cache.get(key)
        if value is not None:
            cache.move_to_end(key)
            return value
    value = make()
    with _lock:
        cache[key] = value
        while len(cache) > limit:
            cache.popitem(last=False)
    return value


def _compiled(proof: Proof) -> tuple[RankProgram, ...]:
    key = proof.schedule.fingerprint
    return cached(_programs, key, lambda: compile_schedule(proof.schedule), 32)


def plan_for(proof: Proof, rank: int, count: int, tag_base: int = 0) -> Plan:
    """The compiled plan of ``rank`` bound to a ``count``-element buffer (cached by fingerprint)."""
    require_proof(proof)
    rank = as_rank(rank, "rank", proof.num_ranks)
    count = as_int(count, "count", minimum=0)
    tag_base = as_int(tag_base, "tag_base", minimum=0)
    programs = _compiled(proof)
    key = (proof.schedule.fingerprint, rank, count, tag_base)
    return cached(_plans, key, lambda: bind(programs[rank], count, tag_base), 256)


def late_rank_for(ranks: Schedule | RankProgram, late_rank: Any = None, size: int | None = None) -> int:
    """The rank that arrives late in a run of ``ranks`` (a schedule, or a rank's program of one):
    ``late_rank`` where the caller names one (checked as a rank of ``size`` ranks, default the
    schedule's), else the schedule's own (:attr:`~stragglar.schedule.Schedule.late_rank`: its
    straggler, else the last rank).

    Every entry point that makes a rank late asks this one function, so they all agree on who it
    is.  A call across processes checks the rank it is given against its group's size: a group of
    another size is then reported by the header check, in the same words on every rank.
    """
    if late_rank is None:
        return ranks.late_rank
    return as_rank(late_rank, "late_rank", ranks.num_ranks if size is None else size)


def rounds_without(proof: Proof, late_rank: int | None = None) -> int:
    """How many of the schedule's first rounds ``late_rank`` takes no part in (None: the late
    rank :func:`~stragglar.runtime.allreduce` assumes: the schedule's straggler, else the last
    rank).

    The other ranks can run those rounds before the late rank arrives (StragglAR's ReduceScatter
    among the punctual ranks: ``rounds=(0, k)``, then ``rounds=(k, None)``), so a caller with
    many buffers can run that part of every one of them while the late rank is still away.

    >>> from stragglar.synth import synthesize
    >>> from stragglar.verify import prove
    >>> proof = prove(synthesize("stragglar", 4))
    >>> rounds_without(proof), rounds_without(proof, 0), proof.num_rounds
    (2, 0, 6)
    """
    require_proof(proof)
    program = _compiled(proof)[late_rank_for(proof.schedule, late_rank)]
    return program.steps[0].round if program.steps else proof.num_rounds
