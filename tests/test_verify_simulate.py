"""The symbolic simulator on hand-built schedules: proofs, and every kind of violation located."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from stragglar.errors import ArgumentError, InputError
from stragglar.schedule import Op, Phase, Round, Schedule, Transfer
from stragglar.verify import VerificationError, Violation, find_violation, prove
from stragglar.verify.smt import smt_prove

R, C = Op.REDUCE, Op.COPY


def T(src: int, dst: int, chunk: int, op: Op = C) -> Transfer:
    return Transfer(src, dst, chunk, op)


def one_phase(n: int, c: int, *rounds: Round, name: str = "p") -> Schedule:
    return Schedule("test", n, c, None, (Phase(name, tuple(range(n)), rounds),))


# Ring AllReduce over 3 ranks and 3 chunks, written out: after the ReduceScatter
# rank 2 holds chunk 0, rank 0 chunk 1 and rank 1 chunk 2 in full.
RING3 = Schedule(
    "ring",
    3,
    3,
    None,
    (
        Phase("reducescatter", (0, 1, 2), ((T(0, 1, 0, R), T(1, 2, 1, R), T(2, 0, 2, R)),
                                           (T(0, 1, 2, R), T(1, 2, 0, R), T(2, 0, 1, R)))),
        Phase("allgather", (0, 1, 2), ((T(2, 0, 0), T(0, 1, 1), T(1, 2, 2)),
                                       (T(0, 1, 0), T(1, 2, 1), T(2, 0, 2)))),
    ),
)  # fmt: skip


def assert_names(v: Violation, kind: str, phase: int, rnd: int, rank: int, chunk: int) -> None:
    assert (v.kind, v.phase, v.round, v.rank, v.chunk) == (kind, phase, rnd, rank, chunk)
    assert f"phase {phase} " in v.message and f"round {rnd}" in v.message
    assert re.search(rf"\brank {rank}\b", v.message) and re.search(rf"\bchunk {chunk}\b", v.message)
    assert "\n" not in v.message and str(v) == v.message


def test_ring3_written_by_hand_is_proved() -> None:
    proof = prove(RING3)
    assert proof.schedule is RING3 and proof.by == "simulator" and proof.seconds >= 0
    sizes = (proof.num_ranks, proof.num_chunks, proof.num_rounds, proof.exposed_rounds, proof.num_transfers)
    assert sizes == (3, 3, 4, 4, 12)
    assert proof.summary == "proved: allreduce over 3 ranks, 3 chunks, 4 rounds, 12 transfers"


def test_two_rank_exchange_reads_the_state_from_before_the_round() -> None:
    # Sequentially the second reduce would count both contributions twice.
    assert find_violation(one_phase(2, 1, (T(0, 1, 0, R), T(1, 0, 0, R)))) is None


def test_whole_buffer_exchange_may_send_several_chunks_to_one_peer() -> None:
    both_ways = tuple(T(s, 1 - s, c, R) for s in (0, 1) for c in range(4))
    assert prove(one_phase(2, 4, both_ways)).num_transfers == 8


def test_summary_counts_rounds_after_the_straggler() -> None:
    hidden = Phase("reducescatter", (0, 1), ((T(0, 1, 0, R), T(1, 0, 0, R)),))
    exposed = Phase("straggler", (0, 1, 2), ((T(2, 0, 0, R),), (T(0, 1, 0), T(0, 2, 0))))
    schedule = Schedule("stragglar", 3, 1, 2, (hidden, exposed))
    with pytest.raises(VerificationError):  # rank 2 cannot send to both ranks in one round
        prove(schedule)
    exposed = Phase("straggler", (0, 1, 2), ((T(2, 0, 0, R),), (T(0, 1, 0),), (T(1, 2, 0),)))
    summary = prove(Schedule("stragglar", 3, 1, 2, (hidden, exposed))).summary
    assert (
        summary
        == "proved: allreduce over 3 ranks, 1 chunk, 3 rounds after the straggler (4 in all), 5 transfers"
    )


def test_summary_and_headline_count_chunk_steps_alike() -> None:
    """Rounds after the straggler arrives are compared with the bound as chunk-steps (README): a
    round that moves two chunks over one link is two, and verify's summary says so as show's does."""
    both = (T(0, 1, 0, R), T(1, 0, 0, R), T(0, 1, 1, R), T(1, 0, 1, R))
    exchange = Phase("exchange", (0, 1), (both,))
    proof = prove(Schedule("stragglar", 2, 2, 1, (Phase("wait", (0,), ((),)), exchange)))
    counted = "1 round (2 chunk-steps) after the straggler"
    assert f"{counted} (2 in all)," in proof.summary
    assert f"{counted} arrives (lower bound" in proof.headline
    fat = prove(Schedule("stragglar", 2, 2, 1, (exchange,)))
    assert "1 round (2 chunk-steps) after the straggler, 4 transfers" in fat.summary


def test_single_rank_needs_no_transfers() -> None:
    assert prove(Schedule("none", 1, 2, None, ())).num_rounds == 0


def test_prove_raises_with_the_violation() -> None:
    schedule = one_phase(2, 1, (T(0, 1, 0, R),))
    with pytest.raises(VerificationError) as info:
        prove(schedule)
    assert info.value.violation == find_violation(schedule)
    assert str(info.value) == info.value.violation.message


def test_port_rule_limits_each_rank_to_one_send_peer() -> None:
    v = find_violation(one_phase(3, 1, (T(0, 1, 0), T(0, 2, 0))))
    assert v is not None
    assert_names(v, "port", 0, 0, 0, 0)
    assert v.transfer == T(0, 2, 0)


def test_port_rule_limits_each_rank_to_one_receive_peer() -> None:
    v = find_violation(one_phase(3, 2, (T(2, 1, 0, R),), (T(0, 1, 0), T(2, 1, 1))))
    assert v is not None
    assert_names(v, "port", 0, 1, 1, 1)


def test_double_write_in_one_round() -> None:
    v = find_violation(one_phase(2, 2, (T(0, 1, 1), T(0, 1, 1, R))))
    assert v is not None
    assert_names(v, "double-write", 0, 0, 1, 1)


def test_membership_in_phase() -> None:
    phases = (Phase("p", (0, 1), ((T(0, 1, 0, R),),)), Phase("q", (0, 1), ((T(2, 0, 0),),)))
    v = find_violation(Schedule("test", 3, 1, None, phases))
    assert v is not None
    assert_names(v, "membership", 1, 0, 2, 0)
    assert "'q'" in v.message


@pytest.mark.parametrize(
    ("transfer", "rank", "chunk"),
    [(T(0, 5, 1), 5, 1), (T(-1, 0, 1), -1, 1), (T(0, 1, 3), 1, 3), (T(0, 1, -1), 1, -1)],
)
def test_range_of_ranks_and_chunks(transfer: Transfer, rank: int, chunk: int) -> None:
    v = find_violation(one_phase(2, 2, (transfer,)))
    assert v is not None
    assert_names(v, "range", 0, 0, rank, chunk)


def test_send_to_self() -> None:
    v = find_violation(one_phase(2, 1, (T(1, 1, 0, R),)))
    assert v is not None
    assert_names(v, "self", 0, 0, 1, 0)


def test_duplicate_is_reported_where_it_is_created() -> None:
    rounds = ((T(0, 1, 0, R),), (T(1, 2, 0, R),), (T(2, 1, 0, R),), (T(1, 0, 0),))
    v = find_violation(one_phase(3, 1, *rounds, name="exchange"))
    assert v is not None
    assert_names(v, "duplicate", 0, 2, 1, 0)
    assert v.message == (
        "phase 0 'exchange' round 2: transfer 2->1 chunk 0 (reduce) "
        "gives rank 1 contributions of ranks [0, 1] twice in chunk 0; "
        "the doubled value survives in rank 0 chunk 0"
    )


def test_duplicate_overwritten_by_a_copy_is_still_a_correct_allreduce() -> None:
    swap = (T(0, 1, 0, R), T(1, 0, 0, R))
    assert find_violation(one_phase(2, 1, swap, (T(0, 1, 0, R),), (T(0, 1, 0),))) is None
    v = find_violation(one_phase(2, 1, swap, (T(0, 1, 0, R),), (T(1, 0, 0),)))
    assert v is not None
    assert_names(v, "duplicate", 0, 1, 1, 0)
    assert v.message.endswith("survives in rank 0 chunk 0")


def test_structural_violation_of_a_round_comes_before_its_duplicate() -> None:
    v = find_violation(one_phase(3, 1, (T(0, 1, 0, R),), (T(0, 1, 0, R), T(2, 1, 0, R))))
    assert v is not None and v.kind == "port"


def test_missing_names_the_last_write() -> None:
    rounds = ((T(0, 1, 0, R),), (T(1, 2, 0, R),), (T(2, 0, 0),))  # rank 1 keeps a partial sum
    v = find_violation(one_phase(3, 1, rounds[0]))
    assert v is not None
    assert (v.kind, v.rank, v.chunk, v.round, v.transfer) == ("missing", 0, 0, None, None)
    assert v.message == "final state: rank 0 chunk 0 lacks contributions of ranks [1, 2] (never written)"
    v = find_violation(one_phase(3, 1, *rounds, name="exchange"))
    assert v is not None
    assert_names(v, "missing", 0, 0, 1, 0)
    assert v.message.endswith("(last written in phase 0 'exchange' round 0 by 0->1 chunk 0 reduce)")


def test_missing_after_a_copy_overwrote_the_full_sum() -> None:
    rounds = ((T(0, 1, 0, R),), (T(1, 2, 0, R),), (T(2, 0, 0),), (T(1, 0, 0),))
    v = find_violation(one_phase(3, 1, *rounds, name="exchange"))
    assert v is not None
    assert_names(v, "missing", 0, 3, 0, 0)
    assert v.transfer == T(1, 0, 0)
    assert v.message == (
        "final state: rank 0 chunk 0 lacks contribution of rank 2 "
        "(last written in phase 0 'exchange' round 3 by 1->0 chunk 0 copy)"
    )


def test_long_rank_lists_are_shortened() -> None:
    v = find_violation(Schedule("none", 20, 1, None, ()))
    assert v is not None
    assert "lacks contributions of ranks [1, 2, 3, 4, 5, 6, 7, 8, ... (11 more)]" in v.message


def test_only_allreduce_can_be_verified() -> None:
    with pytest.raises(ValueError, match="allreduce"):
        find_violation(Schedule("x", 2, 1, None, (), collective="reducescatter"))


def test_unknown_op() -> None:
    v = find_violation(one_phase(2, 1, (Transfer(0, 1, 0, "add"),)))  # type: ignore[arg-type]
    assert v is not None
    assert_names(v, "op", 0, 0, 1, 0)
    assert "'add'" in v.message


def test_the_former_names_still_find_violations_and_warn() -> None:
    """``check`` and ``smt_check`` were the provers' names for :func:`find_violation`: code
    written against them still runs, and each call says what to use instead."""
    from stragglar import verify
    from stragglar.verify import smt

    wrong = one_phase(2, 1, (Transfer(0, 1, 0, "add"),))  # type: ignore[arg-type]
    with pytest.warns(
        DeprecationWarning,
        match=r"^stragglar\.verify\.check is deprecated: use stragglar\.verify\.find_violation$",
    ):
        assert verify.check(wrong) == find_violation(wrong)
    with pytest.warns(
        DeprecationWarning, match=r"smt_check is deprecated: use stragglar\.verify\.smt\.smt_find_violation$"
    ):
        assert smt.smt_check(wrong) == smt.smt_find_violation(wrong)


@pytest.mark.parametrize("prover", [prove, smt_prove])
@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (Schedule("x", 2, 1, 7, ()), r"^straggler must be a rank in 0\.\.1, got 7$"),
        (Schedule("x", 0, 1, None, ()), r"^num_ranks must be at least 1, got 0$"),
        (Schedule("x", 2, 0, None, ()), r"^num_chunks must be at least 1, got 0$"),
        (
            Schedule("x", 2, 1, None, (Phase("p", (0, 5), ()),)),
            r"^phase 0 'p': a rank must be a rank in 0\.\.1",
        ),
        (Schedule("x", 2, 1, None, (Phase("p", (1, 1), ()),)), r"^phase 0 'p' lists a rank twice: \[1, 1\]$"),
    ],
)
def test_both_provers_refuse_a_header_that_makes_no_sense(
    prover: Callable[[Schedule], object], schedule: Schedule, message: str
) -> None:
    """A schedule made in Python with a straggler of 7 out of 2 ranks was proved, and a run then
    blamed a ``late_rank`` the user never passed."""
    with pytest.raises(InputError, match=message):
        prover(schedule)
    with pytest.raises(ArgumentError, match=r"^expected a Schedule, got NoneType$"):
        prover(None)  # type: ignore[arg-type]
