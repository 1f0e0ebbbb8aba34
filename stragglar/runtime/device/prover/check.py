"""Prove a device program from its rows: what the kernels do with it is a correct AllReduce.

First the flags' counts: a flag raised ``K`` times a call, with ordinals 1..K in its setter's
row order and every row on it saying ``per_call`` K, holds c*K + 1 .. c*K + K in call c, above
every value of the calls before, so no wait is satisfied by an earlier call and which raise a
wait sees does not depend on the call number.  Then the rows of one call are run symbolically: a
chunk's value is the set of ranks whose contributions it holds; each rank carries a vector
clock, and a ``wait`` joins the clock of the earliest ``signal`` whose value satisfies it (the
weakest thing the hardware guarantees: an acquire synchronises with the release it reads).
Every access to a buffer chunk (a ``put``, ``push`` or ``pull`` reads its source, a landing,
``push`` or ``pull`` writes its destination, a sum reads it too) is checked against the accesses
before it (:mod:`~stragglar.runtime.device.prover.race`): a read must have the chunk's last write
in its past, a write the last write and every read since.  That is what makes a direct transfer
safe: no inbox holds the sender's value for it, so only happens-before decides what a pull reads
and what a push overwrites; where it orders every conflicting pair, each chunk's value at each
read is the one the symbolic run computes, whatever order the hardware takes.

A packet landing (``copy_packets``, ``reduce_packets``) waits, in the symbolic run, for its slot
to be written by a ``put_packets`` of the call, and joins nothing: each packet carries its own
data and the call's mark in one store, and the reader learns those bytes and nothing else (no
release, no acquire), so the writer's other accesses are not in the reader's past.  The slot's
value needs no more (it is the put's value, written once a call); anything else a packet seems
to order (a pull of the writer's chunk, a push into a chunk the writer read) is left to the race
checks, which refuse it.  Refused, with the row that breaks it:

* a row out of range (an op, peer, chunk, slot or flag that does not exist, a rank sending to
  itself, pushing to, pulling from or naming itself as a packet's writer, an ordinal outside
  1..per_call);
* a flag raised by two ranks, or out of its count (an ordinal not its place among its setter's
  raises, a ``per_call`` not the number of raises), or waited on with another count;
* a ``wait`` nobody ever satisfies, or a packet landing whose slot's writer never runs (a
  deadlock), or either naming a peer that is not the flag's setter or the slot's writer;
* an inbox slot written twice in a call (two writers of one element), or landed before any
  rank wrote it, or landed without a ``wait`` on a flag its writer raised after writing it
  (a read-after-write race), or landed into another chunk than the one written into it (the
  thread blocks of the two ranks would split the chunk differently: their flags would not
  order each other's elements), or landed as packets where it is written as plain elements (the
  marks polled for never come) or as plain elements where it is written as packets (the marks
  would be read as data);
* a chunk read before its last write is in the reader's past (a read-after-write race: a pull
  without its wait), or written before its last write (write after write: two unordered
  pushes) or a read since (write after read: a push into a chunk its owner has yet to send, a
  sender overwriting a chunk its peer has yet to pull) is in the writer's past;
* a contribution added twice, or a rank that ends without every rank's contribution to every
  chunk exactly once;
* a rank that ends with a chunk summed in another order than the schedule's (given the schedule:
  the order its rounds add in, which the interpreter follows) or, without it, than another rank's.
  Floating-point addition is commutative but not associative, so a table that adds the same
  contributions in another grouping ends with other bits: a sum moved one round later gave 0.0
  where the interpreter gives 2.0, and replicas that disagree drift apart in training.  A value
  is therefore also tracked as the tree of its additions (each a pair, either way round), interned
  to a number (:class:`~stragglar.verify.orders.Orders`).

A rank's input is assumed written before its own kernel starts, and nothing more: a peer may
touch it only after a flag that rank raised in the call (across processes nothing else orders a
rank's caller before its peers' kernels).  Calls are assumed apart: no rank's next call starts
before every rank's kernel of this call has ended (the next call rewrites inbox slots and pushes
into and pulls from chunks, so that is what makes it safe; the launches wait for it).
Thread blocks are lanes: every block runs every row over its own part of each chunk (the same
part on every rank, so a push or pull stays within the block's part), with flags of its own,
so a proof of the rows over whole chunks holds for each block's part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stragglar.errors import IncorrectError
from stragglar.runtime.device.prover.race import INPUT_ROW, Access, ChunkAccesses
from stragglar.runtime.device.table import (
    COPY,
    COPY_PACKETS,
    DIRECT,
    OPS,
    PACKETS,
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
from stragglar.schedule import Schedule
from stragglar.verify.orders import Orders, final_orders

__all__ = ["DeviceProgramError", "check", "refusal"]

CALL = 1  # the call number the rows are run for: with the counts checked, any call is the same
PUTS = (PUT, PUT_PACKETS)  # the ops that write a peer's inbox slot
LANDINGS = (COPY, REDUCE, COPY_PACKETS, REDUCE_PACKETS)  # the ops that read their own inbox slot
PACKET_LANDINGS = (COPY_PACKETS, REDUCE_PACKETS)


class DeviceProgramError(IncorrectError):
    """A device program that would race, deadlock or sum wrongly; the message says where."""


_Value = tuple[int, int]  # (bit set of the ranks whose contributions it holds, its order's number)


@dataclass
class _Written:
    """An inbox slot's content in this call: whose, written by which row, when, for which chunk,
    and whether as packets."""

    value: _Value
    writer: int
    row: int
    time: int
    chunk: int
    packets: bool


@dataclass
class _Rank:
    rank: int
    clock: list[int]
    buffer: list[_Value]  # per chunk: the ranks whose contributions it holds, in which order
    inbox: dict[int, _Written] = field(default_factory=dict)
    pc: int = 0


def refusal(program: DeviceProgram, schedule: Schedule | None = None) -> str | None:
    """Why ``program`` is not a correct AllReduce (in ``schedule``'s order of additions, if
    given), or None."""
    try:
        check(program, schedule)
    except DeviceProgramError as error:
        return str(error)
    return None


def check(program: DeviceProgram, schedule: Schedule | None = None) -> None:
    """Prove ``program`` or raise :class:`DeviceProgramError` naming the first row that breaks it.

    With ``schedule`` (the one it was lowered from), every rank must end with every chunk summed
    in the order the schedule's rounds add it, which the interpreter follows; without it, in one
    order on every rank."""
    _check_ranges(program)
    setters = _setters(program)
    orders = Orders(program.num_ranks)
    ends = _run_call(program, setters, orders)
    _check_orders(program, ends, orders, schedule)


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
            if not 0 <= peer < n or (peer == rank and op in (PUT, SIGNAL, WAIT, *DIRECT, *PACKETS)):
                raise _fail(program, rank, index, f"names rank {peer} as its peer")
            if op in (SIGNAL, WAIT):
                if not 0 <= flag < program.flags:
                    raise _fail(program, rank, index, f"names flag {flag} of {program.flags}")
                if not 1 <= ordinal <= per_call:
                    raise _fail(program, rank, index, f"has ordinal {ordinal} outside 1..{per_call}")
                continue
            if not 0 <= chunk < c:
                raise _fail(program, rank, index, f"names chunk {chunk} of {c}")
            owner = peer if op in PUTS else rank
            if op in (*PUTS, *LANDINGS) and not 0 <= slot < program.inbox_slots[owner]:
                raise _fail(program, rank, index, f"names slot {slot} of rank {owner}'s inbox")


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


@dataclass
class _Call:
    """The state of one call's symbolic run: every rank, every flag's stores, every chunk's accesses."""

    program: DeviceProgram
    setters: dict[tuple[int, int], int]
    orders: Orders
    ranks: list[_Rank]
    # (holder, flag) -> the (value, clock) of each signal on it so far
    stores: dict[tuple[int, int], list[tuple[int, list[int]]]] = field(default_factory=dict)
    accesses: ChunkAccesses = field(default_factory=ChunkAccesses)
    # (holder, slot) -> the first (rank, row) whose put or put_packets writes it, from the rows
    writers: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)


