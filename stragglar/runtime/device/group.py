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
which knows every rank's buffer and so runs direct transfers (where its chunks do not move as
packets, which go through the inboxes), kept by the registration as long
as it is open (a loop over many registered buffers does not make states anew each call); its
end-of-call gather is also what keeps a peer from writing this rank's buffer once its call has
returned.

A call comes in two halves (:class:`DeviceCall`): the launch, and the wait with its gather
(:class:`DeviceWork`).  A caller may launch calls on several buffers before it waits for the
first (``async_op``), so that each one's hidden phase runs while the late rank is away; a state
is its call's until that call's gather, so a second launch on it before then is refused.  A
launch holds its kernel's blocks on the GPU until the kernel ends
(:mod:`~stragglar.runtime.device.residency`): one that would not fit beside the kernels still
running waits for them, so that every kernel launched can be resident whole.

The states are kept per group and channel, so that the ranks make and drop them together, and a
call that failed before every rank's words leaves its state broken, never used nor freed again
(:mod:`~stragglar.runtime.device.states`); a dropped state closes the peers' memory it opened and
frees its own, once its last kernel has ended.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np

from stragglar.errors import InputError
from stragglar.runtime.clock import Timeline
from stragglar.runtime.device.ipc import HANDLE_BYTES, handle_bytes, handle_words
from stragglar.runtime.device.kernel import (
    OWN_TUNING,
    RANK_WORDS,
    compile_kernel,
    kernel_args,
    slot_size,
)
from stragglar.runtime.device.loopback import blocks_for, call_failure, resident_blocks
from stragglar.runtime.device.residency import RESIDENT, Held
from stragglar.runtime.device.shared import Registration
from stragglar.runtime.device.states import (
    CACHED,
    States,
    broken_buffer,
    broken_error,
    keep_broken,
)
from stragglar.runtime.device.table import DeviceProgram
from stragglar.runtime.failures import RankError, error_line
from stragglar.runtime.kernels import SUMS
from stragglar.runtime.plans import cached

__all__ = ["DeviceCall", "DeviceRank", "DeviceWork", "Gather", "Launched"]

Gather = Callable[[Sequence[int]], list[tuple[int, ...]]]  # every rank's integers, in rank order
_T = TypeVar("_T")


