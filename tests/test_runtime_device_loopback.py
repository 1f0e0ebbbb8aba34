"""``allreduce_local(..., engine="device")`` with a CuPy stand-in that runs the kernel's own
source compiled for the host (tests/fake_device.py): ranks' kernels in threads of their own,
sums bit for bit the interpreter's call after call, the late rank launched after its delay, a
launch the device could not hold refused before anything runs, a table the prover refuses never
launched, a wait that times out raised as a RankError naming rank, round and peer, and options
that do not apply refused."""

from __future__ import annotations

import ctypes
import dataclasses
import re
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from cupy_surface import bare
from fake_device import FakeCuda, host_or_skip, installed

from stragglar.errors import ArgumentError, InputError
from stragglar.runtime import RankError, allreduce_local
from stragglar.runtime.device import loopback, programs
from stragglar.runtime.device.kernel import OWN_TUNING, PACKET_BYTES, RANK_WORDS, Tuning, kernel_name
from stragglar.runtime.device.lowering import lower
from stragglar.runtime.device.prover import DeviceProgramError
from stragglar.runtime.device.table import PUT_PACKETS, WAIT
from stragglar.runtime.program import RankProgram, compile_schedule
from stragglar.synth import synthesize
from stragglar.verify import prove


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return host_or_skip(tmp_path_factory)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch, host: ctypes.CDLL) -> Iterator[FakeCuda]:
    monkeypatch.setattr(programs, "_programs", type(programs._programs)())
    yield from installed(monkeypatch, host)


def buffers(n: int, count: int, dtype: str, seed: int) -> list[Any]:
    import cupy  # the stand-in

    rng = np.random.default_rng(seed)
    if dtype.startswith("int"):
        return [cupy.asarray(rng.integers(-(2**20), 2**20, count).astype(dtype)) for _ in range(n)]
    return [cupy.asarray(rng.standard_normal(count).astype(dtype)) for _ in range(n)]


def interpreted(data: list[np.ndarray], proof: object) -> list[np.ndarray]:
    reference = [np.array(d).view(np.ndarray) for d in data]
    allreduce_local(reference, proof)  # type: ignore[arg-type]
    return reference


@pytest.mark.parametrize(
    ("algorithm", "n", "chunks", "dtype"),
    [
        ("stragglar", 5, None, "float16"),
        ("stragglar", 8, 24, "float32"),
        ("ring", 6, None, "int64"),
        ("rhd", 8, None, "float64"),
        ("direct", 3, None, "int32"),
    ],
)
@pytest.mark.parametrize("way", ["packets", "direct", "staged"])
def test_the_device_engine_sums_as_the_interpreter_call_after_call(
    cuda: FakeCuda,
    monkeypatch: pytest.MonkeyPatch,
    algorithm: str,
    n: int,
    chunks: int | None,
    dtype: str,
    way: str,
) -> None:
    """On flags (the engine's own), direct transfers where safe and every transfer staged
    (``staged=True``); with packets on, chunks this small move as packets."""
    if way == "packets":
        monkeypatch.setattr(programs, "OWN_TUNING", Tuning(packet_bytes=PACKET_BYTES))
    staged = True if way == "staged" else None
    proof = prove(synthesize(algorithm, n, chunks=chunks))
    for call in range(3):  # the same flags and inboxes: nothing reset between calls
        data = buffers(n, 97, dtype, seed=call)
        want = interpreted(data, proof)
        timelines = allreduce_local(data, proof, engine="device", staged=staged)
        assert [t.rank for t in timelines] == list(range(n))
        for rank, (w, g) in enumerate(zip(want, data, strict=True)):
            assert w.tobytes() == np.array(g).tobytes(), (call, rank)
    assert len(cuda.launches) == 3 * n and cuda.system == [False] * 3 * n  # one GPU: flags at its scope
    (program,) = programs._programs.values()  # the one program the calls ran
    assert (program.packets, program.direct) == (way == "packets", way == "direct")


