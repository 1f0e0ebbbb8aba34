"""Time synthesis, proof and the JSON round trip, and measure their peak memory.

    python benchmarks/bench_synth.py [--gpus 64 256 1024] [--algorithm stragglar] [--json out.json]

Times are wall-clock (``time.perf_counter``), best of 3 runs for N <= 256 and one run above;
JSON is ``dumps`` to text and ``loads`` back (checked equal).  Peak memory is the
``tracemalloc`` peak of Python allocations over synth + prove + JSON dump and load, taken in a
separate run so that tracing does not slow the timed ones.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TypeVar

from options import Parser, as_command, each, json_output
from results import save

from stragglar.formats.schedule_json import dumps, loads
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import prove

T = TypeVar("T")
BEST_OF_MAX_N = 256
REPEATS = 3


@dataclass(frozen=True)
class Result:
    n: int
    algorithm: str
    transfers: int
    synth_s: float
    prove_s: float
    dump_s: float
    load_s: float
    peak_mib: float


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def run_once(algorithm: str, n: int) -> tuple[float, float, float, float, int]:
    synth_s, schedule = timed(lambda: synthesize(algorithm, n))
    prove_s, _ = timed(lambda: prove(schedule))
    dump_s, text = timed(lambda: dumps(schedule))
    load_s, back = timed(lambda: loads(text))
    if back != schedule:
        raise SystemExit(f"N={n}: the JSON round trip changed the schedule")
    return synth_s, prove_s, dump_s, load_s, schedule.num_transfers


def peak_mib(algorithm: str, n: int) -> float:
    """Traced peak of one untimed synth + prove + JSON round trip."""
    tracemalloc.start()
    try:
        schedule = synthesize(algorithm, n)
        prove(schedule)
        loads(dumps(schedule))
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def bench(algorithm: str, n: int) -> Result:
    runs = [run_once(algorithm, n) for _ in range(REPEATS if n <= BEST_OF_MAX_N else 1)]
    synth_s, prove_s, dump_s, load_s = (min(r[i] for r in runs) for i in range(4))
    return Result(n, algorithm, runs[0][4], synth_s, prove_s, dump_s, load_s, peak_mib(algorithm, n))


def table(results: list[Result]) -> str:
    lines = [
        "| N | algorithm | transfers | synth (s) | prove (s) | JSON dump (s) | JSON load (s) "
        "| peak MiB (tracemalloc) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.n} | {r.algorithm} | {r.transfers:,} | {r.synth_s:.3f} | {r.prove_s:.3f} | {r.dump_s:.3f} "
        f"| {r.load_s:.3f} | {r.peak_mib:.1f} |"
        for r in results
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description="Time synth, prove and JSON dump+load per N.")
    parser.add_gpus(default=[64, 256, 1024])
    parser.add_argument(
        "--algorithm", choices=ALGORITHMS, default="stragglar", help="the schedule synthesized"
    )
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also save the results as JSON")
    args = parser.parse_args(argv)
    results = [bench(args.algorithm, n) for n in each(args.gpus, lambda n: f"N = {n}")]
    print(table(results))
    if args.json:
        save(args.json, {"results": [asdict(r) for r in results]})


if __name__ == "__main__":
    as_command(main)
