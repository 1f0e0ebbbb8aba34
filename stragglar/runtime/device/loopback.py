"""Every rank in one process on one GPU, each running its device program as one kernel launch.

Each rank's kernel goes on its own stream; the late rank's is launched ``straggler_delay`` after
the others, which meanwhile run every round that does not need it.  The kernels spin on each
other's flags, so they must all be resident at once: a launch whose blocks the device could not
hold together is refused before anything runs (:func:`resident_blocks`, from the device's
multiprocessors and the kernel's registers, threads and shared memory).  A call waits for every
rank's kernel before it returns, which is what lets the next call reuse the inboxes (see
:mod:`~stragglar.runtime.device.table`); the flags are never reset (their values carry the call
number).  A wait that times out on the device comes back as a
:class:`~stragglar.runtime.failures.RankError` naming the rank, the round and the peer.

Inboxes, flags and the error words are kept per (schedule, element count, dtype, device), a few.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from stragglar.errors import InputError
from stragglar.runtime.clock import Timeline, sleep_until
from stragglar.runtime.device.kernel import ERROR_WORDS, SOURCE, THREADS, kernel_args, kernel_name, slot_size
from stragglar.runtime.device.table import DeviceProgram
from stragglar.runtime.failures import RankError, failure_phrase
from stragglar.runtime.kernels import SUMS
from stragglar.runtime.plans import cached

__all__ = [
    "MAX_BLOCKS",
    "DeviceLoopback",
    "blocks_for",
    "rank_error",
    "resident_blocks",
    "run_device_loopback",
]

MAX_BLOCKS = 16  # thread blocks a rank at most: enough to keep a GPU's copy engines busy
WAIT_TIMEOUT_S = 30.0  # how long a device wait spins, beyond the late rank's delay, before it gives up
_DEFAULT_BLOCKS_PER_SM = 16  # where a device does not say how many blocks a multiprocessor holds


def resident_blocks(properties: Mapping[str, int], registers: int, shared_bytes: int, threads: int) -> int:
    """How many blocks of ``threads`` threads, each thread using ``registers`` registers (rounded
    up to the hardware's 8) and each block ``shared_bytes`` of shared memory, the device holds
    at once (``properties``: ``cupy.cuda.runtime.getDeviceProperties``, cudaDeviceProp's fields)."""
    per_sm = min(
        properties["maxThreadsPerMultiProcessor"] // threads,
        properties.get("maxBlocksPerMultiProcessor", _DEFAULT_BLOCKS_PER_SM),
        properties["regsPerMultiprocessor"] // (-(-max(registers, 1) // 8) * 8 * threads),
        properties["sharedMemPerMultiprocessor"] // max(shared_bytes, 1),
    )
    return int(properties["multiProcessorCount"]) * max(per_sm, 0)


def blocks_for(program: DeviceProgram, count: int, resident: int) -> int:
    """Blocks a rank: as many as the device holds for every rank at once (at most
    :data:`MAX_BLOCKS`), fewer when a chunk has too few elements to share; refused when not even
    one block a rank fits (the ranks' spin-waits would deadlock)."""
    n = program.num_ranks
    if resident < n:
        raise InputError(
            f"the device holds {resident} blocks of this kernel at once, fewer than the {n} ranks: "
            "their kernels could not all run together"
        )
    largest = -(-count // program.num_chunks)
    return max(1, min(MAX_BLOCKS, resident // n, -(-largest // THREADS)))


class DeviceLoopback:
    """One program's device state: each rank's rows, inbox and flags, the error words, the
    streams, and the number of the last call (the flags' values go on from it)."""

    def __init__(self, cupy: Any, program: DeviceProgram, count: int, dtype: str, device_id: int) -> None:
        self.cupy = cupy
        self.program = program
        self.lock = threading.Lock()  # one call at a time: inboxes and flags are shared
        module = cupy.RawModule(code=SOURCE, options=("--std=c++14",), name_expressions=[kernel_name(dtype)])
        self.kernel = module.get_function(kernel_name(dtype))
        resident = resident_blocks(
            cupy.cuda.runtime.getDeviceProperties(device_id),
            self.kernel.num_regs,
            self.kernel.shared_size_bytes,
            THREADS,
        )
        self.blocks = blocks_for(program, count, resident)
        self.count = count
        self.slot_size = slot_size(count, program.num_chunks, dtype)
        word = SUMS[dtype][1]
        n = program.num_ranks
        self.rows = [cupy.asarray(np.ascontiguousarray(r)) for r in program.rows]
        self.inboxes = [
            cupy.empty(max(s, 1) * max(self.slot_size, 1), dtype=word) for s in program.inbox_slots
        ]
        self.flags = [cupy.zeros(program.flags * self.blocks, dtype=cupy.uint64) for _ in range(n)]
        self.errors = cupy.zeros(n * ERROR_WORDS, dtype=cupy.uint64)
        self.inbox_pointers = cupy.asarray(np.array([b.data.ptr for b in self.inboxes], dtype=np.uint64))
        self.flag_pointers = cupy.asarray(np.array([f.data.ptr for f in self.flags], dtype=np.uint64))
        self.streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(n)]
        self.buffer_pointers: tuple[tuple[int, ...], Any] = ((), None)  # the last buffers, on the device
        self.call = 0

    def launch(self, rank: int, buffers: Sequence[int], timeout_s: float) -> None:
        """Rank ``rank``'s kernel on its stream, after the caller's queued work."""
        stream = self.streams[rank]
        stream.wait_event(self.cupy.cuda.get_current_stream().record())
        pointers = (self._buffer_pointers(buffers), self.inbox_pointers, self.flag_pointers, self.errors)
        args = kernel_args(
            self.program,
            rank,
            self.rows[rank],
            self.call,
            self.count,
            self.slot_size,
            buffers[rank],
            pointers,
            timeout_s,
        )
        with stream:
            self.kernel((self.blocks,), (THREADS,), args)

    def _buffer_pointers(self, buffers: Sequence[int]) -> Any:
        """Every rank's buffer address on the device, for the direct rows (made again only when
        the caller's buffers change)."""
        if self.buffer_pointers[0] != tuple(buffers):
            self.buffer_pointers = (tuple(buffers), self.cupy.asarray(np.array(buffers, dtype=np.uint64)))
        return self.buffer_pointers[1]

    def run(self, buffers: Sequence[int], straggler_delay: float, late_rank: int) -> list[Timeline]:
        """One call on the buffers at addresses ``buffers`` (one per rank): every rank's kernel,
        the late rank's ``straggler_delay`` s after the others."""
        self.call += 1
        self.errors.fill(0)
        timeout = WAIT_TIMEOUT_S + straggler_delay
        start = time.perf_counter()
        for rank in range(len(buffers)):
            if rank != late_rank:
                self.launch(rank, buffers, timeout)
        arrived = sleep_until(start + straggler_delay)
        self.launch(late_rank, buffers, timeout)
        for stream in self.streams:
            stream.synchronize()
        done = time.perf_counter()
        words = self.errors.get().reshape(-1, ERROR_WORDS)
        failed = [r for r in range(len(buffers)) if words[r, 0]]
        if failed:
            raise first_failure(self.program, words, failed)
        return [
            Timeline(r, start, arrived if r == late_rank else start, self.program.phase_ends(r, done), done)
            for r in range(len(buffers))
        ]


def rank_error(program: DeviceProgram, rank: int, words: np.ndarray, also: Sequence[int] = ()) -> RankError:
    """The :class:`RankError` of rank ``rank``'s error words (row, round, peer, flag, wanted, seen,
    block): a wait on the device that timed out; ``also``: the other ranks that timed out."""
    row, rnd, peer, flag, wanted, seen, block = (int(w) for w in words[1:ERROR_WORDS])
    phase, number = program.phase_round(rnd)
    what = failure_phrase("timed out", number, phase, peer)
    others = f" (ranks {list(also)} timed out too)" if also else ""
    return RankError(
        f"allreduce failed: rank {rank} {what}: block {block} waited at row {row} for flag {flag} "
        f">= {wanted}, saw {seen}{others}",
        rank=rank,
        reason="timed out",
        round=number,
        phase=phase,
        peer=peer,
    )


def first_failure(program: DeviceProgram, words: np.ndarray, failed: Sequence[int]) -> RankError:
    """The error to raise when ranks ``failed``: one whose peer did not fail itself (the rank that
    never came, not those that waited for others that waited for it), else the first."""
    root = next((r for r in failed if int(words[r, 3]) not in failed), failed[0])
    return rank_error(program, root, words[root], [r for r in failed if r != root])


_loopbacks: OrderedDict[Hashable, DeviceLoopback] = OrderedDict()
CACHED = 4  # loopbacks kept: each holds inboxes about the size of the buffers


def run_device_loopback(
    cupy: Any,
    buffers: Sequence[int],
    count: int,
    dtype: str,
    device_id: int,
    program: DeviceProgram,
    fingerprint: str,
    straggler_delay: float,
    late_rank: int,
) -> list[Timeline]:
    """AllReduce in place the ``count``-element ``dtype`` buffers at addresses ``buffers`` (one
    per rank, all on device ``device_id``) with ``program``, the proved program of the schedule
    whose fingerprint is ``fingerprint``."""
    key = (fingerprint, program.direct, count, dtype, device_id)
    loopback = cached(_loopbacks, key, lambda: DeviceLoopback(cupy, program, count, dtype, device_id), CACHED)
    with loopback.lock:
        return loopback.run(buffers, straggler_delay, late_rank)
