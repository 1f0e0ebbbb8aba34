"""The alpha-beta cost model, evaluated on schedules round by round.

Closed formulas describe an algorithm's ideal; pricing a schedule round by round prices what is
actually shipped, non-power-of-two and odd N included, and any schedule file.  This module only
consumes schedules (:func:`profile`); :mod:`stragglar.model.predict` prices the ones this
package generates.

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

>>> from stragglar.synth import synthesize
>>> c = compare([profile(synthesize(a, 8)) for a in ("stragglar", "ring")], 2**30, delay=0.01)
>>> round(c.speedup("stragglar"), 2), c.get("stragglar").exposed_rounds
(1.36, 9)
>>> print(f"{critical_delay(c.get('stragglar'), c.get('ring')) * 1e3:.3f} ms")
0.876 ms
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from stragglar.args import MAX_INT_BITS, as_int, as_real, as_seconds
from stragglar.errors import ArgumentError, InputError, described
from stragglar.schedule import Schedule, round_load
from stragglar.units import MAX_BYTES, MAX_SECONDS, MIN_BANDWIDTH, format_bytes, format_ratio, format_seconds

__all__ = [
    "PAPER_NETWORK",
    "Comparison",
    "Estimate",
    "Network",
    "Profile",
    "check_setting",
    "compare",
    "critical_delay",
    "estimate",
    "expect",
    "fitted_network",
    "profile",
]

_MAX_INT = 2**MAX_INT_BITS - 1  # the largest count :func:`~stragglar.args.as_int` takes


@dataclass(frozen=True)
class Network:
    """Per-round latency ``alpha`` (seconds) and per-link ``bandwidth`` (bytes per second)."""

    alpha: float
    bandwidth: float

    def __post_init__(self) -> None:
        for name, value in (("alpha", self.alpha), ("bandwidth", self.bandwidth)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):  # "3us": a raw TypeError
                raise ArgumentError(
                    f"{name} must be a number, got {described(value)} ({type(value).__name__})"
                )
        # The bounds of --alpha and --bandwidth: past them a round's price overflowed to inf (alpha
        # 1e300 priced every algorithm at inf s, and their speed-ups NaN), and a beta under 2**-60
        # rounded sub-byte chunks' prices into each other.
        if not 0 <= self.alpha <= MAX_SECONDS:
            raise InputError(
                f"alpha must be a finite number of seconds >= 0 and at most a week ({MAX_SECONDS:,} s), "
                f"got {described(self.alpha)}"
            )
        if not MIN_BANDWIDTH <= self.bandwidth <= MAX_BYTES:
            raise InputError(
                f"bandwidth must be at least {MIN_BANDWIDTH:g} B/s and at most {format_bytes(MAX_BYTES)}/s, "
                f"got {described(self.bandwidth)}"
            )

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1.0 / self.bandwidth


def fitted_network(alpha: float, bandwidth: float) -> Network | None:
    """The network a fit of measured times found, or None where it is outside what the model
    prices (a bandwidth past an exbibyte a second is a fit of times that did not grow with the
    size): a caller then has no fit, as with too few timings, rather than an error mid-run.

    >>> fitted_network(1e-3, 1e9), fitted_network(0.0, 1e30)
    (Network(alpha=0.001, bandwidth=1000000000.0), None)
    """
    if not (0 <= alpha <= MAX_SECONDS and MIN_BANDWIDTH <= bandwidth <= MAX_BYTES):
        return None
    return Network(alpha, bandwidth)


PAPER_NETWORK = Network(alpha=3e-6, bandwidth=450 * 2**30)
"""The paper's simulation setting: alpha = 3 us, 450 GiB/s (an H100 NVLink-class link)."""


