"""The Python API checks its arguments in its own terms (:mod:`stragglar.args`), in every entry point."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from stragglar.args import MAX_DELAY, MAX_TIMEOUT, as_seconds
from stragglar.errors import InputError
from stragglar.measure.launch import launch
from stragglar.measure.run import run_benchmark
from stragglar.model.detect import Rule
from stragglar.runtime import ArgumentError, allreduce, allreduce_local, plan_for
from stragglar.synth import synthesize
from stragglar.verify import prove

PROOF = prove(synthesize("stragglar", 4))
BUFS = [np.arange(6, dtype=np.int64) * (r + 1) for r in range(4)]


def fresh() -> list[np.ndarray]:
    return [b.copy() for b in BUFS]


CALLS: list[tuple[str, Callable[[Any], object], str]] = [
    ("plan_for rank", lambda v: plan_for(PROOF, v, 10), "rank"),
    ("plan_for count", lambda v: plan_for(PROOF, 0, v), "count"),
    ("plan_for tag_base", lambda v: plan_for(PROOF, 0, 10, v), "tag_base"),
    ("allreduce_local late_rank", lambda v: allreduce_local(fresh(), PROOF, late_rank=v), "late_rank"),
    ("allreduce tag", lambda v: allreduce(np.zeros(3), PROOF, tag=v), "tag"),
    ("run_benchmark straggler", lambda v: run_benchmark("local", 4, 64, straggler=v, iters=1), "straggler"),
    ("run_benchmark num_ranks", lambda v: run_benchmark("local", v, 64, iters=1), "num_ranks"),
    ("run_benchmark iters", lambda v: run_benchmark("local", 4, 64, iters=v), "iters"),
]


@pytest.mark.parametrize("bad", [1.5, True, "3", None])
@pytest.mark.parametrize(("what", "call", "name"), CALLS, ids=[c[0] for c in CALLS])
def test_integers_refuse_floats_bools_and_strings_naming_the_argument(
    what: str, call: Callable[[Any], object], name: str, bad: object
) -> None:
    if bad is None and name in ("late_rank", "straggler"):
        return  # None is their default: no late rank asked for
    with pytest.raises(ArgumentError) as info:
        call(bad)
    message = str(info.value)
    assert isinstance(info.value, TypeError) and isinstance(info.value, InputError)
    assert message.startswith(f"{name} must be an integer, got {bad!r}"), message
    assert "--" not in message  # API terms, never the command line's options


def test_numpy_integers_are_fine_integers() -> None:
    plan = plan_for(PROOF, np.int64(3), np.int32(10), np.uint8(4))
    assert plan.rank == 3 and plan.layout.count == 10
    bufs = fresh()
    timelines = allreduce_local(bufs, PROOF, np.float32(0.0), late_rank=np.int16(1))
    assert all(np.array_equal(b, np.arange(6) * 10) for b in bufs) and len(timelines) == 4
    r = run_benchmark("local", np.int64(4), np.int64(64), "int32", straggler=np.int64(2), iters=np.int8(1))
    assert r.late_rank == 2 and r.num_ranks == 4 and type(r.num_ranks) is int


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: plan_for(PROOF, 4, 10), "rank must be a rank in 0..3, got 4"),
        (lambda: plan_for(PROOF, 0, -1), "count must be at least 0, got -1"),
        (lambda: allreduce_local(fresh(), PROOF, -0.5), "straggler_delay must be a finite number of seconds"),
        (lambda: allreduce_local(fresh(), PROOF, float("nan")), "straggler_delay must be a finite number"),
        (lambda: allreduce_local(fresh(), PROOF, late_rank=-1), "late_rank must be a rank in 0..3, got -1"),
        (lambda: allreduce(np.zeros(3), PROOF, timeout=0), "timeout must be a finite number of seconds > 0"),
        (lambda: allreduce(np.zeros(3), PROOF, tag=16384), "tag must be a channel number from 0 to 16383"),
        (lambda: run_benchmark("local", 4, 64, straggler=7), "straggler must be a rank in 0..3, got 7"),
        (lambda: run_benchmark("local", 4, 64, delay=-1), "delay must be a finite number of seconds >= 0"),
        (lambda: run_benchmark("local", 1, 64), "need 2 to 2048 GPUs, got 1"),
    ],
)
def test_values_out_of_range_are_input_errors_naming_the_argument(
    call: Callable[[], object], message: str
) -> None:
    with pytest.raises(InputError) as info:
        call()
    assert str(info.value).startswith(message) and "--" not in str(info.value)


@pytest.mark.parametrize(("what", "call", "name"), CALLS, ids=[c[0] for c in CALLS])
def test_an_integer_past_64_bits_is_refused_in_one_short_line(
    what: str, call: Callable[[Any], object], name: str
) -> None:
    """10**5000 gave Python's own ValueError ("Exceeds the limit (4300 digits) for integer string
    conversion") from the message that tried to print it."""
    with pytest.raises(InputError) as info:
        call(10**5000)
    assert str(info.value) == f"{name} must fit in 64 bits, got an integer of 16,610 bits", what
    with pytest.raises(InputError, match=r"^num_ranks must fit in 64 bits"):
        synthesize("stragglar", -(2**64))


