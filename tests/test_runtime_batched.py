"""Batched loopback rounds: the tables, run by the host backend, equal the reference interpreter
bit for bit (every algorithm, N = 2..17, chunked schedules, every dtype NumPy has, partial round
ranges), and what a GPU would launch per round stays a handful of stages."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from stragglar.runtime import plan_for
from stragglar.runtime.batched import BatchedPlan, HostBackend, batched_plan, run_batched, run_rounds
from stragglar.runtime.local import run_local
from stragglar.runtime.program import Plan
from stragglar.schedule import Schedule
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import prove

NUMPY_DTYPES = ("float16", "float32", "float64", "int32", "int64")


def tables(schedule: Schedule, count: int) -> tuple[list[Plan], BatchedPlan]:
    proof = prove(schedule)
    plans = [plan_for(proof, r, count) for r in range(schedule.num_ranks)]
    return plans, batched_plan(plans, schedule.late_rank)


def inputs(n: int, count: int, dtype: str, seed: int) -> list[np.ndarray]:
    """Values whose sums round (floats from a normal draw), so any change of order shows."""
    rng = np.random.default_rng(seed)
    if dtype.startswith("int"):
        return [rng.integers(-(2**20), 2**20, count).astype(dtype) for _ in range(n)]
    return [rng.standard_normal(count).astype(dtype) for _ in range(n)]


def same_as_interpreter(schedule: Schedule, count: int, dtype: str, seed: int = 0) -> None:
    plans, plan = tables(schedule, count)
    reference = inputs(schedule.num_ranks, count, dtype, seed)
    batched = [b.copy() for b in reference]
    run_local(reference, plans)
    run_batched(batched, plan, HostBackend())
    for rank, (want, got) in enumerate(zip(reference, batched, strict=True)):
        assert want.tobytes() == got.tobytes(), (schedule.algorithm, schedule.num_ranks, count, dtype, rank)


EVERY_SCHEDULE = [(a, n) for a in ALGORITHMS for n in range(2, 18) if a != "rhd" or not n & (n - 1)]


@pytest.mark.parametrize(("algorithm", "n"), EVERY_SCHEDULE)
def test_batched_rounds_equal_the_interpreter_for_every_algorithm(algorithm: str, n: int) -> None:
    schedule = synthesize(algorithm, n)
    for count in (0, 1, n - 1, 97):  # empty chunks, one element, uneven chunks
        same_as_interpreter(schedule, count, "float32", seed=n)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize(("n", "chunks"), [(4, 32), (8, 64), (5, 9), (16, 64)])
def test_chunked_schedules_and_every_dtype_are_exact(dtype: str, n: int, chunks: int) -> None:
    same_as_interpreter(synthesize("stragglar", n, chunks=chunks), 1000, dtype, seed=chunks)


def test_a_moved_straggler_and_partial_round_ranges_compose_to_the_sum() -> None:
    schedule = synthesize("stragglar", 7, straggler=2)
    plans, plan = tables(schedule, 500)
    assert plan.late_rank == 2 and 0 < plan.joins < len(plan.rounds)
    reference = inputs(7, 500, "float64", 3)
    parts = [b.copy() for b in reference]
    run_local(reference, plans)
    backend = HostBackend()
    backend.bind(parts, plan)
    cuts = [0, 1, plan.joins, plan.joins + 2, len(plan.rounds)]
    for first, stop in itertools.pairwise(cuts):
        run_rounds(plan, first, stop, backend)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(reference, parts, strict=True))


def test_a_round_is_a_gather_and_a_landing_with_reductions_first() -> None:
    """What a GPU launches: per round one gather and one landing (that adds the reductions):
    2 launches, not ~3N."""
    plans, plan = tables(synthesize("stragglar", 8, chunks=64), 1 << 12)
    assert plan.launches == 2 * len(plan.rounds)
    for table in plan.rounds:
        slots = table.land[:, 3]
        assert list(slots) == sorted(slots) and table.land[:, 2].sum() == table.size
        assert (table.gather[:, 2:] == table.land[:, 2:]).all()  # one slot per piece, both ends
        reductions = {
            (p.rank, start)
            for p in plans
            for step in p.steps
            if step.round == table.round
            for m in step.recvs
            for start, _, reduce in m.pieces
            if reduce
        }
        for rank, start, _, slot in table.land.tolist():
            assert (slot < table.reduced) == ((rank, start) in reductions), (table.round, rank, start)


def test_the_late_rank_joins_at_its_first_round_and_sleeps_between_the_ranges() -> None:
    schedule = synthesize("stragglar", 6)
    _, plan = tables(schedule, 60)
    first = next(i for i, t in enumerate(plan.rounds) if schedule.late_rank in t.ranks)
    assert plan.joins == first
    bufs = inputs(6, 60, "float32", 1)
    timelines = run_batched(bufs, plan, HostBackend(), straggler_delay=0.05)
    late = timelines[schedule.late_rank]
    assert late.arrived - late.start >= 0.05
    assert all(t.arrived == t.start for t in timelines if t.rank != schedule.late_rank)
    hidden = [t.phase_done[0] for t in timelines if t.rank != schedule.late_rank]
    assert all(done is not None and done < late.arrived for done in hidden)  # phase 1 ran before
    assert late.phase_done[0] is None  # it has no part in the first phase
    assert all(t.phase_done[-1] == t.done for t in timelines)  # the last phase ends with the call


def test_two_pieces_landing_on_one_element_in_a_round_are_refused() -> None:
    """A proved schedule never does it (one peer per round); the tables say so if one did."""
    from stragglar.runtime.batched import _check_disjoint

    _check_disjoint([(1, 0, 5, 0), (1, 5, 5, 5), (2, 0, 5, 10)], 3)
    with pytest.raises(AssertionError, match="round 3: two pieces land on rank 1's element 4"):
        _check_disjoint([(1, 0, 5, 0), (1, 4, 5, 5)], 3)
