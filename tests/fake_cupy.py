"""A stand-in for CuPy that keeps arrays in host memory and follows CUDA's rules where they matter:
kernels read buffers through the device pointers they are given, a launch on a capturing stream
is recorded, not run, and a graph replays exactly what was recorded.  So a host-side shortcut
taken during capture, a pointer table not refreshed between calls, or a stage out of order gives
wrong sums here, as it would on a GPU.  Install it with :func:`installed`."""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cupy_surface import Surface, watched


class FakeArray(np.ndarray):
    """A "device" array: host memory with CuPy's ``data.ptr``, ``device`` and ``set``."""

    @property
    def data(self) -> Any:
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    @property
    def device(self) -> Any:
        return types.SimpleNamespace(id=0)

    def set(self, arr: np.ndarray, stream: Any = None) -> None:  # CuPy's names
        self[...] = arr


class FakeCuda:
    """Streams that record launches while capturing; counts what ran and how."""

    def __init__(self) -> None:
        self.current: FakeStream | None = None
        self.launched = 0  # kernels and adds run eagerly
        self.replays = 0
        self.captures = 0
        self.refuse_capture: str | None = None

    def Stream(self, non_blocking: bool = False) -> FakeStream:
        return FakeStream(self)

    def get_current_stream(self) -> Any:
        return types.SimpleNamespace(record=lambda: "event")

    def Event(self, disable_timing: bool = False) -> FakeEvent:
        return FakeEvent()

    def get_elapsed_time(self, start: FakeEvent, end: FakeEvent) -> float:
        """Milliseconds between the events' records: the stand-in runs work as it is launched."""
        return (end.at - start.at) * 1e3

    def recording(self) -> list[Callable[[], None]] | None:
        """Where a launch is recorded: the current stream's capture (None: it runs now)."""
        return self.current.recording if self.current is not None else None

    def launch(self, work: Callable[[], None]) -> None:
        recording = self.recording()
        if recording is not None:
            recording.append(work)
        else:
            self.launched += 1
            work()


class FakeEvent:
    """An event that keeps when it was last recorded."""

    def __init__(self) -> None:
        self.at = time.perf_counter()

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()


class FakeStream:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.recording: list[Callable[[], None]] | None = None
        self.outer: FakeStream | None = None

    def __enter__(self) -> FakeStream:
        self.outer, self.cuda.current = self.cuda.current, self
        return self

    def __exit__(self, *exc: object) -> None:
        self.cuda.current = self.outer

    def wait_event(self, event: object) -> None:
        pass

    def begin_capture(self) -> None:
        if self.cuda.refuse_capture:
            raise RuntimeError(self.cuda.refuse_capture)
        self.recording = []

    def end_capture(self) -> Any:
        recorded, self.recording = self.recording or [], None
        self.cuda.captures += 1
        return types.SimpleNamespace(launch=lambda stream: self._replay(recorded))

    def _replay(self, recorded: list[Callable[[], None]]) -> None:
        self.cuda.replays += 1
        for work in recorded:
            work()

    def synchronize(self) -> None:
        pass


def _memory(pointer: int, dtype: np.dtype[Any], count: int) -> np.ndarray:
    """``count`` elements at a raw address, as a kernel would see them."""
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(pointer)
    return np.frombuffer(memoryview(raw), dtype=dtype)


# What the sum types of the kernels' source add as (bfloat16 has no NumPy type: the model refuses it).
_MODEL_DTYPES = {
    "HalfSum": np.float16,
    "FloatSum": np.float32,
    "DoubleSum": np.float64,
    "WrappingSum<unsigned int>": np.int32,
    "WrappingSum<unsigned long long>": np.int64,
}


def _parse(expression: str) -> tuple[str, str]:
    """``land<FloatSum >`` -> ("land", "FloatSum")."""
    name, sum_type = expression.split("<", 1)
    return name, sum_type[:-1].strip()


