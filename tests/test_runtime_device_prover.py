"""The device program's prover: the lowered table of every schedule is accepted (every
algorithm at N = 2..17, chunked StragglAR), and each kind of broken table is refused with the
row that breaks it and why: a wait removed, a flag value off by one, a wrong chunk or slot, a
signal raised before its data, a reduction turned copy and back, two setters of a flag, a wait
naming the wrong peer, rows out of range, a sum made in another order than the schedule's or than
another rank's."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import numpy as np
import pytest

from stragglar.runtime.device.lowering import lower
from stragglar.runtime.device.prover import DeviceProgramError, check, refusal
from stragglar.runtime.device.table import COPY, PUT, REDUCE, SIGNAL, WAIT, DeviceProgram
from stragglar.runtime.program import compile_schedule
from stragglar.synth import ALGORITHMS, synthesize

EVERY_SCHEDULE = [(a, n) for a in ALGORITHMS for n in range(2, 18) if a != "rhd" or not n & (n - 1)]
CHUNKED = [(4, 32), (5, 9), (8, 64), (16, 64), (17, 40)]


def lowered(algorithm: str, n: int, chunks: int | None = None) -> DeviceProgram:
    return lower(compile_schedule(synthesize(algorithm, n, chunks=chunks)))


@pytest.mark.parametrize(("algorithm", "n"), EVERY_SCHEDULE)
def test_every_schedule_lowers_to_a_program_the_prover_accepts(algorithm: str, n: int) -> None:
    schedule = synthesize(algorithm, n)
    program = lower(compile_schedule(schedule))
    check(program, schedule)  # in the schedule's order of additions too
    assert refusal(program) is None
    assert sum(len(rows) for rows in program.rows) > 0


@pytest.mark.parametrize(("n", "chunks"), CHUNKED)
def test_chunked_schedules_are_accepted(n: int, chunks: int) -> None:
    schedule = synthesize("stragglar", n, chunks=chunks)
    assert refusal(lower(compile_schedule(schedule)), schedule) is None


Mutate = Callable[[np.ndarray, int], np.ndarray]


def mutated(program: DeviceProgram, rank: int, change: Mutate, index: int) -> DeviceProgram:
    rows = [r.copy() for r in program.rows]
    rows[rank] = change(rows[rank], index)
    return dataclasses.replace(program, rows=tuple(rows))


def rows_of(program: DeviceProgram, op: int) -> list[tuple[int, int]]:
    return [(r, int(i)) for r, rows in enumerate(program.rows) for i in np.flatnonzero(rows[:, 0] == op)]


def set_column(column: int, value: Callable[[np.ndarray], int]) -> Mutate:
    def change(rows: np.ndarray, index: int) -> np.ndarray:
        rows[index, column] = value(rows[index])
        return rows

    return change


def shifted(column: int, modulo: int) -> Mutate:
    """The row's ``column`` moved on by one, modulo ``modulo`` (the next chunk or slot)."""
    return set_column(column, lambda row: (int(row[column]) + 1) % modulo)


def removed(rows: np.ndarray, index: int) -> np.ndarray:
    return np.delete(rows, index, axis=0)


def signal_first(rows: np.ndarray, index: int) -> np.ndarray:
    """The signal at ``index`` moved before the round's first put (its data not yet written)."""
    first = int(np.flatnonzero(rows[:, 1] == rows[index, 1])[0])
    order = [*range(first), index, *(i for i in range(first, len(rows)) if i != index)]
    return rows[order]


SMALL = [
    ("stragglar", 5, None),
    ("stragglar", 4, 8),
    ("ring", 4, None),
    ("rhd", 4, None),
    ("direct", 3, None),
]


@pytest.mark.parametrize(("algorithm", "n", "chunks"), SMALL)
def test_every_wait_removed_is_refused_as_a_race(algorithm: str, n: int, chunks: int | None) -> None:
    program = lowered(algorithm, n, chunks)
    for rank, index in rows_of(program, WAIT):
        with pytest.raises(DeviceProgramError, match="without waiting for a flag raised after that write"):
            check(mutated(program, rank, removed, index))


