"""What the export benchmarks (bench_msccl, bench_mscclpp) share: the best of repeated timings,
and every size's schedule made, or refused, before the table's header."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from stragglar.schedule import Schedule
from stragglar.synth import check_request, synthesize

T = TypeVar("T")


def best_of(repeats: int, run: Callable[[], T]) -> tuple[float, T]:
    """The fastest of ``repeats`` timed runs (the least disturbed by the rest of the machine), and
    the last result."""
    best = float("inf")
    result: T | None = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return best, result


def synthesized(algorithm: str, sizes: Sequence[int], check: Callable[[int, int], None]) -> list[Schedule]:
    """Each size's schedule, all of them checked and made before the header: a size whose file the
    format refuses (``check(N, chunks)``: too many instances, in milliseconds) or that
    ``algorithm`` has no schedule for (rhd at N = 3, known only to its generator) was found after
    the sizes before it had been measured."""
    for n in sizes:
        check(n, check_request(algorithm, n).num_chunks)
    return [synthesize(algorithm, n) for n in sizes]
