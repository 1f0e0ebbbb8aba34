"""What the cost model predicts for the schedules this package generates, and the chunk count
it recommends.

:mod:`stragglar.cost` prices any schedule; this module feeds it the generated ones (cached: a
sweep or a plot asks for the same N again and again), so that ``stragglar cost``, the plots and
the measured sweeps compare like with like.

>>> c = compare_generated(8, 2**30, delay=0.01)
>>> [e.algorithm for e in c.estimates], round(c.speedup("stragglar"), 2)
(['stragglar', 'ring', 'rhd', 'direct'], 1.36)
>>> best = best_chunks(8, 2**30, 0.01)
>>> best, round(compare_generated(8, 2**30, 0.01, chunks=best).speedup(f"stragglar C={best}"), 2)
(38, 1.6)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from functools import lru_cache

from stragglar.cost import PAPER_NETWORK, Comparison, Network, Profile, compare, estimate, profile
from stragglar.errors import InputError
from stragglar.schedule import MAX_CELLS, MAX_CHUNKS, Schedule
from stragglar.synth import ALGORITHMS, synthesize

__all__ = [
    "MAX_AUTO_CHUNKS",
    "MIN_CHUNK_BYTES",
    "best_chunks",
    "chunk_candidates",
    "compare_generated",
    "generated_profile",
    "schedule_name",
]

# A chunk smaller than this is all latency: no candidate cuts a buffer finer.
MIN_CHUNK_BYTES = 4096
# No candidate has more chunks (or N - 1, if more): phase 2's bandwidth term (C + L - 1) / C of a
# buffer is then within 0.25% of one buffer for every N up to 1024 (L - 1 <= 9), while the cost of
# synthesizing, proving and running a schedule grows with C.
MAX_AUTO_CHUNKS = 4096


def schedule_name(schedule: Schedule) -> str:
    """``stragglar C=38`` for a straggler-aware schedule in other than the paper's N-1 chunks, else
    the algorithm: the name the model's estimates and the measured runs both give it.

    >>> from stragglar.synth import synthesize
    >>> schedule_name(synthesize("stragglar", 4, chunks=9)), schedule_name(synthesize("stragglar", 4))
    ('stragglar C=9', 'stragglar')
    """
    paper = schedule.straggler is None or schedule.num_chunks == schedule.num_ranks - 1
    return schedule.algorithm if paper else f"{schedule.algorithm} C={schedule.num_chunks}"


@lru_cache(maxsize=256)
def generated_profile(algorithm: str, num_ranks: int, chunks: int | None = None) -> Profile:
    """The profile of ``algorithm``'s generated schedule for ``num_ranks`` ranks (and ``chunks``
    chunks, StragglAR only), named by :func:`schedule_name`."""
    schedule = synthesize(algorithm, num_ranks, chunks=chunks)
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
    ``stragglar C=<chunks>``, beside the paper's.
    """
    unknown = set(algorithms) - set(ALGORITHMS)
    if unknown:
        raise InputError(f"unknown algorithm {sorted(unknown)[0]!r} (choose from {', '.join(ALGORITHMS)})")
    wanted = {"ring", *algorithms}
    if num_ranks & (num_ranks - 1):
        wanted.discard("rhd")
    profiles = [generated_profile(a, num_ranks) for a in ALGORITHMS if a in wanted]
    if chunks is not None and chunks != num_ranks - 1:
        profiles.insert(0, generated_profile("stragglar", num_ranks, chunks))
    return compare(profiles, size_bytes, delay, network)


def chunk_candidates(
    num_ranks: int, size_bytes: float, network: Network = PAPER_NETWORK, *, power_of_two: bool = False
) -> list[int]:
    """The chunk counts :func:`best_chunks` prices, smallest first.

    Phase 2 in ``C`` chunks costs ``(C + L - 1) * (alpha + s / (C * bandwidth))`` with
    ``L = ceil(log2 N)``: convex in ``C``, least at ``C* = sqrt((L - 1) * s / (alpha * bandwidth))``.
    The hidden ReduceScatter sends ``ceil(C / (N - 1))`` chunks a round, ``s / (N - 1)`` bytes at
    every multiple of ``N - 1`` and more between them: among the multiples it costs the same, so
    the two either side of ``C*`` dominate the rest.  So the candidates are ``N - 1``, the
    integers and the multiples of ``N - 1`` either side of ``C*``, and the powers of two from
    ``C* / 2`` to ``2 C*`` and the nearest ones outside: at most a dozen, each a schedule to
    synthesize.  With ``power_of_two`` only the powers of two (executors split power-of-two
    buffers evenly only into those).  No candidate has chunks under :data:`MIN_CHUNK_BYTES`, is
    more than :data:`MAX_AUTO_CHUNKS` (unless N - 1 is) or than the schedule limits allow; with
    ``alpha = 0`` ``C*`` is the largest allowed.

    >>> chunk_candidates(8, 2**30)
    [7, 16, 32, 35, 38, 39, 42, 64, 128]
    >>> chunk_candidates(8, 2**30, power_of_two=True)
    [16, 32, 64, 128]
    """
    n = num_ranks
    if n < 2:
        raise InputError(f"StragglAR needs at least 2 GPUs, got {n}")
    if not size_bytes > 0:
        raise InputError(f"the buffer size must be > 0 bytes, got {size_bytes}")
    low = n - 1
    high = max(low, min(MAX_AUTO_CHUNKS, MAX_CHUNKS, MAX_CELLS // n, int(size_bytes // MIN_CHUNK_BYTES)))
    doublings = max(1, (n - 1).bit_length()) - 1
    ideal = (
        math.sqrt(doublings * size_bytes / (network.alpha * network.bandwidth))
        if network.alpha > 0
        else float(high)
    )
    ideal = min(max(ideal, low), high)
    first_pow2 = 1 << (low - 1).bit_length()
    powers = [1 << k for k in range(first_pow2.bit_length() - 1, high.bit_length())]
    picks = {p for p in powers if ideal / 2 <= p <= 2 * ideal}
    below = [p for p in powers if p < ideal / 2]
    above = [p for p in powers if p > 2 * ideal]
    picks |= set(below[-1:]) | set(above[:1])
    if not power_of_two:
        picks |= {low, math.floor(ideal), math.ceil(ideal)}
        picks |= {low * max(1, math.floor(ideal / low)), low * math.ceil(ideal / low)}
    chosen = sorted(c for c in picks if low <= c <= high)
    if not chosen:  # a power of two at least N - 1 is more than the limits allow
        raise InputError(f"no power-of-two chunk count from {low} to {high} for {n} GPUs")
    return chosen


def best_chunks(
    num_ranks: int,
    size_bytes: float,
    delay: float,
    network: Network = PAPER_NETWORK,
    *,
    power_of_two: bool = False,
) -> int:
    """The chunk count whose StragglAR schedule the cost model prices fastest after the straggler
    arrives, among :func:`chunk_candidates`; the fewest chunks among equals."""
    n = num_ranks
    priced = [
        (estimate(generated_profile("stragglar", n, c), size_bytes, delay, network).exposed, c)
        for c in chunk_candidates(n, size_bytes, network, power_of_two=power_of_two)
    ]
    return min(priced)[1]
