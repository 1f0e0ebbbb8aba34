"""The device program's prover is sound against every single change to small programs.

The hand-made mutants of test_runtime_device_prover.py, _direct.py and _packets.py are the
changes we thought of.  Here every small program (staged, direct and packets; StragglAR, Ring,
halving/doubling, Direct) is changed in every way one change can: any cell of any row set to any
value in its column's range (every op code included), a row deleted, a row repeated, a row
swapped with the next.  Each changed program the prover accepts must still sum right in two
calls in a row, in every order drawn by a run that knows nothing of the prover
(:func:`run_calls`); the run deadlocking fails it too.  Changes the run cannot tell apart (a
column their row's op does not use: :func:`run_view`) are run once for all.  The prover may
refuse a harmless change (that costs only speed); it must never accept a harmful one.  The
accepted changes are counted, so the property is never checked on nothing.

The run is weaker than the rows in order: a rank's writes (its input, its puts, its pushes, its
landings) reach the others' view only when the run flushes them, one location at a time in any
order, or at the rank's next ``signal`` (a release: all of them, before the flag).  So a rank
that waited for a flag sees what its setter wrote before it, and one that landed packets sees
those packets and nothing else of their sender's: the weakest thing each promises.  Packets
carry the call's number; a plain landing of packets reads poison, a packet landing of plain
elements waits forever."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from test_runtime_device_prover_direct import copies, direct, kept_that_round, lowered, sums, wholly_direct

from stragglar.runtime.device.prover import refusal
from stragglar.runtime.device.table import (
    COPY,
    COPY_PACKETS,
    OPS,
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
    flag_value,
)

ORDERS = 12  # orders drawn per accepted change (each also runs two calls)
BASE = 1000  # more than any count of one rank's contributions a wrong program could make

Location = tuple[str, int, int]  # ("chunk", rank, chunk) or ("inbox", rank, slot)


@dataclass
class Memory:
    """What every rank sees (``seen``), each rank's writes not yet flushed into it (``pending``,
    which that rank alone sees), and the flags (stored at once, after their setter's flush).
    Inbox entries are ("plain", value) or ("packets", call, value)."""

    seen: dict[Location, object] = field(default_factory=dict)
    pending: list[dict[Location, object]] = field(default_factory=list)
    flags: dict[tuple[int, int], int] = field(default_factory=dict)

    def view(self, rank: int, where: Location) -> object:
        return self.pending[rank].get(where, self.seen.get(where))

    def flush(self, rank: int) -> None:
        self.seen.update(self.pending[rank])
        self.pending[rank].clear()


def run_calls(program: DeviceProgram, seed: int, calls: int = 1) -> list[list[list[int]]]:
    """Every rank's buffers after each of ``calls`` calls, each row atomic, a rank's row or a
    flush of one of a rank's writes drawn at random at each step (some ranks straggling, writes
    flushed soon or late, drawn per call); memory, inboxes and flags are kept from call to call,
    and a call begins once every rank ended the one before (all flushed, as the host sees to).
    Rank r's input is BASE**r in every chunk, written by its caller into its pending writes; a
    chunk no write reached reads as poison (more than any right sum)."""
    rng = random.Random(seed)
    n, chunks = program.num_ranks, program.num_chunks
    memory = Memory(pending=[{} for _ in range(n)])
    tables = [list(rows) for rows in run_view(program)]
    buffers = []
    poison = BASE**n * 7
    for call in range(1, calls + 1):
        for rank in range(n):
            memory.pending[rank].update({("chunk", rank, c): BASE**rank for c in range(chunks)})
        _call(tables, call, memory, rng, poison)
        buffers.append(
            [[_number(memory.seen.get(("chunk", r, c)), poison) for c in range(chunks)] for r in range(n)]
        )
    return buffers


# What the run reads of a row, by its op (COLUMNS: op, round, peer, chunk, slot, flag, ordinal,
# per_call): a row's other columns are zero in its run view, so the run cannot see them.
READS = {
    PUT: (2, 3, 4),
    PUT_PACKETS: (2, 3, 4),
    SIGNAL: (2, 5, 6, 7),
    WAIT: (5, 6, 7),
    PUSH: (2, 3),
    PULL: (2, 3),
    PULL_REDUCE: (2, 3),
    COPY: (3, 4),
    REDUCE: (3, 4),
    COPY_PACKETS: (3, 4),
    REDUCE_PACKETS: (3, 4),
}
assert sorted(READS) == list(range(len(OPS)))

RunView = tuple[tuple[tuple[int, ...], ...], ...]


def run_view(program: DeviceProgram) -> RunView:
    """Every rank's rows as :func:`run_calls` sees them, the only form it reads them in: so two
    programs of one view run alike, and one run of the view stands for all of them (a thousand
    accepted changes of a program make a hundred views or fewer)."""
    return tuple(
        tuple(
            tuple(v if c == 0 or c in READS[row[0]] else 0 for c, v in enumerate(row))
            for row in rows.tolist()
        )
        for rows in program.rows
    )


def _number(value: object, poison: int) -> int:
    return value if isinstance(value, int) else poison


def _call(
    tables: list[list[tuple[int, ...]]], call: int, memory: Memory, rng: random.Random, poison: int
) -> None:
    """One call of :func:`run_calls`."""
    pcs = [0] * len(tables)
    eager = rng.choice((0.05, 0.5, 0.95))  # how soon writes are flushed, rather than rows run
    speed = [rng.choice((0.02, 1.0)) for _ in tables]  # some ranks straggle

    def ready(rank: int) -> bool:
        if pcs[rank] == len(tables[rank]):
            return False
        op, _, _, _, slot, flag, ordinal, per_call = tables[rank][pcs[rank]]
        if op == WAIT:
            return memory.flags.get((rank, flag), 0) >= flag_value(call, ordinal, per_call)
        if op in (COPY_PACKETS, REDUCE_PACKETS):
            entry = memory.view(rank, ("inbox", rank, slot))
            return isinstance(entry, tuple) and entry[:2] == ("packets", call)
        return True

    while True:
        movable = [r for r in range(len(tables)) if ready(r)]
        flushable = [r for r in range(len(tables)) if memory.pending[r]]
        if not movable and not flushable:
            break
        if flushable and (not movable or rng.random() < eager):
            rank = rng.choice(flushable)
            where = rng.choice(list(memory.pending[rank]))
            memory.seen[where] = memory.pending[rank].pop(where)
            continue
        me = rng.choices(movable, [speed[r] for r in movable])[0]
        op, _, peer, chunk, slot, flag, ordinal, per_call = tables[me][pcs[me]]
        pcs[me] += 1
        mine = ("chunk", me, chunk)
        value = _number(memory.view(me, mine), poison)
        if op == PUT:
            memory.pending[me][("inbox", peer, slot)] = ("plain", value)
        elif op == PUT_PACKETS:
            memory.pending[me][("inbox", peer, slot)] = ("packets", call, value)
        elif op == SIGNAL:
            memory.flush(me)
            memory.flags[(peer, flag)] = flag_value(call, ordinal, per_call)
        elif op == PUSH:
            memory.pending[me][("chunk", peer, chunk)] = value
        elif op in (COPY, REDUCE, COPY_PACKETS, REDUCE_PACKETS, PULL, PULL_REDUCE):
            memory.pending[me][mine] = _received(memory, me, op, peer, chunk, slot, poison) + (
                value if op in (REDUCE, REDUCE_PACKETS, PULL_REDUCE) else 0
            )
    assert pcs == [len(t) for t in tables], f"deadlocked in call {call}"  # and every write flushed


def _received(memory: Memory, me: int, op: int, peer: int, chunk: int, slot: int, poison: int) -> int:
    """What a landing or a pull reads: a pull the peer's chunk as this rank sees it, a plain
    landing a plain entry of its inbox, a packet landing (run only once ready) its packets."""
    if op in (PULL, PULL_REDUCE):
        return _number(memory.view(me, ("chunk", peer, chunk)), poison)
    entry = memory.view(me, ("inbox", me, slot))
    if not isinstance(entry, tuple):
        return poison
    if op in (COPY, REDUCE):
        return _number(entry[1], poison) if entry[0] == "plain" else poison  # marks read as data
    return _number(entry[2], poison)


def sums_right(program: DeviceProgram, seed: int, calls: int = 1) -> bool:
    """Whether every rank ends every call with every chunk the sum of every rank's input."""
    total = sum(BASE**r for r in range(program.num_ranks))
    return all(
        v == total for buffers in run_calls(program, seed, calls) for chunks in buffers for v in chunks
    )


