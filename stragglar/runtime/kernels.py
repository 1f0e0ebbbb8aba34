"""The CUDA C that moves and adds pieces of buffers, for the GPU paths that launch their own kernels.

Two kernels walk a table of rows ``(buffer, start, length, slot)``, one row per piece: ``gather``
copies each piece from ``buffers[buffer] + start`` to ``slot`` of a contiguous array, ``land``
copies it back to its place, or, for the slots below ``reduced``, adds it to the value there in
place.  The loopback (:mod:`~stragglar.runtime.loopback_gpu`) runs a round of every rank as one
gather and one landing; the CuPy/NCCL transport (:mod:`~stragglar.runtime.cupy_nccl`) packs a
message of several chunks with one gather and lands it with one landing, instead of a copy or an
add per chunk.

The gather moves elements as unsigned integers of the dtype's width (it never looks at a value);
the landing adds in the dtype's own arithmetic, written out here so that it is the interpreter's
``buffer += received`` bit for bit: IEEE addition for float32 and float64, wrapping addition for
the integers, and for float16 and bfloat16 the sum of the two values as float32, rounded to
nearest even (what NumPy and ml_dtypes compute; float32 carries more than twice their precision
plus two bits, so rounding twice equals rounding once, and a native half-precision add gives the
same bits).  Every float32 add (of float32, bfloat16 and float16 alike) is IEEE's written in PTX:
CuPy compiles with ``-ftz=true``, under which a plain ``+`` flushes subnormals (bfloat16's are
float32's) to zero.  The conversions are plain integer code, so the source needs no CUDA header and the
tests compile it for the host with g++ (tests/fake_cupy.py) and to PTX with NVRTC (tests/nvrtc.py).

Buffers are reached through a device array of pointers, so a kernel captured in a CUDA graph
reads its buffers' addresses when it runs, not when it was captured.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from stragglar.runtime.arrays import dtype_name

__all__ = [
    "SOURCE",
    "SUMS",
    "SUM_SOURCE",
    "Kernels",
    "Rows",
    "kernel_names",
    "kernels",
    "launch",
    "upload",
    "words",
]

THREADS = 256
MAX_BLOCKS = 8192  # a grid-stride loop covers the rest

# A sum type names the word that holds an element and how two elements add (the device
# executor's kernel adds with them too: :mod:`stragglar.runtime.device.kernel_source`).
SUM_SOURCE = r"""
union Bits32 { float value; unsigned int word; };

// CuPy compiles every kernel with -ftz=true, under which a float add flushes subnormal operands
// and sums to zero; NumPy's (the interpreter's) does not, so each float add is IEEE's, in PTX.
__device__ float ieee_add(float a, float b) {
#ifdef __CUDA_ARCH__
    float sum;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(sum) : "f"(a), "f"(b));
    return sum;
#else
    return a + b;
#endif
}

__device__ float float_of_half(unsigned short h) {
    Bits32 b;
    unsigned int sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) {  // infinity or NaN
        b.word = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        b.word = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else {  // zero or subnormal: mantissa * 2^-24, exact in float
        b.value = (float)mantissa * 5.9604644775390625e-8f;
        b.word |= sign;
    }
    return b.value;
}

__device__ unsigned short rounded(unsigned int kept, unsigned int rest, unsigned int half) {
    return (unsigned short)(kept + (rest > half || (rest == half && (kept & 1u))));  // to even
}

__device__ unsigned short half_of_float(float value) {
    Bits32 b;
    b.value = value;
    unsigned int sign = (b.word >> 16) & 0x8000u, magnitude = b.word & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // 65520 and up: infinity
    if (magnitude <= 0x33000000u) return (unsigned short)sign;  // 2^-25 and below: zero
    if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal, in units of 2^-24
        unsigned int mantissa = (magnitude & 0x7fffffu) | 0x800000u, shift = 126u - (magnitude >> 23);
        return (unsigned short)(sign | rounded(mantissa >> shift, mantissa & ((1u << shift) - 1u),
                                               1u << (shift - 1u)));
    }
    unsigned int rebiased = magnitude - 0x38000000u;  // exponent bias 127 -> 15
    return (unsigned short)(sign | rounded(rebiased >> 13, rebiased & 0x1fffu, 0x1000u));
}

