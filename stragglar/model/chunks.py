"""How many chunks to cut a buffer into: the cost model's choice, and the one reading of a chunk
option that every caller shares.

Phase 2 of StragglAR in ``C`` chunks takes ``C + ceil(log2 N) - 1`` rounds of ``s / C`` bytes:
more chunks shorten its bandwidth term towards one buffer, fewer save rounds where each round is
dear; the hidden ReduceScatter before it sends ``ceil(C / (N - 1))`` chunks a round, so its time
jumps between multiples of ``N - 1``, and the price of ``C`` is bumpy, not convex (at N = 9 on a
slow network 8 and 11 chunks beat 9 and 10).  So :func:`ranked_chunks` prices *every* count
auto may choose, each from its schedule's loads in closed form (:func:`chunked_loads`, the
generator's, checked against it in the tests), not from a handful of candidates around the
optimum of phase 2 alone, which missed the cheapest by up to 0.4%.  :func:`resolve_chunks` reads
a chunk option (a count, :data:`AUTO` or None), the same way for the command line and the DDP
policy.

>>> from stragglar.model.predict import compare_generated
>>> best = best_chunks(8, 2**30, 0.01)
>>> best, round(compare_generated(8, 2**30, 0.01, chunks=best).speedup(f"stragglar C={best}"), 2)
(38, 1.6)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from stragglar.args import as_int, as_real
from stragglar.errors import ArgumentError, InputError, described
from stragglar.model.cost import PAPER_NETWORK, Network, check_setting, expect
from stragglar.schedule import MAX_CELLS, MAX_CHUNKS, check_num_ranks

if TYPE_CHECKING:  # numpy is imported where a count is priced: a command that prices none skips it
    import numpy as np

__all__ = [
    "AUTO",
    "MAX_AUTO_CHUNKS",
    "MIN_CHUNK_BYTES",
    "SAME_PRICE",
    "best_chunks",
    "best_chunks_over",
    "chunk_candidates",
    "chunked_loads",
    "ranked_chunks",
    "resolve_chunks",
]

AUTO = "auto"  # a chunk option meaning: the count the cost model prices fastest
# A chunk smaller than this is all latency: no count auto chooses cuts a buffer finer.
MIN_CHUNK_BYTES = 4096
# No count auto chooses has more chunks (or N - 1, if more): phase 2's bandwidth term
# (C + L - 1) / C of a buffer is then within 0.25% of one buffer for every N up to 1024
# (L - 1 <= 9), while the cost of synthesizing, proving and running a schedule grows with C.
MAX_AUTO_CHUNKS = 4096
# Two prices within this share of each other are one price: sums equal in exact arithmetic (every
# count at alpha 0 on 2 GPUs costs one buffer's time) differ in float64's last bits, which would
# pick 49 chunks over 1 for a gain of 2e-14%.
SAME_PRICE = 1e-9
_Count = TypeVar("_Count", int, "np.ndarray")  # one chunk count, or an array of them


def chunk_candidates(
    num_ranks: int, size_bytes: float, *, power_of_two: bool = False, max_chunks: int | None = None
) -> list[int]:
    """The chunk counts :func:`ranked_chunks` prices, smallest first: every count from ``N - 1``
    up, none with chunks under :data:`MIN_CHUNK_BYTES`, more than :data:`MAX_AUTO_CHUNKS` (unless
    N - 1 is), than the schedule limits allow or than ``max_chunks`` (an output's own limit,
    such as an executor format's); with ``power_of_two`` only the powers of two among them
    (executors split power-of-two buffers evenly only into those).

    >>> len(chunk_candidates(8, 2**30)), chunk_candidates(8, 7 * 4096)
    (4090, [7])
    >>> chunk_candidates(8, 4096, power_of_two=True)  # the fewest power of two, as N - 1 above
    [8]
    >>> chunk_candidates(8, 2**30, power_of_two=True), chunk_candidates(8, 2**30, max_chunks=9)
    ([8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096], [7, 8, 9])
    """
    n = check_num_ranks(num_ranks)  # 2**63 GPUs left no count under MAX_CELLS: an IndexError in best_chunks
    size_bytes, _ = check_setting(size_bytes, 0.0)
    low = n - 1
    if max_chunks is not None and as_int(max_chunks, "max_chunks") < low:  # not silently N - 1
        raise InputError(
            f"max_chunks must be at least N - 1 = {low}, the fewest StragglAR takes, got {max_chunks}"
        )
    hard = min(MAX_CHUNKS, MAX_CELLS // n, MAX_CHUNKS if max_chunks is None else max_chunks)
    # the fewest a caller takes (N - 1, or the least power of two from there) even where its chunks
    # are under MIN_CHUNK_BYTES: auto's own limits only keep it from cutting finer
    fewest = 1 << (low - 1).bit_length() if power_of_two else low
    high = max(min(fewest, hard), min(MAX_AUTO_CHUNKS, int(size_bytes // MIN_CHUNK_BYTES), hard))
    if not power_of_two:
        return list(range(low, high + 1))
    chosen = [1 << k for k in range((low - 1).bit_length(), high.bit_length()) if low <= 1 << k <= high]
    if not chosen:  # a power of two at least N - 1 is more than the limits allow
        raise InputError(f"no power-of-two chunk count from {low} to {high} for {n} GPUs")
    return chosen


def chunked_loads(num_ranks: int, num_chunks: _Count) -> tuple[int, _Count, _Count, _Count]:
    """The loads of chunked StragglAR's generated schedule for ``N`` ranks and ``C`` chunks, as
    the cost model reads them (:func:`~stragglar.model.cost.profile`): its hidden rounds and the
    chunks they move (a ring ReduceScatter over the punctual ``N - 1``: ``N - 2`` rounds of
    ``ceil(C / (N - 1))`` chunks), then its exposed rounds and theirs (``C + ceil(log2 N) - 1``
    rounds of one chunk).  In closed form, so that auto can price every count without
    synthesizing each (N = 1024 takes 2 s a count); ``tests/test_model_chunks.py`` holds it to the
    generator's schedules.  ``num_chunks`` may be an array of counts: each load is then an array.

    >>> chunked_loads(8, 7), chunked_loads(8, 9)
    ((6, 6, 9, 9), (6, 12, 11, 11))
    """
    import numpy as np

    num_ranks = as_int(num_ranks, "num_ranks", minimum=2)
    if not isinstance(num_chunks, np.ndarray):
        num_chunks = as_int(num_chunks, "num_chunks")  # None: a raw TypeError on '<'
    elif num_chunks.dtype.kind not in "iu":
        raise ArgumentError(f"num_chunks must be integers, got an array of {num_chunks.dtype}")
    if np.any(np.asarray(num_chunks) < num_ranks - 1):
        raise InputError(
            f"StragglAR needs at least N - 1 = {num_ranks - 1} chunks, got {described(num_chunks)}"
        )
    hidden = num_ranks - 2
    exposed = num_chunks + (num_ranks - 1).bit_length() - 1  # (N - 1).bit_length() = ceil(log2 N)
    return hidden, hidden * -(-num_chunks // (num_ranks - 1)), exposed, exposed


def _prices(
    num_ranks: int, chunks: np.ndarray, size_bytes: float, delays: np.ndarray, network: Network
) -> np.ndarray:
    """The time after the straggler arrives of StragglAR in each of ``chunks`` chunks, as
    :func:`~stragglar.model.cost.estimate` prices its generated schedule, summed over calls whose
    straggler is ``delays`` late (sorted, at least one): for thousands of counts at once.  For one
    delay, the same operations in the same order on float64 as the estimate's, so the same numbers;
    over many, each count's hidden work still running as its straggler arrives is summed from the
    delays below it (``k * hidden - their sum``), not per call."""
    import numpy as np

    hidden_rounds, hidden_chunks, exposed_rounds, exposed_chunks = chunked_loads(num_ranks, chunks)
    chunk = size_bytes / chunks
    hidden = hidden_rounds * network.alpha + hidden_chunks * chunk * network.beta
    tail = exposed_rounds * network.alpha + exposed_chunks * chunk * network.beta
    below = np.searchsorted(delays, hidden, side="left")  # the calls whose straggler arrives earlier
    before = np.concatenate(([0.0], np.cumsum(delays)))
    running = below * hidden - before[below]  # one delay: max(hidden - delay, 0), as Estimate.exposed
    exposed: np.ndarray = running + len(delays) * tail  # times 1 is exact: one delay's sum unchanged
    return exposed


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
    arrives, among every count :func:`chunk_candidates` allows; the fewest chunks among equals:
    :func:`ranked_chunks`' first (:func:`best_chunks_over` one delay)."""
    return best_chunks_over(
        num_ranks, size_bytes, [delay], network, power_of_two=power_of_two, max_chunks=max_chunks
    )


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

    >>> ranked_chunks(8, 2**30, 0.005, power_of_two=True)[:4]
    [32, 64, 16, 128]
    """
    import numpy as np

    expect(network, Network, "network")  # None had no attribute 'alpha'
    size_bytes, delay = check_setting(size_bytes, delay)
    return _ranked(*_priced(num_ranks, size_bytes, np.array([delay]), network, power_of_two, max_chunks))


def best_chunks_over(
    num_ranks: int,
    size_bytes: float,
    delays: Sequence[float],
    network: Network = PAPER_NETWORK,
    *,
    power_of_two: bool = False,
    max_chunks: int | None = None,
) -> int:
    """The chunk count whose StragglAR schedule the cost model prices fastest summed over calls
    whose straggler is each of ``delays`` seconds late (a trace's steps, or the hook's recent
    ones), among every count :func:`chunk_candidates` allows; the fewest chunks among equals.  Not
    :func:`best_chunks` at a typical delay: the price of a count is not linear in the delay (its
    hidden work ends as the straggler arrives), so the count fastest at the median delay may lose
    over the calls, even to the paper's N - 1.

    >>> best_chunks_over(8, 2**30, [0.005]) == best_chunks(8, 2**30, 0.005)
    True
    >>> net = Network(10e-6, 25e9)  # late by 20 ms at one call of three:
    >>> best_chunks(4, 25 * 2**20, 0.02, net), best_chunks_over(4, 25 * 2**20, [0.0, 0.0, 0.02], net)
    (10, 9)
    """
    import numpy as np

    expect(network, Network, "network")
    size_bytes, _ = check_setting(size_bytes, 0.0)
    if isinstance(delays, (str, bytes)) or not isinstance(delays, Sequence):
        raise ArgumentError(f"delays must be a sequence of seconds, got {described(delays)}")
    if len(delays) == 0:
        raise InputError("best_chunks_over prices counts over the delays of one call at least, got none")
    late = np.sort(np.array([check_setting(size_bytes, d)[1] for d in delays]))
    return _fastest(*_priced(num_ranks, size_bytes, late, network, power_of_two, max_chunks))


def _ranked(counts: np.ndarray, prices: np.ndarray) -> list[int]:
    """:func:`ranked_chunks`' order of ``counts`` (ascending) by their ``prices``."""
    import numpy as np

    order = np.lexsort((counts, prices))
    ranked: list[int] = []
    first = 0
    while first < len(order):  # prices within SAME_PRICE of a run's first are one: fewest chunks first
        end = first + 1
        top = prices[order[first]] * (1 + SAME_PRICE)
        while end < len(order) and prices[order[end]] <= top:
            end += 1
        ranked += sorted(int(counts[i]) for i in order[first:end])
        first = end
    return ranked


def _fastest(counts: np.ndarray, prices: np.ndarray) -> int:
    """:func:`_ranked`'s first without ranking the rest: the fewest chunks priced within
    :data:`SAME_PRICE` of the cheapest.  Ranking every count took 5 ms (4,090 counts ranked in
    Python), which the DDP hook paid per bucket and step under ``chunks="auto"``."""
    import numpy as np

    cheap = prices <= prices.min() * (1 + SAME_PRICE)
    return int(counts[np.argmax(cheap)])  # counts ascend: the first cheap one is the fewest


def _priced(
    num_ranks: int,
    size_bytes: float,
    delays: np.ndarray,
    network: Network,
    power_of_two: bool,
    max_chunks: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Every count :func:`chunk_candidates` allows (ascending) and its price summed over ``delays``
    (checked, sorted)."""
    import numpy as np

    counts = chunk_candidates(num_ranks, size_bytes, power_of_two=power_of_two, max_chunks=max_chunks)
    chunks = np.asarray(counts, dtype=np.int64)
    return chunks, _prices(num_ranks, chunks, size_bytes, delays, network)


def resolve_chunks(
    chunks: int | str | None,
    num_ranks: int,
    size_bytes: float,
    delay: float | Sequence[float],
    network: Network | None,
    *,
    power_of_two: bool = False,
    max_chunks: int | None = None,
) -> int | None:
    """A chunk option as a count: None stays None (the paper's N-1), a count is itself, and
    :data:`AUTO` is :func:`best_chunks`' for a buffer of ``size_bytes`` with the straggler
    ``delay`` seconds late (a negative lateness, a rank early, prices as none) on ``network``, in
    at most ``max_chunks`` chunks where an output limits them; where ``delay`` is a sequence (the
    straggler's lateness at each of several calls), :func:`best_chunks_over`'s over them.

    >>> resolve_chunks(AUTO, 8, 2**30, 0.005, PAPER_NETWORK), resolve_chunks(14, 8, 2**30, 0.0, None)
    (38, 14)
    >>> resolve_chunks(AUTO, 4, 25 * 2**20, [0.02, -0.001], Network(10e-6, 25e9))  # then early: as 0
    9
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
    if isinstance(delay, Sequence) and not isinstance(delay, (str, bytes)):
        late = [max(as_real(d, "each straggler delay", "seconds"), 0.0) for d in delay]
        return best_chunks_over(
            num_ranks, size_bytes, late, network, power_of_two=power_of_two, max_chunks=max_chunks
        )
    one = as_real(delay, "the straggler delay", "seconds")  # None was a TypeError of max()
    return best_chunks(
        num_ranks, size_bytes, max(one, 0.0), network, power_of_two=power_of_two, max_chunks=max_chunks
    )
