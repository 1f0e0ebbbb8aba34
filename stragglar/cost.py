"""The alpha-beta cost model, evaluated on the schedules this package generates.

Closed formulas describe an algorithm's ideal; pricing the generated schedule round by round
prices what is actually shipped, non-power-of-two and odd N included, and any schedule file.

The model:

* A round costs ``alpha + beta * b``, where ``b`` is the largest number of bytes any rank sends
  or receives in it: a chunk is ``size / num_chunks`` bytes (no padding) and several chunks to
  one peer add up.  ``beta`` is ``1 / bandwidth``.
* The punctual ranks start at ``t = 0``; the straggler arrives at ``t = delay``.  Phases run in
  order.  The phases before the first one that includes the straggler (StragglAR's and Direct's
  hidden phase) run from ``t = 0`` and so overlap the delay; the first phase with the straggler
  starts at ``max(delay, end of those)``.  Ring and RHD have no such phase: they start at
  ``delay``.

Figures of an :class:`Estimate`:

* ``time``: completion, measured from ``t = 0`` (when the punctual ranks start).
* ``exposed``: ``time - delay``, the time after the straggler arrives.  The delay itself is paid
  by every algorithm alike, so this is what an algorithm can change; it is the paper's measure.
* speed-up over Ring (:meth:`Comparison.speedup`): Ring's exposed time over the algorithm's.
  As both wait for the same delay this orders the algorithms exactly as ``time`` does.
* critical delay (:func:`critical_delay`): the delay above which the algorithm beats Ring,
  solved exactly from the piecewise-linear exposed times.

The paper's simulation (alpha 3 us, 450 GiB/s, 1 GiB, delay long enough to hide phase 1):

>>> c = compare(8, 2**30, delay=0.01)
>>> round(c.speedup("stragglar"), 2), c.get("stragglar").exposed_rounds
(1.36, 9)
>>> print(f"{critical_delay(c.get('stragglar'), c.get('ring')) * 1e3:.3f} ms")
0.876 ms
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

from stragglar.schedule import Round, Schedule
from stragglar.synth import ALGORITHMS, synthesize

__all__ = [
    "PAPER_NETWORK",
    "Comparison",
    "Estimate",
    "Network",
    "Profile",
    "compare",
    "critical_delay",
    "estimate",
    "format_bytes",
    "format_seconds",
    "profile",
    "schedule_profile",
]


@dataclass(frozen=True)
class Network:
    """Per-round latency ``alpha`` (seconds) and per-link ``bandwidth`` (bytes per second)."""

    alpha: float
    bandwidth: float

    def __post_init__(self) -> None:
        if not self.alpha >= 0:
            raise ValueError(f"alpha must be >= 0 seconds, got {self.alpha}")
        if not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {self.bandwidth}")

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1.0 / self.bandwidth


PAPER_NETWORK = Network(alpha=3e-6, bandwidth=450 * 2**30)
"""The paper's simulation setting: alpha = 3 us, 450 GiB/s (an H100 NVLink-class link)."""


@dataclass(frozen=True)
class Profile:
    """What the model needs from a schedule: per-round loads, split where the straggler joins.

    A load is the largest number of chunks any rank sends or receives in that round.  ``hidden``
    holds the rounds before the first phase that includes the straggler, ``exposed`` the rest.

    >>> p = profile(synthesize("direct", 8))
    >>> len(p.hidden), p.exposed
    (12, (7, 7, 7))
    """

    algorithm: str
    num_ranks: int
    num_chunks: int
    hidden: tuple[int, ...]
    exposed: tuple[int, ...]

    def seconds(self, loads: Sequence[int], size_bytes: float, network: Network) -> float:
        """The cost of the rounds with these ``loads`` for a buffer of ``size_bytes``."""
        chunk = size_bytes / self.num_chunks
        return len(loads) * network.alpha + sum(loads) * chunk * network.beta


def profile(schedule: Schedule) -> Profile:
    """Price-independent summary of ``schedule``: compute it once, evaluate it at any setting.

    A schedule without a straggler (Ring, RHD) waits for whichever rank is late, so all its
    rounds are exposed.
    """
    hidden: list[int] = []
    exposed: list[int] = []
    joined = False
    for phase in schedule.phases:
        joined = joined or schedule.straggler is None or schedule.straggler in phase.ranks
        (exposed if joined else hidden).extend(_load(rnd) for rnd in phase.rounds)
    return Profile(schedule.algorithm, schedule.num_ranks, schedule.num_chunks, tuple(hidden), tuple(exposed))


def _load(rnd: Round) -> int:
    sent = Counter(t.src for t in rnd)
    received = Counter(t.dst for t in rnd)
    return max(max(sent.values(), default=0), max(received.values(), default=0))


@lru_cache(maxsize=256)
def schedule_profile(algorithm: str, num_ranks: int) -> Profile:
    """The profile of ``algorithm``'s generated schedule (cached: sweeps reuse it)."""
    return profile(synthesize(algorithm, num_ranks))


