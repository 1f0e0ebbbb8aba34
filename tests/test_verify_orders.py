"""Every rank adds each chunk in one order: true of every schedule stragglar generates, told of
one that is correct but groups a sum differently on two ranks (whose float32 results then differ,
shown on the runtime's interpreter), and said by ``verify`` and ``show`` as a warning."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
from cli_results import run

from stragglar import msccl, mscclpp
from stragglar.formats import schedule_json
from stragglar.runtime import allreduce_local
from stragglar.schedule import Op, Phase, Schedule, Transfer
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import prove
from stragglar.verify.orders import order_disagreement

R, C = Op.REDUCE, Op.COPY

# Ranks 0 and 1 swap and add, then each adds 2's and 3's contributions, in opposite turns, and
# hands its sum to 2 or 3: every rank ends with every contribution once, in two groupings.
GROUPED_TWO_WAYS = Schedule(
    "two-ways",
    4,
    1,
    None,
    (
        Phase(
            "all",
            (0, 1, 2, 3),
            (
                (Transfer(0, 1, 0, R), Transfer(1, 0, 0, R)),
                (Transfer(2, 0, 0, R), Transfer(3, 1, 0, R)),
                (Transfer(3, 0, 0, R), Transfer(2, 1, 0, R)),
                (Transfer(0, 2, 0, C), Transfer(1, 3, 0, C)),
            ),
        ),
    ),
)
SAID = (
    "ranks 0 and 1 end with chunk 0 added in different orders (3 + (2 + (0 + 1)) and 2 + (3 + (0 + 1))): "
    "in floating point their results differ in the last bits, and replicas drift apart"
)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_generated_schedule_adds_each_chunk_alike_on_every_rank(algorithm: str) -> None:
    sizes = [n for n in [*range(2, 18), 31, 64, 100] if algorithm != "rhd" or not n & (n - 1)]
    for n in sizes:
        assert order_disagreement(synthesize(algorithm, n)) is None, (algorithm, n)


@pytest.mark.parametrize(("n", "chunks"), [(3, 7), (4, 32), (5, 9), (8, 64), (16, 64), (17, 40)])
def test_chunked_schedules_add_each_chunk_alike_on_every_rank(n: int, chunks: int) -> None:
    assert order_disagreement(synthesize("stragglar", n, chunks=chunks)) is None


def test_a_correct_schedule_that_groups_a_sum_two_ways_is_told_and_its_replicas_differ() -> None:
    proof = prove(GROUPED_TWO_WAYS)  # a correct AllReduce in exact arithmetic
    assert order_disagreement(GROUPED_TWO_WAYS) == SAID
    data = [np.array([x], dtype=np.float32) for x in (1e8, 1.0, -1e8, 1.0)]
    allreduce_local(data, proof)
    assert [float(d[0]) for d in data] == [1.0, 0.0, 1.0, 0.0]  # the replicas' bits differ


@pytest.mark.parametrize("enabled", [True, False])
def test_the_orders_leave_the_garbage_collector_as_they_found_it(enabled: bool) -> None:
    """They pause it while they intern their pairs (stragglar.schedule.gc_paused)."""
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert order_disagreement(GROUPED_TWO_WAYS) is not None
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_verify_and_show_warn_of_it_and_still_prove(tmp_path: Path) -> None:
    path = tmp_path / "two-ways.json"
    path.write_text(schedule_json.dumps(GROUPED_TWO_WAYS))
    for command in ("verify", "show"):
        result = run(command, str(path))
        assert result.exit_code == 0, result.output
        assert result.stderr == f"warning: {path}: {SAID}\n"
    ours = tmp_path / "ours.json"
    ours.write_text(schedule_json.dumps(synthesize("stragglar", 8)))
    assert run("verify", str(ours)).stderr == ""


def test_verify_and_show_warn_of_an_msccl_file_or_plan_that_groups_a_sum_two_ways(tmp_path: Path) -> None:
    """The executors' files of the same schedule: their provers tell it too, naming GPUs."""
    said = SAID.replace("ranks 0 and 1", "gpus 0 and 1")
    files = {
        "two-ways.xml": msccl.lower(prove(GROUPED_TWO_WAYS)),
        "two-ways.plan.json": mscclpp.lower(prove(GROUPED_TWO_WAYS)).text,
    }
    for name, text in files.items():
        path = tmp_path / name
        path.write_text(text)
        for command in ("verify", "show"):
            result = run(command, str(path))
            assert result.exit_code == 0, result.output
            assert result.stderr == f"warning: {path}: {said}\n", (name, command)