class DeviceRank:
    """One rank's device state on a group: its program's rows, its inbox, flags and words,
    its peers' inboxes and flags opened from their handles, every rank's buffer where the buffer
    is registered (``addresses``; None: only this rank's, known per call; ``registered``: the
    buffer itself, kept with the state if it is ever broken), and the number of its last
    call."""

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
        registered: Any = None,
    ) -> None:
        if program.direct and addresses is None:
            raise ValueError("a device program with direct rows needs its peers' buffers: lower it staged")
        self.cupy, self.program, self.rank, self.count = cupy, program, rank, count
        self.lock = threading.Lock()
        self.kernel = compile_kernel(cupy, dtype)  # the engine's own tuning
        properties = cupy.cuda.runtime.getDeviceProperties(device_id)
        self.threads = OWN_TUNING.threads
        resident = resident_blocks(
            properties, self.kernel.num_regs, self.kernel.shared_size_bytes, self.threads
        )
        mine = blocks_for(program, count, dtype, resident, OWN_TUNING)
        self.device_id, self.resident = device_id, resident
        self.holding = Held(Fraction(0))  # the last call's share of the GPU (residency.py)
        self.slot_size = slot_size(count, program.num_chunks, dtype, program.packets)
        self.rows = cupy.asarray(np.ascontiguousarray(program.rows[rank]))
        runtime = cupy.cuda.runtime
        # Inbox and flags come straight from cudaMalloc, not CuPy's pool: a handle names a whole
        # allocation, and a peer opening it gets the allocation's start, which a pooled array's
        # address need not be.
        itemsize = np.dtype(SUMS[dtype][1]).itemsize
        inbox_bytes = max(program.inbox_slots[rank] * self.slot_size, 1) * itemsize
        inbox = _allocation(runtime, inbox_bytes)
        flag_bytes = program.flags * mine * 8
        flags = _allocation(runtime, flag_bytes)
        opened: list[int] = []  # the peers' memory this rank opens, closed when the state goes
        self.stream = cupy.cuda.Stream(non_blocking=True)
        # zeroed on the state's own stream, and done before the handles below go out: a peer's
        # kernel may signal into these flags (or write packets into this inbox) from then on, and a
        # zeroing still queued would wipe its signal (the wait then times out); the wait is this
        # stream's alone, not the device's, where the rank's earlier kernels may spin until the
        # late rank comes.  The inbox too: a slot of packets must hold no mark before its first write.
        runtime.memsetAsync(flags, 0, flag_bytes, self.stream.ptr)
        runtime.memsetAsync(inbox, 0, inbox_bytes, self.stream.ptr)
        self.stream.synchronize()
        weakref.finalize(self, _release, cupy, device_id, self.stream, opened, (inbox, flags))
        self.words = cupy.zeros(program.num_ranks * RANK_WORDS, dtype=cupy.uint64)  # this rank's row only
        own = [
            mine,
            *handle_words(runtime.ipcGetMemHandle(inbox)),
            *handle_words(runtime.ipcGetMemHandle(flags)),
        ]
        width = HANDLE_BYTES // 8
        try:
            gathered = _rows(gather(own), 1 + 2 * width, rank, "its device state's handles")
        except BaseException as e:  # a peer that had the handles may write this memory: kept
            keep_broken(self, None, error_line(e))
            raise
        self.blocks = min(words[0] for words in gathered)
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
        self.buffer_pointers: tuple[int, Any] = (0, None)  # the last buffer, and the kernel's array of it
        if addresses is not None:
            self.buffer_pointers = (addresses[rank], cupy.asarray(np.array(addresses, dtype=np.uint64)))
        self.call = 0
        self.in_flight: Launched | None = None  # a call launched and not yet finished
        self.registered = registered
        self.broken: str | None = None  # why a call on it broke it; then none runs on it

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
        """One call on the buffer at address ``buffer``: :meth:`launch`, then :meth:`finish`."""
        return self.finish(self.launch(buffer, straggler_delay, late_rank, timeout_s), gather)

    def launch(self, buffer: int, straggler_delay: float, late_rank: int, timeout_s: float) -> Launched:
        """Launch this rank's kernel of the next call on the buffer at address ``buffer`` (after
        ``straggler_delay`` s if it is the late rank; each of its waits bounded by ``timeout_s``),
        without waiting for it.  Refused while this state's last call is launched and not yet
        finished (its inbox and flags are that call's until every rank's words say it ended), and
        on a broken state.  A launch cut short breaks the state: the peers' kernels of the
        call wait for this rank's signals, and write into its inbox, until their waits give up."""
        if self.broken is not None:
            raise broken_error(self.rank, self.broken)
        if self.in_flight is not None:
            raise InputError(
                "a device call with this setup (group, schedule, element count and dtype, or its "
                "registered buffer) was launched and not waited for: wait() for it first (each "
                "registered buffer has a setup of its own)"
            )
        self.call += 1
        try:
            launched = self._launched(buffer, straggler_delay, late_rank, timeout_s)
        except BaseException as e:
            self.breaks(error_line(e))
            raise
        self.in_flight = launched
        return launched

    def _launched(self, buffer: int, straggler_delay: float, late_rank: int, timeout_s: float) -> Launched:
        start = time.perf_counter()
        if self.rank == late_rank and straggler_delay > 0:
            time.sleep(straggler_delay)
        arrived = time.perf_counter()
        # the buffers' array first: a new one is copied on the current stream, which the kernel's
        # stream then waits for (after the event, the kernel could read it before it lands)
        pointers = (self._own_buffer(buffer), self.inbox_pointers, self.flag_pointers, self.words)
        self.stream.wait_event(self.cupy.cuda.get_current_stream().record())
        args = kernel_args(  # a peer may be on another GPU: flags at the system's scope
            self.program, self.rank, self.rows, self.count, self.slot_size, pointers, timeout_s, True
        )
        held = self.holding = RESIDENT.hold(self.device_id, self.blocks, self.resident, timeout_s, self.rank)
        try:
            with self.stream:
                self.kernel((self.blocks,), (self.threads,), args)
            ended = self.cupy.cuda.Event(disable_timing=True)
            ended.record(self.stream)
        except BaseException:
            RESIDENT.release(self.device_id, held)
            raise
        held.ended = lambda: bool(ended.done)  # the blocks are free once the kernel has ended
        return Launched(self.call, start, arrived)

    def finish(self, launched: Launched, gather: Gather) -> Timeline:
        """Wait for the ``launched`` call's kernel, then gather every rank's words: every rank
        raises the same error if a wait timed out anywhere, or a rank's kernel did not count the
        call.  The gather is also what keeps a rank from launching its next call on this state
        while a peer still reads this call's inbox slots, so the state is free only after it; a
        wait that does not reach every rank's words (anything raised here, an interrupt too)
        breaks the state."""
        if self.in_flight is not launched:
            raise InputError("this device call was waited for already")
        try:
            try:
                self.stream.synchronize()
            finally:  # the kernel has ended (each of its waits is bounded): its blocks are free
                RESIDENT.release(self.device_id, self.holding)
            done = time.perf_counter()
            own = self.words.get().reshape(-1, RANK_WORDS)[self.rank]
            gathered = _rows(gather([int(w) for w in own]), RANK_WORDS, self.rank, "its call's words")
        except BaseException as e:
            self.breaks(error_line(e))
            raise
        finally:
            self.in_flight = None
        failure = call_failure(self.program, np.array(gathered, dtype=np.uint64), launched.call)
        if failure is not None:
            raise failure
        return Timeline(
            self.rank, launched.start, launched.arrived, self.program.phase_ends(self.rank, done), done
        )

    def breaks(self, why: str) -> None:
        """The state is broken (``why``: what failed): no call runs on it, nor on its registered
        buffer, again, and both are kept while the process lives (:mod:`~.states`)."""
        if self.broken is None:
            self.broken = why
            registered = None if self.registered is None else (self.device_id, self.buffer_pointers[0])
            keep_broken(self, registered, why)


