"""Chunked StragglAR: exchange rounds against C + ceil(log2 N) - 1, and synthesis time.

    python benchmarks/bench_chunked.py [--gpus 4 64] [--prove] [--json out.json]
    python benchmarks/bench_chunked.py --every 2 1024 [--json out.json]

One row per (N, C): rounds of the exchange phase, the lower bound C + ceil(log2 N) - 1, the gap,
wall-clock seconds of the construction (``chunked_copy_rounds``, the walk cache cleared first, so
a size that needs the z3 model pays for its solve; z3 itself is imported before the first row)
and of the whole ``synthesize("stragglar", N, chunks=C)`` (construction, ReduceScatter and the
schedule's objects), and the method.  With ``--prove`` every schedule is also proved by
``stragglar.verify.prove`` (slow for the largest rows), and the proof time is added.  ``--gpus``
keeps the cases of the N it names: all of them take a minute, those of N = 4 a second.

``--every LO HI`` times instead the whole ``synthesize("stragglar", N)`` (the paper's C = N-1,
walk cache cleared) for every N from LO to HI, checks each at the bound, and prints the slowest
sizes and how many took longer than ``--limit`` seconds (the issue's target: 2 s up to 1024).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass

import z3
from options import Parser, as_command, duration, each, json_output, ranks
from results import save

from stragglar.errors import InputError
from stragglar.synth import synthesize
from stragglar.synth.chunked import chunked_copy_rounds
from stragglar.synth.chunked_tail import walk_for
from stragglar.verify import prove

CASES = (
    [(8, 256), (2, 64)]
    + [(n, c) for n in (4, 5, 6, 7, 9, 12, 16, 17, 24, 31, 33, 48, 63, 64) for c in (n - 1, 128, 256)]
    + [(1024, 4096), (1024, 1024), (512, 4096)]
    + [(n, n - 1) for n in (100, 127, 128, 200, 255, 256, 300, 500, 511, 512, 700, 1000, 1023, 1024)]
    + [(n, n - 1) for n in (65, 129, 263, 513, 529)]  # tails found by search
)


@dataclass(frozen=True)
class Row:
    n: int
    c: int
    rounds: int
    bound: int
    gap: int
    copies: int
    seconds: float
    synth_seconds: float
    prove_seconds: float | None
    method: str


def measure(n: int, c: int, with_proof: bool) -> Row:
    walk_for.cache_clear()
    start = time.perf_counter()
    plan = chunked_copy_rounds(n, c)
    seconds = time.perf_counter() - start
    walk_for.cache_clear()
    start = time.perf_counter()
    schedule = synthesize("stragglar", n, chunks=c)
    synth_seconds = time.perf_counter() - start
    if schedule.exposed_rounds != plan.num_rounds:
        raise SystemExit(
            f"N={n} C={c}: synthesized {schedule.exposed_rounds} rounds, planned {plan.num_rounds}"
        )
    prove_seconds = None
    if with_proof:
        start = time.perf_counter()
        prove(schedule)
        prove_seconds = time.perf_counter() - start
    bound = plan.lower_bound
    copies = sum(map(len, plan.rounds))
    return Row(
        n,
        c,
        plan.num_rounds,
        bound,
        plan.num_rounds - bound,
        copies,
        seconds,
        synth_seconds,
        prove_seconds,
        plan.method,
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| N | C | rounds | bound | gap | copies | construct (s) | synthesize (s) | prove (s) | method |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        proof = "-" if r.prove_seconds is None else f"{r.prove_seconds:.2f}"
        lines.append(
            f"| {r.n} | {r.c} | {r.rounds} | {r.bound} | {r.gap} | {r.copies:,} | "
            f"{r.seconds:.3f} | {r.synth_seconds:.3f} | {proof} | {r.method} |"
        )
    at_bound = sum(r.gap == 0 for r in rows)
    lines.append(f"\n{at_bound} of {len(rows)} rows at the bound; largest gap {max(r.gap for r in rows)}.")
    return "\n".join(lines)


@dataclass(frozen=True)
class Timed:
    n: int
    exposed_rounds: int
    bound: int
    synth_seconds: float


def sweep(lo: int, hi: int) -> list[Timed]:
    """Whole synthesis at C = N-1 for every N in ``lo..hi``; a bar on a terminal (it takes minutes)."""
    from tqdm import tqdm

    return [timed(n) for n in tqdm(range(lo, hi + 1), disable=not sys.stderr.isatty(), unit="N")]


def timed(n: int) -> Timed:
    """One size, the walk cache cleared.  The schedule dies on return, outside the timing: kept
    alive into the next size, its millions of transfers would be walked by the collector there."""
    walk_for.cache_clear()
    start = time.perf_counter()
    schedule = synthesize("stragglar", n)
    seconds = time.perf_counter() - start
    return Timed(n, schedule.exposed_rounds, schedule.metadata["lower_bound"], seconds)


def sweep_table(rows: list[Timed], limit: float) -> str:
    slowest = sorted(rows, key=lambda r: -r.synth_seconds)[:10]
    lines = ["| N | rounds | bound | synthesize (s) |", "|---:|---:|---:|---:|"]
    lines += [f"| {r.n} | {r.exposed_rounds} | {r.bound} | {r.synth_seconds:.3f} |" for r in slowest]
    at_bound = sum(r.exposed_rounds == r.bound for r in rows)
    over = [r.n for r in rows if r.synth_seconds > limit]
    lines.append(
        f"\nN = {rows[0].n}..{rows[-1].n}: {at_bound} of {len(rows)} at the bound; "
        f"{len(over)} took longer than {limit:g} s{': ' + ', '.join(map(str, over)) if over else ''}; "
        f"median {sorted(r.synth_seconds for r in rows)[len(rows) // 2]:.3f} s."
    )
    return "\n".join(lines)


def cases_of(gpus: list[int] | None) -> list[tuple[int, int]]:
    """The cases whose N is in ``gpus`` (all of them without it), refusing an N that has none:
    it would have run nothing and printed an empty table."""
    if gpus is None:
        return list(CASES)
    have = sorted({n for n, _ in CASES})
    missing = [n for n in gpus if n not in have]
    if missing:
        cases = ", ".join(map(str, have))
        raise InputError(f"--gpus: no case has N = {', '.join(map(str, missing))} (the cases' N: {cases})")
    return [(n, c) for n, c in CASES if n in gpus]


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_gpus(says="only the cases of these rank counts (default: every case's)")
    parser.add_argument("--prove", action="store_true", help="also prove every schedule (slow for N=1024)")
    parser.add_argument(
        "--json", type=json_output, metavar="FILE", help="write the rows and the machine to this file"
    )
    parser.add_argument("--every", nargs=2, type=ranks, metavar=("LO", "HI"), help="sweep LO..HI, C = N-1")
    parser.add_argument(
        "--limit", type=duration(positive=True), help="with --every: how long an N may take (default: 2s)"
    )
    args = parser.parse_args(argv)
    if args.every:
        for given, option in ((args.prove, "--prove"), (args.gpus, "--gpus")):
            if given:
                parser.error(f"{option} applies to the table of cases, not to --every")
        lo, hi = args.every
        if lo > hi:
            parser.error(f"--every needs LO <= HI, got {lo} and {hi}")
        limit = 2.0 if args.limit is None else args.limit
        sizes = sweep(lo, hi)
        print(sweep_table(sizes, limit))
        if args.json:
            save(args.json, {"limit_s": limit, "sweep": [asdict(r) for r in sizes]})
        return
    if args.limit is not None:
        parser.error("--limit applies to --every only")
    try:
        cases = cases_of(args.gpus)
    except InputError as e:
        parser.error(str(e))
    print(f"z3 {z3.get_version_string()} (imported before timing)")
    rows = [measure(n, c, args.prove) for n, c in each(cases, lambda case: f"N = {case[0]}, C = {case[1]}")]
    print(table(rows))
    if args.json:
        save(args.json, {"z3": z3.get_version_string(), "rows": [asdict(r) for r in rows]})


if __name__ == "__main__":
    as_command(main)
