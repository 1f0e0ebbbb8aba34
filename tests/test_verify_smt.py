"""The z3 checker: proofs, every kind of violation named as the simulator names it, counter-examples.

Counter-examples are not taken on trust: each is re-run in plain Python with exact fractions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction
from typing import cast

import pytest

from stragglar.errors import InputError, ResourceError
from stragglar.schedule import Op, Phase, Round, Schedule, Transfer, move_straggler
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import VerificationError, Violation, find_violation, prove, smt
from stragglar.verify.smt import smt_find_violation, smt_prove

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
    assert smt_find_violation(move_straggler(synthesize("stragglar", 7), straggler)) is None


def test_several_chunks_to_one_peer_in_one_round_are_allowed() -> None:
    both_ways = tuple(T(s, 1 - s, c, R) for s in (0, 1) for c in range(3))
    assert smt_find_violation(one_phase(2, 3, both_ways)) is None


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
    v = smt_find_violation(delayed)
    assert isinstance(v, Violation) and v.counterexample is None
    assert (v.kind, v.phase, v.round, v.rank, v.chunk) == (kind, 0, 1, rank, chunk), v.message
    assert v.message.startswith("phase 0 'p' round 1: transfer ")
    assert re.search(rf"\brank {rank}\b", v.message)
    simulated = find_violation(delayed)
    assert simulated is not None and (simulated.kind, simulated.round, simulated.rank) == (kind, 1, rank)


@pytest.mark.parametrize("at", [0, 5, 14])
def test_the_rules_solved_in_batches_find_a_fault_in_any_batch(
    monkeypatch: pytest.MonkeyPatch, at: int
) -> None:
    """The structural rules go to z3 a batch of rounds at a time (so that Ctrl-C can act between
    them): a fault in the first, a middle or the last batch is found and located like one in a
    schedule solved whole."""
    monkeypatch.setattr(smt, "_PARSED_LINES", 8)  # a batch of one or two rounds
    good = synthesize("stragglar", 8)
    assert smt_find_violation(good) is None
    rounds = [(pi, ri) for pi, phase in enumerate(good.phases) for ri in range(len(phase.rounds))]
    pi, ri = rounds[at]
    phase = good.phases[pi]
    first = phase.rounds[ri][0]
    broken_round = (Transfer(first.src, first.src, first.chunk, first.op), *phase.rounds[ri][1:])
    broken_phase = replace(phase, rounds=(*phase.rounds[:ri], broken_round, *phase.rounds[ri + 1 :]))
    broken = replace(good, phases=tuple(broken_phase if i == pi else p for i, p in enumerate(good.phases)))
    v = smt_find_violation(broken)
    assert v is not None and (v.kind, v.phase, v.round, v.rank) == ("self", pi, ri, first.src), v


def test_port_conflict_names_both_peers() -> None:
    v = smt_find_violation(one_phase(4, 1, (T(3, 0, 0),), (T(1, 2, 0), T(1, 3, 0))))
    assert v is not None and (v.kind, v.round, v.transfer) == ("port", 1, T(1, 3, 0))
    assert "rank 1 send to a second peer (rank 2)" in v.message


def test_duplicate_contribution_has_a_checked_counterexample() -> None:
    s = one_phase(2, 1, SWAP, SWAP)  # the second swap adds everything again: x + x != x
    v = smt_find_violation(s)
    assert v is not None and v.kind == "duplicate" and "counts ranks [0, 1] more than once" in v.message
    assert (v.phase, v.round, v.transfer) == (0, 1, T(1, 0, 0, R))  # the last write of rank 0 chunk 0
    assert_real_counterexample(s, v)


def test_missing_contribution_never_written_has_a_checked_counterexample() -> None:
    s = one_phase(3, 2, (T(0, 1, 0, R), T(1, 2, 1, R)), (T(1, 2, 0), T(2, 0, 1)))
    v = smt_find_violation(s)
    assert v is not None and (v.kind, v.rank, v.chunk) == ("missing", 0, 0)
    assert (v.phase, v.round, v.transfer) == (None, None, None) and v.message.endswith("(never written)")
    assert "lacks ranks [1, 2]" in v.message
    assert_real_counterexample(s, v)


def test_a_value_lacking_and_doubling_is_reported_as_a_duplicate() -> None:
    s = one_phase(3, 1, (T(1, 0, 0, R),), (T(1, 0, 0, R),))  # rank 0 ends with x0 + 2*x1
    v = smt_find_violation(s)
    assert v is not None and (v.kind, v.rank, v.round) == ("duplicate", 0, 1)
    assert "counts ranks [1] more than once and lacks ranks [2]" in v.message
    assert_real_counterexample(s, v)


def test_prove_raises_with_the_violation_and_accepts_only_allreduce() -> None:
    with pytest.raises(VerificationError) as caught:
        smt_prove(one_phase(2, 1, (T(0, 1, 0, R),)))
    violation = caught.value.violation
    assert violation.counterexample is not None and violation.kind == "missing"
    with pytest.raises(ValueError, match="allreduce"):
        smt_find_violation(Schedule("x", 2, 1, None, (), collective="broadcast"))


def test_many_inputs_are_shortened_in_the_message() -> None:
    n = 12
    s = one_phase(n, 1, *[(T(r, r + 1, 0, R),) for r in range(n - 1)])  # only rank 11 gets the sum
    v = smt_find_violation(s)
    assert (
        v is not None
        and v.kind == "missing"
        and "lacks ranks [1, 2, 3, 4, 5, 6, 7, 8, ... (3 more)]" in v.message
    )
    assert_real_counterexample(s, v)


# ---------------------------------------------------------------------------- more chunks than N - 1


def test_a_schedule_past_z3s_reach_is_refused_before_the_solver_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """N = 2048 (8.4 million transfers) ran unbounded; the cap is in transfers, z3's work."""
    schedule = synthesize("stragglar", 8)
    monkeypatch.setattr(smt, "SMT_MAX_TRANSFERS", schedule.num_transfers - 1)
    with pytest.raises(InputError, match=r"^z3 proves schedules of at most 97 transfers .*this one has 98: "):
        smt_find_violation(schedule)
    monkeypatch.setattr(smt, "SMT_MAX_TRANSFERS", schedule.num_transfers)
    assert smt_find_violation(schedule) is None