def exact_calls(proof: Any, calls: int, **options: Any) -> None:
    """``calls`` calls, each on fresh buffers (other addresses) with other values, each exact."""
    n = proof.num_ranks
    for call in range(calls):
        data = buffers(n, 61 + 8 * call, "float32", seed=10 + call)[: n - 1] + buffers(1, 61, "float32", call)
        data = [d[:61] for d in data]
        want = interpreted(data, proof)
        allreduce_local(data, proof, engine="device", **options)
        assert all(w.tobytes() == np.array(g).tobytes() for w, g in zip(want, data, strict=True)), call


@pytest.mark.parametrize("staged", [None, True], ids=["direct", "staged"])
def test_punctual_calls_replay_one_graph_of_every_ranks_kernel(cuda: FakeCuda, staged: bool | None) -> None:
    """The first call launches each rank's kernel, the second captures them (on a stream of the
    call's that forks to the ranks' streams and joins them again: the stand-in fails a capture
    that leaves one unjoined), the rest replay; the graph reads each call's buffers from the
    device, so it runs on fresh ones, and the device counts the calls, so the replays need no
    new arguments."""
    proof = prove(synthesize("stragglar", 5, chunks=7))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a capture that failed would warn
        exact_calls(proof, 5, staged=staged)
    assert cuda.captures == 1 and len(cuda.launches) == 5 * 5


def test_graphs_off_launches_every_rank_every_call_and_never_captures(cuda: FakeCuda) -> None:
    proof = prove(synthesize("ring", 4))
    exact_calls(proof, 3, graphs=False, staged=True)
    assert cuda.captures == 0 and len(cuda.launches) == 3 * 4
    exact_calls(proof, 2)  # on: the first call on it captures
    assert cuda.captures == 1


def test_a_capture_that_fails_warns_once_and_every_call_launches_eagerly(cuda: FakeCuda) -> None:
    cuda.refuse_capture = "operation not permitted when stream is capturing"
    proof = prove(synthesize("stragglar", 4))
    with pytest.warns(
        RuntimeWarning, match="could not capture the ranks' kernel launches in a CUDA graph .* operation not"
    ) as warned:
        exact_calls(proof, 4)
    assert len(warned) == 1 and cuda.captures == 0 and len(cuda.launches) == 4 * 4


def test_a_late_rank_is_launched_by_itself_graphs_or_not(cuda: FakeCuda) -> None:
    proof = prove(synthesize("stragglar", 4))
    for _ in range(3):
        allreduce_local(buffers(4, 40, "float32", seed=3), proof, 0.01, engine="device")
    assert cuda.captures == 0 and len(cuda.launches) == 3 * 4


def test_a_call_interrupted_in_the_late_ranks_delay_ends_at_once_and_the_next_is_exact(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted while the late rank's kernel waits for its delay: it is launched at once, so
    the call's kernels all end (none writes the caller's buffers after it raised) long before
    their timeout, and the calls after it are exact."""
    proof = prove(synthesize("stragglar", 5))
    monkeypatch.setattr(loopback, "WAIT_TIMEOUT_S", 5.0)
    exact_calls(proof, 1)

    def interrupted(until: float) -> float:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(loopback, "sleep_until", interrupted)
        began = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            allreduce_local(buffers(5, 61, "float32", seed=1), proof, 30.0, engine="device")
        assert time.perf_counter() - began < 2.0 and len(cuda.launches) == 2 * 5
    exact_calls(proof, 3)


def test_a_launch_that_fails_waits_for_the_launched_kernels_and_the_next_call_is_exact(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The late rank's launch fails: the others' kernels give up waiting for it (the call
    raises only once they have ended), and the device's counts part (the late rank's is one
    behind); the next call sets them to the host's first, and is exact.  The call cut short has
    no time on the GPU to give a benchmark."""
    proof = prove(synthesize("stragglar", 5))
    late = proof.schedule.late_rank
    monkeypatch.setattr(loopback, "WAIT_TIMEOUT_S", 0.2)
    exact_calls(proof, 1)
    launch = loopback.DeviceLoopback.launch

    def failing(self: loopback.DeviceLoopback, ranks: Sequence[int], timeout_s: float) -> None:
        if late in ranks:
            raise RuntimeError("cudaErrorLaunchFailure")
        launch(self, ranks, timeout_s)

    with monkeypatch.context() as patch:
        patch.setattr(loopback.DeviceLoopback, "launch", failing)
        with pytest.raises(RuntimeError, match="cudaErrorLaunchFailure"):
            allreduce_local(buffers(5, 61, "float32", seed=1), proof, 0.01, engine="device")
    (state,) = loopback._loopbacks.values()
    progress = state.words.reshape(-1, RANK_WORDS)[:, 0]
    assert progress[late] == 1 and all(progress[r] == 2 for r in range(5) if r != late)
    with pytest.raises(RuntimeError, match="did not end: it has no time on the GPU"):
        state.elapsed_s()  # the call cut short has no time, not the call before's
    exact_calls(proof, 3)
    assert state.elapsed_s() >= 0  # a call that ended has


