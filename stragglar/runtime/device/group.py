"""Ranks in processes of their own: each runs its device program as one kernel launch, reaching
its peers' inboxes and flags through CUDA IPC handles exchanged once over the group.

A rank allocates its inbox, its flags and its words (its call count and error words), and
all-gathers, once per (group, schedule, element count, dtype), the IPC handles of its inbox and
flags with the number of blocks its device holds for every rank at once; every rank then opens
its peers' handles (cached with the rest) and launches with the fewest blocks any rank offered
(the flags are per block, so the ranks must agree).  A call launches this rank's kernel (the
late rank after its delay), waits for it, then all-gathers every rank's words: that gather is
also what keeps a rank from starting its next call while a peer still reads this call's inbox
slots, and what lets every rank raise the same :class:`~stragglar.runtime.failures.RankError`
(the one whose peer did not fail itself, or the rank whose kernel did not count the call).  A
dead peer process leaves the others' waits to time out on the device, then their gather to
fail.  Several ranks may share a GPU: their kernels then time-slice (correct, not fast).

A call on a registered buffer (:mod:`~stragglar.runtime.device.shared`) has a state of its own,
which knows every rank's buffer and so runs direct transfers, kept by the registration as long
as it is open (a loop over many registered buffers does not make states anew each call); its
end-of-call gather is also what keeps a peer from writing this rank's buffer once its call has
returned.

Every rank of a group makes the same calls (the header check sees to it), so the ranks make and
drop their states together, least recently used first; a dropped state closes the peers' memory
it opened and frees its own.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from stragglar.errors import InputError
from stragglar.runtime.clock import Timeline
from stragglar.runtime.device.ipc import HANDLE_BYTES, handle_bytes, handle_words
from stragglar.runtime.device.kernel import (
    OWN_TUNING,
    RANK_WORDS,
    SOURCE,
    THREADS,
    kernel_args,
    kernel_name,
    recount,
    slot_size,
)
from stragglar.runtime.device.loopback import blocks_for, call_failure, resident_blocks
from stragglar.runtime.device.shared import Registration
from stragglar.runtime.device.table import DeviceProgram
from stragglar.runtime.kernels import SUMS
from stragglar.runtime.plans import cached

__all__ = ["DeviceRank", "Gather", "run_device_rank"]

Gather = Callable[[Sequence[int]], list[tuple[int, ...]]]  # every rank's integers, in rank order


class DeviceRank:
    """One rank's device state on a group: its program's rows, its inbox, flags and words,
    its peers' inboxes and flags opened from their handles, every rank's buffer where the buffer
    is registered (``addresses``; None: only this rank's, known per call), and the number of its
    last call."""

    def __init__(
        self,
        cupy: Any,
        program: DeviceProgram,
        rank: int,
        count: int,
        dtype: str,
        device_id: int,
        gather: Gather,
        addresses: Sequence[int] | None = None,
    ) -> None:
        if program.direct and addresses is None:
            raise ValueError("a device program with direct rows needs its peers' buffers: lower it staged")
        self.cupy, self.program, self.rank, self.count = cupy, program, rank, count
        self.lock = threading.Lock()
        name = kernel_name(dtype)
        self.kernel = cupy.RawModule(
            code=SOURCE, options=("--std=c++14",), name_expressions=[name]
        ).get_function(name)
        properties = cupy.cuda.runtime.getDeviceProperties(device_id)
        resident = resident_blocks(properties, self.kernel.num_regs, self.kernel.shared_size_bytes, THREADS)
        mine = blocks_for(program, count, resident, OWN_TUNING.max_blocks)  # the engine's own tuning
        self.slot_size = slot_size(count, program.num_chunks, dtype)
        self.rows = cupy.asarray(np.ascontiguousarray(program.rows[rank]))
        runtime = cupy.cuda.runtime
        # Inbox and flags come straight from cudaMalloc, not CuPy's pool: a handle names a whole
        # allocation, and a peer opening it gets the allocation's start, which a pooled array's
        # address need not be.
        itemsize = np.dtype(SUMS[dtype][1]).itemsize
        inbox = _allocation(runtime, max(program.inbox_slots[rank] * self.slot_size, 1) * itemsize)
        flag_bytes = program.flags * mine * 8
        flags = _allocation(runtime, flag_bytes)
        runtime.memset(flags, 0, flag_bytes)
        opened: list[int] = []  # the peers' memory this rank opens, closed when the state goes
        weakref.finalize(self, _release, cupy, device_id, opened, (inbox, flags))
        self.words = cupy.zeros(program.num_ranks * RANK_WORDS, dtype=cupy.uint64)  # this rank's row only
        own = [
            mine,
            *handle_words(runtime.ipcGetMemHandle(inbox)),
            *handle_words(runtime.ipcGetMemHandle(flags)),
        ]
        gathered = gather(own)
        self.blocks = min(words[0] for words in gathered)
        width = HANDLE_BYTES // 8
        inboxes, flag_arrays = [], []
        for peer, words in enumerate(gathered):
            if peer == rank:
                inboxes.append(inbox)
                flag_arrays.append(flags)
                continue
            for handle, into in (
                (words[1 : 1 + width], inboxes),
                (words[1 + width : 1 + 2 * width], flag_arrays),
            ):
                into.append(int(runtime.ipcOpenMemHandle(handle_bytes(handle))))
                opened.append(into[-1])
        self.inbox_pointers = cupy.asarray(np.array(inboxes, dtype=np.uint64))
        self.flag_pointers = cupy.asarray(np.array(flag_arrays, dtype=np.uint64))
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.buffer_pointers: tuple[int, Any] = (0, None)  # the last buffer, and the kernel's array of it
        if addresses is not None:
            self.buffer_pointers = (addresses[rank], cupy.asarray(np.array(addresses, dtype=np.uint64)))
        self.call = 0
        self.counted = True  # False: a call's launch was cut short, the device's count is behind

    def _own_buffer(self, buffer: int) -> Any:
        """Every rank's buffer address as the kernel takes them: a registered buffer's, else this
        rank's own and 0 for its peers (their buffers are not opened here, so the program has no
        direct rows)."""
        if self.buffer_pointers[0] != buffer:
            if self.program.direct:
                raise ValueError("a registered buffer's state runs on that buffer only")
            addresses = np.zeros(self.program.num_ranks, dtype=np.uint64)
            addresses[self.rank] = buffer
            self.buffer_pointers = (buffer, self.cupy.asarray(addresses))
        return self.buffer_pointers[1]

    def run(
        self, buffer: int, straggler_delay: float, late_rank: int, timeout_s: float, gather: Gather
    ) -> Timeline:
        """One call on the buffer at address ``buffer``: this rank's kernel (after
        ``straggler_delay`` s if it is the late rank; each of its waits bounded by ``timeout_s``),
        then every rank's words gathered: every rank raises the same error if a wait timed out
        anywhere, or a rank's kernel did not count the call."""
        self.call += 1
        if not self.counted:  # the device's count as the host's (and every peer's), once the
            self.stream.synchronize()  # kernel of the call cut short has ended (or given up)
            recount(self.words.reshape(-1, RANK_WORDS)[self.rank], self.call - 1)
        self.counted = False
        start = time.perf_counter()
        if self.rank == late_rank and straggler_delay > 0:
            time.sleep(straggler_delay)
        arrived = time.perf_counter()
        self.stream.wait_event(self.cupy.cuda.get_current_stream().record())
        pointers = (self._own_buffer(buffer), self.inbox_pointers, self.flag_pointers, self.words)
        args = kernel_args(  # a peer may be on another GPU: flags at the system's scope
            self.program, self.rank, self.rows, self.count, self.slot_size, pointers, timeout_s, True
        )
        with self.stream:
            self.kernel((self.blocks,), (THREADS,), args)
        self.counted = True
        self.stream.synchronize()
        done = time.perf_counter()
        own = self.words.get().reshape(-1, RANK_WORDS)[self.rank]
        failure = call_failure(
            self.program, np.array(gather([int(w) for w in own]), dtype=np.uint64), self.call
        )
        if failure is not None:
            raise failure
        return Timeline(self.rank, start, arrived, self.program.phase_ends(self.rank, done), done)


