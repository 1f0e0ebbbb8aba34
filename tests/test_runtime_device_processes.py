"""Device ranks as processes of their own (stragglar/runtime/device/group.py and shared.py), with
no GPU: each rank a forked process whose "device" memory is files mapped into memory
(:class:`fake_device.MappedCuda`), so a peer's memory sits at another address in every process,
as CUDA maps it, and whose kernels are the CUDA source compiled for the host.  The handles of the
inboxes, flags and registered buffers cross real process boundaries; the sums, staged and direct,
must be the interpreter's bit for bit, call after call."""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cupy_surface import bare
from fake_device import H200, MappedCuda, host_or_skip, installed

from stragglar.runtime import allreduce_local
from stragglar.runtime.device import group, program_for, shared, states
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
    dies: int = -1,
    timeout: float = 20.0,
) -> None:
    """One rank: its buffer registered, a call on it per input (the late rank late in the
    second), then one more call on an unregistered buffer (staged); puts what it ended with.
    Rank ``dies``'s process ends once its buffer is registered; a device wait gives up after
    ``timeout`` seconds."""
    try:
        import cupy  # the stand-in, installed before the fork

        cuda: MappedCuda = bare(cupy.cuda)  # the stand-in's own, with its test helpers
        algorithm, n, chunks = spec
        proof = prove(synthesize(algorithm, n, chunks=chunks))
        late = proof.schedule.late_rank
        buffer = cuda.buffer(inputs[0][rank], offset=8 * (rank + 1))  # 16-byte aligned on every other rank
        results = []
        # counters apart, as after a registration whose gather ended on some ranks only
        shared._numbers["group"] = rank
        registration = shared.register(cupy, "group", rank, buffer, gather.of(rank))
        if rank == dies:
            os._exit(0)
        for call, arrays in enumerate([*inputs, inputs[0]]):
            on = buffer if call < len(inputs) else cuda.buffer(arrays[rank], offset=8)
            on[...] = arrays[rank]
            group.DeviceCall(
                cupy,
                states.states_for("group", None)[0],
                program_for(proof, direct=call < len(inputs)),
                proof.schedule.fingerprint,
                rank,
                int(on.data.ptr),
                int(on.shape[0]),
                str(on.dtype),
                0,
                0.02 if call == 1 else 0.0,
                late,
                timeout,
                gather.of(rank),
                registration if call < len(inputs) else None,
            ).run()
            results.append(np.array(on).tobytes())
        out.put((rank, results, [registration.number, *registration.addresses]))
    except Exception as e:  # handed to the test
        out.put((rank, repr(e), []))


def answers(
    out: Any, ranks: list[Any], timeout: float, silent: Sequence[int] = ()
) -> dict[int, tuple[Any, list[int]]]:
    """Every rank's answer but the ``silent`` ones', by rank: the test fails once every rank's
    process has ended, or ``timeout`` has passed, with an answer missing; the processes are ended
    either way."""
    got: dict[int, tuple[Any, list[int]]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(ranks) - len(silent) and time.monotonic() < deadline:
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
    missing = sorted(set(range(len(ranks))) - set(got) - set(silent))
    assert not missing, f"ranks {missing} gave no answer (exit codes {[p.exitcode for p in ranks]})"
    return got


def run_ranks(
    n: int, spec: tuple[str, int, int | None], inputs: list[list[np.ndarray]], **options: Any
) -> dict[int, tuple[Any, list[int]]]:
    """:func:`rank_process` in ``n`` forked processes (``options``: its keywords, and ``gather``,
    the gather's timeout); their answers, by rank."""
    context = multiprocessing.get_context("fork")
    gather, out = ProcessGather(context, n, timeout=options.pop("gather", 30.0)), context.Queue()
    ranks = [
        context.Process(target=rank_process, args=(r, gather, spec, inputs, out), kwargs=options)
        for r in range(n)
    ]
    for process in ranks:
        process.start()
    return answers(out, ranks, timeout=90.0, silent=[options["dies"]] if "dies" in options else [])


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
    got = run_ranks(n, (algorithm, n, chunks), inputs)
    failed = {rank: results for rank, (results, _) in got.items() if isinstance(results, str)}
    assert not failed, failed
    for call, arrays in enumerate([*inputs, inputs[0]]):
        want = [a.copy() for a in arrays]
        allreduce_local(want, proof)
        assert [got[r][0][call] for r in range(n)] == [w.tobytes() for w in want], call
    # every rank reached its peers' buffers where they are mapped in its own process, not where
    # their owners have them
    own = [got[r][1][1 + r] for r in range(n)]
    assert any(got[r][1][1 + p] != own[p] for r in range(n) for p in range(n) if p != r)
    assert [got[r][1][0] for r in range(n)] == [n] * n  # the highest number proposed, on every rank


def test_a_rank_whose_process_dies_ends_its_peers_calls_with_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Rank 2's process ends after registering: its peers' kernels wait on its flags until their
    clock says the timeout has passed, and their gather of the error words fails: an error on
    every living rank, within seconds, not a hang."""
    library = host_or_skip(tmp_path_factory)
    for _ in installed(monkeypatch, library, cuda=MappedCuda(dict(H200), tmp_path)):
        pass
    inputs = [[np.arange(30, dtype=np.float32) + 100 * r for r in range(3)]]
    started = time.monotonic()
    got = run_ranks(3, ("stragglar", 3, None), inputs, dies=2, timeout=0.5, gather=3.0)
    assert time.monotonic() - started < 30
    assert sorted(got) == [0, 1]  # rank 2 answered nothing: its process ended
    assert all("did not come to the gather" in got[r][0] for r in (0, 1)), got