def test_a_call_the_device_did_not_count_is_an_error_not_a_result(cuda: FakeCuda) -> None:
    """Every rank's count set back by one after a call: the kernels agree with each other (so
    nothing times out) but not with the host, which refuses the call it cannot account for."""
    proof = prove(synthesize("ring", 3))
    exact_calls(proof, 1)
    (state,) = loopback._loopbacks.values()
    state.words.reshape(-1, RANK_WORDS)[:, 0] -= 1
    with pytest.raises(RankError, match="rank 0's kernel ended call 1, not call 2") as caught:
        allreduce_local(buffers(3, 61, "float32", seed=1), proof, engine="device")
    assert caught.value.rank == 0 and caught.value.reason == "failed"


def test_the_late_rank_is_launched_after_its_delay(cuda: FakeCuda) -> None:
    proof = prove(synthesize("stragglar", 4))
    data = buffers(4, 40, "float32", seed=3)
    want = interpreted(data, proof)
    late = int(data[proof.schedule.late_rank].data.ptr)
    timelines = allreduce_local(data, proof, 0.2, engine="device")
    when = dict(cuda.launches)  # when each kernel began on the stand-in's device
    start = timelines[0].start  # the call's, on the host's clock (the kernels' too)
    assert when[late] - start >= 0.2 and all(t - start < 0.1 for b, t in when.items() if b != late)
    assert timelines[proof.schedule.late_rank].arrived - timelines[0].start >= 0.2
    late_line = timelines[proof.schedule.late_rank]
    assert late_line.phase_done[0] is None and late_line.phase_done[1] == late_line.done  # not in phase 0
    assert timelines[0].phase_done == (timelines[0].done, timelines[0].done)
    assert all(w.tobytes() == np.array(g).tobytes() for w, g in zip(want, data, strict=True))


def test_a_launch_the_device_cannot_hold_at_once_is_refused_before_it_runs(
    monkeypatch: pytest.MonkeyPatch, host: ctypes.CDLL
) -> None:
    """Blocks of the engine's threads, 40 registers each: one multiprocessor whose registers hold
    three at once (its 2048 threads would hold four or more), so four ranks are refused, three
    run."""
    small = {
        "multiProcessorCount": 1,
        "maxThreadsPerMultiProcessor": 2048,
        "maxBlocksPerMultiProcessor": 32,
        "regsPerMultiprocessor": 3 * 40 * OWN_TUNING.threads + 100,
        "sharedMemPerMultiprocessor": 49152,
    }
    fake = next(installed(monkeypatch, host, small))
    proof = prove(synthesize("stragglar", 4))
    data = buffers(4, 40, "float32", seed=4)
    before = [np.array(d) for d in data]
    with pytest.raises(InputError, match=r"holds 3 blocks .* fewer than the 4 ranks"):
        allreduce_local(data, proof, engine="device")
    assert not fake.launches and all((b == np.array(d)).all() for b, d in zip(before, data, strict=True))
    three = buffers(3, 40, "float32", seed=4)
    allreduce_local(three, prove(synthesize("stragglar", 3)), engine="device")  # one block each
    assert len(fake.launches) == 3


