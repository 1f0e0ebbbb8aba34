"""Time the MSCCL++ plan export and the proof of the exported text, and print a table.

    python benchmarks/bench_mscclpp.py [--gpus 8 16 32 64 72] [--algorithm stragglar]
                                       [--instances 1] [--interleavings 4] [--repeats 3] [--json FILE]

Times are wall-clock (``time.perf_counter``), best of ``--repeats``; synthesis and the proof of the
schedule that the export lowers are not timed.
"export" is :func:`stragglar.mscclpp.lower` (schedule to JSON text); "prove" is
:func:`stragglar.mscclpp.prove` on that text (parse with the executor's rules, the
interleaved symbolic runs and the happens-before analysis), i.e. what proving a shipped file costs.
The target is export + prove of N = 64 in under 5 s.
"""

from __future__ import annotations

import functools
import os
import platform
from typing import Any

from exporting import best_of, synthesized
from options import Parser, as_command, each, json_output, whole
from results import save

from stragglar import mscclpp
from stragglar.mscclpp import DEFAULT_INTERLEAVINGS, PlanOptions
from stragglar.schedule import Schedule
from stragglar.synth import ALGORITHMS
from stragglar.verify import prove

TARGET_N, TARGET_S = 64, 5.0


def measure(schedule: Schedule, instances: int, interleavings: int, repeats: int) -> dict[str, Any]:
    """One row: plan shape and the export and prove times of one size.  The schedule is proved
    before the export's timing, as bench_msccl does: the export lowers a proof."""
    proof = prove(schedule)
    options = PlanOptions(instances=instances)
    export_s, plan = best_of(repeats, lambda: mscclpp.lower(proof, options))
    prove_s, proved = best_of(repeats, lambda: mscclpp.prove(plan.text, interleavings=interleavings))
    return {
        "n": schedule.num_ranks,
        "threadblocks": proved.threadblocks,
        "max_threadblocks_per_gpu": proved.max_threadblocks_per_gpu,
        "ops": proved.ops,
        "kib": round(len(plan.text) / 1024, 1),
        "export_s": round(export_s, 3),
        "prove_s": round(prove_s, 3),
        "total_s": round(export_s + prove_s, 3),
    }


def main() -> None:
    parser = Parser(description=(__doc__ or "").split("\n")[0])
    parser.add_gpus(default=[8, 16, 32, 64, 72])
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="stragglar", help="the schedule exported")
    parser.add_argument("--instances", type=whole(1), default=1, help="copies of the schedule the plan runs")
    parser.add_argument(
        "--interleavings",
        type=whole(1, 1000),
        default=DEFAULT_INTERLEAVINGS,
        help="the proof's symbolic runs, each in another order",
    )
    parser.add_argument("--repeats", type=whole(1, 1000), default=3, help="timed runs per N (the best kept)")
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also write the rows to FILE")
    args = parser.parse_args()
    check = functools.partial(mscclpp.check_request, instances=args.instances, algorithm=args.algorithm)
    schedules = synthesized(args.algorithm, args.gpus, check)
    python = platform.python_version()
    print(
        f"{args.algorithm}, {args.instances} instance(s), {args.interleavings} interleavings, best of "
        f"{args.repeats}; Python {python}, {platform.machine()}, {os.cpu_count()} CPUs"
    )
    header = ("N", 4), ("TBs", 6), ("TB/GPU", 6), ("ops", 7), ("KiB", 7), ("export s", 9), ("prove s", 8)
    print(" ".join(f"{name:>{width}}" for name, width in header) + f" {'total s':>8}")
    rows = []
    for schedule in each(schedules, lambda s: f"N = {s.num_ranks}: export and prove"):
        row = measure(schedule, args.instances, args.interleavings, args.repeats)
        rows.append(row)
        print(
            f"{row['n']:>4} {row['threadblocks']:>6} {row['max_threadblocks_per_gpu']:>6} {row['ops']:>7} "
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
