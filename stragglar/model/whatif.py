"""Would StragglAR have helped?  A recorded arrival trace replayed through the policy and the model.

Each step of a group gives when each of its N ranks reached the gradient collective.  From it:

* *Who is late.*  A rank's lateness at a step is how much later it arrived than the latest of the
  others (:func:`~stragglar.model.policy.latenesses`, the probe's rule, computed exactly from the
  trace's times).  A *persistent straggler* is what the DDP hook's ``detect=W`` finds: the rank
  last in at least ``share`` of a window of W steps
  (:func:`~stragglar.model.policy.persistent_late_rank`), a new window after each find.
* *What each collective would cost.*  The alpha-beta model (:func:`~stragglar.model.cost.estimate`)
  prices each bucket from the moment the first rank arrived.  A schedule with straggler ``s``
  starts when every other rank is in (``t_p``) and has ``s`` arrive ``max(t_s - t_p, 0)`` later:
  ``t_p + estimate(...).time``.  Ring (the engine's all_reduce) has no straggler: it starts when
  the last rank is in.  Priced: Ring, the paper's StragglAR and chunked StragglAR (``chunks=auto``
  at the straggler's median lateness, :func:`~stragglar.model.policy.chunk_count`), both with the
  group's persistent straggler (else the rank last most often) as straggler, and the ``auto``
  policy.
* *What the auto policy would have chosen.*  Step by step, with the hook's own code
  (:class:`~stragglar.model.policy.AutoPolicy` and :func:`~stragglar.model.policy.choose`) on the
  given network, seeing what the hook's probe would have seen: the figures of step ``s`` from
  step ``s +`` :data:`~stragglar.model.policy.PROBE_LAG` on.

Each bucket is priced as if it alone met the step's arrivals: the savings add up over buckets,
while the times overstate a step whose buckets overlap.  A model, not a measurement.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from stragglar.model.chunks import AUTO
from stragglar.model.cost import Network, Profile, estimate
from stragglar.model.policy import (
    ALLREDUCE,
    AUTO_WINDOW,
    PROBE_LAG,
    SHARE,
    STRAGGLAR,
    AutoPolicy,
    Choice,
    Timing,
    choose,
    chunk_count,
    last_rank,
    latenesses,
    outlook,
    persistent_late_rank,
)
from stragglar.model.predict import generated_profile

__all__ = ["AUTO_POLICY", "CHUNKED", "PRICED", "GroupReplay", "Setting", "StepReplay", "replay"]

RING = "ring"
CHUNKED = "stragglar C=auto"
AUTO_POLICY = "auto"
PRICED = (RING, STRAGGLAR, CHUNKED, AUTO_POLICY)  # the figures priced, in the order shown
Decision = tuple[int, str, int | None, int | None]


@dataclass(frozen=True)
class Setting:
    """What a replay prices on: the ``network``, the buckets of each step (bytes), the window and
    share of the persistent-straggler rule and the auto policy (the hook's ``detect`` and
    ``share``), and the auto policy's ``chunks`` (the hook's: None for the paper's N-1)."""

    network: Network
    buckets: tuple[int, ...]
    window: int = AUTO_WINDOW
    share: float = SHARE
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
class GroupReplay:
    """A group's replay: ``found`` the persistent-straggler rule's finds as (step, rank);
    ``straggler`` the rank the fixed StragglAR figures take as late (the last find, else the rank
    last most often); ``chunks`` chunked StragglAR's count per bucket (None: the paper's N-1);
    ``decisions`` as the hook records them (:attr:`~stragglar.ddp.StragglarState.decisions`)."""

    num_ranks: int
    steps: tuple[StepReplay, ...]
    found: tuple[tuple[int, int], ...]
    straggler: int
    chunks: tuple[int | None, ...]
    decisions: tuple[Decision, ...]

    @property
    def last_share(self) -> float:
        """The share of steps the straggler arrived last."""
        return sum(s.last == self.straggler for s in self.steps) / len(self.steps)

    def lateness(self, quantile: float) -> float:
        """The straggler's lateness behind the latest other rank at that quantile of the steps
        (nearest rank: 0.5 the median, 0.9 the 90th percentile)."""
        values = sorted(s.late[self.straggler] for s in self.steps)
        return values[max(0, math.ceil(quantile * len(values)) - 1)]

    def total(self, algorithm: str) -> float:
        """``algorithm``'s predicted time summed over the steps."""
        return math.fsum(s.predicted[algorithm] for s in self.steps)

    @property
    def stragglar_steps(self) -> int:
        """The steps at which the auto policy chose StragglAR for some bucket."""
        return sum(s.chose_stragglar for s in self.steps)


