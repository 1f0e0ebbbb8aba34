"""The buffers the runtime sums: NumPy, CuPy or torch arrays, and what it asks of them.

The runtime only slices a buffer, copies into slices and adds into slices, which all three
libraries spell the same way; what differs is asked here, in one place: a buffer's library
(:func:`library_of`) and dtype (:func:`dtype_name`, one of :data:`DTYPES`), its 1-D view
(:func:`flat_view`), scratch like it (:func:`scratch_for`), and the refusals of a buffer that
cannot be summed in place, made before any data moves (:func:`check_array`,
:func:`check_summable`, :func:`check_buffers`, :func:`in_place_refusal`).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from stragglar.errors import ArgumentError, InputError

__all__ = [
    "DTYPES",
    "Array",
    "check_array",
    "check_buffers",
    "check_sizes",
    "check_summable",
    "data_address",
    "dtype_name",
    "empty_like",
    "flat_view",
    "in_place_refusal",
    "library_of",
    "scratch_for",
    "summable_refusal",
]

DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")

Array = Any  # numpy.ndarray, cupy.ndarray or torch.Tensor: all sliced the same way

_dtype_names: dict[Any, str] = {}  # a supported dtype object -> its name


def dtype_name(array: Array) -> str:
    """The dtype as a plain name (``torch.float32`` -> ``float32``), checked against :data:`DTYPES`.

    A call asks it several times per buffer, and naming a NumPy dtype costs microseconds, so the
    names of the dtypes seen are kept (a handful: only supported ones are)."""
    dtype = array.dtype
    name = _dtype_names.get(dtype)
    if name is not None:
        return name
    name = str(dtype).rsplit(".", 1)[-1]
    if name not in DTYPES:
        supported = f"supported dtypes are {', '.join(DTYPES)}{_byte_order_hint(dtype)}"
        raise ArgumentError(f"cannot allreduce dtype {name}: {supported}")
    if len(_dtype_names) < 64:
        _dtype_names[dtype] = name
    return name


def _byte_order_hint(dtype: Any) -> str:
    """The way out where a NumPy dtype is a supported one in the other byte order: NumPy names it
    by its code (``>f4``), and "cannot allreduce dtype >f4: supported dtypes are ..., float32"
    read as a contradiction.  Only the native byte order is summed."""
    if getattr(dtype, "isnative", True):  # torch's dtypes have no byte order
        return ""
    native = str(dtype.newbyteorder("="))
    if native not in DTYPES:
        return ""
    return f" ({native} in the other byte order: pass array.astype('{native}'))"


def flat_view(array: Array, owner: str | None = None) -> Array:
    """A 1-D view sharing ``array``'s memory; the result must land in place, so no copies.  A
    1-D array is its own (every call asks for each buffer's, and a torch or CuPy view costs
    microseconds to make).  ``owner``: whose buffer it is, for the refusal ("rank 2's")."""
    dtype_name(array)
    contiguous = array.is_contiguous() if hasattr(array, "is_contiguous") else array.flags.c_contiguous
    if not contiguous:
        which = "a contiguous buffer" if owner is None else f"{owner} buffer contiguous"
        raise InputError(f"allreduce needs {which} (results are written in place)")
    if type(array) is not np.ndarray and library_of(array) == "numpy":
        array = array.view(np.ndarray)  # a subclass's (np.matrix's) reshape stays 2-D: its memory, plainly
    return array if array.ndim == 1 else array.reshape(-1)


def in_place_refusal(array: Array) -> str | None:
    """Why the AllReduce cannot write ``array`` in place, or None: torch refuses in-place writes to
    a tensor that requires grad (a view of a leaf) or to an inference tensor outside inference
    mode, and would do so in the middle of the rounds, with the buffer half written and the peers
    waiting for data that never comes.  So the rank says so in its header, before any data moves.
    A sparse tensor has no dense memory to write at all (torch raises from deep inside)."""
    layout = getattr(array, "layout", None)
    if layout is not None and str(layout) != "torch.strided":
        kind = str(layout).removeprefix("torch.")
        return f"allreduce writes a dense tensor in place, got a {kind} one: pass tensor.to_dense()"
    if getattr(array, "requires_grad", False):
        return "allreduce writes in place: pass a buffer that does not require grad (tensor.detach())"
    inference = getattr(array, "is_inference", None)
    torch = sys.modules.get("torch")
    if inference is not None and inference() and torch is not None and not torch.is_inference_mode_enabled():
        return (
            "allreduce writes in place: an inference tensor can only be written inside torch.inference_mode()"
        )
    if library_of(array) == "torch" and array.device.type == "cpu" and array.numel():
        # memory torch allocated is writable; memory it was handed (from_numpy, frombuffer) may not be
        foreign = not array.untyped_storage().resizable()
        if foreign and read_only_memory(array.data_ptr(), array.numel() * array.element_size()):
            return "allreduce writes in place: this tensor's memory is read-only (a read-only np.memmap?)"
    return None


def read_only_memory(address: int, length: int) -> bool:
    """Whether any of ``length`` bytes from ``address`` lies in memory this process may not write,
    by the kernel's own list of the process's mappings, read anew each time (Linux; elsewhere
    False, not known): a list kept from an earlier call could miss a read-only file mapped since
    where freed memory was.  A fraction of a millisecond; asked only of memory torch did not
    allocate (see :func:`in_place_refusal`)."""
    try:
        with open("/proc/self/maps", encoding="ascii") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return False
    end = address + length
    for line in lines:
        span, perms = line.split(maxsplit=2)[:2]
        low, high = (int(x, 16) for x in span.split("-"))
        if low < end and address < high and "w" not in perms:
            return True
    return False


def empty_like(flat: Array, size: int) -> Array:
    """Scratch on the same device and with the same dtype as ``flat``."""
    if hasattr(flat, "new_empty"):
        return flat.new_empty(size)
    return np.empty_like(flat, shape=(size,))  # CuPy arrays dispatch this to CuPy


_host_scratch = threading.local()


def scratch_for(flat: Array, size: int) -> Array:
    """``size`` elements of scratch like ``flat``, reused across calls for host (CPU) buffers.

    A fresh 100 MiB host allocation costs about 40 ms of page faults, paid on every call; CUDA
    memory pools already cache, and their stream-ordered reuse is theirs to manage, so device
    buffers get a fresh allocation.  The cache is per thread (a thread runs one AllReduce at a
    time) and per dtype, and holds the largest scratch asked for so far.
    """
    if not _on_host(flat):
        return empty_like(flat, size)
    key = (type(flat), dtype_name(flat))
    cache: dict[tuple[type, str], Array] = _host_scratch.__dict__.setdefault("buffers", {})
    buffer = cache.get(key)
    if buffer is None or buffer.shape[0] < size:
        buffer = cache[key] = empty_like(flat, size)
    return buffer[:size]


def _on_host(flat: Array) -> bool:
    device = getattr(flat, "device", None)
    return isinstance(flat, np.ndarray) or getattr(device, "type", None) == "cpu"


def check_sizes(sizes: Sequence[int], what: str) -> None:
    if len(set(sizes)) > 1:
        raise InputError(f"every rank needs the same buffer size for {what}, got {sorted(set(sizes))}")


def library_of(value: object) -> str | None:
    """``numpy``, ``torch`` or ``cupy`` for an array of that library; None for anything else (a
    list, a scalar), which the interpreter cannot slice in place.  The GPU libraries are asked
    first: an array type of theirs that derives from NumPy's is still theirs."""
    for name, kind in (("torch", "Tensor"), ("cupy", "ndarray")):
        module = sys.modules.get(name)  # never imported here: an array of it means it is loaded
        if module is not None and isinstance(value, getattr(module, kind)):
            return name
    return "numpy" if isinstance(value, np.ndarray) else None


