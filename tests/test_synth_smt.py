"""z3 synthesis of StragglAR's phase 2: optimal, proved by both provers, honest about running out
of time."""

from __future__ import annotations

import time

import pytest

from stragglar.errors import ResourceError
from stragglar.schedule import round_lower_bound
from stragglar.synth import synthesize
from stragglar.synth.smt import copy_rounds_status, smt_copy_rounds
from stragglar.verify import find_violation, prove
from stragglar.verify.smt import smt_prove


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8])
def test_smt_synthesis_is_optimal_and_proved_by_both_checkers(n: int) -> None:
    s = synthesize("stragglar", n, method="smt")
    assert (s.algorithm, s.straggler, s.num_chunks) == ("stragglar", n - 1, n - 1)
    assert s.exposed_rounds == round_lower_bound(n) == s.metadata["lower_bound"]
    assert s.metadata["method"] == "smt" and [p.name for p in s.phases][-1] == "exchange"
    assert prove(s).num_rounds == smt_prove(s).num_rounds
    assert all(len({t.src for t in rnd}) == len(rnd) for rnd in s.phases[-1].rounds)  # one chunk per sender
    moved = synthesize("stragglar", n, 0, method="smt")
    assert moved.straggler == 0 and find_violation(moved) is None


@pytest.mark.parametrize("n", [3, 4, 6, 7])
def test_smt_synthesis_boundary_unsat_one_round_below_the_bound_and_sat_at_it(n: int) -> None:
    bound = round_lower_bound(n)
    assert (copy_rounds_status(n, bound - 1), copy_rounds_status(n, bound)) == ("unsat", "sat")


def test_timeout_is_reported_not_hidden() -> None:
    with pytest.raises(ResourceError, match="z3 did not decide 16 rounds for 14 GPUs within 50 ms"):
        smt_copy_rounds(14, round_lower_bound(14), timeout_s=0.05)
    start = time.perf_counter()
    with pytest.raises(ResourceError):
        synthesize("stragglar", 14, method="smt", timeout_s=0.05)
    assert time.perf_counter() - start < 1.0  # wall clock, building the model included
