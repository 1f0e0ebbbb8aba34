"""Lower a schedule's rank programs (:func:`~stragglar.runtime.program.compile_schedule`) to a
:class:`~stragglar.runtime.device.table.DeviceProgram`.

Each round of a rank becomes: a ``put`` (staged) or ``push`` per chunk it sends that way, a
``signal`` per peer it sent to, then per peer it hears from a ``wait`` and a ``copy`` or
``reduce`` (staged) or ``pull`` or ``pull_reduce`` per chunk it lands itself, in the
interpreter's order (messages by peer, chunks ascending), so every element gets the interpreter's
additions in the interpreter's order.  Which transfers are direct is :func:`~.direct.landings`'s
choice, asked only for a launch that gives every rank's buffer (ranks in one process); the rest
are staged.  A rank's inbox has a slot per staged chunk it receives in a call, numbered in the
order it lands them; flag ``s`` of a rank is the one rank ``s`` raises, the ``k``-th of the ``K``
messages from ``s`` in a call raising it to ``call * K + k``.

With ``packets``, every transfer moves as packets instead (``put_packets`` where a staged one
puts, ``copy_packets`` or ``reduce_packets`` where it lands, the same slots) and no flag is raised
or waited on: each packet says itself whether it has come.  That is for small chunks, where a
round is latency; a packet orders nothing else, so no transfer is direct then (a push or a pull
leans on the flags' ordering).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from stragglar.runtime.device.lowering.direct import Landing, landings
from stragglar.runtime.device.table import (
    COPY,
    COPY_PACKETS,
    PULL,
    PULL_REDUCE,
    PUSH,
    PUT,
    PUT_PACKETS,
    REDUCE,
    REDUCE_PACKETS,
    SIGNAL,
    WAIT,
    DeviceProgram,
)
from stragglar.runtime.program import RankProgram

__all__ = ["lower"]


def lower(programs: Sequence[RankProgram], direct: bool = False, packets: bool = False) -> DeviceProgram:
    """The device program of a schedule's rank programs (one per rank, in rank order), with
    direct transfers where they are safe when ``direct`` (every rank's buffer reachable), or every
    transfer as packets when ``packets`` (then none is direct)."""
    n = len(programs)
    chosen = (
        {(t.sender, t.receiver, t.round, t.chunk): how for t, how in landings(programs).items()}
        if direct and not packets
        else {}
    )
    slots: dict[tuple[int, int, int, int], int] = {}  # (receiver, round, sender, chunk) -> slot
    inbox = [0] * n
    per_call: Counter[tuple[int, int]] = Counter()  # (sender, receiver) -> messages a call
    for p in programs:
        for step in p.steps:
            for m in step.recvs:
                per_call[(m.peer, p.rank)] += 1
                for chunk in m.chunks:
                    if chosen.get((m.peer, p.rank, step.round, chunk), Landing.STAGED) is Landing.STAGED:
                        slots[(p.rank, step.round, m.peer, chunk)] = inbox[p.rank]
                        inbox[p.rank] += 1
    rows = tuple(_rows(p, slots, per_call, chosen, packets) for p in programs)
    first = programs[0]
    return DeviceProgram(
        num_ranks=n,
        num_chunks=first.num_chunks,
        late_rank=first.late_rank,
        flags=n,
        inbox_slots=tuple(inbox),
        rows=rows,
        phases=first.phases,
        phase_starts=first.phase_starts or (0,),
    )


def _rows(
    p: RankProgram,
    slots: dict[tuple[int, int, int, int], int],
    per_call: Counter[tuple[int, int]],
    chosen: dict[tuple[int, int, int, int], Landing],
    packets: bool,
) -> np.ndarray:
    """Rank ``p.rank``'s rows, read-only."""
    put, copy, reduce_op = (PUT_PACKETS, COPY_PACKETS, REDUCE_PACKETS) if packets else (PUT, COPY, REDUCE)
    me = p.rank
    sent: Counter[int] = Counter()
    heard: Counter[int] = Counter()
    rows: list[tuple[int, ...]] = []
    for step in p.steps:
        r = step.round
        for m in step.sends:
            for c in m.chunks:
                slot = slots.get((m.peer, r, me, c))
                if slot is not None:
                    rows.append((put, r, m.peer, c, slot, 0, 0, 0))
                elif chosen[(me, m.peer, r, c)] is Landing.PUSH:
                    rows.append((PUSH, r, m.peer, c, 0, 0, 0, 0))
        if not packets:  # a packet carries its own mark: no flag is raised for it
            for m in step.sends:
                sent[m.peer] += 1
                rows.append((SIGNAL, r, m.peer, 0, 0, me, sent[m.peer], per_call[(me, m.peer)]))
        for m in step.recvs:
            if not packets:
                heard[m.peer] += 1
                rows.append((WAIT, r, m.peer, 0, 0, m.peer, heard[m.peer], per_call[(m.peer, me)]))
            reduce = m.reduce or (False,) * len(m.chunks)
            for c, add in zip(m.chunks, reduce, strict=True):
                slot = slots.get((me, r, m.peer, c))
                if slot is not None:
                    rows.append((reduce_op if add else copy, r, m.peer, c, slot, 0, 0, 0))
                elif chosen[(m.peer, me, r, c)] is Landing.PULL:
                    rows.append((PULL_REDUCE if add else PULL, r, m.peer, c, 0, 0, 0, 0))
    table = np.array(rows, dtype=np.int64).reshape(-1, 8)
    table.flags.writeable = False
    return table
