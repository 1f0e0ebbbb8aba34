"""The GPU loopback (every rank's CuPy array in this process) as batched kernels and CUDA graphs.

A round is the two stages of :func:`~stragglar.runtime.batched.run_rounds`, two kernels that walk
a table of rows: one gathers every piece received into the round buffer, the other lands them,
copying, or for a reduction adding the piece to the receiver's value in place.  The gather moves
elements as unsigned integers of the dtype's width (it never looks at a value); the landing adds
in the dtype's own arithmetic, written out here so that it is the interpreter's
``buffer += received`` bit for bit: IEEE addition for float32 and float64, wrapping addition for
the integers, and for float16 and bfloat16 the sum of the two values as float32, rounded to
nearest even (what NumPy and ml_dtypes compute; float32 carries more than twice their precision
plus two bits, so rounding twice equals rounding once, and a native half-precision add gives the
same bits).  The conversions are plain integer code, so the source needs no CUDA header and the
tests compile it for the host (and with NVRTC) as it is.

Buffers are reached through a device array of pointers written before each call, so a graph
captured once (:mod:`~stragglar.runtime.graphs`) replays on any buffers of the plan's element
count and dtype.  Each :class:`CupyLoopback` owns a stream, the round buffer, the uploaded tables
and its graphs; a call waits for the caller's current stream first and synchronizes at the end
(the loopback returns finished work, as the interpreter does).  They are cached per (schedule,
late rank, element count, dtype, device).  Nothing here runs without a GPU: the stages' order is
tested on NumPy (:class:`~stragglar.runtime.batched.HostBackend`), the graph logic with a CuPy
stand-in, the kernels' C compiled for the host with g++ (tests/fake_cupy.py) and to PTX by NVRTC
(tests/nvrtc.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stragglar.runtime.batched import BatchedPlan, batched_plan, run_batched, run_rounds
from stragglar.runtime.engine import Array, Timeline, dtype_name
from stragglar.runtime.graphs import Replayer
from stragglar.runtime.plans import cached
from stragglar.runtime.program import Plan

__all__ = ["CupyLoopback", "run_cupy_loopback"]

THREADS = 256
MAX_BLOCKS = 8192  # a grid-stride loop covers the rest

# One row per piece: (rank, start, length, slot); slots are the running sum of lengths, so a
# thread finds its row by binary search over the slot column.  A sum type names the word that
# holds an element and how two elements add.
_SOURCE = r"""
union Bits32 { float value; unsigned int word; };

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
    __device__ static Word add(Word a, Word b) { return half_of_float(float_of_half(a) + float_of_half(b)); }
};

struct BfloatSum {
    typedef unsigned short Word;
    __device__ static Word add(Word a, Word b) {
        Bits32 x, y;
        x.word = (unsigned int)a << 16;
        y.word = (unsigned int)b << 16;
        return bfloat_of_float(x.value + y.value);
    }
};

struct FloatSum {
    typedef unsigned int Word;
    __device__ static Word add(Word a, Word b) {
        Bits32 x, y;
        x.word = a;
        y.word = b;
        x.value = x.value + y.value;
        return x.word;
    }
};

struct DoubleSum {
    typedef unsigned long long Word;
    __device__ static Word add(Word a, Word b) {
        union { double value; Word word; } x, y;
        x.word = a;
        y.word = b;
        x.value = x.value + y.value;
        return x.word;
    }
};

template <typename W>
struct WrappingSum {  // two's complement: the integers' sum modulo 2^bits, as NumPy's
    typedef W Word;
    __device__ static Word add(Word a, Word b) { return (Word)(a + b); }
};

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
SUMS: dict[str, tuple[str, Any]] = {  # dtype: (its sum type, the word that holds an element)
    "float16": ("HalfSum", np.uint16),
    "bfloat16": ("BfloatSum", np.uint16),
    "float32": ("FloatSum", np.uint32),
    "float64": ("DoubleSum", np.uint64),
    "int32": ("WrappingSum<unsigned int>", np.uint32),
    "int64": ("WrappingSum<unsigned long long>", np.uint64),
}
_modules: dict[str, Any] = {}


def kernel_names(dtype: str) -> tuple[str, str]:
    """The gather and landing kernels of ``dtype``, as NVRTC name expressions."""
    sum_type = SUMS[dtype][0]
    return f"gather<{sum_type} >", f"land<{sum_type} >"