def data_address(array: Array) -> int:
    """The address of an array's first element (a device address for CuPy arrays and CUDA
    tensors), read from each library's own attribute (NumPy's array interface, torch's
    ``data_ptr``, CuPy's ``data.ptr``) rather than a CUDA array interface: calls ask it for every
    buffer, and that interface is a dictionary made anew each time (torch's in Python)."""
    if type(array) is not np.ndarray:
        library = library_of(array)
        if library == "torch":
            return int(array.data_ptr())
        if library == "cupy":
            return int(array.data.ptr)
    return int(array.__array_interface__["data"][0])


def check_array(array: object, what: str) -> None:
    """Refuse a buffer the AllReduce cannot sum in place, before any data moves: anything but a
    NumPy, CuPy or torch array (:func:`check_summable` too).  A 0-d array is one element, and fine."""
    if library_of(array) is None:
        raise ArgumentError(f"{what} sums NumPy, CuPy or torch arrays, got {type(array).__name__}")
    check_summable(array, what)


def check_summable(array: object, what: str) -> None:
    """Refuse an array whose values are not its data (:func:`summable_refusal`)."""
    refusal = summable_refusal(array, what)
    if refusal is not None:
        raise InputError(refusal)


def summable_refusal(array: object, what: str) -> str | None:
    """Why ``array``'s values are not its data, or None: a meta tensor has a shape and no data (the
    rounds would "succeed" doing nothing in one process, and fail half-way across processes when a
    transport copies out of it); a masked NumPy array would be summed through its mask, the masked
    values included, and look like a masked sum.  Across processes it is a problem of one rank's
    that its header carries, so that its peers refuse the same call with it."""
    if getattr(array, "is_meta", False):
        return f"{what} needs data to sum: a meta tensor holds none"
    if isinstance(array, np.ma.MaskedArray):
        return (
            f"{what} cannot honour a mask: pass the array's data (array.filled(0) sums the unmasked values)"
        )
    return None


def check_buffers(buffers: object) -> None:
    """``allreduce_local``'s buffers: a list (or tuple) of arrays of one library on one device, so
    that a round's copy from one rank into another is a plain slice copy."""
    if not isinstance(buffers, (list, tuple)):
        raise ArgumentError(
            f"allreduce_local takes a list of arrays, one per rank, got {type(buffers).__name__}"
        )
    for rank, buffer in enumerate(buffers):
        check_array(buffer, "allreduce_local")
        refusal = in_place_refusal(buffer)
        if refusal is not None:
            raise InputError(f"rank {rank}'s buffer: {refusal}")
    places = sorted({f"{library_of(b)} on {_device(b)}" for b in buffers})
    if len(places) > 1:
        raise InputError(f"allreduce_local needs every rank's array in one place, got {' and '.join(places)}")


def _device(array: Any) -> str:
    return "the host" if isinstance(array, np.ndarray) else str(array.device)