def replay(times: Sequence[Sequence[Fraction]], steps: Sequence[int], setting: Setting) -> GroupReplay:
    """Replay one group: ``times[i][r]`` is when rank ``r`` reached step ``steps[i]``'s
    collective (seconds, exact; steps in order, at least two ranks)."""
    n = len(times[0])
    late = [_late(row) for row in times]
    last = [last_rank(step) for step in late]
    latest = [max(range(n), key=step.__getitem__) for step in late]  # a tie's first: for Ring's start
    found = _found(last, steps, setting)
    straggler = found[-1][1] if found else _most_often_last(last, late)
    typical = statistics.median(step[straggler] for step in late)
    network = setting.network
    chunks = tuple(chunk_count(n, size, typical, network, AUTO) for size in setting.buckets)
    ring = generated_profile(RING, n)
    if setting.chunks is not None and setting.chunks != AUTO:  # refused now, not at its first use
        generated_profile(STRAGGLAR, n, int(setting.chunks))
    paper = generated_profile(STRAGGLAR, n)
    chunked = [generated_profile(STRAGGLAR, n, c) for c in chunks]
    policy = AutoPolicy(STRAGGLAR, network)
    samples: dict[str, list[Timing]] = {ALLREDUCE: [], STRAGGLAR: []}  # none: the network is given
    outlook = None
    decisions: list[Decision] = []
    previous: Choice | None = None
    replayed = []
    for i, (step, row) in enumerate(zip(steps, times, strict=True)):
        arrived = i - PROBE_LAG + 1  # the steps whose figures the hook's probe has at this step
        if arrived > 0:
            recent = late[max(0, arrived - setting.window) : arrived]  # the probe's window
            outlook = policy.judge(n, recent, setting.window, None, samples)
        first = min(row)
        seconds = [float(t - first) for t in row]
        choices = []
        predicted = dict.fromkeys(PRICED, 0.0)
        for b, size in enumerate(setting.buckets):
            choice = choose(STRAGGLAR, n, size, outlook, setting.chunks)
            if choice != previous:
                previous = choice
                decisions.append((step, choice.algorithm, choice.straggler, choice.chunks))
            choices.append(choice)
            predicted[RING] += _priced(ring, seconds, latest[i], size, network)
            predicted[STRAGGLAR] += _priced(paper, seconds, straggler, size, network)
            predicted[CHUNKED] += _priced(chunked[b], seconds, straggler, size, network)
            if choice.straggler is None:
                predicted[AUTO_POLICY] += _priced(ring, seconds, latest[i], size, network)
            else:
                ours = generated_profile(STRAGGLAR, n, choice.chunks)
                predicted[AUTO_POLICY] += _priced(ours, seconds, choice.straggler, size, network)
        replayed.append(StepReplay(step, late[i], last[i], tuple(choices), predicted))
    return GroupReplay(n, tuple(replayed), found, straggler, chunks, tuple(decisions))


def _late(times: Sequence[Fraction]) -> tuple[float, ...]:
    """Each rank's lateness at one step, from when each arrived: the probe's rule
    (:func:`~stragglar.model.policy.latenesses`) on each rank's wait for the last, computed
    exactly and rounded once, so that the hook's own trace replays to its own figures."""
    latest = max(times)
    return tuple(float(x) for x in latenesses([latest - t for t in times]))


def _most_often_last(last: Sequence[int | None], late: Sequence[Sequence[float]]) -> int:
    """The rank last at the most steps (the lowest on a tie); where nobody ever was, the rank
    the auto policy would expect last over the whole trace (:func:`~stragglar.model.policy.outlook`)."""
    times_last = Counter(rank for rank in last if rank is not None)
    if times_last:
        return min(times_last, key=lambda rank: (-times_last[rank], rank))
    whole = outlook(late, len(late), None, None, None)
    assert whole is not None  # a window of every step is full
    return whole.candidate


def _found(last: Sequence[int | None], steps: Sequence[int], setting: Setting) -> tuple[tuple[int, int], ...]:
    """The persistent stragglers the hook's ``detect`` rule finds, as (step, rank): at each step
    the rule judges the last ranks since its last find, a new window after each."""
    found: list[tuple[int, int]] = []
    since: deque[int | None] = deque(maxlen=setting.window)  # as the probe keeps them
    for step, rank in zip(steps, last, strict=True):
        since.append(rank)
        named = persistent_late_rank(since, setting.window, setting.share)
        if named is not None and (not found or named != found[-1][1]):
            found.append((step, named))
            since.clear()
    return tuple(found)


def _priced(prof: Profile, seconds: Sequence[float], late_rank: int, size: int, network: Network) -> float:
    """``prof``'s time from the first arrival (``seconds``: each rank's arrival after the first),
    with ``late_rank`` as its straggler: it starts when the others are all in, and the straggler
    arrives ``max(its arrival - theirs, 0)`` later (the model's delay)."""
    others = max(t for rank, t in enumerate(seconds) if rank != late_rank)
    return others + estimate(prof, size, max(seconds[late_rank] - others, 0.0), network).time
