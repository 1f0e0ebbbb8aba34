"""Buffers registered on a group: every rank's buffer opened in every peer's process, once.

A device program reaches a peer's buffer by pointer wherever the schedule's own messages order
the accesses (direct transfers; :mod:`~stragglar.runtime.device.lowering.direct`); everywhere else
a transfer is staged through the receiver's inbox, which costs a second copy.  Across processes a
peer's buffer is only reachable once its process has sent its IPC handle and this process has
opened it, and a call cannot gather handles without waiting for every rank, the late one
included: the hidden phase would be hidden no more.  So sharing is a step of its own, made
before the calls, as NCCL's user-buffer registration is: :func:`register` gathers every rank's
handle and offset once, opens the peers' ones (:data:`~stragglar.runtime.device.ipc.OPENINGS`)
and keeps the buffer alive, and a call on a registered buffer runs direct transfers.

A registration's *number* is the highest any rank proposes, each proposing one more than the
last number it knows on the group, so it is the same on every rank and new on every rank (even
after a registration some rank gave up before its gather, or where a rank whose registrations on
the group were all closed forgot the group and starts again from 1).  A call names its buffer's
number in its header (0: not registered), so ranks on different registrations, or one on a
registered buffer and one not, are refused like any other mismatch, never run as a wrong sum.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from stragglar.errors import InputError
from stragglar.runtime.arrays import DTYPES, Array, dtype_name
from stragglar.runtime.device.buffers import address_of
from stragglar.runtime.device.ipc import (
    HANDLE_BYTES,
    OPENINGS,
    allocation_base,
    handle_bytes,
    handle_words,
)
from stragglar.runtime.failures import error_line
from stragglar.runtime.header import MismatchError, ranks_in_words

__all__ = ["Registration", "register", "registered"]

Gather = Callable[[Sequence[int]], list[tuple[int, ...]]]  # every rank's integers, in rank order

_UNSHAREABLE, _TWICE = 1, 2  # why a rank cannot register (0: it can)
_WIDTH = HANDLE_BYTES // 8


class Registration:
    """A buffer registered on a group: open until :meth:`close` (also a context manager).

    What it is: ``owner`` (the group), ``number`` (the group's how-manieth registration, the same
    on every rank), ``key`` (this rank's buffer: address, element count, dtype, GPU).
    What a call uses: ``addresses``, every rank's buffer as this process reaches it, in rank
    order, and ``lock``, held by a call on it so that closing waits for the call.
    What it holds: the buffer itself (so that its memory is not reused while peers may write it),
    the peers' handles it opened, and ``states``, the device states of the calls on it (one per
    schedule: kept as long as the registration, not in the staged calls' few), let go on
    :meth:`close`.
    """

    def __init__(
        self,
        owner: Hashable,
        number: int,
        key: tuple[int, int, str, int],
        addresses: tuple[int, ...],
        buffer: Array,
        handles: tuple[bytes, ...],
        cupy: Any,
    ) -> None:
        self.owner, self.number, self.key = owner, number, key
        self.addresses = addresses
        self.lock = threading.Lock()
        self.buffer: Array | None = buffer
        self.handles, self.cupy = handles, cupy
        self.states: dict[tuple[str, bool], Any] = {}  # by schedule fingerprint, and packets or not

    @property
    def open(self) -> bool:
        return self.buffer is not None

    def holds(self, data: Array) -> bool:
        """Whether ``data`` (a 1-D buffer) is the buffer this open registration keeps: same address,
        element count, dtype and GPU.  A caller that registers a buffer it expects to keep (the
        DDP hook, a bucket's) asks before each call whether it moved."""
        return self.buffer is not None and _key(data) == self.key

    def close(self) -> None:
        """Let go of the peers' buffers and this one's; later calls on the buffer run staged.
        Close on every rank (a rank still registered meets its peers' unregistered calls with a
        MismatchError, or a timeout where its setup had not changed).  A call running on it ends
        first; one launched and not yet waited for (``async_op``) ends on the device first, and
        its wait still checks every rank's words."""
        with self.lock:
            if self.buffer is None:
                return
            with _lock:
                mine = _registry.get(self.owner, {})
                mine.pop(self.key, None)
                if not mine:  # nothing left on the group here: forget it (the group may be going)
                    _registry.pop(self.owner, None)
                    _numbers.pop(self.owner, None)
            self.buffer = None
            states, self.states = list(self.states.values()), {}
            if self.handles:  # on the buffer's GPU, whichever the closing thread has current
                with self.cupy.cuda.Device(self.key[3]):
                    for state in states:  # a call launched and not waited for ends first: it
                        state.stream.synchronize()  # reads the peers' buffers (its waits are bounded)
                    for handle in self.handles:
                        OPENINGS.close(self.cupy.cuda.runtime, handle)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self.open else "closed"
        return f"Registration(number={self.number}, count={self.key[1]}, dtype={self.key[2]!r}, {state})"


_registry: dict[Hashable, dict[tuple[int, int, str, int], Registration]] = {}
_numbers: dict[Hashable, int] = {}
_lock = threading.Lock()


def _key(flat: Array) -> tuple[int, int, str, int]:
    address, device = address_of(flat)
    return address, int(flat.shape[0]), dtype_name(flat), device


def registered(owner: Hashable, flat: Array) -> Registration | None:
    """The open registration of exactly ``flat`` (address, element count, dtype) on ``owner``."""
    return _registry.get(owner, {}).get(_key(flat))


def register(
    cupy: Any, owner: Hashable, rank: int, flat: Array | None, gather: Gather, refusal: str | None = None
) -> Registration:
    """Register this rank's 1-D device buffer ``flat`` on the group ``owner``; every rank of the
    group calls it, in the same order, and every rank raises an error if any cannot (this rank's
    ``refusal``, with ``flat`` None: why its buffer cannot be registered at all).  The buffer's
    GPU is made current meanwhile, whichever the calling thread has: a peer's buffer opens there."""
    on_gpu = contextlib.nullcontext() if flat is None else cupy.cuda.Device(address_of(flat)[1])
    with on_gpu:
        return _register(cupy, owner, rank, flat, gather, refusal)


def _register(
    cupy: Any, owner: Hashable, rank: int, flat: Array | None, gather: Gather, refusal: str | None
) -> Registration:
    runtime = cupy.cuda.runtime
    key = (0, 0, "", 0) if flat is None else _key(flat)
    with _lock:
        proposed = _numbers.get(owner, 0) + 1
        twice = key in _registry.get(owner, {})
    problem, reason, offset, handle = 0, "", 0, bytes(HANDLE_BYTES)
    if flat is None:
        problem, reason = _UNSHAREABLE, refusal or "no buffer"
    elif twice:
        problem, reason = _TWICE, "this buffer is already registered on this group"
    else:
        try:
            base = allocation_base(key[0])
            handle, offset = bytes(runtime.ipcGetMemHandle(base)), key[0] - base
        except Exception as e:  # any refusal (an expandable segment, a stream-ordered pool) is said
            problem, reason = (
                _UNSHAREABLE,
                f"its memory cannot be shared over CUDA IPC ({error_line(e)})",
            )
    dtype = DTYPES.index(key[2]) if key[2] in DTYPES else -1
    gathered = gather([proposed, problem, dtype, key[1], offset, *handle_words(handle)])
    number = max(words[0] for words in gathered)
    with _lock:
        _numbers[owner] = max(_numbers.get(owner, 0), number)
    if problem:
        raise InputError(f"cannot register rank {rank}'s buffer: {reason}")
    _agree(gathered)
    assert flat is not None  # a rank without a buffer has a problem
    addresses, handles, failure = _open_peers(runtime, rank, key[0], gathered)
    # a second gather, so that a rank that could not open a peer's buffer (no peer access between
    # the GPUs) leaves no rank registered
    failed = [r for r, (code,) in enumerate(gather([int(failure is not None)])) if code]
    if failed:
        for handle in handles:
            OPENINGS.close(runtime, handle)
        if failure is not None:
            raise InputError(f"cannot register rank {rank}'s buffer: {failure}")
        raise InputError(
            f"cannot register the buffers: {ranks_in_words(failed)} could not open a peer's buffer "
            "(the error there says why)"
        )
    registration = Registration(owner, number, key, tuple(addresses), flat, tuple(handles), cupy)
    with _lock:
        _registry.setdefault(owner, {})[key] = registration
    return registration


def _open_peers(
    runtime: Any, rank: int, own: int, gathered: Sequence[Sequence[int]]
) -> tuple[list[int], list[bytes], str | None]:
    """(every rank's buffer as this process reaches it, the peers' handles opened, why a peer's
    could not be opened or None); on a failure what was opened is let go and no address is given."""
    addresses: list[int] = []
    handles: list[bytes] = []
    for peer, words in enumerate(gathered):
        if peer == rank:
            addresses.append(own)
            continue
        handle = handle_bytes(words[5 : 5 + _WIDTH])
        try:
            addresses.append(OPENINGS.open(runtime, handle) + words[4])
        except Exception as e:  # any refusal is said in one line
            for opened in handles:
                OPENINGS.close(runtime, opened)
            return (
                [],
                [],
                f"cannot open rank {peer}'s buffer over CUDA IPC ({error_line(e)})",
            )
        handles.append(handle)
    return addresses, handles, None


def _agree(gathered: Sequence[Sequence[int]]) -> None:
    """Raise the same error on every rank unless every rank could register, with the same dtype
    and element count."""
    troubled = [r for r, words in enumerate(gathered) if words[1]]
    if troubled:
        raise InputError(
            f"cannot register the buffers: {ranks_in_words(troubled)} could not (the error there says why)"
        )
    for what, at, shown in (
        ("dtype", 2, lambda v: DTYPES[v]),
        ("element count", 3, str),
    ):
        values = [words[at] for words in gathered]
        if len(set(values)) > 1:
            parts = [
                f"{ranks_in_words([r for r, v in enumerate(values) if v == value])} {shown(value)}"
                for value in dict.fromkeys(values)
            ]
            raise MismatchError(f"ranks disagree on the registration: {what}: {', '.join(parts)}")
