"""Which engine a call runs on (:data:`ENGINES`), and what the device engine asks of a buffer, the
same in one process and across processes: its address and GPU (a CuPy array, or a torch CUDA
tensor: bfloat16 included, which CuPy lacks), the caller's queued work on it done first, and CuPy
to launch the kernels."""

from __future__ import annotations

import sys
from typing import Any

from stragglar.errors import InputError, described
from stragglar.runtime.arrays import Array, library_of

__all__ = ["ENGINES", "address_of", "check_device_buffer", "launcher", "on_device", "queued_work_done"]

ENGINES = ("rounds", "device")  # the rounds driven from the host; each rank's whole part in one kernel


def on_device(engine: Any) -> bool:
    """Whether ``engine`` (one of :data:`ENGINES`) is the device engine."""
    if engine not in ENGINES:
        raise InputError(f"unknown engine {described(engine)} (choose from {', '.join(ENGINES)})")
    return bool(engine == "device")


def check_device_buffer(data: Any) -> None:
    """Refuse, before anything is gathered or launched, a buffer the device engine cannot run on."""
    library = library_of(data)
    if library == "cupy" or (library == "torch" and bool(data.is_cuda)):
        return
    raise InputError("the device engine runs on CuPy arrays or torch CUDA tensors: these buffers are not")


def address_of(flat: Array) -> tuple[int, int]:
    """(the device address, the GPU's index) of a 1-D CuPy array or torch CUDA tensor."""
    check_device_buffer(flat)
    if library_of(flat) == "torch":
        return int(flat.data_ptr()), int(flat.device.index)
    return int(flat.data.ptr), int(flat.device.id)


def queued_work_done(flat: Array, device: int) -> None:
    """A torch tensor's caller queued its work on torch's current stream, which the kernels'
    streams do not follow: wait for it (a CuPy array's streams follow CuPy's current stream)."""
    if library_of(flat) == "torch":
        sys.modules["torch"].cuda.current_stream(device).synchronize()


def launcher() -> Any:
    """CuPy, which compiles and launches the kernels."""
    try:
        import cupy
    except ImportError:
        raise InputError("the device engine launches its kernels with CuPy, which is not installed") from None
    return cupy
