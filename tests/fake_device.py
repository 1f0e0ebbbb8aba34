"""The device executor's CUDA source compiled for the host, and a CuPy stand-in that runs it.

The kernel's memory-model primitives become GCC atomics (acquire loads, release stores, a
compare-and-swap claim), its clock the host's steady clock, and each thread of a block a host
thread, with a real barrier per block (one thread a block where a test asks for no more, as the
stand-in does); a rank's launch runs its blocks' threads and joins them. The stand-in
(:func:`installed`) gives ``allreduce_local(..., engine="device")`` what it asks of CuPy: streams
whose launches run in threads of their own (so the ranks' kernels run at once and spin on each
other's flags, as on a GPU), device arrays in host memory, and a device whose attributes the test
chooses (how many blocks it holds at once)."""

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
from cupy_surface import Surface, watched
from fake_cupy import FakeArray, compiled

from stragglar.runtime.device.kernel import (
    OWN_TUNING,
    PAUSES_NS,
    PROGRESS_WORDS,
    RANK_WORDS,
    SOURCE,
    VECTORS,
    kernel_name,
    slot_size,
)
from stragglar.runtime.device.table import DeviceProgram
from stragglar.runtime.kernels import SUMS

HOST_PRELUDE = r"""
#define STRAGGLAR_HOST
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#define __global__
#define __device__
struct Index { unsigned x, y, z; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
static thread_local Index blockIdx, blockDim, gridDim, threadIdx;
typedef unsigned long long Flag;
static Flag load_acquire(const Flag* w, bool) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }
static void store_release(Flag* w, Flag v, bool) { __atomic_store_n(w, v, __ATOMIC_RELEASE); }
static Flag load_relaxed(const Flag* w) { return __atomic_load_n(w, __ATOMIC_RELAXED); }
static void store_packet(Flag* w, Flag v, bool) { __atomic_store_n(w, v, __ATOMIC_RELAXED); }
static Flag load_packet(const Flag* w, bool) { return __atomic_load_n(w, __ATOMIC_RELAXED); }
static bool claim(unsigned long long* w, unsigned long long call) {
    unsigned long long seen = __atomic_load_n(w, __ATOMIC_RELAXED);
    while (seen < call)
        if (__atomic_compare_exchange_n(w, &seen, call, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            return true;
    return false;
}
static unsigned long long arrive(unsigned long long* w) {
    return __atomic_fetch_add(w, 1ull, __ATOMIC_ACQ_REL);
}
static unsigned long long now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}
// A block's threads: a barrier (a generation count under a lock), the word block_any ORs into, and
// the block's shared call number.
struct Block {
    std::mutex lock;
    std::condition_variable turned;
    unsigned size, waiting = 0, generation = 0;
    std::atomic<int> any{0};
    unsigned long long call = 0;
    explicit Block(unsigned threads) : size(threads) {}
    void barrier() {
        std::unique_lock<std::mutex> held(lock);
        const unsigned mine = generation;
        if (++waiting == size) {
            waiting = 0;
            ++generation;
            turned.notify_all();
        } else {
            turned.wait(held, [&] { return generation != mine; });
        }
    }
};
static thread_local Block* this_block;  // none: a block of one thread (the race detector's driver)
static void block_barrier() {
    if (this_block) this_block->barrier();
}
static bool block_any(int value) {
    if (!this_block) return value != 0;
    if (value) this_block->any.store(1);
    this_block->barrier();
    const bool seen = this_block->any.load() != 0;
    this_block->barrier();  // every thread has read it before it is cleared for the next
    if (threadIdx.x == 0) this_block->any.store(0);
    this_block->barrier();
    return seen;
}
static unsigned long long block_call(const unsigned long long* progress) {
    if (!this_block) return load_relaxed(progress) + 1;
    if (threadIdx.x == 0) this_block->call = load_relaxed(progress) + 1;
    this_block->barrier();  // its lock orders thread 0's write before the others' reads
    return this_block->call;
}
static void spin_pause() { std::this_thread::yield(); }
#define UNROLLED
"""
_HOST_LAUNCH = """
extern "C" void {entry}(const long long* rows, int row_count, int rank, long long count, int num_chunks,
                        long long slot_size, const unsigned long long* buffers,
                        const unsigned long long* inboxes, const unsigned long long* flags,
                        unsigned long long* words, long long timeout_ns, int system, unsigned blocks,
                        unsigned block_threads) {{
    std::vector<std::unique_ptr<Block>> held;
    std::vector<std::thread> threads;
    for (unsigned b = 0; b < blocks; ++b) {{
        held.emplace_back(new Block(block_threads));
        Block* block = held.back().get();
        for (unsigned t = 0; t < block_threads; ++t)
            threads.emplace_back([=] {{
                this_block = block;
                gridDim.x = blocks; blockDim.x = block_threads; blockIdx.x = b; threadIdx.x = t;
                {name}(rows, row_count, rank, count, num_chunks, slot_size, buffers, inboxes, flags,
                       words, timeout_ns, system);
            }});
    }}
    for (auto& t : threads) t.join();
}}
"""
ARGTYPES = [
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_longlong,
    ctypes.c_int,
    ctypes.c_longlong,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_longlong,
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.c_uint,
]


