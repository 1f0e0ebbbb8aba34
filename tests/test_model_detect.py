"""The persistent-straggler rule, on cases where the truth is known: its stated false-alarm rate
under chance, how many steps a rank last at every step takes to be named (worked out by hand from
the test's definition), a straggler that moves or goes away, the margin, and the dating of a find."""

from __future__ import annotations

import math
import random
import re
from typing import Any, cast

import pytest

from stragglar.errors import ArgumentError, InputError
from stragglar.model.detect import (
    MAX_GROUP,
    MIN_FALSE_ALARM,
    Detection,
    Rule,
    event_rank,
    fresh,
    last_and_event,
    last_rank,
    observe,
    observe_event,
    quantile,
    recent_lateness,
)
from stragglar.model.policy import latenesses
from stragglar.model.threshold import lowest_threshold, ville


def last_is(rank: int | None, n: int, by: float = 0.03) -> tuple[float, ...]:
    """One step's latenesses with ``rank`` last by ``by`` seconds (None: every rank ties)."""
    if rank is None:
        return (0.0,) * n
    return tuple(by if r == rank else -by for r in range(n))


def run(rule: Rule, steps: list[tuple[float, ...]]) -> list[Detection]:
    states, state = [], fresh(len(steps[0]))
    for step in steps:
        state = observe(rule, state, step)
        states.append(state)
    return states


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_a_rank_last_at_every_step_is_named_after_the_steps_its_evidence_needs(n: int) -> None:
    # by hand: each step with its last event adds ln(share * N) until the score reaches the threshold
    rule = Rule()
    needed = math.ceil(rule.threshold(n) / math.log(rule.share * n))
    states = run(rule, [last_is(n - 1, n)] * (needed + 3))
    assert [s.named for s in states[: needed - 1]] == [None] * (needed - 1)
    assert all(s.named == n - 1 and s.since == 1 for s in states[needed - 1 :])


@pytest.mark.parametrize(("n", "false_alarm"), [(4, 0.02), (8, 0.01), (16, 0.01)])
def test_under_chance_a_rank_is_named_at_no_more_than_the_stated_share_of_steps(
    n: int, false_alarm: float
) -> None:
    """Chance: a random rank is last at each step.  The bound is on the share of steps at which
    some rank's score is at the threshold; a name is then kept until the score falls back to 0,
    which the second bound allows for (a few steps per false alarm)."""
    gen = random.Random(n)
    rule, steps = Rule(false_alarm=false_alarm), 20_000
    states = run(rule, [last_is(gen.randrange(n), n) for _ in range(steps)])
    at_threshold = sum(max(s.scores) >= rule.threshold(n) for s in states)
    assert at_threshold / steps <= false_alarm
    down = rule.evidence(n)[1]
    named = sum(s.named is not None for s in states)
    assert named / steps <= false_alarm * (1 + math.ceil(rule.threshold(n) / -down))


def test_a_straggler_that_moves_is_followed_and_one_that_goes_away_is_let_go() -> None:
    n, rule = 8, Rule(false_alarm=1e-3)
    up, down = rule.evidence(n)
    h = rule.threshold(n)
    first = [last_is(2, n)] * 10
    then = [last_is(5, n)] * 10
    states = run(rule, first + then + [last_is(None, n)] * 12)
    found = math.ceil(h / up)
    assert states[found - 1].named == 2 and states[found - 2].named is None
    # rank 5 reaches h after as many steps, while rank 2 falls from h: the name moves then
    moved = 10 + found
    assert states[moved - 2].named == 2 and states[moved - 1].named == 5 and states[moved - 1].since == 11
    # nobody late from step 21: rank 5's score falls by -down a step from h, and at 0 it is let go
    gone = 20 + math.ceil(h / -down)
    assert states[gone - 2].named == 5 and states[gone - 1].named is None and states[gone - 1].since is None


