"""StragglAR on a GPU: the loopback eager against CUDA graphs, with every result checked.

    python benchmarks/bench_gpu.py [--quick] [--iters 5] [--json docs/perf/gpu.json]

Loopback (every rank's CuPy array on one GPU, the device copying for the links), for N in
{4, 8, 16}, the paper's C = N - 1 chunks and C = 8N, and buffers of 4 KiB to 256 MiB per rank
(float32): the median time of one AllReduce launched eagerly (batched rounds, a few kernels a
round) and replayed from CUDA graphs (captured on the first call after the eager ones), the time per round
of each, and the device copy floor (one copy of every rank's buffer: no loopback AllReduce
moves less).  Every call's result is checked exactly on the device against the sum (values
distinct per rank and element, exact in float32), and a wrong one stops the benchmark.

Targets (issue 24): graphs <= 10 us per round at N = 8, C = 64, 1 MiB; at N = 8, C = 64, 64 MiB
with graphs <= 1.3x the paper's C = 7 with graphs.  Without a GPU (no CuPy, or no device) it
prints one line "no GPU: ..." and exits 0.  ``--quick`` runs N = 8 only at 4 KiB, 1 MiB and 64 MiB.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from results import save

from stragglar.runtime import allreduce_local
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove

SIZES = (4 << 10, 1 << 20, 64 << 20, 256 << 20)  # bytes per rank
QUICK_SIZES = (4 << 10, 1 << 20, 64 << 20)
PERIOD = 4093  # a prime: element values repeat with it, never in step with a chunk's length
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


class Wrong(Exception):
    """A result differed from the sum: the benchmark stops, since its timings would mean nothing."""


def fill(xp: Any, bufs: list[Any]) -> None:
    """Rank r's element i is ``(i mod PERIOD) * N + r``: distinct per rank, and per element within a
    period, so a misplaced or lost chunk shows; every partial sum is an integer below 2**24."""
    n = len(bufs)
    base = (xp.arange(bufs[0].shape[0], dtype=xp.float32) % PERIOD) * n
    for rank, buf in enumerate(bufs):
        xp.add(base, rank, out=buf)


def verify(xp: Any, bufs: list[Any], what: str) -> None:
    n = len(bufs)
    want = (xp.arange(bufs[0].shape[0], dtype=xp.float32) % PERIOD) * (n * n) + n * (n - 1) // 2
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


def copy_floor_ms(xp: Any, sync: Callable[[], None], count: int, iters: int) -> float:
    """The median time of one device copy of ``count`` float32 elements."""
    source, target = xp.zeros(count, dtype=xp.float32), xp.empty(count, dtype=xp.float32)
    times = []
    for _ in range(iters + 1):
        sync()
        start = time.perf_counter()
        xp.copyto(target, source)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def loopback_row(xp: Any, sync: Callable[[], None], proof: Proof, size_bytes: int, iters: int) -> LoopbackRow:
    n, c = proof.num_ranks, proof.num_chunks
    count = size_bytes // 4
    bufs = [xp.empty(count, dtype=xp.float32) for _ in range(n)]
    what = f"N={n} C={c} {size_bytes} B"
    eager = median_ms(xp, sync, bufs, lambda: allreduce_local(bufs, proof, graphs=False), iters, what)
    graph = median_ms(xp, sync, bufs, lambda: allreduce_local(bufs, proof), iters, what)
    floor = copy_floor_ms(xp, sync, n * count, iters)
    rounds = proof.num_rounds
    return LoopbackRow(
        n, c, size_bytes, rounds, eager, graph, eager * 1e3 / rounds, graph * 1e3 / rounds, floor
    )


def loopback(
    xp: Any, sync: Callable[[], None], ns: tuple[int, ...], sizes: tuple[int, ...], iters: int
) -> list[LoopbackRow]:
    rows = []
    for n in ns:
        for chunks in (n - 1, 8 * n):
            proof = prove(synthesize("stragglar", n, chunks=chunks))
            for size in sizes:
                rows.append(loopback_row(xp, sync, proof, size, iters))
                print(f"  loopback N={n} C={chunks} {size >> 10} KiB done", file=sys.stderr, flush=True)
    return rows


def loopback_table(rows: list[LoopbackRow]) -> str:
    lines = [
        "| N | C | size | rounds | eager (ms) | graph (ms) | eager/round (us) | graph/round (us) "
        "| copy floor (ms) | eager/graph |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.n} | {r.chunks} | {_size(r.size_bytes)} | {r.rounds} | {r.eager_ms:.3f} "
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


def _size(size_bytes: int) -> str:
    return f"{size_bytes >> 20} MiB" if size_bytes >= 1 << 20 else f"{size_bytes >> 10} KiB"


def gpu() -> tuple[Any, str] | str:
    """(CuPy, the device's name), or why there is no GPU to run on."""
    try:
        import cupy
    except ImportError:
        return "cupy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CUDA sees no device"
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    except Exception as e:  # CuPy's CUDA errors are its own types
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return cupy, name.decode() if isinstance(name, bytes) else str(name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="StragglAR on a GPU: loopback eager against CUDA graphs.")
    parser.add_argument("--quick", action="store_true", help="N = 8 only, up to 64 MiB")
    parser.add_argument("--iters", type=int, default=5, help="timed calls per setting (median)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also save the results as JSON")
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    found = gpu()
    if isinstance(found, str):
        print(f"no GPU: {found}")
        return
    cupy, device = found
    sync = cupy.cuda.Device().synchronize
    ns, sizes = ((8,), QUICK_SIZES) if args.quick else ((4, 8, 16), SIZES)
    rows = loopback(cupy, sync, ns, sizes, args.iters)
    print(f"device: {device}\n\n## Loopback (one process, float32), eager against CUDA graphs\n")
    print(loopback_table(rows))
    if args.json:
        save(args.json, {"device": device, "loopback": [asdict(r) for r in rows]})


if __name__ == "__main__":
    main()