def as_packets(program: DeviceProgram) -> DeviceProgram:
    """A staged program with every put, copy and reduce made its packet form and every signal
    and wait dropped, the slots kept: what ``lower(..., packets=True)`` makes (and what
    test_runtime_device_prover_packets.py proves of every schedule)."""
    into = {PUT: PUT_PACKETS, COPY: COPY_PACKETS, REDUCE: REDUCE_PACKETS}
    tables = []
    for rows in program.rows:
        kept = rows[~np.isin(rows[:, 0], (SIGNAL, WAIT))].copy()
        kept[:, 0] = [into[int(op)] for op in kept[:, 0]]
        tables.append(kept)
    return dataclasses.replace(program, rows=tuple(tables))


def programs() -> dict[str, DeviceProgram]:
    stragglar = lowered("stragglar", 4)
    return {
        "stragglar 4 staged": stragglar,
        "stragglar 4 chunked staged": lowered("stragglar", 3, 4),
        "ring 3 staged": lowered("ring", 3),
        "direct 3 staged": lowered("direct", 3),
        "ring 4 direct": wholly_direct("ring", 4),
        "rhd 4 direct": wholly_direct("rhd", 4),
        "stragglar 4 direct": direct(
            stragglar, copies(stragglar), {t for t in sums(stragglar) if kept_that_round(stragglar, t)}
        ),
        "ring 3 packets": as_packets(lowered("ring", 3)),
        "stragglar 4 packets": as_packets(stragglar),
        "direct 3 packets": as_packets(lowered("direct", 3)),
    }


