"""The channels' rule: which calls all-gather their header, and which calls may run at once."""

from __future__ import annotations

import gc

import pytest

from stragglar.errors import InputError
from stragglar.runtime.channels import MAX_TAG, ROUNDS_PER_TAG, Channels


class Group:
    """A group that can be referenced weakly, as torch's and CuPy's can."""


Calls = list[tuple[int | None, str]]  # (channel, setup)


def checks(channels: Channels, group: object, calls: Calls, lockstep: bool) -> list[bool]:
    """Which of ``calls`` (channel, setup), each agreed on when checked, must check."""
    must = []
    for channel, header in calls:
        with channels.enter(group, channel, header, lockstep=lockstep) as call:
            must.append(call.must_check)
            if call.must_check:
                call.agreed()
    return must


def test_a_channel_checks_its_first_call_and_each_change_of_setup() -> None:
    calls: Calls = [(0, "a"), (0, "a"), (0, "b"), (0, "a"), (1, "a"), (0, "a")]
    assert checks(Channels(), Group(), calls, lockstep=False) == [True, False, True, True, True, False]


def test_a_caller_in_lockstep_checks_each_setup_once_per_group() -> None:
    calls: Calls = [(0, "a"), (0, "b"), (0, "a"), (1, "b"), (0, "c"), (0, "b")]
    assert checks(Channels(), Group(), calls, lockstep=True) == [True, True, False, False, True, False]


def test_groups_are_apart_and_a_group_that_is_gone_is_forgotten() -> None:
    channels, first, second = Channels(), Group(), Group()
    assert checks(channels, first, [(0, "a")], lockstep=False) == [True]
    assert checks(channels, second, [(0, "a")], lockstep=False) == [True]
    assert checks(channels, first, [(0, "a")], lockstep=False) == [False]
    del first
    gc.collect()
    again = Group()  # may take the address of the one that is gone: never its channels
    assert checks(channels, again, [(0, "a")], lockstep=False) == [True]


def test_a_busy_channel_refuses_a_second_call_fails_the_first_and_frees_when_it_ends() -> None:
    """The ranks may have raced otherwise: the call that held the channel may have met the other
    call's messages on a peer, so it fails as it ends; the channel is then free and checks again."""
    channels, group = Channels(), Group()
    spoiled = pytest.raises(InputError, match="another allreduce started on tag 3 while this one ran")
    with spoiled, channels.enter(group, 3, "a", lockstep=False) as first:
        first.agreed()
        busy = pytest.raises(InputError, match="another allreduce with tag 3 is still running")
        with busy, channels.enter(group, 3, "a", lockstep=False):
            pass
        with channels.enter(group, 4, "a", lockstep=False):  # another tag runs beside it
            pass
        with channels.enter(Group(), 3, "a", lockstep=False):  # and the same tag on another group
            pass
    assert checks(channels, group, [(3, "a")], lockstep=False) == [True]  # free, and checks again
    with channels.enter(group, 4, "a", lockstep=False):  # a tag that ran beside it is unharmed
        pass
    spoiled = pytest.raises(InputError, match="another allreduce started on this NCCL group while")
    with spoiled, channels.enter(group, None, "a", lockstep=False):  # NCCL: the group is one channel
        busy = pytest.raises(InputError, match="calls on one group must not overlap")
        with busy, channels.enter(group, None, "b", lockstep=True):
            pass


@pytest.mark.parametrize("lockstep", [False, True])
def test_a_call_that_fails_leaves_its_channel_to_check_again(lockstep: bool) -> None:
    channels, group = Channels(), Group()
    assert checks(channels, group, [(0, "a")], lockstep=lockstep) == [True]
    with (
        pytest.raises(RuntimeError, match="a peer died"),
        channels.enter(group, 0, "a", lockstep=lockstep) as call,
    ):
        assert not call.must_check
        raise RuntimeError("a peer died")
    assert checks(channels, group, [(0, "a")], lockstep=lockstep) == [True]


def test_every_channel_has_wire_tags_for_the_longest_schedule_within_a_c_int() -> None:
    from stragglar.schedule import MAX_CELLS, MAX_CHUNKS, MAX_RANKS, round_lower_bound
    from stragglar.synth import synthesize

    def stragglar_rounds(n: int, c: int) -> int:  # the hidden ReduceScatter, then phase 2's bound
        return n - 2 + round_lower_bound(n, c)

    for n, c in ((3, 64), (8, 100), (64, 1000)):
        assert synthesize("stragglar", n, chunks=c).num_rounds == stragglar_rounds(n, c)
    for algorithm in ("ring", "direct"):  # the baselines grow as 2N
        assert synthesize(algorithm, 64).num_rounds <= 2 * 64 + 8
    longest = max(
        max(stragglar_rounds(n, min(MAX_CHUNKS, MAX_CELLS // n)) for n in range(3, MAX_RANKS + 1)),
        2 * MAX_RANKS + 8,
    )
    assert longest < ROUNDS_PER_TAG
    assert (MAX_TAG + 1) * ROUNDS_PER_TAG - 1 == 2**31 - 1
