"""The DDP policy's decisions, without torch: lateness, the fits, the choice, the chunk count, and
the memory it keeps from step to step."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest

from stragglar.errors import ArgumentError, InputError
from stragglar.model import Network, best_chunks, estimate, generated_profile
from stragglar.model.detect import Rule, fresh, observe
from stragglar.model.fits import RUNS, cost_ratio, fit_network, medians, scaled
from stragglar.model.policy import (
    AutoPolicy,
    Choice,
    Outlook,
    choose,
    chunk_count,
    critical_delay_for,
    hidden_for,
    latenesses,
    outlook,
)


def test_lateness_is_the_gap_to_the_latest_other_rank() -> None:
    # rank 2 arrived last, 20 ms after rank 0, the latest of the others; rank 1 was 35 ms early
    waits = [0.020, 0.035, 0.0, 0.021]
    assert [round(x, 6) for x in latenesses(waits)] == [-0.02, -0.035, 0.02, -0.021]
    assert latenesses([0.0, 0.0]) == (0.0, 0.0)  # a tie: nobody is late


def test_the_candidate_is_the_rank_the_rule_names_judged_since_its_evidence_began() -> None:
    # N = 3, false alarms 5%: h = 3.29; a last event adds ln 2.25 = 0.81, a step without one takes
    # ln(0.25 / (2/3)) = -0.98: five events in a row name a rank
    rule = Rule(false_alarm=0.05)
    assert rule.threshold(3) == 3.29
    early = [latenesses([0.0, 0.03, 0.03])] * 6  # steps 1-6: rank 0 last by 30 ms
    late = [latenesses([0.03, 0.0, 0.03]), latenesses([0.05, 0.0, 0.05])] * 4  # steps 7-14: rank 1
    late[3] = latenesses([0.0, 0.02, 0.02])  # ... but rank 0 last at step 10
    state, states = fresh(3), []
    for row in early + late:
        state = observe(rule, state, row)
        states.append(state)
    # rank 0 named at step 5, let go at step 12: h - 3 * 0.98 + 0.81 - 2 * 0.98 < 0; rank 1, at
    # 3 * 0.81 - 0.98 + 2 * 0.81 = 3.07 after step 12, named at step 13
    assert [s.named for s in states] == [None] * 4 + [0] * 7 + [None] + [1] * 2
    assert states[-1].since == 7
    assert outlook(rule, states[3], early, None, None, None) is None  # nobody named yet
    view = outlook(rule, states[-1], early + late, None, None, None)
    # judged over the 8 steps since rank 1's evidence began: last at 7 of them
    assert view is not None and view.candidate == 1 and math.isclose(view.confidence, 7 / 8)
    assert math.isclose(view.lateness, 0.03) and len(view.seen) == 8 and view.seen[3] < 0
    named = outlook(rule, states[-1], early + late, 0, None, None)  # a straggler the user named
    assert named is not None and named.candidate == 0 and math.isclose(named.confidence, 7 / 14)
    assert outlook(rule, states[-1], late[:1], 2, None, None) is None  # never last: no bet


def test_the_bet_weighs_the_saving_by_how_often_the_candidate_was_last() -> None:
    net, size = Network(10e-6, 25e9), 25 * 2**20
    critical = critical_delay_for("stragglar", 16, size, net, net)
    hidden = hidden_for("stragglar", 16, size, net, None)
    assert critical is not None and 2.2 * critical < hidden  # the lateness is hidden whole below
    for d, half_bet in ((1.9 * critical, False), (2.1 * critical, True)):
        always = Outlook(3, d, 1.0, (d,) * 4, net, net)
        half = Outlook(3, d, 0.5, (d, -d, d, -d), net, net)  # last at half the steps: hides d / 2
        hair = Outlook(3, d, 1.0, (d, 1e-9, 1e-9, 1e-9), net, net)  # last at all, 3 of them by a hair
        assert choose("stragglar", 16, size, always) == Choice("stragglar", 3)
        assert (choose("stragglar", 16, size, half) == Choice("stragglar", 3)) is half_bet
        assert choose("stragglar", 16, size, hair) == Choice("allreduce")


def test_the_critical_delay_decides_per_bucket_size() -> None:
    net = Network(1e-4, 1e9)
    small, large = 2**16, 2**26
    critical = critical_delay_for("stragglar", 4, large, net, net)
    assert critical is not None and 0 < critical < 0.1
    at = Outlook(1, critical * 1.1, 1.0, (critical * 1.1,), net, net)
    assert choose("stragglar", 4, large, at) == Choice("stragglar", 1)
    assert choose(
        "stragglar", 4, large, Outlook(1, critical * 0.9, 1.0, (critical * 0.9,), net, net)
    ) == Choice("allreduce")
    assert choose("stragglar", 4, small, at) == Choice("stragglar", 1)  # smaller buckets: lower bar
    assert choose("stragglar", 4, large, None) == Choice("allreduce")  # no figures yet
    assert choose("stragglar", 4, large, Outlook(1, 1.0, 1.0, (1.0,), None, None)) == Choice(
        "allreduce"
    )  # no network
    # StragglAR's own rounds measured twice as slow per byte as the links: it never pays at this size
    assert choose("stragglar", 4, large, Outlook(1, 1.0, 1.0, (1.0,), net, Network(1e-4, 0.5e9))) == Choice(
        "allreduce"
    )
    assert choose("ring", 4, large, Outlook(1, 1.0, 1.0, (1.0,), net, net)) == Choice(
        "allreduce"
    )  # Ring never beats Ring


def test_auto_chunks_follow_the_cost_model_per_bucket_size() -> None:
    nvlink = Network(3e-6, 450 * 2**30)  # the paper's setting: many chunks pay for a large bucket
    cpu = Network(2e-3, 1e9)  # a round costs 2 ms: the paper's N-1 chunks
    for size in (2**20, 2**26, 2**30):
        for net in (nvlink, cpu):
            num_chunks = chunk_count(8, size, 0.005, net, "auto")
            best = best_chunks(8, size, 0.005, net)
            assert num_chunks == (None if best == 7 else best)
    assert chunk_count(8, 2**30, 0.005, nvlink, "auto") == 38  # the model figure
    assert chunk_count(8, 2**20, 0.005, cpu, "auto") is None
    assert chunk_count(8, 2**20, 0.005, None, 16) == 16 and chunk_count(8, 2**20, 0.005, None, 7) is None
    late = Outlook(3, 0.005, 1.0, (0.005,), nvlink, nvlink)
    chosen = choose("stragglar", 8, 2**30, late, "auto")
    assert chosen == Choice("stragglar", 3, 38)
    # the chunked schedule is priced for the critical delay: it pays from a lower lateness than N-1
    paper = critical_delay_for("stragglar", 8, 2**30, nvlink, nvlink)
    chunked = critical_delay_for("stragglar", 8, 2**30, nvlink, nvlink, 38)
    assert paper is not None and chunked is not None and chunked < paper
    assert choose("stragglar", 8, 2**30, Outlook(3, 0.005, 1.0, (0.005,), None, None), "auto") == Choice(
        "allreduce"
    )


def test_auto_chunks_under_the_auto_policy_are_the_fastest_over_the_candidates_record() -> None:
    """The bet's count is the one a brute force over every count, each priced at every step of
    the candidate's record (its lateness there, 0 where another rank was last) and summed, finds
    cheapest: the bet's saving over the Ring is largest with it.  The median lateness when last
    (20 ms here) prices 10 chunks, which cost more over these steps."""
    net = Network(10e-6, 25e9)
    size = 25 * 2**20
    seen = (0.02, 0.0003, 0.021, 0.02, 0.019, 0.0001)  # last at every step, by a hair at two
    chosen = choose("stragglar", 4, size, Outlook(1, 0.02, 1.0, seen, net, net), "auto")

    def total(c: int) -> float:
        prof = generated_profile("stragglar", 4, c)
        return sum(estimate(prof, size, max(d, 0.0), net).time for d in seen)

    every = range(3, 64)
    cheapest = min(total(c) for c in every)
    assert chosen.algorithm == "stragglar" and chosen.chunks is not None
    assert chosen.chunks == min(c for c in every if total(c) <= cheapest * (1 + 1e-12))
    assert best_chunks(4, size, 0.02, net) == 10 and total(10) > cheapest * (1 + 1e-9)


def test_the_cost_ratio_prices_each_timing_at_its_own_chunk_count() -> None:
    net = Network(1e-4, 1e9)
    size = 2**22
    timings = []
    for chunks in (0, 16, 64):  # 0: the paper's N-1
        prof = generated_profile("stragglar", 8, chunks or None)
        timings += [(size, chunks, 1.5 * prof.seconds(prof.exposed, size, net))] * RUNS
    ratio = cost_ratio("stragglar", 8, timings, net)
    assert ratio is not None and math.isclose(ratio, 1.5)
    assert medians(timings) == sorted({(t[0], t[1], t[2]) for t in timings})


def test_fits_recover_the_network_and_ignore_a_slow_first_run() -> None:
    truth = Network(2e-4, 3e8)
    ring = [(size, 0, 6 * truth.alpha + 1.5 * size / truth.bandwidth) for size in (2**16, 2**20, 2**22)]
    firsts = [(2**20, 0, 10.0), (2**25, 0, 10.0)]  # a first run (headers), and DDP's first-step bucket
    fitted = fit_network("ring", 4, firsts + ring * RUNS)
    assert fitted is not None
    assert math.isclose(fitted.alpha, truth.alpha, rel_tol=1e-6)
    assert math.isclose(fitted.bandwidth, truth.bandwidth, rel_tol=1e-6)
    # StragglAR at N = 4 exposes 4 rounds of 1/3 of the buffer each
    ours = [(size, 0, 4 * truth.alpha + 4 / 3 * size / truth.bandwidth) for size in (2**16, 2**22)]
    mine = fit_network("stragglar", 4, ours * RUNS)
    assert mine is not None and math.isclose(mine.bandwidth, truth.bandwidth, rel_tol=1e-6)
    one_size = fit_network("ring", 4, [(2**20, 0, 0.01)] * RUNS)
    assert one_size == Network(0.0, 1.5 * 2**20 / 0.01)  # bandwidth alone
    falling = fit_network("ring", 4, [(2**16, 0, 0.5), (2**22, 0, 0.1)] * RUNS)  # bigger was faster: noise
    assert falling is not None and falling.alpha == 0.0
    assert fit_network("ring", 4, [(0, 0, 1.0), (8, 0, 0.0)] * RUNS) is None
    assert fit_network("ring", 4, ring * (RUNS - 1)) is None  # no size timed often enough yet


def test_stragglar_is_priced_by_its_measured_cost_ratio_whatever_the_load() -> None:
    ring_then = Network(1e-4, 1e9)
    size = 2**22
    prof = generated_profile("stragglar", 4)
    modelled = prof.seconds(prof.exposed, size, ring_then)
    ratio = cost_ratio("stragglar", 4, [(size, 0, 1.6 * modelled)] * RUNS, ring_then)
    assert ratio is not None and math.isclose(ratio, 1.6)
    for load in (0.7, 1.0, 1.5):  # the machine gets faster or slower for both algorithms alike
        ring_now = scaled(ring_then, load)
        slow = Outlook(1, 1.0, 1.0, (1.0,), ring_now, scaled(ring_now, ratio))  # a rank 1 s late
        assert choose("stragglar", 4, size, slow) == Choice("allreduce")  # 1.6x the model: never pays
        assert choose("stragglar", 4, size, Outlook(1, 1.0, 1.0, (1.0,), ring_now, ring_now)) == Choice(
            "stragglar", 1
        )
    assert cost_ratio("stragglar", 4, [(size, 0, modelled)] * (RUNS - 1), ring_then) is None


def test_the_auto_policy_takes_a_new_ratio_only_when_a_new_stragglar_timing_arrives() -> None:
    step = [(-0.01, 0.02, -0.02, -0.03)]  # rank 1 late
    ring = [(4 * 10**6, 0, 6e-3)] * RUNS  # N = 4 at 1 GB/s, alpha 0: exactly the model's price
    slow = [(3 * 10**6, 0, 8e-3)] * RUNS  # StragglAR at twice the model's 4 ms
    policy, rule, none = AutoPolicy("stragglar"), Rule(), fresh(4)
    first = policy.judge(4, step, rule, none, 1, {"allreduce": ring, "stragglar": slow})
    assert first is not None and first.ring == Network(0.0, 1e9)
    assert policy.ratio == 2.0 and policy.priced == slow[-1] and first.ours == scaled(first.ring, 2.0)
    # the Ring gets twice as fast, StragglAR's last timing is the one already taken: the ratio stays
    fast = [(4 * 10**6, 0, 3e-3)] * RUNS
    second = policy.judge(4, step, rule, none, 1, {"allreduce": fast, "stragglar": slow})
    assert second is not None and second.ring == Network(0.0, 2e9) and second.ours == scaled(second.ring, 2.0)
    assert (
        policy.judge(4, step, rule, none, None, {"allreduce": fast, "stragglar": slow}) is None
    )  # nobody named
    assert policy.ring == Network(0.0, 2e9)  # the fit is kept, bet or no bet
    given = AutoPolicy("stragglar", Network(1e-4, 1e9))
    third = given.judge(
        4, [(-0.01, -0.02, -0.02, 0.01)], rule, none, 3, {"allreduce": fast, "stragglar": slow}
    )
    assert third is not None and third.ring == third.ours == Network(1e-4, 1e9)
    assert third.candidate == 3 and given.ratio == 1.0


NET = Network(2e-4, 1e9)
SURE: dict[str, Any] = {
    "candidate": 1,
    "lateness": 0.03,
    "confidence": 1.0,
    "seen": (0.03,) * 4,
    "ring": NET,
    "ours": NET,
}


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        # each was bet on: choose returned Choice('stragglar', straggler=...) with it as the straggler
        ("candidate", -1, InputError, "Outlook.candidate must be at least 0, got -1"),
        ("candidate", None, ArgumentError, "Outlook.candidate must be an integer, got None"),
        ("candidate", 1.5, ArgumentError, "Outlook.candidate must be an integer, got 1.5"),
        ("candidate", True, ArgumentError, "Outlook.candidate must be an integer, got True"),
        # a NaN compared false with the critical delay, so the bet was taken
        ("seen", (math.nan,), InputError, "each of Outlook.seen must be a finite number, got nan"),
        ("seen", (), ArgumentError, "Outlook.seen must be a non-empty sequence"),  # ZeroDivisionError
        ("seen", None, ArgumentError, "Outlook.seen must be a non-empty sequence"),  # not iterable
        ("lateness", None, ArgumentError, "Outlook.lateness must be a number of seconds, got None"),
        ("lateness", math.inf, InputError, "Outlook.lateness must be a finite number, got inf"),
        ("confidence", 0.0, InputError, r"Outlook.confidence must be in \(0, 1\], got 0.0"),
        ("ring", [], ArgumentError, "Outlook.ring must be a Network, got list"),  # unhashable, in the cache
        ("ours", True, ArgumentError, "Outlook.ours must be a Network, got bool"),  # no attribute 'alpha'
    ],
)
def test_an_outlook_no_bet_can_be_taken_on_is_refused(
    field: str, value: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{message}"):
        Outlook(**{**SURE, field: value})


def test_an_outlook_holds_plain_ints_and_a_tuple() -> None:
    import numpy as np

    o = Outlook(**{**SURE, "candidate": np.int64(1), "seen": [0.03, 0.02]})
    assert type(o.candidate) is int and o.seen == (0.03, 0.02)
    assert choose("stragglar", 4, 4 * 2**20, o) == Choice("stragglar", 1)


def test_choose_bets_on_no_rank_outside_the_group() -> None:
    """Rank 5 of 4 GPUs was named the straggler of a StragglAR bucket."""
    far = Outlook(**{**SURE, "candidate": 5})
    with pytest.raises(InputError, match=r"^the outlook's candidate must be a rank in 0..3, got 5$"):
        choose("stragglar", 4, 4 * 2**20, far)
    assert choose("stragglar", 8, 4 * 2**20, far).straggler == 5  # a rank of 8


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: choose("stragglar", 4, -1, None), InputError, "size_bytes must be at least 0, got -1"),
        (
            lambda: choose("stragglar", 4, cast(Any, 1.5), None),
            ArgumentError,
            "size_bytes must be an integer, got 1.5",
        ),
        (
            lambda: choose("stragglar", 4, cast(Any, None), None),
            ArgumentError,
            "size_bytes must be an integer",
        ),
        (
            lambda: choose("stragglar", cast(Any, None), 2**20, None),
            ArgumentError,
            "num_ranks must be an integer",
        ),
        (lambda: choose(cast(Any, ["stragglar"]), 4, 2**20, None), ArgumentError, "algorithm must be a name"),
        (
            lambda: choose("stragglar", 4, 2**20, cast(Any, True)),
            ArgumentError,
            "choose's step must be an Outlook",
        ),
        (
            lambda: chunk_count(8, 2**30, 0.005, cast(Any, True), "auto"),
            ArgumentError,
            "network must be a Network",
        ),
        (
            lambda: chunk_count(8, 2**30, cast(Any, None), NET, "auto"),
            ArgumentError,
            "delay must be a number",
        ),
        (
            lambda: critical_delay_for("stragglar", 4, 2**20, cast(Any, []), NET),
            ArgumentError,
            "ours must be a Network",
        ),
        (
            lambda: critical_delay_for("stragglar", 4, cast(Any, []), NET, NET),
            ArgumentError,
            "size_bytes must be an",
        ),
        (lambda: scaled(NET, 0), InputError, "ratio must be a finite number above 0, got 0"),
        (lambda: scaled(NET, cast(Any, None)), ArgumentError, "ratio must be a number"),
    ],
)
def test_the_policy_refuses_a_wrong_argument_in_one_line(
    call: Any, error: type[Exception], message: str
) -> None:
    """Each was a TypeError, AttributeError or ZeroDivisionError from inside (a list reached the
    caches as "unhashable type"), or (a bucket of -1 or 1.5 bytes) a decision taken on it."""
    with pytest.raises(error, match=message):
        call()


def test_an_empty_bucket_is_left_to_the_engine() -> None:
    assert choose("stragglar", 4, 0, Outlook(**SURE)) == Choice("allreduce")


def test_a_fit_outside_what_the_model_prices_is_no_fit() -> None:
    """Times that did not grow with the size fitted a bandwidth past an exbibyte a second, which the
    Network refuses: the fit is none, as with too few timings, not an error in the middle of a run."""
    flat = [(2**20, 0, 1e-3), (2**26, 0, 1e-3 + 1e-12)] * RUNS  # 1e20 B/s: the bandwidth alone instead
    fitted = fit_network("ring", 4, flat)
    assert fitted is not None and fitted.alpha == 0.0 and fitted.bandwidth < 1e11
    assert fit_network("ring", 4, [(2**20, 0, 1e-300)] * RUNS) is None  # 1e306 B/s


def test_a_measured_ratio_that_scales_a_fit_past_the_model_s_bounds_is_no_network() -> None:
    """A ring fitted near the model's bandwidth bound (1e18 B/s), with StragglAR's rounds measured
    at a third of its price, was scaled to 3e18 B/s: the Network's InputError in the middle of
    training.  The policy then has no network for StragglAR, as with too few timings."""
    ring = [(4 * 10**6, 0, 6e-12)] * RUNS  # N = 4: 6 rounds of a quarter at 1e18 B/s
    ours = [(3 * 10**6, 0, 4e-12 / 3)] * RUNS  # 4 rounds of a third, at a third of their price
    policy = AutoPolicy("stragglar")
    step = policy.judge(
        4, [(-0.01, 0.02, -0.02, -0.03)], Rule(), fresh(4), 1, {"allreduce": ring, "stragglar": ours}
    )
    assert policy.ring is not None and policy.ratio == pytest.approx(1 / 3)
    assert step is not None and step.ring == policy.ring and step.ours is None
    assert choose("stragglar", 4, 2**20, step) == Choice("allreduce")


@pytest.mark.parametrize(
    ("samples", "error", "message"),
    [
        (
            None,
            ArgumentError,
            r"samples must be an iterable of \(bytes, chunks, seconds\) timings, got None$",
        ),
        ("abc", ArgumentError, r"samples must be an iterable .* timings, got 'abc'$"),  # unpacked 'a'
        ([None], ArgumentError, r"each timing must be a \(bytes, chunks, seconds\) tuple, got None$"),
        ([(2**20, 0)], ArgumentError, r"each timing must be a .* tuple, got \(1048576, 0\)$"),
        (
            [(2**20, 0, 1e-3, 9)],
            ArgumentError,
            r"each timing must be a .* tuple, got \(1048576, 0, 0.001, 9\)$",
        ),
        ([{2**20, 0, 1e-3}], ArgumentError, r"each timing must be a .* tuple, got \{"),  # a set's order
        ([("1MiB", 0, 1e-3)], ArgumentError, r"a timing's bytes must be an integer, got '1MiB' \(str\)$"),
        ([(2**20 + 0.5, 0, 1e-3)], ArgumentError, r"a timing's bytes must be an integer, got 1048576.5"),
        ([(-8, 0, 1e-3)], InputError, r"a timing's bytes must be at least 0, got -8$"),
        ([(2**20, -1, 1e-3)], InputError, r"a timing's chunks must be at least 0, got -1$"),
        ([(2**20, 0, None)], ArgumentError, r"a timing's time must be a number of seconds, got None"),
        (
            [(2**20, 0, math.nan)],
            InputError,
            r"a timing's time must be a finite number of seconds >= 0, got nan$",
        ),
        (
            [(2**20, 0, math.inf)],
            InputError,
            r"a timing's time must be a finite number of seconds >= 0, got inf$",
        ),
        (
            [(2**20, 0, -1e-3)],
            InputError,
            r"a timing's time must be a finite number of seconds >= 0, got -0.001$",
        ),
    ],
)
def test_what_is_no_timing_is_refused_in_one_line(samples: Any, error: type[Exception], message: str) -> None:
    """The fits and the cost ratio met these as a TypeError or ValueError from an unpacking or a
    comparison, or took a NaN, infinite or negative time for no timing (an infinite one made a
    cost ratio of inf); each is one line of ours, from every function that reads timings."""
    timings: Any = samples if samples is None or isinstance(samples, str) else samples * RUNS
    for call in (
        lambda: medians(timings),
        lambda: fit_network("ring", 4, timings),
        lambda: cost_ratio("stragglar", 4, timings, NET),
    ):
        with pytest.raises(error, match=f"^{message}"):
            call()


def test_timings_as_the_probe_gathers_them_are_read_as_before() -> None:
    """A deque of tuples of ints and a float, numpy's numbers too; a size or a time of 0 (a slot no
    rank timed) left out, not refused; and a cost ratio needs a network."""
    import collections

    import numpy as np

    gathered = collections.deque([(2**20, 0, 2e-3), (2**20, 0, 0.0), (0, 0, 1.0)] * RUNS, maxlen=16)
    assert medians(gathered) == [(2**20, 0, 2e-3)]
    as_numpy = [(np.int64(2**20), np.int64(0), np.float64(2e-3))] * RUNS
    assert medians(as_numpy) == [(2**20, 0, 2e-3)] and fit_network("ring", 4, as_numpy) == fit_network(
        "ring", 4, gathered
    )
    with pytest.raises(ArgumentError, match=r"^cost_ratio's network must be a Network, got NoneType$"):
        cost_ratio("stragglar", 4, gathered, cast(Any, None))
