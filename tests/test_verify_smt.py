"""The z3 checker and the SAT lower bounds: proofs, every kind of violation, counter-examples.

Counter-examples are not taken on trust: each is re-run in plain Python with exact fractions.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction
from typing import cast

import pytest

from stragglar.errors import ResourceError
from stragglar.schedule import Op, Phase, Round, Schedule, Transfer, move_straggler, round_lower_bound
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.synth.ring import ring_reduce_scatter
from stragglar.synth.smt import copy_rounds_status, smt_copy_rounds
from stragglar.verify import VerificationError, Violation, check, prove
from stragglar.verify.bound import phase2_feasible, prove_lower_bound
from stragglar.verify.smt import smt_check, smt_prove

R, C = Op.REDUCE, Op.COPY


def T(src: int, dst: int, chunk: int, op: Op = C) -> Transfer:
    return Transfer(src, dst, chunk, op)


def one_phase(n: int, c: int, *rounds: Round, ranks: Sequence[int] | None = None) -> Schedule:
    members = tuple(range(n)) if ranks is None else tuple(ranks)
    return Schedule("test", n, c, None, (Phase("p", members, rounds),))


SWAP = (T(0, 1, 0, R), T(1, 0, 0, R))


def final_values(s: Schedule, chunk: int, inputs: Sequence[Fraction]) -> list[Fraction]:
    """Run ``chunk`` of ``s`` in plain Python, rank r starting from ``inputs[r]``."""
    values = list(inputs)
    for phase in s.phases:
        for rnd in phase.rounds:
            writes = [
                (t.dst, values[t.src] + (values[t.dst] if t.op is R else 0)) for t in rnd if t.chunk == chunk
            ]
            for dst, value in writes:  # after the whole round has been read: synchronous
                values[dst] = value
    return values


def assert_real_counterexample(s: Schedule, v: Violation) -> None:
    """The model's inputs, run without z3, leave the named rank's chunk wrong by the stated amount."""
    ce = v.counterexample
    assert ce is not None and (ce.rank, ce.chunk) == (v.rank, v.chunk)
    assert len(ce.inputs) == s.num_ranks and ce.expected == sum(ce.inputs)
    ended = final_values(s, ce.chunk, ce.inputs)
    assert ended[ce.rank] == ce.actual != ce.expected
    assert v.message.startswith(f"final state: rank {v.rank} chunk {v.chunk} ")


def sizes(algorithm: str) -> list[int]:
    return [n for n in range(2, 11) if algorithm != "rhd" or n & (n - 1) == 0]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_synthesized_schedule_is_proved(algorithm: str) -> None:
    for n in sizes(algorithm):
        s = synthesize(algorithm, n)
        proof = smt_prove(s)
        assert (proof.num_ranks, proof.num_chunks, proof.num_transfers) == (n, s.num_chunks, s.num_transfers)
        assert proof.summary.startswith(prove(s).summary) and "(z3, " in proof.summary


@pytest.mark.parametrize("straggler", [0, 3, 6])
def test_stragglar_with_any_straggler_is_proved(straggler: int) -> None:
    assert smt_check(move_straggler(synthesize("stragglar", 7), straggler)) is None


def test_several_chunks_to_one_peer_in_one_round_are_allowed() -> None:
    both_ways = tuple(T(s, 1 - s, c, R) for s in (0, 1) for c in range(3))
    assert smt_check(one_phase(2, 3, both_ways)) is None


STRUCTURAL = {
    "send to two peers": (one_phase(3, 2, (T(0, 1, 0), T(0, 2, 1))), "port", 0, 1),
    "receive from two peers": (one_phase(3, 2, (T(0, 2, 0), T(1, 2, 1))), "port", 2, 1),
    "write one value twice": (one_phase(2, 1, (T(0, 1, 0, R), T(0, 1, 0, C))), "double-write", 1, 0),
    "rank outside the phase": (one_phase(3, 1, (T(0, 2, 0),), ranks=(0, 1)), "membership", 2, 0),
    "rank out of range": (one_phase(3, 1, (T(0, 5, 0),)), "range", 5, 0),
    "negative rank": (one_phase(3, 1, (T(-1, 0, 0),)), "range", -1, 0),
    "chunk out of range": (one_phase(3, 2, (T(0, 1, 7),)), "range", 1, 7),
    "send to oneself": (one_phase(3, 1, (T(1, 1, 0),)), "self", 1, 0),
    "unknown op": (one_phase(2, 1, (T(0, 1, 0, cast(Op, "xor")),)), "op", 1, 0),
}


@pytest.mark.parametrize("case", STRUCTURAL)
def test_each_structural_violation_is_named_like_the_simulator_does(case: str) -> None:
    schedule, kind, rank, chunk = STRUCTURAL[case]
    (phase,) = schedule.phases
    delayed = replace(schedule, phases=(Phase("p", phase.ranks, ((), *phase.rounds)),))  # fault in round 1
    v = smt_check(delayed)
    assert isinstance(v, Violation) and v.counterexample is None
    assert (v.kind, v.phase, v.round, v.rank, v.chunk) == (kind, 0, 1, rank, chunk), v.message
    assert v.message.startswith("phase 0 'p' round 1: transfer ")
    assert re.search(rf"\brank {rank}\b", v.message)
    simulated = check(delayed)
    assert simulated is not None and (simulated.kind, simulated.round, simulated.rank) == (kind, 1, rank)


def test_port_conflict_names_both_peers() -> None:
    v = smt_check(one_phase(4, 1, (T(3, 0, 0),), (T(1, 2, 0), T(1, 3, 0))))
    assert v is not None and (v.kind, v.round, v.transfer) == ("port", 1, T(1, 3, 0))
    assert "rank 1 send to a second peer (rank 2)" in v.message


def test_duplicate_contribution_has_a_checked_counterexample() -> None:
    s = one_phase(2, 1, SWAP, SWAP)  # the second swap adds everything again: x + x != x
    v = smt_check(s)
    assert v is not None and v.kind == "duplicate" and "counts ranks [0, 1] more than once" in v.message
    assert (v.phase, v.round, v.transfer) == (0, 1, T(1, 0, 0, R))  # the last write of rank 0 chunk 0
    assert_real_counterexample(s, v)


def test_missing_contribution_never_written_has_a_checked_counterexample() -> None:
    s = one_phase(3, 2, (T(0, 1, 0, R), T(1, 2, 1, R)), (T(1, 2, 0), T(2, 0, 1)))
    v = smt_check(s)
    assert v is not None and (v.kind, v.rank, v.chunk) == ("missing", 0, 0)
    assert (v.phase, v.round, v.transfer) == (None, None, None) and v.message.endswith("(never written)")
    assert "lacks ranks [1, 2]" in v.message
    assert_real_counterexample(s, v)


def test_a_value_lacking_and_doubling_is_reported_as_a_duplicate() -> None:
    s = one_phase(3, 1, (T(1, 0, 0, R),), (T(1, 0, 0, R),))  # rank 0 ends with x0 + 2*x1
    v = smt_check(s)
    assert v is not None and (v.kind, v.rank, v.round) == ("duplicate", 0, 1)
    assert "counts ranks [1] more than once and lacks ranks [2]" in v.message
    assert_real_counterexample(s, v)


def test_prove_raises_with_the_violation_and_accepts_only_allreduce() -> None:
    with pytest.raises(VerificationError) as caught:
        smt_prove(one_phase(2, 1, (T(0, 1, 0, R),)))
    violation = caught.value.violation
    assert violation.counterexample is not None and violation.kind == "missing"
    with pytest.raises(ValueError, match="allreduce"):
        smt_check(Schedule("x", 2, 1, None, (), collective="broadcast"))


def test_many_inputs_are_shortened_in_the_message() -> None:
    n = 12
    s = one_phase(n, 1, *[(T(r, r + 1, 0, R),) for r in range(n - 1)])  # only rank 11 gets the sum
    v = smt_check(s)
    assert (
        v is not None
        and v.kind == "missing"
        and "lacks ranks [1, 2, 3, 4, 5, 6, 7, 8, ... (3 more)]" in v.message
    )
    assert_real_counterexample(s, v)


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
    assert check(schedule) is None and smt_check(schedule) is None


@pytest.mark.slow
@pytest.mark.parametrize("n", range(9, 13))
def test_lower_bound_proved_for_larger_n(n: int) -> None:
    assert prove_lower_bound(n).proved


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8])
def test_smt_synthesis_is_optimal_and_proved_by_both_checkers(n: int) -> None:
    s = synthesize("stragglar", n, method="smt")
    assert (s.algorithm, s.straggler, s.num_chunks) == ("stragglar", n - 1, n - 1)
    assert s.exposed_rounds == round_lower_bound(n) == s.metadata["lower_bound"]
    assert s.metadata["method"] == "smt" and [p.name for p in s.phases][-1] == "exchange"
    assert prove(s).num_rounds == smt_prove(s).num_rounds
    assert all(len({t.src for t in rnd}) == len(rnd) for rnd in s.phases[-1].rounds)  # one chunk per sender
    moved = synthesize("stragglar", n, 0, method="smt")
    assert moved.straggler == 0 and check(moved) is None


@pytest.mark.parametrize("n", [3, 4, 6, 7])
def test_smt_synthesis_boundary_unsat_one_round_below_the_bound_and_sat_at_it(n: int) -> None:
    bound = round_lower_bound(n)
    assert (copy_rounds_status(n, bound - 1), copy_rounds_status(n, bound)) == ("unsat", "sat")


def test_timeout_is_reported_not_hidden() -> None:
    assert phase2_feasible(8, round_lower_bound(8) - 1, timeout_s=0.05).status == "unknown"
    with pytest.raises(ResourceError, match=r"z3 did not decide 16 rounds for 14 GPUs within 0\.05 s"):
        smt_copy_rounds(14, round_lower_bound(14), timeout_s=0.05)
    start = time.perf_counter()
    with pytest.raises(ResourceError):
        synthesize("stragglar", 14, method="smt", timeout_s=0.05)
    assert time.perf_counter() - start < 1.0  # wall clock, building the model included


def test_phase2_needs_at_least_two_gpus() -> None:
    with pytest.raises(ValueError, match="need 2 to 24 GPUs"):
        phase2_feasible(1, 3)


# ---------------------------------------------------------------------------- more chunks than N - 1


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
    assert check(s) is None and smt_check(s) is None and s.exposed_steps == bound
    assert prove_lower_bound(3, 60, c).proved


@pytest.mark.proofs
@pytest.mark.parametrize("n", range(2, 9))
def test_the_chunked_bound_for_every_chunk_count_up_to_16(n: int) -> None:
    for c in range(n - 1, 17):
        result = prove_lower_bound(n, 120, c)
        assert result.proved, result.summary
