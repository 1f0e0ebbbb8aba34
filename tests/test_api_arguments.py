"""The library's entry points refuse what they cannot use in one line of their own: an
ArgumentError (a TypeError) for a wrong kind of value, an InputError (a ValueError) for a value out
of range, never Python's own AttributeError, TypeError from deep inside, or a NaN result."""

from __future__ import annotations

from typing import Any

import pytest

from stragglar import msccl, mscclpp
from stragglar.errors import ArgumentError, InputError
from stragglar.formats import schedule_json
from stragglar.model import chunked_loads, compare_generated, estimate, profile
from stragglar.model.cost import PAPER_NETWORK
from stragglar.schedule import Schedule
from stragglar.synth import synthesize
from stragglar.verify import prove

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
