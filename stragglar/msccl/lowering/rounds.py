"""Lowering stage 1: cut each round into pieces, one step's worth of chunks on one FIFO.

Instance ``j`` of ``instances`` runs the whole schedule on chunks ``j*C .. j*C+C-1``.  Within a
round, the transfers of one (sender, receiver) pair in chunk order are cut into runs of
consecutive chunks with one op; a run becomes one step (``cnt`` > 1) unless its chunks sit in
different buffers.

Synchronous rounds read the state at the start of the round.  A rank that receives chunk ``c``
while it also sends ``c`` in the same round (the straggler exchange) must not overwrite the value
being sent: if either transfer is part of a multi-chunk run, the receive goes to the scratch copy
of the chunk (``s`` for ``i`` and back) and later steps use that copy; otherwise the in-place
receive waits for the send through a dependency (stage 3).  Chunks whose final value is in scratch
are copied back to ``i`` at the end.

>>> from stragglar.schedule import Op, Transfer
>>> [p.cnt for p in round_pieces((Transfer(0, 1, 0), Transfer(0, 1, 1), Transfer(2, 1, 3)), {})]
[2, 1]
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from stragglar.msccl.vocabulary import MAX_COUNT
from stragglar.schedule import Op, Round, Schedule, Transfer

__all__ = ["Piece", "round_pieces", "schedule_pieces"]

Location = dict[tuple[int, int], str]  # (gpu, chunk) -> the buffer holding its current value


@dataclass(frozen=True)
class Piece:
    """One step's worth of a round: ``cnt`` consecutive chunks on one FIFO, with their buffers.

    ``srcbuf`` holds the sender's value, ``localbuf`` the receiver's current one (the other operand
    of a reduce), ``dstbuf`` where the result goes.
    """

    src: int
    dst: int
    chunk: int
    cnt: int
    reduce: bool
    srcbuf: str
    localbuf: str
    dstbuf: str


def schedule_pieces(
    schedule: Schedule, instances: int
) -> tuple[list[tuple[int, list[Piece]]], list[tuple[int, int]]]:
    """Every round's pieces, as ``(instance, pieces)`` in execution order, and the sorted
    ``(gpu, offset)`` of the chunks whose final value is in scratch."""
    c = schedule.num_chunks
    rounds: list[tuple[int, list[Piece]]] = []
    back: list[tuple[int, int]] = []
    for j in range(instances):
        loc: Location = {}
        for rnd in _rounds(schedule):
            pieces = round_pieces(rnd, loc)
            rounds.append((j, pieces))
            for p in pieces:
                for chunk in range(p.chunk, p.chunk + p.cnt):
                    loc[p.dst, chunk] = p.dstbuf
        back += sorted((g, j * c + chunk) for (g, chunk), buf in loc.items() if buf == "s")
    return rounds, sorted(back)


def _rounds(schedule: Schedule) -> Iterator[Round]:
    for phase in schedule.phases:
        yield from phase.rounds


def _runs(rnd: Round) -> list[list[Transfer]]:
    """The round's transfers per FIFO in chunk order, cut into runs of consecutive chunks and one op."""
    runs: list[list[Transfer]] = []
    for t in sorted(rnd, key=lambda t: (t.src, t.dst, t.chunk)):
        last = runs[-1][-1] if runs else None
        if last is not None and (last.src, last.dst, last.chunk + 1, last.op) == (
            t.src,
            t.dst,
            t.chunk,
            t.op,
        ):
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs


def round_pieces(rnd: Round, loc: Location) -> list[Piece]:
    """Split a round into pieces with uniform buffers (see the module docstring for scratch)."""
    runs = _runs(rnd)
    sent: defaultdict[int, set[int]] = defaultdict(set)
    for t in rnd:
        sent[t.src].add(t.chunk)
    hazard = {(t.dst, t.chunk) for t in rnd if t.chunk in sent[t.dst]}
    multi = {r for run in runs if len(run) > 1 for t in run for r in (t.src, t.dst) if (r, t.chunk) in hazard}
    pieces: list[Piece] = []
    for run in runs:
        for t in run:
            local = loc.get((t.dst, t.chunk), "i")
            dst = ("s" if local == "i" else "i") if t.dst in multi and (t.dst, t.chunk) in hazard else local
            src = loc.get((t.src, t.chunk), "i")
            piece = Piece(t.src, t.dst, t.chunk, 1, t.op is Op.REDUCE, src, local, dst)
            last = pieces[-1] if pieces else None
            if last is not None and last.cnt < MAX_COUNT - 1 and piece == _next(last):
                pieces[-1] = dataclasses.replace(last, cnt=last.cnt + 1)
            else:
                pieces.append(piece)
    return pieces


def _next(piece: Piece) -> Piece:
    """The one-chunk piece that would continue ``piece`` in the same step."""
    return dataclasses.replace(piece, chunk=piece.chunk + piece.cnt, cnt=1)
