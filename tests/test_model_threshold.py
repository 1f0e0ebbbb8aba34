"""The persistent-straggler test's threshold, checked by a computation that shares nothing with
the one that chose it: the score's own chain on its real values (a dictionary from score to
probability, every reachable score kept), not the grid of :mod:`stragglar.model.threshold`.

Under chance the threshold must keep each rank at it with probability at most false_alarm / N at
every step (the stated rate, summed over the ranks), and it must be close to the lowest that does:
half a nat lower, the promise is broken."""

from __future__ import annotations

import collections
import math

import pytest

from stragglar.model.detect import FALSE_ALARM, Rule
from stragglar.model.threshold import GRID, lowest_threshold, ville

STEPS = 400  # steps of the chain: both runs below agree to 1e-9 by then in every case here


def at_threshold(n: int, rule: Rule, h: float, start: float) -> float:
    """The probability that a rank last at chance 1/N has its score at ``h`` after STEPS steps,
    its score started at ``start`` (0: below every step's; ``h``: above)."""
    up, down = rule.evidence(n)
    mass = {start: 1.0}
    for _ in range(STEPS):
        after: collections.defaultdict[float, float] = collections.defaultdict(float)
        for score, p in mass.items():
            after[round(min(h, score + up), 9)] += p / n
            after[round(max(0.0, score + down), 9)] += p * (1 - 1 / n)
        mass = {score: p for score, p in after.items() if p > 1e-15}
    return mass.get(round(h, 9), 0.0)


@pytest.mark.parametrize("n", [3, 4, 8, 16])
@pytest.mark.parametrize("false_alarm", [0.01, 1e-3])
def test_the_threshold_keeps_the_stated_rate_and_half_a_nat_less_would_not(
    n: int, false_alarm: float
) -> None:
    rule = Rule(false_alarm=false_alarm)
    h = rule.threshold(n)
    # from the cap the chance of being at it only falls, towards the steady state: a bound for every step
    assert n * at_threshold(n, rule, h, start=h) <= false_alarm
    # from 0 it only rises: a step at which the lower threshold already breaks the promise
    assert n * at_threshold(n, rule, h - 0.5, start=0.0) > false_alarm


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64, 1024])
def test_the_threshold_is_below_villes_and_on_the_grid(n: int) -> None:
    h = Rule().threshold(n)
    assert h <= ville(n, FALSE_ALARM) - 0.5
    assert math.isclose(h / GRID, round(h / GRID))


def test_a_score_that_cannot_rise_or_fall_has_no_threshold() -> None:
    with pytest.raises(ValueError, match="must rise at an event and fall without one"):
        lowest_threshold(4, 0.01, 0.0, -1.0)
    with pytest.raises(ValueError, match="must rise at an event and fall without one"):
        lowest_threshold(4, 0.01, 1.0, 0.0)
