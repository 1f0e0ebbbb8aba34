"""The device program's prover on direct transfers (``push``, ``pull``, ``pull_reduce``): lowered
staged tables rewritten by hand, a transfer at a time, into direct ones.  Accepted where the
schedule's own messages order every access to a chunk (Ring and halving/doubling wholly direct,
StragglAR with every copy pushed and every sum pulled whose sender keeps the chunk that round);
refused, naming both rows, where they do not: a push into a chunk its owner still sends, a pull
without its wait, a pull from a chunk its sender overwrites in the same round (a swap), two
unordered pushes into one chunk, a pull adding a contribution twice, a push or pull to itself or
of a chunk out of range.  A run with numbers in orders drawn at random, which knows nothing of
the prover, shows the accepted programs summing right and the refused pulls summing wrong."""

from __future__ import annotations

import dataclasses
import random
import re

import numpy as np
import pytest

from stragglar.runtime.device.lowering import lower
from stragglar.runtime.device.prover import DeviceProgramError, check, refusal
from stragglar.runtime.device.table import (
    COPY,
    PULL,
    PULL_REDUCE,
    PUSH,
    PUT,
    REDUCE,
    SIGNAL,
    WAIT,
    DeviceProgram,
    flag_value,
)
from stragglar.runtime.program import compile_schedule
from stragglar.synth import synthesize

Transfer = tuple[int, int]  # (sender, its put row)
BASE = 1000  # more than any count of one rank's contributions a wrong program could make


def lowered(algorithm: str, n: int, chunks: int | None = None) -> DeviceProgram:
    return lower(compile_schedule(synthesize(algorithm, n, chunks=chunks)))


def transfers(program: DeviceProgram) -> dict[Transfer, tuple[int, int]]:
    """Every staged transfer: (sender, put row) -> (receiver, the row landing its slot)."""
    landing = {
        (rank, int(row[4])): index
        for rank, rows in enumerate(program.rows)
        for index, row in enumerate(rows)
        if row[0] in (COPY, REDUCE)
    }
    return {
        (sender, index): (int(row[2]), landing[(int(row[2]), int(row[4]))])
        for sender, rows in enumerate(program.rows)
        for index, row in enumerate(rows)
        if row[0] == PUT
    }


def direct(program: DeviceProgram, pushed: set[Transfer], pulled: set[Transfer]) -> DeviceProgram:
    """``program`` with the ``pushed`` transfers (copies) made pushes (the put becomes a push into
    the receiver's chunk, the landing goes) and the ``pulled`` ones pulls (the put goes, the
    landing becomes a pull or pull_reduce from the sender); the signals and waits stay."""
    staged = transfers(program)
    rows = [[[int(v) for v in row] for row in table] for table in program.rows]
    gone: set[tuple[int, int]] = set()
    for sender, index in pushed:
        receiver, landed = staged[(sender, index)]
        assert rows[receiver][landed][0] == COPY, "only a copy can be pushed"
        rows[sender][index] = [PUSH, rows[sender][index][1], receiver, rows[sender][index][3], 0, 0, 0, 0]
        gone.add((receiver, landed))
    for sender, index in pulled:
        receiver, landed = staged[(sender, index)]
        op, rnd, _, chunk = rows[receiver][landed][:4]
        rows[receiver][landed] = [PULL if op == COPY else PULL_REDUCE, rnd, sender, chunk, 0, 0, 0, 0]
        gone.add((sender, index))
    tables = tuple(
        np.array([row for i, row in enumerate(table) if (rank, i) not in gone], dtype=np.int64).reshape(-1, 8)
        for rank, table in enumerate(rows)
    )
    return dataclasses.replace(program, rows=tables)


def copies(program: DeviceProgram) -> set[Transfer]:
    return {t for t, (r, i) in transfers(program).items() if program.rows[r][i][0] == COPY}


def sums(program: DeviceProgram) -> set[Transfer]:
    return set(transfers(program)) - copies(program)


def kept_that_round(program: DeviceProgram, transfer: Transfer) -> bool:
    """Whether the sender lands nothing into the chunk it sends in the round it sends it."""
    sender, index = transfer
    rnd, chunk = program.rows[sender][index, [1, 3]]
    rows = program.rows[sender]
    return not bool(np.any(np.isin(rows[:, 0], (COPY, REDUCE)) & (rows[:, 1] == rnd) & (rows[:, 3] == chunk)))


def wholly_direct(algorithm: str, n: int) -> DeviceProgram:
    """Every copy pushed, every sum pulled."""
    program = lowered(algorithm, n)
    return direct(program, copies(program), sums(program))