def test_two_ranks_late_by_turns_keep_one_name_not_trade_it_every_step() -> None:
    """Ranks 1 and 3 last at alternate steps (4x chance at N = 8): each is at h at its own steps
    and one event below between them, and the name moved at every step (48 "moves" in 80 steps,
    a warning logged at each, the auto policy re-betting at each)."""
    n = 8
    states = run(Rule(), [last_is(1 if step % 2 else 3, n) for step in range(1, 101)])
    named = [s.named for s in states]
    first = next(i for i, rank in enumerate(named) if rank is not None)
    assert named[first] in (1, 3) and set(named[first:]) == {named[first]}


def test_false_alarms_begin_at_most_at_the_stated_rate_though_each_lasts() -> None:
    """Under chance (a uniform random rank last at each step, seeded) a name is given or moved at
    no more than ``false_alarm`` of the steps, as proved; once given it is kept until its score
    falls back to 0, so the steps at which some rank is named are several times more."""
    n, steps, rule = 8, 60_000, Rule(false_alarm=0.01)
    draw = random.Random(7)
    state, begun, named = fresh(n), 0, 0
    for _ in range(steps):
        before = state.named
        state = observe(rule, state, last_is(draw.randrange(n), n))
        begun += state.named is not None and state.named != before
        named += state.named is not None
    assert 0 < begun <= rule.false_alarm * steps
    assert named > 3 * rule.false_alarm * steps  # why the claim is of the beginnings


def test_only_a_rank_later_than_the_margin_counts() -> None:
    n = 4
    hair = [last_is(1, n, by=0.0005)] * 40  # last at every step, by half a millisecond
    assert all(s.named is None for s in run(Rule(margin=0.001), hair))
    assert run(Rule(), hair)[-1].named == 1  # no margin: it counts
    assert all(s.named is None for s in run(Rule(), [last_is(None, n)] * 40))  # ties: nobody late


def test_a_find_is_dated_from_the_first_step_of_its_evidence_never_before_it_was_late() -> None:
    n, rule = 8, Rule()
    gen = random.Random(3)
    others = [last_is(gen.randrange(n - 1), n) for _ in range(30)]  # rank 7 never last before step 31
    states = run(rule, others + [last_is(7, n)] * 20)
    named = next(s for s in states if s.named is not None)
    assert named.named == 7 and named.since == 31


def test_the_recent_figures_are_each_ranks_over_the_window() -> None:
    n = 4
    rows = [last_is(3, n, 0.01), last_is(1, n, 0.02), last_is(1, n, 0.04), last_is(1, n, 0.06)]
    states = run(Rule(false_alarm=0.3, share=0.9), rows)
    figures = recent_lateness(Rule(false_alarm=0.3, share=0.9), states[-1], rows)
    assert [f.last_share for f in figures] == [0.0, 0.75, 0.0, 0.25]  # rank 1 named at step 4
    assert figures[1].median == pytest.approx(0.03) and figures[1].p90 == pytest.approx(0.06)
    assert figures[3].median == pytest.approx(-0.03)  # early at three steps of four
    assert [f.persistent for f in figures] == [False, True, False, False] and figures[1].evidence == 1.0
    assert recent_lateness(Rule(), fresh(n), []) == ()


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"false_alarm": 0.0}, InputError, r"Rule.false_alarm must be in \(0, 1\), got 0.0"),
        ({"share": 1.0}, InputError, r"Rule.share must be in \(0, 1\), got 1.0"),
        ({"share": math.nan}, InputError, r"Rule.share must be in \(0, 1\), got nan"),
        ({"margin": -0.001}, InputError, "Rule.margin must be seconds, 0 or more"),
        ({"margin": math.inf}, InputError, "Rule.margin must be seconds, 0 or more"),
        ({"share": True}, ArgumentError, "Rule.share must be a number"),
    ],
)
def test_a_rule_refuses_parameters_the_test_has_no_meaning_for(
    kwargs: dict[str, float], error: type, words: str
) -> None:
    with pytest.raises(error, match=words):
        Rule(**kwargs)