def test_more_ranks_than_a_gpu_runs_kernels_at_once_are_refused_before_launch(cuda: FakeCuda) -> None:
    """A GPU runs at most 128 kernels at once: the 129th rank's would wait for a slot that the
    spinning others never give up."""
    data = buffers(129, 129, "float32", seed=1)
    with pytest.raises(InputError, match=r"runs at most 128 kernels at once, not 129$"):
        allreduce_local(data, prove(synthesize("ring", 129)), engine="device")
    assert not cuda.launches


@pytest.mark.parametrize("packets", [False, True], ids=["flags", "packets"])
def test_a_program_the_prover_refuses_is_never_launched(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch, packets: bool
) -> None:
    """On flags a wait taken out before a partial sum; as packets, the second put of rank 0's
    peer taken out (its landing would wait for ever)."""

    def broken(ranks: list[RankProgram], direct: bool, packets: bool) -> object:
        program = lower(ranks, direct, packets)
        rows = [r.copy() for r in program.rows]
        if packets:
            rows[1] = np.delete(rows[1], np.flatnonzero(rows[1][:, 0] == PUT_PACKETS)[1], axis=0)
        else:
            rows[0] = np.delete(rows[0], np.flatnonzero(rows[0][:, 0] == WAIT)[1], axis=0)
        return dataclasses.replace(program, rows=tuple(rows))

    if packets:
        monkeypatch.setattr(programs, "OWN_TUNING", Tuning(packet_bytes=PACKET_BYTES))
    monkeypatch.setattr(programs, "lower", broken)
    data = buffers(4, 40, "float32", seed=5)
    with pytest.raises(DeviceProgramError, match=r"slot" if packets else r"rank 0 .* without waiting"):
        allreduce_local(data, prove(synthesize("ring", 4)), engine="device")
    assert not cuda.launches


@pytest.mark.parametrize("packets", [False, True], ids=["flags", "packets"])
def test_a_rank_that_never_starts_is_reported_with_round_and_peer(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch, packets: bool
) -> None:
    """The wait that timed out named: a flag and the value wanted, or a packet's inbox slot and
    the call's mark wanted (1: the first call) against the mark seen (0: a fresh inbox)."""
    if packets:
        monkeypatch.setattr(programs, "OWN_TUNING", Tuning(packet_bytes=PACKET_BYTES))
    proof = prove(synthesize("stragglar", 5))
    late = proof.schedule.late_rank
    launch = loopback.DeviceLoopback.launch

    def all_but_the_late(self: loopback.DeviceLoopback, ranks: Sequence[int], timeout_s: float) -> None:
        launch(self, [r for r in ranks if r != late], timeout_s)

    monkeypatch.setattr(loopback.DeviceLoopback, "launch", all_but_the_late)
    monkeypatch.setattr(loopback, "WAIT_TIMEOUT_S", 0.3)
    with pytest.raises(RankError) as caught:
        allreduce_local(buffers(5, 40, "float32", seed=6), proof, engine="device")
    error = caught.value
    assert error.reason == "timed out" and error.peer == late and error.rank != late
    assert error.round is not None and error.phase in [p.name for p in proof.schedule.phases]
    assert f"waiting for rank {late}" in str(error)
    waited = (
        r"for a packet of inbox slot \d+ marked 1, saw mark 0" if packets else r"for flag \d+ >= \d+, saw \d+"
    )
    assert re.search(waited, str(error)), str(error)