def replaced(program: DeviceProgram, rank: int, rows: np.ndarray) -> DeviceProgram:
    return dataclasses.replace(
        program, rows=tuple(rows if r == rank else t for r, t in enumerate(program.rows))
    )


def without_wait(program: DeviceProgram, rank: int, pull: int) -> DeviceProgram:
    """``program`` without the wait before ``rank``'s row ``pull``."""
    return replaced(program, rank, np.delete(program.rows[rank], pull - 1, axis=0))


def ops(program: DeviceProgram) -> set[int]:
    return {int(op) for rows in program.rows for op in rows[:, 0]}


@pytest.mark.parametrize(("algorithm", "n"), [("ring", 3), ("ring", 4), ("rhd", 4)])
def test_wholly_direct_ring_and_halving_doubling_are_accepted(algorithm: str, n: int) -> None:
    program = wholly_direct(algorithm, n)
    assert PUT not in ops(program) and {PUSH, PULL_REDUCE} <= ops(program)
    assert program.direct
    check(program)
    assert refusal(program) is None


def test_every_transfer_pulled_in_a_ring_is_accepted() -> None:
    program = lowered("ring", 4)
    pulled = direct(program, set(), set(transfers(program)))
    assert ops(pulled) & {PUT, PUSH, COPY, REDUCE} == set()
    assert refusal(pulled) is None


@pytest.mark.parametrize(("n", "chunks"), [(4, None), (5, None), (4, 8)])
def test_stragglar_with_copies_pushed_and_kept_sums_pulled_is_accepted(n: int, chunks: int | None) -> None:
    program = lowered("stragglar", n, chunks)
    pulled = {t for t in sums(program) if kept_that_round(program, t)}
    made = direct(program, copies(program), pulled)
    assert {PUT, PUSH, PULL_REDUCE} <= ops(made)  # staged and direct side by side
    assert refusal(made) is None


def race(kind: str, actor: str, verb: str, chunk: int, owner: int, earlier: str, their: str) -> str:
    """The refusal's pattern: ``actor`` and ``earlier`` are (rank, op) patterns of the two rows."""
    return (
        rf"refused: {actor} {verb} chunk {chunk} of rank {owner}, which {earlier} {their}, "
        rf"without waiting for a flag raised after that \w+ \(a {kind} race\)"
    )


def row(rank: int | str, op: str) -> str:
    return rf"rank {rank} row \d+ \({op}, round \d+ of phase '[\w-]+'\)"


def test_a_push_into_a_chunk_its_owner_still_sends_is_a_write_after_read_race() -> None:
    """Direct at N = 4 with every copy pushed: rank 0, done summing with the late rank, pushes
    the sum into rank 1's chunk 0, which nothing tells it rank 1 has finished pushing on to rank
    2 in the ring before (staged, the sum waits in rank 1's inbox).  Rare orders end wrong (rank
    1's push of the older value lands in rank 2 after the late rank's), too rare for a test to
    draw; the race is refused whatever the orders drawn show."""
    program = lowered("direct", 4)
    assert refusal(direct(program, set(), set())) is None
    with pytest.raises(DeviceProgramError) as refused:
        check(direct(program, copies(program), set()))
    message = str(refused.value)
    assert re.search(
        race("write-after-read", row(0, "push"), "writes", 0, 1, row(1, "push"), "reads"), message
    )
    assert "(push, round 3 of phase 'allreduce-others')" in message
    assert "(push, round 1 of phase 'exchange-broadcast')" in message


def test_a_push_before_the_wait_that_orders_it_races_with_the_receivers_input() -> None:
    """A Ring at N = 3, copies pushed and sums staged: rank 0's first allgather push moved before
    its last wait of the reduce-scatter may overwrite rank 1's chunk before rank 1 has put it, and
    before anything tells rank 0 that rank 1's caller has even written it (across processes
    rank 1 may not have started): refused as the earlier of the two, a write after that input."""
    program = lowered("ring", 3)
    made = direct(program, copies(program), set())
    rows = made.rows[0]
    push = int(np.flatnonzero(rows[:, 0] == PUSH)[0])
    wait = int(np.flatnonzero(rows[:push, 0] == WAIT)[-1])
    receiver, chunk = (int(v) for v in rows[push, [2, 3]])
    put = int(np.flatnonzero((made.rows[receiver][:, 0] == PUT) & (made.rows[receiver][:, 3] == chunk))[0])
    early = rows[[*range(wait), push, *(i for i in range(wait, len(rows)) if i != push)]]
    with pytest.raises(DeviceProgramError) as caught:
        check(replaced(made, 0, early))
    assert re.search(
        race(
            "write-after-write",
            rf"rank 0 row {wait} \(push, round 0 of phase 'allgather'\)",
            "writes",
            chunk,
            receiver,
            rf"rank {receiver}'s caller",
            "writes",
        ),
        str(caught.value),
    )
    assert made.rows[receiver][put, 0] == PUT  # the read the push would also race


