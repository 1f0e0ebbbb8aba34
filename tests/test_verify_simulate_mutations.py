"""Mutation testing of the verifier against an independent numeric model.

Every single-transfer mutant of every synthesized schedule must either be
rejected by ``stragglar.verify`` or still be an AllReduce, and the verifier's
verdict must match a check that shares no code with it: the structural rules
restated here, and random uint64 inputs summed with numpy (wrapping mod 2**64).
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import pytest

from stragglar.schedule import Op, Phase, Round, Schedule, Transfer
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import Violation, find_violation

SIZES = range(2, 11)
EXHAUSTIVE_UP_TO = 6  # larger sizes mutate a seeded sample of transfers unless run with -m slow
SAMPLED_TRANSFERS = 24
STRUCTURAL_KINDS = {"port", "double-write", "membership", "range", "self", "op"}

Position = tuple[int, int]  # (phase index, round index)


@dataclass(frozen=True)
class Mutant:
    name: str
    schedule: Schedule
    first: Position  # the earliest round the mutation touches


def structurally_sound(s: Schedule) -> bool:
    """The schedule rules, restated without stragglar.verify: one-port, one write per value, in range."""
    ranks, chunks = range(s.num_ranks), range(s.num_chunks)
    return all(
        sound_round(rnd, frozenset(phase.ranks), ranks, chunks) for phase in s.phases for rnd in phase.rounds
    )


@functools.lru_cache(maxsize=1 << 16)  # a mutant changes one or two rounds: the others are known
def sound_round(rnd: Round, members: frozenset[int], ranks: range, chunks: range) -> bool:
    peers_out: defaultdict[int, set[int]] = defaultdict(set)
    peers_in: defaultdict[int, set[int]] = defaultdict(set)
    for t in rnd:
        peers_out[t.src].add(t.dst)
        peers_in[t.dst].add(t.src)
    if any(len(peers) > 1 for peers in [*peers_out.values(), *peers_in.values()]):
        return False
    if max(Counter((t.dst, t.chunk) for t in rnd).values(), default=0) > 1:
        return False
    return all(well_formed(t, members, ranks, chunks) for t in rnd)


def well_formed(t: Transfer, members: frozenset[int], ranks: range, chunks: range) -> bool:
    in_range = t.src in ranks and t.dst in ranks and t.chunk in chunks
    return (
        in_range and t.src != t.dst and t.src in members and t.dst in members and t.op in (Op.COPY, Op.REDUCE)
    )


def wrong_values(s: Schedule, rng: np.random.Generator) -> set[tuple[int, int]]:
    """Run ``s`` on distinct random uint64 inputs; return the (rank, chunk) that miss the true sum."""
    values = rng.integers(0, 2**64 - 1, size=(s.num_ranks, s.num_chunks), dtype=np.uint64, endpoint=True)
    assert np.unique(values).size == values.size
    expected = values.sum(axis=0, dtype=np.uint64)
    for phase in s.phases:
        for rnd in phase.rounds:
            if rnd:
                src, dst, chunk, add = columns(rnd)
                # The right side is computed in full before the assignment: a synchronous round.
                values[dst, chunk] = values[src, chunk] + np.where(add == 1, values[dst, chunk], np.uint64(0))
    rank, chunk = np.nonzero(values != expected)
    return set(zip(rank.tolist(), chunk.tolist(), strict=True))


@functools.lru_cache(maxsize=1 << 16)
def columns(rnd: Round) -> np.ndarray:
    """A round's sources, destinations, chunks and reduce flags, one row each."""
    return np.transpose([(t.src, t.dst, t.chunk, t.op is Op.REDUCE) for t in rnd])


def positions(s: Schedule) -> list[Position]:
    return [(pi, ri) for pi, phase in enumerate(s.phases) for ri in range(len(phase.rounds))]


def with_rounds(s: Schedule, changes: dict[Position, Round]) -> Schedule:
    phases = tuple(
        Phase(p.name, p.ranks, tuple(changes.get((pi, ri), rnd) for ri, rnd in enumerate(p.rounds)))
        for pi, p in enumerate(s.phases)
    )
    return replace(s, phases=phases)