@dataclass(frozen=True)
class Profile:
    """What the model needs from a schedule: per-round loads, split where the straggler joins.

    A load is the largest number of chunks any rank sends or receives in that round.  ``hidden``
    holds the rounds before the first phase that includes the straggler, ``exposed`` the rest.

    >>> from stragglar.synth import synthesize
    >>> p = profile(synthesize("direct", 8))
    >>> len(p.hidden), p.exposed
    (12, (7, 7, 7))
    """

    algorithm: str
    num_ranks: int
    num_chunks: int
    hidden: tuple[int, ...]
    exposed: tuple[int, ...]

    def __post_init__(self) -> None:
        """Refuse, in one line, a profile made by hand that no schedule has: 0 chunks priced every
        round as a ZeroDivisionError, a negative or NaN load a negative or NaN time, and loads in a
        list an unhashable profile (a sequence of them is kept as a tuple of ints)."""
        _check_name(self.algorithm, "Profile.algorithm")
        as_int(self.num_ranks, "Profile.num_ranks", minimum=1)
        as_int(self.num_chunks, "Profile.num_chunks", minimum=1)
        for name in ("hidden", "exposed"):
            object.__setattr__(self, name, _loads(getattr(self, name), f"Profile.{name}"))

    def seconds(self, loads: Sequence[int], size_bytes: float, network: Network) -> float:
        """The cost of the rounds with these ``loads`` for a buffer of ``size_bytes``."""
        chunk = size_bytes / self.num_chunks
        return len(loads) * network.alpha + sum(loads) * chunk * network.beta


def _check_name(value: object, name: str) -> None:
    """Refuse an algorithm's name that is no string: a table and :meth:`Comparison.get` print and
    match it as one."""
    if not isinstance(value, str):
        raise ArgumentError(f"{name} must be a name (a str), got {described(value)}")