def test_a_pull_whose_wait_is_removed_races() -> None:
    """Every pull, its wait removed: refused as a race.  A first round's pull reads the sender's
    input, which its caller wrote before the sender's kernel started and nothing before its flag
    says has happened (across processes it may not have); a later one reads a chunk the sender
    is still summing into."""
    program = wholly_direct("ring", 4)
    pulls = [
        (r, int(i)) for r, rows in enumerate(program.rows) for i in np.flatnonzero(rows[:, 0] == PULL_REDUCE)
    ]
    assert all(program.rows[r][i - 1, 0] == WAIT for r, i in pulls)
    assert len(pulls) == 3 * 4  # the reduce-scatter's rounds, a pull per rank
    for rank, index in pulls:
        said = str(refusal(without_wait(program, rank, index)))
        assert "race)" in said
        if program.rows[rank][index, 1] == 0:
            assert re.search(r"reads chunk \d+ of rank \d+, which rank \d+'s caller writes", said), said
    rank, index = max(pulls)  # the last rank's last, run last: the read-after-write it is
    chunk, peer = (int(v) for v in program.rows[rank][index, [3, 2]])
    with pytest.raises(DeviceProgramError) as caught:
        check(without_wait(program, rank, index))
    pattern = race(
        "read-after-write", row(rank, "pull_reduce"), "reads", chunk, peer, row(peer, "pull_reduce"), "writes"
    )
    assert re.search(pattern, str(caught.value))
    assert f"rank {rank} row {index - 1} (pull_reduce, round 2 of phase 'reduce-scatter')" in str(
        caught.value
    )


def test_a_pull_from_a_chunk_its_sender_sums_into_that_round_is_refused() -> None:
    """StragglAR's exchange: the late rank and a peer swap a chunk and both add.  Pulled one way,
    the sender's own landing into the chunk races with the pull, whichever the run meets first."""
    program = lowered("stragglar", 4)
    swaps = [t for t in sums(program) if not kept_that_round(program, t)]
    assert len(swaps) == 6
    for sender, index in swaps:
        chunk = int(program.rows[sender][index, 3])
        why = str(refusal(direct(program, set(), {(sender, index)})))
        landing, pull = row(sender, "reduce"), row(r"\d", "pull_reduce")
        assert re.search(
            race("write-after-read", landing, "writes", chunk, sender, pull, "reads")
            + "|"
            + race("read-after-write", pull, "reads", chunk, sender, landing, "writes"),
            why,
        ), why


def test_two_unordered_pushes_into_one_chunk_are_a_write_after_write_race() -> None:
    """In a wholly direct ring, rank 2's first allgather push retargeted to the chunk rank 0 pushes
    into rank 1 in the same round."""
    program = wholly_direct("ring", 3)
    first = {r: int(np.flatnonzero(rows[:, 0] == PUSH)[0]) for r, rows in enumerate(program.rows)}
    into = program.rows[0][first[0], [2, 3]]
    assert into[0] == 1
    rows = program.rows[2].copy()
    rows[first[2], [2, 3]] = into
    with pytest.raises(DeviceProgramError) as caught:
        check(replaced(program, 2, rows))
    pushes = [rf"rank {r} row {first[r]} \(push, round 0 of phase 'allgather'\)" for r in (0, 2)]
    assert re.search(
        "|".join(
            race("write-after-write", actor, "writes", int(into[1]), 1, earlier, "writes")
            for actor, earlier in (pushes, pushes[::-1])
        ),
        str(caught.value),
    )


def test_a_pull_turned_pull_reduce_adds_twice_and_the_reverse_sums_short() -> None:
    program = lowered("ring", 4)
    pulled = direct(program, set(), set(transfers(program)))
    for op, into, reason in [
        (PULL_REDUCE, PULL, r"ends with chunk \d+ summing ranks"),
        (
            PULL,
            PULL_REDUCE,
            r"\(pull_reduce, .*\) adds the contributions of ranks \[\d(, \d)*\] to chunk \d+ twice",
        ),
    ]:
        rows_with = [
            (r, int(i)) for r, rows in enumerate(pulled.rows) for i in np.flatnonzero(rows[:, 0] == op)
        ]
        assert len(rows_with) == 3 * 4
        for rank, index in rows_with:
            rows = pulled.rows[rank].copy()
            rows[index, 0] = into
            with pytest.raises(DeviceProgramError, match=reason):
                check(replaced(pulled, rank, rows))