@pytest.mark.parametrize("false_alarm", [1e-13, 1e-300, 2e-308, 5e-324])
def test_a_rule_refuses_a_false_alarm_too_rare_to_work_a_threshold_out_for(false_alarm: float) -> None:
    """Below about 1e-308 the threshold overflowed; at 1e-300 it took half a minute."""
    words = rf"Rule.false_alarm must be at least 1e-12 \(.*\), got {false_alarm}$"
    with pytest.raises(InputError, match=words):
        Rule(false_alarm=false_alarm)


def test_at_the_floor_the_threshold_is_worked_out_and_below_villes() -> None:
    for n in (2, 4, 64):
        h = Rule(false_alarm=MIN_FALSE_ALARM).threshold(n)
        assert 0 < h < ville(n, MIN_FALSE_ALARM)


@pytest.mark.parametrize("false_alarm", [5e-324, 1e-13, 1.0, math.nan])
def test_the_threshold_refuses_a_false_alarm_out_of_its_range(false_alarm: float) -> None:
    """Called directly, it refuses what :class:`Rule` refuses, rather than overflow (5e-324) or
    run without a bound on its time."""
    up, down = Rule().evidence(4)
    with pytest.raises(ValueError, match=r"false_alarm must be in \[1e-12, 1\)"):
        lowest_threshold(4, false_alarm, up, down)


def test_a_share_at_or_below_chance_names_nobody() -> None:
    """Last at 20% of steps is no evidence among 4 ranks (chance: 25%): a rank's score would rise at
    every step it is *not* last, and the ranks never last would be named."""
    rule = Rule(share=0.2)
    assert not rule.finds(4) and rule.finds(8)
    states = run(rule, [last_is(0, 4)] * 400)
    assert all(s.named is None for s in states) and states[-1].scores == (0.0,) * 4
    assert run(rule, [last_is(0, 8)] * 40)[-1].named == 0  # among 8 it is evidence


@pytest.mark.parametrize(
    ("n", "rule"),
    [(2, Rule()), (3, Rule(margin=0.015)), (8, Rule(false_alarm=0.01, margin=0.005)), (3, Rule(share=0.2))],
)
def test_a_step_judged_once_moves_the_rule_as_its_figures_do(n: int, rule: Rule) -> None:
    """A replay finds each step's last rank and event once (:func:`last_and_event`) and hands the
    event to :func:`observe_event`: the same states as :func:`observe` on the figures, step by
    step, on rows with ties for last (nobody's event), lateness within the margin, and a rule
    that names nobody among 3 (share 0.2, below chance)."""
    draw = random.Random(n)
    levels = (-0.02, -0.01, 0.0, 0.005, 0.01, 0.02)  # few values: ties for last at many steps
    by_figures = by_event = fresh(n)
    kinds, named = set(), set()
    for _ in range(400):
        late = [draw.choice(levels) for _ in range(n)]
        if draw.random() < 0.8:  # a persistent straggler, to be named
            late[n - 1] = 0.03
        last, event = last_and_event(rule, late)
        assert (last, event) == (last_rank(late), event_rank(rule, late))
        kinds.add((last is None, event is None))
        by_figures = observe(rule, by_figures, late)
        by_event = observe_event(rule, by_event, event)
        assert by_event == by_figures
        named.add(by_event.named)
    assert {(True, True), (False, False)} <= kinds  # ties and events met
    assert (False, True) in kinds or rule.margin == 0  # a last within the margin met where one is
    assert named == ({None, n - 1} if rule.finds(n) else {None})


