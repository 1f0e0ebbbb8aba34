"""What the cost model predicts for the schedules this package generates.

:mod:`stragglar.cost` prices any schedule; this module feeds it the generated ones (cached: a
sweep or a plot asks for the same N again and again), so that ``stragglar cost``, the plots and
the measured sweeps compare like with like.

>>> c = compare_generated(8, 2**30, delay=0.01)
>>> [e.algorithm for e in c.estimates], round(c.speedup("stragglar"), 2)
(['stragglar', 'ring', 'rhd', 'direct'], 1.36)
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from stragglar.cost import PAPER_NETWORK, Comparison, Network, Profile, compare, profile
from stragglar.errors import InputError
from stragglar.synth import ALGORITHMS, synthesize

__all__ = ["compare_generated", "generated_profile"]


@lru_cache(maxsize=256)
def generated_profile(algorithm: str, num_ranks: int) -> Profile:
    """The profile of ``algorithm``'s generated schedule for ``num_ranks`` ranks."""
    return profile(synthesize(algorithm, num_ranks))


def compare_generated(
    num_ranks: int,
    size_bytes: float,
    delay: float,
    network: Network = PAPER_NETWORK,
    algorithms: Sequence[str] = ALGORITHMS,
) -> Comparison:
    """Estimate each of ``algorithms`` (Ring is always added) on its generated schedule.

    RHD is left out when ``num_ranks`` is not a power of two, as it has no schedule there.
    """
    unknown = set(algorithms) - set(ALGORITHMS)
    if unknown:
        raise InputError(f"unknown algorithm {sorted(unknown)[0]!r} (choose from {', '.join(ALGORITHMS)})")
    wanted = {"ring", *algorithms}
    if num_ranks & (num_ranks - 1):
        wanted.discard("rhd")
    profiles = [generated_profile(a, num_ranks) for a in ALGORITHMS if a in wanted]
    return compare(profiles, size_bytes, delay, network)
