"""Device ranks on a group (stragglar/runtime/device/group.py), each rank a thread here with a
CuPy stand-in whose IPC handles are addresses and whose kernels are the CUDA source compiled for
the host: handles exchanged once and cached, sums bit for bit the interpreter's call after call,
a rank whose kernel never runs named by every rank's error, and a rank that never comes to a
call ends the others' calls with an error, not a hang.  Registered buffers
(stragglar/runtime/device/shared.py) run direct transfers, exact call after call; every rank
refuses alike a registration that cannot be made or a call whose ranks disagree on it; a rank
that closed its registration alone ends the call with errors, never a wrong sum."""

from __future__ import annotations

import ctypes
import gc
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from cupy_surface import bare
from fake_device import H200, FakeCuda, host_or_skip, installed
from test_runtime_cupy_nccl import run_ranks
from unused_comm import UnusedComm

from stragglar.errors import InputError
from stragglar.runtime import (
    ArgumentError,
    MismatchError,
    RankError,
    allreduce,
    allreduce_local,
    register_buffer,
    release_graphs,
)
from stragglar.runtime.device import group, program_for, programs, shared, states
from stragglar.runtime.device.kernel import PACKET_BYTES, RANK_WORDS, Tuning
from stragglar.runtime.device.lowering import lower
from stragglar.runtime.program import compile_schedule
from stragglar.schedule import Schedule
from stragglar.synth import synthesize
from stragglar.verify import prove


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return host_or_skip(tmp_path_factory)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch, host: ctypes.CDLL) -> Iterator[FakeCuda]:
    monkeypatch.setattr(group, "CACHED", 32)  # every rank is in this process: keep each one's state
    yield from installed(monkeypatch, host)


class AllGather:
    """An all-gather of integers among threads, bounded by ``timeout`` (a rank that never comes
    breaks it: a TimeoutError, as a group's gather would fail)."""

    def __init__(self, size: int, timeout: float = 10.0) -> None:
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.values: list[Sequence[int]] = [()] * size
        self.calls = 0

    def of(self, rank: int) -> Callable[[Sequence[int]], list[tuple[int, ...]]]:
        def gather(values: Sequence[int]) -> list[tuple[int, ...]]:
            self.values[rank] = list(values)
            try:
                self.barrier.wait()
                out = [tuple(v) for v in self.values]
                self.barrier.wait()  # everyone has read before anyone writes again
            except threading.BrokenBarrierError:
                raise TimeoutError("a rank did not come to the gather") from None
            if rank == 0:
                self.calls += 1
            return out

        return gather


def ranks_run(
    schedule: Schedule,
    data: list[Any],
    gather: AllGather,
    delay: float = 0.0,
    absent: Sequence[int] = (),
    timeout: float = 30.0,
    owner: str = "group",
    channel: int | None = None,
    start: Callable[[int], float] = lambda rank: 0.0,
) -> list[Any]:
    """Every rank but ``absent`` in a thread of its own, on ``channel`` of the group ``owner``, each
    beginning its call ``start(rank)`` s after its thread; each rank's result or exception."""
    import cupy

    proof = prove(schedule)
    program = program_for(proof, direct=False)
    results: list[Any] = [None] * schedule.num_ranks

    def rank(r: int) -> None:
        time.sleep(start(r))
        try:
            results[r] = group.DeviceCall(
                cupy,
                states.states_for(owner, channel)[0],
                program,
                proof.schedule.fingerprint,
                r,
                int(data[r].data.ptr),
                int(data[r].shape[0]),
                str(data[r].dtype),
                0,
                delay,
                schedule.late_rank,
                timeout,
                gather.of(r),
            ).run()
        except Exception as e:  # handed to the test
            results[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(schedule.num_ranks) if r not in absent]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    return results


def exact(schedule: Schedule, seed: int, **options: Any) -> bool:
    """Whether every rank of a call on fresh data (``options``: :func:`ranks_run`'s) sums exactly."""
    data = fresh(schedule.num_ranks, 40, "float32", seed)
    want = [np.array(d).view(np.ndarray) for d in data]
    allreduce_local(want, prove(schedule))
    results = ranks_run(schedule, data, **options)
    assert not [r for r in results if isinstance(r, Exception)], results
    return all(w.tobytes() == np.array(g).tobytes() for w, g in zip(want, data, strict=True))


def kept_states() -> list[group.DeviceRank]:
    """Every staged call's state this process keeps, on every group and channel."""
    return [state for kept in states._kept.values() for state in kept.values()]


def drop_states() -> None:
    """Let go of every group's staged states, as torch's destroy of each group would."""
    for kept in list(states._kept.values()):
        states.forget(kept)
    gc.collect()


def fresh(n: int, count: int, dtype: str, seed: int) -> list[Any]:
    import cupy

    rng = np.random.default_rng(seed)
    if dtype.startswith("int"):
        return [cupy.asarray(rng.integers(-(2**20), 2**20, count).astype(dtype)) for _ in range(n)]
    return [cupy.asarray(rng.standard_normal(count).astype(dtype)) for _ in range(n)]


@pytest.mark.parametrize(
    ("algorithm", "n", "chunks", "dtype"),
    [("stragglar", 4, None, "float32"), ("ring", 3, None, "int64"), ("stragglar", 5, 12, "float16")],
)
def test_ranks_on_a_group_sum_as_the_interpreter_and_exchange_handles_once(
    cuda: FakeCuda, algorithm: str, n: int, chunks: int | None, dtype: str
) -> None:
    schedule = synthesize(algorithm, n, chunks=chunks)
    gather = AllGather(n)
    for call in range(3):
        data = fresh(n, 61, dtype, seed=call)
        want = [np.array(d).view(np.ndarray) for d in data]
        allreduce_local(want, prove(schedule))
        results = ranks_run(schedule, data, gather, delay=0.01 if call == 1 else 0.0)
        assert not [r for r in results if isinstance(r, Exception)], results
        for rank, (w, g) in enumerate(zip(want, data, strict=True)):
            assert w.tobytes() == np.array(g).tobytes(), (call, rank)
    assert gather.calls == 1 + 3  # the handles once, then each call's error words
    assert len(cuda.opened) == 2 * n * (n - 1)  # each rank opened each peer's inbox and flags, once
    assert cuda.system == [True] * 3 * n  # a peer may be on another GPU: flags at the system's scope
    drop_states()  # the peers' memory closed, its own freed
    gc.collect()
    assert sorted(cuda.closed) == sorted(cuda.opened) and not cuda.allocations
    late = results[schedule.late_rank]
    assert late.arrived >= late.start


