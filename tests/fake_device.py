"""The device executor's CUDA source compiled for the host, and a CuPy stand-in that runs it.

The kernel's memory-model primitives become GCC atomics (acquire loads, release stores, a
compare-and-swap claim), its clock the host's steady clock, and each thread block a host thread
of one thread (so a block barrier is nothing); a rank's launch runs its blocks' threads and joins
them.  The stand-in (:func:`installed`) gives ``allreduce_local(..., engine="device")`` what it
asks of CuPy: streams whose launches run in threads of their own (so the ranks' kernels run at
once and spin on each other's flags, as on a GPU), device arrays in host memory, and a device
whose attributes the test chooses (how many blocks it holds at once)."""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_cupy import FakeArray, compiled

from stragglar.runtime.device.kernel import ERROR_WORDS, SOURCE, kernel_name, slot_size
from stragglar.runtime.device.table import DeviceProgram
from stragglar.runtime.kernels import SUMS

HOST_PRELUDE = r"""
#define STRAGGLAR_HOST
#include <chrono>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __shared__
struct Index { unsigned x, y, z; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
static thread_local Index blockIdx, blockDim, gridDim, threadIdx;
typedef unsigned long long Flag;
static Flag load_acquire(const Flag* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }
static void store_release(Flag* w, Flag v) { __atomic_store_n(w, v, __ATOMIC_RELEASE); }
static Flag load_relaxed(const Flag* w) { return __atomic_load_n(w, __ATOMIC_RELAXED); }
static bool claim(unsigned long long* w) {
    unsigned long long zero = 0;
    return __atomic_compare_exchange_n(w, &zero, 1ull, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}
static unsigned long long now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}
static void block_barrier() {}
static void spin_pause() { std::this_thread::yield(); }
"""
_HOST_LAUNCH = """
extern "C" void {entry}(const long long* rows, int row_count, int rank, unsigned long long call,
                        long long count, int num_chunks, long long slot_size, unsigned long long buffer,
                        const unsigned long long* buffers, const unsigned long long* inboxes,
                        const unsigned long long* flags, unsigned long long* errors, long long timeout_ns,
                        unsigned blocks) {{
    std::vector<std::thread> threads;
    for (unsigned b = 0; b < blocks; ++b)
        threads.emplace_back([=] {{
            gridDim.x = blocks; blockDim.x = 1; blockIdx.x = b; threadIdx.x = 0;
            {name}(rows, row_count, rank, call, count, num_chunks, slot_size, buffer, buffers, inboxes,
                   flags, errors, timeout_ns);
        }});
    for (auto& t : threads) t.join();
}}
"""
ARGTYPES = [
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_ulonglong,
    ctypes.c_longlong,
    ctypes.c_int,
    ctypes.c_longlong,
    ctypes.c_ulonglong,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_longlong,
    ctypes.c_uint,
]


def entry_name(dtype: str) -> str:
    return f"host_run_{dtype}"


def host_library(folder: Path) -> ctypes.CDLL:
    """The kernel of every dtype, compiled for the host, each with an entry that runs a rank's blocks."""
    entries = "".join(_HOST_LAUNCH.format(entry=entry_name(dtype), name=kernel_name(dtype)) for dtype in SUMS)
    library = compiled(HOST_PRELUDE + SOURCE + entries, folder)
    for dtype in SUMS:
        entry = getattr(library, entry_name(dtype))
        entry.argtypes = ARGTYPES
        entry.restype = None
    return library


_compiled: list[ctypes.CDLL] = []  # the one host build of a test session