@pytest.mark.parametrize(("algorithm", "n", "chunks"), SMALL)
def test_every_flag_value_one_too_low_is_refused(algorithm: str, n: int, chunks: int | None) -> None:
    """A wait for one less than its value: the flag's previous setting in this call (a race); for
    its first setting, a wait counting one setting less a call (the value the call before left:
    refused as a count the flag's raises do not make), or ordinal 0 (out of range)."""
    program = lowered(algorithm, n, chunks)
    for rank, index in rows_of(program, WAIT):
        ordinal, per_call = program.rows[rank][index, 6:8]
        if ordinal > 1:
            wrong = mutated(program, rank, set_column(6, lambda row: int(row[6]) - 1), index)
            reason = "without waiting"
        elif per_call > 1:  # call * (K - 1) + 1 <= the K * call the call before left
            wrong = mutated(program, rank, set_column(7, lambda row: int(row[7]) - 1), index)
            reason = f"as raised {per_call - 1} times a call, but it is raised {per_call} times"
        else:
            wrong = mutated(program, rank, set_column(6, lambda row: 0), index)
            reason = "has ordinal 0 outside 1..1"
        with pytest.raises(DeviceProgramError, match=reason):
            check(wrong)


def test_a_count_of_raises_off_by_one_is_refused_on_waits_and_signals() -> None:
    """A wait counting one raise more a call than the flag gets; a signal out of its place in
    the count (two swapped)."""
    program = lowered("ring", 4)
    for rank, index in rows_of(program, WAIT):
        with pytest.raises(DeviceProgramError, match="times a call, but it is raised"):
            check(mutated(program, rank, set_column(7, lambda row: int(row[7]) + 1), index))
    signals = [i for r, i in rows_of(program, SIGNAL) if r == 0]
    first, second = signals[0], signals[1]

    def swapped(rows: np.ndarray, index: int) -> np.ndarray:
        rows[[first, second], 6] = rows[[second, first], 6]
        return rows

    with pytest.raises(DeviceProgramError, match=r"as its setting 2 of \d+ a call, but it is setting 1"):
        check(mutated(program, 0, swapped, first))


def test_waits_moved_before_the_signals_they_answer_deadlock() -> None:
    """Two ranks exchanging in a round, each waiting for the other before raising its flag."""
    program = lowered("rhd", 2)
    rows = []
    for table in program.rows:
        first_round = table[table[:, 1] == table[0, 1]]
        waits_first = np.concatenate(
            [first_round[first_round[:, 0] == WAIT], first_round[first_round[:, 0] != WAIT]]
        )
        rows.append(np.concatenate([waits_first, table[len(first_round) :]]))
    with pytest.raises(DeviceProgramError, match="never raises that high \\(a deadlock\\)"):
        check(dataclasses.replace(program, rows=tuple(rows)))


@pytest.mark.parametrize(("algorithm", "n", "chunks"), SMALL)
def test_a_wrong_chunk_or_slot_is_refused(algorithm: str, n: int, chunks: int | None) -> None:
    program = lowered(algorithm, n, chunks)
    other_chunk = shifted(3, program.num_chunks)
    for rank, index in rows_of(program, PUT)[:12]:
        other_slot = shifted(4, program.inbox_slots[int(program.rows[rank][index, 2])])
        assert "into chunk" in str(refusal(mutated(program, rank, other_chunk, index)))
        assert re.search(
            "writes too|no rank writes|without waiting|into chunk",
            str(refusal(mutated(program, rank, other_slot, index))),
        )
    for rank, index in rows_of(program, REDUCE)[:12] + rows_of(program, COPY)[:12]:
        assert refusal(mutated(program, rank, other_chunk, index)) is not None


def test_a_signal_raised_before_its_data_is_written_is_a_race() -> None:
    program = lowered("stragglar", 6)
    for rank, index in rows_of(program, SIGNAL):
        with pytest.raises(DeviceProgramError, match="without waiting"):
            check(mutated(program, rank, signal_first, index))


def test_a_reduction_turned_copy_or_a_copy_turned_reduction_sums_wrongly() -> None:
    program = lowered("stragglar", 5)
    for rank, index in rows_of(program, REDUCE):
        with pytest.raises(DeviceProgramError, match="ends with chunk"):
            check(mutated(program, rank, set_column(0, lambda row: COPY), index))
    for rank, index in rows_of(program, COPY):
        with pytest.raises(DeviceProgramError, match="twice"):
            check(mutated(program, rank, set_column(0, lambda row: REDUCE), index))


