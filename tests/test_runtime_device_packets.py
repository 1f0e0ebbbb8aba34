"""The device executor's packets (small chunks moved as 8-byte packets of 4 data bytes and the
call's mark, with no flag): the kernel's own source compiled for the host (tests/fake_device.py),
every schedule's proved packet program exact, bit for bit the interpreter's, in every dtype, with
several threads a block (each thread forwards what it landed itself, with no barrier between
packet rows), call after call on the same inboxes; a packet an earlier call left is never taken
for this call's; a rank that never comes makes the others time out naming it, the round and the
slot; and under the race detector (ThreadSanitizer) the packet programs run race-free."""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import race_detector
from fake_device import HostRun
from test_runtime_device_kernel import EVERY_SCHEDULE, host, inputs, interpreted, same, words
from test_runtime_device_races import binary, usable

from stragglar.runtime.device.kernel import RANK_WORDS, SOURCE, VECTORS, slot_size
from stragglar.runtime.device.loopback import call_failure
from stragglar.runtime.device.lowering import lower
from stragglar.runtime.device.prover import DeviceProgramError, check
from stragglar.runtime.device.table import (
    COPY_PACKETS,
    PACKETS,
    PUT_PACKETS,
    REDUCE_PACKETS,
    SIGNAL,
    WAIT,
    DeviceProgram,
)
from stragglar.runtime.kernels import SUMS
from stragglar.runtime.program import compile_schedule
from stragglar.synth import synthesize

__all__ = ["binary", "host"]  # the fixtures, shared with the kernel's and the race detector's tests

DTYPES = list(SUMS)
LANDINGS = (COPY_PACKETS, REDUCE_PACKETS)


def packet_program(algorithm: str, n: int, chunks: int | None = None) -> DeviceProgram:
    program = lower(compile_schedule(synthesize(algorithm, n, chunks=chunks)), packets=True)
    check(program)
    return program


def test_a_packet_program_has_no_flags_and_only_packet_transfers() -> None:
    """What the lowering gives with ``packets``: puts and landings of packets, the same slots as
    the staged program's, no signal and no wait; and the inbox slots sized for the packets."""
    schedule = compile_schedule(synthesize("stragglar", 8, chunks=16))
    staged, packets = lower(schedule), lower(schedule, packets=True)
    assert packets.packets and not staged.packets and not packets.direct
    assert packets.inbox_slots == staged.inbox_slots
    for plain, moved in zip(staged.rows, packets.rows, strict=True):
        kept = plain[~np.isin(plain[:, 0], (SIGNAL, WAIT))]
        assert np.isin(moved[:, 0], PACKETS).all()
        assert (moved[:, 1:5] == kept[:, 1:5]).all()
    assert lower(schedule, direct=True, packets=True).rows[3].tolist() == packets.rows[3].tolist()
    for dtype in DTYPES:  # the largest chunk's packets: 63 elements, 4 bytes of them a packet
        itemsize = np.dtype(SUMS[dtype][1]).itemsize
        packets = -(-63 * itemsize // 4)
        assert slot_size(1000, 16, dtype, packets=True) * itemsize >= 8 * packets
        assert slot_size(1000, 16, dtype, packets=True) >= slot_size(1000, 16, dtype)


@pytest.mark.parametrize(("index", "algorithm", "n"), [(i, *s) for i, s in enumerate(EVERY_SCHEDULE)])
def test_every_schedule_as_packets_runs_exactly_as_the_interpreter(
    host: ctypes.CDLL, index: int, algorithm: str, n: int
) -> None:
    """Every algorithm at N = 2..17, the dtypes taken in turn, 1..3 blocks of 1..3 threads, two
    calls on the same inboxes (the second's packets must carry its own mark)."""
    dtype = DTYPES[index % len(DTYPES)]
    same(
        synthesize(algorithm, n),
        host,
        dtype,
        5 * n + 3,
        blocks=1 + index % 3,
        calls=2,
        threads=1 + index // 3 % 3,
        packets=True,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "chunks"), [(4, 32), (5, 9), (8, 64)])
def test_chunked_schedules_as_packets_in_every_dtype_are_exact(
    host: ctypes.CDLL, dtype: str, n: int, chunks: int
) -> None:
    """Odd chunk sizes (a float16 chunk ends in a half-filled packet), 3 blocks of 4 threads: a
    block's part starts at a whole packet, and every thread lands and forwards its own."""
    same(
        synthesize("stragglar", n, chunks=chunks),
        host,
        dtype,
        count=7 * chunks + 3,
        blocks=3,
        calls=3,
        threads=4,
        packets=True,
        vectors=VECTORS[chunks % len(VECTORS)],
    )


