"""Time ``stragglar whatif`` on large arrival traces: the read of the table and the replay apart.

    python benchmarks/bench_whatif.py [--gpus 8 64 256] [--steps 2000] [--runs 3] [--json out.json]

For each N, a CSV trace of ``--steps`` steps is written to a temporary folder, one row per step
and rank (``step,rank,time``, times in seconds with six decimals, a step every 100 ms, each rank
up to 1 ms after the step's start and rank 5 (rank 1 at N < 6) 20 ms late at 70% of the steps),
then read as the command reads it (:func:`~stragglar.formats.traces.read_trace`) and replayed as
it replays it (:func:`~stragglar.model.whatif.replay`, three buckets of 25, 25 and 4 MiB on
10 us and 25 GB/s), each the best of ``--runs``.  Every replay must find the late rank as the
persistent straggler.

Target: at least 100,000 rows a second read and replayed together at the largest N, where the
rows outweigh what a step costs whatever its ranks (its choices and prices per bucket): nearly
three times the 36,000 a second the reader and replay managed before their times were read and
compared as integers (a 64-rank trace of 5,000 steps, 320,000 rows, took 8.8 s).
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from options import Parser, as_command, each, json_output, whole
from results import save

from stragglar.formats.traces import MAX_ROWS, Columns, read_trace
from stragglar.model.cost import Network
from stragglar.model.whatif import Setting, replay

TARGET_ROWS_PER_SECOND = 100_000  # read and replayed together
SETTING = Setting(Network(10e-6, 25e9), (25 * 2**20, 25 * 2**20, 4 * 2**20))
_T = TypeVar("_T")


@dataclass(frozen=True)
class Result:
    n: int
    steps: int
    rows: int
    read_s: float  # best of the runs: the table read into a group of exact times
    replay_s: float  # best of the runs: the group replayed through the policy and the model

    @property
    def rows_per_second(self) -> float:
        return self.rows / (self.read_s + self.replay_s)


def late_rank(n: int) -> int:
    """The rank the trace makes late: 5, as in the README's example, where there is one."""
    return 5 if n > 5 else 1


def write_trace(path: Path, n: int, steps: int) -> None:
    """A trace with one persistent straggler, as a training job's per-rank timer would write it."""
    draw = random.Random(n * 1_000_003 + steps)
    late = late_rank(n)
    with path.open("w") as file:
        file.write("step,rank,time\n")
        for step in range(steps):
            rows = []
            for rank in range(n):
                t = step * 0.1 + draw.random() * 1e-3
                if rank == late and draw.random() < 0.7:
                    t += 0.02
                rows.append(f"{step},{rank},{t:.6f}\n")
            file.write("".join(rows))


def best(runs: int, work: Callable[[], _T]) -> tuple[float, _T]:
    """The shortest of ``runs`` timings of ``work``, and its last result."""
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    assert result is not None
    return min(times), result


def bench(folder: Path, n: int, steps: int, runs: int) -> Result:
    path = folder / f"trace_{n}.csv"
    write_trace(path, n, steps)
    read_s, groups = best(runs, lambda: read_trace(path, "csv", Columns()))
    (group,) = groups
    replay_s, replayed = best(runs, lambda: replay(group.ticks, group.steps, SETTING, group.per_second))
    if replayed.straggler != late_rank(n):
        raise AssertionError(
            f"N = {n}: the replay took rank {replayed.straggler} as late, not {late_rank(n)}"
        )
    return Result(n, steps, n * steps, read_s, replay_s)


def table(results: list[Result]) -> str:
    lines = [
        "| N | steps | rows | read (s) | replay (s) | rows a second |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r.n} | {r.steps:,} | {r.rows:,} | {r.read_s:.2f} | {r.replay_s:.2f} "
            f"| {r.rows_per_second:,.0f} |"
            for r in results
        ),
    ]
    largest = max(results, key=lambda r: (r.n, r.rows))
    verdict = "met" if largest.rows_per_second >= TARGET_ROWS_PER_SECOND else "MISSED"
    lines.append(
        f"\nread and replayed at N={largest.n}: {largest.rows_per_second:,.0f} rows a second "
        f"(target >= {TARGET_ROWS_PER_SECOND:,}: {verdict})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description="Time whatif's read of a CSV trace and its replay, per N.")
    parser.add_gpus(default=[8, 64, 256])
    parser.add_argument("--steps", type=whole(1, 10**6), default=2000, help="steps of each trace")
    parser.add_argument("--runs", type=whole(1, 100), default=3, help="timed runs of each part (the best)")
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also save the results as JSON")
    args = parser.parse_args(argv)
    too_many = [n for n in args.gpus if n * args.steps > MAX_ROWS]
    if too_many:
        parser.error(
            f"{too_many[0]} ranks of {args.steps:,} steps are more than the {MAX_ROWS:,} rows whatif "
            "reads: give fewer --steps"
        )
    with tempfile.TemporaryDirectory(prefix="bench_whatif") as folder:
        results = [
            bench(Path(folder), n, args.steps, args.runs) for n in each(args.gpus, lambda n: f"N = {n}")
        ]
    print(table(results))
    if args.json:
        save(args.json, {"results": [asdict(r) | {"rows_per_second": r.rows_per_second} for r in results]})


if __name__ == "__main__":
    as_command(main)
