"""The library's entry points refuse what they cannot use in one line of their own: an
ArgumentError (a TypeError) for a wrong kind of value, an InputError (a ValueError) for a value out
of range, never Python's own AttributeError, TypeError from deep inside, or a NaN result."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, cast

import numpy as np
import pytest

from stragglar import msccl, mscclpp
from stragglar.errors import ArgumentError, InputError
from stragglar.formats import schedule_json
from stragglar.model import (
    AUTO,
    best_chunks,
    chunk_candidates,
    chunked_loads,
    compare,
    compare_generated,
    critical_delay,
    estimate,
    generated_profile,
    profile,
    ranked_chunks,
    resolve_chunks,
    schedule_name,
)
from stragglar.model.cost import PAPER_NETWORK
from stragglar.schedule import Op, Phase, Schedule, Transfer, move_straggler, relabel_ranks, round_lower_bound
from stragglar.synth import (
    Request,
    check_request,
    direct_allreduce,
    generate,
    rhd_allreduce,
    ring_allreduce,
    stragglar_allreduce,
    synthesize,
)
from stragglar.verify import find_violation, prove
from stragglar.verify.smt import smt_find_violation

PROOF = prove(synthesize("stragglar", 4))
PLAN = mscclpp.lower(PROOF)
# the modules as a caller without type checking sees them (mypy refuses these calls, rightly)
JSON: Any = schedule_json
XML: Any = msccl
PLANS: Any = mscclpp


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        # each was an AttributeError or a json/re TypeError from inside
        (
            lambda: JSON.loads(None),
            ArgumentError,
            "a schedule's JSON is its text (str or bytes), got None",
        ),
        (
            lambda: JSON.loads({}),
            ArgumentError,
            "a schedule's JSON is its text (str or bytes), got {}",
        ),
        (
            lambda: JSON.dumps(PROOF),
            ArgumentError,
            "expected a Schedule, got Proof: pass its .schedule",
        ),
        (lambda: XML.prove(None), ArgumentError, "an MSCCL XML source is the file's text (a str)"),
        (lambda: XML.prove(b"<algo/>"), ArgumentError, "an MSCCL XML source is the file's text (a str)"),
        (lambda: PLANS.prove(PLAN), ArgumentError, "the plan's JSON text: pass the MscclppPlan's .text"),
        (lambda: PLANS.describe(5), ArgumentError, "a plan source is the plan's JSON text (a str)"),
        # an infinite delay priced every speed-up as NaN, True was a 1-byte buffer
        (lambda: compare_generated(8, 2**20, float("inf")), InputError, "delay must be a finite number"),
        (
            lambda: compare_generated(8, float("inf"), 1e-3),
            InputError,
            "size must be a finite number of bytes",
        ),
        (
            lambda: estimate(profile(PROOF.schedule), True, 0.0, PAPER_NETWORK),
            ArgumentError,
            "the buffer size must be a number of bytes, got True",
        ),
        (lambda: chunked_loads(8, -1), InputError, "StragglAR needs at least N - 1 = 7 chunks, got -1"),
        (lambda: chunked_loads(0, 8), InputError, "num_ranks must be at least 2, got 0"),
    ],
)
def test_a_wrong_argument_is_one_line_of_ours(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_wrong_kinds_at_the_entry_points_of_synthesis_and_the_model() -> None:
    anything: Any = ["ring"]
    with pytest.raises(ArgumentError, match=r"algorithm must be a name \(a str\), got \['ring'\]"):
        synthesize(anything, 4)
    with pytest.raises(ArgumentError, match="num_ranks must be an integer, got '2'"):
        Schedule("hand", "2", 1, None, ())  # type: ignore[arg-type]
    with pytest.raises(
        InputError, match=r"no estimate for 'rhd' at N = 6 \(priced: stragglar, ring, direct\)"
    ):
        compare_generated(6, 2**20, 0.0).get("rhd")  # was a KeyError


def one_round(*transfers: Any, algorithm: Any = "hand") -> Schedule:
    return Schedule(algorithm, 2, 1, None, (Phase("p", (0, 1), (transfers,)),))


@pytest.mark.parametrize("prover", [find_violation, smt_find_violation], ids=["simulator", "z3"])
@pytest.mark.parametrize(
    ("transfer", "message"),
    [
        # True == 1 and NumPy's integers index lists: the proof passed, and every writer refused the
        # proved schedule afterwards; floats and plain tuples broke the provers themselves
        (Transfer(False, True, 0, Op.REDUCE), "its src must be a Python int, got False (bool)"),
        (
            Transfer(np.int64(0), 1, 0, Op.REDUCE),
            "its src must be a Python int, got np.int64(0) (numpy.int64)",
        ),
        (Transfer(0, cast(int, 1.0), 0, Op.REDUCE), "its dst must be a Python int, got 1.0 (float)"),
        (Transfer(0, 1, cast(int, 0.0), Op.REDUCE), "its chunk must be a Python int, got 0.0 (float)"),
        ((0, 1, 0, Op.REDUCE), "a round holds Transfers, got tuple (0, 1, 0"),
    ],
)
def test_every_prover_refuses_a_transfer_that_is_not_the_irs(
    prover: Any, transfer: Any, message: str
) -> None:
    schedule = one_round(transfer, Transfer(1, 0, 0, Op.REDUCE))
    with pytest.raises(ArgumentError) as info:
        prover(schedule)
    assert str(info.value) == f"phase 0 'p' round 0: {message}" or message in str(info.value)
    assert str(info.value).startswith("phase 0 'p' round 0: ")


@pytest.mark.parametrize("prover", [find_violation, smt_find_violation], ids=["simulator", "z3"])
def test_an_op_given_as_its_name_is_named_as_neither_op(prover: Any) -> None:
    v = prover(one_round(Transfer(0, 1, 0, cast(Op, "reduce")), Transfer(1, 0, 0, Op.REDUCE)))
    assert v is not None and v.kind == "op"
    assert "op 'reduce', which is neither Op.COPY nor Op.REDUCE" in v.message


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (one_round(algorithm=3), "a schedule's algorithm must be a non-empty str, got 3"),
        (
            Schedule("x", 2, 1, None, cast(Any, ("p",))),
            "phase 0: a schedule holds Phases named by a str, got str",
        ),
        (Schedule("x", 2, 1, None, (Phase(cast(str, 3), (0, 1), ()),)), "got a Phase named 3"),
        (Schedule("x", 2, 1, None, (), collective=""), "a schedule's collective must be a non-empty str"),
    ],
)
def test_a_header_no_writer_can_name_is_refused_before_the_proof(schedule: Schedule, message: str) -> None:
    """A schedule named 3 was proved, and then broke the MSCCL lowering with a TypeError."""
    with pytest.raises(ArgumentError, match=re.escape(message)):
        prove(schedule)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: ring_allreduce(cast(int, "4")), ArgumentError, "num_ranks must be an integer, got '4'"),
        (lambda: rhd_allreduce(cast(int, 4.0)), ArgumentError, "num_ranks must be an integer, got 4.0"),
        (lambda: direct_allreduce(-1), InputError, "need 2 to 2048 GPUs, got -1"),  # made a -1-rank schedule
        (lambda: stragglar_allreduce(8, num_chunks=3), InputError, "StragglAR needs at least N - 1 = 7"),
        # a TypeError on '<', and "'float' object has no attribute 'bit_length'"
        (lambda: round_lower_bound(cast(int, None)), ArgumentError, "num_ranks must be an integer, got None"),
        (lambda: round_lower_bound(cast(int, float("nan"))), ArgumentError, "num_ranks must be an integer"),
        (lambda: round_lower_bound(8, cast(int, 1.5)), ArgumentError, "num_chunks must be an integer"),
        (lambda: move_straggler(cast(Schedule, None), 1), ArgumentError, "expected a Schedule, got NoneType"),
        (lambda: relabel_ranks(cast(Schedule, None), [0, 1]), ArgumentError, "expected a Schedule"),
        (
            lambda: relabel_ranks(one_round(Transfer(0, 5, 0)), [1, 0]),
            ArgumentError,
            "schedule 'hand' names a rank outside 0..1",
        ),
        (lambda: msccl.check_request(cast(int, "8"), 7), ArgumentError, "num_ranks must be an integer"),
        (lambda: mscclpp.check_request(8, cast(int, "7")), ArgumentError, "num_chunks must be an integer"),
        (
            lambda: mscclpp.check_request(8, 7, max_threadblocks=0),
            InputError,
            "max_threadblocks must be at least 1, got 0",
        ),
        (
            lambda: generate(Request("stragglar", cast(int, "4"), None, None, "construct")),
            ArgumentError,
            "num_ranks must be an integer, got '4'",
        ),
        (
            lambda: generate(Request("ring", 4, None, 9, "construct")),
            InputError,
            "a chunk count applies to stragglar only, not ring",
        ),
    ],
)
def test_generators_and_relabelling_refuse_in_one_line(
    call: Any, error: type[Exception], message: str
) -> None:
    """Each was Python's own TypeError, AttributeError or IndexError, or (direct with -1 GPUs, a hand-
    made request for Ring in 9 chunks) a schedule nobody asked for."""
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: profile(cast(Any, PROOF)),
            "profile's schedule must be a Schedule, got Proof: pass its .schedule",
        ),
        (
            lambda: estimate(cast(Any, PROOF.schedule), 2**20, 0.0, PAPER_NETWORK),
            "estimate's profile must be a Profile, got Schedule: pass profile(schedule)",
        ),
        (
            lambda: estimate(profile(PROOF.schedule), 2**20, 0.0, cast(Any, None)),
            "network must be a Network, got NoneType",
        ),
        (
            lambda: compare(cast(Any, None), 2**20, 0.0),
            "profiles must be a sequence of Profiles, got NoneType",
        ),
        (lambda: compare([cast(Any, None)], 2**20, 0.0), "each of profiles must be a Profile, got NoneType"),
        (
            lambda: compare_generated(8, 2**20, 0.0, network=cast(Any, 1)),
            "network must be a Network, got int",
        ),
        (lambda: critical_delay(cast(Any, None), cast(Any, None)), "candidate must be an Estimate"),
        (lambda: schedule_name(cast(Any, PROOF)), "must be a Schedule, got Proof: pass its .schedule"),
    ],
)
def test_the_cost_model_takes_its_own_kinds_in_one_line(call: Any, message: str) -> None:
    """Each was an AttributeError from inside ('Schedule' object has no attribute 'hidden')."""
    with pytest.raises(ArgumentError) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_checked_request_is_generated_as_it_is_and_a_changed_one_checked_again() -> None:
    checked = check_request("stragglar", 8)
    assert generate(checked.with_chunks(12)).num_chunks == 12
    with pytest.raises(InputError, match="StragglAR needs at least N - 1 = 7 chunks, got 3"):
        checked.with_chunks(3)
    with pytest.raises(InputError, match="needs at least N - 1 = 7 chunks, got 3"):
        generate(dataclasses.replace(checked, chunks=3))  # its seal does not travel with replace
    with pytest.raises(ArgumentError, match="with_chunks takes a checked request"):
        Request("stragglar", 8, None, None, "construct").with_chunks(8)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        # no count fit under the schedule limits at 2**63 GPUs: best_chunks' ranked[0] was an IndexError
        (lambda: best_chunks(2**63, 2**30, 0.0), InputError, "need 2 to 2048 GPUs, got 9223372036854775808"),
        (lambda: chunk_candidates(4096, 2**30), InputError, "need 2 to 2048 GPUs, got 4096"),
        # each an AttributeError ('NoneType' object has no attribute 'alpha')
        (lambda: best_chunks(8, 2**30, 0.0, cast(Any, None)), ArgumentError, "network must be a Network"),
        (lambda: ranked_chunks(8, 2**30, 0.0, cast(Any, 1.5)), ArgumentError, "network must be a Network"),
        (
            lambda: resolve_chunks(AUTO, 8, 2**30, 0.0, cast(Any, True)),
            ArgumentError,
            "network must be a Network, got bool",
        ),
        # a TypeError of max(None, 0.0)
        (
            lambda: resolve_chunks(AUTO, 8, 2**30, cast(Any, None), PAPER_NETWORK),
            ArgumentError,
            "the straggler delay must be a number of seconds, got None",
        ),
        # a TypeError on '<', numpy's UFuncTypeError, "can only concatenate list"
        (lambda: chunked_loads(2, cast(Any, None)), ArgumentError, "num_chunks must be an integer, got None"),
        (lambda: chunked_loads(2, cast(Any, "3")), ArgumentError, "num_chunks must be an integer, got '3'"),
        (lambda: chunked_loads(2, cast(Any, [])), ArgumentError, "num_chunks must be an integer, got []"),
        (
            lambda: chunked_loads(2, np.array([1.5])),
            ArgumentError,
            "num_chunks must be integers, got an array of float64",
        ),
        # the cache's "unhashable type: 'list'"
        (
            lambda: generated_profile(cast(Any, []), 4),
            ArgumentError,
            "algorithm must be a name (a str), got []",
        ),
        (
            lambda: generated_profile("ring", cast(Any, [])),
            ArgumentError,
            "num_ranks must be an integer, got []",
        ),
        # "'NoneType' object is not iterable", "unhashable type: 'list'"
        (
            lambda: compare_generated(4, 2**20, 0.0, algorithms=cast(Any, None)),
            ArgumentError,
            "algorithms must be a list of names (each a str), got None",
        ),
        (
            lambda: compare_generated(4, 2**20, 0.0, algorithms=cast(Any, [["ring"]])),
            ArgumentError,
            "algorithms must be a list of names (each a str), got [['ring']]",
        ),
    ],
)
def test_the_chunk_choice_and_the_generated_profiles_refuse_in_one_line(
    call: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)


def test_chunked_loads_and_compare_generated_still_take_what_they_took() -> None:
    hidden, moved, exposed, _ = chunked_loads(8, np.array([7, 9], dtype=np.int64))
    assert (hidden, moved.tolist(), exposed.tolist()) == (6, [6, 12], [9, 11])
    assert chunked_loads(8, np.int64(7)) == (6, 6, 9, 9)
    names = [
        e.algorithm for e in compare_generated(4, 2**20, 0.0, algorithms=cast(Any, {"direct"})).estimates
    ]
    assert names == ["ring", "direct"]
