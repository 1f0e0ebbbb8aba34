"""The blocks a process's device kernels hold on a GPU (stragglar/runtime/device/residency.py): a
launch with no room waits for kernels before it to end, not for their callers' waits, bounded."""

from __future__ import annotations

import threading
import time

import pytest

from stragglar.runtime import RankError
from stragglar.runtime.device.residency import Residency


def test_holds_within_room_are_made_at_once_and_counted_per_gpu() -> None:
    room = Residency()
    first, second = room.hold(0, 4, 8, 1.0), room.hold(0, 4, 8, 1.0)
    room.hold(1, 8, 8, 1.0)  # another GPU's room
    assert (room.held(0), room.held(1)) == (8, 8)
    room.release(0, first)
    assert room.held(0) == 4
    second.ended = lambda: True  # its kernel ended: let go without a release
    assert room.held(0) == 0


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
    assert room.held(0) == 6


@pytest.mark.parametrize(("rank", "who"), [(3, "rank 3"), (None, "the call")])
def test_no_room_within_the_timeout_is_one_line_naming_what_holds_it(rank: int | None, who: str) -> None:
    room = Residency()
    room.hold(2, 5, 8, 1.0)  # launched and running (no end known)
    with pytest.raises(RankError) as info:
        room.hold(2, 4, 8, 0.1, rank)
    said = str(info.value)
    assert said == (
        f"allreduce failed: {who} timed out waiting for room on GPU 2: the device calls in flight "
        "hold 5 of the 8 blocks it runs at once, and this call needs 4"
    )
    assert info.value.reason == "timed out" and info.value.rank == rank