@pytest.mark.parametrize("timeout_s", [0, -1, float("inf"), float("nan"), 2 * MAX_TIMEOUT])
def test_the_z3_search_takes_a_positive_bounded_timeout(timeout_s: float) -> None:
    """-1 and inf reached z3 (a ResourceError after no search, a raw OverflowError)."""
    with pytest.raises(InputError, match=r"^timeout_s must be"):
        synthesize("stragglar", 5, method="smt", timeout_s=timeout_s)


def test_times_refuse_bools_and_strings() -> None:
    with pytest.raises(ArgumentError, match=r"^straggler_delay must be a number of seconds, got True"):
        allreduce_local(fresh(), PROOF, True)
    with pytest.raises(ArgumentError, match=r"^timeout must be a number of seconds, got '5s'"):
        allreduce(np.zeros(3), PROOF, timeout="5s")  # type: ignore[call-overload]


def test_stragglar_state_checks_its_fields() -> None:
    pytest.importorskip("torch")
    from stragglar.ddp import StragglarState

    assert StragglarState(straggler=np.int64(3)).straggler == 3
    with pytest.raises(ArgumentError, match=r"^StragglarState.process_group must be a torch process group"):
        StragglarState(process_group="world")  # accepted, then a raw AttributeError in backward()
    with pytest.raises(ArgumentError, match=r"^StragglarState.graphs must be True or False, got 'no'$"):
        StragglarState(graphs="no")  # type: ignore[arg-type]
    assert type(StragglarState(straggler=np.int64(3)).straggler) is int
    for bad, kind in [(1.5, "float"), (True, "bool"), ("3", "str")]:
        with pytest.raises(
            ArgumentError, match=rf"^StragglarState.straggler must be an integer, got .* \({kind}\)"
        ):
            StragglarState(straggler=bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^StragglarState.straggler must be at least 0, got -1"):
        StragglarState(straggler=-1)
    with pytest.raises(InputError, match=r"^StragglarState.algorithm must be one of stragglar, ring"):
        StragglarState(algorithm="magic")
    with pytest.raises(InputError, match=r"^StragglarState.timeout must be a finite number of seconds > 0"):
        StragglarState(timeout=0)
    with pytest.raises(ArgumentError, match=r"^StragglarState.detect must be an integer"):
        StragglarState(detect=2.5)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=r"^StragglarState.rule must be a stragglar.model.detect.Rule"):
        StragglarState(rule=0.75)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^Rule.share must be in \(0, 1\), got 1.5"):
        StragglarState(rule=Rule(share=1.5))
    state = StragglarState(straggler=5)
    with pytest.raises(InputError, match=r"^StragglarState.straggler must be a rank in 0..3, got 5"):
        state.proof(4)
    # an algorithm without a straggler: the straggler is only the late rank, never an error
    ring = StragglarState(algorithm="ring", straggler=1)
    assert ring.proof(4).schedule.straggler is None and ring.late_rank(4) == 1
    assert StragglarState(straggler=1).proof(4).schedule.straggler == 1


