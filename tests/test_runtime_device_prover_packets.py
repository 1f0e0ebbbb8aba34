"""The device program's prover on packets (``put_packets``, ``copy_packets``, ``reduce_packets``):
staged tables rewritten into packet ones (every put, copy and reduce made its packet form, the
signals and waits dropped, the slots kept).  Every schedule so rewritten is accepted (every
algorithm at N = 2..17, chunked StragglAR).  Each kind of broken packet table is refused with
the row and why: a landing of another slot, a slot nobody writes, a writer that never runs (a
deadlock naming the slot), packets landed as plain elements and the reverse, a landing naming
another writer, a landing moved to a rank whose inbox the slot is not, a sum turned copy and
back, rows out of range.  And a packet orders nothing but its own data: a direct program whose
message is made packets, its flag dropped, is refused as a race where that flag ordered a push
or a pull, though the same message made packets in the staged program is accepted."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import numpy as np
import pytest
from test_runtime_device_prover import (
    CHUNKED,
    EVERY_SCHEDULE,
    SMALL,
    lowered,
    mutated,
    rows_of,
    set_column,
    shifted,
)
from test_runtime_device_prover_soundness import as_packets, sums_right

from stragglar.runtime.device.lowering import lower
from stragglar.runtime.device.prover import DeviceProgramError, check, refusal
from stragglar.runtime.device.table import (
    COPY,
    COPY_PACKETS,
    PUT,
    PUT_PACKETS,
    REDUCE,
    REDUCE_PACKETS,
    SIGNAL,
    WAIT,
    DeviceProgram,
)
from stragglar.runtime.program import compile_schedule
from stragglar.synth import synthesize

PACKET_FORM = {PUT: PUT_PACKETS, COPY: COPY_PACKETS, REDUCE: REDUCE_PACKETS}
LANDINGS = (COPY_PACKETS, REDUCE_PACKETS)
Message = tuple[int, int, int]  # (sender, receiver, round)


def packets(algorithm: str, n: int, chunks: int | None = None) -> DeviceProgram:
    return as_packets(lowered(algorithm, n, chunks))


def with_messages_as_packets(
    program: DeviceProgram, messages: set[Message], keep_flags: bool = False
) -> DeviceProgram:
    """``program`` with the staged transfers of ``messages`` made packets and, unless
    ``keep_flags``, their signal and wait dropped (each message has one of each), every flag's
    remaining raises and waits counted again (ordinals 1..K in row order, ``per_call`` K)."""
    tables: list[list[list[int]]] = []
    for rank, rows in enumerate(program.rows):
        table = []
        for row in rows.tolist():
            op, rnd, peer = row[:3]
            message = (rank, peer, rnd) if op in (PUT, SIGNAL) else (peer, rank, rnd)
            if message in messages and op in (SIGNAL, WAIT) and not keep_flags:
                continue
            if message in messages and op in PACKET_FORM:
                row[0] = PACKET_FORM[op]
            table.append(row)
        tables.append(table)
    raised: dict[tuple[int, int], int] = {}
    for table in tables:
        for row in table:
            if row[0] == SIGNAL:
                raised[(row[2], row[5])] = row[6] = raised.get((row[2], row[5]), 0) + 1
    waited: dict[tuple[int, int], int] = {}
    for rank, table in enumerate(tables):
        for row in table:
            if row[0] == SIGNAL:
                row[7] = raised[(row[2], row[5])]
            elif row[0] == WAIT:
                waited[(rank, row[5])] = row[6] = waited.get((rank, row[5]), 0) + 1
                row[7] = raised[(rank, row[5])]
    arrays = tuple(np.array(table, dtype=np.int64).reshape(-1, 8) for table in tables)
    return dataclasses.replace(program, rows=arrays)


def to(value: int) -> Callable[[np.ndarray], int]:
    """A column's new value, whatever the row held."""
    return lambda row: value


def ops(program: DeviceProgram) -> set[int]:
    return {int(op) for rows in program.rows for op in rows[:, 0]}