def _run_call(program: DeviceProgram, setters: dict[tuple[int, int], int], orders: Orders) -> list[list[int]]:
    """Run one call's rows; every rank's chunks' orders at the end (each chunk checked complete)."""
    n, everyone = program.num_ranks, (1 << program.num_ranks) - 1
    ranks = [_Rank(r, [0] * n, [(1 << r, r)] * program.num_chunks) for r in range(n)]
    tables = [rows.tolist() for rows in program.rows]
    call = _Call(program, setters, orders, ranks, writers=_writers(tables))
    while True:
        moved = False
        for state in call.ranks:
            moved |= _advance(call, state, tables[state.rank])
        if all(state.pc == len(tables[state.rank]) for state in call.ranks):
            break
        if not moved:
            raise _deadlock(call, tables)
    for state in call.ranks:
        for chunk, (value, _) in enumerate(state.buffer):
            if value != everyone:
                have = [r for r in range(n) if value >> r & 1]
                raise DeviceProgramError(
                    f"device program refused: rank {state.rank} ends with chunk {chunk} summing ranks "
                    f"{have}, not all {n}"
                )
    return [[order for _, order in state.buffer] for state in call.ranks]


def _check_orders(
    program: DeviceProgram, ends: list[list[int]], orders: Orders, schedule: Schedule | None
) -> None:
    """Every rank ends with every chunk in the schedule's order of additions (without a schedule,
    in rank 0's)."""
    expected = ends[0] if schedule is None else _schedule_orders(program, schedule, orders)
    whose = "rank 0's" if schedule is None else "the schedule's"
    for rank, chunks in enumerate(ends):
        for chunk, order in enumerate(chunks):
            want = expected[chunk] if schedule is None else expected[rank * program.num_chunks + chunk]
            if order != want:
                raise DeviceProgramError(
                    f"device program refused: rank {rank} ends with chunk {chunk} added as "
                    f"{orders.text(order)}, not in {whose} order {orders.text(want)} (other bits in "
                    "floating point)"
                )


