"""NVRTC, CUDA's runtime compiler, called through ctypes: it compiles CUDA C++ to PTX on a machine
without a GPU, so the tests can show that the kernels' source compiles as CuPy's ``RawModule``
compiles it on a GPU.  The library comes from the ``nvidia-cuda-nvrtc`` wheel (the test extra, on
Linux x86-64); :func:`library` is None where it is missing."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Compiled", "NvrtcError", "compile_ptx", "library"]


class NvrtcError(Exception):
    """The compiler refused the source; the message is its log."""


@dataclass(frozen=True)
class Compiled:
    ptx: str
    lowered: dict[str, str]  # name expression -> mangled name of the kernel in the PTX


def library() -> ctypes.CDLL | None:
    """libnvrtc from the installed wheel, or None."""
    try:
        import nvidia  # type: ignore[import-untyped]
    except ImportError:
        return None
    for folder in nvidia.__path__:
        for path in sorted(Path(folder).glob("cu*/lib/libnvrtc.so*")):
            if "builtins" not in path.name:
                return ctypes.CDLL(str(path))
    return None


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
