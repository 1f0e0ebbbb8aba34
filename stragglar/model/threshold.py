"""The persistent-straggler test's threshold: the lowest score whose false-alarm rate is proved.

Ville's inequality gives the test (:mod:`stragglar.model.detect`) a threshold ``ln(N / false_alarm)``
that is always safe, but about three times too cautious: at N = 8 some rank's score sits at that
threshold at a third of the promised share of steps under chance.  At a few nats of evidence a
step, that caution costs a step or two before a real straggler is named, which is the difference
between finding it within 8 steps at N = 8 and not.  So the threshold is worked out instead from
the chain the score itself follows.

*The chain.*  Under chance a rank has its last event at a step with probability at most 1/N,
whatever happened before.  Its score then moves by ``up`` with that probability and by ``down``
(negative) otherwise, kept within ``[0, h]``.  The update is monotone in the score and in the
event, so a rank last with probability exactly 1/N at every step, independently, is the worst
case: coupled on one uniform draw a step, its score is never below that of a rank last less
often.

*On a grid.*  The chain is run on multiples of :data:`GRID` nats with ``up`` rounded up and
``down`` rounded towards 0, so the grid score is never below the real one: the probability that
the grid score is at the cap bounds the probability that the real score reaches ``h``.

*A proved bound, not an estimate.*  Started from 0 (every score's start), the probability that the
score is at the cap grows step by step to the chain's stationary value; started at the cap, it
falls to it.  The two runs are iterated side by side until they settle the question: a threshold
passes when the run from the cap (an upper bound for every step) gives at most ``false_alarm /
N`` per rank, and fails when the run from 0 (a lower bound) already gives more, or when neither
has settled after :data:`MAX_ITERATIONS`.  The lowest passing multiple of the grid is found by
bisection and never exceeds Ville's threshold, which is kept where the grid is too coarse to beat
it.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from stragglar.args import as_int, as_real
from stragglar.errors import InputError, described

if TYPE_CHECKING:  # numpy is imported where a threshold is computed: importing the rule skips it
    import numpy as np

__all__ = ["GRID", "MAX_ITERATIONS", "MIN_FALSE_ALARM", "lowest_threshold", "ville"]

GRID = 0.01  # nats: the grid the score's chain is run on (finer: a threshold closer to exact, slower)
MAX_ITERATIONS = 4000  # steps of the chain before an unsettled threshold counts as failing
_SLACK = 1e-9  # grid steps added before rounding, so float error in ln() never rounds the wrong way

# The rarest false alarm a threshold is worked out for.  The chain's grid has ln(N / false_alarm) /
# GRID points, and bisection runs it up to MAX_ITERATIONS steps at each of their log2, so the cost
# grows with ln(1 / false_alarm), and without a floor there is no bound: at 1e-300 the threshold took
# over 30 s (N = 4, share 0.3), and below about 1e-308 N / false_alarm overflows to infinity.
# Measured at 1e-12 (N 2 to 1024, shares 0.3, 0.75, 0.99): under 0.3 s; at 1e-50 up to 6 s; at
# 1e-100 about 20 s.  (A share just above chance runs every bisection step to MAX_ITERATIONS: about
# 1 s at 1e-12 as at the default 1e-4, which the floor neither causes nor cures.)  Nor does a rarer
# false alarm mean anything: at a step a second, 1e-12 is one false alarm in 30,000 years.
MIN_FALSE_ALARM = 1e-12


def ville(num_ranks: int, false_alarm: float) -> float:
    """Ville's threshold, ``ln(N / false_alarm)``: safe for any evidence per step.

    >>> round(ville(8, 1e-3), 3)
    8.987
    """
    if not 0 < as_real(false_alarm, "false_alarm", "probability") < 1:  # a math domain error
        raise InputError(f"false_alarm must be in (0, 1), got {described(false_alarm)}")
    return math.log(as_int(num_ranks, "num_ranks", minimum=1) / false_alarm)


@functools.lru_cache(maxsize=256)
def lowest_threshold(num_ranks: int, false_alarm: float, up: float, down: float) -> float:
    """The lowest score ``h`` (a multiple of :data:`GRID`, or Ville's threshold) at which some rank
    of ``num_ranks`` reaches ``h`` at a given step with probability at most ``false_alarm`` under
    chance, for a score that moves by ``up`` (> 0) at a step with the rank's event and by ``down``
    (< 0) at one without.

    >>> up, down = math.log(0.75 * 8), math.log(0.25 / (1 - 1 / 8))
    >>> ville(8, 1e-4) - lowest_threshold(8, 1e-4, up, down) > 0.5
    True
    """
    if not (up > 0 > down):
        raise InputError(f"the score must rise at an event and fall without one, got {up}, {down}")
    if not MIN_FALSE_ALARM <= false_alarm < 1:  # below the floor: no bound on the time (NaN too)
        raise InputError(f"false_alarm must be in [{MIN_FALSE_ALARM:g}, 1), got {false_alarm}")
    step_up = math.ceil(up / GRID + _SLACK)
    step_down = math.ceil(down / GRID + _SLACK)  # towards 0: the grid score stays above the real one
    per_rank = false_alarm / num_ranks
    highest = math.ceil(ville(num_ranks, false_alarm) / GRID)
    lo, hi = 0, highest + 1  # lo fails (a score at 0 is "at" a cap of 0), hi stands for Ville's
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _passes(mid, step_up, step_down, 1 / num_ranks, per_rank):
            hi = mid
        else:
            lo = mid
    return ville(num_ranks, false_alarm) if hi > highest else hi * GRID


def _passes(cap: int, step_up: int, step_down: int, chance: float, per_rank: float) -> bool:
    """Whether the grid chain capped at ``cap`` is at the cap with probability at most ``per_rank``
    at every step, settled by the runs from 0 and from the cap (undecided: False)."""
    import numpy as np

    if cap == 0:
        return False
    low = np.zeros(cap + 1)
    high = np.zeros(cap + 1)
    low[0] = high[cap] = 1.0
    for _ in range(MAX_ITERATIONS):
        low, high = _step(low, step_up, step_down, chance), _step(high, step_up, step_down, chance)
        if high[cap] <= per_rank:
            return True
        if low[cap] > per_rank:
            return False
    return False


def _step(mass: np.ndarray, step_up: int, step_down: int, chance: float) -> np.ndarray:
    """The score's distribution one step on: up by ``step_up`` (at most to the cap) with
    probability ``chance``, else down by ``-step_down`` (at least to 0)."""
    import numpy as np

    cap = len(mass) - 1
    after = np.zeros_like(mass)
    rise, fall = mass * chance, mass * (1 - chance)
    if step_up >= cap:
        after[cap] += rise.sum()
    else:
        after[step_up:cap] += rise[: cap - step_up]
        after[cap] += rise[cap - step_up :].sum()
    drop = -step_down
    if drop > cap:
        after[0] += fall.sum()
    else:
        after[0] += fall[: drop + 1].sum()
        after[1 : cap + 1 - drop] += fall[drop + 1 :]
    return after