@pytest.mark.parametrize(("algorithm", "n"), EVERY_SCHEDULE)
def test_every_schedule_as_packets_is_accepted(algorithm: str, n: int) -> None:
    program = packets(algorithm, n)
    assert ops(program) <= {PUT_PACKETS, COPY_PACKETS, REDUCE_PACKETS} and PUT_PACKETS in ops(program)
    assert program.packets and not program.direct
    check(program)
    assert refusal(program) is None


@pytest.mark.parametrize(("n", "chunks"), CHUNKED)
def test_chunked_schedules_as_packets_are_accepted(n: int, chunks: int) -> None:
    assert refusal(packets("stragglar", n, chunks)) is None


def test_every_message_made_packets_is_every_transfer_made_packets() -> None:
    """The two rewritings of this file agree: every message made packets, flags and all, is the
    whole table made packets."""
    program = lowered("stragglar", 5)
    messages = {
        (r, int(row[2]), int(row[1])) for r, rows in enumerate(program.rows) for row in rows if row[0] == PUT
    }
    rewritten = with_messages_as_packets(program, messages)
    assert all(np.array_equal(a, b) for a, b in zip(rewritten.rows, as_packets(program).rows, strict=True))


@pytest.mark.parametrize(("algorithm", "n"), EVERY_SCHEDULE)
def test_the_lowerings_packet_programs_are_accepted_and_are_these(algorithm: str, n: int) -> None:
    program = lower(compile_schedule(synthesize(algorithm, n)), packets=True)
    assert refusal(program) is None
    expected = packets(algorithm, n)
    assert program.inbox_slots == expected.inbox_slots
    assert all(np.array_equal(a, b) for a, b in zip(program.rows, expected.rows, strict=True))


def landings(program: DeviceProgram) -> list[tuple[int, int]]:
    return sorted(rows_of(program, COPY_PACKETS) + rows_of(program, REDUCE_PACKETS))


OTHER_SLOT = {  # why a landing of another slot is refused, by kind
    "another chunk's": r"lands slot \d+, written from chunk \d+, into chunk \d+",
    "another writer's": r"lands slot \d+ as rank \d+'s, which rank \d+ row \d+ \(put_packets",
    "a sum short": r"ends with chunk \d+ summing ranks",
    "a sum twice": r"adds the contributions of ranks .* twice",
    "written later": r"waits for the packets of slot \d+ .* never runs \(a deadlock\)",
}


@pytest.mark.parametrize(("algorithm", "n", "chunks"), SMALL)
def test_a_landing_of_another_slot_is_refused(algorithm: str, n: int, chunks: int | None) -> None:
    """Another slot of the same inbox holds another chunk, or another writer's, or the same
    chunk of another round (a sum short or added twice), or one written later (a deadlock).
    Only where it holds a value the landing's chunk is about to be given anyway (Direct: rank 1
    copying the final sum of chunk 0 twice) is it harmless, and accepted: then it sums right."""
    program = packets(algorithm, n, chunks)
    reasons, accepted = set(), 0
    for rank, index in landings(program):
        slots = program.inbox_slots[rank]
        if slots < 2:
            continue
        changed = mutated(program, rank, shifted(4, slots), index)
        said = refusal(changed)
        if said is None:
            accepted += 1
            assert all(sums_right(changed, seed, calls=2) for seed in range(12))
            continue
        kind = next((k for k, pattern in OTHER_SLOT.items() if re.search(pattern, said)), None)
        assert kind is not None, said
        reasons.add(kind)
    assert reasons and accepted <= (1 if algorithm == "direct" else 0)
    if algorithm == "stragglar" and chunks is None:  # many peers and chunks into the late rank
        assert {"another chunk's", "another writer's"} <= reasons, reasons


