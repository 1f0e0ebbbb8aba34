"""Measured StragglAR against gloo's all_reduce on CPU, beside the cost model's prediction.

    python benchmarks/bench_gloo.py [--gpus 4 8] [--sizes 16 64] [--delays 0 50 200] [--iters 5]
                                    [--json out.json]

Each setting is one ``run_benchmark("torch", ...)``: fork-started gloo ranks on 127.0.0.1; every
iteration runs the StragglAR schedule, then gloo's all_reduce, both with the straggler (rank N-1)
sleeping ``delay`` first and both results checked.  So the two alternate within one run and see
the same machine state.  Times count from the common start (the delay included); the ratio
gloo / StragglAR is taken per iteration (the pair ran back to back) and reported as the median
with its min-max spread.

The prediction: gloo's all_reduce is a ring, so per N a Ring alpha-beta model,
``T = 2(N-1) alpha + 2(N-1)/N * size / bandwidth``, is fitted by least squares to gloo's median
times at delay 0 over the sizes measured (two sizes determine it exactly).  The same network is
then used to price StragglAR's schedule and Ring's at the measured setting
(:func:`stragglar.cost.compare`), and the predicted ratio is Ring's completion time over
StragglAR's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

import numpy as np

from stragglar.cost import Network, compare
from stragglar.runtime.bench import BenchmarkResult, run_benchmark

MIB = 2**20


@dataclass(frozen=True)
class Row:
    n: int
    size_mib: int
    delay_ms: float
    stragglar_ms: float
    gloo_ms: float
    ratio: float  # gloo / stragglar, median of per-iteration ratios; > 1: StragglAR faster
    ratio_min: float
    ratio_max: float
    predicted: float | None


def measure(n: int, size_mib: int, delay_ms: float, iters: int) -> BenchmarkResult:
    return run_benchmark(
        "torch", n, size_mib * MIB, "float32", delay_ms / 1e3, iters=iters, warmup=1, timeout=120.0
    )


def fit_ring(n: int, points: list[tuple[int, float]]) -> Network | None:
    """Least-squares alpha and bandwidth of a Ring all_reduce from (bytes, seconds) at delay 0."""
    if len({s for s, _ in points}) < 2:
        return None
    a = np.array([[2 * (n - 1), 2 * (n - 1) / n * s] for s, _ in points])
    (alpha, beta), *_ = np.linalg.lstsq(a, np.array([t for _, t in points]), rcond=None)
    return Network(max(float(alpha), 0.0), 1.0 / float(beta)) if beta > 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64], help="MiB")
    parser.add_argument("--delays", type=float, nargs="+", default=[0, 50, 200], help="ms")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    results: dict[tuple[int, int, float], BenchmarkResult] = {}
    for n in args.gpus:
        for size in args.sizes:
            for delay in args.delays:
                results[n, size, delay] = r = measure(n, size, delay, args.iters)
                ratio = r.baseline_time / r.time
                print(f"  measured N={n} {size} MiB {delay:g} ms: {ratio:.2f}x", flush=True)

    networks = {
        n: fit_ring(n, [(s * MIB, results[n, s, 0.0].baseline_time) for s in args.sizes])
        if 0.0 in args.delays
        else None
        for n in args.gpus
    }
    rows = []
    for (n, size, delay), r in results.items():
        ratios = [b / t for b, t in zip(r.baseline_times, r.times, strict=True)]
        net = networks[n]
        predicted = None
        if net is not None:
            c = compare(n, size * MIB, delay / 1e3, net, ("stragglar",))
            predicted = c.get("ring").time / c.get("stragglar").time
        rows.append(
            Row(
                n,
                size,
                delay,
                r.time * 1e3,
                r.baseline_time * 1e3,
                statistics.median(ratios),
                min(ratios),
                max(ratios),
                predicted,
            )
        )

    print()
    for n, net in networks.items():
        if net is not None:
            print(
                f"gloo fit, N={n}: alpha {net.alpha * 1e6:.0f} us, bandwidth {net.bandwidth / 1e9:.2f} GB/s"
            )
    print()
    print("| N | MiB | delay (ms) | StragglAR (ms) | gloo (ms) | gloo / StragglAR [min-max] | model |")
    print("|---:|---:|---:|---:|---:|---|---:|")
    for row in rows:
        model = f"{row.predicted:.2f}x" if row.predicted is not None else "-"
        print(
            f"| {row.n} | {row.size_mib} | {row.delay_ms:g} | {row.stragglar_ms:.1f} | {row.gloo_ms:.1f} | "
            f"{row.ratio:.2f}x [{row.ratio_min:.2f}-{row.ratio_max:.2f}] | {model} |"
        )
    if args.json:
        doc = {
            "date": date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "iters": args.iters,
            "fits": {n: asdict(net) if net else None for n, net in networks.items()},
            "rows": [asdict(row) for row in rows],
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
