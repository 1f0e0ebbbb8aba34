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

from stragglar.runtime.device.kernel import SOURCE, VECTORS, slot_size
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


def test_a_packet_an_earlier_call_left_is_not_taken_for_this_call_s(host: ctypes.CDLL) -> None:
    """Call 1 runs whole; in call 2 rank 3 never comes: the slots it would write still hold call
    1's packets, data and all, and the ranks waiting on them time out instead of landing them."""
    program = packet_program("stragglar", 4)
    run = HostRun(host, program, 24, "int32", 2, threads=2)
    data = [words(d, "int32").copy() for d in inputs(4, 24, "int32", 3)]
    assert not run.call([d.copy() for d in data])[:, 0].any()
    errors = run.call([d.copy() for d in data], timeout_s=0.3, absent=[3])
    failed = [r for r in range(4) if errors[r, 0] == 2]
    blamed = [r for r in failed if errors[r, 3] == 3]
    assert blamed and 3 not in failed, errors
    for rank in blamed:
        row = program.rows[rank][int(errors[rank, 1])]
        assert row[0] in (COPY_PACKETS, REDUCE_PACKETS) and row[2] == 3
        assert errors[rank, 4] == row[4]  # the slot
        assert (errors[rank, 5], errors[rank, 6]) == (2, 1)  # wanted call 2's mark, saw call 1's


def test_a_rank_that_never_comes_times_out_the_others_naming_it(host: ctypes.CDLL) -> None:
    program = packet_program("stragglar", 5)
    run = HostRun(host, program, 30, "float16", 2, threads=3)
    data = [words(d, "float16").copy() for d in inputs(5, 30, "float16", 1)]
    errors = run.call(data, timeout_s=0.3, absent=[4])
    failed = [r for r in range(5) if errors[r, 0]]
    blamed = [r for r in failed if errors[r, 3] == 4]
    assert blamed and 4 not in failed, errors
    for rank in blamed:
        index = int(errors[rank, 1])
        row = program.rows[rank][index]
        assert row[0] in (COPY_PACKETS, REDUCE_PACKETS) and row[2] == 4
        assert errors[rank, 2] == row[1]  # the row's round
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