def waiting_for(program: DeviceProgram, peer: int) -> list[int]:
    """The ranks that land packets of ``peer``'s."""
    return [
        r
        for r, rows in enumerate(program.rows)
        if ((np.isin(rows[:, 0], LANDINGS)) & (rows[:, 2] == peer)).any()
    ]


def test_a_packet_an_earlier_call_left_is_not_taken_for_this_call_s(host: ctypes.CDLL) -> None:
    """Call 1 runs whole; in call 2 rank 3 never comes: the slots it writes still hold call 1's
    packets, data and all, and every rank that lands them times out instead (had it taken them,
    it would have ended the call).  A rank's threads give up each on its own, so a rank may name
    another wait than the one on rank 3; one that names rank 3 saw call 1's mark."""
    program = packet_program("stragglar", 4)
    run = HostRun(host, program, 24, "int32", 2, threads=2)
    data = [words(d, "int32").copy() for d in inputs(4, 24, "int32", 3)]
    assert not run.call([d.copy() for d in data])[:, 0].any()
    errors = run.call([d.copy() for d in data], timeout_s=0.3, absent=[3])
    assert waiting_for(program, 3) and all(errors[r, 0] == 2 for r in waiting_for(program, 3)), errors
    per_slot = run.slot_size * np.dtype(SUMS["int32"][1]).itemsize // 8
    for row in program.rows[3][program.rows[3][:, 0] == PUT_PACKETS]:
        first = run.inboxes[int(row[2])].view(np.uint64)[int(row[4]) * per_slot]
        assert first >> np.uint64(32) == 1  # call 1's mark, left in the slot
    for rank in (r for r in range(3) if errors[r, 3] == 3):
        row = program.rows[rank][int(errors[rank, 1])]
        assert row[0] in LANDINGS and row[2] == 3 and errors[rank, 4] == row[4]  # the slot
        assert (errors[rank, 5], errors[rank, 6]) == (2, 1)  # wanted call 2's mark, saw call 1's


@pytest.mark.parametrize("seed", range(3))
def test_a_rank_that_never_comes_times_out_the_others_and_the_error_names_it(
    host: ctypes.CDLL, seed: int
) -> None:
    """The ranks' error words may name each other in a ring (each thread gives up on its own, so
    a rank's first to give up may wait at a later row than its first stuck one; seen here), but
    the error raised names the rank that never came, from its count of calls, at the first wait
    for it; a rank whose word names it saw no mark in its fresh inbox."""
    program = packet_program("stragglar", 5)
    run = HostRun(host, program, 30, "float16", 2, threads=3)
    data = [words(d, "float16").copy() for d in inputs(5, 30, "float16", seed)]
    errors = run.call(data, timeout_s=0.3, absent=[4])
    assert all(errors[r, 0] == 1 for r in waiting_for(program, 4)) and not errors[4, 0], errors
    error = call_failure(program, run.words.reshape(-1, RANK_WORDS), 1)
    assert error is not None and (error.peer, error.reason) == (4, "timed out") and error.rank != 4
    assert "waiting for rank 4" in str(error) and error.round is not None, str(error)
    for rank in (r for r in range(4) if errors[r, 3] == 4):
        row = program.rows[rank][int(errors[rank, 1])]
        assert row[0] in LANDINGS and row[2] == 4 and errors[rank, 2] == row[1]  # the row's round
        assert errors[rank, 6] == 0 and errors[rank, 5] == 1  # a fresh inbox: no mark yet


def test_a_put_sending_another_chunk_is_caught_by_the_prover_and_sums_wrong_on_the_kernel(
    host: ctypes.CDLL,
) -> None:
    """The mutation the prover refuses is one the kernel would run to a wrong sum: nothing else
    stands between a wrong table and a wrong result, so the prover must see it."""
    program = lower(compile_schedule(synthesize("ring", 4)), packets=True)
    rows = [r.copy() for r in program.rows]
    index = int(np.flatnonzero(rows[0][:, 0] == PUT_PACKETS)[0])
    rows[0][index, 3] = (rows[0][index, 3] + 1) % program.num_chunks
    wrong = dataclasses.replace(program, rows=tuple(rows))
    with pytest.raises(DeviceProgramError, match="refused"):
        check(wrong)
    data = inputs(4, 16, "int32", 4)
    run = HostRun(host, wrong, 16, "int32", 1)
    buffers = [words(d, "int32").copy() for d in data]
    run.call(buffers, timeout_s=2.0)
    want = interpreted(synthesize("ring", 4), data, "int32")
    assert any(w.tobytes() != b.tobytes() for w, b in zip(want, buffers, strict=True))