def entry_name(dtype: str, vectors: int = OWN_TUNING.vectors) -> str:
    return f"host_run_{dtype}_{vectors}"


def host_library(folder: Path) -> ctypes.CDLL:
    """The kernel of every dtype and vector count, compiled for the host, each with an entry that
    runs a rank's blocks."""
    kernels = [(dtype, vectors) for dtype in SUMS for vectors in VECTORS]
    entries = "".join(_HOST_LAUNCH.format(entry=entry_name(*k), name=kernel_name(*k)) for k in kernels)
    library = compiled(HOST_PRELUDE + SOURCE + entries, folder)
    for kernel in kernels:
        entry = getattr(library, entry_name(*kernel))
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
    """A program's inboxes, flags and every rank's words in host memory, run by host threads: one
    per rank (a Python thread; ctypes lets go of the interpreter lock) and ``threads`` per block,
    with a real barrier among them.  It counts the calls as the host does, and checks that every
    rank that ran counted each one."""

    def __init__(
        self,
        library: ctypes.CDLL,
        program: DeviceProgram,
        count: int,
        dtype: str,
        blocks: int,
        vectors: int = OWN_TUNING.vectors,
        threads: int = 1,
    ) -> None:
        self.entry = getattr(library, entry_name(dtype, vectors))
        self.program, self.count, self.blocks, self.threads = program, count, blocks, threads
        self.slot_size = slot_size(count, program.num_chunks, dtype, program.packets)
        word = SUMS[dtype][1]
        self.inboxes = [np.zeros(max(s * self.slot_size, 1), dtype=word) for s in program.inbox_slots]
        self.flags = [np.zeros(program.flags * blocks, dtype=np.uint64) for _ in program.rows]
        self.words = np.zeros(program.num_ranks * RANK_WORDS, dtype=np.uint64)
        self.inbox_pointers = np.array([pointer(b) for b in self.inboxes], dtype=np.uint64)
        self.flag_pointers = np.array([pointer(f) for f in self.flags], dtype=np.uint64)
        self.rows = [np.ascontiguousarray(r) for r in program.rows]
        self.calls = 0

    def rank(self, rank: int, buffers: np.ndarray, timeout_s: float) -> None:
        """Rank ``rank``'s kernel on ``buffers`` (every rank's buffer address, in rank order)."""
        self.entry(
            pointer(self.rows[rank]),
            len(self.rows[rank]),
            rank,
            self.count,
            self.program.num_chunks,
            self.slot_size,
            pointer(buffers),
            pointer(self.inbox_pointers),
            pointer(self.flag_pointers),
            pointer(self.words),
            int(timeout_s * 1e9),
            1,
            self.blocks,
            self.threads,
        )

    def call(
        self, buffers: Sequence[np.ndarray], timeout_s: float = 20.0, absent: Sequence[int] = ()
    ) -> np.ndarray:
        """Every rank but ``absent`` runs the next call on its buffer (word views); the error
        words, one row per rank (a row's first word: the number of the call that failed there)."""
        self.calls += 1
        addresses = np.array([pointer(b) for b in buffers], dtype=np.uint64)
        threads = [
            threading.Thread(target=self.rank, args=(r, addresses, timeout_s))
            for r in range(self.program.num_ranks)
            if r not in absent
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s + 60)
            assert not t.is_alive(), "a rank's kernel outlived its own timeout"
        words = self.words.reshape(-1, RANK_WORDS)
        counted = [int(words[r, 0]) for r in range(self.program.num_ranks) if r not in absent]
        assert counted == [self.calls] * len(counted), f"call {self.calls} counted as {counted}"
        assert not words[:, 1].any(), "a rank's count of its ended blocks was not reset"
        errors: np.ndarray = words[:, PROGRESS_WORDS:].copy()
        return errors


