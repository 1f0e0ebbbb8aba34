"""The share of a GPU a process's device kernels hold (stragglar/runtime/device/residency.py): a
launch with no room waits for kernels before it to end, not for their callers' waits, bounded;
kernels of other sizes take their own shares."""

from __future__ import annotations

import threading
import time
from fractions import Fraction

import pytest

from stragglar.runtime import RankError
from stragglar.runtime.device.residency import Residency


def test_holds_within_room_are_made_at_once_and_counted_per_gpu() -> None:
    room = Residency()
    first, second = room.hold(0, 4, 8, 1.0), room.hold(0, 4, 8, 1.0)
    room.hold(1, 8, 8, 1.0)  # another GPU's room
    assert room.held(0) == room.held(1) == 1
    room.release(0, first)
    assert room.held(0) == Fraction(1, 2)
    second.ended = lambda: True  # its kernel ended: let go without a release
    assert room.held(0) == 0


def test_kernels_of_other_sizes_take_their_own_shares() -> None:
    """A kernel of many registers fits 6 blocks on the GPU, a light one 12: 4 of the first take
    two thirds, so 4 of the second (a third) fit beside them, and 5 do not."""
    room = Residency()
    room.hold(0, 4, 6, 1.0)
    room.hold(0, 4, 12, 1.0)
    assert room.held(0) == 1
    with pytest.raises(RankError, match="take 12 of the 12 blocks of this kernel"):
        room.hold(0, 1, 12, 0.05)


def test_a_launch_with_no_room_waits_for_a_kernel_before_it_to_end() -> None:
    """The kernel's end is seen through its hold's ``ended`` (an event on the GPU): a caller that
    launches twice before it waits once gets room as soon as the first kernel ends."""
    room = Residency()
    ended = threading.Event()
    room.hold(0, 6, 8, 1.0).ended = ended.is_set
    threading.Timer(0.2, ended.set).start()
    start = time.monotonic()
    room.hold(0, 6, 8, 5.0)
    assert 0.15 < time.monotonic() - start < 2.0
    assert room.held(0) == Fraction(3, 4)


@pytest.mark.parametrize(("rank", "who"), [(3, "rank 3"), (None, "the call")])
def test_no_room_within_the_timeout_is_one_line_naming_what_holds_it(rank: int | None, who: str) -> None:
    room = Residency()
    room.hold(2, 5, 8, 1.0)  # launched and running (no end known)
    with pytest.raises(RankError) as info:
        room.hold(2, 4, 8, 0.1, rank)
    assert str(info.value) == (
        f"allreduce failed: {who} timed out waiting for room on GPU 2: the device calls in flight "
        "take 5 of the 8 blocks of this kernel it runs at once, and this call needs 4"
    )
    assert info.value.reason == "timed out" and info.value.rank == rank


def test_a_call_larger_than_the_gpu_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="a call of 9 blocks on a GPU that runs 8 at once"):
        Residency().hold(0, 9, 8, 30.0)