@pytest.mark.parametrize(("algorithm", "n", "chunks"), SMALL)
def test_a_put_packets_removed_leaves_its_slot_unwritten(algorithm: str, n: int, chunks: int | None) -> None:
    program = packets(algorithm, n, chunks)
    for rank, index in rows_of(program, PUT_PACKETS)[:12]:
        peer, slot = (int(v) for v in program.rows[rank][index, [2, 4]])
        pattern = (
            rf"rank {peer} row \d+ \((copy|reduce)_packets, .*\) lands slot {slot} of its inbox, "
            "which no rank writes"
        )
        with pytest.raises(DeviceProgramError, match=pattern):
            check(mutated(program, rank, lambda rows, i: np.delete(rows, i, axis=0), index))


def test_landings_before_the_puts_they_wait_for_deadlock_naming_the_slot() -> None:
    """A ring's first round with every rank landing before it puts: each waits for packets its
    neighbour would write only after its own landing."""
    program = packets("ring", 4)
    tables = []
    for rows in program.rows:
        first = rows[rows[:, 1] == rows[0, 1]]
        tables.append(
            np.concatenate(
                [first[np.isin(first[:, 0], LANDINGS)], first[first[:, 0] == PUT_PACKETS], rows[len(first) :]]
            )
        )
    with pytest.raises(DeviceProgramError) as caught:
        check(dataclasses.replace(program, rows=tuple(tables)))
    assert re.search(
        r"rank \d row 0 \(reduce_packets, round 0 of phase 'reduce-scatter'\) waits for the packets of "
        r"slot 0 of its inbox, which rank \d row 1 \(put_packets, round 0 of phase 'reduce-scatter'\) "
        r"writes, but that row never runs \(a deadlock\)",
        str(caught.value),
    ), caught.value
    assert "flag" not in str(caught.value)


def test_a_landing_before_its_own_puts_only_waits() -> None:
    """One rank's first landing moved before its puts of the round: it waits for its packets,
    which need nothing of it, so the table is as good (accepted, and it sums right)."""
    program = packets("ring", 4)
    rows = program.rows[0]
    landing = int(np.flatnonzero(np.isin(rows[:, 0], LANDINGS))[0])
    assert landing > 0 and rows[landing, 1] == rows[0, 1]
    early = rows[[landing, *(i for i in range(len(rows)) if i != landing)]]
    moved = dataclasses.replace(program, rows=(early, *program.rows[1:]))
    assert refusal(moved) is None
    assert all(sums_right(moved, seed, calls=2) for seed in range(12))


@pytest.mark.parametrize(("algorithm", "n", "chunks"), SMALL)
def test_a_put_packets_made_a_plain_put_is_refused(algorithm: str, n: int, chunks: int | None) -> None:
    """The landing would poll for marks a plain put never writes."""
    program = packets(algorithm, n, chunks)
    for rank, index in rows_of(program, PUT_PACKETS)[:12]:
        slot = int(program.rows[rank][index, 4])
        pattern = (
            rf"_packets, .*\) polls slot {slot} for packets, which rank {rank} row {index} \(put, .*\) "
            r"writes as plain elements \(the marks it polls for never come\)"
        )
        with pytest.raises(DeviceProgramError, match=pattern):
            check(mutated(program, rank, set_column(0, lambda row: PUT), index))