def _schedule_orders(program: DeviceProgram, schedule: Schedule, orders: Orders) -> list[int]:
    """Each (rank, chunk)'s order of additions at the end of ``schedule`` (the IR's own semantics,
    run from the schedule, not from anything the lowering made of it), index ``rank * C + chunk``."""
    n, c = schedule.num_ranks, schedule.num_chunks
    if (n, c) != (program.num_ranks, program.num_chunks):
        raise DeviceProgramError(
            f"device program refused: it is for {program.num_ranks} ranks and {program.num_chunks} "
            f"chunks, the schedule for {n} and {c}"
        )
    return final_orders(schedule, orders)


def _advance(call: _Call, state: _Rank, rows: list[list[int]]) -> bool:
    """Run ``state``'s rows until one waits for a flag not yet raised or packets not yet written;
    whether any ran."""
    program, me, start = call.program, state.rank, state.pc
    while state.pc < len(rows):
        index = state.pc
        op, _, peer, chunk, slot, flag, ordinal, per_call = rows[index]
        if op == WAIT:
            want = flag_value(CALL, ordinal, per_call)
            if call.setters.get((me, flag)) != peer:
                raise _fail(
                    program,
                    me,
                    index,
                    f"waits for rank {peer} on flag {flag}, which rank {peer} never raises",
                )
            seen = next((clock for value, clock in call.stores.get((me, flag), ()) if value >= want), None)
            if seen is None:
                break
            state.clock = [max(a, b) for a, b in zip(state.clock, seen, strict=True)]
        elif op in PACKET_LANDINGS and _slot(call, state, index, True, peer, slot) is None:
            break  # its packets are not written yet; landing them joins no clock
        state.clock[me] += 1
        if op in PUTS:
            _access(call, state, index, me, chunk, writes=False)
            target = call.ranks[peer].inbox
            if slot in target:
                other = target[slot]
                raise _fail(
                    program,
                    me,
                    index,
                    f"writes slot {slot} of rank {peer}'s inbox, which "
                    f"{_where(program, other.writer, other.row)} writes too",
                )
            target[slot] = _Written(state.buffer[chunk], me, index, state.clock[me], chunk, op == PUT_PACKETS)
        elif op == SIGNAL:
            call.stores.setdefault((peer, flag), []).append(
                (flag_value(CALL, ordinal, per_call), list(state.clock))
            )
        elif op in LANDINGS:
            value = _landed(call, state, index, op in PACKET_LANDINGS, peer, chunk, slot)
            _into(call, state, index, chunk, value, op in (REDUCE, REDUCE_PACKETS))
        elif op == PUSH:
            _access(call, state, index, me, chunk, writes=False)
            _access(call, state, index, peer, chunk, writes=True)
            call.ranks[peer].buffer[chunk] = state.buffer[chunk]
        elif op in (PULL, PULL_REDUCE):
            _access(call, state, index, peer, chunk, writes=False)
            _into(call, state, index, chunk, call.ranks[peer].buffer[chunk], op == PULL_REDUCE)
        state.pc += 1
    return state.pc > start


