"""What the measured timings say: the networks fitted to them, and how much dearer than the model's
price StragglAR's rounds were.

The auto policy (:mod:`stragglar.model.policy`) prices both algorithms on networks it fits to
the probe's :data:`Timing` s, each gathered from every rank: the engine's all_reduce of whole
buckets (:func:`fit_network`), and StragglAR's exposed rounds once it has run
(:func:`cost_ratio`, the factor :func:`scaled` applies).  Plain float arithmetic throughout, so
every rank fits the same network from the same figures.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Iterable, Iterator, Sequence

from stragglar.args import as_int, as_real, as_seconds
from stragglar.errors import ArgumentError, InputError, described
from stragglar.model.cost import Network, expect, fitted_network
from stragglar.model.predict import generated_profile

__all__ = ["RUNS", "Timing", "cost_ratio", "fit_network", "medians", "scaled", "scaled_fit"]

RUNS = 3  # timings of one size before the fits trust it

Timing = tuple[int, int, float]
"""A bucket's reduction, as gathered: (bytes, chunks, seconds); chunks is the schedule's chunk
count where it was not the algorithm's own (the paper's N-1 for StragglAR), else 0, and always 0
for the engine's all_reduce."""


def fit_network(algorithm: str, num_ranks: int, samples: Iterable[Timing]) -> Network | None:
    """Alpha and bandwidth that explain :data:`Timing` s of ``algorithm``'s exposed rounds (all of
    a Ring's), on its generated schedule for ``num_ranks``; None without enough timings, or where
    the fit is outside what the model prices (:func:`~stragglar.model.cost.fitted_network`).

    Least squares over the sizes' medians (:func:`medians`) when sizes at least a factor 2 apart
    separate alpha from bandwidth; otherwise (DDP's buckets are often all about one size), or
    when that needs a negative alpha, the bandwidth alone with alpha 0, which prices each round
    by its bytes.  Plain float arithmetic, so every rank fits the same network from the same
    figures.

    >>> ring = [(2**20, 0, 6e-3 + 1.5 * 2**20 / 1e9), (2**24, 0, 6e-3 + 1.5 * 2**24 / 1e9)] * 3  # N = 4
    >>> net = fit_network("ring", 4, ring + [(2**26, 0, 9.0)])  # a size timed once: left out
    >>> round(net.alpha * 1e3, 6), round(net.bandwidth / 1e9, 6)
    (1.0, 1.0)
    >>> fit_network("ring", 4, [(2**20, 0, 3e-3), (2**20, 0, 1.0), (2**20, 0, 3e-3)]).alpha
    0.0
    >>> fit_network("ring", 4, [(2**20, 0, 3e-3)] * (RUNS - 1)) is None
    True
    """
    prof = generated_profile(algorithm, num_ranks)
    rounds, per_byte = len(prof.exposed), sum(prof.exposed) / prof.num_chunks
    points = [(per_byte * size, seconds) for size, chunks, seconds in medians(samples) if not chunks]
    if not points:
        return None
    if points[-1][0] >= 2 * points[0][0]:  # t = rounds * alpha + bytes * beta
        mean_b = sum(b for b, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        beta = sum((b - mean_b) * (t - mean_t) for b, t in points) / sum((b - mean_b) ** 2 for b, _ in points)
        alpha = (mean_t - beta * mean_b) / rounds
        fitted = fitted_network(alpha, 1.0 / beta) if beta > 0 else None
        if fitted is not None:
            return fitted
    return fitted_network(0.0, sum(b for b, _ in points) / sum(t for _, t in points))


def cost_ratio(algorithm: str, num_ranks: int, samples: Iterable[Timing], network: Network) -> float | None:
    """How many times the model's price on ``network`` ``algorithm``'s measured exposed times
    were, each against the schedule in the chunks it ran in (the median over sizes and chunk
    counts); None without enough timings.

    >>> net = Network(0.0, 1e9)  # N = 4: StragglAR exposes 4 rounds of a third of the bucket each
    >>> cost_ratio("stragglar", 4, [(3 * 10**6, 0, 8e-3)] * RUNS, net)  # the model says 4 ms
    2.0
    >>> cost_ratio("stragglar", 4, [(3 * 10**6, 6, 7e-3)] * RUNS, net)  # 7 rounds of a sixth: 3.5 ms
    2.0
    """
    expect(network, Network, "cost_ratio's network")  # None was an AttributeError, once timed enough
    ratios = []
    for size, chunks, seconds in medians(samples):
        prof = generated_profile(algorithm, num_ranks, chunks or None)
        ratios.append(seconds / prof.seconds(prof.exposed, size, network))
    return statistics.median(ratios) if ratios else None


def scaled_fit(network: Network, ratio: float) -> Network | None:
    """:func:`scaled` of a fitted network by a measured ratio, or None where the result is outside
    what the model prices (:func:`~stragglar.model.cost.fitted_network`)."""
    return fitted_network(network.alpha * ratio, network.bandwidth / ratio)


def scaled(network: Network, ratio: float) -> Network:
    """``network`` with every round ``ratio`` (a finite number above 0) times as expensive.

    >>> scaled(Network(1e-3, 1e9), 2.0)
    Network(alpha=0.002, bandwidth=500000000.0)
    """
    expect(network, Network, "scaled's network")
    if not 0 < as_real(ratio, "ratio", "times") < math.inf:  # 0 was a ZeroDivisionError
        raise InputError(f"ratio must be a finite number above 0, got {described(ratio)}")
    return Network(network.alpha * ratio, network.bandwidth / ratio)


def medians(samples: Iterable[Timing]) -> list[Timing]:
    """(size, chunks, median seconds) for each size and chunk count timed at least :data:`RUNS`
    times, smallest first.

    Only those timed that often count: the first run of a bucket also checks headers and
    compiles, and DDP's first step has one bucket of every gradient, a size that never recurs.

    >>> medians([(8, 0, 1.0), (8, 0, 3.0), (8, 0, 2.0), (4, 0, 0.5), (8, 9, 1.0)])
    [(8, 0, 2.0)]
    """
    times: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
    for size, chunks, seconds in _timings(samples):
        if size > 0 and seconds > 0:
            times[size, chunks].append(seconds)
    return [
        (size, chunks, statistics.median(ts))
        for (size, chunks), ts in sorted(times.items())
        if len(ts) >= RUNS
    ]


def _timings(samples: Iterable[Timing]) -> Iterator[Timing]:
    """Each of ``samples`` as a :data:`Timing` of plain numbers, or one line of ours where it is
    none: the fits and the cost ratio met None, a string, a pair or a time of "s" as a TypeError
    or ValueError from an unpacking or a comparison, and took a NaN, infinite or negative time
    for no timing, or an infinite one as a ratio of inf.

    A size or a time of 0 is a timing still: the probe's slot that no rank timed, which
    :func:`medians` leaves out.
    """
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Iterable):
        raise ArgumentError(
            f"samples must be an iterable of (bytes, chunks, seconds) timings, got {described(samples)}"
        )
    for sample in samples:
        if isinstance(sample, (str, bytes)) or not isinstance(sample, Sequence) or len(sample) != 3:
            raise ArgumentError(
                f"each timing must be a (bytes, chunks, seconds) tuple, got {described(sample)}"
            )
        size, chunks, seconds = sample
        yield (
            as_int(size, "a timing's bytes", minimum=0),
            as_int(chunks, "a timing's chunks", minimum=0),
            as_seconds(seconds, "a timing's time"),
        )