@pytest.mark.parametrize(("algorithm", "n", "chunks"), SMALL)
def test_packets_landed_as_plain_elements_and_the_reverse_are_refused(
    algorithm: str, n: int, chunks: int | None
) -> None:
    """A plain copy or reduce of a packet slot would read the marks as data; in a staged table,
    a packet landing of a plain put's slot waits for marks that never come, and a plain landing
    of a slot a put_packets wrote reads its marks."""
    program = packets(algorithm, n, chunks)
    for rank, index in landings(program)[:12]:
        plain = {COPY_PACKETS: COPY, REDUCE_PACKETS: REDUCE}[int(program.rows[rank][index, 0])]
        with pytest.raises(
            DeviceProgramError,
            match=r"reads slot \d+ as plain elements, which rank \d+ row \d+ \(put_packets",
        ):
            check(mutated(program, rank, set_column(0, to(plain)), index))
    staged = lowered(algorithm, n, chunks)
    for rank, index in (rows_of(staged, COPY) + rows_of(staged, REDUCE))[:12]:
        with pytest.raises(
            DeviceProgramError, match=r"polls slot \d+ for packets, which rank \d+ row \d+ \(put,"
        ):
            check(mutated(staged, rank, set_column(0, lambda row: PACKET_FORM[int(row[0])]), index))
    for rank, index in rows_of(staged, PUT)[:12]:
        with pytest.raises(
            DeviceProgramError,
            match=rf"reads slot \d+ as plain elements, which rank {rank} row {index} \(put_packets",
        ):
            check(mutated(staged, rank, set_column(0, lambda row: PUT_PACKETS), index))


@pytest.mark.parametrize(("algorithm", "n", "chunks"), [s for s in SMALL if s[1] > 2])
def test_a_landing_naming_another_writer_is_refused(algorithm: str, n: int, chunks: int | None) -> None:
    program = packets(algorithm, n, chunks)
    for rank, index in landings(program)[:12]:
        writer, slot = (int(v) for v in program.rows[rank][index, [2, 4]])
        other = next(p for p in range(n) if p not in (rank, writer))
        pattern = (
            rf"rank {rank} row {index} \(\w+_packets, .*\) lands slot {slot} as rank {other}'s, "
            rf"which rank {writer} row \d+ \(put_packets"
        )
        with pytest.raises(DeviceProgramError, match=pattern):
            check(mutated(program, rank, set_column(2, to(other)), index))


def test_a_landing_moved_to_a_rank_whose_inbox_the_slot_is_not_is_refused() -> None:
    """Every landing of StragglAR at N = 5, moved to the same place of another rank's table (not
    its writer's): that rank's slot of the number is out of its inbox, another's, or another
    chunk's, or it is the same chunk of the same writer and then one rank sums short."""
    program = packets("stragglar", 5)
    count = 0
    for rank, index in landings(program):
        row = program.rows[rank][index]
        for other in range(program.num_ranks):
            if other in (rank, int(row[2])):
                continue
            table = program.rows[other]
            at = int(np.searchsorted(table[:, 1], row[1], side="right"))
            moved = [*program.rows]
            moved[rank] = np.delete(program.rows[rank], index, axis=0)
            moved[other] = np.insert(table, at, row, axis=0)
            said = refusal(dataclasses.replace(program, rows=tuple(moved)))
            assert said is not None
            assert re.search(
                r"names slot \d+ of rank \d+'s inbox|as rank \d+'s, which|into chunk|ends with chunk"
                r"|twice|a deadlock",
                said,
            ), said
            count += 1
    assert count > 20


def test_a_sum_turned_copy_and_a_copy_turned_sum_are_refused() -> None:
    program = packets("stragglar", 5)
    for rank, index in rows_of(program, REDUCE_PACKETS):
        with pytest.raises(DeviceProgramError, match="ends with chunk"):
            check(mutated(program, rank, set_column(0, lambda row: COPY_PACKETS), index))
    for rank, index in rows_of(program, COPY_PACKETS):
        with pytest.raises(
            DeviceProgramError,
            match=r"\(reduce_packets, .*\) adds the contributions of ranks \[.*\] to chunk \d+ twice",
        ):
            check(mutated(program, rank, set_column(0, lambda row: REDUCE_PACKETS), index))


