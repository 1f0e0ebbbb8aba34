"""The replay of an arrival trace: who is late, what each algorithm would cost, and what the auto
policy would have chosen, step by step, with the hook's own code."""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from fractions import Fraction

import pytest

from stragglar.errors import InputError
from stragglar.model import Network, best_chunks, generated_profile
from stragglar.model.policy import PROBE_LAG
from stragglar.model.whatif import AUTO_POLICY, CHUNKED, Episode, Setting, priced, replay

NET = Network(1e-4, 1e9)  # alpha 100 us, 1 GB/s
SIZE = 12 * 10**6  # a multiple of 3 and 4: whole chunks for N = 4


def trace(rows: list[list[float]]) -> tuple[list[tuple[Fraction, ...]], list[int]]:
    """Times (seconds) per step, as the reader gives them, and steps 1..S."""
    return [tuple(Fraction(t) for t in row) for row in rows], list(range(1, len(rows) + 1))


def test_a_persistent_straggler_is_found_and_the_saving_is_the_models() -> None:
    delay, steps = 0.05, 16
    times, numbers = trace([[100.0 * s, 100.0 * s, 100.0 * s + delay, 100.0 * s] for s in range(steps)])
    result = replay(times, numbers, Setting(NET, (SIZE,)))
    # by hand: N = 4, each step adds ln(0.75 * 4) = 1.10 to rank 2's score, which names it at
    # ln(4 / 1e-4) = 10.6: at step 10, dated from step 1, and still named at the end
    named = math.ceil(math.log(4 / 1e-4) / math.log(3))
    assert result.episodes == (Episode(2, 1, named, None),) and result.persistent_straggler == 2
    assert result.straggler == 2 and result.last_share == 1.0
    assert result.lateness(0.5) == pytest.approx(delay) and result.lateness(0.9) == pytest.approx(delay)
    # By hand, N = 4: a Ring starts when rank 2 is in and runs 6 rounds of a quarter; StragglAR runs
    # 2 rounds of a third while rank 2 is late (hidden), then 4 rounds of a third.
    alpha, beta = NET.alpha, 1 / NET.bandwidth
    ring = delay + 6 * (alpha + SIZE / 4 * beta)
    ours = max(delay, 2 * (alpha + SIZE / 3 * beta)) + 4 * (alpha + SIZE / 3 * beta)
    assert all(s.predicted["ring"] == pytest.approx(ring) for s in result.steps)
    assert all(s.predicted["stragglar"] == pytest.approx(ours) for s in result.steps)
    # auto: the engine until the rule names rank 2, on figures the probe has two steps later
    first = named + PROBE_LAG
    assert result.decisions == ((1, "allreduce", None, None), (first, "stragglar", 2, None))
    assert result.stragglar_steps == steps - first + 1
    saved = result.total("ring") - result.total(AUTO_POLICY)
    assert saved == pytest.approx((steps - first + 1) * (ring - ours))
    assert result.total(CHUNKED) <= result.total("stragglar") + 1e-12  # the model's fastest count


@pytest.mark.parametrize(("n", "steps", "seed"), [(4, 40, 4), (8, 60, 1), (32, 43, 2)])
def test_a_randomly_late_rank_is_no_persistent_straggler_and_auto_stays_on_the_engine(
    n: int, steps: int, seed: int
) -> None:
    """The issue's cases: a random rank 40 ms late at each step (8 ranks, 60 steps; 32, 43)."""
    gen = random.Random(seed)
    rows = []
    for s in range(steps):
        row = [10.0 * s + gen.random() * 1e-3 for _ in range(n)]  # a millisecond of jitter
        row[gen.randrange(n)] += 0.04
        rows.append(row)
    times, numbers = trace(rows)
    result = replay(times, numbers, Setting(NET, (SIZE,)))
    assert result.episodes == () and result.persistent_straggler is None
    assert result.decisions == ((1, "allreduce", None, None),)
    assert result.stragglar_steps == 0
    assert result.total(AUTO_POLICY) == result.total("ring")
    counts = Counter(step.last for step in result.steps)
    assert result.chance == 1 / n and result.times_last == max(counts.values())  # the rank last most often
    assert counts[result.straggler] == result.times_last


def test_a_straggler_after_random_lateness_is_dated_from_its_first_late_step() -> None:
    """Ranks 0-6 late at random for 30 steps, then rank 7 at every step: named, and dated from
    step 31, the first at which it was ever late (the old rule dated such finds steps early)."""
    gen = random.Random(5)
    rows = []
    for s in range(50):
        row = [10.0 * s] * 8
        row[gen.randrange(7) if s < 30 else 7] += 0.04
        rows.append(row)
    times, numbers = trace(rows)
    result = replay(times, numbers, Setting(NET, (SIZE,)))
    (episode,) = result.episodes
    assert episode.rank == 7 and episode.since == 31 and episode.until is None
    assert result.straggler == 7 and result.lateness(0.5) == pytest.approx(0.04)


def test_a_straggler_that_moves_is_two_episodes_and_the_figures_take_the_longer() -> None:
    rows = [[10.0 * s + (0.04 if r == (1 if s < 20 else 3) else 0.0) for r in range(4)] for s in range(60)]
    times, numbers = trace(rows)
    result = replay(times, numbers, Setting(NET, (SIZE,)))
    first, second = result.episodes
    assert (first.rank, first.since, second.rank, second.until) == (1, 1, 3, None)
    assert first.until is not None and 20 < first.until <= second.named  # let go once rank 3 is named
    assert second.since == 21 and result.persistent_straggler == 3 and result.straggler == 3


