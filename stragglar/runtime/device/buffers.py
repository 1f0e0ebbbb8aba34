"""Which engine a call runs on (:data:`ENGINES`), and what the device engine asks of a buffer, the
same in one process and across processes: its address and GPU (a CuPy array, or a torch CUDA
tensor: bfloat16 included, which CuPy lacks), the caller's queued work on it done first, no CUDA
graph being captured on the caller's stream, and CuPy to launch the kernels."""

from __future__ import annotations

import sys
from typing import Any

from stragglar.errors import ArgumentError, InputError, described
from stragglar.runtime.arrays import Array, data_address, library_of

__all__ = [
    "ENGINES",
    "address_of",
    "check_device_buffer",
    "check_not_capturing",
    "launcher",
    "on_device",
    "queued_work_done",
]

ENGINES = ("rounds", "device")  # the rounds driven from the host; each rank's whole part in one kernel


def on_device(engine: Any) -> bool:
    """Whether ``engine`` (one of :data:`ENGINES`) is the device engine."""
    if not isinstance(engine, str):  # a wrong type is an ArgumentError (a TypeError), as everywhere
        raise ArgumentError(f"engine must be one of {', '.join(ENGINES)}, got {described(engine)}")
    if engine not in ENGINES:
        raise InputError(f"unknown engine {described(engine)} (choose from {', '.join(ENGINES)})")
    return bool(engine == "device")


def check_device_buffer(data: Any) -> None:
    """Refuse, before anything is gathered or launched, a buffer the device engine cannot run on."""
    library = library_of(data)
    if library == "cupy" or (library == "torch" and bool(data.is_cuda)):
        return
    if library is None:  # not an array at all: a wrong type, as allreduce and allreduce_local say it
        raise ArgumentError(
            f"the device engine runs on CuPy arrays or torch CUDA tensors, not {type(data).__name__}"
        )
    got = {"numpy": "NumPy arrays", "torch": "torch CPU tensors"}[library]
    raise InputError(f"the device engine runs on CuPy arrays or torch CUDA tensors, not {got}")


def check_not_capturing(data: Any) -> None:
    """Refuse a call (or a registration) made while the caller's current stream (torch's for a
    torch tensor, CuPy's for a CuPy array) is capturing a CUDA graph, before anything is gathered,
    waited for or launched: a device call waits on the host for its kernels, to read their error
    words, and a registration for its peers, which a capture forbids; an operation refused
    halfway would also spoil the caller's capture.
    Where the stream cannot say (CuPy's default stream while another stream captures), the call
    goes on: its streams are its own."""
    if library_of(data) == "torch":  # a tensor off the GPU is refused elsewhere; torch may have no CUDA
        capturing = bool(data.is_cuda) and bool(sys.modules["torch"].cuda.is_current_stream_capturing())
    else:
        try:
            capturing = bool(launcher().cuda.get_current_stream().is_capturing())
        except RuntimeError:  # cudaErrorStreamCaptureImplicit: another stream captures, not this one
            capturing = False
    if capturing:
        raise InputError(
            "the device engine cannot run while the current stream is capturing a CUDA graph: it "
            "waits on the host for its kernels (to read their error words) and for its peers"
        )


def address_of(flat: Array) -> tuple[int, int]:
    """(the device address, the GPU's index) of a 1-D CuPy array or torch CUDA tensor."""
    check_device_buffer(flat)
    device = flat.device.index if library_of(flat) == "torch" else flat.device.id
    return data_address(flat), int(device)


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
