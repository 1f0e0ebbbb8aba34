"""Would StragglAR have helped?  A recorded arrival trace replayed through the policy and the model.

Each step of a group gives when each of its N ranks reached the gradient collective.  From it:

* *Who is late.*  A rank's lateness at a step is how much later it arrived than the latest of the
  others (:func:`~stragglar.model.policy.latenesses`, the probe's rule, computed exactly from the
  trace's times).  A *persistent straggler* is what the DDP hook finds, with the one rule
  (:mod:`stragglar.model.detect`: a sequential test on the steps at which each rank was last,
  against chance 1/N, whose false alarms begin at a stated rate per step where steps are
  independent); each time the rule names
  a rank is an :class:`Episode`, from the first step of the evidence to the step it lets go.
* *What each collective would cost.*  The alpha-beta model (:func:`~stragglar.model.cost.estimate`)
  prices each bucket from the moment the first rank arrived.  A schedule with straggler ``s``
  starts when every other rank is in (``t_p``) and has ``s`` arrive ``max(t_s - t_p, 0)`` later:
  ``t_p + estimate(...).time``.  Ring (the engine's all_reduce) has no straggler: it starts when
  the last rank is in.  Priced: Ring, the paper's StragglAR and chunked StragglAR (per bucket, the
  one chunk count the model prices fastest over the whole trace,
  :func:`~stragglar.model.policy.chunk_count`: never slower than the paper's), both with
  the group's persistent straggler (the rank named at the end, else the one named at the most
  steps; else the rank last most often) as straggler, and the ``auto`` policy.
* *What the auto policy would have chosen.*  Step by step, with the hook's own code
  (:class:`~stragglar.model.policy.AutoPolicy` and :func:`~stragglar.model.policy.choose`) on the
  given network, seeing what the hook's probe would have seen: the figures of step ``s`` from
  step ``s +`` :data:`~stragglar.model.policy.PROBE_LAG` on.

Each bucket is priced as if it alone met the step's arrivals: the savings add up over buckets,
while the times overstate a step whose buckets overlap.  A model, not a measurement.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import cast

from stragglar.errors import ArgumentError, InputError, described
from stragglar.model.chunks import AUTO
from stragglar.model.cost import Network, Profile, estimate
from stragglar.model.detect import WINDOW, Detection, Rule, fresh, last_and_event, observe_event, quantile
from stragglar.model.fits import Timing
from stragglar.model.policy import (
    ALLREDUCE,
    PROBE_LAG,
    STRAGGLAR,
    AutoPolicy,
    Choice,
    Outlook,
    choose,
    chunk_count,
    latenesses,
)
from stragglar.model.predict import generated_profile
from stragglar.units import common_ticks

__all__ = [
    "AUTO_POLICY",
    "CHUNKED",
    "PRICED",
    "Episode",
    "GroupReplay",
    "Setting",
    "StepReplay",
    "priced",
    "replay",
]

RING = "ring"
CHUNKED = "stragglar C=auto"
AUTO_POLICY = "auto"
PRICED = (RING, STRAGGLAR, CHUNKED, AUTO_POLICY)  # the figures priced, in the order shown
Decision = tuple[int, str, int | None, int | None]


@dataclass(frozen=True)
class Setting:
    """What a replay prices on: the ``network``, the buckets of each step (bytes), the
    persistent-straggler ``rule`` and the ``window`` of recent steps the auto policy judges (the
    hook's ``false_alarm``, ``share``, ``margin`` and ``detect``), and the auto policy's ``chunks``
    (the hook's: None for the paper's N-1)."""

    network: Network
    buckets: tuple[int, ...]
    window: int = WINDOW
    rule: Rule = field(default_factory=Rule)
    chunks: int | str | None = None


@dataclass(frozen=True)
class StepReplay:
    """One step: each rank's lateness (seconds), the rank last in (None: a tie, nobody late), the
    auto policy's choice per bucket, and each algorithm's predicted time from the first arrival,
    summed over the buckets."""

    step: int
    late: tuple[float, ...]
    last: int | None
    choices: tuple[Choice, ...]
    predicted: dict[str, float]

    @property
    def chose_stragglar(self) -> bool:
        return any(choice.algorithm == STRAGGLAR for choice in self.choices)


@dataclass(frozen=True)
class Episode:
    """A rank the rule named: ``since`` the first step of the evidence (a step at which it was
    last), ``named`` the step the evidence sufficed, ``until`` the first step it was no longer
    named (None: still named at the trace's end)."""

    rank: int
    since: int
    named: int
    until: int | None


@dataclass(frozen=True)
class GroupReplay:
    """A group's replay: ``episodes`` the persistent stragglers the rule named, in order;
    ``straggler`` the rank the fixed StragglAR figures take as late (the rank named at the end,
    else the rank named at the most steps, else the rank last most often); ``chunks`` chunked
    StragglAR's count per bucket (None: the paper's N-1); ``decisions`` as the hook records them
    (:attr:`~stragglar.ddp.StragglarState.decisions`)."""

    num_ranks: int
    steps: tuple[StepReplay, ...]
    episodes: tuple[Episode, ...]
    straggler: int
    chunks: tuple[int | None, ...]
    decisions: tuple[Decision, ...]

    @property
    def persistent_straggler(self) -> int | None:
        """The rank the rule names at the trace's end (None: nobody)."""
        return self.episodes[-1].rank if self.episodes and self.episodes[-1].until is None else None

    @property
    def times_last(self) -> int:
        """The steps at which the straggler arrived last."""
        return sum(s.last == self.straggler for s in self.steps)

    @property
    def last_share(self) -> float:
        """The share of steps the straggler arrived last."""
        return self.times_last / len(self.steps)

    @property
    def chance(self) -> float:
        """The share of steps a rank is last at by chance alone: 1/N."""
        return 1 / self.num_ranks

    def lateness(self, quantile_: float) -> float | None:
        """The straggler's lateness behind the latest other rank at the steps it was last, at that
        quantile: 0.5 the median (of an even count, the mean of the middle two, as the hook's
        figures are: the nearest rank printed 15 ms for 1..30 ms),
        others the nearest rank (0.9 the 90th percentile); None: never last."""
        values = [s.late[self.straggler] for s in self.steps if s.last == self.straggler]
        if not values:
            return None
        return statistics.median(values) if quantile_ == 0.5 else quantile(values, quantile_)

    def total(self, algorithm: str) -> float:
        """``algorithm``'s predicted time summed over the steps."""
        return math.fsum(s.predicted[algorithm] for s in self.steps)

    @property
    def stragglar_steps(self) -> int:
        """The steps at which the auto policy chose StragglAR for some bucket."""
        return sum(s.chose_stragglar for s in self.steps)


def replay(
    times: Sequence[Sequence[Fraction | int | float]],
    steps: Sequence[int],
    setting: Setting,
    per_second: int | None = None,
) -> GroupReplay:
    """Replay one group: ``times[i][r]`` is when rank ``r`` reached step ``steps[i]``'s
    collective (steps in order, at least two ranks): seconds, exact, or with ``per_second`` whole
    ticks of ``1 / per_second`` seconds (a trace's :attr:`~stragglar.formats.traces.Group.ticks`,
    which the replay compares and subtracts as they are).  A trace of another shape is an
    :class:`~stragglar.errors.InputError`: steps out of order would date evidence after its
    naming."""
    if not times or len(times) != len(steps):
        raise InputError(f"{len(times)} rows of times for {len(steps)} steps: one row a step, at least one")
    n = len(times[0])
    if n < 2 or any(len(row) != n for row in times):
        counts = sorted({len(row) for row in times})
        raise InputError(f"every step needs the same ranks, at least two: got rows of {counts} ranks")
    if any(later <= earlier for earlier, later in itertools.pairwise(steps)):
        raise InputError("steps must be numbered in increasing order")
    ticks: Sequence[Sequence[int]]
    if per_second is None:
        ticks, per_second = common_ticks([[Fraction(t).as_integer_ratio() for t in row] for row in times])
    elif type(per_second) is not int or per_second < 1:  # of any size: the lcm of the denominators
        raise ArgumentError(
            f"per_second must be a whole number of ticks above 0, got {described(per_second)}"
        )
    else:
        ticks = cast("Sequence[Sequence[int]]", times)  # whole ticks, as the readers' groups hold them
    late = [_late(row, per_second) for row in ticks]
    # each step's row checked and its last rank found once, for the rule, the policy's windows and
    # the figures (four checks and three finds a step before: 0.86 s -> 0.73 s a replay at N = 256)
    last, events = zip(*[last_and_event(setting.rule, step) for step in late], strict=True)
    latest = [max(range(n), key=step.__getitem__) for step in late]  # a tie's first: for Ring's start
    states = _detections(setting.rule, n, events)
    episodes = _episodes(states, steps)
    straggler = _straggler(episodes, steps, last)
    arrivals = [_after_first(row, per_second) for row in ticks]
    delays = [_wait(seconds, straggler)[1] for seconds in arrivals]
    network = setting.network
    # per bucket, the one count the model prices fastest over the trace's steps (the count fastest
    # at a typical lateness could save less than the paper's N - 1 over them: on the README's
    # example, 10 chunks at the median lateness saved 4.6 ms where 9 save 5.6 ms); once a size,
    # each pricing every step (0.4 s at 500,000 steps)
    fastest = {size: chunk_count(n, size, delays, network, AUTO) for size in set(setting.buckets)}
    chunks = tuple(fastest[size] for size in setting.buckets)
    ring = generated_profile(RING, n)
    if setting.chunks is not None and setting.chunks != AUTO:  # refused now, not at its first use
        generated_profile(STRAGGLAR, n, int(setting.chunks))
    paper = generated_profile(STRAGGLAR, n)
    chunked = [generated_profile(STRAGGLAR, n, c) for c in chunks]
    policy = AutoPolicy(STRAGGLAR, network)
    samples: dict[str, list[Timing]] = {ALLREDUCE: [], STRAGGLAR: []}  # none: the network is given
    outlook: Outlook | None = None
    decisions: list[Decision] = []
    previous: Choice | None = None
    replayed = []
    for i, (step, seconds) in enumerate(zip(steps, arrivals, strict=True)):
        arrived = i - PROBE_LAG + 1  # the steps whose figures the hook's probe has at this step
        if arrived > 0:
            start = max(0, arrived - setting.window)  # the probe's window
            recent, marks = late[start:arrived], events[start:arrived]
            outlook = policy.judge(n, recent, setting.rule, states[arrived - 1], None, samples, marks)
        choices = []
        predicted = dict.fromkeys(PRICED, 0.0)
        chosen: dict[int, Choice] = {}  # a step's buckets are often of one size: chosen once
        price = _Prices(seconds, network)
        for b, size in enumerate(setting.buckets):
            if size not in chosen:
                chosen[size] = choose(STRAGGLAR, n, size, outlook, setting.chunks)
            choice = chosen[size]
            if choice != previous:
                previous = choice
                decisions.append((step, choice.algorithm, choice.straggler, choice.chunks))
            choices.append(choice)
            predicted[RING] += price(ring, latest[i], size)
            predicted[STRAGGLAR] += price(paper, straggler, size)
            predicted[CHUNKED] += price(chunked[b], straggler, size)
            if choice.straggler is None:
                predicted[AUTO_POLICY] += price(ring, latest[i], size)
            else:
                ours = generated_profile(STRAGGLAR, n, choice.chunks)
                predicted[AUTO_POLICY] += price(ours, choice.straggler, size)
        replayed.append(StepReplay(step, late[i], last[i], tuple(choices), predicted))
    return GroupReplay(n, tuple(replayed), episodes, straggler, chunks, tuple(decisions))


def _late(ticks: Sequence[int], per_second: int) -> tuple[float, ...]:
    """Each rank's lateness at one step, from when each arrived (``ticks`` of ``1 / per_second``
    seconds): the probe's rule (:func:`~stragglar.model.policy.latenesses`) on each rank's wait
    for the last, computed exactly in ticks and rounded once (an integer division is rounded
    correctly, as a ``Fraction``'s conversion is), so that the hook's own trace replays to its own
    figures."""
    latest = max(ticks)
    return tuple(x / per_second for x in latenesses([latest - t for t in ticks]))


def _detections(rule: Rule, num_ranks: int, events: Sequence[int | None]) -> list[Detection]:
    """The rule's state after each step, from each step's event rank (the hook's, step by step)."""
    states, state = [], fresh(num_ranks)
    for event in events:
        state = observe_event(rule, state, event)
        states.append(state)
    return states


def _episodes(states: Sequence[Detection], steps: Sequence[int]) -> tuple[Episode, ...]:
    """Each rank the rule named, with the steps (the trace's numbers) it was named over."""
    episodes: list[Episode] = []
    named: int | None = None
    for i, state in enumerate(states):
        if state.named == named:
            continue
        if named is not None:
            episodes[-1] = Episode(named, episodes[-1].since, episodes[-1].named, steps[i])
        named = state.named
        if named is not None:
            assert state.since is not None  # a named rank has evidence that began somewhere
            episodes.append(Episode(named, steps[state.since - 1], steps[i], None))
    return tuple(episodes)


def _straggler(episodes: Sequence[Episode], steps: Sequence[int], last: Sequence[int | None]) -> int:
    """The rank the fixed figures take as late: the one named at the trace's end, else the one
    named at the most steps (the later on a tie), else the one last at the most steps (the lowest
    on a tie), else rank 0 (nobody was ever late)."""
    if episodes and episodes[-1].until is None:
        return episodes[-1].rank
    index = {step: i for i, step in enumerate(steps)}
    named: Counter[int] = Counter()
    for episode in episodes:
        end = len(steps) if episode.until is None else index[episode.until]
        named[episode.rank] += end - index[episode.named]
    if named:
        return max(reversed([e.rank for e in episodes]), key=named.__getitem__)
    times_last = Counter(rank for rank in last if rank is not None)
    return min(times_last, key=lambda rank: (-times_last[rank], rank)) if times_last else 0


class _Prices:
    """One step's prices, each worked out once: the figures share schedules (the auto policy's is
    Ring's or a fixed one's, chunked StragglAR's often the paper's) and buckets their sizes."""

    def __init__(self, seconds: Sequence[float], network: Network) -> None:
        self._seconds, self._network = seconds, network
        self._known: dict[tuple[str, int, int, int], float] = {}

    def __call__(self, prof: Profile, late_rank: int, size: int) -> float:
        """:func:`priced` at this step, with ``late_rank`` as the straggler."""
        key = (prof.algorithm, prof.num_chunks, late_rank, size)
        if key not in self._known:
            self._known[key] = priced(prof, self._seconds, late_rank, size, self._network)
        return self._known[key]


def priced(prof: Profile, seconds: Sequence[float], late_rank: int, size: int, network: Network) -> float:
    """``prof``'s time from the first arrival (``seconds``: each rank's arrival after the first),
    with ``late_rank`` as its straggler: it starts when the others are all in, and the straggler
    arrives ``max(its arrival - theirs, 0)`` later (the model's delay)."""
    others, delay = _wait(seconds, late_rank)
    return others + estimate(prof, size, delay, network).time


def _after_first(ticks: Sequence[int], per_second: int) -> list[float]:
    """Each rank's arrival at one step, seconds after the first rank's (each rounded once)."""
    first = min(ticks)
    return [(t - first) / per_second for t in ticks]


def _wait(seconds: Sequence[float], late_rank: int) -> tuple[float, float]:
    """When every rank but ``late_rank`` is in, and how much later it arrives (0: not later)."""
    others = max([*seconds[:late_rank], *seconds[late_rank + 1 :]])  # in C: a step is priced 12 times
    return others, max(seconds[late_rank] - others, 0.0)