@pytest.mark.parametrize("op", [PUSH, PULL, PULL_REDUCE])
def test_a_direct_row_to_itself_or_of_a_chunk_out_of_range_is_refused(op: int) -> None:
    program = wholly_direct("ring", 3)
    rank, index = 1, int(np.flatnonzero(program.rows[1][:, 0] == (PUSH if op == PUSH else PULL_REDUCE))[0])
    for column, value, reason in [(2, rank, f"names rank {rank} as its peer"), (3, 3, "names chunk 3 of 3")]:
        rows = program.rows[rank].copy()
        rows[index, 0] = op
        rows[index, column] = value
        with pytest.raises(DeviceProgramError, match=re.escape(f"rank {rank} row {index} (") + ".*" + reason):
            check(replaced(program, rank, rows))


def interleaved(program: DeviceProgram, seed: int, calls: int = 1) -> list[list[list[int]]]:
    """The buffers after each of ``calls`` calls, running the rows with numbers, a row at a time
    of a rank drawn at random among those not waiting (each row atomic: an order the hardware
    could take, not every one); inboxes and flags are kept from call to call, as the device keeps
    them, and a call begins once every rank ended the one before (as the host sees to).  Rank
    r's input is BASE**r in every chunk, so a sum says how often it holds each rank's."""
    rng = random.Random(seed)
    inbox: dict[tuple[int, int], int] = {}
    flags: dict[tuple[int, int], int] = {}
    tables = [rows.tolist() for rows in program.rows]
    return [_call(tables, program.num_chunks, call, inbox, flags, rng) for call in range(1, calls + 1)]


def _call(
    tables: list[list[list[int]]],
    num_chunks: int,
    call: int,
    inbox: dict[tuple[int, int], int],
    flags: dict[tuple[int, int], int],
    rng: random.Random,
) -> list[list[int]]:
    """One call of :func:`interleaved`: every rank's buffers at its end."""
    buffers = [[BASE**r] * num_chunks for r in range(len(tables))]
    pcs = [0] * len(tables)

    def ready(rank: int) -> bool:
        if pcs[rank] == len(tables[rank]):
            return False
        op, _, _, _, _, flag, ordinal, per_call = tables[rank][pcs[rank]]
        return op != WAIT or flags.get((rank, flag), 0) >= flag_value(call, ordinal, per_call)

    while movable := [r for r in range(len(tables)) if ready(r)]:
        me = rng.choice(movable)
        op, _, peer, chunk, slot, flag, ordinal, per_call = tables[me][pcs[me]]
        pcs[me] += 1
        mine = buffers[me]
        if op == PUT:
            inbox[(peer, slot)] = mine[chunk]
        elif op == SIGNAL:
            flags[(peer, flag)] = flag_value(call, ordinal, per_call)
        elif op in (COPY, PULL):
            mine[chunk] = inbox[(me, slot)] if op == COPY else buffers[peer][chunk]
        elif op in (REDUCE, PULL_REDUCE):
            mine[chunk] += inbox[(me, slot)] if op == REDUCE else buffers[peer][chunk]
        elif op == PUSH:
            buffers[peer][chunk] = mine[chunk]
    assert pcs == [len(t) for t in tables], f"deadlocked in call {call}"
    return buffers


def sums_right(program: DeviceProgram, seed: int, calls: int = 1) -> bool:
    """Whether every rank ends every call with every chunk the sum of every rank's input."""
    total = sum(BASE**r for r in range(program.num_ranks))
    return all(
        v == total for buffers in interleaved(program, seed, calls) for chunks in buffers for v in chunks
    )


ORDERS = 60


def test_accepted_direct_programs_sum_right_in_every_order_drawn() -> None:
    stragglar = lowered("stragglar", 5)
    made = [
        wholly_direct("ring", 4),
        wholly_direct("rhd", 4),
        direct(stragglar, copies(stragglar), {t for t in sums(stragglar) if kept_that_round(stragglar, t)}),
    ]
    for program in made:
        assert refusal(program) is None
        assert all(sums_right(program, seed) for seed in range(ORDERS))


def test_refused_pulls_sum_wrong_in_some_order() -> None:
    """The races refused above are real: a pull without its wait, a pull of a swapped chunk."""
    ring = wholly_direct("ring", 4)
    pull = int(np.flatnonzero(ring.rows[3][:, 0] == PULL_REDUCE)[-1])
    stragglar = lowered("stragglar", 4)
    swap = next(t for t in sums(stragglar) if not kept_that_round(stragglar, t))
    for program in [without_wait(ring, 3, pull), direct(stragglar, set(), {swap})]:
        assert refusal(program) is not None
        assert not all(sums_right(program, seed) for seed in range(ORDERS))