def changes(program: DeviceProgram) -> Iterator[tuple[str, DeviceProgram]]:
    """Every program one change away from ``program``, each with what was changed."""
    tables = program.rows
    highest = np.max(np.concatenate(tables), axis=0)
    limits = [len(OPS), *(int(h) + 2 for h in highest[1:])]  # op codes; else one past the largest used
    limits[2] = program.num_ranks
    limits[3] = program.num_chunks
    for rank, rows in enumerate(tables):
        for index in range(len(rows)):
            for column, limit in enumerate(limits):
                for value in range(limit):
                    if value != rows[index, column]:
                        changed = rows.copy()
                        changed[index, column] = value
                        yield (
                            f"rank {rank} row {index} column {column} = {value}",
                            _with(program, rank, changed),
                        )
            yield f"rank {rank} row {index} deleted", _with(program, rank, np.delete(rows, index, axis=0))
            yield (
                f"rank {rank} row {index} repeated",
                _with(program, rank, np.insert(rows, index, rows[index], 0)),
            )
            if index + 1 < len(rows):
                order = [*range(index), index + 1, index, *range(index + 2, len(rows))]
                yield f"rank {rank} rows {index} and {index + 1} swapped", _with(program, rank, rows[order])


def _with(program: DeviceProgram, rank: int, rows: np.ndarray) -> DeviceProgram:
    tables = tuple(rows if r == rank else t for r, t in enumerate(program.rows))
    return dataclasses.replace(program, rows=tables)


@pytest.mark.parametrize("name", list(programs()))
def test_every_single_change_the_prover_accepts_still_sums_right(name: str) -> None:
    program = programs()[name]
    assert refusal(program) is None and all(sums_right(program, seed, calls=2) for seed in range(ORDERS))
    accepted: dict[RunView, tuple[str, DeviceProgram]] = {}  # one accepted change of each view
    refused = 0
    for change, changed in changes(program):
        if refusal(changed) is not None:
            refused += 1
            continue
        accepted.setdefault(run_view(changed), (change, changed))
    for change, changed in accepted.values():
        for seed in range(ORDERS):
            try:
                right = sums_right(changed, seed, calls=2)
            except (AssertionError, KeyError, IndexError) as failed:
                pytest.fail(f"{name}, {change}: accepted, and its run failed: {failed!r}")
            assert right, f"{name}, {change}: accepted, and it sums wrong (order {seed})"
    assert len(accepted) > 1 and refused > 0, (len(accepted), refused)  # views that differ, and refusals
