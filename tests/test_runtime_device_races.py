"""The device executor's kernel under a race detector (tests/race_detector.py: ThreadSanitizer on
the kernel's own source compiled for the host): the proved programs of every algorithm, chunked
ones, staged and direct, run call after call on fresh buffers with no data race and the
interpreter's bits; and the detector is shown to see what the flags are there for: a program
with a wait taken out races."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import race_detector
from test_runtime_device_kernel import CHUNKED, EVERY_SCHEDULE, inputs, interpreted, words

from stragglar.runtime.device.kernel import OWN_TUNING, VECTORS
from stragglar.runtime.device.lowering import lower
from stragglar.runtime.device.prover import check
from stragglar.runtime.device.table import WAIT, DeviceProgram
from stragglar.runtime.program import compile_schedule
from stragglar.schedule import Schedule
from stragglar.synth import synthesize


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = race_detector.build(tmp_path_factory.mktemp("races"))
    if isinstance(built, str):
        pytest.skip(built)
    return built


def race_free_and_exact(
    binary: Path,
    folder: Path,
    schedule: Schedule,
    dtype: str,
    count: int,
    blocks: int,
    direct: bool,
    vectors: int = OWN_TUNING.vectors,
) -> None:
    data = inputs(schedule.num_ranks, count, dtype, seed=count + schedule.num_ranks)
    program = lower(compile_schedule(schedule), direct)
    check(program)
    data_words = [words(d, dtype) for d in data]
    outcome = race_detector.run(binary, folder, program, data_words, dtype, blocks, 3, vectors)
    usable(outcome)
    assert outcome.status == 0, outcome.report
    assert "WARNING: ThreadSanitizer" not in outcome.report, outcome.report
    assert outcome.buffers is not None
    want = interpreted(schedule, data, dtype)
    for rank, (w, g) in enumerate(zip(want, outcome.buffers, strict=True)):
        assert w.tobytes() == g.tobytes(), (schedule.algorithm, schedule.num_ranks, dtype, rank, direct)


def usable(outcome: race_detector.Outcome) -> None:
    """Skip where ThreadSanitizer itself cannot run (an operating system whose memory layout it
    refuses)."""
    if outcome.status != 0 and "FATAL: ThreadSanitizer" in outcome.report:
        pytest.skip(outcome.report.strip().splitlines()[0])


@pytest.mark.parametrize("direct", [False, True], ids=["staged", "direct"])
@pytest.mark.parametrize(
    ("algorithm", "n", "chunks"),
    [("stragglar", 5, None), ("stragglar", 8, None), ("ring", 4, None), ("rhd", 8, None), ("direct", 3, None)]
    + [("stragglar", n, c) for n, c in CHUNKED[:2]],
)
def test_proved_programs_run_without_a_data_race(
    binary: Path, tmp_path: Path, algorithm: str, n: int, chunks: int | None, direct: bool
) -> None:
    """A block's part of a chunk (1 to 3 blocks) long enough for 16-byte moves in every word size,
    with single elements around them, the kernel's vector counts taken in turn; three calls on the
    same inboxes and flags."""
    schedule = synthesize(algorithm, n, chunks=chunks)
    for i, dtype in enumerate(race_detector.DTYPES):
        count = schedule.num_chunks * 50 + 5
        vectors = VECTORS[(n + i) % len(VECTORS)]
        blocks = 1 + (n + i) % 3
        race_free_and_exact(binary, tmp_path, schedule, dtype, count, blocks, direct, vectors)


@pytest.mark.slow
@pytest.mark.parametrize("direct", [False, True], ids=["staged", "direct"])
def test_every_schedule_and_every_chunked_one_runs_without_a_data_race(
    binary: Path, tmp_path: Path, direct: bool
) -> None:
    cases = [synthesize(a, n) for a, n in EVERY_SCHEDULE] + [
        synthesize("stragglar", n, chunks=c) for n, c in CHUNKED
    ]
    for index, schedule in enumerate(cases):
        dtype = race_detector.DTYPES[index % len(race_detector.DTYPES)]
        vectors = VECTORS[index % len(VECTORS)]
        race_free_and_exact(
            binary, tmp_path, schedule, dtype, 3 * schedule.num_chunks + 2, 2, direct, vectors
        )


def without_a_wait(program: DeviceProgram, rank: int) -> DeviceProgram:
    """``program`` with the first wait of ``rank`` taken out, the one before its first read of a
    peer's data (the prover refuses it; the run does not consult the prover).  Nothing else orders
    that read after the peer's caller wrote its input, so the race shows in every run.  (A wait for
    one value too few would race only where it is run before the peer raises the flag anew: that
    one is caught by the prover alone.)"""
    rows = [r.copy() for r in program.rows]
    first = int(np.flatnonzero(rows[rank][:, 0] == WAIT)[0])
    rows[rank] = np.delete(rows[rank], first, axis=0)
    return dataclasses.replace(program, rows=tuple(rows))


@pytest.mark.parametrize("direct", [False, True], ids=["staged", "direct"])
def test_a_program_with_a_wait_taken_out_races(binary: Path, tmp_path: Path, direct: bool) -> None:
    schedule = synthesize("ring", 4)
    program = without_a_wait(lower(compile_schedule(schedule), direct), rank=1)
    data = [words(d, "float32") for d in inputs(4, 4 * 50, "float32", seed=1)]
    outcome = race_detector.run(binary, tmp_path, program, data, "float32", 1, 1)
    usable(outcome)
    assert outcome.status == race_detector.RACE and "WARNING: ThreadSanitizer: data race" in outcome.report
    assert "run_program" in outcome.report  # in the kernel's own code
