"""The GPU loopback's CUDA source on a machine without a GPU: NVRTC compiles it as CuPy compiles
it on a GPU, and its landing adds bit for bit as the interpreter's ``buffer += received`` (NumPy;
torch for bfloat16, which NumPy lacks), the source compiled for the host with g++."""

from __future__ import annotations

import ctypes
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from fake_cupy import compiled, entry_name, host_source
from nvrtc import CUPY_ADDS, compile_ptx, library

from stragglar.runtime.kernels import SOURCE, SUMS, kernel_names

NAMES = [name for dtype in SUMS for name in kernel_names(dtype)]
COPIES = 997  # the last elements of a landing are copies, not sums


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to compile the CUDA source for the host")
    return compiled(host_source(SOURCE, NAMES), Path(tmp_path_factory.mktemp("kernels")))


def landed(host: ctypes.CDLL, dtype: str, target: np.ndarray, received: np.ndarray) -> np.ndarray:
    """``target`` after the landing kernel of ``dtype`` ran over it as one row (every thread of
    the grid in turn): the first elements added to ``received``'s, the last :data:`COPIES` copied."""
    out: np.ndarray = target.copy()
    entry = getattr(host, entry_name(kernel_names(dtype)[1]))
    entry.restype = None
    pointers = np.array([out.ctypes.data], dtype=np.uint64)
    rows = np.array([[0, 0, out.shape[0], 0]], dtype=np.int64)
    entry(
        ctypes.c_void_p(pointers.ctypes.data),
        ctypes.c_void_p(rows.ctypes.data),
        ctypes.c_int(1),
        ctypes.c_longlong(out.shape[0]),
        ctypes.c_longlong(out.shape[0] - COPIES),
        ctypes.c_void_p(received.ctypes.data),
        ctypes.c_uint(min(8192, -(-out.shape[0] // 256))),
        ctypes.c_uint(256),
    )
    return out


def same_bits(got: np.ndarray, want: np.ndarray, dtype: str) -> np.ndarray:
    """Where ``got`` equals ``want`` bit for bit; any NaN equals any NaN (payloads are the
    hardware's choice)."""
    equal: np.ndarray = got == want
    if dtype.startswith("int"):
        return equal
    nan: np.ndarray = np.isnan(as_float(got, dtype)) & np.isnan(as_float(want, dtype))
    agree: np.ndarray = equal | nan
    return agree


def as_float(words: np.ndarray, dtype: str) -> np.ndarray:
    wide: np.ndarray = words.astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32) if dtype == "bfloat16" else words.view(dtype)  # bfloat16: a float32's top


def operands(bits: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of element bit patterns: for 16 bits every pattern against shuffles of them all, itself
    (doubling) and its negation (cancelling to zero); for 32 and 64 bits random patterns (NaN,
    infinities and subnormals included), near-cancelling pairs and pairs of subnormals."""
    rng = np.random.default_rng(seed)
    word = {16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]
    sign = word(1) << word(bits - 1)
    if bits == 16:
        every = np.arange(1 << 16, dtype=np.uint32).astype(word)
        a = np.tile(every, 7)
        b = np.concatenate([*(rng.permutation(every) for _ in range(5)), every, every ^ sign])
        return a, b
    info = np.iinfo(word)
    a = rng.integers(0, info.max, 1 << 19, dtype=word, endpoint=True)
    b = rng.integers(0, info.max, 1 << 19, dtype=word, endpoint=True)
    as_float = {32: np.float32, 64: np.float64}[bits]
    near = rng.standard_normal(1 << 16).astype(as_float)
    across = (-near * (1 + rng.standard_normal(1 << 16) * 1e-6)).astype(as_float)
    subnormal = (word(1) << word(23 if bits == 32 else 52)) - word(1)
    small = rng.integers(0, subnormal, 1 << 16, dtype=word) | (rng.integers(0, 2, 1 << 16, dtype=word) * sign)
    smaller = rng.integers(0, subnormal, 1 << 16, dtype=word)
    return np.concatenate([a, near.view(word), small]), np.concatenate([b, across.view(word), smaller])


def interpreted(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """The interpreter's ``buffer += received`` on these bits: NumPy's, torch's for bfloat16."""
    if dtype == "bfloat16":
        return torch_sum(a, b)
    values = a.view(dtype).copy()
    with np.errstate(over="ignore", invalid="ignore"):
        values += b.view(dtype)  # the interpreter's buffer += received
    words: np.ndarray = values.view(a.dtype)
    return words


def torch_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    y = torch.from_numpy(b.view(np.int16).copy()).view(torch.bfloat16)
    x += y
    words: np.ndarray = x.view(torch.int16).numpy().view(np.uint16)
    return words


@pytest.mark.parametrize("dtype", list(SUMS))
def test_the_landing_adds_as_the_interpreter_bit_for_bit(host: ctypes.CDLL, dtype: str) -> None:
    """Every float16/bfloat16 pattern against every other (in shuffles), random float32/float64
    patterns with ties, overflow, cancellation and subnormals; the integers wrap as NumPy's."""
    a, b = operands(8 * SUMS[dtype][1]().itemsize, seed=len(dtype))
    got = landed(host, dtype, a, b)
    want = np.concatenate([interpreted(a, b, dtype)[:-COPIES], b[-COPIES:]])
    wrong = np.flatnonzero(~same_bits(got, want, dtype))
    first = wrong[0] if wrong.size else 0
    assert not wrong.size, (
        f"{wrong.size} sums differ, first {a[first]:#x} + {b[first]:#x}: "
        f"{got[first]:#x}, want {want[first]:#x}"
    )


nvrtc = library()


@pytest.mark.skipif(nvrtc is None, reason="needs NVRTC (the nvidia-cuda-nvrtc wheel of the test extra)")
@pytest.mark.parametrize("arch", ["compute_75", "compute_80", "compute_90"])
def test_the_kernels_compile_with_nvrtc_as_cupy_compiles_them(arch: str) -> None:
    """CuPy's RawModule hands the source, its options and the name expressions to NVRTC on the
    GPU's machine, with ``-ftz=true`` added; here NVRTC compiles them so for a GPU of each
    generation we expect to meet.  The adds in the PTX are IEEE adds (no flush of subnormals to
    zero), as the host tests assume: under CuPy's flag a plain ``+`` of floats was ``add.ftz.f32``,
    which flushed float32 and bfloat16 subnormals that NumPy keeps."""
    assert nvrtc is not None
    result = compile_ptx(nvrtc, SOURCE, NAMES, ["--std=c++14", f"-arch={arch}", *CUPY_ADDS])
    for name in NAMES:
        assert f".entry {result.lowered[name]}(" in result.ptx, name
    adds = re.findall(r"\badd(?:\.[a-z0-9]+)*\.f(?:32|64)\b", result.ptx)
    assert "add.rn.f32" in adds and any(a.endswith(".f64") for a in adds), adds
    assert not [a for a in adds if ".ftz" in a], adds
