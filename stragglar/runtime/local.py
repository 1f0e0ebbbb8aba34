"""All ranks in one process: the reference executor, and the GPU loopback (:func:`allreduce_local`).

Each round, every rank packs its sends, then every receive is filled by a plain slice copy from
the matching send, then the reductions run: exactly the per-rank interpreter, with the network
replaced by copies.  With CuPy arrays on one GPU this is the loopback mode (device-to-device
copies; NCCL refuses two ranks on one GPU).  Rounds that need the straggler wait until
``straggler_delay`` has passed, so on a GPU the hidden phase really runs during the delay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from stragglar.args import MAX_DELAY, as_flag, as_seconds
from stragglar.errors import InputError
from stragglar.runtime.arrays import (
    Array,
    check_buffers,
    check_sizes,
    data_address,
    dtype_name,
    empty_like,
    flat_view,
    library_of,
)
from stragglar.runtime.clock import Timeline, sleep_until
from stragglar.runtime.device.buffers import on_device
from stragglar.runtime.interpreter import apply, recv_view, send_view
from stragglar.runtime.plans import late_rank_for, plan_for
from stragglar.runtime.program import BoundStep, Plan
from stragglar.verify import Proof, require_proof

__all__ = ["allreduce_local", "check_loopback", "check_own_memory", "run_local"]


def allreduce_local(
    buffers: Sequence[Any],
    proof: Proof,
    straggler_delay: float = 0.0,
    *,
    late_rank: int | None = None,
    graphs: bool | None = None,
    engine: str = "rounds",
    staged: bool | None = None,
) -> list[Timeline]:
    """Sum ``buffers`` (one array per rank, all in this process) in place, following the schedule.

    The reference executor (NumPy), and the GPU loopback with CuPy arrays on one device.  The late
    rank (``late_rank``, default the schedule's straggler, else the last rank) arrives
    ``straggler_delay`` seconds (at most an hour) after the start: rounds from its first one on
    wait until then.  ``buffers`` is a list of NumPy, CuPy or torch arrays, all of one library on
    one device; anything else is refused before any data moves.

    CuPy arrays run batched rounds (a few kernels a round, :mod:`~stragglar.runtime.loopback_gpu`)
    replayed from CUDA graphs after the first call; ``graphs=False`` launches them eagerly every
    call.  ``graphs`` applies to CuPy arrays only.

    ``engine="device"`` runs the whole AllReduce on the GPU instead, one persistent kernel per
    rank (:mod:`~stragglar.runtime.device`), on CuPy arrays or torch CUDA tensors of one GPU
    (CuPy launches the kernels; torch's bfloat16 included); ``"rounds"`` (the default) drives the
    rounds from the host as above.  The device engine moves a chunk straight between two ranks'
    buffers where the schedule's own messages make that safe, through the receiver's inbox
    elsewhere; ``staged=True`` stages every transfer (what ranks in separate processes do on a
    buffer that is not registered).  ``staged`` applies to the device engine only.  A device
    call with nobody late (``straggler_delay`` 0) launches every rank's kernel from one CUDA
    graph after its first call; ``graphs=False`` launches them one by one every call (a late
    rank's kernel is always launched by itself, after its delay).
    """
    require_proof(proof)
    check_buffers(buffers)
    delay = as_seconds(straggler_delay, "straggler_delay", maximum=MAX_DELAY)
    late_rank = late_rank_for(proof.schedule, late_rank)
    on_gpu = bool(buffers) and library_of(buffers[0]) == "cupy"
    if graphs is not None:
        as_flag(graphs, "graphs")
    if on_device(engine):
        direct = staged is None or not as_flag(staged, "staged")
        return _on_device(buffers, proof, delay, late_rank, direct, graphs is not False)
    if staged is not None:
        raise InputError(
            "staged applies to the device engine (engine='device'): the rounds engine has no inboxes"
        )
    if graphs is not None and not on_gpu:
        raise InputError("graphs applies to CuPy arrays (the GPU loopback): these rounds have no CUDA graph")
    count = int(flat_view(buffers[0], "rank 0's").shape[0]) if buffers else 0
    plans = [plan_for(proof, r, count) for r in range(proof.num_ranks)]
    if not on_gpu:
        return run_local(buffers, plans, delay, late_rank=late_rank)
    import cupy

    from stragglar.runtime.loopback_gpu import run_cupy_loopback

    flats = check_loopback(buffers, len(plans))
    fingerprint = proof.schedule.fingerprint
    return run_cupy_loopback(cupy, flats, plans, fingerprint, delay, late_rank, graphs is not False)


def _on_device(
    buffers: Sequence[Any], proof: Proof, delay: float, late_rank: int, direct: bool, graphs: bool
) -> list[Timeline]:
    """The device engine on ``buffers``: its program proved (with direct transfers where safe when
    ``direct``), then one kernel per rank (from a graph when nobody is late, unless not ``graphs``)."""
    from stragglar.runtime.device import program_for_call
    from stragglar.runtime.device.buffers import (
        address_of,
        check_device_buffer,
        check_not_capturing,
        launcher,
        queued_work_done,
    )
    from stragglar.runtime.device.loopback import run_device_loopback

    if not buffers:
        raise InputError("the device engine runs on CuPy arrays or torch CUDA tensors: got no buffers")
    check_device_buffer(buffers[0])
    check_not_capturing(buffers[0])
    cupy = launcher()
    flats = check_loopback(buffers, proof.num_ranks)
    count = int(flats[0].shape[0])
    addresses = [address_of(f) for f in flats]
    devices = sorted({device for _, device in addresses})
    if len(devices) > 1:
        raise InputError(f"the device engine runs every rank on one GPU, got buffers on GPUs {devices}")
    dtype, fingerprint = dtype_name(flats[0]), proof.schedule.fingerprint
    program = program_for_call(proof, direct, count, dtype)  # proved before its first launch
    queued_work_done(flats[0], devices[0])
    pointers = [pointer for pointer, _ in addresses]
    return run_device_loopback(
        cupy, pointers, count, dtype, devices[0], program, fingerprint, delay, late_rank, graphs
    )


def check_own_memory(flats: Sequence[Array]) -> None:
    """Refuse, before any data moves, buffers that cannot each take one rank's result in place: a
    read-only one (it would fail half-way, the others partly reduced) or two that share memory
    (every rank's writes would land in both, and the sum would be wrong without a word).

    >>> import numpy as np
    >>> a = np.arange(6.0)
    >>> check_own_memory([a[:3], a[3:]])  # apart: fine
    >>> check_own_memory([a[:4], a[2:]])
    Traceback (most recent call last):
    ...
    stragglar.errors.InputError: the buffers of ranks 0 and 1 overlap: each rank needs a buffer of its own
    """
    for rank, flat in enumerate(flats):
        flags = getattr(flat, "flags", None)
        if flags is not None and not getattr(flags, "writeable", True):
            raise InputError(f"allreduce writes in place: rank {rank}'s buffer is read-only")
    extents = sorted((*_extent(flat), rank) for rank, flat in enumerate(flats) if flat.shape[0])
    reach, owner = -1, -1  # the furthest end so far, and whose buffer reaches it
    for start, end, rank in extents:
        if start < reach:
            first, second = sorted((owner, rank))
            raise InputError(
                f"the buffers of ranks {first} and {second} overlap: each rank needs a buffer of its own"
            )
        if end > reach:
            reach, owner = end, rank


def check_loopback(buffers: Sequence[Array], num_ranks: int) -> list[Array]:
    """The buffers as 1-D views, once they are one per rank of ``num_ranks``, of one dtype and
    size, each its own."""
    if len(buffers) != num_ranks:
        raise InputError(f"schedule has {num_ranks} ranks, got {len(buffers)} buffers")
    if len({dtype_name(b) for b in buffers}) > 1:
        raise InputError(f"every rank needs the same dtype, got {sorted({dtype_name(b) for b in buffers})}")
    flats = [flat_view(b, f"rank {rank}'s") for rank, b in enumerate(buffers)]
    check_sizes([int(f.shape[0]) for f in flats], "allreduce")
    check_own_memory(flats)
    return flats


def _extent(flat: Array) -> tuple[int, int]:
    """The bytes a contiguous 1-D buffer covers: NumPy, CuPy (device pointers are unique across a
    process's devices) or torch."""
    start = data_address(flat)
    return start, start + int(flat.shape[0]) * int(flat.dtype.itemsize)


def run_local(
    buffers: Sequence[Array],
    plans: Sequence[Plan],
    straggler_delay: float = 0.0,
    sync: Callable[[], None] = lambda: None,
    late_rank: int | None = None,
) -> list[Timeline]:
    """AllReduce ``buffers`` (one per rank, in place) with one bound plan per rank.

    The late rank (``late_rank``, default the schedule's straggler, else the last rank: see
    :func:`~stragglar.runtime.plans.late_rank_for`) arrives ``straggler_delay`` seconds after the
    start, so every round from its first one on waits until then, as every rank would wait for it
    on a network; rounds before it run at once.  ``sync`` waits for queued device work
    (``cupy.cuda.Device().synchronize``) before the clock is read at the end.
    """
    flats = check_loopback(buffers, len(plans))
    start = time.perf_counter()
    works = [empty_like(f, p.work_size) for f, p in zip(flats, plans, strict=True)]
    by_round: dict[int, dict[int, BoundStep]] = {}
    for p in plans:
        for step in p.steps:
            by_round.setdefault(step.round, {})[p.rank] = step
    program = plans[0].program
    late_rank = late_rank_for(program, late_rank)
    late_steps = plans[late_rank].program.steps
    joins = late_steps[0].round if late_steps else 0
    arrived: float | None = None
    phase_done: list[list[float | None]] = [[None] * len(program.phases) for _ in plans]
    for rnd in sorted(by_round):
        if rnd >= joins and arrived is None:
            arrived = sleep_until(start + straggler_delay)
        steps = by_round[rnd]
        sent = {
            (rank, m.peer): send_view(flats[rank], works[rank], m)
            for rank, s in steps.items()
            for m in s.sends
        }
        for rank, step in steps.items():
            for m in step.recvs:
                data = sent[(m.peer, rank)]
                assert data.shape[0] == m.size, (
                    f"round {rnd}: {m.peer}->{rank} sends {data.shape[0]}, not {m.size}"
                )
                recv_view(flats[rank], works[rank], m)[:] = data
        now = time.perf_counter()
        for rank, step in steps.items():
            for m in step.recvs:
                apply(flats[rank], works[rank], m)
            phase_done[rank][step.phase] = now
    if arrived is None:  # no round moved data after it joined (tiny buffers): it still came late
        arrived = sleep_until(start + straggler_delay)
    sync()
    done = time.perf_counter()
    return [
        Timeline(r, start, arrived if r == late_rank else start, tuple(phase_done[r]), done)
        for r in range(len(plans))
    ]