def test_options_that_do_not_apply_are_refused(cuda: FakeCuda) -> None:
    proof = prove(synthesize("ring", 3))
    with pytest.raises(InputError, match=r"runs on CuPy arrays or torch CUDA tensors, not NumPy arrays$"):
        allreduce_local([np.zeros(4, np.float32) for _ in range(3)], proof, engine="device")
    with pytest.raises(ArgumentError, match="graphs must be True or False, got 'yes'"):
        allreduce_local(buffers(3, 4, "float32", 0), proof, engine="device", graphs="yes")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="unknown engine 'gpu'"):
        allreduce_local(buffers(3, 4, "float32", 0), proof, engine="gpu")
    with pytest.raises(InputError, match="staged applies to the device engine"):
        allreduce_local(buffers(3, 4, "float32", 0), proof, staged=True)
    with pytest.raises(ArgumentError, match="staged must be True or False, got 1"):
        allreduce_local(buffers(3, 4, "float32", 0), proof, engine="device", staged=1)  # type: ignore[arg-type]
    assert not cuda.launches


def test_blocks_a_rank_follow_the_device_and_the_chunks() -> None:
    """On an H200 (132 multiprocessors, 4 blocks of 512 threads each at 32 registers): 528 blocks
    at once, so 8 ranks get the most (16) on large chunks, one block on a chunk of few elements."""
    from fake_device import H200

    resident = loopback.resident_blocks(H200, registers=32, shared_bytes=4, threads=512)
    assert resident == 132 * 4
    program = lower(compile_schedule(synthesize("stragglar", 8)))
    assert loopback.blocks_for(program, 7 * 2**20, "float32", resident, Tuning(max_blocks=16)) == 16
    assert (
        loopback.blocks_for(program, 7 * 2**20, "float32", resident, Tuning(max_blocks=100)) == 528 // 8
    )  # as many as fit
    assert loopback.blocks_for(program, 7 * 100, "float32", resident, Tuning(threads=512)) == 1
    assert (
        loopback.blocks_for(program, 7 * 100, "float32", resident, Tuning(threads=128)) == 1
    )  # 100 elements: one block
    assert (
        loopback.blocks_for(program, 7 * 1000, "float32", resident, Tuning(threads=128)) == 8
    )  # 1000: 8 of 128 threads
    assert (
        loopback.blocks_for(program, 7 * 2**20, "float32", 40, Tuning(max_blocks=16)) == 5
    )  # 40 shared by 8 ranks


def test_a_program_of_packets_shares_its_units_among_the_blocks_not_its_elements() -> None:
    """A thread lands a whole packet unit (two float16 elements, one float32 or float64), so a
    chunk of 1024 float16 elements, 512 units, fills 4 blocks of 128 threads, not 8 half-idle."""
    program = lower(compile_schedule(synthesize("stragglar", 8)), packets=True)
    staged = lower(compile_schedule(synthesize("stragglar", 8)))
    tuning = Tuning(threads=128)
    assert loopback.blocks_for(program, 7 * 1024, "float16", 528, tuning) == 4
    assert loopback.blocks_for(staged, 7 * 1024, "float16", 528, tuning) == 8
    assert loopback.blocks_for(program, 7 * 1024, "float32", 528, tuning) == 8
    assert loopback.blocks_for(program, 7 * 1024, "float64", 528, tuning) == 8
    assert loopback.blocks_for(program, 7 * 1025, "float16", 528, tuning) == 5  # 513 units