# ---------------------------------------------------------------------------- upper bounds


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda v: allreduce(np.zeros(3), PROOF, timeout=v), "timeout must be at most 86,400 s (a day)"),
        (lambda v: run_benchmark("local", 4, 64, timeout=v), "timeout must be at most 86,400 s (a day)"),
        (lambda v: launch(print, 2, timeout=v), "timeout must be at most 86,400 s (a day)"),
        (
            lambda v: allreduce(np.zeros(3), PROOF, straggler_delay=v),
            "straggler_delay must be at most 3,600 s (an hour)",
        ),
        (lambda v: allreduce_local(fresh(), PROOF, v), "straggler_delay must be at most 3,600 s (an hour)"),
        (lambda v: run_benchmark("local", 4, 64, delay=v), "delay must be at most 3,600 s (an hour)"),
    ],
)
@pytest.mark.parametrize("value", [1e9, 1e12, 1e308])
def test_a_wait_of_years_is_refused_not_taken(
    call: Callable[[Any], object], message: str, value: float
) -> None:
    """``timeout=1e12`` or ``straggler_delay=1e9`` was a hang; ``1e308`` overflowed the engines'
    own timeouts and was reported as a peer's failure."""
    with pytest.raises(InputError, match=f"^{re.escape(f'{message}, got {value!r} s')}$"):
        call(value)


def test_the_bounds_themselves_are_taken_and_huge_integers_are_not_finite() -> None:
    assert (
        as_seconds(MAX_TIMEOUT, "timeout") == 86400.0
        and as_seconds(MAX_DELAY, "d", maximum=MAX_DELAY) == 3600.0
    )
    with pytest.raises(InputError, match=r"^timeout must be a finite number of seconds >= 0"):
        as_seconds(10**400, "timeout")  # float() of it overflowed: a raw OverflowError


def test_stragglar_state_bounds_its_times() -> None:
    pytest.importorskip("torch")
    from stragglar.ddp import StragglarState

    with pytest.raises(InputError, match=r"^StragglarState.timeout must be at most 86,400 s \(a day\)"):
        StragglarState(timeout=1e308)  # was a raw OverflowError
    with pytest.raises(
        InputError, match=r"^StragglarState.straggler_delay must be at most 3,600 s \(an hour\)"
    ):
        StragglarState(straggler_delay=1e9)


def test_a_tag_past_the_channels_is_refused_before_any_data_moves() -> None:
    """A tag is a channel, 0 to 16383, whose wire tags are C ints: ``tag=2**31`` failed
    mid-schedule, after data had moved, and ``tag=2**63`` was a raw ValueError.  The tag is checked
    first: a tag that fits goes on to the next check (here, that a NumPy array needs an NcclGroup)."""
    for tag in (16384, 2**31, 2**63):
        with pytest.raises(InputError, match=r"^tag must be a channel number from 0 to 16383"):
            allreduce(np.zeros(3), PROOF, tag=tag)
    with pytest.raises(ArgumentError, match="cannot allreduce a ndarray across processes"):
        allreduce(np.zeros(3), PROOF, tag=16383)


def test_a_rule_that_could_name_nobody_is_refused_at_the_first_step() -> None:
    """Last at 20% of steps is no evidence among 4 ranks (chance: 25%): the hook would measure
    every step and never name anyone, so it says so instead."""
    pytest.importorskip("torch")
    from stragglar.ddp import StragglarState

    state = StragglarState(policy="auto", rule=Rule(share=0.2))
    with pytest.raises(InputError, match=r"a share of 0.2 is no more than chance \(1/4\) among 4 ranks"):
        state.new_step(4)
