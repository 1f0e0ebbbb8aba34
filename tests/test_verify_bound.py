"""The SAT lower bounds on StragglAR's rounds after the straggler arrives: unsat one round below
the bound, and a phase 2 that both provers accept at it, for N - 1 chunks and more."""

from __future__ import annotations

import pytest

from stragglar.errors import ArgumentError
from stragglar.schedule import Op, Phase, Round, Schedule, Transfer, round_lower_bound
from stragglar.synth.ring import ring_reduce_scatter
from stragglar.verify import find_violation
from stragglar.verify.bound import phase2_feasible, prove_lower_bound
from stragglar.verify.smt import smt_find_violation


def after_reduce_scatter(n: int, exchange: tuple[Round, ...]) -> Schedule:
    """The bound's phase 2 after the ring ReduceScatter it starts from (straggler n-1)."""
    others = tuple(range(n - 1))
    phases = (Phase("reduce-scatter", others, ring_reduce_scatter(others, others)),) if n > 2 else ()
    return Schedule("stragglar", n, n - 1, n - 1, (*phases, Phase("exchange", tuple(range(n)), exchange)))


@pytest.mark.parametrize("n", range(2, 9))
def test_lower_bound_proved_and_reached_for_small_n(n: int) -> None:
    """The general model: unsat at R*(n) - 1 rounds, and at R*(n) a phase 2 both provers accept."""
    bound = prove_lower_bound(n)
    assert (
        bound.proved and bound.exchange is None and bound.bound == round_lower_bound(n) and bound.seconds >= 0
    )
    assert bound.summary.startswith(f"proved: no phase 2 for {n} GPUs fits in {bound.bound - 1} rounds")
    answer = phase2_feasible(n, round_lower_bound(n))
    assert answer.status == "sat" and answer.exchange is not None
    schedule = after_reduce_scatter(n, answer.exchange)
    assert schedule.exposed_rounds == round_lower_bound(n)
    assert find_violation(schedule) is None and smt_find_violation(schedule) is None


@pytest.mark.slow
@pytest.mark.parametrize("n", range(9, 13))
def test_lower_bound_proved_for_larger_n(n: int) -> None:
    assert prove_lower_bound(n).proved


def test_a_query_out_of_time_is_unknown_not_decided() -> None:
    assert phase2_feasible(8, round_lower_bound(8) - 1, timeout_s=0.05).status == "unknown"


def test_phase2_needs_at_least_two_gpus() -> None:
    with pytest.raises(ValueError, match="need 2 to 24 GPUs"):
        phase2_feasible(1, 3)


def ring_by_owner(n: int, c: int) -> Phase:
    """A ReduceScatter among ranks 0..n-2 leaving chunk k at rank k mod (n-1): the ring over owners,
    each message carrying all the chunks of one owner."""
    late = n - 1
    blocks = [tuple(range(owner, c, late)) for owner in range(late)]
    rounds = tuple(
        tuple(
            Transfer(i, (i + 1) % late, k, Op.REDUCE)
            for i in range(late)
            for k in blocks[(i - 1 - step) % late]
        )
        for step in range(late - 1)
    )
    return Phase("reduce-scatter", tuple(range(late)), rounds)


@pytest.mark.parametrize(("n", "c"), [(4, 8), (6, 12), (8, 16)])
def test_the_chunked_bound_is_proved_in_a_model_that_fixes_no_order(n: int, c: int) -> None:
    result = prove_lower_bound(n, 60, c)
    assert (
        result.proved and result.bound == c + (n - 1).bit_length() - 1 and result.rounds == result.bound - 1
    )
    assert f"so {c} + ceil(log2 {n}) - 1 = {result.bound} is a lower bound" in result.summary


@pytest.mark.parametrize(("n", "c"), [(3, 4), (4, 6), (5, 6)])
def test_both_models_refute_one_round_below_the_chunked_bound(n: int, c: int) -> None:
    """The relaxed model (the straggler's data alone) proves the bound; the model with both parts,
    which it relaxes, must agree."""
    bound = round_lower_bound(n, c)
    assert prove_lower_bound(n, 60, c).model == "the straggler's data"
    assert phase2_feasible(n, bound - 1, 60, c).status == "unsat"


@pytest.mark.parametrize("c", [2, 4, 6])
def test_three_gpus_reach_the_chunked_bound_outside_the_papers_exchange_order(c: int) -> None:
    """The restricted order (chunk k exchanged in round k) needs more rounds at N = 3 for C > 2;
    the general model reaches C + 1, and the schedule it finds is proved by both provers."""
    bound = round_lower_bound(3, c)
    answer = phase2_feasible(3, bound, 60, c)
    assert answer.status == "sat" and answer.exchange is not None
    s = Schedule("stragglar", 3, c, 2, (ring_by_owner(3, c), Phase("exchange", (0, 1, 2), answer.exchange)))
    assert find_violation(s) is None and smt_find_violation(s) is None and s.exposed_steps == bound
    assert prove_lower_bound(3, 60, c).proved


@pytest.mark.proofs
@pytest.mark.parametrize("n", range(2, 9))
def test_the_chunked_bound_for_every_chunk_count_up_to_16(n: int) -> None:
    for c in range(n - 1, 17):
        result = prove_lower_bound(n, 120, c)
        assert result.proved, result.summary


@pytest.mark.parametrize("rounds", [True, 2.0])
def test_a_round_count_that_is_no_integer_is_refused_not_decided(rounds: object) -> None:
    """True named z3's final-state variables apart from the rounds' (has_True_...), so nothing
    tied them and z3 "beat" the bound."""
    with pytest.raises(ArgumentError, match="rounds must be an integer"):
        phase2_feasible(4, rounds)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="rounds must be an integer"):
        prove_lower_bound(4, rounds=rounds)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="num_chunks must be an integer"):
        prove_lower_bound(4, num_chunks=True)
