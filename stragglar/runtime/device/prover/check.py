"""Prove a device program from its rows: what the kernels do with it is a correct AllReduce.

First the flags' counts: a flag raised ``K`` times a call, with ordinals 1..K in its setter's
row order and every row on it saying ``per_call`` K, holds c*K + 1 .. c*K + K in call c, above
every value of the calls before, so no wait is satisfied by an earlier call and which raise a
wait sees does not depend on the call number.  Then the rows of one call are run symbolically: a
chunk's value is the set of ranks whose contributions it holds; each rank carries a vector
clock, and a ``wait`` joins the clock of the earliest ``signal`` whose value satisfies it (the
weakest thing the hardware guarantees: an acquire synchronises with the release it reads).
Refused, with the row that breaks it:

* a row out of range (an op, peer, chunk, slot or flag that does not exist, a rank sending to
  itself, an ordinal outside 1..per_call);
* a flag raised by two ranks, or out of its count (an ordinal not its place among its setter's
  raises, a ``per_call`` not the number of raises), or waited on with another count;
* a ``wait`` nobody ever satisfies (a deadlock), or one naming a peer that is not the flag's
  setter;
* an inbox slot written twice in a call (two writers of one element), or landed before any
  rank wrote it, or landed without a ``wait`` on a flag its writer raised after writing it
  (a read-after-write race), or landed into another chunk than the one written into it (the
  thread blocks of the two ranks would split the chunk differently: their flags would not
  order each other's elements);
* a contribution added twice, or a rank that ends without every rank's contribution to every
  chunk exactly once.

Calls are assumed apart: the host waits for every rank's kernel of a call before it launches
the next call's (an inbox slot is rewritten by the next call, so that is what makes it safe).
Thread blocks are lanes: every block runs every row over its own part of each chunk, with flags
of its own, so a proof of the rows over whole chunks holds for each block's part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stragglar.errors import IncorrectError
from stragglar.runtime.device.table import COPY, OPS, PUT, REDUCE, SIGNAL, WAIT, DeviceProgram, flag_value

__all__ = ["DeviceProgramError", "check", "refusal"]

CALL = 1  # the call number the rows are run for: with the counts checked, any call is the same


class DeviceProgramError(IncorrectError):
    """A device program that would race, deadlock or sum wrongly; the message says where."""


@dataclass
class _Written:
    """An inbox slot's content in this call: whose, written by which row, when, for which chunk."""

    value: int
    writer: int
    row: int
    time: int
    chunk: int


@dataclass
class _Rank:
    rank: int
    clock: list[int]
    buffer: list[int]  # per chunk: the bit set of ranks whose contributions it holds
    inbox: dict[int, _Written] = field(default_factory=dict)
    pc: int = 0


def refusal(program: DeviceProgram) -> str | None:
    """Why ``program`` is not a correct AllReduce, or None."""
    try:
        check(program)
    except DeviceProgramError as error:
        return str(error)
    return None


def check(program: DeviceProgram) -> None:
    """Prove ``program`` or raise :class:`DeviceProgramError` naming the first row that breaks it."""
    _check_ranges(program)
    setters = _setters(program)
    _run_call(program, setters)


def _where(program: DeviceProgram, rank: int, index: int) -> str:
    row = program.rows[rank][index]
    phase, number = program.phase_round(int(row[1])) if int(row[1]) >= 0 else ("?", int(row[1]))
    return f"rank {rank} row {index} ({OPS[int(row[0])]}, round {number} of phase {phase!r})"


def _fail(program: DeviceProgram, rank: int, index: int, why: str) -> DeviceProgramError:
    return DeviceProgramError(f"device program refused: {_where(program, rank, index)} {why}")