def test_a_schedule_of_many_ranks_and_chunks_is_refused_however_few_its_transfers() -> None:
    """A 1.3 KB file declaring N = 2048 and 2048 chunks over 18 transfers took z3 140 s and 1.2 GB."""
    small = synthesize("stragglar", 4)
    declared = replace(small, num_ranks=2048, num_chunks=2048)
    with pytest.raises(
        InputError, match=r"^z3 proves schedules of at most 262,144 ranks x chunks .* has 4,194,304"
    ):
        smt_find_violation(declared)


class Ticks:
    """``time.monotonic`` that advances a second at every reading: a proof's clock, made exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_a_proof_past_its_timeout_is_given_up_not_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read once at the start, once before the structure's one batch and once before each chunk:
    with 4 s the third chunk finds the time spent."""
    monkeypatch.setattr("stragglar.verify.smt.time.monotonic", Ticks())
    with pytest.raises(ResourceError, match=r"^z3 did not finish the proof within 4 s \(at chunk 2 of 7\)$"):
        smt_prove(synthesize("stragglar", 8), timeout_s=4.0)
    wrong = one_phase(2, 1, (T(0, 1, 0, R), T(1, 0, 0, R)), (T(0, 1, 0, R), T(1, 0, 0, R)))
    monkeypatch.setattr("stragglar.verify.smt.time.monotonic", Ticks())
    with pytest.raises(ResourceError, match=r"within 2 s \(at chunk 0 of 1\)$"):  # not proved, not refuted
        smt_find_violation(wrong, timeout_s=2.0)
    monkeypatch.setattr("stragglar.verify.smt.time.monotonic", Ticks())
    violation = smt_find_violation(wrong, timeout_s=3.0)
    assert violation is not None and str(violation.kind) == "duplicate"


def test_z3_out_of_time_in_a_query_is_the_same_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query the time left cuts short answers unknown: that is the timeout's error too, and
    without a timeout an unknown structure query is still located, as before."""
    monkeypatch.setattr(smt, "_rounds_hold", lambda solver, batch: None)
    with pytest.raises(ResourceError, match=r"\(in the rounds' structure\)$"):
        smt_find_violation(synthesize("stragglar", 4), timeout_s=60.0)
    with pytest.raises(RuntimeError, match="rejected the rules of the whole schedule but of no prefix"):
        smt_find_violation(synthesize("stragglar", 4))


def test_a_generous_timeout_changes_no_verdict() -> None:
    assert smt_prove(synthesize("stragglar", 8), timeout_s=600.0).by == "z3"
    wrong = one_phase(2, 1, (T(0, 1, 0, R), T(1, 0, 0, R)), (T(0, 1, 0, R), T(1, 0, 0, R)))
    bounded, unbounded = smt_find_violation(wrong, timeout_s=600.0), smt_find_violation(wrong)
    assert bounded is not None and unbounded is not None  # the same fault; z3 may pick another model
    assert (bounded.kind, bounded.rank, bounded.chunk) == (unbounded.kind, unbounded.rank, unbounded.chunk)
    with pytest.raises(InputError, match="timeout_s must be"):
        smt_prove(synthesize("stragglar", 4), timeout_s=0.0)
