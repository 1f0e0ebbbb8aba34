"""The in-process backends of ``stragglar run``: every rank's buffer in this process, NumPy
(``local``) or CuPy on one GPU (``cupy``, the loopback).

There is no network here, so the baseline is no collective but summing the buffers directly,
after the same delay: the ratios check the schedule's own overhead (the interpreter's, or the
loopback's kernels), not what a schedule buys on a network.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stragglar.errors import InputError
from stragglar.measure.data import check_result, expected, payload
from stragglar.measure.timing import Figures, Series, iteration_figures, turn
from stragglar.model import schedule_name
from stragglar.runtime import allreduce_local
from stragglar.verify import Proof

__all__ = ["in_process_figures"]


def in_process_figures(
    backend: str,
    proofs: Sequence[Proof],
    n: int,
    count: int,
    dtype: str,
    delay: float,
    iters: int,
    warmup: int,
    late_rank: int,
    tick: Callable[[], None] | None,
    graphs: bool | None,
) -> Figures:
    """Every schedule of ``proofs`` and the sum of the buffers, on ``n`` buffers in this process,
    ``warmup + iters`` times in the rotating order of :func:`~stragglar.measure.timing.turn`, every
    result checked; the late rank arrives ``delay`` seconds late for each.  ``backend``: ``local``
    (NumPy arrays) or ``cupy`` (the GPU loopback, ``graphs``: replayed from CUDA graphs)."""
    xp, sync, host = _array_module(backend)
    moved = tick if tick is not None else _still
    inputs = []
    for r in range(n):  # seconds for 8 ranks of 64 MiB: the bar shows them too
        inputs.append(xp.asarray(payload(r, count, n, dtype).astype(dtype)))
        moved()
    want = expected(count, n, dtype)
    moved()
    bufs = [x.copy() for x in inputs]
    times: list[list[float]] = [[] for _ in proofs]
    hidden: list[list[float]] = [[] for _ in proofs]
    base: list[float] = []
    for it in range(warmup + iters):
        for entry in turn(it, len(proofs) + 1):
            for b, x in zip(bufs, inputs, strict=True):
                b[:] = x
            sync()
            if entry < len(proofs):
                schedule = proofs[entry].schedule
                timelines = allreduce_local(bufs, proofs[entry], delay, late_rank=late_rank, graphs=graphs)
                total, done = iteration_figures(schedule, timelines)
                what = schedule_name(schedule)
                if it >= warmup:
                    times[entry].append(total)
                    hidden[entry].extend([done] if done is not None else [])
            else:
                total, what = _sum_buffers(bufs, delay, sync), "sum"
                if it >= warmup:
                    base.append(total)
            for r, b in enumerate(bufs):
                check_result(b, want, r, what, host)
                moved()
    series = tuple(Series(tuple(t), tuple(h)) for t, h in zip(times, hidden, strict=True))
    return Figures(series, "sum of buffers", tuple(base))


def _still() -> None:
    """No bar to move."""


def _sum_buffers(bufs: list[Any], delay: float, sync: Callable[[], None]) -> float:
    """The in-process baseline: after the delay, every buffer becomes the sum; its seconds."""
    start = time.perf_counter()
    time.sleep(delay)
    total = bufs[0].copy()
    for b in bufs[1:]:
        total += b
    for b in bufs:
        b[:] = total
    sync()
    return time.perf_counter() - start


def _array_module(backend: str) -> tuple[Any, Callable[[], None], Callable[[Any], np.ndarray]]:
    """(array module, device sync, to-host) for the in-process backends; cupy runs loopback."""
    if backend == "local":
        return np, lambda: None, np.asarray
    import cupy

    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CuPy raises its own CUDA error types, not importable without a GPU
        raise InputError(f"the cupy backend found no usable GPU: {e}") from None
    return cupy, cupy.cuda.Device().synchronize, cupy.asnumpy
