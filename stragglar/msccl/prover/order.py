"""Happens-before between thread blocks, as vector clocks, for the MSCCL executor model's race check.

Two accesses of one chunk by different thread blocks (TBs) of a GPU, one a write, are ordered if
every run makes one come first.  What orders them is program order inside a TB, a dependency (the
wait ends only after the producer's releasing ``hasdep`` step), and a message: a receive happens
after the send it takes, so an order can also run through other GPUs (tb A writes a chunk, sends
to GPU 1, whose TB forwards to tb B of the first GPU, which then reads the chunk).  A connection's
limited room also orders a send after an earlier receive, but only for the capacity modelled, not
for every buffer size: that order is not counted, so a file relying on it is refused (the safe
side).

Progress is counted in *ticks*, one per chunk a TB moves (a ``cnt``-chunk step is ``cnt`` ticks):
an access made at tick ``k`` of TB ``u`` is known to TB ``t`` once ``t``'s clock holds more than
``k`` for ``u``.  A clock is a vector with a column per tracked TB, never changed once made (a join
makes a new one, and only when it learns something), so that a snapshot, what a releasing step or
a sent chunk knew, is the clock itself with the TB's own progress beside it: taking one costs
nothing, and the vectors alive are those clocks still referred to.

Following messages makes every TB's clock as wide as the TBs it may learn of, all of them: 13,450
TBs tracking 13,450 each at N = 128.  So a run starts with
:meth:`Clocks.within_gpus` (columns: the TBs of one's own GPU; messages carry nothing), which
never misses a race but may flag accesses ordered through other GPUs; only the GPUs it flags are
run again, a few at a time (:func:`batches`), with :meth:`Clocks.through_gpus` (every TB tracks
those GPUs' TBs and messages carry clocks), which is exact for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:  # numpy is imported where clocks are made: a command that proves no file skips it
    import numpy as np
    import numpy.typing as npt

__all__ = ["Access", "Accesses", "Clock", "Clocks", "Conflict", "Key", "Snapshot", "batches", "releases"]

Clock: TypeAlias = "npt.NDArray[np.int32]"  # ticks: at most 2 iterations x 64 steps x 71 chunks per TB
Key = tuple[int, int, str, int]  # a chunk of one iteration: (iteration, gpu, buffer, offset)
CELLS = 1 << 26  # clock entries (256 MiB) a run that follows messages budgets for: what it tracks at once
KEPT = 2  # clocks budgeted per TB: its own, and one its chunks in flight or its releases still refer to


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What TB ``tb`` knew at a point: its clock then, and its own ticks below ``progress``."""

    clock: Clock
    tb: int
    progress: int


class Clocks:
    """The vector clock of every TB over the tracked TBs' columns (``column[u]``, -1 if untracked).

    ``exact`` says whether :meth:`known` is happens-before itself (messages followed) or only the
    part of it inside each GPU (then a gap is a suspect, not yet a race).
    """

    def __init__(self, clock: list[Clock], column: list[int], exact: bool) -> None:
        self.clock, self.column, self.exact = clock, column, exact

    @classmethod
    def within_gpus(cls, gpu_of: Sequence[int], local: Sequence[int]) -> Clocks:
        """Each TB tracks the TBs of its own GPU (``local[u]``: u's index there); messages carry
        nothing."""
        import numpy as np

        zero = {g: np.zeros(count, dtype=np.int32) for g, count in Counter(gpu_of).items()}
        return cls([zero[g] for g in gpu_of], list(local), exact=False)

    @classmethod
    def through_gpus(cls, gpu_of: Sequence[int], tracked: set[int]) -> Clocks:
        """Every TB tracks the TBs of the GPUs in ``tracked``, and messages carry clocks."""
        import numpy as np

        column, width = [], 0
        for g in gpu_of:
            column.append(width if g in tracked else -1)
            width += g in tracked
        zero = np.zeros(width, dtype=np.int32)
        return cls([zero] * len(gpu_of), column, exact=True)

    @property
    def messages(self) -> bool:
        """Whether sent chunks carry their sender's clock."""
        return self.exact

    def tracks(self, t: int) -> bool:
        """Whether TB ``t``'s accesses are checked in this run."""
        return self.column[t] >= 0

    def known(self, t: int, u: int, tick: int) -> bool:
        """Whether TB ``t`` knows that TB ``u`` (of its GPU) made its access at ``tick``."""
        return bool(self.clock[t][self.column[u]] > tick)

    def snapshot(self, t: int, progress: int) -> Snapshot:
        """What ``t`` knows, its own ticks below ``progress`` included."""
        return Snapshot(self.clock[t], t, progress)

    def join(self, t: int, known: Snapshot) -> None:
        """``t`` now knows what ``known`` knew (a wait released, a chunk received)."""
        import numpy as np

        mine, own = self.clock[t], self.column[known.tb]
        learns = own >= 0 and known.progress > mine[own]
        if known.clock is not mine and not learns:
            learns = bool(np.any(known.clock > mine))
        if learns:
            clock = np.maximum(mine, known.clock)
            if own >= 0:
                clock[own] = max(clock[own], known.progress)
            self.clock[t] = clock


