"""The size rule of MSCCL++ plans: which buffer sizes the executor accepts, and why not."""

from __future__ import annotations

import json
import re

import pytest

from stragglar.mscclpp import PlanFormatError, SizeRule, size_rule, will_use
from stragglar.mscclpp.sizes import offset_limit
from stragglar.mscclpp.vocabulary import UINT32_LIMIT, UINT64_MAX

RULE = SizeRule(buffer_alignment=16, chunks=7, min_message_size=224, max_message_size=7 << 20)


@pytest.mark.parametrize(
    ("nbytes", "used", "reason"),
    [
        (
            7 << 10,
            True,
            "used: 7168 bytes is a multiple of 112 (16-byte alignment x 7 chunks) within [224, 7340032]",
        ),
        (
            1 << 20,
            False,
            "not used: 1048576 bytes is not a multiple of 112 (16-byte alignment x 7 chunks); nearest "
            "usable: 1048544 or 1048656",
        ),
        (
            50,
            False,
            "not used: 50 bytes is not a multiple of 112 (16-byte alignment x 7 chunks); nearest usable: 224",
        ),
        (112, False, "not used: 112 bytes is below min_message_size 224; nearest usable: 224"),
        (
            224,
            True,
            "used: 224 bytes is a multiple of 112 (16-byte alignment x 7 chunks) within [224, 7340032]",
        ),
        (
            (7 << 20) + 112,
            False,
            "not used: 7340144 bytes is above max_message_size 7340032; nearest usable: 7340032",
        ),
        (0, False, "not used: 0 bytes is not a positive size"),
    ],
)
def test_decisions_and_reasons(nbytes: int, used: bool, reason: str) -> None:
    decision = RULE.decide(nbytes)
    assert (decision.used, decision.reason) == (used, reason)


def test_no_power_of_two_fits_seven_chunks() -> None:
    assert not any(RULE.decide(1 << k).used for k in range(4, 23))