class DeviceArray(FakeArray):
    gpu = 0  # the GPU it is on (a test may set another on a buffer of its own)

    @property
    def device(self) -> Any:
        return types.SimpleNamespace(id=self.gpu)

    def get(self) -> np.ndarray:
        host: np.ndarray = np.array(self).view(np.ndarray)
        return host


class FakeDevice:
    """``cupy.cuda.Device``: a GPU, made the calling thread's current one inside ``with``."""

    def __init__(self, cuda: FakeCuda, gpu: int) -> None:
        self.cuda, self.id, self.outer = cuda, gpu, 0

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> FakeDevice:
        self.outer, self.cuda.local.device = self.cuda.device, self.id
        return self

    def __exit__(self, *exc: object) -> None:
        self.cuda.local.device = self.outer


class FakeCuda:
    """Streams whose launches run in threads; a device with the attributes the test sets."""

    def __init__(self, attributes: dict[str, int]) -> None:
        self.local = threading.local()  # each thread's current stream: ranks may be threads
        self.attributes = attributes
        self.launches: list[tuple[int, float]] = []  # (buffer address, when)
        self.system: list[bool] = []  # per launch: whether its flags are at the system's scope
        # per launch: the kernel's name expression, its spin's pause (ns), its blocks and threads
        self.shapes: list[tuple[str, int, int, int]] = []
        self.opened: list[int] = []  # the addresses IPC handles were opened for
        self.closed: list[int] = []
        self.allocations: dict[int, np.ndarray] = {}  # what cudaMalloc gave, by address
        self.capturing: list[FakeStream] = []  # the stream capturing, and those that joined it
        self.captures = 0
        self.refuse_capture: str | None = None  # set: begin_capture fails with it
        self.current_devices: set[int] = set()  # the caller's GPU at each launch, allocation, IPC call
        self.runtime = types.SimpleNamespace(
            ipcGetMemHandle=self._noted(self.handle),
            ipcOpenMemHandle=self._noted(self.open),
            malloc=self._noted(self.malloc),
            free=self._noted(self.allocations.pop),
            memsetAsync=lambda address, value, nbytes, stream: ctypes.memset(address, value, nbytes),
            ipcCloseMemHandle=self._noted(self.closed.append),
            getDeviceProperties=lambda device: self.attributes,
            getDeviceCount=lambda: 1,
        )

    def Device(self, gpu: int | None = None) -> FakeDevice:  # CuPy's name
        """A GPU (None: the calling thread's current one), current inside ``with``."""
        return FakeDevice(self, self.device if gpu is None else gpu)

    @property
    def device(self) -> int:
        """The calling thread's current GPU (0 until it makes another current)."""
        return int(getattr(self.local, "device", 0))

    def _noted(self, call: Any) -> Any:
        """``call``, noting the caller's current GPU (CUDA runs it on that GPU)."""

        def noted(*args: Any) -> Any:
            self.current_devices.add(self.device)
            return call(*args)

        return noted

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
        """The stream the caller made current (``with stream:``), else the default, which holds no
        work of the stand-in's and never captures."""
        if self.current is not None:
            return self.current
        return types.SimpleNamespace(record=lambda: FakeEvent(), is_capturing=lambda: False)

    def Event(self, disable_timing: bool = False) -> FakeEvent:
        return FakeEvent()

    def get_elapsed_time(self, start: FakeEvent, end: FakeEvent) -> float:
        """Milliseconds between the two events' records (the stand-in's streams run on the host:
        a time on the host's clock, not the kernels' own)."""
        return (end.at - start.at) * 1e3


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