def _allocation(runtime: Any, nbytes: int) -> int:
    return int(runtime.malloc(nbytes))


def _release(cupy: Any, device_id: int, opened: Sequence[int], own: Sequence[int]) -> None:
    """Close the peers' memory this rank opened, then free its own, on its GPU (a state may go in
    any thread, whichever GPU that thread has current)."""
    runtime = cupy.cuda.runtime
    with cupy.cuda.Device(device_id):
        for pointer in opened:
            runtime.ipcCloseMemHandle(pointer)
        for pointer in own:
            runtime.free(pointer)


_ranks: OrderedDict[Hashable, DeviceRank] = OrderedDict()
CACHED = 4  # kept per process: each holds an inbox about the size of the buffer


def run_device_rank(
    cupy: Any,
    owner: Hashable,
    program: DeviceProgram,
    fingerprint: str,
    rank: int,
    buffer: int,
    count: int,
    dtype: str,
    device_id: int,
    straggler_delay: float,
    late_rank: int,
    timeout_s: float,
    gather: Gather,
    registration: Registration | None = None,
) -> Timeline:
    """AllReduce this rank's ``count``-element ``dtype`` buffer at address ``buffer`` over the
    group ``owner`` (``gather``: its all-gather of integers) with ``program``; a device wait gives
    up after ``timeout_s`` (which includes the late rank's delay).  ``registration``: the buffer's
    on the group, whose peers' buffers a direct ``program`` reaches (None: ``program`` is staged)."""
    if registration is None:
        key = (owner, fingerprint, rank, count, dtype, device_id)
        state = cached(
            _ranks, key, lambda: DeviceRank(cupy, program, rank, count, dtype, device_id, gather), CACHED
        )
        with state.lock:
            return state.run(buffer, straggler_delay, late_rank, timeout_s, gather)
    with registration.lock:  # the group, rank, buffer, count, dtype and GPU are the registration's
        if not registration.open:
            raise InputError("the buffer's registration was closed as its call began")
        if fingerprint not in registration.states:
            made = DeviceRank(cupy, program, rank, count, dtype, device_id, gather, registration.addresses)
            registration.states[fingerprint] = made
        direct: DeviceRank = registration.states[fingerprint]
        with direct.lock:
            return direct.run(buffer, straggler_delay, late_rank, timeout_s, gather)