OUT_OF_RANGE: list[tuple[int, int, Callable[[DeviceProgram, int, int], int], str]] = [
    # (op, column, value of (program, rank, peer), reason)
    (PUT_PACKETS, 2, lambda p, rank, peer: rank, "names rank {rank} as its peer"),
    (PUT_PACKETS, 2, lambda p, rank, peer: 7, "names rank 7 as its peer"),
    (PUT_PACKETS, 3, lambda p, rank, peer: 99, "names chunk 99 of 3"),
    (PUT_PACKETS, 4, lambda p, rank, peer: p.inbox_slots[peer], "names slot {value} of rank {peer}'s inbox"),
    (COPY_PACKETS, 2, lambda p, rank, peer: rank, "names rank {rank} as its peer"),
    (COPY_PACKETS, 4, lambda p, rank, peer: p.inbox_slots[rank], "names slot {value} of rank {rank}'s inbox"),
    (REDUCE_PACKETS, 3, lambda p, rank, peer: 3, "names chunk 3 of 3"),
    (REDUCE_PACKETS, 4, lambda p, rank, peer: -1, "names slot -1 of rank {rank}'s inbox"),
]


@pytest.mark.parametrize(("op", "column", "value", "reason"), OUT_OF_RANGE)
def test_packet_rows_out_of_range_are_refused(
    op: int, column: int, value: Callable[[DeviceProgram, int, int], int], reason: str
) -> None:
    program = packets("ring", 3)
    rank, index = rows_of(program, op)[0]
    peer = int(program.rows[rank][index, 2])
    wrong = value(program, rank, peer)
    expected = (
        re.escape(f"rank {rank} row {index} (")
        + ".*"
        + re.escape(reason.format(rank=rank, peer=peer, value=wrong))
    )
    with pytest.raises(DeviceProgramError, match=expected):
        check(mutated(program, rank, set_column(column, lambda row: wrong), index))


def staged_messages(program: DeviceProgram) -> list[Message]:
    """Every message with a staged transfer: (sender, receiver, round) of every put."""
    return sorted(
        {
            (r, int(row[2]), int(row[1]))
            for r, rows in enumerate(program.rows)
            for row in rows
            if row[0] == PUT
        }
    )


@pytest.mark.parametrize(("algorithm", "n"), [("direct", 4), ("direct", 5), ("stragglar", 8)])
def test_a_packet_message_orders_no_direct_transfer(algorithm: str, n: int) -> None:
    """In a program lowered with direct transfers, each staged message made packets and its flag
    dropped, one at a time: refused as a race where that flag also ordered a push or a pull
    (the Direct algorithm: a push into a chunk its owner's caller or another push wrote, whose
    order ran through the message), else accepted; the same message made packets in the staged
    program is always accepted (there nothing but the slot needs ordering), and so is the direct
    one with the flag kept (packet landings after a wait)."""
    programs = compile_schedule(synthesize(algorithm, n))
    mixed, staged = lower(programs, direct=True), lower(programs)
    assert refusal(mixed) is None and mixed.direct
    races = 0
    for message in staged_messages(mixed):
        said = refusal(with_messages_as_packets(mixed, {message}))
        if said is not None:
            assert re.search(
                r"\((push|pull|pull_reduce), .*without waiting for a flag raised after that \w+ "
                r"\(a [\w-]+ race\)",
                said,
            ), said
            races += 1
        assert refusal(with_messages_as_packets(staged, {message})) is None
        assert refusal(with_messages_as_packets(mixed, {message}, keep_flags=True)) is None
    if algorithm == "direct":
        assert races > 0
    assert staged_messages(mixed)


def test_the_race_a_packet_message_leaves_is_real() -> None:
    """Direct at N = 4, rank 0's first message to rank 1 made packets: rank 2's push into rank
    0's chunk 2 was ordered after rank 0's caller wrote it only through that message's flag; in
    some order drawn by the soundness test's weak run (writes seen late unless released), the
    caller's write lands after the push and a rank ends with a wrong sum."""
    programs = compile_schedule(synthesize("direct", 4))
    mixed = with_messages_as_packets(lower(programs, direct=True), {(0, 1, 0)})
    with pytest.raises(
        DeviceProgramError,
        match=r"rank 2 row \d+ \(push, .*\) writes chunk 2 of rank 0, which rank 0's caller writes",
    ):
        check(mixed)
    assert not all(sums_right(mixed, seed, calls=2) for seed in range(200))
