"""Time the MSCCL++ plan export and the proof of the exported text, and print a table.

    python benchmarks/bench_mscclpp.py [--sizes 8 16 32 64 72] [--algorithm stragglar]
                                       [--instances 1] [--interleavings 4] [--repeats 3] [--json FILE]

Times are wall-clock (``time.perf_counter``), best of ``--repeats``; synthesis is not timed.
"export" is :func:`stragglar.mscclpp.lower` (schedule to JSON text); "prove" is
:func:`stragglar.mscclpp.prove` on that text (parse with the executor's rules, the
interleaved symbolic runs and the happens-before analysis), i.e. what proving a shipped file costs.
The target is export + prove of N = 64 in under 5 s.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from typing import Any, TypeVar

from options import Parser, as_command, json_output, ranks, whole
from results import save

from stragglar import mscclpp
from stragglar.mscclpp import DEFAULT_INTERLEAVINGS, PlanOptions
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import prove

T = TypeVar("T")
TARGET_N, TARGET_S = 64, 5.0


def best_of(repeats: int, run: Callable[[], T]) -> tuple[float, T]:
    """The fastest of ``repeats`` timed runs, and the last result."""
    best = float("inf")
    result: T | None = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return best, result


def measure(algorithm: str, n: int, instances: int, interleavings: int, repeats: int) -> dict[str, Any]:
    """One row: plan shape and the export and prove times of one size."""
    schedule = synthesize(algorithm, n)
    options = PlanOptions(instances=instances)
    export_s, plan = best_of(repeats, lambda: mscclpp.lower(prove(schedule), options))
    prove_s, proof = best_of(repeats, lambda: mscclpp.prove(plan.text, interleavings=interleavings))
    return {
        "n": n,
        "threadblocks": proof.threadblocks,
        "max_threadblocks_per_gpu": proof.max_threadblocks_per_gpu,
        "ops": proof.ops,
        "kib": round(len(plan.text) / 1024, 1),
        "export_s": round(export_s, 3),
        "prove_s": round(prove_s, 3),
        "total_s": round(export_s + prove_s, 3),
    }


def main() -> None:
    parser = Parser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sizes", type=ranks, nargs="+", default=[8, 16, 32, 64, 72])
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="stragglar")
    parser.add_argument("--instances", type=whole(1), default=1)
    parser.add_argument("--interleavings", type=whole(1, 1000), default=DEFAULT_INTERLEAVINGS)
    parser.add_argument("--repeats", type=whole(1, 1000), default=3)
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also write the rows to FILE")
    args = parser.parse_args()
    python = platform.python_version()
    print(
        f"{args.algorithm}, {args.instances} instance(s), {args.interleavings} interleavings, best of "
        f"{args.repeats}; Python {python}, {platform.machine()}, {os.cpu_count()} CPUs"
    )
    header = ("N", 4), ("TBs", 6), ("TB/GPU", 6), ("ops", 7), ("KiB", 7), ("export s", 9), ("prove s", 8)
    print(" ".join(f"{name:>{width}}" for name, width in header) + f" {'total s':>8}")
    rows = []
    for n in args.sizes:
        row = measure(args.algorithm, n, args.instances, args.interleavings, args.repeats)
        rows.append(row)
        print(
            f"{n:>4} {row['threadblocks']:>6} {row['max_threadblocks_per_gpu']:>6} {row['ops']:>7} "
            f"{row['kib']:>7.0f} {row['export_s']:>9.3f} {row['prove_s']:>8.3f} {row['total_s']:>8.3f}"
        )
    target = next((r for r in rows if r["n"] == TARGET_N), None)
    if target is not None:
        verdict = "met" if target["total_s"] < TARGET_S else "MISSED"
        total = target["total_s"]
        print(f"target: export + prove of N={TARGET_N} under {TARGET_S:.0f} s: {verdict} ({total:.2f} s)")
    if args.json:
        save(
            args.json,
            {
                "benchmark": "bench_mscclpp",
                "algorithm": args.algorithm,
                "instances": args.instances,
                "interleavings": args.interleavings,
                "repeats": args.repeats,
                "python": python,
                "cpus": os.cpu_count(),
                "rows": rows,
            },
        )


if __name__ == "__main__":
    as_command(main)