class FakeEvent:
    """What an event waits for: the work on its stream when it was last recorded (threads that
    ran or run it), and, recorded while capturing, the capture (a stream that waits on it joins)."""

    def __init__(
        self, work: list[threading.Thread] | None = None, capture: FakeGraph | None = None, source: int = 0
    ) -> None:
        self.work = work or []
        self.capture = capture
        self.source = source  # the id of the stream it was recorded on
        self.at = time.perf_counter()  # when it was last recorded

    def record(self, stream: Any) -> None:
        recorded = stream.record()
        self.work, self.capture, self.source = recorded.work, recorded.capture, recorded.source
        self.at = time.perf_counter()

    @property
    def done(self) -> bool:
        """Whether the work it waits for has ended (CuPy's ``Event.done``)."""
        return not any(thread.is_alive() for thread in self.work)


class FakeGraph:
    """Launches captured from a stream and the streams it forked to: each a branch whose launches
    run in order; every branch runs at once when the graph is launched."""

    def __init__(self) -> None:
        self.branches: dict[int, list[Any]] = {}  # a stream's id: its launches, in order
        self.forked: set[int] = set()  # the streams that joined the capture
        self.joined: set[int] = set()  # those the capturing stream waited on afterwards

    def launch(self, stream: FakeStream) -> None:
        done: list[threading.Thread] = []
        for launches in self.branches.values():
            before = list(stream.work)
            for target in launches:
                thread = _started(target, before)
                before = [thread]
            done += before
        stream.work = done


class FakeStream:
    """A stream as an order of work: a kernel's thread starts once the work before it on this
    stream (and that it was made to wait for) has ended.  While capturing, launches are recorded
    into a :class:`FakeGraph` instead, and the streams that wait on the capture's events join it;
    a capture that ends with a joined stream not waited on again fails, as CUDA's does."""

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.ptr = id(self)  # CuPy's handle of the stream, as the runtime's calls take it
        self.work: list[threading.Thread] = []
        self.outer: FakeStream | None = None
        self.capture: FakeGraph | None = None

    def __enter__(self) -> FakeStream:
        self.outer, self.cuda.current = self.cuda.current, self
        return self

    def __exit__(self, *exc: object) -> None:
        self.cuda.current = self.outer

    def launch(self, target: Any) -> None:
        if self.capture is not None:
            self.capture.branches.setdefault(id(self), []).append(target)
            return
        self.work = [_started(target, self.work)]

    def record(self) -> FakeEvent:
        return FakeEvent(list(self.work), self.capture, id(self))

    def wait_event(self, event: FakeEvent) -> None:
        if event.capture is not None:
            if self.capture is None:
                self.capture = event.capture
                event.capture.forked.add(id(self))
                self.cuda.capturing.append(self)
            else:
                event.capture.joined.add(event.source)
            return
        self.work = self.work + event.work

    def is_capturing(self) -> bool:
        return self.capture is not None

    def begin_capture(self) -> None:
        if self.cuda.refuse_capture:
            raise RuntimeError(self.cuda.refuse_capture)
        self.capture = FakeGraph()
        self.cuda.capturing.append(self)

    def end_capture(self) -> FakeGraph:
        graph, self.capture = self.capture, None
        assert graph is not None
        for stream in self.cuda.capturing:
            stream.capture = None
        self.cuda.capturing = []
        self.cuda.captures += 1
        unjoined = graph.forked - graph.joined
        if unjoined:
            raise RuntimeError("cudaErrorStreamCaptureUnjoined: a forked stream was not joined")
        return graph

    def synchronize(self) -> None:
        assert self.capture is None, "cudaErrorStreamCaptureUnsupported: synchronized while capturing"
        for t in self.work:
            t.join(120)
            assert not t.is_alive(), "a kernel outlived its own timeout"
        self.work = []


