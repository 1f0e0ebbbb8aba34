"""How a flat buffer is cut into a schedule's chunks, identically on every rank.

Schedules rarely have a chunk count that divides the buffer, so chunks are uneven: the first
``count % num_chunks`` chunks get one element more.  Every rank computes the same layout from the
element count alone, so both ends of a transfer agree on its size without talking; chunks may be
empty when ``count < num_chunks`` (their transfers are skipped on both sides).

>>> Layout.even(10, 4).bounds
((0, 3), (3, 6), (6, 8), (8, 10))
>>> Layout.even(2, 3).sizes
(1, 1, 0)
"""

from __future__ import annotations

from dataclasses import dataclass

from stragglar.args import as_int
from stragglar.errors import InputError
from stragglar.schedule import MAX_CHUNKS

__all__ = ["Layout"]


@dataclass(frozen=True, slots=True)
class Layout:
    """Element ranges ``[start, stop)`` of each chunk of a ``count``-element buffer."""

    count: int
    bounds: tuple[tuple[int, int], ...]

    @classmethod
    def even(cls, count: int, num_chunks: int) -> Layout:
        """Split ``count`` elements into ``num_chunks`` chunks whose sizes differ by at most one;
        counts that are no integers, or more chunks than a schedule has, are refused in one line
        before any bound is made ("5" was a TypeError, 10**9 chunks a billion bounds)."""
        count = as_int(count, "count", minimum=0)
        num_chunks = as_int(num_chunks, "num_chunks", minimum=1)
        if num_chunks > MAX_CHUNKS:
            raise InputError(
                f"cannot lay out {count} elements in {num_chunks:,} chunks: at most {MAX_CHUNKS:,}"
            )
        base, extra = divmod(count, num_chunks)
        bounds: list[tuple[int, int]] = []
        start = 0
        for chunk in range(num_chunks):
            stop = start + base + (chunk < extra)
            bounds.append((start, stop))
            start = stop
        layout = cls(count, tuple(bounds))
        layout.check()
        return layout

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.bounds)

    def check(self) -> None:
        """Assert that the chunks cover ``[0, count)`` exactly once, in order."""
        position = 0
        for start, stop in self.bounds:
            assert start == position <= stop, f"chunk [{start}, {stop}) leaves a gap or overlap at {position}"
            position = stop
        assert position == self.count, f"chunks cover [0, {position}), not [0, {self.count})"
