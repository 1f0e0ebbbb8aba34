"""How synthesis and the two provers scale with N: time, peak memory, and the fitted exponent.

    python benchmarks/bench_tooling.py [--gpus 8 64 256 1024 2048] [--budget 120s] [--json out.json]

Steps: ``synth`` (``synthesize("stragglar", N)``), ``prove`` (the symbolic simulator,
``stragglar.verify.prove``) and ``smt`` (the z3 checker, ``stragglar.verify.smt.smt_prove``).
Each step is timed once (wall clock), then run again under ``tracemalloc`` for its peak of
Python allocations above what it started with (native memory, such as z3's C++ heap, is not
seen).  A step is skipped at the next N when the exponent fitted so far predicts it would exceed
``--budget``; the proof steps at an N whose synthesis was skipped are skipped with it, and every
step skipped is listed under the tables.  The growth exponent k of ``time ~ N^k`` and
``memory ~ N^k`` is the least-squares slope in log-log over the N >= 64 measured (N = 8 is
dominated by fixed costs).
"""

from __future__ import annotations

import math
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from options import Parser, as_command, duration, json_output, note
from results import save

from stragglar.schedule import MAX_RANKS, Schedule
from stragglar.synth import synthesize
from stragglar.verify import prove
from stragglar.verify.smt import smt_prove

FIT_FROM = 64
Step = Callable[[int, Schedule | None], Any]


def _given(schedule: Schedule | None) -> Schedule:
    """The schedule synthesized by the step before (the proof steps run after ``synth``)."""
    assert schedule is not None, "the proof steps need the synthesized schedule"
    return schedule


STEPS: dict[str, Step] = {
    "synth": lambda n, _: synthesize("stragglar", n),
    "prove": lambda _, s: prove(_given(s)),
    "smt": lambda _, s: smt_prove(_given(s)),
}


def timed(step: Step, n: int, schedule: Schedule | None) -> tuple[float, Any]:
    start = time.perf_counter()
    value = step(n, schedule)
    return time.perf_counter() - start, value


def peak_mib(step: Step, n: int, schedule: Schedule | None) -> float:
    """Peak of Python allocations during ``step`` above what was allocated when it started."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        step(n, schedule)
        return (tracemalloc.get_traced_memory()[1] - base) / 2**20
    finally:
        tracemalloc.stop()


def slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(value) against log(N)."""
    pts = [(math.log(n), math.log(v)) for n, v in points if n >= FIT_FROM and v > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def predicted(points: list[tuple[int, float]], n: int) -> float:
    """Extrapolate the last point with the slope so far (2 if unknown: the transfers grow as N^2)."""
    k = slope(points) or 2.0
    last_n, last_v = points[-1]
    return float(last_v * (n / last_n) ** k)


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_gpus(default=[8, 64, 256, 1024, MAX_RANKS])
    parser.add_argument("--budget", type=duration(positive=True), default="120s", help="time per step and N")
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also save the figures as JSON")
    args = parser.parse_args()

    todo = STEPS
    times: dict[str, list[tuple[int, float]]] = {name: [] for name in todo}
    peaks: dict[str, list[tuple[int, float]]] = {name: [] for name in todo}
    skipped: list[str] = []
    transfers: dict[int, int] = {}
    for n in sorted(args.gpus):
        schedule: Schedule | None = None
        for name, step in todo.items():
            if name != "synth" and schedule is None:
                skipped.append(f"{name} at N={n}: needs the schedule, and synth was skipped")
                continue
            if times[name] and (guess := predicted(times[name], n)) > args.budget:
                skipped.append(f"{name} at N={n}: predicted {guess:.3g} s > budget {args.budget:.3g} s")
                continue
            seconds, value = timed(step, n, schedule)
            times[name].append((n, seconds))
            if name == "synth":
                schedule = value
                transfers[n] = value.num_transfers
            peaks[name].append((n, peak_mib(step, n, schedule)))
            note(f"  N={n} {name}: {seconds:.3f} s, {peaks[name][-1][1]:.1f} MiB")
        del schedule

    print()
    print("| step | N | transfers | time (s) | peak MiB (tracemalloc) |")
    print("|---|---:|---:|---:|---:|")
    for name in todo:
        for (n, s), (_, m) in zip(times[name], peaks[name], strict=True):
            print(f"| {name} | {n} | {transfers[n]:,} | {s:.3f} | {m:.1f} |")
    print()
    print(f"| step | time exponent (N >= {FIT_FROM}) | memory exponent |")
    print("|---|---:|---:|")
    fits = {}
    for name in todo:
        kt, km = slope(times[name]), slope(peaks[name])
        fits[name] = {"time": kt, "memory": km}
        print(f"| {name} | {kt:.2f} | {km:.2f} |" if kt and km else f"| {name} | - | - |")
    for line in skipped:
        print(f"skipped: {line}")
    if args.json:
        figures = {"transfers": transfers, "times_s": times, "peak_mib": peaks, "exponents": fits}
        save(args.json, {**figures, "skipped": skipped})


if __name__ == "__main__":
    as_command(main)