def _kernel(cuda: FakeCuda, expression: str) -> Callable[..., None]:
    """The kernels' contract: row (rank, start, length, slot) moves ``length`` elements between
    ``buffers[rank] + start`` and ``round + slot``; landing adds the slots below ``reduced``."""
    name, sum_type = _parse(expression)
    dtype = np.dtype(_MODEL_DTYPES[sum_type])

    def kernel(grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
        pointers, rows, count, size, *rest = args
        words = rest[-1]
        assert int(count) == len(rows) and int(size) == int(rows[-1, 2] + rows[-1, 3])
        assert words.dtype.itemsize == dtype.itemsize and words.dtype.kind == "u"

        def work() -> None:
            values = words.view(dtype)
            for rank, start, length, slot in rows.tolist():
                memory = _memory(int(pointers[rank]), dtype, start + length)
                if name == "gather":
                    values[slot : slot + length] = memory[start : start + length]
                elif slot < int(rest[0]):
                    memory[start : start + length] += values[slot : slot + length]
                else:
                    memory[start : start + length] = values[slot : slot + length]

        cuda.launch(work)

    return kernel


# The CUDA C, compiled for the host: CUDA's qualifiers and thread indices stubbed, and every
# thread of the grid run in turn (the kernels' threads write disjoint elements).
_HOST_PRELUDE = """
#define __global__
#define __device__
struct Index { unsigned x, y, z; };
static Index blockIdx, blockDim, gridDim, threadIdx;
"""
_HOST_LAUNCH = """
extern "C" void {entry}(const unsigned long long* buffers, const long long* rows, int count,
                        long long total, long long reduced, void* round, unsigned grid, unsigned block) {{
    typedef {sum_type}::Word Word;
    gridDim.x = grid; blockDim.x = block;
    for (unsigned b = 0; b < grid; ++b)
        for (unsigned t = 0; t < block; ++t) {{
            blockIdx.x = b; threadIdx.x = t;
            {call};
        }}
}}
"""
_HOST_CALLS = {
    "gather": "gather<{sum_type} >(buffers, rows, count, total, static_cast<Word*>(round))",
    "land": "land<{sum_type} >(buffers, rows, count, total, reduced, static_cast<const Word*>(round))",
}


def entry_name(expression: str) -> str:
    """A C name for a kernel's host entry point."""
    return "host_" + "".join(c if c.isalnum() else "_" for c in expression)


def host_source(code: str, name_expressions: list[str]) -> str:
    """``code`` for g++: the prelude, then a host entry point per kernel named."""
    launches = []
    for expression in name_expressions:
        name, sum_type = _parse(expression)
        call = _HOST_CALLS[name].format(sum_type=sum_type)
        launches.append(_HOST_LAUNCH.format(entry=entry_name(expression), sum_type=sum_type, call=call))
    return _HOST_PRELUDE + code + "".join(launches)


def compiled(source: str, folder: Path) -> ctypes.CDLL:
    """``source`` (C++ for the host) built as a shared library in ``folder`` and loaded (named by
    the source's hash: the loader would hand back an earlier library loaded from the same path)."""
    name = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = folder / f"kernels-{name}.cpp"
    path.write_text(source)
    library = folder / f"kernels-{name}.so"
    subprocess.run(
        ["g++", "-std=c++14", "-O1", "-shared", "-fPIC", "-o", str(library), str(path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return ctypes.CDLL(str(library))


def _host_kernel(cuda: FakeCuda, library: ctypes.CDLL, expression: str) -> Callable[..., None]:
    """A kernel of the CUDA source, compiled for the host, launched as CuPy would launch it."""
    entry = getattr(library, entry_name(expression))
    entry.restype = None
    landing = _parse(expression)[0] == "land"

    def kernel(grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
        pointers, rows, count, size, *rest = args
        words = rest[-1]
        reduced = int(rest[0]) if landing else 0
        assert len(rest) == (2 if landing else 1) and words.dtype.kind == "u"
        assert rows.dtype == np.int64 and rows.flags.c_contiguous

        def work() -> None:
            entry(
                ctypes.c_void_p(pointers.ctypes.data),
                ctypes.c_void_p(rows.ctypes.data),
                ctypes.c_int(int(count)),
                ctypes.c_longlong(int(size)),
                ctypes.c_longlong(reduced),
                ctypes.c_void_p(words.ctypes.data),
                ctypes.c_uint(grid[0]),
                ctypes.c_uint(block[0]),
            )

        cuda.launch(work)

    return kernel


def fake_cupy(cuda: FakeCuda, compile_in: Path | None = None) -> types.ModuleType:
    """The stand-in; with ``compile_in`` (a folder) its kernels are the CUDA source itself,
    compiled for the host with g++, instead of a Python model of what they do."""
    module = types.ModuleType("cupy")
    module.ndarray = FakeArray  # type: ignore[attr-defined]
    module.cuda = cuda  # type: ignore[attr-defined]
    module.uint64 = np.uint64  # type: ignore[attr-defined]

    def raw_module(code: str, options: tuple[str, ...], name_expressions: list[str]) -> Any:
        assert options == ("--std=c++14",) and len(name_expressions) == 2
        if compile_in is None:
            kernels = {name: _kernel(cuda, name) for name in name_expressions}
        else:
            library = compiled(host_source(code, name_expressions), compile_in)
            kernels = {name: _host_kernel(cuda, library, name) for name in name_expressions}
        return types.SimpleNamespace(get_function=lambda name: kernels[name])

    module.RawModule = raw_module  # type: ignore[attr-defined]
    module.__dict__.update(__getattr__=lambda name: getattr(np, name))  # the rest: NumPy's
    module.asarray = lambda a: np.array(a).view(FakeArray)  # type: ignore[attr-defined]  # a copy, as to a device
    module.empty = lambda n, dtype: np.empty(n, dtype).view(FakeArray)  # type: ignore[attr-defined]
    module.zeros = lambda n, dtype: np.zeros(n, dtype).view(FakeArray)  # type: ignore[attr-defined]
    return module


def installed(monkeypatch: pytest.MonkeyPatch, compile_in: Path | None = None) -> Iterator[FakeCuda]:
    """Put the stand-in in ``sys.modules["cupy"]`` with empty kernel and loopback caches
    (``compile_in``: see :func:`fake_cupy`)."""
    from stragglar.runtime import kernels, loopback_gpu

    fake, surface = FakeCuda(), Surface()
    monkeypatch.setitem(sys.modules, "cupy", watched(fake_cupy(fake, compile_in), surface))
    monkeypatch.setattr(kernels, "_modules", {})
    monkeypatch.setattr(loopback_gpu, "_loopbacks", type(loopback_gpu._loopbacks)())
    yield fake
    surface.check()