@dataclass(frozen=True)
class Estimate:
    """One algorithm's predicted figures at one setting; all times in seconds."""

    algorithm: str
    num_ranks: int
    rounds: int
    exposed_rounds: int
    hidden: float
    tail: float
    delay: float

    @property
    def time(self) -> float:
        """Completion time, from when the punctual ranks start."""
        return max(self.delay, self.hidden) + self.tail

    @property
    def exposed(self) -> float:
        """Time after the straggler arrives: the tail, plus any hidden work still running then."""
        return self.time - self.delay


def estimate(prof: Profile, size_bytes: float, delay: float, network: Network) -> Estimate:
    """Evaluate ``prof`` for a buffer of ``size_bytes`` and a straggler ``delay`` seconds late.

    >>> e = estimate(schedule_profile("stragglar", 4), 3 * 2**20, 0.0, Network(0.0, 2**30))
    >>> e.hidden * 1e3, e.tail * 1e3  # 2 hidden rounds, 4 exposed, 1 MiB chunks at 1 GiB/s
    (1.953125, 3.90625)
    """
    if not size_bytes > 0:
        raise ValueError(f"the buffer size must be > 0 bytes, got {size_bytes}")
    if not delay >= 0:
        raise ValueError(f"the straggler delay must be >= 0 seconds, got {delay}")
    return Estimate(
        prof.algorithm,
        prof.num_ranks,
        len(prof.hidden) + len(prof.exposed),
        len(prof.exposed),
        prof.seconds(prof.hidden, size_bytes, network),
        prof.seconds(prof.exposed, size_bytes, network),
        delay,
    )


def critical_delay(candidate: Estimate, baseline: Estimate) -> float | None:
    """The smallest delay ``d*`` with ``candidate`` strictly faster than ``baseline`` at every
    delay above it; ``0.0`` if it is faster at every delay, None if at no large delay.

    Each exposed time is ``max(hidden - d, 0) + tail``: piecewise linear with one bend, so the
    difference is linear between the bends and the crossing is solved exactly.

    >>> e = lambda hidden, tail: Estimate("x", 4, 0, 0, hidden, tail, 0.0)
    >>> critical_delay(e(5.0, 2.0), e(0.0, 4.0)), critical_delay(e(5.0, 4.0), e(0.0, 4.0))
    (3.0, None)
    """

    def gap(d: float) -> float:
        ours = max(candidate.hidden - d, 0.0) + candidate.tail
        theirs = max(baseline.hidden - d, 0.0) + baseline.tail
        return ours - theirs

    if candidate.tail >= baseline.tail:
        return None
    bends = sorted({0.0, candidate.hidden, baseline.hidden})
    for left, right in reversed(list(pairwise(bends))):
        at_left, at_right = gap(left), gap(right)
        if at_right >= 0:
            return right
        if at_left >= 0:
            return left + (right - left) * at_left / (at_left - at_right)
    return 0.0


@dataclass(frozen=True)
class Comparison:
    """Every algorithm's estimate at one setting, with Ring as the baseline."""

    num_ranks: int
    size_bytes: float
    delay: float
    network: Network
    estimates: tuple[Estimate, ...]

    def get(self, algorithm: str) -> Estimate:
        for e in self.estimates:
            if e.algorithm == algorithm:
                return e
        raise KeyError(f"no estimate for {algorithm!r} at N={self.num_ranks}")

    def speedup(self, algorithm: str) -> float:
        """Ring's exposed time over ``algorithm``'s: above 1 means faster than Ring."""
        return self.get("ring").exposed / self.get(algorithm).exposed

    def critical_delay(self, algorithm: str) -> float | None:
        """See :func:`critical_delay`, against Ring."""
        return critical_delay(self.get(algorithm), self.get("ring"))


def compare(
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
        raise ValueError(f"unknown algorithm {sorted(unknown)[0]!r} (choose from {', '.join(ALGORITHMS)})")
    wanted = dict.fromkeys(["ring", *algorithms])
    if num_ranks & (num_ranks - 1):
        wanted.pop("rhd", None)
    estimates = tuple(
        estimate(schedule_profile(a, num_ranks), size_bytes, delay, network)
        for a in ALGORITHMS
        if a in wanted
    )
    return Comparison(num_ranks, size_bytes, delay, network, estimates)


def format_seconds(seconds: float) -> str:
    """A duration with a unit people read at a glance: ``0.002884`` -> ``'2.884 ms'``.

    >>> format_seconds(0.002884), format_seconds(3e-6), format_seconds(1.5)
    ('2.884 ms', '3 us', '1.5 s')
    """
    for unit, factor in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= factor:
            return f"{seconds / factor:.4g} {unit}"
    return f"{seconds / 1e-6:.4g} us"


def format_bytes(size: float) -> str:
    """A byte count in binary units: ``2**30`` -> ``'1 GiB'``.

    >>> format_bytes(2**30), format_bytes(450 * 2**30), format_bytes(1536)
    ('1 GiB', '450 GiB', '1.5 KiB')
    """
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            return f"{size / factor:.4g} {unit}"
    return f"{size:.4g} B"
