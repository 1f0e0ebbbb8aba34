"""Which rank is persistently late: one sequential test, with a stated false-alarm rate.

Every decision taken for a user starts from this question: the DDP hook's ``policy="auto"`` and
``detect=``, and ``stragglar whatif``, all ask :func:`observe`.  A rank that is merely last at
some step proves nothing: with N ranks someone is last at every step, and a window of a few steps
names a "persistent" straggler by chance all the time.  So the rule asks how much more often than
chance a rank is last.

*Events.*  At each step the rank last (:func:`~stragglar.model.policy.last_rank`) and later than
every other by more than :attr:`Rule.margin` has a *last event*; the others have none.  If no rank
is persistently late, each rank has one at most a 1/N share of the steps (chance, or less where
nobody is late by the margin).

*The test.*  Each rank keeps a CUSUM score of the log-likelihood ratio of its events between a
rank last at :attr:`Rule.share` of the steps (a persistent straggler) and one last at chance
1/N: ``+ln(share N)`` at a step with its event, ``+ln((1 - share) / (1 - 1/N))`` (negative) at a
step without, never below 0.  A rank is *named* when its score reaches the threshold ``h``
(:meth:`Rule.threshold`).  Where ``share`` is at or below chance the test has nothing to find and
names nobody.

*The false-alarm rate.*  ``h`` is the lowest score (to a hundredth of a nat) at which, while no
rank is last more often than chance, some rank's score is at ``h`` at any given step with
probability at most ``false_alarm``.  It is worked out from the chain the score follows
(:mod:`stragglar.model.threshold`, a proved bound), and never exceeds Ville's
``ln(N / false_alarm)``, which holds for any test of this kind but is about three times too
cautious here.  A name is given (or moved) only at a step with a score at ``h``, so a *false
alarm*, a rank named where none is persistently late, begins at a given step with probability
at most ``false_alarm`` (:data:`FALSE_ALARM`): over S steps at most ``S * false_alarm`` of them
are expected.  Each lasts until the named score falls back to 0 (5 to 11 steps on average at a
1% rate at N = 4 to 64, longer at rarer rates and at N = 2), so the share of steps at which an
innocent rank *is* named is several times the rate (``benchmarks/bench_detect.py`` measures
both).

"More often than chance" is meant step by step: each rank last with probability at most 1/N
whatever happened at the steps before (the chain's assumption).  Lateness that lasts a few steps
without favouring any rank in the long run (a rank slowed for bursts of steps, lateness
correlated from step to step) breaks it: a burst that outlasts :meth:`Rule.fewest_steps` is
named, as often as such bursts come, and the rate bounds nothing then.  For the policy such a
rank is late while it is named, which is what a name is used for.

*Change.*  Scores are capped at ``h``: a named rank that stops being late loses its score at the
rate its events stop, and is no longer named when the score reaches 0 (the straggler went away),
or when another rank's score is at ``h`` while its own is too low to get back there with one
more event (the straggler moved).  Not sooner: two ranks late by turns, each at ``h`` at its own
steps and one event below it between them, would otherwise trade the name at every step.  The
named rank is dated *since* the first step of the evidence that named it: the first last event
after its score was last 0, a step at which it was late.
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from stragglar.args import as_int, as_rank, as_real
from stragglar.errors import ArgumentError, InputError, described
from stragglar.model.threshold import MIN_FALSE_ALARM, lowest_threshold, ville

__all__ = [
    "FALSE_ALARM",
    "MIN_FALSE_ALARM",
    "SHARE",
    "WINDOW",
    "Detection",
    "RankLateness",
    "Rule",
    "event_rank",
    "fresh",
    "group_size",
    "last_and_event",
    "last_rank",
    "observe",
    "observe_event",
    "quantile",
    "recent_lateness",
]

FALSE_ALARM = 1e-4  # the probability that a false alarm (a rank named where none is late) begins at a step
SHARE = 0.75  # the share of steps a persistent straggler is last at, that the test is tuned to find
WINDOW = 24  # recent steps the lateness figures (and the auto policy's confidence) are taken over
MAX_GROUP = 2**20  # ranks a state is made for: far past any process group, and 8 MB of scores
_PLAIN = frozenset((float, int))  # figures' types that are real numbers with no ABC check (not bool)


@dataclass(frozen=True, slots=True)
class Rule:
    """The test's parameters: ``false_alarm`` (per step, in [:data:`MIN_FALSE_ALARM`, 1)),
    ``share`` (in (0, 1); a rank last more often is found sooner, one last less often later or
    never; at or below chance, 1/N, the test names nobody) and ``margin`` (seconds a rank must be
    later than every other for its step to count; 0: any lateness)."""

    false_alarm: float = FALSE_ALARM
    share: float = SHARE
    margin: float = 0.0

    def __post_init__(self) -> None:
        """Refuse parameters the test has no meaning for (one line each).

        >>> Rule(share=1.0)
        Traceback (most recent call last):
        ...
        stragglar.errors.InputError: Rule.share must be in (0, 1), got 1.0

        A false alarm rarer than :data:`MIN_FALSE_ALARM` is refused too: its threshold's
        computation has no bound on its time (and overflows below about 1e-308).
        """
        for name, value in (
            ("false_alarm", self.false_alarm),
            ("share", self.share),
            ("margin", self.margin),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ArgumentError(f"Rule.{name} must be a number, got {described(value)}")
        for name, value in (("false_alarm", self.false_alarm), ("share", self.share)):
            if not 0 < value < 1:
                raise InputError(f"Rule.{name} must be in (0, 1), got {described(value)}")
        if self.false_alarm < MIN_FALSE_ALARM:
            raise InputError(
                f"Rule.false_alarm must be at least {MIN_FALSE_ALARM:g} (the threshold of a rarer "
                f"false alarm takes too long to work out), got {described(self.false_alarm)}"
            )
        if not 0 <= self.margin < math.inf:
            raise InputError(f"Rule.margin must be seconds, 0 or more, got {described(self.margin)}")

    def threshold(self, num_ranks: int) -> float:
        """The score at which a rank is named: the lowest with the stated false-alarm rate at
        ``num_ranks`` ranks (Ville's ``ln(N / false_alarm)`` where the test names nobody anyway).

        >>> Rule(false_alarm=1e-3).threshold(8), round(ville(8, 1e-3), 2)
        (7.76, 8.99)
        """
        if not self.finds(num_ranks):
            return ville(num_ranks, self.false_alarm)
        return lowest_threshold(num_ranks, self.false_alarm, *self.evidence(num_ranks))

    def finds(self, num_ranks: int) -> bool:
        """Whether the test can name anybody among ``num_ranks``: only where :attr:`share` is above
        chance, 1/N (at or below it, being last is no evidence of being persistently late).

        >>> Rule(share=0.2).finds(4), Rule(share=0.2).finds(8)
        (False, True)
        """
        return self.share * group_size(num_ranks) > 1

    def fewest_steps(self, num_ranks: int) -> int | None:
        """The fewest steps after which a rank can be named among ``num_ranks``: last at every one
        of them (None: the test names nobody there).  A shorter trace names nobody whatever it
        holds, which a verdict of "no persistent straggler" must say.

        >>> Rule().fewest_steps(2), Rule().fewest_steps(3), Rule().fewest_steps(8)
        (23, 12, 6)
        """
        if not self.finds(num_ranks):
            return None
        return math.ceil(self.threshold(num_ranks) / self.evidence(num_ranks)[0] - 1e-9)

    def evidence(self, num_ranks: int) -> tuple[float, float]:
        """The score's change at a step with the rank's event and at one without.

        >>> [round(x, 3) for x in Rule(share=0.75).evidence(4)]
        [1.099, -1.099]
        """
        chance = 1 / as_int(num_ranks, "num_ranks", minimum=2)  # 1 rank: ZeroDivisionError below
        return math.log(self.share / chance), math.log((1 - self.share) / (1 - chance))


@dataclass(frozen=True, slots=True)
class Detection:
    """The rule's state after ``steps`` steps: each rank's score, the step each rank's current
    evidence began (None: its score is 0), and the named rank with the step it is dated since
    (both None: no persistent straggler)."""

    scores: tuple[float, ...]
    starts: tuple[int | None, ...]
    named: int | None = None
    since: int | None = None
    steps: int = 0


def group_size(num_ranks: int) -> int:
    """``num_ranks`` as a count of ranks the rule judges: 1 to :data:`MAX_GROUP` (None was a
    TypeError from inside, -1 a math domain error, 10**30 an OverflowError, 2**40 a MemoryError)."""
    n = as_int(num_ranks, "num_ranks", minimum=1)
    if n > MAX_GROUP:
        raise InputError(f"num_ranks must be at most {MAX_GROUP:,}, got {n:,}")
    return n


def fresh(num_ranks: int) -> Detection:
    """The state before any step: no evidence, nobody named."""
    n = group_size(num_ranks)
    return Detection((0.0,) * n, (None,) * n)


def last_rank(late: Sequence[float]) -> int | None:
    """The rank that arrived after every other at one step, from its latenesses; None where two
    or more tie for last (a trace's clock too coarse to tell them apart): nobody was late.

    >>> last_rank([-0.03, 0.01, -0.02]), last_rank([0.0, -0.01, 0.0])
    (1, None)
    """
    check_step_figures(late, "latenesses")
    return _last(late)


def _last(late: Sequence[float]) -> int | None:
    """:func:`last_rank` of figures already checked (numbers, finite, at least one)."""
    figures = late if isinstance(late, (tuple, list)) else list(late)
    latest = figures.index(max(figures))  # the first of the largest, as a max by index is; 4x faster
    return latest if figures[latest] > 0 else None


def check_step_figures(figures: Sequence[float] | Sequence[Fraction], what: str) -> None:
    """Refuses a step's figures that name no last rank: fewer than two ranks (nobody to be later
    than), or a figure that is no finite number (a NaN would make the last depend on its place)."""
    check_numbers(figures, what)
    if len(figures) < 2:
        raise InputError(f"{what} of at least two ranks are needed, got {len(figures)}")
    try:
        finite = all(map(math.isfinite, figures))  # in C: a replay checks every step's figures
    except OverflowError:  # an int past a float's range (a replay's ticks) is finite all the same
        finite = all(type(x) is int or math.isfinite(x) for x in figures)
    if not finite:
        raise InputError(f"{what} must be finite numbers, got {list(figures)}"[:200])


def check_numbers(figures: object, what: str) -> None:
    """Refuses ``figures`` that are not a sequence of real numbers, in one line: None had no
    ``len()``, a string's letters failed in ``math.isfinite``."""
    if isinstance(figures, (str, bytes)) or not hasattr(figures, "__len__"):
        raise ArgumentError(f"{what} must be a sequence of numbers, got {described(figures)}")
    if set(map(type, figures)) <= _PLAIN:  # type: ignore[call-overload]
        return  # the common case, in C: the hook judges every step, a replay every step of a trace
    for x in figures:  # type: ignore[attr-defined]
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise ArgumentError(f"{what} must be numbers, got {described(x)} ({type(x).__name__})")


def event_rank(rule: Rule, late: Sequence[float]) -> int | None:
    """The rank with a last event at one step: last, and later than every other by more than the
    margin (None: nobody)."""
    return last_and_event(rule, late)[1]


def last_and_event(rule: Rule, late: Sequence[float]) -> tuple[int | None, int | None]:
    """A step's :func:`last_rank` and :func:`event_rank` together, its figures checked once: a
    replay needs both at every step of a trace, and :func:`observe_event` takes the event.

    >>> last_and_event(Rule(margin=0.02), [0.01, -0.01]), last_and_event(Rule(), [0.01, -0.01])
    ((0, None), (0, 0))
    """
    last = last_rank(late)
    return last, _event(rule, late, last)


def _event(rule: Rule, late: Sequence[float], last: int | None) -> int | None:
    """The step's event rank, from its last rank (``late``'s :func:`last_rank`)."""
    return last if last is not None and late[last] > rule.margin else None


def observe(rule: Rule, detection: Detection, late: Sequence[float]) -> Detection:
    """The state after one more step, with each rank's lateness ``late`` at it.  Steps are
    counted from 1 (:attr:`Detection.steps`, and the step numbers in ``starts`` and ``since``).

    >>> rule, state = Rule(false_alarm=0.01), fresh(8)  # h = 5.41 (Ville: ln 800 = 6.68); +1.79 an event
    >>> for s in range(1, 7):  # rank 0 last at steps 1-2, rank 7 from step 3
    ...     state = observe(rule, state, [0.0] * 7 + [0.03] if s > 2 else [0.03] + [0.0] * 7)
    ...     print(s, state.named, state.since)
    1 None None
    2 None None
    3 None None
    4 None None
    5 None None
    6 7 3
    """
    _check_state("observe", rule, detection)
    check_numbers(late, "latenesses")
    n = len(late)
    if n != len(detection.scores):
        raise InputError(f"{n} latenesses for a state of {len(detection.scores)} ranks: one a rank")
    if not all(map(math.isfinite, late)):  # a NaN would make last_rank depend on its place
        raise InputError(f"latenesses must be finite numbers, got {list(late)}"[:200])
    # checked: the last found without last_rank's second look (a rank alone, where the test names
    # nobody, has no last to find)
    return _advance(rule, detection, _event(rule, late, _last(late)) if rule.finds(n) else None)


def observe_event(rule: Rule, detection: Detection, event: int | None) -> Detection:
    """:func:`observe` of a step whose figures were already judged: ``event`` its
    :func:`event_rank` (None: nobody's).  A replay finds each step's last rank and event once
    (:func:`last_and_event`) and needs both, where :func:`observe` would check the figures and
    find them again.

    >>> rule, late = Rule(), [0.0, 0.02, -0.01]
    >>> observe_event(rule, fresh(3), event_rank(rule, late)) == observe(rule, fresh(3), late)
    True
    """
    _check_state("observe_event", rule, detection)
    if event is not None:
        as_rank(event, "event", len(detection.scores))
    return _advance(rule, detection, event)


def _check_state(caller: str, rule: object, detection: object) -> None:
    """Refuses arguments in place of the rule and its state, in one line naming ``caller``."""
    if not isinstance(rule, Rule) or not isinstance(detection, Detection):
        raise ArgumentError(
            f"{caller} takes a Rule and a Detection, got {type(rule).__name__} and {type(detection).__name__}"
        )


def _advance(rule: Rule, detection: Detection, event: int | None) -> Detection:
    """The state after one more step at which ``event`` (a rank of the state's, or None) had the
    last event: :func:`observe`'s and :func:`observe_event`'s one test, their arguments checked."""
    n = len(detection.scores)
    step = detection.steps + 1
    if not rule.finds(n):
        return Detection(detection.scores, detection.starts, None, None, step)
    up, down = rule.evidence(n)
    h = rule.threshold(n)
    # a score at 0 without the event stays at 0 (down < 0 where the test finds): most ranks, most
    # steps, passed over in one comprehension, as the hook observes every step
    scores = [
        min(h, max(0.0, score + (up if rank == event else down))) if score or rank == event else 0.0
        for rank, score in enumerate(detection.scores)
    ]
    starts = [
        None if new == 0 else step if start is None else start
        for new, start in zip(scores, detection.starts, strict=True)
    ]
    named, since = detection.named, detection.since
    if named is not None and scores[named] == 0:
        named = since = None  # its events stopped: no persistent straggler any more
    at_threshold = [rank for rank, score in enumerate(scores) if score >= h]
    if at_threshold and (named is None or scores[named] + up < h - _ROUNDING):
        named = min(at_threshold, key=lambda rank: (-scores[rank], rank))
        since = starts[named]
    return Detection(tuple(scores), tuple(starts), named, since, step)


_ROUNDING = 1e-9  # nats: one event below h is back at h, whatever the last bits of ln() say


@dataclass(frozen=True, slots=True)
class RankLateness:
    """One rank's figures over a recent window: the share of its steps at which the rank was last,
    its lateness's median and 90th percentile (seconds, negative where it was early), its score as
    a share of the threshold, and whether the rule names it the persistent straggler."""

    rank: int
    last_share: float
    median: float
    p90: float
    evidence: float
    persistent: bool


def recent_lateness(
    rule: Rule, detection: Detection, recent: Sequence[Sequence[float]]
) -> tuple[RankLateness, ...]:
    """Each rank's :class:`RankLateness` over the rows of ``recent`` (one per step; none: no figures).

    >>> rows = [(-0.03, 0.03), (-0.02, 0.02), (0.01, -0.01)]
    >>> figures = recent_lateness(Rule(), fresh(2), rows)
    >>> [(r.rank, round(r.last_share, 2), r.median, r.persistent) for r in figures]
    [(0, 0.33, -0.02, False), (1, 0.67, 0.02, False)]
    """
    if not recent:
        return ()
    n = len(recent[0])
    h = rule.threshold(n)
    lasts = [last_rank(row) for row in recent]
    return tuple(
        RankLateness(
            rank,
            sum(last == rank for last in lasts) / len(recent),
            statistics.median(row[rank] for row in recent),
            quantile([row[rank] for row in recent], 0.9),
            detection.scores[rank] / h,
            detection.named == rank,
        )
        for rank in range(n)
    )


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile ``q`` of ``values`` (0.5 the median's lower, 0.9 the 90th percentile).

    >>> quantile([3.0, 1.0, 2.0, 4.0], 0.9), quantile([3.0, 1.0, 2.0, 4.0], 0.5)
    (4.0, 2.0)
    """
    check_numbers(values, "quantile's values")
    if len(values) == 0:  # was an IndexError (len: an array has no truth value)
        raise InputError("a quantile of no values is undefined")
    if not 0 <= as_real(q, "q", "shares") <= 1:  # 1.5 was an IndexError, NaN a ValueError
        raise InputError(f"q must be a share from 0 to 1, got {described(q)}")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