def mutants_of(s: Schedule, order: list[Position], k: int, ti: int) -> Iterator[Mutant]:
    """Every single-transfer mutation of transfer ``ti`` in round ``order[k]``."""
    here = order[k]
    rnd = s.phases[here[0]].rounds[here[1]]
    t = rnd[ti]
    rest = rnd[:ti] + rnd[ti + 1 :]

    def swapped(name: str, new: Transfer) -> Mutant:
        return Mutant(f"{name}: {t} -> {new}", with_rounds(s, {here: (*rest[:ti], new, *rest[ti:])}), here)

    yield Mutant(f"drop {t}", with_rounds(s, {here: rest}), here)
    yield Mutant(f"duplicate {t}", with_rounds(s, {here: (*rnd, t)}), here)
    yield swapped("flip op", t._replace(op=Op.COPY if t.op is Op.REDUCE else Op.REDUCE))
    yield from (swapped("chunk", t._replace(chunk=c)) for c in range(s.num_chunks) if c != t.chunk)
    yield from (swapped("src", t._replace(src=r)) for r in range(s.num_ranks) if r != t.src)
    yield from (swapped("dst", t._replace(dst=r)) for r in range(s.num_ranks) if r != t.dst)
    for there in order[max(k - 1, 0) : k + 2]:
        if there != here:
            moved = {here: rest, there: (*s.phases[there[0]].rounds[there[1]], t)}
            yield Mutant(f"move {t} from {here} to {there}", with_rounds(s, moved), min(here, there))


def all_mutants(s: Schedule, pick: random.Random | None) -> Iterator[Mutant]:
    """Mutants of every transfer, or of a sample of them for large ``s`` when ``pick`` is given."""
    order = positions(s)
    sites = [(k, ti) for k, (pi, ri) in enumerate(order) for ti in range(len(s.phases[pi].rounds[ri]))]
    if pick is not None and s.num_ranks > EXHAUSTIVE_UP_TO:
        sites = sorted(pick.sample(sites, min(SAMPLED_TRANSFERS, len(sites))))
    for k, ti in sites:
        yield from mutants_of(s, order, k, ti)


def assert_located(v: Violation, m: Mutant, wrong: set[tuple[int, int]]) -> None:
    """The violation names its round, rank and chunk, and is no earlier than the mutation."""
    assert re.search(rf"\brank {v.rank}\b", v.message) and re.search(rf"\bchunk {v.chunk}\b", v.message)
    if v.round is not None:
        assert re.search(rf"\bphase {v.phase} .* round {v.round}\b", v.message), v.message
    if v.kind == "missing":  # found in the final state, after every round
        assert v.message.startswith("final state:") and (v.rank, v.chunk) in wrong, (m.name, v.message)
    else:
        assert v.phase is not None and v.round is not None
        assert (v.phase, v.round) >= m.first, (m.name, v.message)


def sizes_for(algorithm: str) -> list[int]:
    return [n for n in SIZES if algorithm != "rhd" or n & (n - 1) == 0]


CHUNKED = "stragglar-chunked"  # StragglAR in more than N-1 chunks
CHUNKED_SIZES = ((2, 3), (3, 5), (3, 6), (4, 7), (5, 9), (6, 12), (8, 16))


def schedules_for(kind: str) -> list[Schedule]:
    if kind == CHUNKED:
        return [synthesize("stragglar", n, chunks=c) for n, c in CHUNKED_SIZES]
    return [synthesize(kind, n) for n in sizes_for(kind)]


@pytest.mark.parametrize("algorithm", [*ALGORITHMS, CHUNKED])
@pytest.mark.parametrize(
    "exhaustive", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["sampled", "all"]
)
def test_every_mutant_is_killed_or_still_an_allreduce(algorithm: str, exhaustive: bool) -> None:
    rng, pick = np.random.default_rng(2024), None if exhaustive else random.Random(2024)
    tally: Counter[str] = Counter()
    disagreements: list[str] = []
    for schedule in schedules_for(algorithm):
        n = schedule.num_ranks
        assert (
            find_violation(schedule) is None
            and structurally_sound(schedule)
            and not wrong_values(schedule, rng)
        )
        for m in all_mutants(schedule, pick):
            v = find_violation(m.schedule)
            sound = structurally_sound(m.schedule)
            wrong = wrong_values(m.schedule, rng) if sound else set()
            equivalent = sound and not wrong
            tally["equivalent" if equivalent else "non-equivalent"] += 1
            tally["killed"] += v is not None
            if (v is None) != equivalent:
                disagreements.append(f"N={n} {m.name}: verifier says {v}, independent check {equivalent}")
            elif v is not None:
                assert v.kind not in STRUCTURAL_KINDS or not sound, (m.name, v.message)
                assert_located(v, m, wrong)
    killed, real = tally["killed"], tally["non-equivalent"]
    print(
        f"\n{algorithm}: killed {killed}/{real} non-equivalent mutants ({killed / real:.1%}), "
        f"{tally['equivalent']} equivalent, {len(schedules_for(algorithm))} schedules"
    )
    assert not disagreements, "\n".join(disagreements[:10])
    assert killed == real
