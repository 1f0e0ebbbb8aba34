"""Time the z3 work: the checker on StragglAR schedules, the lower bounds, optimal synthesis.

    .venv/bin/python benchmarks/bench_smt.py                      # the figures in docs/smt.md
    .venv/bin/python benchmarks/bench_smt.py --gpus 8 64 --bound-max 8
    .venv/bin/python benchmarks/bench_smt.py --no-checker --synth-max 1     # the lower bounds alone

The lower bounds go up from N = 2 until ``--bound-max`` or the first query z3 does not decide
within ``--bound-timeout`` (600s); ``synthesize(..., method="smt")`` (z3 finds the copies of
phase 2 in the paper's exchange order; each schedule then proved by both checkers) runs for
N = 2..``--synth-max``.
"""

from __future__ import annotations

import time

from options import Parser, as_command, duration, each, json_output, whole
from results import save

from stragglar.schedule import Phase, Schedule, round_lower_bound
from stragglar.synth import synthesize
from stragglar.synth.ring import ring_reduce_scatter
from stragglar.verify import prove
from stragglar.verify.bound import prove_lower_bound
from stragglar.verify.smt import smt_prove

Row = dict[str, object]  # one table row, as the JSON keeps it
CHECKER_GPUS = (8, 16, 32, 64, 128, 256)


def checker_table(gpus: list[int]) -> list[Row]:
    rows: list[Row] = []
    print(f"{'N':>4} {'transfers':>9} {'z3 proof s':>10} {'simulator s':>11}")
    for n in each(gpus, lambda n: f"z3 proof, N = {n}"):
        schedule = synthesize("stragglar", n)
        seconds = smt_prove(schedule).seconds
        start = time.perf_counter()
        prove(schedule)
        simulated = time.perf_counter() - start
        print(f"{n:>4} {schedule.num_transfers:>9} {seconds:>10.2f} {simulated:>11.3f}", flush=True)
        rows.append({"n": n, "transfers": schedule.num_transfers, "z3_s": seconds, "simulator_s": simulated})
    return rows


def bound_table(up_to: int, timeout_s: float) -> list[Row]:
    rows: list[Row] = []
    print(f"{'N':>4} {'R*(N)':>5} {'R*(N)-1 rounds':>14} {'solver s':>9}")
    for n in each(range(2, up_to + 1), lambda n: f"bound, N = {n}"):
        bound = prove_lower_bound(n, timeout_s)
        print(f"{n:>4} {bound.bound:>5} {bound.status:>14} {bound.seconds:>9.2f}", flush=True)
        rows.append({"n": n, "bound": bound.bound, "status": bound.status, "seconds": bound.seconds})
        if bound.exchange is not None:  # R*(N) refuted in our model: check the schedule, then say so
            others = tuple(range(n - 1))
            reduce_scatter = Phase("reduce-scatter", others, ring_reduce_scatter(others, others))
            found = Schedule(
                "stragglar",
                n,
                n - 1,
                n - 1,
                (reduce_scatter, Phase("exchange", tuple(range(n)), bound.exchange)),
            )
            prove(found)
            smt_prove(found)
            print(f"!!! N={n}: z3 found a phase 2 of {bound.bound - 1} rounds, proved correct twice")
        if bound.status == "unknown":
            break
    return rows


def synthesis_table(up_to: int) -> list[Row]:
    rows: list[Row] = []
    print(f"{'N':>4} {'rounds':>6} {'R*(N)':>5} {'seconds':>8}")
    for n in each(range(2, up_to + 1), lambda n: f"synthesis, N = {n}"):
        start = time.perf_counter()
        schedule = synthesize("stragglar", n, method="smt")
        seconds = time.perf_counter() - start
        prove(schedule)
        smt_prove(schedule)
        print(f"{n:>4} {schedule.exposed_rounds:>6} {round_lower_bound(n):>5} {seconds:>8.2f}", flush=True)
        rows.append(
            {"n": n, "rounds": schedule.exposed_rounds, "bound": round_lower_bound(n), "seconds": seconds}
        )
    return rows


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_gpus(
        says="the checker's table: z3's proof of StragglAR at each N "
        f"(default: {' '.join(map(str, CHECKER_GPUS))})"
    )
    parser.add_argument(
        "--no-checker", action="store_true", help="no checker table (the bounds, the synthesis)"
    )
    parser.add_argument(
        "--bound-max", type=whole(2, 24), default=15, metavar="N", help="lower bounds for N = 2 to this"
    )
    parser.add_argument(
        "--bound-timeout", type=duration(positive=True), default="600s", help="z3's time per bound"
    )
    parser.add_argument(
        "--synth-max",
        type=whole(1, 16),
        default=12,
        metavar="N",
        help="synthesis for N = 2 to this (1: none)",
    )
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also save the tables as JSON")
    args = parser.parse_args()
    if args.no_checker and args.gpus is not None:
        parser.error("--gpus applies to the checker's table, which --no-checker leaves out")
    checker: list[Row] = []
    if not args.no_checker:
        checker = checker_table(args.gpus or list(CHECKER_GPUS))
        print()
    bounds = bound_table(args.bound_max, args.bound_timeout)
    synthesis: list[Row] = []
    if args.synth_max >= 2:
        print()
        synthesis = synthesis_table(args.synth_max)
    if args.json:
        tables = {"checker": checker, "bounds": bounds, "synthesis": synthesis}
        save(args.json, {"bound_timeout_s": args.bound_timeout, **tables})


if __name__ == "__main__":
    as_command(main)
