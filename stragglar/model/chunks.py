"""How many chunks to cut a buffer into: the cost model's choice, and the one reading of a chunk
option that every caller shares.

Phase 2 of StragglAR in ``C`` chunks takes ``C + ceil(log2 N) - 1`` rounds of ``s / C`` bytes:
more chunks shorten its bandwidth term towards one buffer, fewer save rounds where each round is
dear.  :func:`best_chunks` prices a few candidate counts (:func:`chunk_candidates`) on their
generated schedules and keeps the fastest; :func:`resolve_chunks` reads a chunk option
(a count, :data:`AUTO` or None), the same way for the command line and the DDP policy.

>>> from stragglar.model.predict import compare_generated
>>> best = best_chunks(8, 2**30, 0.01)
>>> best, round(compare_generated(8, 2**30, 0.01, chunks=best).speedup(f"stragglar C={best}"), 2)
(38, 1.6)
"""

from __future__ import annotations

import math

from stragglar.args import as_int
from stragglar.errors import InputError, described
from stragglar.model.cost import PAPER_NETWORK, Network, estimate
from stragglar.model.predict import generated_profile
from stragglar.schedule import MAX_CELLS, MAX_CHUNKS

__all__ = [
    "AUTO",
    "MAX_AUTO_CHUNKS",
    "MIN_CHUNK_BYTES",
    "best_chunks",
    "chunk_candidates",
    "ranked_chunks",
    "resolve_chunks",
]

AUTO = "auto"  # a chunk option meaning: the count the cost model prices fastest
# A chunk smaller than this is all latency: no candidate cuts a buffer finer.
MIN_CHUNK_BYTES = 4096
# No candidate has more chunks (or N - 1, if more): phase 2's bandwidth term (C + L - 1) / C of a
# buffer is then within 0.25% of one buffer for every N up to 1024 (L - 1 <= 9), while the cost of
# synthesizing, proving and running a schedule grows with C.
MAX_AUTO_CHUNKS = 4096


def chunk_candidates(
    num_ranks: int,
    size_bytes: float,
    network: Network = PAPER_NETWORK,
    *,
    power_of_two: bool = False,
    max_chunks: int | None = None,
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
    more than :data:`MAX_AUTO_CHUNKS` (unless N - 1 is), than the schedule limits allow or than
    ``max_chunks`` (an output's own limit, such as an executor format's); with ``alpha = 0`` ``C*``
    is the largest allowed.

    >>> chunk_candidates(8, 2**30)
    [7, 16, 32, 35, 38, 39, 42, 64, 128]
    >>> chunk_candidates(8, 2**30, power_of_two=True), chunk_candidates(8, 2**30, max_chunks=20)
    ([16, 32, 64, 128], [7, 8, 14, 16, 20])
    """
    n = as_int(num_ranks, "num_ranks")
    if n < 2:
        raise InputError(f"StragglAR needs at least 2 GPUs, got {n}")
    if not size_bytes > 0:
        raise InputError(f"the buffer size must be > 0 bytes, got {size_bytes}")
    low = n - 1
    if max_chunks is not None and as_int(max_chunks, "max_chunks") < low:  # not silently N - 1
        raise InputError(
            f"max_chunks must be at least N - 1 = {low}, the fewest StragglAR takes, got {max_chunks}"
        )
    limits = (MAX_AUTO_CHUNKS, MAX_CHUNKS, MAX_CELLS // n, int(size_bytes // MIN_CHUNK_BYTES))
    high = max(low, min(*limits, MAX_CHUNKS if max_chunks is None else max_chunks))
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
    max_chunks: int | None = None,
) -> int:
    """The chunk count whose StragglAR schedule the cost model prices fastest after the straggler
    arrives, among :func:`chunk_candidates`; the fewest chunks among equals."""
    ranked = ranked_chunks(
        num_ranks, size_bytes, delay, network, power_of_two=power_of_two, max_chunks=max_chunks
    )
    return ranked[0]


def ranked_chunks(
    num_ranks: int,
    size_bytes: float,
    delay: float,
    network: Network = PAPER_NETWORK,
    *,
    power_of_two: bool = False,
    max_chunks: int | None = None,
) -> list[int]:
    """:func:`chunk_candidates`, the cost model's fastest after the straggler arrives first, the
    fewest chunks first among equals: :func:`best_chunks`' order, for a caller whose output may
    refuse its pick (an executor's limits that only its lowering knows) and takes the next.

    >>> ranked_chunks(8, 2**30, 0.005, power_of_two=True)
    [32, 64, 16, 128]
    """
    n = num_ranks
    priced = sorted(
        (estimate(generated_profile("stragglar", n, c), size_bytes, delay, network).exposed, c)
        for c in chunk_candidates(n, size_bytes, network, power_of_two=power_of_two, max_chunks=max_chunks)
    )
    return [c for _, c in priced]


def resolve_chunks(
    chunks: int | str | None,
    num_ranks: int,
    size_bytes: float,
    delay: float,
    network: Network | None,
    *,
    power_of_two: bool = False,
    max_chunks: int | None = None,
) -> int | None:
    """A chunk option as a count: None stays None (the paper's N-1), a count is itself, and
    :data:`AUTO` is :func:`best_chunks`' for a buffer of ``size_bytes`` with the straggler
    ``delay`` seconds late (a negative lateness, a rank early, prices as none) on ``network``, in
    at most ``max_chunks`` chunks where an output limits them.

    >>> resolve_chunks(AUTO, 8, 2**30, 0.005, PAPER_NETWORK), resolve_chunks(14, 8, 2**30, 0.0, None)
    (38, 14)
    >>> resolve_chunks(AUTO, 8, 2**30, 0.005, None)
    Traceback (most recent call last):
    ...
    stragglar.errors.InputError: chunks='auto' prices chunk counts on a network, and none is known
    """
    if chunks is None:
        return None
    if chunks != AUTO:
        if isinstance(chunks, str):  # int("x") raised a bare ValueError
            raise InputError(f"chunks must be a chunk count, None or {AUTO!r}, got {described(chunks)}")
        return as_int(chunks, "chunks", minimum=1)
    if network is None:
        raise InputError("chunks='auto' prices chunk counts on a network, and none is known")
    return best_chunks(
        num_ranks, size_bytes, max(delay, 0.0), network, power_of_two=power_of_two, max_chunks=max_chunks
    )