def test_a_step_of_another_count_of_ranks_or_not_a_number_is_refused() -> None:
    """A row of 3 latenesses for a state of 4 ranks was read as a step among 3; a NaN made the
    last rank depend on where it stood ([nan, .5, -.1]: nobody; [.5, nan, -.1]: rank 0)."""
    with pytest.raises(InputError, match=r"^3 latenesses for a state of 4 ranks"):
        observe(Rule(), fresh(4), [0.1, -0.1, -0.2])
    for late in ([math.nan, 0.5, -0.1], [0.5, math.nan, -0.1], [math.inf, -1.0, -2.0]):
        with pytest.raises(InputError, match=r"^latenesses must be finite numbers"):
            observe(Rule(), fresh(3), late)


@pytest.mark.parametrize("figures", [[], [0.5], [0.1, math.nan, 0.2], [math.inf, 0.0]])
def test_one_steps_figures_that_name_no_last_rank_are_refused(figures: list[float]) -> None:
    """Fewer than two ranks (max of nothing, an IndexError) and a NaN (the last then depended on
    where it stood) were Python's errors or a wrong answer."""
    with pytest.raises(InputError, match=r"at least two ranks|finite"):
        last_rank(figures)
    with pytest.raises(InputError, match=r"at least two ranks|finite"):
        latenesses(figures)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: quantile([], 0.5), InputError, "a quantile of no values is undefined"),  # IndexError
        (
            lambda: quantile([1.0, 2.0], 1.5),
            InputError,
            "q must be a share from 0 to 1, got 1.5",
        ),  # IndexError
        (lambda: quantile([1.0, 2.0], math.nan), InputError, "q must be a share from 0 to 1, got nan"),
        (
            lambda: quantile(cast(Any, None), 0.5),
            ArgumentError,
            "quantile's values must be a sequence of numbers",
        ),
        (lambda: fresh(cast(Any, None)), ArgumentError, "num_ranks must be an integer, got None"),
        (lambda: fresh(2**40), InputError, f"num_ranks must be at most {MAX_GROUP:,}"),  # MemoryError
        (lambda: fresh(10**30), InputError, "num_ranks must fit in 64 bits"),  # OverflowError
        (lambda: Rule().threshold(-1), InputError, "num_ranks must be at least 1, got -1"),  # domain error
        (
            lambda: Rule().fewest_steps(cast(Any, math.inf)),
            ArgumentError,
            "num_ranks must be an integer, got inf",
        ),
        (lambda: Rule().evidence(1), InputError, "num_ranks must be at least 2, got 1"),  # ZeroDivisionError
        (lambda: ville(-1, 1e-4), InputError, "num_ranks must be at least 1, got -1"),
        (
            lambda: last_rank(cast(Any, None)),
            ArgumentError,
            "latenesses must be a sequence of numbers, got None",
        ),
        (lambda: latenesses(cast(Any, ["a", "b"])), ArgumentError, "waits must be numbers, got 'a' (str)"),
        (lambda: observe(Rule(), fresh(2), cast(Any, None)), ArgumentError, "latenesses must be a sequence"),
        (
            lambda: observe(cast(Any, None), fresh(2), [0.1, 0.0]),
            ArgumentError,
            "observe takes a Rule and a Detection",
        ),
        (lambda: lowest_threshold(4, 1e-4, -1.0, -1.0), InputError, "the score must rise at an event"),
        (lambda: observe_event(Rule(), fresh(2), 2), InputError, "event must be a rank in 0..1, got 2"),
        (lambda: observe_event(Rule(), fresh(2), cast(Any, True)), ArgumentError, "event must be an integer"),
        (
            lambda: observe_event(Rule(), cast(Any, None), None),
            ArgumentError,
            "observe_event takes a Rule and a Detection",
        ),
    ],
)
def test_the_rule_refuses_a_wrong_argument_in_one_line(
    call: Any, error: type[Exception], message: str
) -> None:
    """Each was Python's own TypeError, IndexError, ValueError, OverflowError, ZeroDivisionError or
    MemoryError (a plain ValueError, from lowest_threshold)."""
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_a_quantile_of_an_array_is_taken() -> None:
    import numpy as np

    assert quantile(cast(Any, np.array([3.0, 1.0, 2.0])), 0.5) == 2.0