def _check_ranges(program: DeviceProgram) -> None:
    n, c = program.num_ranks, program.num_chunks
    if len(program.rows) != n or len(program.inbox_slots) != n:
        raise DeviceProgramError(f"device program refused: {n} ranks but {len(program.rows)} tables")
    for rank, rows in enumerate(program.rows):
        if rows.ndim != 2 or rows.shape[1] != 8:
            raise DeviceProgramError(f"device program refused: rank {rank}'s table is not rows of 8")
        for index, (op, rnd, peer, chunk, slot, flag, ordinal, per_call) in enumerate(rows.tolist()):
            if not 0 <= op < len(OPS):
                raise DeviceProgramError(f"device program refused: rank {rank} row {index} has op {op}")
            if rnd < 0:
                raise _fail(program, rank, index, f"has round {rnd}")
            if not 0 <= peer < n or (peer == rank and op in (PUT, SIGNAL, WAIT)):
                raise _fail(program, rank, index, f"names rank {peer} as its peer")
            if op in (PUT, COPY, REDUCE):
                owner = peer if op == PUT else rank
                if not 0 <= chunk < c:
                    raise _fail(program, rank, index, f"names chunk {chunk} of {c}")
                if not 0 <= slot < program.inbox_slots[owner]:
                    raise _fail(program, rank, index, f"names slot {slot} of rank {owner}'s inbox")
            else:
                if not 0 <= flag < program.flags:
                    raise _fail(program, rank, index, f"names flag {flag} of {program.flags}")
                if not 1 <= ordinal <= per_call:
                    raise _fail(program, rank, index, f"has ordinal {ordinal} outside 1..{per_call}")


def _setters(program: DeviceProgram) -> dict[tuple[int, int], int]:
    """(holder, flag) -> the one rank that raises it, ``K`` times a call with ordinals 1..K in
    its row order, every row on the flag (its raises and its waits) saying ``per_call`` K.  So
    a flag's values in call c are c*K + 1 .. c*K + K, above every value of the calls before:
    which raise a wait sees does not depend on the call number, and one call stands for all."""
    setters: dict[tuple[int, int], int] = {}
    raised: dict[tuple[int, int], list[tuple[int, int, int]]] = {}  # (ordinal, per_call, row)
    for rank, rows in enumerate(program.rows):
        for index, row in enumerate(rows.tolist()):
            if row[0] != SIGNAL:
                continue
            key = (row[2], row[5])
            other = setters.setdefault(key, rank)
            if other != rank:
                raise _fail(
                    program,
                    rank,
                    index,
                    f"raises flag {row[5]} of rank {row[2]}, which rank {other} raises too",
                )
            raised.setdefault(key, []).append((row[6], row[7], index))
    for (holder, flag), settings in raised.items():
        times = len(settings)
        for ordinal, (got, per_call, index) in enumerate(settings, start=1):
            if (got, per_call) != (ordinal, times):
                raise _fail(
                    program,
                    setters[(holder, flag)],
                    index,
                    f"raises flag {flag} of rank {holder} as its setting {got} of {per_call} a call, "
                    f"but it is setting {ordinal} of the {times} its rows make",
                )
    for rank, rows in enumerate(program.rows):
        for index, row in enumerate(rows.tolist()):
            times = len(raised.get((rank, row[5]), ()))
            if row[0] == WAIT and times and row[7] != times:
                raise _fail(
                    program,
                    rank,
                    index,
                    f"waits on flag {row[5]} as raised {row[7]} times a call, but it is raised {times} times",
                )
    return setters


def _run_call(program: DeviceProgram, setters: dict[tuple[int, int], int]) -> None:
    n, everyone = program.num_ranks, (1 << program.num_ranks) - 1
    ranks = [_Rank(r, [0] * n, [1 << r] * program.num_chunks) for r in range(n)]
    stores: dict[tuple[int, int], list[tuple[int, list[int]]]] = {}  # (holder, flag) -> (value, clock)
    tables = [rows.tolist() for rows in program.rows]
    while True:
        moved = False
        for state in ranks:
            moved |= _advance(program, state, tables[state.rank], ranks, stores, setters)
        if all(state.pc == len(tables[state.rank]) for state in ranks):
            break
        if not moved:
            raise _deadlock(program, ranks, tables)
    for state in ranks:
        for chunk, value in enumerate(state.buffer):
            if value != everyone:
                have = [r for r in range(n) if value >> r & 1]
                raise DeviceProgramError(
                    f"device program refused: rank {state.rank} ends with chunk {chunk} summing ranks "
                    f"{have}, not all {n}"
                )


