"""A peer process's memory in this one: CUDA IPC handles, what they name, and their opening.

A handle names a whole ``cudaMalloc`` allocation, and opening it gives the allocation's start in
this process, so a buffer inside an allocation (a torch tensor from the caching allocator, a CuPy
array from its pool) travels as its allocation's handle and its offset in it
(:func:`allocation_base`: the driver's ``cuMemGetAddressRange``, which neither CuPy nor torch
offers for any pointer).

Two shared buffers of a peer may live in one of its allocations, and so have one handle.  CUDA
does not promise that a handle opens twice in one process, so :class:`Openings` opens each handle
once and counts its users: the last one to let go closes it.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from stragglar.errors import InputError

__all__ = ["HANDLE_BYTES", "OPENINGS", "Openings", "allocation_base", "handle_bytes", "handle_words"]

HANDLE_BYTES = 64  # a CUDA IPC memory handle


def handle_words(handle: bytes) -> list[int]:
    """An IPC handle as signed 64-bit integers (what a gather of integers carries)."""
    return [int(w) for w in np.frombuffer(handle, dtype=np.int64)]


def handle_bytes(words: Sequence[int]) -> bytes:
    return np.array(words, dtype=np.int64).tobytes()


@functools.cache
def _driver() -> Any:
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise InputError(
            "cannot load the CUDA driver (libcuda.so.1) to share a buffer over CUDA IPC"
        ) from None
    entry = driver.cuMemGetAddressRange_v2
    entry.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
    entry.restype = ctypes.c_int
    return entry


def allocation_base(address: int) -> int:
    """The start of the device allocation that holds ``address`` (in the current CUDA context)."""
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    status = _driver()(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(address))
    if status != 0:
        raise InputError(f"the CUDA driver knows no allocation at {address:#x} (CUresult {status})")
    return int(base.value)


class Openings:
    """This process's openings of peers' handles: each handle opened once, closed with its last user."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.opened: dict[bytes, tuple[int, int]] = {}  # handle -> (address here, users)

    def open(self, runtime: Any, handle: bytes) -> int:
        """The address here of the allocation ``handle`` names, opened on first use."""
        with self.lock:
            address, users = self.opened.get(handle, (0, 0))
            if not users:
                address = int(runtime.ipcOpenMemHandle(handle))
            self.opened[handle] = (address, users + 1)
            return address

    def close(self, runtime: Any, handle: bytes) -> None:
        """One user of ``handle`` lets go; the last one closes it."""
        with self.lock:
            address, users = self.opened.pop(handle)
            if users > 1:
                self.opened[handle] = (address, users - 1)
            else:
                runtime.ipcCloseMemHandle(address)


OPENINGS = Openings()
