"""A readable round-by-round table of a schedule, for people (the CLI's default output).

Each phase gets a header line with its index, name, ranks and round count, then one
line per round listing what moves over each link, in the schedule's order::

    a->b cK    rank a copies its chunk K into rank b's (b's old value is replaced)
    a->b cK+   rank a adds its chunk K into rank b's (a reduce)
    a<>b cK+   a and b swap chunk K and both add: StragglAR's exchange with the straggler
    c0-3,6     several chunks over the same link in the same round
    -          an idle round

Rounds are numbered from 0 within each phase, as in the verifier's messages, and
items are padded to one width per phase so that they line up.

>>> from stragglar.schedule import Op, Phase, Schedule, Transfer
>>> def t(src, dst, chunk, op=Op.COPY):
...     return Transfer(src, dst, chunk, op)
>>> R = Op.REDUCE
>>> hidden = Phase("reduce-scatter", (0, 1), ((t(0, 1, 1, R), t(1, 0, 0, R)),))
>>> swap0, swap1 = (t(0, 2, 0, R), t(2, 0, 0, R)), (t(1, 2, 1, R), t(2, 1, 1, R))
>>> exposed = Phase("exchange", (0, 1, 2), (swap0, swap1, (t(0, 1, 0), t(2, 0, 1))))
>>> print(render(Schedule("stragglar", 3, 2, 2, (hidden, exposed))))
phase 0 'reduce-scatter', ranks 0-1: 1 round
  round 0 | 0->1 c1+  1->0 c0+
phase 1 'exchange', ranks 0-2: 3 rounds
  round 0 | 0<>2 c0+
  round 1 | 1<>2 c1+
  round 2 | 0->1 c0   2->0 c1
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stragglar.schedule import Op, Phase, Round, Schedule, Transfer
from stragglar.units import count_of

__all__ = ["compact_ranges", "render"]

_GAP = "  "


def render(schedule: Schedule) -> str:
    """The whole schedule as a table, one line per round, without a trailing newline."""
    labels = _Labels(schedule.num_ranks, schedule.num_chunks)
    lines: list[str] = []
    for index, phase in enumerate(schedule.phases):
        lines.extend(_render_phase(index, phase, labels))
    return "\n".join(lines)


def _render_phase(index: int, phase: Phase, labels: _Labels) -> list[str]:
    rows = [labels.round_items(rnd) for rnd in phase.rounds]
    width = max((len(item) for row in rows for item in row), default=0)
    digits = len(str(max(len(rows) - 1, 0)))
    header = (
        f"phase {index} {phase.name!r}, ranks {compact_ranges(phase.ranks)}: {count_of(len(rows), 'round')}"
    )
    lines = [header]
    for number, row in enumerate(rows):
        cells = _GAP.join([item.ljust(width) for item in row]) if row else "-"
        lines.append(f"  round {number:>{digits}} | {cells}".rstrip())
    return lines


class _Labels:
    """Rank and chunk labels formatted once: a 2M-transfer schedule renders in a few seconds."""

    def __init__(self, num_ranks: int, num_chunks: int) -> None:
        self.rank = [str(r) for r in range(num_ranks)]
        self.chunk = [f" c{c}" for c in range(num_chunks)]

    def round_items(self, rnd: Round) -> list[str]:
        """The items of one round: a single chunk per sender is the fast, common case."""
        if len({t.src for t in rnd}) == len(rnd):
            return self._single_items(rnd)
        return self._grouped_items(rnd)

    def _single_items(self, rnd: Round) -> list[str]:
        by_src = {t.src: t for t in rnd}
        items: list[str] = []
        for t in rnd:
            back = by_src.get(t.dst)
            if _is_swap(t, back):
                if t.src < t.dst:
                    items.append(f"{self.rank[t.src]}<>{self.rank[t.dst]}{self.chunk[t.chunk]}+")
                continue
            mark = "+" if t.op is Op.REDUCE else ""
            items.append(f"{self.rank[t.src]}->{self.rank[t.dst]}{self.chunk[t.chunk]}{mark}")
        return items

    def _grouped_items(self, rnd: Round) -> list[str]:
        """One item per (src, dst, op) link, listing its chunks; equal reduces both ways are a swap."""
        links: dict[tuple[int, int, Op], list[int]] = {}
        for t in rnd:
            links.setdefault((t.src, t.dst, t.op), []).append(t.chunk)
        items: list[str] = []
        for (src, dst, op), chunks in links.items():
            mark = "+" if op is Op.REDUCE else ""
            back = links.get((dst, src, op)) if op is Op.REDUCE else None
            if back is not None and sorted(back) == sorted(chunks):
                if src < dst:
                    items.append(f"{self.rank[src]}<>{self.rank[dst]} c{compact_ranges(chunks)}+")
                continue
            items.append(f"{self.rank[src]}->{self.rank[dst]} c{compact_ranges(chunks)}{mark}")
        return items


def _is_swap(t: Transfer, back: Transfer | None) -> bool:
    """Whether ``t`` and ``back`` reduce the same chunk in opposite directions."""
    return (
        back is not None
        and t.op is Op.REDUCE
        and back.op is Op.REDUCE
        and back.dst == t.src
        and back.chunk == t.chunk
    )


def compact_ranges(numbers: Iterable[int]) -> str:
    """Sorted numbers with consecutive runs collapsed; a repeat stays visible, it may be a bug.

    >>> compact_ranges([7, 0, 1, 2, 4, 5, 5])
    '0-2,4-5,5,7'
    """
    runs: list[list[int]] = []
    for v in sorted(numbers):
        if runs and runs[-1][-1] == v - 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ",".join(_run(run) for run in runs)


def _run(run: Sequence[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
