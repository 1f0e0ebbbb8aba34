"""``stragglar run``: time a schedule on real buffers against the engine's own AllReduce.

Every rank fills distinct per-rank, per-element integers (exact in every dtype, so any misplaced or
doubled chunk shows), the result is compared with a NumPy reference after every iteration, and a
mismatch raises: no figure is reported for a wrong result.  Each iteration the straggler arrives
``delay`` seconds late, both for the schedule and for the baseline (the engine's all_reduce, or
for in-process runs a sum of the buffers), so the figures compare like with like.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stragglar.runtime.engine import DTYPES, Timeline
from stragglar.schedule import Schedule

__all__ = ["BACKENDS", "BenchmarkResult", "expected", "payload", "run_benchmark"]

BACKENDS = ("local", "torch", "cupy")
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}
_EXACT = {"float16": 2**11, "bfloat16": 2**8}  # largest integers every partial sum stays exact at


@dataclass(frozen=True)
class BenchmarkResult:
    """Per-iteration seconds (slowest rank, from the common start to its last round).
    ``hidden`` is when the punctual ranks finished the phases without the straggler."""

    backend: str
    algorithm: str
    num_ranks: int
    dtype: str
    count: int
    delay: float
    times: tuple[float, ...]
    hidden: tuple[float, ...]
    baseline: str
    baseline_times: tuple[float, ...]

    @property
    def size_bytes(self) -> int:
        return self.count * _ITEMSIZE[self.dtype]

    @property
    def time(self) -> float:
        return statistics.median(self.times)

    @property
    def baseline_time(self) -> float:
        return statistics.median(self.baseline_times)

    @property
    def algbw(self) -> float:
        """Algorithm bandwidth, bytes per second: buffer size over time."""
        return self.size_bytes / self.time

    @property
    def baseline_algbw(self) -> float:
        return self.size_bytes / self.baseline_time

    def report(self) -> str:
        """A few lines for the terminal."""
        mib, gb = self.size_bytes / 2**20, 1e9
        hidden = (
            f"  (hidden phase done at {statistics.median(self.hidden) * 1e3:.2f} ms)" if self.hidden else ""
        )
        rows = (
            (self.algorithm, self.time, self.algbw),
            (self.baseline, self.baseline_time, self.baseline_algbw),
        )
        return "\n".join(
            [
                f"{self.algorithm} on {self.backend}: {self.num_ranks} ranks, {mib:.2f} MiB {self.dtype}, "
                f"straggler delay {self.delay * 1e3:g} ms, {len(self.times)} iterations (median), "
                "results checked",
                *(f"  {name:<18} {t * 1e3:10.3f} ms/iter  {bw / gb:8.3f} GB/s" for name, t, bw in rows),
                f"  speed-up {self.baseline_time / self.time:.2f}x{hidden}",
            ]
        )


def payload(rank: int, count: int, num_ranks: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input as int64: differs per rank and per element, and sums exactly in ``dtype``."""
    limit = _EXACT.get(dtype, 2**24) // num_ranks
    return (np.arange(count, dtype=np.int64) * 1_000_003 + rank * 7_919 + 1) % limit


def expected(count: int, num_ranks: int, dtype: str) -> np.ndarray:
    """The exact AllReduce of every rank's :func:`payload`, as int64."""
    total = np.zeros(count, np.int64)
    for r in range(num_ranks):
        total += payload(r, count, num_ranks, dtype)
    return total


CHECK_BLOCK = 1 << 22  # elements compared at a time: checking a 1 GiB buffer needs no full-size copy


def check(
    result: Any, want: np.ndarray, rank: int, what: str, host: Callable[[Any], Any] = np.asarray
) -> None:
    """Raise unless ``result`` equals the reference exactly.

    ``result`` is any sliceable 1-D array (NumPy, CuPy, torch); ``host`` brings one block of it to
    NumPy.  Blocks keep the extra memory small, so 8 ranks can check 256 MiB buffers side by side.
    """
    wrong, first = 0, None
    for lo in range(0, want.size, CHECK_BLOCK):
        got = np.asarray(host(result[lo : lo + CHECK_BLOCK]), dtype=np.float64)
        bad = np.flatnonzero(got != want[lo : lo + CHECK_BLOCK])
        if bad.size and first is None:
            first = (lo + int(bad[0]), got[bad[0]])
        wrong += bad.size
    if first is not None:
        i, value = first
        raise AssertionError(
            f"{what}: rank {rank} has wrong values at {wrong} of {want.size} elements "
            f"(first: element {i} is {value}, expected {want[i]})"
        )