def _slot(call: _Call, state: _Rank, index: int, packets: bool, peer: int, slot: int) -> _Written | None:
    """What the landing at ``index`` (of ``packets`` or plain elements) reads of ``slot`` of the
    rank's inbox: the write there so far (None if none yet), refused where the slot is written
    the other way (the rows say which, before it is written), by no rank, or, for packets, by
    another rank than the row's ``peer``."""
    program, me = call.program, state.rank
    written = state.inbox.get(slot)
    writer = (written.writer, written.row) if written is not None else call.writers.get((me, slot))
    if writer is None:
        raise _fail(program, me, index, f"lands slot {slot} of its inbox, which no rank writes")
    by_packets = (
        written.packets if written is not None else int(program.rows[writer[0]][writer[1], 0]) == PUT_PACKETS
    )
    if by_packets and not packets:
        raise _fail(
            program,
            me,
            index,
            f"reads slot {slot} as plain elements, which {_where(program, *writer)} writes as packets "
            "(it would read their marks as data)",
        )
    if packets and not by_packets:
        raise _fail(
            program,
            me,
            index,
            f"polls slot {slot} for packets, which {_where(program, *writer)} writes as plain elements "
            "(the marks it polls for never come)",
        )
    if packets and writer[0] != peer:
        raise _fail(
            program, me, index, f"lands slot {slot} as rank {peer}'s, which {_where(program, *writer)} writes"
        )
    return written


def _landed(call: _Call, state: _Rank, index: int, packets: bool, peer: int, chunk: int, slot: int) -> _Value:
    """The value a landing of ``slot`` into ``chunk`` reads, once its write is in the rank's past
    (plain elements: through a flag) or done (packets: each carries its own data)."""
    program, me = call.program, state.rank
    written = _slot(call, state, index, packets, peer, slot)
    if written is None or (not written.packets and state.clock[written.writer] < written.time):
        writer = call.writers[(me, slot)] if written is None else (written.writer, written.row)
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
    return written.value


def _into(call: _Call, state: _Rank, index: int, chunk: int, value: _Value, adds: bool) -> None:
    """Set (a copy, a pull) or add (a reduce, a pull_reduce) ``value`` into the rank's ``chunk``.
    A sum reads the chunk too, but its write's check covers that read: the same last write must
    be in the rank's past."""
    _access(call, state, index, state.rank, chunk, writes=True)
    if not adds:
        state.buffer[chunk] = value
        return
    (have, order), (adding, added) = state.buffer[chunk], value
    if have & adding:
        twice = [r for r in range(call.program.num_ranks) if (have & adding) >> r & 1]
        raise _fail(
            call.program, state.rank, index, f"adds the contributions of ranks {twice} to chunk {chunk} twice"
        )
    state.buffer[chunk] = (have | adding, call.orders.add(order, added))


def _access(call: _Call, state: _Rank, index: int, owner: int, chunk: int, writes: bool) -> None:
    """Record this row's read or write of ``owner``'s ``chunk``, refused if it races with one before."""
    access = Access(state.rank, index, state.clock[state.rank])
    record = call.accesses.write if writes else call.accesses.read
    race = record(owner, chunk, access, state.clock)
    if race is None:
        return
    mine, theirs = ("write" if writes else "read"), ("write" if race.earlier_writes else "read")
    earlier = (
        f"rank {race.earlier.rank}'s caller"
        if race.earlier.row == INPUT_ROW
        else _where(call.program, race.earlier.rank, race.earlier.row)
    )
    raise _fail(
        call.program,
        state.rank,
        index,
        f"{mine}s chunk {chunk} of rank {owner}, which {earlier} {theirs}s, without waiting for a flag "
        f"raised after that {theirs} (a {mine}-after-{theirs} race)",
    )


def _writers(tables: list[list[list[int]]]) -> dict[tuple[int, int], tuple[int, int]]:
    """(holder, slot) -> the first (rank, row) that puts or puts packets into it, for every slot
    any row writes (a second writer is refused when it runs)."""
    writers: dict[tuple[int, int], tuple[int, int]] = {}
    for rank, rows in enumerate(tables):
        for index, row in enumerate(rows):
            if row[0] in PUTS:
                writers.setdefault((row[2], row[4]), (rank, index))
    return writers


def _deadlock(call: _Call, tables: list[list[list[int]]]) -> DeviceProgramError:
    """The first rank stuck on a wait or a packet landing, as an error."""
    program = call.program
    state = next(s for s in call.ranks if s.pc < len(tables[s.rank]))
    op, _, peer, _, slot, flag, ordinal, per_call = tables[state.rank][state.pc]
    if op in PACKET_LANDINGS:
        writer = _where(program, *call.writers[(state.rank, slot)])
        return _fail(
            program,
            state.rank,
            state.pc,
            f"waits for the packets of slot {slot} of its inbox, which {writer} writes, but that row "
            "never runs (a deadlock)",
        )
    want = flag_value(CALL, ordinal, per_call)
    return _fail(
        program,
        state.rank,
        state.pc,
        f"waits for flag {flag} >= {want} (call {CALL}), which rank {peer} never raises that high "
        "(a deadlock)",
    )
