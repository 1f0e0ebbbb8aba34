"""The z3 checker and the simulator agree on the mutation suite of tests/test_verify_simulate_mutations.py.

Both must give the same verdict on every mutant, agree with the independent numeric check, and
name the same kind of fault: the same structural rule in the same round, or a wrong final value
whose z3 counter-example really leaves that value wrong when re-run without z3.  z3 costs a few
milliseconds a query, so the default run takes a seeded sample of the sampled tier (a few
mutants of every mutation type at every size), ``-m slow`` a larger one (it was the sampled tier
whole, half of CI's slow tier), and ``-m manual`` the sampled tier whole and the exhaustive one.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
import pytest
from test_verify_simulate_mutations import (
    CHUNKED,
    STRUCTURAL_KINDS,
    Mutant,
    all_mutants,
    schedules_for,
    structurally_sound,
    wrong_values,
)
from test_verify_smt import assert_real_counterexample

from stragglar.synth import ALGORITHMS
from stragglar.verify import Violation, find_violation
from stragglar.verify.smt import smt_find_violation

Cell = tuple[int, int]  # (rank, chunk)
PER_TYPE_AND_SIZE = {"few": 3, "more": 12}  # mutants of each type ("drop", "src", ...) per size


def mutation_type(m: Mutant) -> str:
    return m.name.split(":")[0].split(" ")[0]


def some_of_each_type(mutants: Iterator[Mutant], pick: random.Random, each: int) -> list[Mutant]:
    by_type: defaultdict[str, list[Mutant]] = defaultdict(list)
    for m in mutants:
        by_type[mutation_type(m)].append(m)
    return [m for group in by_type.values() for m in pick.sample(group, min(each, len(group)))]


def assert_same_fault(m: Mutant, ours: Violation, theirs: Violation, sound: bool, wrong: set[Cell]) -> None:
    """The same rule broken in the same round, or a wrong value that z3 shows with real inputs."""
    if ours.kind in STRUCTURAL_KINDS or theirs.kind in STRUCTURAL_KINDS:
        assert not sound and (ours.kind, ours.phase, ours.round) == (theirs.kind, theirs.phase, theirs.round)
        assert (ours.phase, ours.round) >= m.first, (m.name, ours.message)
    else:
        assert (ours.rank, ours.chunk) in wrong, (m.name, ours.message)
        assert_real_counterexample(m.schedule, ours)


@pytest.mark.parametrize("algorithm", [*ALGORITHMS, CHUNKED])
@pytest.mark.parametrize(
    "tier",
    # the sampled tier whole takes ~8 minutes on 2 cores, the exhaustive one ("all") over ten
    [
        "few",
        pytest.param("more", marks=pytest.mark.slow),
        pytest.param("sampled", marks=pytest.mark.manual),
        pytest.param("all", marks=pytest.mark.manual),
    ],
)
def test_smt_and_simulator_agree_on_every_mutant(algorithm: str, tier: str) -> None:
    rng, pick = np.random.default_rng(7), random.Random(2024)
    disagreements: list[str] = []
    checked = 0
    for schedule in schedules_for(algorithm):
        n = schedule.num_ranks
        mutants = all_mutants(schedule, None if tier == "all" else pick)
        each = PER_TYPE_AND_SIZE.get(tier)
        for m in mutants if each is None else some_of_each_type(mutants, pick, each):
            checked += 1
            ours, theirs = smt_find_violation(m.schedule), find_violation(m.schedule)
            sound = structurally_sound(m.schedule)
            wrong = wrong_values(m.schedule, rng) if sound else set()
            if (ours is None) != (theirs is None) or (ours is None) != (sound and not wrong):
                disagreements.append(f"N={n} {m.name}: z3 {ours}; simulator {theirs}; numeric {sound, wrong}")
            elif ours is not None and theirs is not None:
                assert_same_fault(m, ours, theirs, sound, wrong)
    assert not disagreements, "\n".join(disagreements[:10])
    assert checked >= 50