def test_a_tuning_sets_the_kernels_blocks_threads_vectors_and_pause_and_every_call_stays_exact(
    cuda: FakeCuda,
) -> None:
    """What a benchmark measures against the engine's own tuning: the blocks a rank (at most
    ``max_blocks``; a chunk of 1600 elements shares among at most 4 blocks of 512 threads, 13 of
    128), a block's threads, and the kernel of ``vectors`` and ``pause_ns``, each call on fresh
    buffers exact."""
    import cupy  # the stand-in

    proof = prove(synthesize("stragglar", 4, chunks=6))
    program = programs.program_for(proof, direct=True)
    count = 6 * 1600
    tunings = [
        Tuning(max_blocks=2, vectors=8, threads=512),
        Tuning(max_blocks=3, vectors=2, threads=512),
        Tuning(max_blocks=64, vectors=1, threads=512),
        Tuning(max_blocks=64, vectors=1, threads=128, pause_ns=0),  # 1600 elements: 13 blocks of 128
    ]
    for call, tuning in enumerate(tunings):
        data = buffers(4, count, "float32", seed=call)
        want = interpreted(data, proof)
        addresses = [int(d.ctypes.data) for d in data]
        fingerprint = proof.schedule.fingerprint
        loopback.run_device_loopback(
            cupy, addresses, count, "float32", 0, program, fingerprint, 0.0, 3, tuning=tuning
        )
        assert all(w.tobytes() == np.array(g).tobytes() for w, g in zip(want, data, strict=True)), tuning
    shapes = [
        (kernel_name("float32", 8), 64, 2, 512),
        (kernel_name("float32", 2), 64, 3, 512),
        (kernel_name("float32", 1), 64, 4, 512),
        (kernel_name("float32", 1), 0, 13, 128),
    ]
    assert cuda.shapes == [shape for shape in shapes for _ in range(4)]


def test_a_tuning_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="vectors must be one of"):
        Tuning(vectors=3)
    with pytest.raises(ValueError, match="max_blocks must be at least 1"):
        Tuning(max_blocks=0)
    with pytest.raises(ValueError, match="threads must be one of"):
        Tuning(threads=1024)
    with pytest.raises(ValueError, match="pause_ns must be one of"):
        Tuning(pause_ns=1)
    with pytest.raises(ValueError, match="packet_bytes must be at least 0"):
        Tuning(packet_bytes=-1)


def test_packets_are_chosen_by_the_largest_chunk_s_bytes() -> None:
    """The threshold the benchmarks time packets at, 64 KiB a chunk: at N = 8, C = 64 a float32
    buffer of 4 MiB has chunks of exactly 64 KiB (packets), one more element makes the largest
    chunk 4 bytes more (flags); bytes, not elements (float16 twice the elements for the same
    bytes); none at 0, the engine's own until a GPU has timed them."""
    on = Tuning(packet_bytes=PACKET_BYTES)
    assert PACKET_BYTES == 64 * 1024
    assert on.moves_packets(2**20, 64, "float32") and not on.moves_packets(2**20 + 1, 64, "float32")
    assert on.moves_packets(2**21, 64, "float16") and not on.moves_packets(2**21, 64, "float64")
    assert not Tuning().moves_packets(64, 64, "float32") and OWN_TUNING.packet_bytes == 0
    assert not on.moves_packets(0, 64, "float32")  # no chunk holds anything: no packet to send


def test_cupy_buffers_that_share_memory_are_refused_before_any_kernel(cuda: FakeCuda) -> None:
    """The buffers' extents come from CuPy's own addresses: views of one array that overlap."""
    import cupy  # the stand-in

    whole = cupy.asarray(np.arange(24, dtype=np.float32))
    proof = prove(synthesize("ring", 3))
    with pytest.raises(InputError, match="the buffers of ranks 1 and 2 overlap"):
        allreduce_local([whole[0:8], whole[8:16], whole[12:20]], proof, engine="device")
    allreduce_local([whole[0:8], whole[8:16], whole[16:24]], proof, engine="device")  # apart: runs
    assert len(cuda.launches) == 3