@pytest.mark.parametrize(
    ("alignment", "chunks", "scratch"), [(16, 7, 9), (16, 63, 70), (32, 3, 3), (16, 1, 0)]
)
def test_offset_limit_is_the_largest_size_whose_chunk_ends_fit_32_bits(
    alignment: int, chunks: int, scratch: int
) -> None:
    top = offset_limit(alignment, chunks, scratch)
    span = max(chunks, scratch)
    assert top % (alignment * chunks) == 0
    assert top // chunks * span <= UINT32_LIMIT
    assert (top // chunks + alignment) * span > UINT32_LIMIT


def test_a_size_inside_the_window_that_overflows_offsets_is_refused() -> None:
    rule = SizeRule(16, 7, 112, UINT64_MAX, max_scratch_chunks=14)
    safe = offset_limit(16, 7, 14)
    assert rule.decide(safe).used
    assert rule.decide(safe + 112).reason == (
        f"not used: {safe + 112} bytes overflows the executor's 32-bit chunk offsets (14 chunks of "
        f"{(safe + 112) // 7} bytes); at most {safe}"
    )


def test_rule_from_plan_text_uses_the_executor_defaults() -> None:
    text = json.dumps(
        {"gpus": [{"input_chunks": 4, "scratch_chunks": 2}, {"input_chunks": 4, "scratch_chunks": 6}]}
    )
    assert size_rule(text) == SizeRule(16, 4, 0, UINT64_MAX, 6)
    assert will_use(text, 64 * 1000).used
    assert (
        size_rule(text).describe()
        == "multiples of 64 bytes (16-byte alignment x 4 chunks) from 0 to 2^64-1 bytes"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope", "not JSON: Expecting value at line 1 column 1"),
        ("{}", "not an MSCCL++ execution plan: no 'gpus' list"),
        (
            json.dumps({"gpus": [{"input_chunks": 3}, {"input_chunks": 4}]}),
            "GPUs must agree on a positive input_chunks, got [3, 4]",
        ),
        (
            json.dumps({"buffer_alignment": 0, "gpus": [{"input_chunks": 3}]}),
            "plan: 'buffer_alignment' must be a positive multiple of 16 below 2^32 (a uint32_t; the kernel "
            "addresses chunks in 16-byte vectors), got 0",
        ),
        (
            json.dumps({"min_message_size": -1, "gpus": [{"input_chunks": 3}]}),
            "plan: 'min_message_size' must be an integer from 0 to 2^64-1 (the executor keeps it in 64 "
            "bits), got -1",
        ),
    ],
)
def test_bad_text_is_a_format_error(text: str, message: str) -> None:
    with pytest.raises(PlanFormatError) as info:
        size_rule(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "rule",
    [
        RULE,
        SizeRule(16, 7, 300, 7 << 20),  # the window starts between two multiples
        SizeRule(16, 7, 0, 1000),  # and ends between two
        SizeRule(16, 7, 112, UINT64_MAX, max_scratch_chunks=14),  # the offsets end it
        SizeRule(32, 3, 5000, 5000 + 96),  # one usable size
    ],
)
def test_every_size_suggested_is_one_the_rule_uses(rule: SizeRule) -> None:
    """``show --size`` names the nearest usable sizes: each must be inside the window and below the
    offset limit, not merely the next multiple of the step."""
    span = rule.usable()
    assert span is not None
    low, high = span
    assert rule.decide(low).used and rule.decide(high).used
    assert not rule.decide(low - rule.step).used and not rule.decide(high + rule.step).used
    probes = [1, 50, low - 1, low + 1, high - 1, high + 1, (low + high) // 2 + 1, high + 10**6, 1 << 40]
    for nbytes in probes:
        reason = rule.decide(nbytes).reason
        if "nearest usable: " in reason:
            named = [int(n) for n in reason.split("nearest usable: ")[1].split(" or ")]
            assert named and all(rule.decide(n).used for n in named), (nbytes, reason)


def test_a_window_without_a_usable_size_says_why() -> None:
    assert SizeRule(16, 7, 300, 200).window_problem() == (
        "no buffer size selects the plan: min_message_size 300 > max_message_size 200"
    )
    assert SizeRule(16, 7, 113, 223).usable() is None
    rule = SizeRule(16, 7, 1 << 33, UINT64_MAX, max_scratch_chunks=7)
    assert rule.usable() is None and rule.window_problem() == (
        f"no buffer size selects the plan: every multiple of 112 bytes in [{1 << 33}, {UINT64_MAX}] "
        f"overflows the 32-bit chunk offsets (at most {offset_limit(16, 7, 7)})"
    )
    assert rule.decide(1000).reason.endswith(f"; {rule.window_problem()}")
    assert RULE.window_problem() is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"buffer_alignment": 3}, "'buffer_alignment' must be a positive multiple of 16 below 2^32"),
        ({"buffer_alignment": 24}, "'buffer_alignment' must be a positive multiple of 16 below 2^32"),
        ({"buffer_alignment": 1 << 36}, "'buffer_alignment' must be a positive multiple of 16 below 2^32"),
        ({"max_message_size": 1 << 70}, "'max_message_size' must be an integer from 0 to 2^64-1"),
        ({"min_message_size": 1 << 64}, "'min_message_size' must be an integer from 0 to 2^64-1"),
        ({"max_message_size": 1e9}, "'max_message_size' must be an integer from 0 to 2^64-1"),
        ({"buffer_alignment": True}, "'buffer_alignment' must be an integer from 0 to 2^64-1"),
    ],
)
def test_fields_the_executor_would_misread_are_refused(fields: dict[str, object], message: str) -> None:
    """The executor converts the JSON numbers to uint32_t / size_t, and the kernel divides chunk
    offsets by 16: a value it would read as another, or misaddress, is refused as malformed."""
    with pytest.raises(PlanFormatError, match="^plan: " + re.escape(message)):
        size_rule(json.dumps({**fields, "gpus": [{"input_chunks": 3}]}))
    assert size_rule(json.dumps({"buffer_alignment": 48, "gpus": [{"input_chunks": 3}]})).step == 144