def batches(gpus: Sequence[int], size: Sequence[int], total: int) -> list[set[int]]:
    """``gpus`` (with ``size[g]`` TBs each) in groups whose clocks, :data:`KEPT` for each of the
    ``total`` TBs, stay within :data:`CELLS` entries (one GPU per group at least).

    >>> batches([0, 1, 2], [4, 4, 4], 1 << 22)
    [{0, 1}, {2}]
    """
    out: list[set[int]] = []
    width = 0
    for g in gpus:
        if out and (width + size[g]) * total * KEPT <= CELLS:
            out[-1].add(g)
            width += size[g]
        else:
            out.append({g})
            width = size[g]
    return out


def releases(hasdep: Sequence[bool]) -> list[int]:
    """For each transmission of a TB (``hasdep``: whether each signals), the index of the first one
    at or after it that signals: the one whose signal ends a wait on it (``len(hasdep)`` if none).

    >>> releases([False, True, False, False, True, False])
    [1, 1, 4, 4, 4, 6]
    """
    out, first = [len(hasdep)] * len(hasdep), len(hasdep)
    for k in reversed(range(len(hasdep))):
        if hasdep[k]:
            first = k
        out[k] = first
    return out


@dataclass(frozen=True, slots=True)
class Access:
    """An access of a chunk: by which TB, at which of its ticks, in which step (for messages)."""

    tb: int
    tick: int
    step: int


@dataclass(frozen=True, slots=True)
class Conflict:
    """An earlier access that a new one is not known to follow; ``verb`` says what it did."""

    earlier: Access
    verb: str  # "reads" or "writes"


class Accesses:
    """For each chunk, the last write and the reads since, and whether a new access follows them
    (by :class:`Clocks`; only the accesses of the TBs they track are checked)."""

    def __init__(self, clocks: Clocks) -> None:
        self.clocks = clocks
        self.last_write: dict[Key, Access] = {}
        self.readers: dict[Key, dict[int, Access]] = {}

    def read(self, key: Key, access: Access) -> Conflict | None:
        """Record a read; the write it may not follow, if any."""
        conflict = self._after_write(key, access)
        self.readers.setdefault(key, {})[access.tb] = access
        return conflict

    def write(self, key: Key, access: Access) -> Conflict | None:
        """Record a write; the write or a read since it that it may not follow, if any."""
        conflict = self._after_write(key, access)
        if conflict is None and self.clocks.tracks(access.tb):
            conflict = next(
                (
                    Conflict(read, "reads")
                    for read in self.readers.get(key, {}).values()
                    if read.tb != access.tb and not self.clocks.known(access.tb, read.tb, read.tick)
                ),
                None,
            )
        self.readers[key] = {}
        self.last_write[key] = access
        return conflict

    def writer(self, key: Key) -> Access | None:
        """The last write of a chunk, if any."""
        return self.last_write.get(key)

    def _after_write(self, key: Key, access: Access) -> Conflict | None:
        last = self.last_write.get(key)
        if (
            last is not None
            and last.tb != access.tb
            and self.clocks.tracks(access.tb)
            and not self.clocks.known(access.tb, last.tb, last.tick)
        ):
            return Conflict(last, "writes")
        return None