def _started(target: Any, after: list[threading.Thread]) -> threading.Thread:
    """``target`` in a thread of its own that starts once ``after`` have ended."""

    def run() -> None:
        for t in after:
            t.join()
        target()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def fake_cupy(cuda: FakeCuda, library: ctypes.CDLL) -> types.ModuleType:
    module = types.ModuleType("cupy")
    module.ndarray = DeviceArray  # type: ignore[attr-defined]
    module.cuda = cuda  # type: ignore[attr-defined]
    module.uint64 = np.uint64  # type: ignore[attr-defined]

    def raw_module(code: str, options: tuple[str, ...], name_expressions: list[str]) -> Any:
        assert code == SOURCE and len(name_expressions) == 1
        assert options[0] == "--std=c++14" and options[1].startswith("-DSTRAGGLAR_PAUSE_NS=")
        pause_ns = int(options[1].partition("=")[2])
        assert len(options) == 2 and pause_ns in PAUSES_NS, options
        kernel_of = next((d, v) for d in SUMS for v in VECTORS if kernel_name(d, v) == name_expressions[0])
        entry = getattr(library, entry_name(*kernel_of))

        def kernel(grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
            stream = cuda.current
            assert stream is not None, "every rank's kernel goes on a stream of its own"
            cuda.current_devices.add(cuda.device)
            values = [int(a.ctypes.data) if isinstance(a, np.ndarray) and a.ndim else int(a) for a in args]
            own = args[6]  # every rank's buffer: its own is read when the kernel starts

            def run() -> None:
                cuda.launches.append((int(own[int(args[2])]), time.perf_counter()))
                cuda.system.append(bool(args[-1]))
                cuda.shapes.append((name_expressions[0], pause_ns, grid[0], block[0]))
                entry(*values, grid[0], 1)  # one thread a block: the kernel tests run more

            stream.launch(run)

        kernel_object = types.SimpleNamespace(num_regs=40, shared_size_bytes=4)
        return types.SimpleNamespace(get_function=lambda name: _Kernel(kernel, kernel_object))

    module.RawModule = raw_module  # type: ignore[attr-defined]
    module.__dict__.update(__getattr__=lambda name: getattr(np, name))
    module.asarray = lambda a: np.array(a).view(DeviceArray)  # type: ignore[attr-defined]
    module.empty = lambda n, dtype: np.empty(n, dtype).view(DeviceArray)  # type: ignore[attr-defined]
    module.zeros = lambda n, dtype: np.zeros(n, dtype).view(DeviceArray)  # type: ignore[attr-defined]
    module.arange = lambda *a, **k: np.arange(*a, **k).view(DeviceArray)  # type: ignore[attr-defined]
    module.asnumpy = lambda a: np.array(a).view(np.ndarray)  # type: ignore[attr-defined]
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
    registrations, no blocks held on any GPU, and the driver's allocation lookup answered from
    the stand-in's allocations (``cuda``: a stand-in of the caller's making, else one of a device
    with ``attributes``)."""
    from stragglar.runtime.device import group, ipc, loopback, residency, shared, states

    fake = FakeCuda(dict(H200 if attributes is None else attributes)) if cuda is None else cuda
    resident = residency.Residency()  # no test's holds in another's
    monkeypatch.setattr(group, "RESIDENT", resident)
    monkeypatch.setattr(loopback, "RESIDENT", resident)
    surface = Surface()
    monkeypatch.setitem(sys.modules, "cupy", watched(fake_cupy(fake, library), surface))
    monkeypatch.setattr(loopback, "_loopbacks", type(loopback._loopbacks)())
    monkeypatch.setattr(states, "_kept", {})
    monkeypatch.setattr(states, "_broken", [])  # the test's own broken states, let go after it
    monkeypatch.setattr(states, "_broken_buffers", {})
    monkeypatch.setattr(shared, "_registry", {})
    monkeypatch.setattr(shared, "_numbers", {})
    monkeypatch.setattr(ipc, "OPENINGS", ipc.Openings())
    monkeypatch.setattr(shared, "OPENINGS", ipc.OPENINGS)
    monkeypatch.setattr(shared, "allocation_base", fake.base_of)
    yield fake
    surface.check()