def run_benchmark(
    backend: str = "torch",
    num_ranks: int = 4,
    size_bytes: int = 16 * 2**20,
    dtype: str = "float32",
    delay: float = 0.0,
    *,
    algorithm: str = "stragglar",
    schedule: Schedule | None = None,
    straggler: int | None = None,
    iters: int = 5,
    warmup: int = 1,
    timeout: float = 60.0,
) -> BenchmarkResult:
    """Run ``schedule`` (default: ``algorithm`` synthesized for ``num_ranks``) ``warmup + iters``
    times on ``backend`` and the engine's all_reduce as often, checking every result.

    ``delay`` is in seconds.  Raises ValueError for a bad request, AssertionError for a wrong
    result, and :class:`~stragglar.runtime.launch.LaunchError` when a rank fails.
    """
    from stragglar.synth import synthesize

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (choose from {', '.join(DTYPES)})")
    if schedule is None:
        schedule = synthesize(algorithm, num_ranks, straggler)
    elif schedule.num_ranks != num_ranks:
        raise ValueError(f"schedule is for {schedule.num_ranks} ranks, not {num_ranks}")
    count = size_bytes // _ITEMSIZE[dtype]
    if count < 1 or iters < 1 or warmup < 0 or delay < 0:
        raise ValueError("need size >= one element, iters >= 1, warmup >= 0 and delay >= 0")
    _require(backend)
    if backend == "torch":
        from stragglar.runtime.bench_torch import torch_figures

        figures = torch_figures(schedule, count, dtype, delay, iters, warmup, timeout)
    else:
        figures = _in_process(backend, schedule, count, dtype, delay, iters, warmup)
    times, hidden, base_name, base = figures
    return BenchmarkResult(
        backend, schedule.algorithm, num_ranks, dtype, count, delay, times, hidden, base_name, base
    )


def _require(backend: str) -> None:
    """A ValueError naming the extra to install when the backend's library is missing."""
    if backend != "local" and importlib.util.find_spec(backend) is None:  # named after its library
        raise ValueError(f"the {backend} backend needs {backend}: pip install 'stragglar[{backend}]'")


Figures = tuple[tuple[float, ...], tuple[float, ...], str, tuple[float, ...]]


def iteration_figures(schedule: Schedule, timelines: Sequence[Timeline]) -> tuple[float, float | None]:
    """(slowest rank's time from its start to its end, when the hidden phases were done)."""
    late = schedule.straggler
    hidden = [i for i, p in enumerate(schedule.phases) if late is not None and late not in p.ranks]
    ends = [
        done - t.start
        for t in timelines
        if t.rank != late
        for done in (t.phase_done[i] for i in hidden)
        if done is not None
    ]
    return max(t.done - t.start for t in timelines), (max(ends) if ends else None)


def _in_process(
    backend: str, schedule: Schedule, count: int, dtype: str, delay: float, iters: int, warmup: int
) -> Figures:
    from stragglar.runtime import plan_for
    from stragglar.runtime.local import run_local

    xp, sync, host = _array_module(backend)
    try:
        inputs = [
            xp.asarray(payload(r, count, schedule.num_ranks, dtype).astype(dtype))
            for r in range(schedule.num_ranks)
        ]
    except TypeError as e:
        raise ValueError(f"the {backend} backend cannot hold {dtype}: {e}") from None
    want = expected(count, schedule.num_ranks, dtype)
    plans = [plan_for(schedule, r, count) for r in range(schedule.num_ranks)]
    bufs = [x.copy() for x in inputs]
    times: list[float] = []
    hidden: list[float] = []
    base: list[float] = []
    for it in range(warmup + iters):
        for b, x in zip(bufs, inputs, strict=True):
            b[:] = x
        sync()
        figures = iteration_figures(schedule, run_local(bufs, plans, delay, sync))
        for r, b in enumerate(bufs):
            check(b, want, r, schedule.algorithm, host)
        for b, x in zip(bufs, inputs, strict=True):
            b[:] = x
        sync()
        start = time.perf_counter()
        time.sleep(delay)
        total = bufs[0].copy()
        for b in bufs[1:]:
            total += b
        for b in bufs:
            b[:] = total
        sync()
        if it >= warmup:
            times.append(figures[0])
            hidden.extend([figures[1]] if figures[1] is not None else [])
            base.append(time.perf_counter() - start)
        for r, b in enumerate(bufs):
            check(b, want, r, "sum", host)
    return tuple(times), tuple(hidden), "sum of buffers", tuple(base)


def _array_module(backend: str) -> tuple[Any, Callable[[], None], Callable[[Any], np.ndarray]]:
    """(array module, device sync, to-host) for the in-process backends; cupy runs loopback."""
    if backend == "local":
        return np, lambda: None, np.asarray
    import cupy

    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CuPy raises its own CUDA error types, not importable without a GPU
        raise ValueError(f"the cupy backend found no usable GPU: {e}") from None
    return cupy, cupy.cuda.Device().synchronize, cupy.asnumpy