def _rows(gathered: list[tuple[int, ...]], width: int, rank: int, what: str) -> list[tuple[int, ...]]:
    """``gathered``, where every rank sent ``width`` integers; else a peer is in another call (its
    states differ from this rank's), and every rank of this call fails."""
    odd = [peer for peer, row in enumerate(gathered) if len(row) != width]
    if odd:
        raise RankError(
            f"allreduce failed: rank {rank} gathered {what}, and rank {odd[0]} answered with "
            f"{len(gathered[odd[0]])} integers where {width} were due: it is in another call",
            rank=rank,
            peer=odd[0],
            during=f"gathering {what}",
        )
    return gathered


@dataclass(frozen=True)
class Launched:
    """A call whose kernel :meth:`DeviceRank.launch` launched: its number (the device counts it
    too), when it began and when this rank arrived (after a late rank's delay)."""

    call: int
    start: float
    arrived: float


def _allocation(runtime: Any, nbytes: int) -> int:
    return int(runtime.malloc(nbytes))


def _release(cupy: Any, device_id: int, stream: Any, opened: Sequence[int], own: Sequence[int]) -> None:
    """Close the peers' memory this rank opened, then free its own, on its GPU (a state may go in
    any thread, whichever GPU that thread has current), once its last kernel has ended (a call
    launched and never waited for; each of its waits is bounded)."""
    runtime = cupy.cuda.runtime
    with cupy.cuda.Device(device_id):
        stream.synchronize()
        for pointer in opened:
            runtime.ipcCloseMemHandle(pointer)
        for pointer in own:
            runtime.free(pointer)


