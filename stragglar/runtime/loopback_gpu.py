"""The GPU loopback (every rank's CuPy array in this process) as batched kernels and CUDA graphs.

A round is the stages of :func:`~stragglar.runtime.batched.run_rounds`: two copy kernels that
walk a table of rows (gather into the round buffer, land from it), and for a round that reduces,
a third copy (the receivers' values) and CuPy's own add between the two round buffers, the same
add the interpreter's ``buffer += received`` runs, so results are bit for bit the interpreter's.
The copy kernels move elements as unsigned integers of the dtype's width, so one kernel serves
every dtype; buffers are reached through a device array of pointers written before each call,
so a graph captured once (:mod:`~stragglar.runtime.graphs`) replays on any buffers of the plan's
element count and dtype.

Each :class:`CupyLoopback` owns a stream, the round buffers, the uploaded tables and its graphs;
a call waits for the caller's current stream first and synchronizes at the end (the loopback
returns finished work, as the interpreter does).  They are cached per (schedule, late rank,
element count, dtype, device).  Nothing here runs without a GPU: the stages' order is tested on
NumPy (:class:`~stragglar.runtime.batched.HostBackend`), the graph logic with a CuPy stand-in, and
the kernels' C compiled for the host (tests/fake_cupy.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stragglar.runtime.batched import BatchedPlan, batched_plan, reduced_rows, run_batched, run_rounds
from stragglar.runtime.engine import Array, Timeline, dtype_name
from stragglar.runtime.graphs import Replayer
from stragglar.runtime.plans import cached
from stragglar.runtime.program import Plan

__all__ = ["CupyLoopback", "run_cupy_loopback"]

THREADS = 256
MAX_BLOCKS = 8192  # a grid-stride loop covers the rest

# One row per piece: (rank, start, length, slot); slots are the running sum of lengths, so a
# thread finds its row by binary search over the slot column.
_SOURCE = r"""
__device__ int row_of(const long long* rows, int count, long long element) {
    int lo = 0, hi = count;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (rows[4 * mid + 3] <= element) lo = mid; else hi = mid;
    }
    return lo;
}

template <typename T>
__global__ void from_buffers(const unsigned long long* buffers, const long long* rows, int count,
                             long long total, T* round) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        int r = row_of(rows, count, e);
        const T* source = reinterpret_cast<const T*>(buffers[rows[4 * r]]);
        round[e] = source[rows[4 * r + 1] + (e - rows[4 * r + 3])];
    }
}

template <typename T>
__global__ void into_buffers(const unsigned long long* buffers, const long long* rows, int count,
                             long long total, const T* round) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        int r = row_of(rows, count, e);
        T* target = reinterpret_cast<T*>(buffers[rows[4 * r]]);
        target[rows[4 * r + 1] + (e - rows[4 * r + 3])] = round[e];
    }
}
"""
_WIDTHS = {2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
_modules: dict[int, Any] = {}


def _kernels(cupy: Any, width: int) -> tuple[Any, Any]:
    """The two copy kernels for elements of ``width`` bytes (compiled once per process)."""
    module = _modules.get(width)
    if module is None:
        names = [f"from_buffers<{_WIDTHS[width]}>", f"into_buffers<{_WIDTHS[width]}>"]
        module = cupy.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=names)
        _modules[width] = module
    word = _WIDTHS[width]
    return module.get_function(f"from_buffers<{word}>"), module.get_function(f"into_buffers<{word}>")


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
    """One plan's tables on one device, with the stream, round buffers and graphs to run them."""

    def __init__(self, cupy: Any, plan: BatchedPlan, dtype: Any) -> None:
        self.cupy = cupy
        self.plan = plan
        self.lock = threading.Lock()  # one call at a time: the round buffers are shared
        self.stream = cupy.cuda.Stream(non_blocking=True)
        width = np.dtype(dtype).itemsize
        self.from_buffers, self.into_buffers = _kernels(cupy, width)
        self.received = cupy.empty(plan.scratch, dtype=dtype)
        self.current = cupy.empty(plan.scratch, dtype=dtype)
        words = {2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
        self.received_words, self.current_words = self.received.view(words), self.current.view(words)
        self.pointers = cupy.zeros(plan.num_ranks, dtype=cupy.uint64)
        self.gathers = [_upload(cupy, t.gather) for t in plan.rounds]
        self.fetches = [_upload(cupy, reduced_rows(t)) for t in plan.rounds]
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

    def _launch(self, kernel: Any, rows: _Rows, words: Any) -> None:
        if rows.size:
            blocks = min(MAX_BLOCKS, -(-rows.size // THREADS))
            args = (self.pointers, rows.device, np.int32(rows.count), np.int64(rows.size), words)
            kernel((blocks,), (THREADS,), args)

    def gather(self, index: int) -> None:
        self._launch(self.from_buffers, self.gathers[index], self.received_words)

    def fetch(self, index: int) -> None:
        self._launch(self.from_buffers, self.fetches[index], self.current_words)

    def add(self, index: int) -> None:
        n = self.plan.rounds[index].reduced
        self.cupy.add(self.current[:n], self.received[:n], out=self.received[:n])

    def land(self, index: int) -> None:
        self._launch(self.into_buffers, self.lands[index], self.received_words)


_loopbacks: OrderedDict[Hashable, CupyLoopback] = OrderedDict()
CACHED = 8  # loopbacks kept: each holds two round buffers of the largest round


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
        _loopbacks, key, lambda: CupyLoopback(cupy, batched_plan(plans, late_rank), flats[0].dtype), CACHED
    )
    with loopback.lock:
        loopback.replayer.graphs = graphs
        return run_batched(flats, loopback.plan, loopback, straggler_delay, runner=loopback.replayed)
