"""Device ranks as processes of their own (stragglar/runtime/device/group.py and shared.py), with
no GPU: each rank a forked process whose "device" memory is files mapped into memory
(:class:`fake_device.MappedCuda`), so a peer's memory sits at another address in every process,
as CUDA maps it, and whose kernels are the CUDA source compiled for the host.  The handles of the
inboxes, flags and registered buffers cross real process boundaries; the sums, staged and direct,
must be the interpreter's bit for bit, call after call."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_device import H200, MappedCuda, host_or_skip, installed

from stragglar.runtime import allreduce_local
from stragglar.runtime.device import group, program_for, shared
from stragglar.synth import synthesize
from stragglar.verify import prove

WIDTH = 32  # the most integers a rank gathers at once (a registration's: 5 and a handle's 8)


class ProcessGather:
    """An all-gather of integers among forked processes: a row each in shared memory, and a
    barrier bounded by ``timeout`` (a rank that never comes breaks it: a TimeoutError)."""

    def __init__(self, context: Any, size: int, timeout: float) -> None:
        self.size = size
        self.rows = context.Array("q", size * WIDTH, lock=False)
        self.lengths = context.Array("q", size, lock=False)
        self.barrier = context.Barrier(size, timeout=timeout)

    def of(self, rank: int) -> Callable[[Sequence[int]], list[tuple[int, ...]]]:
        def gather(values: Sequence[int]) -> list[tuple[int, ...]]:
            self.rows[rank * WIDTH : rank * WIDTH + len(values)] = list(values)
            self.lengths[rank] = len(values)
            try:
                self.barrier.wait()
                out = [tuple(self.rows[r * WIDTH : r * WIDTH + self.lengths[r]]) for r in range(self.size)]
                self.barrier.wait()  # everyone has read before anyone writes again
            except threading.BrokenBarrierError:
                raise TimeoutError("a rank did not come to the gather") from None
            return out

        return gather


def rank_process(
    rank: int,
    gather: ProcessGather,
    spec: tuple[str, int, int | None],
    inputs: list[list[np.ndarray]],
    out: Any,
) -> None:
    """One rank: its buffer registered, a call on it per input (the late rank late in the
    second), then one more call on an unregistered buffer (staged); puts what it ended with."""
    try:
        import cupy  # the stand-in, installed before the fork

        cuda: MappedCuda = cupy.cuda
        algorithm, n, chunks = spec
        proof = prove(synthesize(algorithm, n, chunks=chunks))
        late = proof.schedule.late_rank
        buffer = cuda.buffer(inputs[0][rank], offset=16 * (rank + 1))
        results = []
        registration = shared.register(cupy, "group", rank, buffer, gather.of(rank))
        for call, arrays in enumerate([*inputs, inputs[0]]):
            on = buffer if call < len(inputs) else cuda.buffer(arrays[rank], offset=8)
            on[...] = arrays[rank]
            group.run_device_rank(
                cupy,
                "group",
                program_for(proof, direct=call < len(inputs)),
                proof.schedule.fingerprint,
                rank,
                int(on.data.ptr),
                int(on.shape[0]),
                str(on.dtype),
                0,
                0.02 if call == 1 else 0.0,
                late,
                20.0,
                gather.of(rank),
                registration if call < len(inputs) else None,
            )
            results.append(np.array(on).tobytes())
        out.put((rank, results, [int(a) for a in registration.addresses]))
    except Exception as e:  # noqa: BLE001: handed to the test
        out.put((rank, repr(e), []))


def answers(out: Any, ranks: list[Any], timeout: float) -> dict[int, tuple[Any, list[int]]]:
    """Every rank's answer, by rank: the test fails once every rank's process has ended, or
    ``timeout`` has passed, with an answer missing; the processes are ended either way."""
    got: dict[int, tuple[Any, list[int]]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(ranks) and time.monotonic() < deadline:
            try:
                rank, results, addresses = out.get(timeout=0.2)
            except queue.Empty:
                if not any(process.is_alive() for process in ranks) and out.empty():
                    break
                continue
            got[rank] = (results, addresses)
    finally:
        for process in ranks:
            process.join(5)
            if process.is_alive():
                process.kill()
    missing = sorted(set(range(len(ranks))) - set(got))
    assert not missing, f"ranks {missing} gave no answer (exit codes {[p.exitcode for p in ranks]})"
    return got


@pytest.mark.parametrize(
    ("algorithm", "n", "chunks", "dtype"),
    [("stragglar", 4, 6, "float32"), ("ring", 3, None, "int64"), ("stragglar", 3, None, "float16")],
)
def test_ranks_in_processes_of_their_own_sum_as_the_interpreter(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    algorithm: str,
    n: int,
    chunks: int | None,
    dtype: str,
) -> None:
    library = host_or_skip(tmp_path_factory)
    for _ in installed(monkeypatch, library, cuda=MappedCuda(dict(H200), tmp_path)):
        pass  # what it installs stays until the test ends, and the forked ranks inherit it
    proof = prove(synthesize(algorithm, n, chunks=chunks))
    rng = np.random.default_rng(n)
    inputs = [[(rng.permutation(41) % 251 + 300 * r).astype(dtype) for r in range(n)] for _ in range(3)]
    context = multiprocessing.get_context("fork")
    gather, out = ProcessGather(context, n, timeout=30.0), context.Queue()
    spec = (algorithm, n, chunks)
    ranks = [context.Process(target=rank_process, args=(r, gather, spec, inputs, out)) for r in range(n)]
    for process in ranks:
        process.start()
    got = answers(out, ranks, timeout=90.0)
    failed = {rank: results for rank, (results, _) in got.items() if isinstance(results, str)}
    assert not failed, failed
    for call, arrays in enumerate([*inputs, inputs[0]]):
        want = [a.copy() for a in arrays]
        allreduce_local(want, proof)
        assert [got[r][0][call] for r in range(n)] == [w.tobytes() for w in want], call
    # every rank reached its peers' buffers where they are mapped in its own process, not where
    # their owners have them
    own = [got[r][1][r] for r in range(n)]
    assert any(got[r][1][p] != own[p] for r in range(n) for p in range(n) if p != r)
