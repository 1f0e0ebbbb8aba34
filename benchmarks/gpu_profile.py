"""bench_gpu.py's ``device_profile`` part: where the host's part of a device call goes.

At N = 8, C = 64, 1 MiB a device call took 0.63 ms on an H200 by the host's clock, about 0.3 ms of
it the host's own work around the kernels (the buffers' checks, the graph's replay, the wait,
every rank's words read back and checked).  This profiles that call with :mod:`cProfile` (whose
own cost inflates every figure, the small functions' most: read the figures as shares, not as
times) and prints the functions that take the most of it.

Rows: first the call as a user waits for it, unprofiled (``own_us``: the host's time of a call,
``cumulative_us``: its kernels' time on the GPU, both medians), then the ``TOP`` functions by
their own time in the profiled calls: ``function`` (``file:line(name)``, the file relative to
the package or the Python library), ``calls`` (how many times a call runs it), ``own_us`` (its
own time a call, callees excluded) and ``cumulative_us`` (with its callees).  Every call is
checked against the sum.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_device import inputs, or_dash, state_of

from stragglar.runtime import allreduce_local
from stragglar.synth import synthesize
from stragglar.verify import prove

N, CHUNKS, SIZE = 8, 64, 1 << 20  # the round target's setting
DTYPE = "float32"
TOP = 20  # functions shown
CALLS_PER_ITER = 20  # profiled calls for each of bench_gpu's --iters: a call is well under a millisecond
UNPROFILED = "a whole call, unprofiled (host; its kernels on the GPU)"


@dataclass(frozen=True)
class ProfileRow:
    function: str
    calls: float  # times a call runs it
    own_us: float  # a call's time in it, callees excluded (the unprofiled row: a call's host time)
    cumulative_us: float | None  # with its callees (the unprofiled row: the kernels' time on the GPU)


def device_profile(
    xp: Any, sync: Callable[[], None], iters: int, progress: Callable[[str], None]
) -> list[ProfileRow]:
    proof = prove(synthesize("stragglar", N, chunks=CHUNKS))
    count = SIZE // xp.dtype(DTYPE).itemsize
    fresh, want = inputs(xp, N, count, DTYPE)
    bufs = [xp.empty(count, dtype=DTYPE) for _ in range(N)]
    state = state_of(xp, proof, count, DTYPE)  # the state the default calls run on

    def call() -> None:
        allreduce_local(bufs, proof, engine="device")

    def refill() -> None:
        for buf, values in zip(bufs, fresh, strict=True):
            xp.copyto(buf, values)
        sync()

    def checked() -> None:
        if not all(bool(xp.array_equal(b, want)) for b in bufs):
            raise AssertionError(f"the device engine's sum at N={N} C={CHUNKS} {SIZE >> 10} KiB is not exact")

    host, gpu = [], []
    for i in range(iters + 2):  # the first call launches, the second captures its graph: neither timed
        refill()
        start = time.perf_counter()
        call()
        sync()
        if i >= 2:
            host.append(time.perf_counter() - start)
            gpu.append(state.elapsed_s())
        checked()
    calls = CALLS_PER_ITER * iters
    profiler = cProfile.Profile()
    for _ in range(calls):  # each on fresh inputs; the last call's sum checked
        refill()
        profiler.enable()
        call()
        profiler.disable()
    sync()
    checked()
    whole = ProfileRow(UNPROFILED, 1.0, statistics.median(host) * 1e6, statistics.median(gpu) * 1e6)
    progress(f"device profile N={N} C={CHUNKS} {SIZE >> 10} KiB: a call {whole.own_us:.1f} us on the host")
    return [whole, *top_functions(pstats.Stats(profiler), calls)]


def top_functions(stats: pstats.Stats, calls: int) -> list[ProfileRow]:
    """The :data:`TOP` functions of ``stats`` (``calls`` calls profiled) by their own time."""
    rows = [
        ProfileRow(_named(where), counted / calls, own * 1e6 / calls, cumulative * 1e6 / calls)
        for where, (_, counted, own, cumulative, _) in stats.stats.items()  # type: ignore[attr-defined]
    ]
    return sorted(rows, key=lambda r: -r.own_us)[:TOP]


def _named(where: tuple[str, int, str]) -> str:
    """``file:line(name)``, the file from its package's folder on (``stragglar/...``, ``cupy/...``),
    or its name alone (the standard library's); a built-in as Python names it."""
    path, line, name = where
    if path == "~":
        return name
    parts = Path(path).parts
    for package in ("stragglar", "cupy", "cupy_backends", "numpy", "torch"):
        if package in parts:
            return f"{'/'.join(parts[len(parts) - 1 - parts[::-1].index(package) :])}:{line}({name})"
    return f"{Path(path).name}:{line}({name})"


def profile_table(rows: list[ProfileRow]) -> str:
    lines = [
        f"N = {N}, C = {CHUNKS}, {SIZE >> 10} KiB {DTYPE}, per call (cProfile's own cost included):",
        "",
        "| function | calls | own (us) | with callees (us) |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {r.function} | {r.calls:g} | {r.own_us:.1f} | {or_dash(r.cumulative_us)} |" for r in rows]
    return "\n".join(lines)
