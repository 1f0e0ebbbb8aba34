"""The device executor's kernel as the host sees it: how a rank's kernel spreads its work
(:class:`Tuning`), the sizes of an inbox slot and of a packet unit, and the kernel's name,
compilation and launch arguments, one place for every path that launches it (one process or a
group).

The CUDA C, and the layout of a rank's words it shares with the host, are in
:mod:`~stragglar.runtime.device.kernel_source`; its names are importable from here too.  The
call number lives on the device, in each rank's progress words, so a launch's arguments never
change from call to call, and a CUDA graph of launches replays as call after call;
:func:`recount` sets the device's count back to the host's after a call that was cut short.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stragglar.runtime.device.kernel_source import ERROR_WORDS, PROGRESS_WORDS, RANK_WORDS, SOURCE
from stragglar.runtime.device.table import DeviceProgram
from stragglar.runtime.kernels import SUMS

__all__ = [
    "ERROR_WORDS",
    "OWN_TUNING",
    "PACKET_BYTES",
    "PAUSES_NS",
    "PROGRESS_WORDS",
    "RANK_WORDS",
    "SOURCE",
    "THREADS",
    "VECTORS",
    "Tuning",
    "compile_kernel",
    "kernel_args",
    "kernel_name",
    "packet_unit",
    "recount",
    "slot_size",
]

THREADS = (128, 256, 512)  # threads a block may have: its part of a chunk is copied with a block-stride loop
VECTORS = (1, 2, 4, 8)  # the 16-byte vectors a thread may keep in flight (a template argument each)
PAUSES_NS = (0, 64)  # how long a spinning thread sleeps between two looks at a flag (0: it does not)
# The largest chunk that we expect packets to move faster than flags (a round at N = 8 waited on
# latency at 16 KiB chunks, and twice the bytes are still few at 64 KiB): what the tests turn
# packets on at, and the chunk size of the benchmark's 4 MiB row; not yet the engine's own
# (Tuning.packet_bytes)
PACKET_BYTES = 64 * 1024


@dataclass(frozen=True)
class Tuning:
    """How a rank's kernel spreads its work over the device: what the engine's speed depends on
    beside the schedule, and nothing its results do (every setting runs the same program to the
    same bits).  ``max_blocks``: thread blocks a rank at most (fewer where the device could not
    hold that many for every rank at once, or where a chunk is too small to share); more blocks
    move more of a round's data at once, and each waits on a flag of its own.  ``vectors``: the
    16-byte vectors a thread loads before it stores them (one of :data:`VECTORS`); more hide more
    of the memory's latency, for more registers.  ``threads``: a block's (one of :data:`THREADS`);
    fewer a block let the device hold more blocks at once, and a block's barriers cost less.
    ``pause_ns``: how long a thread waiting on a flag sleeps between looks (one of
    :data:`PAUSES_NS`): a sleep leaves the memory to the blocks that move data, and may see the
    flag later.  ``packet_bytes``: the largest chunk (in bytes) whose transfers move as packets
    (:mod:`~stragglar.runtime.device.table`; 0: none do): a packet carries its own mark, so a
    round costs one trip through memory rather than the data's and a flag's, for twice the
    bytes.  The defaults are the engine's; the others are there to be measured against them
    (``benchmarks/gpu_tuning.py``)."""

    # The engine's own, from a sweep on an H200 at the speed targets' settings (N = 8: the paper's
    # C at 64 MiB, where it was the fastest; C = 64 at 1 MiB, 7% behind the fastest;
    # benchmarks/gpu_tuning.py, docs/perf/gpu-tuning-sweep-h200.json): 8 vectors in flight a thread
    # take a copy near the memory's speed, and blocks of 256 threads let the device hold twice as
    # many of them at once as of 512.
    max_blocks: int = 64
    vectors: int = 8
    threads: int = 256
    pause_ns: int = 64
    # The sweep above ran on flags alone.  Packets are off until a GPU has timed them against
    # flags (benchmarks/gpu_device.py times every chunk both ways): built, proved and run on the
    # host only, they are not yet known to be faster anywhere.
    packet_bytes: int = 0

    def __post_init__(self) -> None:
        if self.max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, not {self.max_blocks}")
        if self.vectors not in VECTORS:
            raise ValueError(f"vectors must be one of {VECTORS}, not {self.vectors}")
        if self.threads not in THREADS:
            raise ValueError(f"threads must be one of {THREADS}, not {self.threads}")
        if self.pause_ns not in PAUSES_NS:
            raise ValueError(f"pause_ns must be one of {PAUSES_NS}, not {self.pause_ns}")
        if self.packet_bytes < 0:
            raise ValueError(f"packet_bytes must be at least 0, not {self.packet_bytes}")

    def moves_packets(self, count: int, num_chunks: int, dtype: str) -> bool:
        """Whether a call on ``count`` elements of ``dtype`` in ``num_chunks`` chunks moves its
        chunks as packets: its largest chunk is at most :attr:`packet_bytes`.

        >>> on = Tuning(packet_bytes=PACKET_BYTES)
        >>> on.moves_packets(2**18, 64, "float32"), on.moves_packets(2**24, 64, "float32")
        (True, False)
        >>> Tuning().moves_packets(2**18, 64, "float32")  # the engine's own: none yet
        False
        """
        largest = -(-count // num_chunks) * int(np.dtype(SUMS[dtype][1]).itemsize)
        return 0 < largest <= self.packet_bytes


OWN_TUNING = Tuning()  # the engine's own: what every call uses unless a benchmark measures another


def slot_size(count: int, num_chunks: int, dtype: str, packets: bool = False) -> int:
    """Elements of one inbox slot for ``count`` elements of ``dtype`` in ``num_chunks`` chunks: the
    largest chunk, placed at its own offset within 16 bytes (as in the buffer, so that a staged
    transfer moves 16 bytes at a time too), in whole 16 bytes; with ``packets`` (a program that
    moves any: :attr:`~stragglar.runtime.device.table.DeviceProgram.packets`), room for the
    largest chunk's packets if that is more (8 bytes for every 4 of data, rounded up to whole
    elements for a dtype of 2 bytes).

    >>> slot_size(10, 3, "float32"), slot_size(12, 3, "float32"), slot_size(0, 3, "float64")
    (8, 8, 2)
    >>> slot_size(12, 3, "float32", packets=True), slot_size(5, 1, "float16", packets=True)
    (8, 16)
    """
    itemsize = int(np.dtype(SUMS[dtype][1]).itemsize)
    width = 16 // itemsize
    largest = -(-count // num_chunks)
    elements = largest + width - 1
    if packets:  # a unit's packets: 8 bytes for every 4 of data (an 8-byte element: two)
        per = packet_unit(dtype)
        elements = max(elements, -(-largest // per) * 8 * max(1, itemsize // 4) // itemsize)
    return -(-elements // width) * width


def packet_unit(dtype: str) -> int:
    """The elements of ``dtype`` in one packet unit, which one thread lands and forwards
    (``Packing<Word>::PER``): a packet's 4 bytes of data, or one 8-byte element (two packets).

    >>> packet_unit("float16"), packet_unit("float32"), packet_unit("int64")
    (2, 1, 1)
    """
    return max(1, 4 // int(np.dtype(SUMS[dtype][1]).itemsize))


def kernel_name(dtype: str, vectors: int = OWN_TUNING.vectors) -> str:
    """The kernel of ``dtype`` (a key of :data:`~stragglar.runtime.kernels.SUMS`) moving
    ``vectors`` 16-byte vectors a thread at once, as an NVRTC name expression."""
    return f"run_program<{SUMS[dtype][0]}, {vectors}>"


def compile_kernel(cupy: Any, dtype: str, tuning: Tuning = OWN_TUNING) -> Any:
    """``run_program`` for ``dtype`` under ``tuning`` (its vectors and pause; its blocks and
    threads are the launch's), compiled by CuPy's NVRTC (which keeps what it compiled on disk)."""
    name = kernel_name(dtype, tuning.vectors)
    options = ("--std=c++14", f"-DSTRAGGLAR_PAUSE_NS={tuning.pause_ns}")
    return cupy.RawModule(code=SOURCE, options=options, name_expressions=[name]).get_function(name)


def recount(progress: Any, last_call: int) -> None:
    """Set progress words (one rank's row, or rows of them: each row's first
    :data:`PROGRESS_WORDS`) as a kernel that ended call ``last_call`` leaves them: where a call
    was cut short, the device's count is then the host's again."""
    progress[..., 0] = last_call
    progress[..., 1] = 0


def kernel_args(
    program: DeviceProgram,
    rank: int,
    rows: Any,
    count: int,
    slot_size: int,
    pointers: tuple[Any, Any, Any, Any],
    timeout_s: float,
    system: bool,
) -> tuple[Any, ...]:
    """``run_program``'s arguments, in its order and C types, for rank ``rank``'s launch: ``rows``
    its table on the device, ``pointers`` the device arrays of every rank's buffer, inbox and
    flag addresses and of every rank's words (:data:`RANK_WORDS`); ``system``: whether the flags
    are released and acquired at the system's scope (peers on other GPUs) or the GPU's.  Nothing
    in them changes from call to call (the buffers' addresses are read from the device array), so
    a graph of launches replays.  One place for the kernel's signature, whoever launches it (one
    process or a group)."""
    buffers, inboxes, flags, words = pointers
    return (
        rows,
        np.int32(len(program.rows[rank])),
        np.int32(rank),
        np.int64(count),
        np.int32(program.num_chunks),
        np.int64(slot_size),
        buffers,
        inboxes,
        flags,
        words,
        np.int64(int(timeout_s * 1e9)),
        np.int32(system),
    )
