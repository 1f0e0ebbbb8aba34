"""When a call checks its header, and which calls may run at once: the runtime's channels.

The header check (:mod:`stragglar.runtime.header`) all-gathers every rank's description of the
call, so it needs every rank, the late one included: run before every call it would make the
punctual ranks wait for the late rank, and the hidden phase would be hidden no more.  So a call
checks only where its ranks could disagree without anyone noticing, and that is decided per
*channel*, a sequence of calls that every rank makes in the same order:

* On gloo a channel is a group and a ``tag``: the tag picks the call's wire tags (``tag x``
  :data:`ROUNDS_PER_TAG` ``+ round``), so messages of different channels never match, and every
  rank's calls on one channel form one sequence.  NCCL matches messages by order alone, so there
  a whole group is one channel.
* A call checks when its header differs from the last one its channel ran (or checked), and on a
  channel's first call.  By induction every rank then had the same last header on the channel: if
  all ranks bring the same new one, all check and agree; if any rank brings another one, it checks
  while the others may not, and the call cannot complete on any rank (the checking rank waits in
  the gather, the others wait for its data) until the timeout: never a sum of mixed setups.  A
  channel that keeps one setup (a training loop, a benchmark) checks once.
* ``lockstep`` calls come from a caller that guarantees every rank makes the same calls on the
  group in the same order (the DDP hook: DDP reduces the same buckets in the same order on every
  rank, and every rank's policy decides from the same gathered figures).  Their headers are
  checked once per group and setup, however setups alternate, which keeps every bucket's
  ReduceScatter hidden while the late rank is away.
* Two calls on one channel at once would take each other's messages: a call that finds its channel
  busy in this process is refused before any data moves, and the call that holds the channel fails
  too when it ends.  The ranks may have raced differently (on one rank the first call took the
  channel, on another the second), so the call that ran may have exchanged messages with the
  other call's peers: its result cannot be trusted.  A rank that saw no overlap at all (it ran the
  two calls one after the other, while another rank ran them in the other order) cannot know: no
  header tells two calls of the same setup apart, as NCCL cannot tell two collectives apart.
  Concurrent calls need distinct tags.

>>> channels = Channels()
>>> group, header = object(), ("a header",)
>>> with channels.enter(group, 0, header, lockstep=False) as call:
...     print(call.must_check)  # the channel's first call
...     call.agreed()  # every rank's header was the same
True
>>> with channels.enter(group, 0, header, lockstep=False) as call:  # the same setup again
...     print(call.must_check)
False
>>> with channels.enter(group, 0, header, lockstep=False):  # doctest: +ELLIPSIS
...     channels.enter(group, 0, header, lockstep=False).__enter__()
Traceback (most recent call last):
...
stragglar.errors.InputError: another allreduce with tag 0 is still running on this group ...
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from stragglar.args import as_int
from stragglar.errors import InputError

__all__ = ["HEADER_TAG", "MAX_TAG", "ROUNDS_PER_TAG", "Call", "Channels", "as_tag"]

ROUNDS_PER_TAG = 2**17  # wire tags per channel: more rounds than any schedule within the size limits
MAX_TAG = 2**31 // ROUNDS_PER_TAG - 1  # 16383: the last channel whose wire tags fit a C int
HEADER_TAG = ROUNDS_PER_TAG - 1  # a channel's last wire tag carries its header gather, not a round


def as_tag(tag: object, num_rounds: int) -> int:
    """``tag`` as a channel number, checked before any data moves: its wire tags
    (``tag x ROUNDS_PER_TAG + round``) must be C ints, as gloo's and NCCL's are (a tag past them
    failed mid-schedule), and a schedule's rounds must fit a channel's (every schedule within the
    size limits does).

    >>> as_tag(16383, 15)
    16383
    >>> as_tag(2**31, 15)
    Traceback (most recent call last):
    ...
    stragglar.errors.InputError: tag must be a channel number from 0 to 16383, got 2147483648
    """
    channel = as_int(tag, "tag", minimum=0)
    if channel > MAX_TAG:
        raise InputError(f"tag must be a channel number from 0 to {MAX_TAG}, got {channel}")
    if num_rounds > HEADER_TAG:
        raise InputError(f"{num_rounds} rounds are more than a channel's {HEADER_TAG} wire tags for rounds")
    return channel


@dataclass
class _Group:
    """One group's channels: the last header each ran, the headers lockstep calls checked, the
    channels a call is running on, and those of them another call tried to take meanwhile."""

    alive: Callable[[], Any]  # the group, or None once it is gone (a group is held weakly where it allows)
    last: dict[Hashable, Hashable] = field(default_factory=dict)
    checked: OrderedDict[Hashable, None] = field(default_factory=OrderedDict)
    busy: set[Hashable] = field(default_factory=set)
    spoiled: set[Hashable] = field(default_factory=set)  # busy channels another call tried to take


@dataclass
class Call:
    """A call inside :meth:`Channels.enter`: ``must_check`` says whether its header must be
    all-gathered; :meth:`agreed` records that the ranks agreed on it."""

    must_check: bool
    _agreed: Callable[[], None]

    def agreed(self) -> None:
        self._agreed()


class Channels:
    """Per group (by identity, held weakly where it allows): each channel's last header, the
    headers checked by lockstep calls (the ``limit`` most recent), and the channels in use."""

    def __init__(self, limit: int = 1024) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._groups: dict[int, _Group] = {}

    @contextlib.contextmanager
    def enter(self, group: Any, channel: Hashable, header: Hashable, *, lockstep: bool) -> Iterator[Call]:
        """Hold ``channel`` of ``group`` for one call with ``header``; refuse it (InputError) when
        another call of this process holds it.  A call that raises leaves its channel unknown, so
        the next call on it checks again (every rank failed it: the check, or a peer, saw to it)."""
        with self._lock:
            state = self._take(group, channel)
            must_check = header not in state.checked if lockstep else state.last.get(channel) != header
        done = False

        def agreed() -> None:
            with self._lock:
                if lockstep:
                    state.checked[header] = None
                    while len(state.checked) > self._limit:
                        state.checked.popitem(last=False)
                else:
                    state.last[channel] = header

        try:
            yield Call(must_check, agreed)
            done = True
        finally:
            with self._lock:
                spoiled = self._give(state, channel)
                if spoiled or not done:
                    state.last.pop(channel, None)
                    state.checked.pop(header, None)
        if spoiled and done:  # a call that failed keeps its own error
            raise InputError(_spoiled(channel))

    @contextlib.contextmanager
    def hold(self, group: Any, channel: Hashable) -> Iterator[None]:
        """Hold ``channel`` of ``group`` for a gather that is part of a call already entered and
        left (a device call's wait): refused while another call holds the channel, and failed
        where one tried to take it meanwhile, as :meth:`enter` is.  No header is checked."""
        with self._lock:
            state = self._take(group, channel)
        done = False
        try:
            yield
            done = True
        finally:
            with self._lock:
                spoiled = self._give(state, channel)
        if spoiled and done:
            raise InputError(_spoiled(channel))

    def _take(self, group: Any, channel: Hashable) -> _Group:
        """Mark ``channel`` busy (under the lock); refuse it, and spoil its holder, where busy."""
        state = self._state(group)
        if channel in state.busy:
            state.spoiled.add(channel)  # the running call fails too: see the module's docstring
            raise InputError(_busy(channel))
        state.busy.add(channel)
        return state

    def _give(self, state: _Group, channel: Hashable) -> bool:
        """Free ``channel`` (under the lock); whether another call tried to take it meanwhile."""
        state.busy.discard(channel)
        spoiled = channel in state.spoiled
        state.spoiled.discard(channel)
        return spoiled

    def _state(self, group: Any) -> _Group:
        """``group``'s channels (under the lock); a group that is gone is never taken for a new one
        at the same address."""
        state = self._groups.get(id(group))
        if state is None or state.alive() is not group:
            for key in [k for k, s in self._groups.items() if s.alive() is None]:
                del self._groups[key]
            try:
                alive: Callable[[], Any] = weakref.ref(group)
            except TypeError:
                alive = lambda: group  # noqa: E731 - the group cannot be referenced weakly: keep it
            state = self._groups[id(group)] = _Group(alive)
        return state

    def clear(self) -> None:
        with self._lock:
            self._groups.clear()


def _busy(channel: Hashable) -> str:
    if channel is None:
        return (
            "another allreduce is still running on this NCCL group in this process: NCCL matches "
            "messages by order, so calls on one group must not overlap (use a group per concurrent call)"
        )
    return (
        f"another allreduce with tag {channel} is still running on this group in this process: "
        "concurrent calls need distinct tags"
    )


def _spoiled(channel: Hashable) -> str:
    where = "this NCCL group" if channel is None else f"tag {channel}"
    return (
        f"another allreduce started on {where} while this one ran: its ranks may have paired this "
        "call's messages with that one's, so its result is not to be trusted (concurrent calls need "
        "distinct tags, on NCCL distinct groups)"
    )