def _advance(
    program: DeviceProgram,
    state: _Rank,
    rows: list[list[int]],
    ranks: list[_Rank],
    stores: dict[tuple[int, int], list[tuple[int, list[int]]]],
    setters: dict[tuple[int, int], int],
) -> bool:
    """Run ``state``'s rows until one waits for a flag not yet raised; whether any ran."""
    me, start = state.rank, state.pc
    while state.pc < len(rows):
        index = state.pc
        op, _, peer, chunk, slot, flag, ordinal, per_call = rows[index]
        if op == WAIT:
            want = flag_value(CALL, ordinal, per_call)
            if setters.get((me, flag)) != peer:
                raise _fail(
                    program,
                    me,
                    index,
                    f"waits for rank {peer} on flag {flag}, which rank {peer} never raises",
                )
            seen = next((clock for value, clock in stores.get((me, flag), ()) if value >= want), None)
            if seen is None:
                break
            state.clock = [max(a, b) for a, b in zip(state.clock, seen, strict=True)]
        state.clock[me] += 1
        if op == PUT:
            target = ranks[peer].inbox
            if slot in target:
                other = target[slot]
                raise _fail(
                    program,
                    me,
                    index,
                    f"writes slot {slot} of rank {peer}'s inbox, which "
                    f"{_where(program, other.writer, other.row)} writes too",
                )
            target[slot] = _Written(state.buffer[chunk], me, index, state.clock[me], chunk)
        elif op == SIGNAL:
            stores.setdefault((peer, flag), []).append(
                (flag_value(CALL, ordinal, per_call), list(state.clock))
            )
        elif op in (COPY, REDUCE):
            _land(program, state, index, op, chunk, slot)
        state.pc += 1
    return state.pc > start


def _land(program: DeviceProgram, state: _Rank, index: int, op: int, chunk: int, slot: int) -> None:
    me = state.rank
    written = state.inbox.get(slot)
    if written is None or state.clock[written.writer] < written.time:
        writer = _writer(program, me, slot) if written is None else (written.writer, written.row)
        if writer is None:
            raise _fail(program, me, index, f"lands slot {slot} of its inbox, which no rank writes")
        raise _fail(
            program,
            me,
            index,
            f"reads slot {slot}, which {_where(program, *writer)} writes, without waiting for a flag "
            "raised after that write",
        )
    if written.chunk != chunk:
        raise _fail(
            program, me, index, f"lands slot {slot}, written from chunk {written.chunk}, into chunk {chunk}"
        )
    if op == COPY:
        state.buffer[chunk] = written.value
        return
    if state.buffer[chunk] & written.value:
        twice = [r for r in range(program.num_ranks) if state.buffer[chunk] & written.value >> r & 1]
        raise _fail(program, me, index, f"adds the contributions of ranks {twice} to chunk {chunk} twice")
    state.buffer[chunk] |= written.value


def _writer(program: DeviceProgram, holder: int, slot: int) -> tuple[int, int] | None:
    """The first (rank, row) that puts into ``slot`` of ``holder``'s inbox, if any does."""
    for rank, rows in enumerate(program.rows):
        for index, row in enumerate(rows.tolist()):
            if row[0] == PUT and row[2] == holder and row[4] == slot:
                return rank, index
    return None


def _deadlock(
    program: DeviceProgram, ranks: list[_Rank], tables: list[list[list[int]]]
) -> DeviceProgramError:
    """The first rank stuck on a wait, as an error."""
    state = next(s for s in ranks if s.pc < len(tables[s.rank]))
    _, _, peer, _, _, flag, ordinal, per_call = tables[state.rank][state.pc]
    want = flag_value(CALL, ordinal, per_call)
    return _fail(
        program,
        state.rank,
        state.pc,
        f"waits for flag {flag} >= {want} (call {CALL}), which rank {peer} never raises that high "
        "(a deadlock)",
    )
