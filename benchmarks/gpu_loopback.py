"""bench_gpu.py's ``loopback`` part: every rank's CuPy array on one GPU, the device copying for
the links, StragglAR's AllReduce launched eagerly (batched rounds, a few kernels a round) against
the same replayed from CUDA graphs, and the device copy floor (one copy of every rank's buffer:
no loopback AllReduce moves less).

Every call's result is checked exactly on the device against the sum (values distinct per rank
and element, exact in float32: :func:`gpu_inputs.value`), and a wrong one stops the benchmark.
Targets (issue 24): with graphs <= :data:`ROUND_TARGET_US` per round at N = 8, C = 64, 1 MiB, and
at N = 8, 64 MiB C = 64 with graphs <= :data:`CHUNKED_TARGET` x the paper's C = 7 with graphs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_device import copy_seconds
from gpu_inputs import PERIOD, Wrong, size_text, total, value

from stragglar.runtime import allreduce_local
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove

ROUND_TARGET_US = 10.0  # graphs, N = 8, C = 64, 1 MiB
CHUNKED_TARGET = 1.3  # graphs, N = 8, 64 MiB: C = 64 over C = 7


@dataclass(frozen=True)
class LoopbackRow:
    n: int
    chunks: int
    size_bytes: int
    rounds: int
    eager_ms: float
    graph_ms: float
    eager_round_us: float
    graph_round_us: float
    floor_ms: float


def fill(xp: Any, bufs: list[Any]) -> None:
    """Every rank's input (:func:`gpu_inputs.value`), made on the device: NumPy's exact payloads
    (``stragglar.measure.data``) would be made on the host, seconds per rank at 256 MiB."""
    base = xp.arange(bufs[0].shape[0], dtype=xp.float32) % PERIOD
    for rank, buf in enumerate(bufs):
        buf[...] = value(base, rank, len(bufs))


def verify(xp: Any, bufs: list[Any], what: str) -> None:
    want = total(xp.arange(bufs[0].shape[0], dtype=xp.float32) % PERIOD, len(bufs))
    for rank, buf in enumerate(bufs):
        if not bool(xp.array_equal(buf, want)):
            wrong = int((buf != want).sum())
            raise Wrong(f"{what}: rank {rank} has {wrong} wrong elements of {buf.shape[0]}")


def median_ms(
    xp: Any, sync: Callable[[], None], bufs: list[Any], call: Callable[[], object], iters: int, what: str
) -> float:
    """The median over ``iters`` calls (after one untimed call), each on fresh data and checked."""
    times = []
    for i in range(iters + 1):
        fill(xp, bufs)
        sync()
        start = time.perf_counter()
        call()
        sync()
        if i:
            times.append(time.perf_counter() - start)
        verify(xp, bufs, what)
    return statistics.median(times) * 1e3


def loopback_row(xp: Any, sync: Callable[[], None], proof: Proof, size_bytes: int, iters: int) -> LoopbackRow:
    n, c = proof.num_ranks, proof.num_chunks
    count = size_bytes // 4
    bufs = [xp.empty(count, dtype=xp.float32) for _ in range(n)]
    what = f"N={n} C={c} {size_bytes} B"
    eager = median_ms(xp, sync, bufs, lambda: allreduce_local(bufs, proof, graphs=False), iters, what)
    graph = median_ms(xp, sync, bufs, lambda: allreduce_local(bufs, proof), iters, what)
    floor = copy_seconds(xp, sync, n * count * 4, iters)[0] * 1e3  # every rank's buffer, once, by the host
    rounds = proof.num_rounds
    return LoopbackRow(
        n, c, size_bytes, rounds, eager, graph, eager * 1e3 / rounds, graph * 1e3 / rounds, floor
    )


def loopback(
    xp: Any,
    sync: Callable[[], None],
    ns: tuple[int, ...],
    sizes: tuple[int, ...],
    iters: int,
    progress: Callable[[str], None],
) -> list[LoopbackRow]:
    rows = []
    for n in ns:
        for chunks in (n - 1, 8 * n):
            proof = prove(synthesize("stragglar", n, chunks=chunks))
            for size in sizes:
                rows.append(loopback_row(xp, sync, proof, size, iters))
                progress(f"loopback N={n} C={chunks} {size_text(size)} done")
    return rows


def loopback_table(rows: list[LoopbackRow]) -> str:
    lines = [
        "| N | C | size | rounds | eager (ms) | graph (ms) | eager/round (us) | graph/round (us) "
        "| copy floor (ms) | eager/graph |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.n} | {r.chunks} | {size_text(r.size_bytes)} | {r.rounds} | {r.eager_ms:.3f} "
            f"| {r.graph_ms:.3f} | {r.eager_round_us:.1f} | {r.graph_round_us:.1f} | {r.floor_ms:.3f} "
            f"| {r.eager_ms / r.graph_ms:.1f}x |"
        )
    targets = loopback_targets(rows)
    return "\n".join([*lines, "", *targets] if targets else lines)


def loopback_targets(rows: list[LoopbackRow]) -> list[str]:
    """The issue's two loopback targets, where the rows include their settings."""
    out = []
    at = {(r.n, r.chunks, r.size_bytes): r for r in rows}
    small = at.get((8, 64, 1 << 20))
    if small is not None:
        verdict = "met" if small.graph_round_us <= ROUND_TARGET_US else "MISSED"
        out.append(
            f"graphs at N=8 C=64 1 MiB: {small.graph_round_us:.1f} us per round "
            f"(target <= {ROUND_TARGET_US:g} us: {verdict})"
        )
    chunked, paper = at.get((8, 64, 64 << 20)), at.get((8, 7, 64 << 20))
    if chunked is not None and paper is not None:
        ratio = chunked.graph_ms / paper.graph_ms
        verdict = "met" if ratio <= CHUNKED_TARGET else "MISSED"
        out.append(
            f"graphs at N=8 64 MiB: C=64 takes {ratio:.2f}x the paper's C=7 "
            f"(target <= {CHUNKED_TARGET:g}x: {verdict})"
        )
    return out