@dataclass(frozen=True)
class DeviceCall:
    """One rank's call on a group: AllReduce this rank's ``count``-element ``dtype`` buffer at
    address ``buffer`` on GPU ``device_id`` over a channel of a group whose states are ``states``
    (:func:`~stragglar.runtime.device.states.states_for`; ``gather``: its all-gather of integers,
    which makes the state's IPC handles known) with ``program`` (whose schedule's
    fingerprint is ``fingerprint``); a device wait gives up after ``timeout_s`` (which includes the
    late rank's delay).  ``registration``: the buffer's on the group, whose peers' buffers a
    direct ``program`` reaches (None: ``program`` is staged).  It runs on the buffer's GPU,
    whichever GPU the calling thread has current."""

    cupy: Any
    states: States
    program: DeviceProgram
    fingerprint: str
    rank: int
    buffer: int
    count: int
    dtype: str
    device_id: int
    straggler_delay: float
    late_rank: int
    timeout_s: float
    gather: Gather
    registration: Registration | None = None

    def run(self) -> Timeline:
        """The whole call: launched, waited for, every rank's words gathered over ``gather``."""
        return self._on_state(
            lambda state: state.run(
                self.buffer, self.straggler_delay, self.late_rank, self.timeout_s, self.gather
            )
        )

    def launch(self, gather_on: Callable[[Any], Gather]) -> DeviceWork:
        """The call launched: :meth:`DeviceWork.wait` finishes it, gathering over
        ``gather_on(group)``."""
        return self._on_state(
            lambda state: DeviceWork(
                self.cupy,
                self.device_id,
                state,
                state.launch(self.buffer, self.straggler_delay, self.late_rank, self.timeout_s),
                gather_on,
            )
        )

    def _on_state(self, act: Callable[[DeviceRank], _T]) -> _T:
        """``act`` on the call's state, made on first use, under its lock (and the registration's:
        closing it waits for the call), with the buffer's GPU current."""
        registration = self.registration
        with self.cupy.cuda.Device(self.device_id):
            if registration is None:
                refusal = self.refusal()
                if refusal is not None:
                    raise refusal
                key = self._key()
                state = cached(self.states, key, lambda: self._made(None), CACHED)
                with state.lock:
                    return act(state)
            with registration.lock:  # the group, rank, buffer, count, dtype and GPU are its own
                if not registration.open:
                    raise InputError("the buffer's registration was closed as its call began")
                refusal = self.refusal()
                if refusal is not None:  # a peer may write the buffer itself
                    raise refusal
                held = (self.fingerprint, self.program.packets)
                if held not in registration.states:
                    registration.states[held] = self._made(registration.addresses, registration.buffer)
                direct: DeviceRank = registration.states[held]
                with direct.lock:
                    return act(direct)

    def refusal(self) -> RankError | None:
        """The refusal this call meets where its state (on a registration: any of the
        registration's), or its buffer, is broken, or None.  A caller raises it before its peers
        are asked anything (a group with a collective that failed may not answer them), as the
        launch would."""
        registration = self.registration
        if registration is not None:
            states = list(registration.states.values())  # a snapshot: no lock held
        else:
            state = self.states.get(self._key())
            states = [] if state is None else [state]
        why = next((state.broken for state in states if state.broken is not None), None)
        why = why or broken_buffer(self.device_id, self.buffer)
        return None if why is None else broken_error(self.rank, why)

    def _key(self) -> Hashable:
        """The state's key among the group's: its program's (a schedule moves packets or not), this
        rank's, and its buffers' (count, dtype, GPU)."""
        return self.fingerprint, self.program.packets, self.rank, self.count, self.dtype, self.device_id

    def _made(self, addresses: Sequence[int] | None, registered: Any = None) -> DeviceRank:
        return DeviceRank(
            self.cupy,
            self.program,
            self.rank,
            self.count,
            self.dtype,
            self.device_id,
            self.gather,
            addresses,
            registered,
        )


def _abandoned(state: DeviceRank, launched: Launched) -> None:
    """A work dropped without its wait: its call never reached every rank's words."""
    if state.in_flight is launched:
        state.in_flight = None
        state.breaks("a device call launched and never waited for")


class DeviceWork:
    """A device call launched and not yet waited for: what ``allreduce(..., engine="device",
    async_op=True)`` returns.  Its buffer holds the sum once :meth:`wait` has returned.

    :meth:`wait` is a collective: every rank waits for every work it launched, in the same order.
    Until then the call's state (its inbox and flags) is the call's, so a call launched on the
    same buffer and setup before the wait is refused; a work dropped without its wait breaks the
    state (:mod:`~stragglar.runtime.device.states`).
    """

    def __init__(
        self,
        cupy: Any,
        device_id: int,
        state: DeviceRank,
        launched: Launched,
        gather_on: Callable[[Any], Gather],
    ) -> None:
        self._cupy, self._device_id, self._state, self._launched = cupy, device_id, state, launched
        self._gather_on = gather_on
        weakref.finalize(self, _abandoned, state, launched)  # dropped unwaited: the state breaks

    def wait(self, group: Any = None) -> Timeline:
        """Wait for this rank's kernel, then all-gather every rank's words over ``group`` (None:
        the call's own; or another group of the same ranks in the same order, for a caller that
        makes other calls on the call's group meanwhile, from another thread): every rank raises
        the same :class:`~stragglar.runtime.RankError` where a wait timed out anywhere.  Returns
        this rank's timeline.  Once only."""
        gather = self._gather_on(group)
        with self._cupy.cuda.Device(self._device_id), self._state.lock:
            return self._state.finish(self._launched, gather)
