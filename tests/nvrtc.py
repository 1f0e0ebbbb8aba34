"""NVRTC, CUDA's runtime compiler, called through ctypes: it compiles CUDA C++ to PTX on a machine
without a GPU, so the tests can show that the kernels' source compiles as CuPy's ``RawModule``
compiles it on a GPU.  The library comes from the ``nvidia-cuda-nvrtc`` wheel (the test extra, on
Linux x86-64); :func:`library` is None where it is missing.  ``ptxas``, the assembler the driver
runs on that PTX when a module loads, comes from the ``nvidia-cuda-nvcc`` wheel: what it reports
of each kernel (registers, spills) is what decides whether a block of it can launch."""

from __future__ import annotations

import ctypes
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CUPY_ADDS", "Assembled", "Compiled", "NvrtcError", "assemble", "compile_ptx", "library", "ptxas"]

# What CuPy appends to every NVRTC compile's options (cupy/cuda/compiler.py), after the caller's:
# so a kernel is compiled here as it will be on the GPU's machine.
CUPY_ADDS = ("-ftz=true",)


class NvrtcError(Exception):
    """The compiler refused the source; the message is its log."""


@dataclass(frozen=True)
class Compiled:
    ptx: str
    lowered: dict[str, str]  # name expression -> mangled name of the kernel in the PTX


@dataclass(frozen=True)
class Assembled:
    """What ptxas reports of one kernel."""

    registers: int  # a thread's
    spilled: int  # bytes of spill stores and loads: registers it had to keep in memory instead
    shared: int  # bytes of shared memory a block


def _wheel_files(pattern: str) -> list[Path]:
    """Files of the installed ``nvidia-*`` wheels matching ``pattern`` (under ``nvidia/``)."""
    try:
        import nvidia  # type: ignore[import-untyped]
    except ImportError:
        return []
    return [path for folder in nvidia.__path__ for path in sorted(Path(folder).glob(pattern))]


def library() -> ctypes.CDLL | None:
    """libnvrtc from the installed wheel, or None."""
    for path in _wheel_files("cu*/lib/libnvrtc.so*"):
        if "builtins" not in path.name:
            return ctypes.CDLL(str(path))
    return None


def ptxas() -> Path | None:
    """ptxas from the installed wheel, or None."""
    return next(iter(_wheel_files("cu*/bin/ptxas")), None)


def assemble(assembler: Path, ptx: str, arch: str, folder: Path) -> dict[str, Assembled]:
    """``ptx`` assembled for ``arch`` (``sm_90``: Hopper) in ``folder``: per kernel (its mangled
    name), what ptxas reports of it."""
    source, target = folder / "kernels.ptx", folder / "kernels.cubin"
    source.write_text(ptx)
    done = subprocess.run(
        [str(assembler), f"-arch={arch}", "-v", str(source), "-o", str(target)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise NvrtcError(done.stderr.strip())
    found: dict[str, Assembled] = {}
    for name, body in re.findall(
        r"entry function '(\w+)' for '\w+'\n(.*?)(?=entry function|\Z)", done.stderr, re.S
    ):
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", body)
        registers = re.search(r"Used (\d+) registers", body)
        shared = re.search(r"(\d+) bytes smem", body)
        assert spills and registers, body
        found[name] = Assembled(
            int(registers.group(1)),
            int(spills.group(1)) + int(spills.group(2)),
            int(shared.group(1)) if shared else 0,
        )
    return found


def compile_ptx(nvrtc: ctypes.CDLL, source: str, names: list[str], options: list[str]) -> Compiled:
    """``source`` compiled with ``options``, with the kernels ``names`` (name expressions) lowered."""
    program = ctypes.c_void_p()
    created = nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernels.cu", 0, None, None)
    _check(nvrtc, created)
    try:
        for name in names:
            _check(nvrtc, nvrtc.nvrtcAddNameExpression(program, name.encode()))
        flags = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        if nvrtc.nvrtcCompileProgram(program, len(options), flags) != 0:
            raise NvrtcError(_text(nvrtc, program, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog))
        lowered = {}
        for name in names:
            mangled = ctypes.c_char_p()
            _check(nvrtc, nvrtc.nvrtcGetLoweredName(program, name.encode(), ctypes.byref(mangled)))
            lowered[name] = (mangled.value or b"").decode()
        ptx = _text(nvrtc, program, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        return Compiled(ptx, lowered)
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


def _text(nvrtc: ctypes.CDLL, program: ctypes.c_void_p, size_of: object, read: object) -> str:
    size = ctypes.c_size_t()
    _check(nvrtc, size_of(program, ctypes.byref(size)))  # type: ignore[operator]
    text = ctypes.create_string_buffer(size.value)
    _check(nvrtc, read(program, text))  # type: ignore[operator]
    return text.value.decode()


def _check(nvrtc: ctypes.CDLL, result: int) -> None:
    if result != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise NvrtcError(nvrtc.nvrtcGetErrorString(result).decode())