def test_a_rank_whose_kernel_never_runs_is_named_by_every_rank(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = synthesize("stragglar", 4)
    late = schedule.late_rank
    run = group.DeviceRank.run

    def silent(
        self: group.DeviceRank, buffer: int, delay: float, late_rank: int, timeout: float, gather: Any
    ) -> Any:
        if self.rank == late:
            self.kernel = lambda grid, block, args: None  # joins the gathers, never launches
        return run(self, buffer, delay, late_rank, timeout, gather)

    monkeypatch.setattr(group.DeviceRank, "run", silent)
    results = ranks_run(schedule, fresh(4, 40, "float32", 1), AllGather(4), timeout=0.3)
    assert all(isinstance(r, RankError) for r in results), results
    assert {(r.peer, r.reason) for r in results} == {(late, "timed out")}
    assert len({str(r) for r in results}) == 1  # the same error on every rank


def test_after_waits_that_timed_out_on_the_device_the_next_call_is_exact(cuda: FakeCuda) -> None:
    """The late rank comes 0.6 s late to waits bounded at 0.3 s: every rank's waits give up, every
    kernel ends and every rank's words are gathered, so every rank raises the same RankError and
    its state is not broken: the next calls, nobody late, sum exactly."""
    schedule = synthesize("stragglar", 4)
    gather = AllGather(4)
    results = ranks_run(schedule, fresh(4, 40, "float32", 5), gather, delay=0.6, timeout=0.3)
    assert all(isinstance(r, RankError) and r.reason == "timed out" for r in results), results
    assert len({str(r) for r in results}) == 1 and not states._broken
    for seed in (6, 7):
        assert exact(schedule, seed, gather=gather), seed


def test_calls_on_two_channels_of_a_group_at_once_each_run_on_states_of_their_own(cuda: FakeCuda) -> None:
    """Two calls of one setup at once on two channels (tags on gloo), begun in opposite orders by
    the even and the odd ranks: each channel keeps states of its own, so each sums exactly (on one
    state, a rank's kernel of one call would meet a peer's of the other, and mix their data)."""
    schedule = synthesize("ring", 4)
    outcomes: dict[int, bool] = {}

    def channel(tag: int) -> None:
        later = (lambda r: 0.1 * (r % 2)) if tag == 1 else (lambda r: 0.1 * (1 - r % 2))
        outcomes[tag] = exact(schedule, tag, gather=AllGather(4), channel=tag, start=later)

    threads = [threading.Thread(target=channel, args=(tag,)) for tag in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert outcomes == {1: True, 2: True}
    assert set(states._kept) == {("group", 1), ("group", 2)}


def test_calls_on_another_group_keep_this_group_s_states(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each group keeps its own few states: the calls of another group in between (which, in one
    cache for the whole process, would push this group's out) leave them, so this group's next
    call gathers no handles."""
    monkeypatch.setattr(group, "CACHED", 4)  # one setup's 4 ranks, all in this process
    schedule = synthesize("stragglar", 4)
    here, there = AllGather(4), AllGather(4)
    assert exact(schedule, 1, gather=here)
    assert exact(schedule, 2, gather=there, owner="another group")
    assert exact(schedule, 3, gather=here)
    assert here.calls == 1 + 2  # the handles once, then each call's words
    assert there.calls == 1 + 1  # the other group's states are its own


class OddWords(AllGather):
    """An all-gather where rank ``odd`` sends one integer too many with a call's words (as a peer in
    another call, whose states differ, would send its handles instead)."""

    def __init__(self, size: int, odd: int) -> None:
        super().__init__(size)
        self.odd = odd

    def of(self, rank: int) -> Callable[[Sequence[int]], list[tuple[int, ...]]]:
        gather = super().of(rank)
        if rank != self.odd:
            return gather
        return lambda values: gather([*values, 0] if len(values) == RANK_WORDS else values)


def test_a_peer_that_answers_with_other_words_fails_every_rank_and_breaks_its_state(cuda: FakeCuda) -> None:
    schedule = synthesize("stragglar", 3)
    results = ranks_run(schedule, fresh(3, 30, "float32", 4), OddWords(3, odd=2))
    assert all(isinstance(r, RankError) for r in results), results
    assert [str(r) for r in results] == [
        f"allreduce failed: rank {rank} gathered its call's words, and rank 2 answered with "
        f"{RANK_WORDS + 1} integers where {RANK_WORDS} were due: it is in another call"
        for rank in range(3)
    ]
    assert [(r.rank, r.peer) for r in results] == [(0, 2), (1, 2), (2, 2)]
    assert len(states._broken) == 3


def test_a_failure_between_the_kernel_s_end_and_the_gather_breaks_the_state(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0's wait for its own kernel raises (a CUDA error, or an interrupt as it returns): it
    never reaches the gather, so its peers' gathers fail, and every rank's state is broken alike,
    rank 0's too: the next call is refused on every rank at once."""
    schedule = synthesize("stragglar", 3)
    run = group.DeviceRank.run

    def failing(self: group.DeviceRank, *args: Any) -> Any:
        if self.rank == 0:
            synchronize = self.stream.synchronize

            def fails() -> None:
                synchronize()
                self.stream.synchronize = synchronize  # once: the state's release waits again
                raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access")

            self.stream.synchronize = fails
        return run(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(group.DeviceRank, "run", failing)
        results = ranks_run(schedule, fresh(3, 30, "float32", 5), AllGather(3, timeout=2.0))
    assert "cudaErrorIllegalAddress" in str(results[0])
    assert all(isinstance(r, TimeoutError) for r in results[1:]), results
    assert sorted(state.rank for state in states._broken) == [0, 1, 2]
    results = ranks_run(schedule, fresh(3, 30, "float32", 6), AllGather(3))
    assert all(isinstance(r, RankError) and "cannot run this device call" in str(r) for r in results)


def test_a_rank_that_never_comes_ends_the_others_calls(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = synthesize("ring", 3)
    gather = AllGather(3, timeout=2.0)
    assert not any(isinstance(r, Exception) for r in ranks_run(schedule, fresh(3, 30, "float32", 2), gather))
    results = ranks_run(schedule, fresh(3, 30, "float32", 3), gather, absent=[2], timeout=0.3)
    assert isinstance(results[0], TimeoutError) and isinstance(results[1], TimeoutError)


def test_a_setup_whose_call_failed_before_every_rank_s_words_runs_no_call_again(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Call 2: the late rank's launch fails (it raises before the gather), so its peers' kernels
    time out and their gather fails.  None of them can know that every peer's kernel of the call
    has ended (a peer's could still write their inboxes), so the next call on the setup is refused
    at once on every rank, naming what failed, and the states' memory is never freed; a new group
    sums exactly."""
    schedule = synthesize("stragglar", 4)
    late = schedule.late_rank
    assert not any(
        isinstance(r, Exception) for r in ranks_run(schedule, fresh(4, 40, "float32", 1), AllGather(4))
    )
    run = group.DeviceRank.run

    def failing(self: group.DeviceRank, *args: Any) -> Any:
        if self.rank == late:
            launch = self.kernel

            def fail(grid: Any, block: Any, args: Any) -> None:
                self.kernel = launch
                raise RuntimeError("cudaErrorLaunchFailure")

            self.kernel = fail
        return run(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(group.DeviceRank, "run", failing)
        results = ranks_run(schedule, fresh(4, 40, "float32", 2), AllGather(4, timeout=2.0), timeout=0.3)
    assert isinstance(results[late], RuntimeError) and "cudaErrorLaunchFailure" in str(results[late])
    assert all(isinstance(r, TimeoutError) for i, r in enumerate(results) if i != late), results
    launches = len(cuda.launches)
    began = time.perf_counter()
    results = ranks_run(schedule, fresh(4, 40, "float32", 3), AllGather(4), timeout=10)
    assert time.perf_counter() - began < 5 and len(cuda.launches) == launches  # refused before launch
    assert all(isinstance(r, RankError) for r in results), results
    for rank, error in enumerate(results):
        why = "cudaErrorLaunchFailure" if rank == late else "a rank did not come to the gather"
        assert str(error) == (
            f"allreduce failed: rank {rank} cannot run this device call: an earlier call on its setup "
            f"or buffer failed before every rank was known to have ended it ({why}), so a peer's "
            "kernel may still write there: make the group anew"
        )
        assert (error.rank, error.reason, error.during) == (rank, "failed", "after a device call that failed")
    kept = {id(state) for state in states._broken}
    assert kept == {id(state) for state in kept_states()} and len(kept) == 4
    drop_states()
    gc.collect()
    assert len(cuda.allocations) >= 4 * 2  # every rank's inbox and flags are still there
    assert exact(schedule, 4, gather=AllGather(4), owner="a new group")


def test_allreduce_with_engine_device_on_an_nccl_group(cuda: FakeCuda) -> None:
    """``allreduce(..., engine="device")`` end to end on ranks in threads: the header checked and
    the handles and error words gathered over an NcclGroup (a fake NCCL), the kernels the source
    compiled for the host; twice, each on a group of its own (which exchanges its handles anew)."""
    proof = prove(synthesize("stragglar", 4, chunks=6))
    for call in range(2):
        data = fresh(4, 50, "float32", seed=10 + call)
        want = [np.array(d).view(np.ndarray) for d in data]
        allreduce_local(want, proof)
        *results, _, _ = run_ranks(
            4, lambda r, g, data=data: allreduce(data[r], proof, group=g, timeout=10, engine="device")
        )
        assert not [x for x in results if isinstance(x, Exception)], results
        assert all(w.tobytes() == np.array(d).tobytes() for w, d in zip(want, data, strict=True))
    assert len(cuda.opened) == 2 * (2 * 4 * 3)  # per group: each rank its 3 peers' inbox and flags


def test_ranks_on_different_engines_all_fail_alike_before_anything_runs(cuda: FakeCuda) -> None:
    """One rank on the device engine, the others on the rounds engine: one would wait on flags,
    the others on messages, each until its timeout; the header says which engine each rank runs,
    so every rank raises the same MismatchError at once, and no kernel is launched."""
    proof = prove(synthesize("stragglar", 3))
    data = fresh(3, 30, "float32", seed=5)
    *results, _, _ = run_ranks(
        3,
        lambda r, g: allreduce(data[r], proof, group=g, timeout=10, engine="device" if r == 1 else "rounds"),
    )
    assert all(isinstance(x, MismatchError) for x in results), results
    said = {str(x) for x in results}
    assert said == {
        "ranks disagree on the allreduce: "
        "engine: ranks 0, 2 run the rounds engine, rank 1 runs the device engine"
    }
    assert not cuda.launches


def test_a_rank_that_cannot_set_up_its_device_call_is_named_by_its_peers_at_once(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank whose process has no CuPy raises its own error after the header's gather, and its
    header says so: its peers raise a MismatchError naming it, in the same call, rather than
    launch their kernels and wait on its flags until their timeout."""
    from stragglar.runtime.device.buffers import launcher as found

    proof = prove(synthesize("stragglar", 3))
    data = fresh(3, 30, "float32", seed=6)
    own = threading.local()

    def launcher() -> Any:
        if getattr(own, "rank", None) == 1:
            raise InputError("the device engine launches its kernels with CuPy, which is not installed")
        return found()

    monkeypatch.setattr("stragglar.runtime.distributed.launcher", launcher)  # what allreduce calls

    def call(r: int, g: Any) -> Any:
        own.rank = r
        return allreduce(data[r], proof, group=g, timeout=10, engine="device")

    *results, _, _ = run_ranks(3, call)
    assert isinstance(results[1], InputError) and "CuPy, which is not installed" in str(results[1])
    said = "cannot allreduce: rank 1 could not set up its device call (its own error says why: no CuPy, say)"
    assert [type(x).__name__ for x in results[::2]] == ["MismatchError"] * 2, results
    assert {str(x) for x in results[::2]} == {said}
    assert not cuda.launches


def test_options_of_the_rounds_engine_are_refused_on_the_device_engine(cuda: FakeCuda) -> None:
    from stragglar.runtime import NcclGroup

    proof = prove(synthesize("ring", 2))
    data = fresh(1, 8, "float32", 0)[0]
    group = NcclGroup(comm=UnusedComm())
    for option, reason in (
        ({"graphs": False}, "graphs applies to the rounds engine"),
        ({"rounds": (0, 1)}, "rounds applies to the rounds engine"),
        ({"engine": "fast"}, "unknown engine 'fast'"),
    ):
        with pytest.raises(InputError, match=reason):
            allreduce(data, proof, group=group, **{"engine": "device", **option})  # type: ignore[call-overload]
    with pytest.raises(InputError, match=r"runs on CuPy arrays or torch CUDA tensors, not NumPy arrays$"):
        allreduce(np.zeros(8, np.float32), proof, group=group, engine="device")
    with pytest.raises(ArgumentError, match=r"^engine must be one of rounds, device, got 5$"):  # a type
        allreduce(data, proof, group=group, engine=5)  # type: ignore[call-overload]
    with pytest.raises(ArgumentError, match=r"^group must be a torch process group, an NcclGroup or None"):
        release_graphs("x")  # released nothing, and said 0
    assert not cuda.launches


def test_a_call_or_a_registration_inside_a_graph_capture_is_refused_before_anything_is_gathered(
    cuda: FakeCuda,
) -> None:
    """Every rank captures (as a training step captured whole would): each refuses at once, in
    one line, with nothing gathered, opened or launched."""
    import cupy  # the stand-in

    from stragglar.runtime import NcclGroup, register_buffer

    proof = prove(synthesize("ring", 2))
    data = fresh(1, 8, "float32", 0)[0]
    group = NcclGroup(comm=UnusedComm())  # a gather on it would fail: nothing is gathered
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for attempt in (
            lambda: allreduce(data, proof, group=group, engine="device"),
            lambda: register_buffer(data, group),
        ):
            with pytest.raises(InputError, match="cannot run while the current stream is capturing"):
                attempt()
        graph = stream.end_capture()
    assert not bare(graph).branches and not cuda.launches and not cuda.opened


def test_a_rank_of_a_group_refuses_a_program_that_reaches_its_peers_buffers() -> None:
    """A group opens its peers' inboxes and flags, not their buffers: direct rows would write
    through a null pointer, so such a program is refused before anything is allocated."""
    program = lower(compile_schedule(synthesize("ring", 3)), direct=True)
    with pytest.raises(ValueError, match="needs its peers' buffers"):
        group.DeviceRank(None, program, 0, 12, "float32", 0, lambda values: [])


# Registered buffers (stragglar/runtime/device/shared.py): every rank's buffer opened in its
# peers' processes once, so that calls on it run direct transfers.


def values(n: int, count: int, dtype: str, seed: int) -> list[np.ndarray]:
    """Distinct values per rank and element, exact in ``dtype``'s sums (small integers)."""
    rng = np.random.default_rng(seed)
    return [(rng.permutation(count) % 251 + 300 * r).astype(dtype) for r in range(n)]


def summed(proof: Any, arrays: list[np.ndarray]) -> list[bytes]:
    want = [a.copy() for a in arrays]
    allreduce_local(want, proof)
    return [w.tobytes() for w in want]


@pytest.mark.parametrize("packets", [False, True], ids=["flags", "packets"])
@pytest.mark.parametrize(
    ("algorithm", "n", "chunks", "dtype"),
    [("stragglar", 4, 6, "float32"), ("ring", 5, None, "int64"), ("stragglar", 3, None, "float16")],
)
def test_calls_on_registered_buffers_run_direct_and_sum_as_the_interpreter(
    cuda: FakeCuda,
    monkeypatch: pytest.MonkeyPatch,
    algorithm: str,
    n: int,
    chunks: int | None,
    dtype: str,
    packets: bool,
) -> None:
    """On flags (the engine's own), direct transfers between the registered buffers; with packets
    on, chunks this small move as packets, through the inboxes even on a registered buffer."""
    if packets:
        monkeypatch.setattr(programs, "OWN_TUNING", Tuning(packet_bytes=PACKET_BYTES))
    proof = prove(synthesize(algorithm, n, chunks=chunks))
    inputs = [values(n, 37, dtype, seed) for seed in range(3)]
    buffers = [cuda.buffer(inputs[0][r], offset=16 * (r + 1)) for r in range(n)]

    def rank(r: int, g: Any) -> tuple[list[bytes], list[group.DeviceRank]]:
        out = []
        with register_buffer(buffers[r], g, timeout=10) as registration:
            assert registration.addresses[r] == buffers[r].data.ptr
            for call, arrays in enumerate(inputs):
                buffers[r][...] = arrays[r]
                allreduce(buffers[r], proof, g, 0.01 if call == 1 else 0.0, timeout=10, engine="device")
                out.append(np.array(buffers[r]).tobytes())
            states = list(registration.states.values())
        assert not registration.states  # let go on close
        return out, states

    *results, _, _ = run_ranks(n, rank)
    assert not [x for x in results if isinstance(x, Exception)], results
    for call, arrays in enumerate(inputs):
        assert [got[call] for got, _ in results] == summed(proof, arrays), call
    states = [state for _, kept in results for state in kept]
    assert len(states) == n  # one state per rank
    assert all((s.program.direct, s.program.packets) == (not packets, packets) for s in states)
    assert not kept_states()  # none among the staged calls' states
    every = np.array([b.data.ptr for b in buffers], dtype=np.uint64)
    assert all(np.array_equal(s.buffer_pointers[1], every) for s in states)  # each reaches every buffer
    bases = {cuda.base_of(b.data.ptr) for b in buffers}
    assert set(cuda.opened) >= bases and bases <= set(cuda.closed)  # opened once here, closed on close


def test_a_loop_over_many_registered_buffers_makes_each_state_once(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five registered buffers per rank, reduced in turn twice over, where the staged calls keep
    a single state: each buffer's state is made on its first call only (a state made anew would
    gather handles and allocate an inbox every call)."""
    monkeypatch.setattr(group, "CACHED", 1)
    made: list[int] = []
    init = group.DeviceRank.__init__

    def counted(self: group.DeviceRank, *args: Any, **kwargs: Any) -> None:
        made.append(args[2])  # the rank
        init(self, *args, **kwargs)

    monkeypatch.setattr(group.DeviceRank, "__init__", counted)
    proof = prove(synthesize("stragglar", 3))
    arrays = [values(3, 10 + k, "int32", k) for k in range(5)]
    buffers = [[cuda.buffer(a[r]) for a in arrays] for r in range(3)]

    def rank(r: int, g: Any) -> list[bytes]:
        for b in buffers[r]:
            register_buffer(b, g, timeout=10)
        for _ in range(2):
            for k, b in enumerate(buffers[r]):
                b[...] = arrays[k][r]
                allreduce(b, proof, g, timeout=10, engine="device")
        return [np.array(b).tobytes() for b in buffers[r]]

    *results, _, _ = run_ranks(3, rank)
    assert not [x for x in results if isinstance(x, Exception)], results
    for k, a in enumerate(arrays):
        assert [got[k] for got in results] == summed(proof, a), k
    assert sorted(made) == [0] * 5 + [1] * 5 + [2] * 5


def test_a_registered_and_an_unregistered_buffer_are_refused_alike(cuda: FakeCuda) -> None:
    """One rank calls on a copy of its registered buffer: its peers would reach the registered
    one while it sums the copy, so every rank raises the same MismatchError before any launch."""
    proof = prove(synthesize("stragglar", 4))
    buffers = [cuda.buffer(v) for v in values(4, 20, "float32", 0)]

    def rank(r: int, g: Any) -> Any:
        register_buffer(buffers[r], g, timeout=10)
        data = buffers[r].copy() if r == 1 else buffers[r]
        return allreduce(data, proof, g, timeout=10, engine="device")

    *results, _, _ = run_ranks(4, rank)
    assert all(isinstance(x, MismatchError) for x in results), results
    assert {str(x) for x in results} == {
        "ranks disagree on the allreduce: registered buffer: "
        "ranks 0, 2, 3 use registration 1, rank 1 uses a buffer not registered"
    }
    assert not cuda.launches


def test_every_rank_refuses_a_registration_that_any_rank_cannot_make(cuda: FakeCuda) -> None:
    """A buffer outside any allocation the driver knows (here: host memory, as an expandable
    segment is to CUDA IPC), different element counts, or a buffer registered twice: every rank
    raises, the rank at fault says why, and nothing is opened."""
    import cupy

    def attempt(make: Any) -> list[Any]:
        *results, _, _ = run_ranks(3, lambda r, g: register_buffer(make(r), g, timeout=10))
        return results

    unknown = attempt(lambda r: cupy.asarray(np.arange(9.0)) if r == 2 else cuda.buffer(np.arange(9.0)))
    assert str(unknown[2]).startswith(
        "cannot register rank 2's buffer: its memory cannot be shared over CUDA IPC"
    )
    assert [str(x) for x in unknown[:2]] == [
        "cannot register the buffers: rank 2 could not (the error there says why)"
    ] * 2
    strided = attempt(lambda r: cuda.buffer(np.arange(18.0))[:: 1 + (r == 1)])
    assert str(strided[1]).startswith("cannot register rank 1's buffer: ") and "contiguous" in str(strided[1])
    assert "rank 1 could not" in str(strided[0])
    with pytest.raises(InputError, match=r"runs on CuPy arrays or torch CUDA tensors, not NumPy arrays$"):
        register_buffer(np.zeros(4), None)
    with pytest.raises(ArgumentError, match=r"runs on CuPy arrays or torch CUDA tensors, not list$"):
        register_buffer([0.0] * 4, None)
    with pytest.raises(ArgumentError, match=r"runs on CuPy arrays or torch CUDA tensors, not NoneType$"):
        register_buffer(None, None)
    with pytest.raises(ArgumentError, match=r"^cannot register a DeviceArray across processes: pass a torch"):
        register_buffer(cuda.buffer(np.zeros(4)), None)  # a CuPy array needs an NcclGroup
    counts = attempt(lambda r: cuda.buffer(np.arange(9.0 + (r == 0))))
    assert {str(x) for x in counts} == {
        "ranks disagree on the registration: element count: rank 0 10, ranks 1, 2 9"
    }
    assert not cuda.opened
    same = cuda.buffer(np.arange(6.0))
    twice = [cuda.buffer(np.arange(6.0)) for _ in range(3)]
    results = attempt(lambda r: twice[r])
    assert not [x for x in results if isinstance(x, Exception)]

    def again(r: int, g: Any) -> Any:
        register_buffer(twice[r] if r else same, g, timeout=10)  # a new group: rank 0's is fresh
        return register_buffer(twice[r] if r else same, g, timeout=10)

    *results, _, _ = run_ranks(3, again)
    assert all(isinstance(x, InputError) for x in results), results
    assert "already registered on this group" in str(results[0])


def test_a_peer_buffer_that_cannot_be_opened_leaves_no_rank_registered(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks 0 and 1 cannot open rank 2's buffer (as between GPUs without peer access): every rank
    raises, rank 2 too (it opened its peers' fine), and nothing stays open or registered."""
    buffers = [cuda.buffer(np.arange(12.0) + r) for r in range(3)]
    refused = cuda.base_of(buffers[2].data.ptr)
    opened = cuda.runtime.ipcOpenMemHandle

    def open_handle(handle: bytes, flags: int = 1) -> int:
        if int.from_bytes(handle, "little") == refused:
            raise RuntimeError("cudaErrorPeerAccessUnsupported: peer access is not supported")
        return int(opened(handle, flags))

    monkeypatch.setattr(cuda.runtime, "ipcOpenMemHandle", open_handle)
    *results, _, _ = run_ranks(3, lambda r, g: register_buffer(buffers[r], g, timeout=10))
    assert [str(x) for x in results] == [
        "cannot register rank 0's buffer: cannot open rank 2's buffer over CUDA IPC "
        "(cudaErrorPeerAccessUnsupported: peer access is not supported)",
        "cannot register rank 1's buffer: cannot open rank 2's buffer over CUDA IPC "
        "(cudaErrorPeerAccessUnsupported: peer access is not supported)",
        "cannot register the buffers: ranks 0, 1 could not open a peer's buffer (the error there says why)",
    ]
    assert sorted(cuda.closed) == sorted(cuda.opened) and not shared._registry


def test_a_registration_closed_everywhere_runs_staged_and_one_closed_alone_fails(cuda: FakeCuda) -> None:
    proof = prove(synthesize("stragglar", 3))
    arrays = values(3, 25, "float32", 4)
    buffers = [cuda.buffer(a) for a in arrays]

    def rank(r: int, g: Any) -> Any:
        registration = register_buffer(buffers[r], g, timeout=10)
        allreduce(buffers[r], proof, g, timeout=10, engine="device")
        registration.close()
        registration.close()  # twice is once
        buffers[r][...] = arrays[r]
        allreduce(buffers[r], proof, g, timeout=10, engine="device")
        return np.array(buffers[r]).tobytes()

    *results, _, _ = run_ranks(3, rank)
    assert results == summed(proof, arrays)
    assert [s.program.direct for s in kept_states()] == [False] * 3  # the registered ones went
    assert not shared._registry and not shared._numbers  # every rank closed all it had: groups forgotten
    assert sorted(set(cuda.closed) & {cuda.base_of(b.data.ptr) for b in buffers}) == sorted(
        cuda.base_of(b.data.ptr) for b in buffers
    )

    def alone(r: int, g: Any) -> Any:
        registration = register_buffer(buffers[r], g, timeout=10)
        allreduce(buffers[r], proof, g, timeout=10, engine="device")
        if r == 0:
            registration.close()  # its next call checks its header; its peers' do not
        return allreduce(buffers[r], proof, g, timeout=0.5, engine="device")

    *results, _, _ = run_ranks(3, alone)
    assert all(isinstance(x, Exception) for x in results), results
    assert all(isinstance(x, RankError) for x in results[1:]), results  # they waited on rank 0's flags


def test_a_registered_buffer_whose_call_failed_runs_no_call_again_and_stays_allocated(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 2's launch fails on a registered buffer: its peers' kernels give up and their gather
    fails.  A peer's kernel of a direct call writes this rank's buffer itself, so every later call
    on the registration is refused, another schedule's too, and the failed state keeps the buffer
    after the registration is closed (memory reused elsewhere must not take a late write), and a
    staged call on that buffer is refused as well."""
    proof, other = prove(synthesize("stragglar", 3)), prove(synthesize("ring", 3))
    buffers = [cuda.buffer(v) for v in values(3, 24, "float32", 6)]
    run = group.DeviceRank.run

    def failing(self: group.DeviceRank, *args: Any) -> Any:
        if self.rank == 2:
            self.kernel = lambda grid, block, args: (_ for _ in ()).throw(RuntimeError("launch failed"))
        return run(self, *args)

    monkeypatch.setattr(group.DeviceRank, "run", failing)

    def rank(r: int, g: Any) -> tuple[Exception, Exception, Exception, Any]:
        registration = register_buffer(buffers[r], g, timeout=10)
        try:
            allreduce(buffers[r], proof, g, timeout=0.3, engine="device")
        except Exception as e:
            failed = e
        try:
            allreduce(buffers[r], other, g, timeout=10, engine="device")
        except Exception as e:
            refused = e
        registration.close()
        try:  # staged now, on the buffer a peer's kernel of the failed call may still write
            allreduce(buffers[r], proof, g, timeout=10, engine="device")
        except Exception as e:
            staged = e
        return failed, refused, staged, registration

    *results, _, _ = run_ranks(3, rank)
    assert [type(x) for x in results] == [tuple] * 3, results
    assert str(results[2][0]) == "launch failed"
    assert all(isinstance(failed, RankError) for failed, *_ in results[:2]), results
    for r, (_, refused, staged, registration) in enumerate(results):
        for error in (refused, staged):
            assert isinstance(error, RankError) and str(error).startswith(
                f"allreduce failed: rank {r} cannot run this device call: an earlier call on its setup"
            ), error
        assert not registration.open
    kept = sorted(state.rank for state in states._broken)
    assert kept == [0, 1, 2] and all(state.registered is not None for state in states._broken)
    assert sorted(int(state.registered.data.ptr) for state in states._broken) == sorted(
        int(b.data.ptr) for b in buffers
    )


def test_an_nccl_group_s_device_states_go_as_its_graphs_are_released(cuda: FakeCuda) -> None:
    """An NcclGroup's communicator is destroyed by its caller, after ``release_graphs``: the
    device engine's states on it (an inbox about each buffer's size) go there too, where before
    they stayed while the process ran."""
    proof = prove(synthesize("stragglar", 3))
    buffers = [cuda.buffer(v) for v in values(3, 20, "float32", 8)]

    def rank(r: int, g: Any) -> Any:
        allreduce(buffers[r], proof, g, timeout=10, engine="device")
        kept = (g.comm, None) in states._kept
        release_graphs(g)
        return kept, (g.comm, None) in states._kept

    *results, _, _ = run_ranks(3, rank)
    assert results == [(True, False)] * 3, results
    gc.collect()
    assert not set(cuda.allocations) - {cuda.base_of(b.data.ptr) for b in buffers}  # inboxes, flags freed


def test_every_launch_allocation_and_handle_is_made_on_the_buffer_s_gpu(cuda: FakeCuda) -> None:
    """The ranks' buffers on GPU 1, every thread's current GPU 0 (as a thread of the DDP hook's
    worker finds it): a registration, a direct call and a staged call each make the buffer's GPU
    current for their allocations, IPC handles and launches, and give the caller's back."""
    n = 3
    proof = prove(synthesize("stragglar", n))
    inputs = values(n, 29, "float32", 5)
    kept = [cuda.buffer(inputs[r], offset=16 * (r + 1)) for r in range(n)]
    other = [cuda.buffer(inputs[r]) for r in range(n)]
    for buffer in (*kept, *other):
        buffer.gpu = 1

    def rank(r: int, g: Any) -> list[bytes]:
        with register_buffer(kept[r], g, timeout=10):
            allreduce(kept[r], proof, g, timeout=10, engine="device")  # direct
        allreduce(other[r], proof, g, timeout=10, engine="device")  # staged
        assert cuda.device == 0
        return [np.array(kept[r]).tobytes(), np.array(other[r]).tobytes()]

    *results, _, _ = run_ranks(n, rank)
    assert not [x for x in results if isinstance(x, Exception)], results
    assert [got[0] for got in results] == [got[1] for got in results] == summed(proof, inputs)
    drop_states()  # the staged states go here, in this thread, on GPU 0
    assert cuda.closed and not set(cuda.allocations) - {cuda.base_of(b.data.ptr) for b in (*kept, *other)}
    assert cuda.current_devices == {1}  # the registrations closed and the states freed on GPU 1 too


def run_ranks_on_two_groups(n: int, body: Callable[[int, Any, Any], Any]) -> list[Any]:
    """``body(rank, group, other)`` in n threads, ``other`` a second group of the same ranks."""
    from test_runtime_cupy_nccl import nccl_groups

    _, second = nccl_groups(n)
    *results, _, _ = run_ranks(n, lambda r, g: body(r, g, second[r]))
    return results


def test_async_calls_on_several_buffers_launch_at_once_and_each_wait_sums_exactly(cuda: FakeCuda) -> None:
    """Three registered buffers, two steps of a loop (lockstep calls, as the DDP hook makes): at
    the second, once every setup was checked and every state made, every punctual rank launches
    its three kernels before the late rank has launched any, so their hidden phases all run
    while it is away; each wait, on a second group while the first takes the next launches,
    gives the interpreter's sums."""
    n, buffers_a_rank, steps = 4, 3, 2
    proof = prove(synthesize("stragglar", n))
    late = proof.schedule.late_rank
    inputs = [
        [values(n, 41, "float32", 10 * step + b) for b in range(buffers_a_rank)] for step in range(steps)
    ]
    mine = [
        [cuda.buffer(inputs[0][b][r], offset=16 * (r + 1)) for b in range(buffers_a_rank)] for r in range(n)
    ]
    launched_at: dict[int, float] = {}

    def rank(r: int, g: Any, other: Any) -> list[list[bytes]]:
        registrations = [register_buffer(buffer, g, timeout=10) for buffer in mine[r]]
        got = []
        for step in range(steps):
            for b, buffer in enumerate(mine[r]):
                buffer[...] = inputs[step][b][r]
            works = [
                allreduce(buffer, proof, g, 0.05, timeout=10, lockstep=True, engine="device", async_op=True)
                for buffer in mine[r]
            ]
            launched_at[r] = time.perf_counter()
            for work in works:
                work.wait(other)
            got.append([np.array(buffer).tobytes() for buffer in mine[r]])
        for registration in registrations:
            registration.close()
        return got

    results = run_ranks_on_two_groups(n, rank)
    assert not [x for x in results if isinstance(x, Exception)], results
    for step in range(steps):
        for b in range(buffers_a_rank):
            assert [got[step][b] for got in results] == summed(proof, inputs[step][b]), (step, b)
    late_buffers = {buffer.data.ptr for buffer in mine[late]}
    late_launches = sorted(at for address, at in cuda.launches if address in late_buffers)
    assert len(late_launches) == steps * buffers_a_rank
    assert all(launched_at[r] < late_launches[buffers_a_rank] for r in range(n) if r != late)


def test_an_async_call_is_waited_for_once_and_its_buffer_not_launched_on_before(cuda: FakeCuda) -> None:
    n = 3
    proof = prove(synthesize("ring", n))
    inputs = values(n, 20, "int64", 4)
    kept = [cuda.buffer(inputs[r]) for r in range(n)]

    def rank(r: int, g: Any) -> list[str]:
        errors = []
        with register_buffer(kept[r], g, timeout=10):
            work = allreduce(kept[r], proof, g, timeout=10, engine="device", async_op=True)
            try:
                allreduce(kept[r], proof, g, timeout=10, engine="device")
            except InputError as e:
                errors.append(str(e))
            work.wait()
            try:
                work.wait()
            except InputError as e:
                errors.append(str(e))
        return errors

    *results, _, _ = run_ranks(n, rank)
    refusals = [
        "a device call with this setup (group, schedule, element count and dtype, or its registered "
        "buffer) was launched and not waited for: wait() for it first (each registered buffer has a "
        "setup of its own)",
        "this device call was waited for already",
    ]
    assert results == [refusals] * n, results
    assert [np.array(k).tobytes() for k in kept] == summed(proof, inputs)


def test_a_work_dropped_without_its_wait_breaks_its_state_and_keeps_its_memory(cuda: FakeCuda) -> None:
    """Every rank launches a call and drops its work unwaited: nothing says the peers' kernels have
    ended, so the state is broken and kept (not freed when the cache lets it go), and the next
    call with that setup is refused, naming why."""
    proof = prove(synthesize("stragglar", 3))
    buffers = [cuda.buffer(v) for v in values(3, 20, "float32", 7)]

    def rank(r: int, g: Any) -> Exception:
        work = allreduce(buffers[r], proof, g, timeout=10, engine="device", async_op=True)
        del work  # never waited for
        try:
            allreduce(buffers[r], proof, g, timeout=10, engine="device")
        except Exception as e:
            return e
        raise AssertionError("the call after a dropped work ran")

    *results, _, _ = run_ranks(3, rank)
    assert [type(x) for x in results] == [RankError] * 3, results
    assert all("(a device call launched and never waited for)" in str(x) for x in results)
    assert sorted(state.rank for state in states._broken) == [0, 1, 2]
    held = set(cuda.allocations) - {cuda.base_of(b.data.ptr) for b in buffers}
    assert len(held) == 3 * 2  # every rank's inbox and flags
    drop_states()  # the caches let go of them: only the broken list keeps them now
    assert held <= set(cuda.allocations)  # not freed: a peer's kernel may still write them
    states._broken.clear()
    gc.collect()
    assert not held & set(cuda.allocations)  # what kept them was the list (the test's own check)


def test_async_op_applies_to_the_device_engine_only(cuda: FakeCuda) -> None:
    proof = prove(synthesize("ring", 2))
    with pytest.raises(InputError, match=r"^async_op applies to engine 'device'"):
        allreduce(np.zeros(4), proof, async_op=True)


def test_a_new_buffer_s_address_is_on_the_device_before_the_kernel_s_stream_waits(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call on a buffer at a new address copies the buffers' array on the current stream; the
    kernel's stream waits for an event recorded there.  The event was recorded before the copy,
    so the kernel could read the array before it landed (an old address, or garbage)."""
    said: dict[int, list[str]] = {}  # by rank thread
    made = group.DeviceRank._own_buffer

    def own_buffer(self: Any, buffer: int) -> Any:
        said.setdefault(threading.get_ident(), []).append("array")
        return made(self, buffer)

    current = cuda.get_current_stream

    def get_current_stream() -> Any:
        stream = current()
        record = stream.record

        def recorded() -> Any:
            said.setdefault(threading.get_ident(), []).append("event")
            return record()

        return types.SimpleNamespace(record=recorded)

    monkeypatch.setattr(group.DeviceRank, "_own_buffer", own_buffer)
    monkeypatch.setattr(cuda, "get_current_stream", get_current_stream)
    schedule = synthesize("stragglar", 3)
    gather = AllGather(3)
    for call in range(2):  # new buffers each call: new addresses
        results = ranks_run(schedule, fresh(3, 61, "float32", seed=call), gather)
        assert not [r for r in results if isinstance(r, Exception)], results
    assert sum(map(len, said.values())) == 2 * 6, said  # 3 ranks, 2 calls
    assert all(steps == ["array", "event"] * (len(steps) // 2) for steps in said.values()), said


def test_the_flags_and_inbox_are_zero_before_their_handles_go_to_the_peers(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cudaMemset is queued on the legacy stream, which the rank's non-blocking stream does not
    follow: a zeroing still queued when a peer's kernel signals into the flags (or writes packets
    into the inbox) would wipe the signal.  The flags and the inbox are zeroed on the state's
    stream, which is synchronized (that stream, not the whole device, where the rank's earlier
    kernels may spin until the late rank comes) before the handles are gathered."""
    from fake_device import FakeStream

    said: dict[int, list[str]] = {}

    def noted(word: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def note(*args: Any) -> Any:
            said.setdefault(threading.get_ident(), []).append(word)
            return call(*args)

        return note

    zeroed_on: list[int] = []  # the streams the zeroing was queued on
    zeroed: set[int] = set()  # the allocations zeroed whole
    zero = cuda.runtime.memsetAsync

    def memset_async(address: int, value: int, nbytes: int, stream: int) -> Any:
        zeroed_on.append(stream)
        if nbytes == cuda.allocations[address].nbytes:
            zeroed.add(address)
        return noted("zero", zero)(address, value, nbytes, stream)

    synchronized: list[int] = []
    synchronize = FakeStream.synchronize

    def synchronize_stream(stream: FakeStream) -> Any:
        synchronized.append(stream.ptr)
        return noted("synchronize", synchronize)(stream)

    monkeypatch.setattr(cuda.runtime, "memsetAsync", memset_async)
    monkeypatch.setattr(FakeStream, "synchronize", synchronize_stream)
    gather = AllGather(3)
    monkeypatch.setattr(gather, "of", lambda rank, of=gather.of: noted("gather", of(rank)))
    results = ranks_run(synthesize("stragglar", 3), fresh(3, 61, "float32", seed=0), gather)
    assert not [r for r in results if isinstance(r, Exception)], results
    first = [["zero", "zero", "synchronize", "gather"]] * 3  # the flags and the inbox, then the handles
    assert sorted(steps[:4] for steps in said.values()) == first, said
    assert len(zeroed_on) == 6 and 0 not in zeroed_on and set(zeroed_on) <= set(synchronized)
    assert zeroed == set(cuda.allocations), "every rank's inbox and flags, whole"


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch, host: ctypes.CDLL) -> Iterator[FakeCuda]:
    """GPUs of 4 multiprocessors, each holding 3 blocks of the kernel: 12 at once."""
    yield from installed(monkeypatch, host, {**H200, "multiProcessorCount": 4})


def test_async_calls_past_a_gpu_s_room_wait_for_the_kernels_before_them_not_for_their_waits(
    small: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank on a GPU of its own that holds 12 blocks of the kernel, each call 3 of them: a
    rank launches five calls (on registered buffers: a state each, its setup checked at a first
    step), then waits for them, the late rank 0.3 s late to each.  A punctual rank's fifth launch
    has no room until its first kernel has ended, which it does once the late rank launched its
    first, without its wait (which comes after the launches; a hold kept until then never let the
    fifth launch go): every sum exact, and no GPU ever held more than it runs at once, the
    punctual ranks' all it runs."""
    from test_runtime_cupy_nccl import FakeNccl

    from stragglar.runtime.device import residency

    cuda, resident = small, residency.Residency()
    monkeypatch.setattr(group, "RESIDENT", resident)
    monkeypatch.setattr(FakeNccl, "patience", 10.0)  # the punctual ranks wait 1.5 s for the late one
    most: dict[int, int] = {}
    hold = resident.hold

    def counted(device: int, blocks: int, *args: Any) -> residency.Held:
        held = hold(device, blocks, *args)
        most[device] = max(most.get(device, 0), int(resident.held(device) * 12))  # in blocks
        return held

    monkeypatch.setattr(resident, "hold", counted)
    n, calls, count = 4, 5, 6000
    proof = prove(synthesize("stragglar", n))
    inputs = [values(n, count, "float32", c) for c in range(calls)]
    mine = [[cuda.buffer(inputs[c][r]) for c in range(calls)] for r in range(n)]
    for r in range(n):
        for buffer in mine[r]:
            buffer.gpu = r

    def rank(r: int, g: Any, other: Any) -> list[bytes]:
        registrations = [register_buffer(buffer, g, timeout=10) for buffer in mine[r]]  # a state each
        for _ in range(2):  # the first step checks each setup (a gather each launch), the second not
            for c, buffer in enumerate(mine[r]):
                buffer[...] = inputs[c][r]
            works = [
                allreduce(buffer, proof, g, 0.3, timeout=10, lockstep=True, engine="device", async_op=True)
                for buffer in mine[r]
            ]
            for work in works:
                work.wait(other)
        for registration in registrations:
            registration.close()
        return [np.array(buffer).tobytes() for buffer in mine[r]]

    results = run_ranks_on_two_groups(n, rank)
    assert not [x for x in results if isinstance(x, Exception)], results
    for c in range(calls):
        assert [got[c] for got in results] == summed(proof, inputs[c]), c
    late = proof.schedule.late_rank  # its kernels end soon after it launches each, 0.3 s late
    assert most == {r: 12 if r != late else most[late] for r in range(n)} and most[late] <= 12, most
