"""Which transfers the device lowering makes direct: never one that a same-round access makes
unsafe, every one of a Ring's, and a program the prover accepts for every schedule; with the
lowering's own judgement of order switched off (everything direct), the prover refuses."""

from __future__ import annotations

from collections import Counter

import pytest

from stragglar.runtime.device.lowering import direct, lower
from stragglar.runtime.device.lowering.direct import Landing, Transfer, landings
from stragglar.runtime.device.prover import DeviceProgramError, check
from stragglar.runtime.program import compile_schedule
from stragglar.synth import ALGORITHMS, synthesize

EVERY_SCHEDULE = [(a, n) for a in ALGORITHMS for n in range(2, 18) if a != "rhd" or not n & (n - 1)]


@pytest.mark.parametrize(("algorithm", "n"), EVERY_SCHEDULE)
def test_no_direct_transfer_meets_a_same_round_access_of_its_chunk(algorithm: str, n: int) -> None:
    """A push into a chunk its receiver sends, or another writes, in the same round, or a pull
    of a chunk its sender rewrites in that round (a swap), would race whatever the flags: the
    necessary conditions, checked transfer by transfer against the schedule itself."""
    chosen = landings(compile_schedule(synthesize(algorithm, n)))
    by_round: Counter[tuple[int, int, int, str]] = Counter()
    for t in chosen:
        by_round[(t.receiver, t.chunk, t.round, "in")] += 1
        by_round[(t.sender, t.chunk, t.round, "out")] += 1
    for t, how in chosen.items():
        if how is Landing.PUSH:
            assert not t.reduce
            assert by_round[(t.receiver, t.chunk, t.round, "in")] == 1, t
            assert by_round[(t.receiver, t.chunk, t.round, "out")] == 0, t
        if how is Landing.PULL:
            assert by_round[(t.sender, t.chunk, t.round, "in")] == 0, t


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13])
def test_every_transfer_of_a_ring_is_direct(n: int) -> None:
    """A Ring's rank sends at each round the chunk it reduced or received the round before, to the
    next rank, which has not touched that chunk since the message that ordered it: nothing staged."""
    chosen = landings(compile_schedule(synthesize("ring", n)))
    assert set(chosen.values()) <= {Landing.PUSH, Landing.PULL}
    assert all((how is Landing.PULL) == t.reduce for t, how in chosen.items())
    assert lower(compile_schedule(synthesize("ring", n)), True).inbox_slots == (0,) * n


@pytest.mark.parametrize(
    ("algorithm", "n", "chunks"), [("stragglar", 8, None), ("stragglar", 6, 20), ("direct", 5, None)]
)
def test_the_prover_accepts_the_lowering_and_refuses_it_when_every_transfer_is_direct(
    monkeypatch: pytest.MonkeyPatch, algorithm: str, n: int, chunks: int | None
) -> None:
    programs = compile_schedule(synthesize(algorithm, n, chunks=chunks))
    program = lower(programs, True)
    check(program)
    assert program.direct and sum(program.inbox_slots) < sum(lower(programs).inbox_slots)

    def every_order_holds(ranks: object, wanted: set[tuple[object, object]]) -> set[tuple[object, object]]:
        return wanted

    monkeypatch.setattr(direct, "_held", every_order_holds)
    careless = lower(programs, True)
    assert sum(careless.inbox_slots) < sum(program.inbox_slots)
    with pytest.raises(DeviceProgramError, match="device program refused"):
        check(careless)


def test_a_transfer_is_keyed_by_its_chunk_round_and_ranks() -> None:
    chosen = landings(compile_schedule(synthesize("stragglar", 4)))
    keys = Counter((t.sender, t.receiver, t.round, t.chunk) for t in chosen)
    assert max(keys.values()) == 1 and all(isinstance(t, Transfer) for t in chosen)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_what_stays_staged_in_the_papers_schedule_is_its_swaps(n: int) -> None:
    """The README's and docs' account: in the paper's schedule every transfer is direct but the
    two sides of a swap (two ranks exchanging one chunk in one round), 84 of 98 at N = 8."""
    chosen = landings(compile_schedule(synthesize("stragglar", n)))
    moves = {(t.sender, t.receiver, t.round, t.chunk) for t in chosen}
    staged = [t for t, how in chosen.items() if how is Landing.STAGED]
    assert staged and all((t.receiver, t.sender, t.round, t.chunk) in moves for t in staged)
    if n == 8:
        assert (len(chosen) - len(staged), len(chosen)) == (84, 98)


@pytest.mark.parametrize(
    ("algorithm", "n", "chunks"),
    [("stragglar", 8, None), ("stragglar", 5, 12), ("ring", 4, None), ("rhd", 8, None)],
)
def test_each_rank_s_phases_are_those_of_its_rows_rounds(algorithm: str, n: int, chunks: int | None) -> None:
    """The phases a call's timeline marks done for a rank (worked out once per program) against
    each of its rows' rounds named by phase: the late rank of StragglAR has none in the first."""
    schedule = synthesize(algorithm, n, chunks=chunks)
    for program in (lower(compile_schedule(schedule)), lower(compile_schedule(schedule), True)):
        for rank, rows in enumerate(program.rows):
            named = {program.phases.index(program.phase_round(int(r))[0]) for r in rows[:, 1]}
            assert program.rank_phases[rank] == tuple(phase in named for phase in range(len(program.phases)))
            assert program.phase_ends(rank, 2.5) == tuple(
                2.5 if phase in named else None for phase in range(len(program.phases))
            )
        if algorithm == "stragglar":
            assert not program.rank_phases[schedule.late_rank][0]