def test_nobody_late_saves_nothing_and_stragglar_costs_more() -> None:
    times, numbers = trace([[float(s)] * 3 for s in range(10)])
    result = replay(times, numbers, Setting(NET, (SIZE,)))
    assert result.episodes == () and result.stragglar_steps == 0
    assert all(s.last is None for s in result.steps)  # a tie for last: nobody is late
    assert result.times_last == 0 and result.lateness(0.5) is None
    assert all(late == 0.0 for s in result.steps for late in s.late)
    assert result.total("stragglar") > result.total("ring")  # its hidden rounds are not hidden
    assert result.total(AUTO_POLICY) == result.total("ring")


def test_several_buckets_are_priced_each_and_decided_each() -> None:
    delay = 0.05
    times, numbers = trace([[float(s), s + delay, float(s), float(s)] for s in range(8)])
    one = replay(times, numbers, Setting(NET, (SIZE,)))
    two = replay(times, numbers, Setting(NET, (SIZE, 2 * SIZE)))
    big = replay(times, numbers, Setting(NET, (2 * SIZE,)))
    assert two.total("ring") == pytest.approx(one.total("ring") + big.total("ring"))
    assert all(len(s.choices) == 2 for s in two.steps)
    assert two.decisions[0] == (1, "allreduce", None, None)


@pytest.mark.parametrize(
    ("n", "seed", "size", "median_loses"),
    [(4, 1, 25 * 2**20, True), (5, 2, 2**20, False), (8, 3, SIZE, True)],
)
def test_the_chunked_figures_take_the_count_fastest_over_the_whole_trace(
    n: int, seed: int, size: int, median_loses: bool
) -> None:
    """Its count is the one a brute force over every count, each priced at every step, finds
    cheapest in all (the fewest among equals): never more than the paper's N - 1 costs.  Rank 1
    is 20 ms late at 40% of the steps, a few hundred microseconds early or late at the others:
    the count fastest at its median lateness, what the replay took before, costs more in two of
    the three."""
    gen = random.Random(seed)
    rows = []
    for s in range(40):
        row = [0.1 * s + gen.random() * 2e-4 for _ in range(n)]
        row[1] += 0.02 if gen.random() < 0.4 else 0.0
        rows.append(row)
    times, numbers = trace(rows)
    net = Network(10e-6, 25e9)
    result = replay(times, numbers, Setting(net, (size,)))
    assert result.straggler == 1
    seconds = [[float(t - min(row)) for t in row] for row in times]

    def total(c: int) -> float:
        return math.fsum(priced(generated_profile("stragglar", n, c), row, 1, size, net) for row in seconds)

    (chosen,) = result.chunks
    count = n - 1 if chosen is None else chosen
    every = range(n - 1, 4 * count + 8)
    cheapest = min(total(c) for c in every)
    assert result.total(CHUNKED) == pytest.approx(total(count), rel=1e-12)
    assert total(count) == pytest.approx(cheapest, rel=1e-9)
    assert count == min(c for c in every if total(c) <= cheapest * (1 + 1e-9))
    assert result.total(CHUNKED) <= result.total("stragglar")
    when_late = statistics.median(r.late[1] for r in result.steps if r.last == 1)
    assert (total(best_chunks(n, size, when_late, net)) > cheapest * (1 + 1e-9)) == median_loses


def test_a_clock_of_nanoseconds_since_1970_keeps_every_nanosecond() -> None:
    epoch = 1_764_000_000_000_000_000  # ns: past float64's 53 bits
    rows = [[Fraction(epoch + 10**9 * s + r, 10**9) for r in range(3)] for s in range(5)]
    result = replay(rows, list(range(5)), Setting(NET, (SIZE,)))
    assert all(s.late[2] == pytest.approx(1e-9, rel=1e-6) for s in result.steps)
    assert all(s.last == 2 for s in result.steps)


def test_the_fixed_stragglar_figures_take_the_rank_last_most_often_without_a_find() -> None:
    times, numbers = trace([[0.0, 0.01, 0.0], [0.0, 0.0, 0.01], [0.0, 0.01, 0.0]])
    result = replay(times, numbers, Setting(NET, (SIZE,), window=4))
    assert result.episodes == () and result.straggler == 1
    assert math.isclose(result.last_share, 2 / 3)


@pytest.mark.parametrize(
    ("times", "steps", "message"),
    [
        ([], [], "0 rows of times for 0 steps"),
        ([[0, 1]] * 3, [1, 2], "3 rows of times for 2 steps"),
        ([[0]] * 3, [1, 2, 3], "every step needs the same ranks, at least two: got rows of [1] ranks"),
        (
            [[0, 1], [0, 1, 2]],
            [1, 2],
            "every step needs the same ranks, at least two: got rows of [2, 3] ranks",
        ),
        ([[0, 1, 0, 0]] * 3, [3, 2, 1], "steps must be numbered in increasing order"),
        ([[0, 1, 0, 0]] * 3, [1, 1, 2], "steps must be numbered in increasing order"),
    ],
)
def test_a_trace_of_another_shape_is_refused(times: list[list[int]], steps: list[int], message: str) -> None:
    """replay's steps were taken in the order given: steps numbered backwards dated a rank's
    evidence after its naming (named at step 3, since step 12); ragged rows priced a step with the
    ranks it had, and no step or one rank raised an IndexError."""
    rows = [tuple(Fraction(t) for t in row) for row in times]
    with pytest.raises(InputError) as refused:
        replay(rows, steps, Setting(NET, (SIZE,)))
    assert str(refused.value).startswith(message), refused.value
