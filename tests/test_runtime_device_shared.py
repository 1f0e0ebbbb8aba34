"""Registered buffers on a group (stragglar/runtime/device/shared.py): every rank's buffer opened
in its peers' processes once, so that calls on it run direct transfers.  Ranks are threads with a
fake NCCL group and a CuPy stand-in whose IPC handles are allocations' starts and whose kernels are
the CUDA source compiled for the host: sums bit for bit the interpreter's, call after call; every
rank refuses alike a registration that cannot be made or a call whose ranks disagree on it; a
rank that closed its registration alone ends the call with errors, never a wrong sum."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fake_device import FakeCuda, host_or_skip, installed
from test_runtime_cupy_nccl import run_ranks

from stragglar.errors import InputError
from stragglar.runtime import MismatchError, RankError, allreduce, allreduce_local, register_buffer
from stragglar.runtime.device import group
from stragglar.synth import synthesize
from stragglar.verify import prove


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return host_or_skip(tmp_path_factory)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch, host: ctypes.CDLL) -> Iterator[FakeCuda]:
    monkeypatch.setattr(group, "CACHED", 32)  # every rank is in this process: keep each one's state
    yield from installed(monkeypatch, host)


def values(n: int, count: int, dtype: str, seed: int) -> list[np.ndarray]:
    """Distinct values per rank and element, exact in ``dtype``'s sums (small integers)."""
    rng = np.random.default_rng(seed)
    return [(rng.permutation(count) % 251 + 300 * r).astype(dtype) for r in range(n)]


def summed(proof: Any, arrays: list[np.ndarray]) -> list[bytes]:
    want = [a.copy() for a in arrays]
    allreduce_local(want, proof)
    return [w.tobytes() for w in want]


@pytest.mark.parametrize(
    ("algorithm", "n", "chunks", "dtype"),
    [("stragglar", 4, 6, "float32"), ("ring", 5, None, "int64"), ("stragglar", 3, None, "float16")],
)
def test_calls_on_registered_buffers_run_direct_and_sum_as_the_interpreter(
    cuda: FakeCuda, algorithm: str, n: int, chunks: int | None, dtype: str
) -> None:
    proof = prove(synthesize(algorithm, n, chunks=chunks))
    inputs = [values(n, 37, dtype, seed) for seed in range(3)]
    buffers = [cuda.buffer(inputs[0][r], offset=16 * (r + 1)) for r in range(n)]

    def rank(r: int, g: Any) -> list[bytes]:
        out = []
        with register_buffer(buffers[r], g, timeout=10) as registration:
            assert registration.addresses[r] == buffers[r].data.ptr
            for call, arrays in enumerate(inputs):
                buffers[r][...] = arrays[r]
                allreduce(buffers[r], proof, g, 0.01 if call == 1 else 0.0, timeout=10, engine="device")
                out.append(np.array(buffers[r]).tobytes())
        return out

    *results, _, _ = run_ranks(n, rank)
    assert not [x for x in results if isinstance(x, Exception)], results
    for call, arrays in enumerate(inputs):
        assert [got[call] for got in results] == summed(proof, arrays), call
    states = list(group._ranks.values())
    assert len(states) == n and all(s.program.direct for s in states)  # one state per rank, direct
    every = np.array([b.data.ptr for b in buffers], dtype=np.uint64)
    assert all(np.array_equal(s.buffer_pointers[1], every) for s in states)  # each reaches every buffer
    bases = {cuda.base_of(b.data.ptr) for b in buffers}
    assert set(cuda.opened) >= bases and bases <= set(cuda.closed)  # opened once here, closed on close


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
    with pytest.raises(InputError, match="runs on CuPy arrays or torch CUDA tensors"):
        register_buffer(np.zeros(4), None)
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
    assert [s.program.direct for s in group._ranks.values()] == [True] * 3 + [False] * 3
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