def test_torch_cpu_tensors_and_buffers_on_two_gpus_are_refused(cuda: FakeCuda) -> None:
    import fake_device

    torch = pytest.importorskip("torch")
    proof = prove(synthesize("ring", 3))
    with pytest.raises(
        InputError, match=r"runs on CuPy arrays or torch CUDA tensors, not torch CPU tensors$"
    ):
        allreduce_local([torch.zeros(4) for _ in range(3)], proof, engine="device")

    class OnSecondGpu(fake_device.DeviceArray):
        @property
        def device(self) -> Any:
            return type("Device", (), {"id": 1})()

    data = buffers(3, 4, "float32", 0)
    data[2] = data[2].view(OnSecondGpu)
    with pytest.raises(InputError, match=r"on one GPU, got buffers on GPUs \[0, 1\]"):
        allreduce_local(data, proof, engine="device")
    assert not cuda.launches


def test_a_call_inside_the_caller_s_graph_capture_is_refused_before_it_touches_the_capture(
    cuda: FakeCuda,
) -> None:
    """The call would wait on the host for its kernels, which a capture forbids: one line, no
    work recorded into the caller's graph, and the capture still ends cleanly."""
    import cupy  # the stand-in

    proof = prove(synthesize("ring", 3))
    data = buffers(3, 40, "float32", 0)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        with pytest.raises(InputError, match="cannot run while the current stream is capturing a CUDA graph"):
            allreduce_local(data, proof, engine="device")
        graph = stream.end_capture()
    assert not bare(graph).branches and not cuda.launches
    want = interpreted(data, proof)
    allreduce_local(data, proof, engine="device")  # outside the capture: runs
    assert all(w.tobytes() == np.array(g).tobytes() for w, g in zip(want, data, strict=True))


def test_a_torch_tensor_is_refused_while_torch_s_current_stream_captures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's current stream is the one a torch caller captures on (CuPy's is not asked); a
    tensor off the GPU never asks it (a torch without CUDA cannot)."""
    torch = pytest.importorskip("torch")
    from stragglar.runtime.device import buffers as device_buffers

    class OnGpu(torch.Tensor):  # type: ignore[misc,name-defined]
        @property
        def is_cuda(self) -> bool:
            return True

    tensor = torch.zeros(4).as_subclass(OnGpu)
    device_buffers.check_not_capturing(torch.zeros(4))  # on the CPU: torch's CUDA is not asked
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(InputError, match="capturing a CUDA graph"):
        device_buffers.check_not_capturing(tensor)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    device_buffers.check_not_capturing(tensor)


def test_the_error_raised_names_the_rank_nobody_heard_from_not_those_waiting_on_waiters() -> None:
    """Rank 1 waited for rank 0, which waited for rank 3 (absent, no error of its own): the
    error is rank 0's, naming rank 3, and says rank 1 timed out too."""
    program = lower(compile_schedule(synthesize("stragglar", 4)))
    words = np.zeros((4, 8), dtype=np.uint64)
    words[0] = [1, 2, 1, 3, 3, 5, 4, 0]  # claimed, row 2, round 1, peer 3, flag 3, wanted 5, saw 4, block 0
    words[1] = [1, 7, 2, 0, 0, 6, 5, 1]
    error = loopback.first_failure(program, words, [0, 1], {})
    phase, number = program.phase_round(1)
    assert (error.rank, error.peer, error.round, error.phase) == (0, 3, number, phase)
    assert str(error).endswith("block 0 waited at row 2 for flag 3 >= 5, saw 4 (ranks [1] timed out too)")
    assert loopback.first_failure(program, words, [1], {}).peer == 0  # alone, rank 1's own


def test_the_kernels_and_their_memory_go_on_the_buffers_gpu(cuda: FakeCuda) -> None:
    """Buffers on GPU 1 while the caller's current GPU is 0: the engine makes theirs current for
    its allocations and launches, and gives the caller's back."""
    proof = prove(synthesize("stragglar", 4))
    data = buffers(4, 33, "float32", seed=3)
    for buffer in data:
        buffer.gpu = 1
    want = interpreted(data, proof)
    allreduce_local(data, proof, engine="device")
    assert all(w.tobytes() == np.array(g).tobytes() for w, g in zip(want, data, strict=True))
    assert cuda.current_devices == {1} and cuda.device == 0