def _loads(value: object, name: str) -> tuple[int, ...]:
    """``value`` as per-round loads (chunks, each an integer >= 0); :func:`profile`'s tuple of
    ints as it is, without a copy."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ArgumentError(f"{name} must be a sequence of per-round loads (chunks), got {described(value)}")
    if type(value) is tuple and all(type(load) is int and load >= 0 for load in value):
        return value
    return tuple(as_int(load, f"each of {name}", minimum=0) for load in value)


def expect(value: object, kind: type, name: str) -> None:
    """Refuse, in one line of ours, a ``value`` that is not a ``kind``: the model's functions take
    each other's results, and a Schedule passed where its Profile belongs was an AttributeError
    from inside."""
    if isinstance(value, kind):
        return
    hint = ""
    if kind is Profile and isinstance(value, Schedule):
        hint = ": pass profile(schedule)"
    elif kind is Schedule and isinstance(getattr(value, "schedule", None), Schedule):
        hint = ": pass its .schedule"
    article = "an" if kind.__name__[0] in "AEIOU" else "a"
    raise ArgumentError(f"{name} must be {article} {kind.__name__}, got {type(value).__name__}{hint}")


def profile(schedule: Schedule) -> Profile:
    """Price-independent summary of ``schedule``: compute it once, evaluate it at any setting.

    A schedule without a straggler (Ring, RHD) waits for whichever rank is late, so all its
    rounds are exposed (:attr:`~stragglar.schedule.Schedule.hidden_phases`).
    """
    expect(schedule, Schedule, "profile's schedule")
    split = schedule.hidden_phases
    hidden = tuple(round_load(rnd) for phase in schedule.phases[:split] for rnd in phase.rounds)
    exposed = tuple(round_load(rnd) for phase in schedule.phases[split:] for rnd in phase.rounds)
    return Profile(schedule.algorithm, schedule.num_ranks, schedule.num_chunks, hidden, exposed)


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

    def __post_init__(self) -> None:
        """Refuse, in one line, figures made by hand that no setting prices: a NaN or infinite time
        compared false with everything (:func:`critical_delay` found crossings in it), and a
        negative one, or more exposed rounds than rounds, described no schedule.  :func:`estimate`
        builds several per bucket and step for the DDP policy: its plain ints and floats pass one
        test first, 0.3 us where the checks that name what is wrong take 2 us."""
        if (
            type(self.num_ranks) is type(self.rounds) is type(self.exposed_rounds) is int
            and type(self.hidden) is type(self.tail) is type(self.delay) is float
            and type(self.algorithm) is str
            and 1 <= self.num_ranks <= _MAX_INT
            and 0 <= self.exposed_rounds <= self.rounds <= _MAX_INT
            and 0.0 <= self.hidden < math.inf
            and 0.0 <= self.tail < math.inf
            and 0.0 <= self.delay < math.inf
        ):
            return
        _check_name(self.algorithm, "Estimate.algorithm")
        as_int(self.num_ranks, "Estimate.num_ranks", minimum=1)
        rounds = as_int(self.rounds, "Estimate.rounds", minimum=0)
        if not 0 <= as_int(self.exposed_rounds, "Estimate.exposed_rounds") <= rounds:
            raise InputError(
                f"Estimate.exposed_rounds must be in 0..{rounds} (its rounds), got {self.exposed_rounds}"
            )
        for name in ("hidden", "tail", "delay"):
            as_seconds(getattr(self, name), f"Estimate.{name}", maximum=math.inf)

    @property
    def time(self) -> float:
        """Completion time, from when the punctual ranks start."""
        return max(self.delay, self.hidden) + self.tail

    @property
    def exposed(self) -> float:
        """Time after the straggler arrives: the tail, plus any hidden work still running then.

        Summed from its parts, not taken as ``time - delay``: with a delay far above the tail that
        difference lost the tail to rounding (a 1-byte buffer an hour late was exposed 0 s, and its
        speed-up a ZeroDivisionError).
        """
        return max(self.hidden - self.delay, 0.0) + self.tail


def check_setting(size_bytes: float, delay: float) -> tuple[float, float]:
    """A setting the model prices, checked the same way by every caller: a buffer of 1 byte to
    :data:`~stragglar.units.MAX_BYTES` (``--size``'s bounds) and a straggler a finite number of
    seconds late, at least 0, as floats.  An infinite delay priced every speed-up as NaN, and
    ``True`` was a 1-byte buffer; a buffer of 1e308 bytes cost inf s, and one of 1e-320 bytes 0 s
    (its speed-up a ZeroDivisionError).

    >>> check_setting(2**30, 0)
    (1073741824.0, 0.0)
    """
    size = _finite(size_bytes, "the buffer size", "bytes")
    if not 1 <= size <= MAX_BYTES:
        raise InputError(
            f"the buffer size must be at least 1 byte and at most {format_bytes(MAX_BYTES)}, "
            f"got {described(size_bytes)}"
        )
    late = _finite(delay, "the straggler delay", "seconds")
    if not late >= 0:
        raise InputError(f"the straggler delay must be >= 0 seconds, got {described(delay)}")
    return size, late


def _finite(value: object, name: str, unit: str) -> float:
    number = as_real(value, name, unit)
    if not math.isfinite(number):
        raise InputError(f"{name} must be a finite number of {unit}, got {described(value)}")
    return number


def estimate(prof: Profile, size_bytes: float, delay: float, network: Network) -> Estimate:
    """Evaluate ``prof`` for a buffer of ``size_bytes`` and a straggler ``delay`` seconds late.

    >>> from stragglar.synth import synthesize
    >>> e = estimate(profile(synthesize("stragglar", 4)), 3 * 2**20, 0.0, Network(0.0, 2**30))
    >>> e.hidden * 1e3, e.tail * 1e3  # 2 hidden rounds, 4 exposed, 1 MiB chunks at 1 GiB/s
    (1.953125, 3.90625)
    """
    expect(prof, Profile, "estimate's profile")
    expect(network, Network, "network")
    size_bytes, delay = check_setting(size_bytes, delay)
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
    expect(candidate, Estimate, "critical_delay's candidate")
    expect(baseline, Estimate, "critical_delay's baseline")
    if candidate.num_ranks != baseline.num_ranks:  # a crossing of two settings means nothing
        raise InputError(
            f"critical_delay compares two algorithms on one setting, got {candidate.num_ranks} GPUs "
            f"against {baseline.num_ranks}"
        )

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
        priced = ", ".join(e.algorithm for e in self.estimates)
        raise InputError(  # rhd has none where N is no power of two: a value error, not a lookup's
            f"no estimate for {described(algorithm)} at N = {self.num_ranks} (priced: {priced})"
        )

    def speedup(self, algorithm: str) -> float:
        """Ring's exposed time over ``algorithm``'s: above 1 means faster than Ring.  A schedule
        with no time after the straggler arrives (a hand-made one with no round after it joins)
        has no speed-up to give: refused, where the division raised ZeroDivisionError."""
        ours = self.get(algorithm).exposed
        if ours <= 0:
            raise InputError(
                f"{described(algorithm)} takes no time after the straggler arrives: no speed-up over ring"
            )
        return self.get("ring").exposed / ours

    def critical_delay(self, algorithm: str) -> float | None:
        """See :func:`critical_delay`, against Ring."""
        return critical_delay(self.get(algorithm), self.get("ring"))

    def table(self) -> str:
        """The setting, one row per algorithm, then when each straggler-aware one beats Ring.
        "straggler rounds": the rounds of the phases the straggler takes part in, of all (the
        others can run during its delay); whether they are exposed depends on the delay, which
        "exposed time" prices."""
        width = max(10, *(len(e.algorithm) for e in self.estimates))
        lines = [
            f"alpha-beta model: {self.num_ranks} GPUs, {format_bytes(self.size_bytes)} buffer, straggler "
            f"{format_seconds(self.delay)} late, alpha {format_seconds(self.network.alpha)}, "
            f"{format_bytes(self.network.bandwidth)}/s",
            f"{'algorithm':<{width}} {'straggler rounds':>16} {'time':>11} {'exposed time':>13} "
            f"{'speed-up over ring':>19}",
        ]
        for e in self.estimates:
            rounds = f"{e.exposed_rounds} of {e.rounds}"
            lines.append(
                f"{e.algorithm:<{width}} {rounds:>16} {format_seconds(e.time):>11} "
                f"{format_seconds(e.exposed):>13} {format_ratio(self.speedup(e.algorithm)):>18}x"
            )
        for e in self.estimates:
            if e.hidden == 0:
                continue
            critical = self.critical_delay(e.algorithm)
            if critical is None:
                verdict = "never beats ring at this size, whatever the delay"
            elif critical == 0:
                verdict = "beats ring at every delay"
            else:
                verdict = f"beats ring when the straggler is more than {format_seconds(critical)} late"
            lines.append(f"critical delay: {e.algorithm} {verdict}")
        return "\n".join(lines)


def compare(
    profiles: Sequence[Profile], size_bytes: float, delay: float, network: Network = PAPER_NETWORK
) -> Comparison:
    """Estimate every profiled schedule (one per algorithm, all for one N, Ring among them)."""
    if isinstance(profiles, (str, bytes)) or not isinstance(profiles, Sequence):
        raise ArgumentError(f"profiles must be a sequence of Profiles, got {type(profiles).__name__}")
    for p in profiles:
        expect(p, Profile, "each of profiles")
    expect(network, Network, "network")
    if not any(p.algorithm == "ring" for p in profiles):
        raise InputError("a comparison needs Ring's profile: speed-ups are over Ring")
    if len({p.num_ranks for p in profiles}) != 1:
        raise InputError(
            f"a comparison needs profiles for one N, got {sorted({p.num_ranks for p in profiles})}"
        )
    estimates = tuple(estimate(p, size_bytes, delay, network) for p in profiles)
    return Comparison(profiles[0].num_ranks, size_bytes, delay, network, estimates)
