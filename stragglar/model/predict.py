"""What the cost model predicts for the schedules this package generates.

:mod:`stragglar.model.cost` prices any schedule; this module feeds it the generated ones (cached:
a sweep, a plot or a DDP hook asks for the same N again and again), so that ``stragglar cost``,
the plots, the measured sweeps and the DDP policy compare like with like.

>>> c = compare_generated(8, 2**30, delay=0.01)
>>> [e.algorithm for e in c.estimates], round(c.speedup("stragglar"), 2)
(['stragglar', 'ring', 'rhd', 'direct'], 1.36)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from functools import lru_cache

from stragglar.errors import ArgumentError, InputError, described
from stragglar.model.cost import PAPER_NETWORK, Comparison, Network, Profile, compare, expect, profile
from stragglar.schedule import Schedule, gc_paused
from stragglar.synth import ALGORITHMS, check_request, synthesize

__all__ = ["compare_generated", "generated_profile", "schedule_name"]


def schedule_name(schedule: Schedule) -> str:
    """``stragglar C=38`` for a straggler-aware schedule in other than the paper's N-1 chunks, else
    the algorithm: the name the model's estimates and the measured runs both give it.

    >>> from stragglar.synth import synthesize
    >>> schedule_name(synthesize("stragglar", 4, chunks=9)), schedule_name(synthesize("stragglar", 4))
    ('stragglar C=9', 'stragglar')
    """
    expect(schedule, Schedule, "schedule_name's schedule")
    paper = schedule.straggler is None or schedule.num_chunks == schedule.num_ranks - 1
    return schedule.algorithm if paper else f"{schedule.algorithm} C={schedule.num_chunks}"


def generated_profile(algorithm: str, num_ranks: int, chunks: int | None = None) -> Profile:
    """The profile of ``algorithm``'s generated schedule for ``num_ranks`` ranks (and ``chunks``
    chunks, StragglAR only), named by :func:`schedule_name`.

    The request is checked before the cache is asked: a list for a name was the cache's
    "unhashable type" TypeError, not the generator's one line.
    """
    request = check_request(algorithm, num_ranks, chunks=chunks)
    return _generated_profile(request.algorithm, request.num_ranks, request.chunks)


@lru_cache(maxsize=256)
def _generated_profile(algorithm: str, num_ranks: int, chunks: int | None) -> Profile:
    # Only the profile is kept: paused across synthesis and pricing, the schedule (millions of
    # transfers at N = 2048) is freed before the collector runs again, which otherwise walked all
    # of it once (1.3 s a schedule at 2048 GPUs) on the first allocation after synthesis.
    with gc_paused():
        return _profile_of(synthesize(algorithm, num_ranks, chunks=chunks))


def _profile_of(schedule: Schedule) -> Profile:
    return dataclasses.replace(profile(schedule), algorithm=schedule_name(schedule))


def compare_generated(
    num_ranks: int,
    size_bytes: float,
    delay: float,
    network: Network = PAPER_NETWORK,
    algorithms: Sequence[str] = ALGORITHMS,
    chunks: int | None = None,
) -> Comparison:
    """Estimate each of ``algorithms`` (Ring is always added) on its generated schedule.

    RHD is left out when ``num_ranks`` is not a power of two, as it has no schedule there.  With
    ``chunks`` (other than the paper's N-1) StragglAR in that many chunks is added first, as
    ``stragglar C=<chunks>``, beside the paper's.  A request any schedule would refuse is refused
    before the first is made (at N = 2048 each takes seconds).
    """
    if isinstance(algorithms, str):  # its letters were taken for names: "unknown algorithm 'g'"
        raise ArgumentError(
            f"algorithms must be a list of names, got {described(algorithms)}: pass [{algorithms!r}]"
        )
    names = tuple(algorithms) if isinstance(algorithms, Iterable) else None
    if names is None or not all(isinstance(a, str) for a in names):
        raise ArgumentError(  # None was "not iterable", [["ring"]] "unhashable type", from inside
            f"algorithms must be a list of names (each a str), got {described(algorithms)}"
        )
    unknown = set(names) - set(ALGORITHMS)
    if unknown:
        raise InputError(
            f"unknown algorithm {described(sorted(unknown)[0])} (choose from {', '.join(ALGORITHMS)})"
        )
    check_request("stragglar", num_ranks, chunks=chunks)
    wanted = {"ring", *names}
    if num_ranks & (num_ranks - 1):
        wanted.discard("rhd")
    profiles = [generated_profile(a, num_ranks) for a in ALGORITHMS if a in wanted]
    if chunks is not None and chunks != num_ranks - 1:
        profiles.insert(0, generated_profile("stragglar", num_ranks, chunks))
    return compare(profiles, size_bytes, delay, network)
