"""The device engine across processes on one GPU, for test_runtime_device_gpu.py: ranks as
processes of their own on a torch NCCL group, their kernels reaching each other's buffers through
CUDA IPC handles.  Run as a script (``python tests/device_ranks.py WORLD``) in a process that has
made no CUDA context: the launcher forks its ranks, and a context made before a fork is unusable
in the children (the test's own process has run the engine already).  Prints ``WORLD ranks
exact`` and exits 0, or exits 1 with what failed."""

from __future__ import annotations

import ctypes
import signal
import sys
from typing import Any

from stragglar.measure.launch import LaunchError, launch
from stragglar.runtime import allreduce
from stragglar.synth import synthesize
from stragglar.verify import prove


def device_rank(rank: int, world: int) -> bool:
    """A rank of its own process on a torch NCCL group: the device engine, twice on fresh tensors
    (staged), then twice on a registered one (direct transfers), then three registered ones at
    once (``async_op``), exact; a registration left open on a group is closed as the group is
    destroyed; then with packets on, on fresh tensors and on a registered one, exact; then a rank
    that brings a CPU tensor is named by its peers at once (:func:`refusals`)."""
    import torch
    import torch.distributed as dist

    from stragglar.runtime import register_buffer
    from stragglar.runtime.device import states

    proof = prove(synthesize("stragglar", world, chunks=2 * world))
    base = torch.arange(10_000, dtype=torch.float32, device="cuda") % 97
    fresh_then_registered(rank, world, proof, base, 4, "")
    # three registered tensors at once (async_op), each waited for over a second group, as the DDP
    # hook's second thread waits; the second step is launched with every setup checked already
    other = dist.new_group(list(range(world)))
    several = [torch.empty_like(base) for _ in range(3)]
    registrations = [register_buffer(t, timeout=60) for t in several]
    for step in range(2):
        for k, t in enumerate(several):
            t.copy_(base * world + rank + 10 * k + step)
        works = [
            allreduce(t, proof, timeout=60, lockstep=True, engine="device", async_op=True) for t in several
        ]
        for work in works:
            work.wait(other)
        for k, t in enumerate(several):
            want = base * world * world + world * (world - 1) // 2 + world * (10 * k + step)
            if not torch.equal(t, want):
                raise AssertionError(
                    f"rank {rank} async step {step} tensor {k}: {int((t != want).sum())} wrong"
                )
    for registration in registrations:
        registration.close()
    sub = dist.new_group(list(range(world)))
    staged = base * world + rank
    allreduce(staged, proof, sub, timeout=60, engine="device")  # a state kept on the group
    if not torch.equal(staged, base * world * world + world * (world - 1) // 2):
        raise AssertionError(f"rank {rank}: a staged call on a subgroup was not exact")
    left = register_buffer(torch.empty_like(base), sub, timeout=60)  # never closed by the script
    dist.destroy_process_group(sub)
    if left.open:
        raise AssertionError(f"rank {rank}: a registration left open outlived its group")
    if any(owner is sub for owner, _ in states._kept):
        raise AssertionError(f"rank {rank}: the device states of a group outlived it")
    packets(rank, world, proof, base)
    refusals(rank, world, proof, base)
    return True


def refusals(rank: int, world: int, proof: Any, base: Any) -> None:
    """Rank 1 brings a CPU tensor (to the NCCL engine, then to the device engine): it raises its own
    error after the header's gather, which it joins on the GPU its group is bound to, and its peers
    a MismatchError naming it at once, not a timeout; every rank then calls again, exact."""
    import time

    import torch

    from stragglar.errors import ArgumentError, InputError
    from stragglar.runtime.header import MismatchError

    for engine, own, problem in (
        ("rounds", ArgumentError, "has data its engine cannot send"),
        ("device", InputError, "has a buffer the device engine cannot run on"),
    ):
        tensor = base * world + rank
        if rank == 1:
            tensor = tensor.cpu()
        start = time.monotonic()
        try:
            allreduce(tensor, proof, timeout=30, engine=engine)
        except (ArgumentError, InputError) as e:  # MismatchError is an InputError
            said: Exception | None = e
        else:
            said = None
        waited = time.monotonic() - start
        if rank == 1 and type(said) is not own:
            raise AssertionError(f"rank 1, engine {engine}: {own.__name__} expected, got {said!r}")
        if rank != 1 and not (isinstance(said, MismatchError) and f"rank 1 {problem}" in str(said)):
            raise AssertionError(f"rank {rank}, engine {engine}: rank 1 not named at once: {said!r}")
        if waited > 20:
            raise AssertionError(f"rank {rank}, engine {engine}: the refusal took {waited:.0f} s")
        again = base * world + rank
        allreduce(again, proof, timeout=60, engine=engine)
        if not torch.equal(again, base * world * world + world * (world - 1) // 2):
            raise AssertionError(f"rank {rank}, engine {engine}: the call after a refusal was not exact")


def packets(rank: int, world: int, proof: Any, base: Any) -> None:
    """Calls with packets on (the engine's own tuning, packets up to the chunks the benchmarks
    time them at: these chunks of 5 KB move as packets), on fresh tensors and on a registered one."""
    import pytest

    from stragglar.runtime.device import programs
    from stragglar.runtime.device.kernel import PACKET_BYTES, Tuning

    pytest.MonkeyPatch().setattr(programs, "OWN_TUNING", Tuning(packet_bytes=PACKET_BYTES))  # this process's
    fresh_then_registered(rank, world, proof, base, 3, " as packets")


def fresh_then_registered(rank: int, world: int, proof: Any, base: Any, calls: int, how: str) -> None:
    """``calls`` calls, the first two on fresh tensors and the others on one registered tensor,
    each exact (``how``: said after the call's number where one is not)."""
    import torch

    from stragglar.runtime import register_buffer

    kept = torch.empty_like(base)
    with register_buffer(kept, timeout=60):
        for call in range(calls):
            tensor = base * world + rank + call if call < 2 else kept.copy_(base * world + rank + call)
            allreduce(tensor, proof, timeout=60, engine="device")
            want = base * world * world + world * (world - 1) // 2 + world * call
            if not torch.equal(tensor, want):
                wrong = int((tensor != want).sum())
                raise AssertionError(f"rank {rank} call {call}{how}: {wrong} wrong elements")


def main(world: int) -> int:
    if sys.platform.startswith("linux"):  # die with the test that started this (its ranks die with this)
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    try:
        results = launch(device_rank, world, (), timeout=90, backend="nccl", gpus=1)
    except LaunchError as failed:
        print(failed, file=sys.stderr)
        return 1
    if results != [True] * world:
        print(f"ranks returned {results}", file=sys.stderr)
        return 1
    print(f"{world} ranks exact")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
