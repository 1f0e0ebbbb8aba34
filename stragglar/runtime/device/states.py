"""Where a process keeps its ranks' device states between calls, and which ones no call may use.

A rank's state on a group (:class:`~stragglar.runtime.device.group.DeviceRank`: its inbox, its
flags, the peers' ones it opened) is memory its peers' kernels write by pointer.  A rank may let
one go only where every peer lets go of its own at the same call: a peer that still had it would
write the next call's data into memory freed here, and reused by anything.

*Kept per group and channel* (:class:`States`).  Every rank makes the calls of one channel of a
group in one order (the header check sees to it), so where each channel keeps its own few most
recent states, least recently used first, the ranks make and drop them together.  A process's
calls on another group, or on another channel of this one (tags on gloo, in other threads), move
nothing here; one cache for the whole process would let ranks whose other calls differ drop
different states.  A torch group's states go before torch destroys the group (the caller
registers :func:`forget`), an :class:`~stragglar.runtime.NcclGroup`'s as
:func:`~stragglar.runtime.release_graphs` releases the group (:func:`forget_group`), which
comes before destroying its communicator.

*Broken* (:func:`keep_broken`).  A call whose launch was cut short, whose wait did not reach
every rank's words, or that was never waited for, leaves its state broken: this rank cannot know
that its peers' kernels of that call have ended (they wait for every rank's signals), and one
still running writes the state's inbox and flags, and a registered buffer, until its own waits
give up.  No call runs on a broken state again, nor on the registered buffer a broken state
reached, and a broken state is kept, with the buffer, while the process lives: memory reused
elsewhere must not take a peer's late writes.  A group with a collective that failed is one to
make anew, as NCCL's communicators are after an error.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from stragglar.runtime.failures import RankError
from stragglar.runtime.plans import emptied

__all__ = [
    "CACHED",
    "States",
    "broken_buffer",
    "broken_error",
    "forget",
    "forget_group",
    "keep_broken",
    "states_for",
]

CACHED = 4  # states kept per group and channel: each holds an inbox about the size of its buffer


class States(OrderedDict[Hashable, Any]):
    """One channel of one group's device states, by setup, least recently used first (at most
    :data:`CACHED`): see the module's notes."""


_lock = threading.RLock()  # re-entered where a dropped work breaks its state in a collection
_kept: dict[tuple[Hashable, Hashable], States] = {}  # by (group, channel)
_broken: list[Any] = []  # broken states, kept for the process's life
_broken_buffers: dict[tuple[int, int], str] = {}  # (GPU, address) of a registered buffer: why


def states_for(owner: Hashable, channel: Hashable) -> tuple[States, bool]:
    """The states of ``channel`` of the group ``owner``, and whether they were made now (a caller
    then registers :func:`forget` where the group can be destroyed)."""
    with _lock:
        states = _kept.get((owner, channel))
        if states is not None:
            return states, False
        states = _kept[(owner, channel)] = States()
        return states, True


def forget(states: States) -> None:
    """Let go of ``states`` (their group is going): each closes the peers' memory it opened and
    frees its own once its last kernel has ended, unless a call still holds it."""
    with _lock:
        for key in [key for key, kept in _kept.items() if kept is states]:
            del _kept[key]
    emptied(states)  # beside a call that looks its state up


def forget_group(owner: Hashable | None) -> None:
    """Let go of the states of every channel of the group ``owner`` (None: of every group)."""
    with _lock:
        going = [states for (group, _), states in _kept.items() if owner is None or group is owner]
    for states in going:
        forget(states)


def keep_broken(state: Any, buffer: tuple[int, int] | None, why: str) -> None:
    """Keep ``state``, broken (``why``: what failed), while the process lives; ``buffer``: the
    (GPU, address) of the registered buffer its peers reach, refused to later calls too."""
    with _lock:
        _broken.append(state)
        if buffer is not None:
            _broken_buffers.setdefault(buffer, why)


def broken_buffer(device_id: int, address: int) -> str | None:
    """Why the buffer at ``address`` on GPU ``device_id`` may still be written by a peer's kernel
    of a broken call, or None."""
    return _broken_buffers.get((device_id, address))


def broken_error(rank: int, why: str) -> RankError:
    """The refusal of a call on a broken state, or on a buffer a broken state reached: ``why``
    its call failed."""
    return RankError(
        f"allreduce failed: rank {rank} cannot run this device call: an earlier call on its setup "
        f"or buffer failed before every rank was known to have ended it ({why}), so a peer's kernel "
        "may still write there: make the group anew",
        rank=rank,
        during="after a device call that failed",
    )
