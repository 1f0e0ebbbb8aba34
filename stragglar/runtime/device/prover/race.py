"""Happens-before on buffer chunks: every conflicting pair of accesses to a chunk is ordered.

A direct transfer reads or writes a peer's buffer with no inbox between, so a chunk may be
touched by several ranks in a call.  Its value is then determined only if happens-before (each
rank's row order, joined by the flags' release/acquire chains: the vector clocks of
:mod:`~stragglar.runtime.device.prover.check`) orders every two accesses of which one is a
write.  Where it does, the writes to a chunk are one chain and every read falls between two of
them, so the order the rows are run in symbolically is one the hardware could take, and every
other order it could take gives the same values.  A rank's input is written before its own
kernel starts, but nothing orders it before its peers' kernels (across processes, or the late
rank's caller still computing it): it counts as a write at the owner's start, in the past of the
owner's rows, and of a peer's only through a flag the owner raised in the call.

"Each rank's row order" is an order of the threads of a block too, which the kernel makes so:
its signals and waits are block barriers, and so is the step between two data rows in a row
(:mod:`~stragglar.runtime.device.kernel_source`: two rows may give a chunk's elements to other threads).

Per chunk this keeps the last write and, per rank, the last read since that write: a rank's
earlier reads are in the past of its later ones, so a writer that has the last in its past has
them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["INPUT_ROW", "Access", "ChunkAccesses", "Race", "input_write"]


@dataclass(frozen=True)
class Access:
    """One row's access: the rank, the row, and that rank's own clock entry at it."""

    rank: int
    row: int
    time: int

    def before(self, clock: list[int]) -> bool:
        """Whether this access is in the past of a rank whose vector clock is ``clock``."""
        return clock[self.rank] >= self.time


@dataclass(frozen=True)
class Race:
    """An access that happens-before does not order after ``earlier``, which conflicts with it."""

    earlier: Access
    earlier_writes: bool


INPUT_ROW = -1  # the row of the write that is a rank's input


def input_write(owner: int) -> Access:
    """The write of ``owner``'s input: before its first row (time 1), after nothing."""
    return Access(owner, INPUT_ROW, 1)


@dataclass
class _Chunk:
    write: Access
    reads: dict[int, Access] = field(default_factory=dict)  # rank -> its last read since that write


@dataclass
class ChunkAccesses:
    """Every (rank, chunk) of the buffers, with the accesses a new one must come after."""

    chunks: dict[tuple[int, int], _Chunk] = field(default_factory=dict)

    def read(self, owner: int, chunk: int, access: Access, clock: list[int]) -> Race | None:
        """Record a read of ``owner``'s ``chunk``, or the write it races with (read after write)."""
        state = self.chunks.setdefault((owner, chunk), _Chunk(input_write(owner)))
        if not state.write.before(clock):
            return Race(state.write, earlier_writes=True)
        state.reads[access.rank] = access
        return None

    def write(self, owner: int, chunk: int, access: Access, clock: list[int]) -> Race | None:
        """Record a write of ``owner``'s ``chunk``, or the write (write after write) or the read
        (write after read) it races with."""
        state = self.chunks.setdefault((owner, chunk), _Chunk(input_write(owner)))
        if not state.write.before(clock):
            return Race(state.write, earlier_writes=True)
        for read in sorted(state.reads.values(), key=lambda a: a.rank):
            if not read.before(clock):
                return Race(read, earlier_writes=False)
        self.chunks[(owner, chunk)] = _Chunk(access)
        return None
