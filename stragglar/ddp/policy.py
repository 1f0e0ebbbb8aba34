"""When StragglAR pays, and for which straggler: pure functions of the figures every rank gathers.

Every rank calls these with the same gathered figures, so every rank reaches the same choice for
the same bucket; nothing here reads a clock or a rank's own state.

*Lateness.*  At each step the probe (:class:`~stragglar.ddp.probe.LateRankProbe`) gathers each
rank's wait: how long it waited, from posting a tiny all_gather, for the last rank to post it.
Rank ``r``'s lateness at that step is how much later it arrived than the latest of the others,
``min(wait of the others) - wait of r``: positive for the last rank (exactly the model's delay if
it were the straggler), negative for the others.  Its *expected* lateness is the median over the
recent steps, so one slow step (a page fault, a collection) decides nothing.

*Critical delay.*  The cost model (:mod:`stragglar.cost`) says above which delay StragglAR beats a
Ring AllReduce of the same bucket on a given network; below it the engine's all_reduce is used.

*Network.*  Fitted (a Ring alpha-beta model, :func:`~stragglar.measure.sweep.fit_ring`) to the
engine's own all_reduce timings of earlier buckets, each the fastest rank's time (the last rank to
arrive does not wait for anyone, so its time is the communication alone).
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from stragglar.cost import Network, critical_delay, estimate
from stragglar.measure.predict import generated_profile
from stragglar.measure.sweep import fit_ring

__all__ = [
    "Choice",
    "Outlook",
    "choose",
    "critical_delay_for",
    "fit_network",
    "latenesses",
    "outlook",
    "persistent_late_rank",
]

STRAGGLAR = "stragglar"
ALLREDUCE = "allreduce"


@dataclass(frozen=True, slots=True)
class Choice:
    """How one bucket is reduced: ``algorithm`` is "stragglar" (with ``straggler``) or "allreduce"."""

    algorithm: str
    straggler: int | None = None


ENGINE = Choice(ALLREDUCE)


@dataclass(frozen=True, slots=True)
class Outlook:
    """One step's figures: the rank most likely to be last, how late it is expected (seconds), and
    the network its buckets are priced on (None: not known yet)."""

    candidate: int
    lateness: float
    network: Network | None


def persistent_late_rank(history: Sequence[int], window: int, share: float) -> int | None:
    """The rank that arrived last in at least ``share`` of the last ``window`` steps, if any.

    >>> persistent_late_rank([2, 2, 1, 2], window=4, share=0.75)
    2
    >>> persistent_late_rank([2, 2, 1], window=4, share=0.75) is None  # not a full window yet
    True
    """
    recent = list(history)[-window:]
    if len(recent) < window:
        return None
    rank, count = collections.Counter(recent).most_common(1)[0]
    return rank if count >= share * window else None


def latenesses(waits: Sequence[float]) -> tuple[float, ...]:
    """Each rank's lateness at one step, from every rank's wait (at least two ranks).

    >>> [round(x, 3) for x in latenesses([0.030, 0.001, 0.031, 0.029])]
    [-0.029, 0.028, -0.03, -0.028]
    """
    order = sorted(range(len(waits)), key=waits.__getitem__)
    first, second = waits[order[0]], waits[order[1]]  # the last rank's wait, the next one's
    return tuple((second if rank == order[0] else first) - wait for rank, wait in enumerate(waits))


def outlook(history: Sequence[Sequence[float]], network: Network | None, fixed: int | None) -> Outlook | None:
    """The step's :class:`Outlook` from the latenesses of recent steps (None: no step seen yet).

    The candidate is ``fixed`` (a straggler the user named), else the rank with the largest
    expected lateness, the lowest such rank on a tie.

    >>> steps = [(0.0, 0.03, -0.01), (-0.002, 0.028, -0.005), (0.001, -0.001, -0.003)]
    >>> o = outlook(steps, None, None)
    >>> o.candidate, round(o.lateness, 3)
    (1, 0.028)
    >>> round(outlook(steps, None, 2).lateness, 3)
    -0.005
    """
    if not history:
        return None
    expected = [statistics.median(column) for column in zip(*history, strict=True)]
    candidate = fixed if fixed is not None else max(range(len(expected)), key=expected.__getitem__)
    return Outlook(candidate, expected[candidate], network)


@lru_cache(maxsize=4096)
def critical_delay_for(algorithm: str, num_ranks: int, size_bytes: int, network: Network) -> float | None:
    """The delay above which ``algorithm``'s schedule beats a Ring AllReduce of ``size_bytes``
    (None: at no delay), on ``network``.  Cached: a hook asks for the same buckets every step."""
    ours = estimate(generated_profile(algorithm, num_ranks), size_bytes, 0.0, network)
    ring = estimate(generated_profile("ring", num_ranks), size_bytes, 0.0, network)
    return critical_delay(ours, ring)


def choose(algorithm: str, num_ranks: int, size_bytes: int, step: Outlook | None) -> Choice:
    """StragglAR with the candidate as straggler when its expected lateness exceeds the critical
    delay for a bucket of ``size_bytes``; otherwise (or with no figures yet) the engine's all_reduce.

    >>> late = Outlook(candidate=1, lateness=0.030, network=Network(2e-4, 1e9))
    >>> choose("stragglar", 4, 4 * 2**20, late), choose("stragglar", 4, 64 * 2**20, late)
    (Choice(algorithm='stragglar', straggler=1), Choice(algorithm='allreduce', straggler=None))
    """
    if step is None or step.network is None or size_bytes <= 0:
        return ENGINE
    critical = critical_delay_for(algorithm, num_ranks, size_bytes, step.network)
    if critical is None or step.lateness <= critical:
        return ENGINE
    return Choice(STRAGGLAR, step.candidate)


def fit_network(num_ranks: int, samples: Iterable[tuple[int, float]]) -> Network | None:
    """Alpha and bandwidth of the engine's all_reduce from (bytes, seconds) timings.

    Least squares on a Ring model when the sizes differ enough to separate alpha from bandwidth;
    otherwise (one bucket size, or noise that makes the fit meaningless) the bandwidth alone, with
    alpha 0, which prices every round by its bytes.

    >>> net = fit_network(4, [(2**20, 6e-3 + 1.5 * 2**20 / 1e9), (2**24, 6e-3 + 1.5 * 2**24 / 1e9)])
    >>> round(net.alpha * 1e3, 6), round(net.bandwidth / 1e9, 6)
    (1.0, 1.0)
    >>> fit_network(4, [(2**20, 3e-3)]).alpha, fit_network(4, []) is None
    (0.0, True)
    """
    points = [(size, seconds) for size, seconds in samples if size > 0 and seconds > 0]
    if not points:
        return None
    fitted = fit_ring(num_ranks, points)
    if fitted is not None:
        return fitted
    ring_bytes = sum(2 * (num_ranks - 1) / num_ranks * size for size, _ in points)
    return Network(0.0, ring_bytes / sum(seconds for _, seconds in points))