def _kernels(cupy: Any, dtype: str) -> tuple[Any, Any]:
    """The two kernels for ``dtype`` (compiled once per process)."""
    names = kernel_names(dtype)
    module = _modules.get(dtype)
    if module is None:
        module = cupy.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=list(names))
        _modules[dtype] = module
    return module.get_function(names[0]), module.get_function(names[1])


@dataclass(frozen=True)
class _Rows:
    """A table of rows on the device, with how many rows and elements it covers."""

    device: Any
    count: int
    size: int


def _upload(cupy: Any, rows: np.ndarray) -> _Rows:
    size = int(rows[-1, 3] + rows[-1, 2]) if len(rows) else 0  # slots start at 0 and run on
    return _Rows(cupy.asarray(rows), len(rows), size)


class CupyLoopback:
    """One plan's tables on one device, with the stream, round buffer and graphs to run them."""

    def __init__(self, cupy: Any, plan: BatchedPlan, dtype: str) -> None:
        self.cupy = cupy
        self.plan = plan
        self.lock = threading.Lock()  # one call at a time: the round buffer is shared
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.gather_kernel, self.land_kernel = _kernels(cupy, dtype)
        self.received = cupy.empty(plan.scratch, dtype=SUMS[dtype][1])  # the elements' bits
        self.pointers = cupy.zeros(plan.num_ranks, dtype=cupy.uint64)
        self.gathers = [_upload(cupy, t.gather) for t in plan.rounds]
        self.lands = [_upload(cupy, t.land) for t in plan.rounds]
        self.replayer = Replayer(self)

    def replayed(self, plan: BatchedPlan, first: int, stop: int) -> None:
        """Rounds ``first`` to ``stop - 1``, from a graph once one is captured."""
        self.replayer((first, stop), lambda: self.run(plan, first, stop))

    def bind(self, flats: Sequence[Array], plan: BatchedPlan) -> None:
        """Point the kernels at this call's buffers, after the caller's queued work on them."""
        self.stream.wait_event(self.cupy.cuda.get_current_stream().record())
        addresses = np.array([f.data.ptr for f in flats], dtype=np.uint64)
        self.pointers.set(addresses, stream=self.stream)

    def run(self, plan: BatchedPlan, first: int, stop: int) -> None:
        with self.stream:
            run_rounds(plan, first, stop, self)

    def capture(self, work: Callable[[], object]) -> Any:
        self.stream.begin_capture()
        try:
            work()
        finally:
            graph = self.stream.end_capture()
        return graph

    def replay(self, graph: Any) -> None:
        graph.launch(stream=self.stream)

    def sync(self) -> None:
        self.stream.synchronize()

    def _launch(self, kernel: Any, rows: _Rows, *args: Any) -> None:
        if rows.size:
            blocks = min(MAX_BLOCKS, -(-rows.size // THREADS))
            table = (self.pointers, rows.device, np.int32(rows.count), np.int64(rows.size))
            kernel((blocks,), (THREADS,), (*table, *args))

    def gather(self, index: int) -> None:
        self._launch(self.gather_kernel, self.gathers[index], self.received)

    def land(self, index: int) -> None:
        reduced = np.int64(self.plan.rounds[index].reduced)
        self._launch(self.land_kernel, self.lands[index], reduced, self.received)


_loopbacks: OrderedDict[Hashable, CupyLoopback] = OrderedDict()
CACHED = 8  # loopbacks kept: each holds a round buffer of the largest round


def run_cupy_loopback(
    cupy: Any,
    flats: Sequence[Array],
    plans: Sequence[Plan],
    fingerprint: str,
    straggler_delay: float,
    late_rank: int,
    graphs: bool = True,
) -> list[Timeline]:
    """AllReduce CuPy ``flats`` (1-D views, one per rank, one device) in place with batched rounds, from
    CUDA graphs after the first call unless ``graphs`` is False."""
    count, dtype = int(flats[0].shape[0]), dtype_name(flats[0])
    key = (fingerprint, late_rank, count, dtype, int(flats[0].device.id))
    loopback = cached(
        _loopbacks, key, lambda: CupyLoopback(cupy, batched_plan(plans, late_rank), dtype), CACHED
    )
    with loopback.lock:
        loopback.replayer.graphs = graphs
        return run_batched(flats, loopback.plan, loopback, straggler_delay, runner=loopback.replayed)
