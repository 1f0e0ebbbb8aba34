"""The DDP policy's decisions, without torch: lateness, the fits, the choice, the chunk count, and
the memory it keeps from step to step."""

from __future__ import annotations

import math

from stragglar.model import Network, best_chunks, generated_profile
from stragglar.model.detect import Rule, fresh, observe
from stragglar.model.policy import (
    RUNS,
    AutoPolicy,
    Choice,
    Outlook,
    choose,
    chunk_count,
    cost_ratio,
    critical_delay_for,
    fit_network,
    hidden_for,
    latenesses,
    medians,
    outlook,
    scaled,
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