def host_or_skip(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """:func:`host_library`, compiled once per test session (each test module used to compile its
    own); the test skipped where there is no g++ to compile it."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to compile the CUDA source for the host")
    if not _compiled:
        _compiled.append(host_library(tmp_path_factory.mktemp("device")))
    return _compiled[0]


def pointer(array: np.ndarray) -> int:
    return int(array.ctypes.data)


class HostRun:
    """A program's inboxes, flags and error words in host memory, run by host threads: one per
    rank (a Python thread; ctypes lets go of the interpreter lock) and one per block."""

    def __init__(
        self, library: ctypes.CDLL, program: DeviceProgram, count: int, dtype: str, blocks: int
    ) -> None:
        self.entry = getattr(library, entry_name(dtype))
        self.program, self.count, self.blocks = program, count, blocks
        self.slot_size = slot_size(count, program.num_chunks, dtype)
        word = SUMS[dtype][1]
        self.inboxes = [np.zeros(max(s * self.slot_size, 1), dtype=word) for s in program.inbox_slots]
        self.flags = [np.zeros(program.flags * blocks, dtype=np.uint64) for _ in program.rows]
        self.errors = np.zeros(program.num_ranks * ERROR_WORDS, dtype=np.uint64)
        self.inbox_pointers = np.array([pointer(b) for b in self.inboxes], dtype=np.uint64)
        self.flag_pointers = np.array([pointer(f) for f in self.flags], dtype=np.uint64)
        self.rows = [np.ascontiguousarray(r) for r in program.rows]

    def rank(self, rank: int, buffers: np.ndarray, call: int, timeout_s: float) -> None:
        """Rank ``rank``'s kernel on ``buffers`` (every rank's buffer address, in rank order)."""
        self.entry(
            pointer(self.rows[rank]),
            len(self.rows[rank]),
            rank,
            call,
            self.count,
            self.program.num_chunks,
            self.slot_size,
            int(buffers[rank]),
            pointer(buffers),
            pointer(self.inbox_pointers),
            pointer(self.flag_pointers),
            pointer(self.errors),
            int(timeout_s * 1e9),
            self.blocks,
        )

    def call(
        self, buffers: Sequence[np.ndarray], call: int, timeout_s: float = 20.0, absent: Sequence[int] = ()
    ) -> np.ndarray:
        """Every rank but ``absent`` runs call number ``call`` on its buffer (word views); the
        error words, one row per rank."""
        self.errors[:] = 0
        addresses = np.array([pointer(b) for b in buffers], dtype=np.uint64)
        threads = [
            threading.Thread(target=self.rank, args=(r, addresses, call, timeout_s))
            for r in range(self.program.num_ranks)
            if r not in absent
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s + 60)
            assert not t.is_alive(), "a rank's kernel outlived its own timeout"
        words: np.ndarray = self.errors.reshape(-1, ERROR_WORDS).copy()
        return words


class DeviceArray(FakeArray):
    def get(self) -> np.ndarray:
        host: np.ndarray = np.array(self).view(np.ndarray)
        return host


class FakeCuda:
    """Streams whose launches run in threads; a device with the attributes the test sets."""

    def __init__(self, attributes: dict[str, int]) -> None:
        self.local = threading.local()  # each thread's current stream: ranks may be threads
        self.attributes = attributes
        self.launches: list[tuple[int, float]] = []  # (buffer address, when)
        self.opened: list[int] = []  # the addresses IPC handles were opened for
        self.closed: list[int] = []
        self.allocations: dict[int, np.ndarray] = {}  # what cudaMalloc gave, by address
        self.runtime = types.SimpleNamespace(
            ipcGetMemHandle=self.handle,
            ipcOpenMemHandle=self.open,
            malloc=self.malloc,
            free=self.allocations.pop,
            memset=lambda address, value, nbytes: ctypes.memset(address, value, nbytes),
            ipcCloseMemHandle=self.closed.append,
            getDeviceProperties=lambda device: self.attributes,
        )

    def base_of(self, address: int) -> int:
        """The start of the allocation holding ``address`` (the driver's cuMemGetAddressRange)."""
        for base, memory in self.allocations.items():
            if base <= address < base + memory.nbytes:
                return base
        raise RuntimeError(f"CUDA_ERROR_NOT_FOUND: no allocation holds {address:#x}")

    def buffer(self, values: np.ndarray, offset: int = 16) -> DeviceArray:
        """A device buffer holding ``values``, ``offset`` bytes into an allocation of its own."""
        base = self.malloc(values.nbytes + offset + 16)
        memory = self.allocations[base][offset : offset + values.nbytes]
        array: DeviceArray = memory.view(values.dtype).view(DeviceArray)
        array[...] = values
        return array

    def malloc(self, nbytes: int) -> int:
        memory = np.empty(nbytes, dtype=np.uint8)
        self.allocations[int(memory.ctypes.data)] = memory
        return int(memory.ctypes.data)

    @property
    def current(self) -> FakeStream | None:
        return getattr(self.local, "stream", None)

    @current.setter
    def current(self, stream: FakeStream | None) -> None:
        self.local.stream = stream

    def handle(self, address: int) -> bytes:
        """An IPC handle: here, the address itself (every rank is in this process), of an
        allocation's start only (a real handle names the whole allocation)."""
        assert address in self.allocations, "a handle of an address that is no allocation's start"
        return int(address).to_bytes(64, "little")

    def open(self, handle: bytes, flags: int = 1) -> int:
        address = int.from_bytes(handle, "little")
        self.opened.append(address)
        return address

    def Stream(self, non_blocking: bool = False) -> FakeStream:
        return FakeStream(self)

    def get_current_stream(self) -> Any:
        return types.SimpleNamespace(record=lambda: "event")


class MappedCuda(FakeCuda):
    """A stand-in for ranks in processes of their own: "device" memory is a file of ``folder``
    mapped into memory, an IPC handle its name, and opening a handle maps the file afresh, at
    another address than the owner's (as CUDA maps a peer's allocation), so a peer's address used
    unconverted, or an offset dropped, reads and writes the wrong bytes.  Flags are atomics in
    the shared pages, which GCC's atomics order across processes as they do across threads.  A
    mapping lives as long as the process (a closed handle is only counted)."""

    def __init__(self, attributes: dict[str, int], folder: Path) -> None:
        super().__init__(attributes)
        self.folder = folder
        self.maps: list[mmap.mmap] = []  # every mapping this process made, kept mapped
        self.names: dict[int, str] = {}  # an allocation's file, by its address here

    def mapped(self, name: str, nbytes: int) -> tuple[int, np.ndarray]:
        with open(self.folder / name, "r+b") as file:
            self.maps.append(mmap.mmap(file.fileno(), nbytes))
        memory = np.frombuffer(self.maps[-1], dtype=np.uint8)
        return int(memory.ctypes.data), memory

    def malloc(self, nbytes: int) -> int:
        name = f"m{os.getpid()}-{len(self.maps)}"
        (self.folder / name).write_bytes(bytes(max(nbytes, 1)))
        address, memory = self.mapped(name, max(nbytes, 1))
        self.allocations[address], self.names[address] = memory, name
        return address

    def handle(self, address: int) -> bytes:
        assert address in self.allocations, "a handle of an address that is no allocation's start"
        return self.names[address].encode().ljust(64, b"\0")

    def open(self, handle: bytes, flags: int = 1) -> int:
        name = handle.rstrip(b"\0").decode()
        address, _ = self.mapped(name, (self.folder / name).stat().st_size)
        self.opened.append(address)
        return address


class FakeStream:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.threads: list[threading.Thread] = []
        self.outer: FakeStream | None = None

    def __enter__(self) -> FakeStream:
        self.outer, self.cuda.current = self.cuda.current, self
        return self

    def __exit__(self, *exc: object) -> None:
        self.cuda.current = self.outer

    def wait_event(self, event: object) -> None:
        pass

    def synchronize(self) -> None:
        for t in self.threads:
            t.join(120)
            assert not t.is_alive(), "a kernel outlived its own timeout"
        self.threads = []


def fake_cupy(cuda: FakeCuda, library: ctypes.CDLL) -> types.ModuleType:
    module = types.ModuleType("cupy")
    module.ndarray = DeviceArray  # type: ignore[attr-defined]
    module.cuda = cuda  # type: ignore[attr-defined]
    module.uint64 = np.uint64  # type: ignore[attr-defined]

    def raw_module(code: str, options: tuple[str, ...], name_expressions: list[str]) -> Any:
        assert code == SOURCE and options == ("--std=c++14",) and len(name_expressions) == 1
        dtype = next(d for d in SUMS if kernel_name(d) == name_expressions[0])
        entry = getattr(library, entry_name(dtype))

        def kernel(grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
            stream = cuda.current
            assert stream is not None, "every rank's kernel goes on a stream of its own"
            values = [int(a.ctypes.data) if isinstance(a, np.ndarray) and a.ndim else int(a) for a in args]
            cuda.launches.append((values[7], time.perf_counter()))
            thread = threading.Thread(target=entry, args=(*values, grid[0]), daemon=True)
            thread.start()
            stream.threads.append(thread)

        kernel_object = types.SimpleNamespace(num_regs=40, shared_size_bytes=4)
        return types.SimpleNamespace(get_function=lambda name: _Kernel(kernel, kernel_object))

    module.RawModule = raw_module  # type: ignore[attr-defined]
    module.__dict__.update(__getattr__=lambda name: getattr(np, name))
    module.asarray = lambda a: np.array(a).view(DeviceArray)  # type: ignore[attr-defined]
    module.empty = lambda n, dtype: np.empty(n, dtype).view(DeviceArray)  # type: ignore[attr-defined]
    module.zeros = lambda n, dtype: np.zeros(n, dtype).view(DeviceArray)  # type: ignore[attr-defined]
    module.arange = lambda *a, **k: np.arange(*a, **k).view(DeviceArray)  # type: ignore[attr-defined]
    return module


class _Kernel:
    def __init__(self, launch: Any, attributes: Any) -> None:
        self.launch = launch
        self.num_regs = attributes.num_regs
        self.shared_size_bytes = attributes.shared_size_bytes

    def __call__(self, grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
        self.launch(grid, block, args)


H200 = {  # what a Hopper GPU says of itself (132 multiprocessors)
    "multiProcessorCount": 132,
    "maxThreadsPerMultiProcessor": 2048,
    "maxBlocksPerMultiProcessor": 32,
    "regsPerMultiprocessor": 65536,
    "sharedMemPerMultiprocessor": 233472,
}


def installed(
    monkeypatch: pytest.MonkeyPatch,
    library: ctypes.CDLL,
    attributes: dict[str, int] | None = None,
    cuda: FakeCuda | None = None,
) -> Iterator[FakeCuda]:
    """The stand-in in ``sys.modules["cupy"]``, with empty caches of device loopbacks, ranks and
    registrations, and the driver's allocation lookup answered from the stand-in's allocations
    (``cuda``: a stand-in of the caller's making, else one of a device with ``attributes``)."""
    from stragglar.runtime.device import group, ipc, loopback, shared

    fake = FakeCuda(dict(H200 if attributes is None else attributes)) if cuda is None else cuda
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(fake, library))
    monkeypatch.setattr(loopback, "_loopbacks", type(loopback._loopbacks)())
    monkeypatch.setattr(group, "_ranks", type(group._ranks)())
    monkeypatch.setattr(shared, "_registry", {})
    monkeypatch.setattr(shared, "_numbers", {})
    monkeypatch.setattr(ipc, "OPENINGS", ipc.Openings())
    monkeypatch.setattr(shared, "OPENINGS", ipc.OPENINGS)
    monkeypatch.setattr(shared, "allocation_base", fake.base_of)
    yield fake
