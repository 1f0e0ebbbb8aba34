"""Every rank in one process on one GPU, each running its device program as one kernel launch.

Each rank's kernel goes on its own stream; the late rank's is launched ``straggler_delay`` after
the others, which meanwhile run every round that does not need it.  The kernels spin on each
other's flags, so they must all be resident at once: a launch whose blocks the device could not
hold together is refused before anything runs (:func:`resident_blocks`, from the device's
multiprocessors and the kernel's registers, threads and shared memory).  A call waits for every
rank's kernel before it returns, which is what lets the next call reuse the inboxes (see
:mod:`~stragglar.runtime.device.table`); the flags are never reset (their values carry the call
number, which the device counts).  A wait that times out on the device comes back as a
:class:`~stragglar.runtime.failures.RankError` naming the rank, the round and the peer.

A call with nobody late launches every rank's kernel at once: from its second call on, that is
one CUDA graph's replay (:class:`~stragglar.runtime.graphs.Replayer`), which spares the host a
launch per rank.  The graph reads the buffers through a device array of their addresses written
before each call, so it replays on any buffers.

Inboxes, flags and the words are kept per (schedule, element count, dtype, device), a few.
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
from stragglar.runtime.device.kernel import (
    ERROR_WORDS,
    OWN_TUNING,
    PROGRESS_WORDS,
    RANK_WORDS,
    Tuning,
    compile_kernel,
    kernel_args,
    packet_unit,
    recount,
    slot_size,
)
from stragglar.runtime.device.residency import RESIDENT
from stragglar.runtime.device.table import COPY_PACKETS, PACKETS, REDUCE_PACKETS, WAIT, DeviceProgram
from stragglar.runtime.failures import RankError, failure_phrase
from stragglar.runtime.graphs import Replayer, StreamGraphs
from stragglar.runtime.kernels import SUMS
from stragglar.runtime.plans import cached

__all__ = [
    "DeviceLoopback",
    "blocks_for",
    "call_failure",
    "device_loopback",
    "first_failure",
    "rank_error",
    "resident_blocks",
    "run_device_loopback",
]

WAIT_TIMEOUT_S = 30.0  # how long a device wait spins, beyond the late rank's delay, before it gives up
# CUDA runs at most 128 kernels at once on a device (compute capability 7.0 and later): past that,
# ranks' kernels would queue behind ranks that spin waiting for them
MAX_KERNELS = 128
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


def blocks_for(program: DeviceProgram, count: int, dtype: str, resident: int, tuning: Tuning) -> int:
    """Blocks a rank: as many as the device holds for every rank at once (at most
    ``tuning.max_blocks``), fewer when a chunk of ``count`` elements of ``dtype`` has too few to
    share among blocks of ``tuning.threads`` (a program of packets: too few packet units, which
    a thread moves whole, so that no thread of a block idles for want of one); refused when not
    even one block a rank fits (the ranks' spin-waits would deadlock)."""
    n = program.num_ranks
    if resident < n:
        raise InputError(
            f"the device holds {resident} blocks of this kernel at once, fewer than the {n} ranks: "
            "their kernels could not all run together"
        )
    largest = -(-count // program.num_chunks)
    if program.packets:
        largest = -(-largest // packet_unit(dtype))
    return max(1, min(tuning.max_blocks, resident // n, -(-largest // tuning.threads)))


class DeviceLoopback:
    """One program's device state: each rank's rows, inbox, flags and words, every rank's buffer
    address on the device (written before a call), the streams, the graphs of punctual calls, and
    the number of calls made (the device counts them too: see
    :mod:`~stragglar.runtime.device.kernel_source`).  ``tuning``: the kernel's blocks, threads,
    vectors and pause."""

    def __init__(
        self,
        cupy: Any,
        program: DeviceProgram,
        count: int,
        dtype: str,
        device_id: int,
        system: bool,
        tuning: Tuning = OWN_TUNING,
    ) -> None:
        if program.num_ranks > MAX_KERNELS:
            raise InputError(
                f"the device engine runs every rank's kernel at once on one GPU, which runs at most "
                f"{MAX_KERNELS} kernels at once, not {program.num_ranks}"
            )
        self.cupy = cupy
        self.program = program
        self.system = system  # flags at the system's scope, as across GPUs (every rank is on one here)
        self.lock = threading.Lock()  # one call at a time: inboxes and flags are shared
        self.kernel = compile_kernel(cupy, dtype, tuning)
        self.threads = tuning.threads
        resident = resident_blocks(
            cupy.cuda.runtime.getDeviceProperties(device_id),
            self.kernel.num_regs,
            self.kernel.shared_size_bytes,
            self.threads,
        )
        self.blocks = blocks_for(program, count, dtype, resident, tuning)
        self.device_id, self.resident = device_id, resident
        self.count = count
        self.slot_size = slot_size(count, program.num_chunks, dtype, program.packets)
        word = SUMS[dtype][1]
        n = program.num_ranks
        self.rows = [cupy.asarray(np.ascontiguousarray(r)) for r in program.rows]
        # zeroed: a slot of packets must hold no mark of a call before its first write
        self.inboxes = [
            cupy.zeros(max(s, 1) * max(self.slot_size, 1), dtype=word) for s in program.inbox_slots
        ]
        self.flags = [cupy.zeros(program.flags * self.blocks, dtype=cupy.uint64) for _ in range(n)]
        self.words = cupy.zeros(n * RANK_WORDS, dtype=cupy.uint64)
        self.inbox_pointers = cupy.asarray(np.array([b.data.ptr for b in self.inboxes], dtype=np.uint64))
        self.flag_pointers = cupy.asarray(np.array([f.data.ptr for f in self.flags], dtype=np.uint64))
        self.buffer_pointers = cupy.zeros(n, dtype=cupy.uint64)
        self.bound: tuple[int, ...] = ()  # the addresses in buffer_pointers
        self.origin = cupy.cuda.Stream(non_blocking=True)  # where a call starts and ends
        self.streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(n)]
        # Events made once and recorded again each call: the caller's queued work, origin's
        # before the launches, each rank's end (a capture records them too, making none).
        self.queued, self.ready = (cupy.cuda.Event(disable_timing=True) for _ in range(2))
        self.ended = [cupy.cuda.Event(disable_timing=True) for _ in range(n)]
        # and origin's before a call's launches and after its kernels, timed: what the call took on
        # the GPU, without the host's part (elapsed_s)
        self.began, self.finished = cupy.cuda.Event(), cupy.cuda.Event()
        self.timed = False  # whether the last call ended with both recorded
        self.replayer = Replayer(StreamGraphs(self.origin), limit=1, work="the ranks' kernel launches")
        self.call = 0
        self.counted = True  # False: a call's launches were cut short, the device's counts are behind

    def start(self, buffers: Sequence[int]) -> None:
        """Begin a call on the buffers at addresses ``buffers`` (one per rank): after the caller's
        queued work, with the device's call counts set to the host's where a call was cut short."""
        self.call += 1
        if not self.counted:  # once the kernels of the call cut short have ended (or given up)
            self.join()
            self.origin.synchronize()
            recount(self.words.reshape(-1, RANK_WORDS), self.call - 1)
        self.queued.record(self.cupy.cuda.get_current_stream())
        self.origin.wait_event(self.queued)
        if self.bound != tuple(buffers):
            self.buffer_pointers.set(np.array(buffers, dtype=np.uint64), stream=self.origin)
            self.bound = tuple(buffers)
        self.counted = False

    def launch(self, ranks: Sequence[int], timeout_s: float) -> None:
        """The kernels of ``ranks``, each on its rank's stream, after what ``origin`` holds."""
        self.ready.record(self.origin)
        pointers = (self.buffer_pointers, self.inbox_pointers, self.flag_pointers, self.words)
        for rank in ranks:
            args = kernel_args(
                self.program,
                rank,
                self.rows[rank],
                self.count,
                self.slot_size,
                pointers,
                timeout_s,
                self.system,
            )
            stream = self.streams[rank]
            stream.wait_event(self.ready)
            with stream:
                self.kernel((self.blocks,), (self.threads,), args)

    def join(self) -> None:
        """``origin`` waits for every rank's kernel."""
        for stream, ended in zip(self.streams, self.ended, strict=True):
            ended.record(stream)
            self.origin.wait_event(ended)

    def punctual(self) -> None:
        """Every rank's kernel at once, then the join: the work a graph replays."""
        self.launch(range(self.program.num_ranks), WAIT_TIMEOUT_S)
        self.join()

    def run(
        self, buffers: Sequence[int], straggler_delay: float, late_rank: int, graphs: bool
    ) -> list[Timeline]:
        """One call on the buffers at addresses ``buffers`` (one per rank): every rank's kernel,
        the late rank's ``straggler_delay`` s after the others; a punctual call from a CUDA graph
        after the first unless ``graphs`` is False."""
        self.start(buffers)
        self.timed = False
        self.began.record(self.origin)
        timeout = WAIT_TIMEOUT_S + straggler_delay
        # every kernel of the call has ended when the block is left: its blocks are free
        with RESIDENT.holding(self.device_id, self.blocks * len(buffers), self.resident, timeout):
            start = arrived = time.perf_counter()
            try:
                if straggler_delay == 0:
                    self.replayer.graphs = graphs
                    self.replayer("punctual", self.punctual)
                else:
                    self.launch([r for r in range(len(buffers)) if r != late_rank], timeout)
                    try:
                        arrived = sleep_until(start + straggler_delay)
                    finally:  # interrupted too: the call then ends at once, not at its timeout
                        self.launch([late_rank], timeout)
                    self.join()
            except BaseException:
                self.join()  # no kernel a call launched outlives it (a wait gives up within its timeout)
                self.origin.synchronize()
                raise
            self.counted = True
            self.finished.record(self.origin)
            self.origin.synchronize()
            self.timed = True
        done = time.perf_counter()
        failure = call_failure(self.program, self.words.get().reshape(-1, RANK_WORDS), self.call)
        if failure is not None:
            raise failure
        return [
            Timeline(r, start, arrived if r == late_rank else start, self.program.phase_ends(r, done), done)
            for r in range(len(buffers))
        ]

    def elapsed_s(self) -> float:
        """The last call's time on the GPU (s): from before its first launch to the end of its
        last rank's kernel, a late rank's delay included; the host's checks before and after it
        are not (a benchmark's measure of the kernels themselves).  A call cut short has none."""
        if not self.timed:
            raise RuntimeError("the last call on this state did not end: it has no time on the GPU")
        return float(self.cupy.cuda.get_elapsed_time(self.began, self.finished)) / 1e3


def call_failure(program: DeviceProgram, words: np.ndarray, call: int) -> RankError | None:
    """What went wrong in call number ``call``, from every rank's words (one row each,
    :data:`~stragglar.runtime.device.kernel_source.RANK_WORDS`), or None: a wait that timed out (see
    :func:`first_failure`), else a rank whose kernel did not count the call (the device's count
    and the host's part: a call of that rank's was cut short, or never ran)."""
    rows = words.tolist()  # Python integers at once: a call asks this every time
    failed = [rank for rank, row in enumerate(rows) if row[PROGRESS_WORDS] == call]
    if failed:
        absent = {rank: row[0] for rank, row in enumerate(rows) if row[0] != call and rank not in failed}
        return first_failure(program, words[:, PROGRESS_WORDS:], failed, absent)
    rank = next((rank for rank, row in enumerate(rows) if row[0] != call), None)
    if rank is None:
        return None
    ended = rows[rank][0]
    return RankError(
        f"allreduce failed: rank {rank}'s kernel ended call {ended}, not call {call}: "
        "it did not run this call to its end",
        rank=rank,
        reason="failed",
        during="running its kernel",
    )


def rank_error(program: DeviceProgram, rank: int, words: np.ndarray, also: Sequence[int] = ()) -> RankError:
    """The :class:`RankError` of rank ``rank``'s error words (the failed call, then row, round,
    peer, flag or a packet's slot, wanted, seen, block): a wait on the device that timed out;
    ``also``: the other ranks that timed out."""
    row, rnd, peer, flag, wanted, seen, block = (int(w) for w in words[1:ERROR_WORDS])
    phase, number = program.phase_round(rnd)
    what = failure_phrase("timed out", number, phase, peer)
    others = f" (ranks {list(also)} timed out too)" if also else ""
    rows = program.rows[rank]
    waited = (
        f"a packet of inbox slot {flag} marked {wanted}, saw mark {seen}"
        if 0 <= row < len(rows) and int(rows[row, 0]) in PACKETS
        else f"flag {flag} >= {wanted}, saw {seen}"
    )
    return RankError(
        f"allreduce failed: rank {rank} {what}: block {block} waited at row {row} for {waited}{others}",
        rank=rank,
        reason="timed out",
        round=number,
        phase=phase,
        peer=peer,
    )


def first_failure(
    program: DeviceProgram, words: np.ndarray, failed: Sequence[int], absent: Mapping[int, int]
) -> RankError:
    """The error to raise when ranks ``failed`` (``words``: every rank's error words): one whose
    peer did not fail itself (the rank that never came, not those that waited for others that
    waited for it).  Where every failed rank names another failed rank (the threads waiting on
    packets give up each on its own, so a rank may name a wait of a later row than its first
    stuck one, and the ranks then name each other in a ring), a rank whose kernel did not run
    the call (``absent``: each with the last call it ended) is the cause: named with the first
    failed rank that waits for it, at that rank's first wait for it.  Else the first."""
    root = next((r for r in failed if int(words[r, 3]) not in failed), None)
    if root is not None:
        return rank_error(program, root, words[root], [r for r in failed if r != root])
    for rank in failed:
        for missing, ended in absent.items():
            round_index = _first_wait_for(program, rank, missing)
            if round_index is None:
                continue
            phase, number = program.phase_round(round_index)
            what = failure_phrase("timed out", number, phase, missing)
            also = [r for r in failed if r != rank]
            return RankError(
                f"allreduce failed: rank {rank} {what}: rank {missing}'s kernel did not run this call "
                f"(it ended call {ended})" + (f" (ranks {also} timed out too)" if also else ""),
                rank=rank,
                reason="timed out",
                round=number,
                phase=phase,
                peer=missing,
            )
    return rank_error(program, failed[0], words[failed[0]], failed[1:])


def _first_wait_for(program: DeviceProgram, rank: int, peer: int) -> int | None:
    """The round of rank ``rank``'s first wait for rank ``peer`` (on a flag or on packets), if any."""
    rows = program.rows[rank]
    waits = rows[np.isin(rows[:, 0], (WAIT, COPY_PACKETS, REDUCE_PACKETS)) & (rows[:, 2] == peer)]
    return int(waits[0, 1]) if len(waits) else None


_loopbacks: OrderedDict[Hashable, DeviceLoopback] = OrderedDict()
CACHED = 4  # loopbacks kept: each holds inboxes about the size of the buffers


def device_loopback(
    cupy: Any,
    count: int,
    dtype: str,
    device_id: int,
    program: DeviceProgram,
    fingerprint: str,
    system: bool = False,
    tuning: Tuning = OWN_TUNING,
) -> DeviceLoopback:
    """The device state of ``program`` (the proved program of the schedule whose fingerprint is
    ``fingerprint``) for ``count``-element ``dtype`` buffers on device ``device_id``, made once and
    kept among the last few; ``system`` and ``tuning`` as :func:`run_device_loopback` takes them.
    A call on it holds its ``lock``."""
    key = (fingerprint, program.direct, program.packets, count, dtype, device_id, system, tuning)
    return cached(
        _loopbacks,
        key,
        lambda: DeviceLoopback(cupy, program, count, dtype, device_id, system, tuning),
        CACHED,
    )


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
    graphs: bool = True,
    system: bool = False,
    tuning: Tuning = OWN_TUNING,
) -> list[Timeline]:
    """AllReduce in place the ``count``-element ``dtype`` buffers at addresses ``buffers`` (one
    per rank, all on device ``device_id``) with ``program``, the proved program of the schedule
    whose fingerprint is ``fingerprint``; a call with nobody late replays from a CUDA graph after
    the first unless ``graphs`` is False.  Every rank is on one GPU, so the flags are released and
    acquired at the GPU's scope; ``system`` puts them at the system's, as ranks on several GPUs
    need (what that costs, measured on one: ``benchmarks/gpu_device.py``); ``tuning``: the
    kernel's blocks, threads, vectors and pause (the engine's own unless measuring others:
    ``benchmarks/gpu_tuning.py``).  It runs on device ``device_id``, whichever GPU the calling
    thread has current."""
    with cupy.cuda.Device(device_id):
        loopback = device_loopback(cupy, count, dtype, device_id, program, fingerprint, system, tuning)
        with loopback.lock:
            return loopback.run(buffers, straggler_delay, late_rank, graphs)