__device__ unsigned short bfloat_of_float(float value) {
    Bits32 b;
    b.value = value;
    if ((b.word & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((b.word >> 16) | 0x40u);
    return (unsigned short)((b.word + 0x7fffu + ((b.word >> 16) & 1u)) >> 16);
}

struct HalfSum {
    typedef unsigned short Word;
    __device__ static Word add(Word a, Word b) {
        return half_of_float(ieee_add(float_of_half(a), float_of_half(b)));
    }
};

struct BfloatSum {
    typedef unsigned short Word;
    __device__ static Word add(Word a, Word b) {
        Bits32 x, y;
        x.word = (unsigned int)a << 16;
        y.word = (unsigned int)b << 16;
        return bfloat_of_float(ieee_add(x.value, y.value));
    }
};

struct FloatSum {
    typedef unsigned int Word;
    __device__ static Word add(Word a, Word b) {
        Bits32 x, y;
        x.word = a;
        y.word = b;
        x.value = ieee_add(x.value, y.value);
        return x.word;
    }
};

struct DoubleSum {
    typedef unsigned long long Word;
    __device__ static Word add(Word a, Word b) {
        union { double value; Word word; } x, y;
        x.word = a;
        y.word = b;
        x.value = x.value + y.value;  // -ftz=true leaves doubles alone
        return x.word;
    }
};

template <typename W>
struct WrappingSum {  // two's complement: the integers' sum modulo 2^bits, as NumPy's
    typedef W Word;
    __device__ static Word add(Word a, Word b) { return (Word)(a + b); }
};

"""
# One row per piece: (buffer, start, length, slot); slots are the running sum of lengths, so a
# thread finds its row by binary search over the slot column.
SOURCE = (
    SUM_SOURCE
    + r"""
__device__ int row_of(const long long* rows, int count, long long element) {
    int lo = 0, hi = count;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (rows[4 * mid + 3] <= element) lo = mid; else hi = mid;
    }
    return lo;
}

template <typename Sum>
__global__ void gather(const unsigned long long* buffers, const long long* rows, int count,
                       long long total, typename Sum::Word* round) {
    typedef typename Sum::Word Word;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        int r = row_of(rows, count, e);
        const Word* source = reinterpret_cast<const Word*>(buffers[rows[4 * r]]);
        round[e] = source[rows[4 * r + 1] + (e - rows[4 * r + 3])];
    }
}

template <typename Sum>
__global__ void land(const unsigned long long* buffers, const long long* rows, int count,
                     long long total, long long reduced, const typename Sum::Word* round) {
    typedef typename Sum::Word Word;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        int r = row_of(rows, count, e);
        Word* target = reinterpret_cast<Word*>(buffers[rows[4 * r]]);
        target += rows[4 * r + 1] + (e - rows[4 * r + 3]);
        *target = e < reduced ? Sum::add(*target, round[e]) : round[e];
    }
}
"""
)
SUMS: dict[str, tuple[str, Any]] = {  # dtype: (its sum type, the word that holds an element)
    "float16": ("HalfSum", np.uint16),
    "bfloat16": ("BfloatSum", np.uint16),
    "float32": ("FloatSum", np.uint32),
    "float64": ("DoubleSum", np.uint64),
    "int32": ("WrappingSum<unsigned int>", np.uint32),
    "int64": ("WrappingSum<unsigned long long>", np.uint64),
}
_modules: dict[str, Any] = {}
_compiling = threading.Lock()


def kernel_names(dtype: str) -> tuple[str, str]:
    """The gather and landing kernels of ``dtype``, as NVRTC name expressions."""
    sum_type = SUMS[dtype][0]
    return f"gather<{sum_type} >", f"land<{sum_type} >"


@dataclass(frozen=True)
class Kernels:
    """The two compiled kernels of one dtype."""

    gather: Any
    land: Any


def kernels(cupy: Any, dtype: str) -> Kernels:
    """The kernels for ``dtype`` (a key of :data:`SUMS`), compiled once per process."""
    names = kernel_names(dtype)
    with _compiling:  # ranks in threads start together: one compiles, the others wait for it
        module = _modules.get(dtype)
        if module is None:
            module = cupy.RawModule(code=SOURCE, options=("--std=c++14",), name_expressions=list(names))
            _modules[dtype] = module
    return Kernels(module.get_function(names[0]), module.get_function(names[1]))


@dataclass(frozen=True)
class Rows:
    """A table of rows on the device, with how many rows and elements it covers."""

    device: Any
    count: int
    size: int


def upload(cupy: Any, rows: np.ndarray) -> Rows:
    """``rows`` (int64, one row per piece, slots from 0 in order) copied to the device."""
    size = int(rows[-1, 3] + rows[-1, 2]) if len(rows) else 0  # slots start at 0 and run on
    return Rows(cupy.asarray(rows), len(rows), size)


def words(array: Any) -> Any:
    """``array``'s elements as the unsigned words the kernels move (the same bytes)."""
    return array.view(SUMS[dtype_name(array)][1])


def launch(kernel: Any, pointers: Any, rows: Rows, *args: Any) -> None:
    """``kernel`` over ``rows`` on the current stream (nothing for a table of no elements):
    ``pointers`` is the device array of buffer addresses the rows' first column indexes."""
    if rows.size:
        blocks = min(MAX_BLOCKS, -(-rows.size // THREADS))
        table = (pointers, rows.device, np.int32(rows.count), np.int64(rows.size))
        kernel((blocks,), (THREADS,), (*table, *args))