@pytest.mark.parametrize(
    ("algorithm", "n", "chunks", "dtype"),
    [("stragglar", 5, None, "float16"), ("stragglar", 8, 16, "int64"), ("ring", 6, None, "float32")],
)
def test_packet_programs_run_race_free(
    binary: Path, tmp_path: Path, algorithm: str, n: int, chunks: int | None, dtype: str
) -> None:
    """Three calls on the same inboxes under ThreadSanitizer, 2 blocks of 3 threads a rank: a
    packet's store and load are atomic, so a landing that polls a slot its writer is still filling
    is no race; and with no barrier between packet rows, the thread that sends an element on is
    the one that landed it (else the detector would see a block's threads race on the chunk)."""
    schedule = synthesize(algorithm, n, chunks=chunks)
    data = inputs(n, 4 * n + 5, dtype, seed=n)
    program = lower(compile_schedule(schedule), packets=True)
    check(program)
    outcome = race_detector.run(
        binary, tmp_path, program, [words(d, dtype) for d in data], dtype, 2, 3, threads=3
    )
    usable(outcome)
    assert outcome.status == 0 and "WARNING: ThreadSanitizer" not in outcome.report, outcome.report
    assert outcome.buffers is not None
    for want, got in zip(interpreted(schedule, data, dtype), outcome.buffers, strict=True):
        assert want.tobytes() == got.tobytes()


def test_the_detector_sees_a_block_s_threads_race_where_packet_rows_share_out_elements_differently(
    tmp_path: Path,
) -> None:
    """What makes the missing barrier between packet rows safe, taken away: a kernel whose
    ``put_packets`` gives a block's units to its threads in reverse order sends elements another
    thread of the block landed, with nothing between, and the detector reports the race (so the
    test above, which finds none, can fail)."""
    forward = "for (long long u = lo / P::PER + threadIdx.x; u * P::PER < hi; u += blockDim.x) {"
    assert SOURCE.count(forward) == 2  # put_packets's loop, then land_packets's
    reverse = (
        "for (long long u = lo / P::PER + (blockDim.x - 1 - threadIdx.x); u * P::PER < hi; u += blockDim.x) {"
    )
    changed = SOURCE.replace(forward, reverse, 1)
    built = race_detector.build(tmp_path, changed)
    if isinstance(built, str):
        pytest.skip(built)
    schedule = synthesize("stragglar", 5)
    data = inputs(5, 5 * 3 * 2 + 1, "float32", seed=5)  # parts of 3 units a block: every thread has one
    program = lower(compile_schedule(schedule), packets=True)
    outcome = race_detector.run(
        built, tmp_path, program, [words(d, "float32") for d in data], "float32", 2, 2, threads=3
    )
    usable(outcome)
    assert outcome.status == race_detector.RACE and "WARNING: ThreadSanitizer: data race" in outcome.report


def test_error_words_that_name_each_other_in_a_ring_are_traced_to_the_rank_that_never_ran() -> None:
    """Words made by hand: ranks 0 and 2 name each other, 1 and 3 name 0 and 2, rank 4 ended
    call 6 and never ran call 7: the error names rank 4, at the round of the first failed rank's
    first wait for it, and the others as timed out too.  Where no rank is missing the first
    failed rank's own word is the error, as before."""
    program = packet_program("stragglar", 5)
    words_of = np.zeros((5, RANK_WORDS), dtype=np.uint64)
    words_of[:4, 0] = 7  # ranks 0..3 ended call 7 (a kernel counts a call it gave up in)
    words_of[4, 0] = 6
    for rank, peer in ((0, 2), (1, 0), (2, 0), (3, 2)):
        index = int(np.flatnonzero(np.isin(program.rows[rank][:, 0], LANDINGS))[-1])
        words_of[rank, 2:] = (7, index, program.rows[rank][index, 1], peer, 0, 7, 6, 0)
    error = call_failure(program, words_of, 7)
    assert error is not None and (error.rank, error.peer, error.reason) == (0, 4, "timed out"), error
    first = program.rows[0][np.isin(program.rows[0][:, 0], LANDINGS) & (program.rows[0][:, 2] == 4)][0]
    assert (error.phase, error.round) == program.phase_round(int(first[1]))
    assert str(error).endswith(
        "rank 4's kernel did not run this call (it ended call 6) (ranks [1, 2, 3] timed out too)"
    )
    words_of[4, 0] = 7  # rank 4 ran it too, and did not give up: no rank is missing
    error = call_failure(program, words_of, 7)
    assert error is not None and (error.rank, error.peer) == (0, 2), error