def test_two_setters_of_a_flag_and_a_wait_naming_another_setter_are_refused() -> None:
    program = lowered("stragglar", 4)
    raised = {
        (int(program.rows[r][i, 2]), int(program.rows[r][i, 5])): r for r, i in rows_of(program, SIGNAL)
    }
    rank, index = rows_of(program, SIGNAL)[0]
    holder = int(program.rows[rank][index, 2])
    flag, other = next((f, r) for (h, f), r in raised.items() if h == holder and r != rank)
    with pytest.raises(
        DeviceProgramError, match=f"which rank {other} raises too|which rank {rank} raises too"
    ):
        check(mutated(program, rank, set_column(5, lambda row: flag), index))
    rank, index = rows_of(program, WAIT)[0]
    setter = int(program.rows[rank][index, 2])
    wrong_peer = next(p for p in range(4) if p not in (rank, setter))
    with pytest.raises(DeviceProgramError, match=f"waits for rank {wrong_peer} on flag"):
        check(mutated(program, rank, set_column(2, lambda row: wrong_peer), index))


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [(0, 11, "has op 11"), (2, 7, "names rank 7"), (3, 99, "names chunk 99"), (5, 50, "names flag 50")],
)
def test_rows_out_of_range_are_refused(column: int, value: int, reason: str) -> None:
    program = lowered("ring", 3)
    op = {0: PUT, 2: PUT, 3: PUT, 5: WAIT}[column]
    rank, index = rows_of(program, op)[0]
    with pytest.raises(DeviceProgramError, match=reason):
        check(mutated(program, rank, set_column(column, lambda row: value), index))


def test_a_rank_sending_to_itself_is_refused() -> None:
    program = lowered("ring", 3)
    rank, index = rows_of(program, PUT)[0]
    with pytest.raises(DeviceProgramError, match=f"names rank {rank} as its peer"):
        check(mutated(program, rank, set_column(2, lambda row: rank), index))


def test_a_sum_moved_to_a_later_round_is_refused_as_another_order() -> None:
    """rhd over 4 ranks with rank 0's first sum of chunk 0 moved after its second: every
    contribution still arrives once and every rank agrees, but the grouping is another one, so
    in float32 with inputs 1e8, 1, -1e8, 1 chunk 0 ends 0.0 on every rank where the schedule
    (and the interpreter) gives 2.0."""
    schedule = synthesize("rhd", 4)
    program = lower(compile_schedule(schedule))
    rows = program.rows[0]
    sums = [int(i) for i in np.flatnonzero((rows[:, 0] == REDUCE) & (rows[:, 3] == 0))]
    first, second = sums[0], sums[1]
    order = [*range(first), *range(first + 1, second + 1), first, *range(second + 1, len(rows))]
    moved = dataclasses.replace(program, rows=(rows[order], *program.rows[1:]))
    assert refusal(moved) is None  # a proof of contributions alone took it
    with pytest.raises(DeviceProgramError) as info:
        check(moved, schedule)
    assert re.fullmatch(
        r"device program refused: rank 0 ends with chunk 0 added as .*, not in the schedule's "
        r"order \(0 \+ 2\) \+ \(1 \+ 3\) \(other bits in floating point\)",
        str(info.value),
    ), info.value


def all_to_all(n: int) -> DeviceProgram:
    """Every rank puts its one chunk into each peer's inbox, raises each peer's flag, waits for
    both and adds the slots in peer order: each rank adds the same contributions, grouped by
    where it stands."""

    def rows(rank: int) -> np.ndarray:
        peers = [q for q in range(n) if q != rank]
        slot = {q: [p for p in range(n) if p != q].index(rank) for q in peers}  # mine in q's inbox
        table = [(PUT, 0, q, 0, slot[q], 0, 0, 0) for q in peers]
        table += [(SIGNAL, 0, q, 0, 0, rank, 1, 1) for q in peers]
        table += [(WAIT, 0, q, 0, 0, q, 1, 1) for q in peers]
        table += [(REDUCE, 0, q, 0, i, 0, 0, 0) for i, q in enumerate(peers)]
        return np.array(table, dtype=np.int64)

    return DeviceProgram(n, 1, n - 1, n, (n - 1,) * n, tuple(rows(r) for r in range(n)), ("all",), (0,))


def test_ranks_that_group_one_sum_differently_are_refused_without_a_schedule() -> None:
    """Three ranks that each add the others' contributions onto their own end with (0 + 1) + 2,
    (1 + 0) + 2 and (2 + 0) + 1: in floating point, replicas that disagree (1e8, -1e8, 1 gave
    1.0, 1.0 and 0.0)."""
    program = all_to_all(3)
    with pytest.raises(DeviceProgramError) as info:
        check(program)
    assert str(info.value) == (
        "device program refused: rank 2 ends with chunk 0 added as 1 + (0 + 2), not in rank 0's "
        "order 2 + (0 + 1) (other bits in floating point)"
    )
    assert refusal(all_to_all(2)) is None  # two ranks: a + b and b + a are the same bits
