"""Chunked StragglAR: exchange rounds against C + ceil(log2 N) - 1, and synthesis time.

    python benchmarks/bench_chunked.py [--prove] [--json out.json]

One row per (N, C): rounds of the exchange phase, the lower bound, the gap, the optimum of the
restricted model (differs from the bound only for N = 3), wall-clock seconds of
``chunked_copy_rounds`` (the walk cache cleared first, so a size that needs the z3 model pays
for its solve; z3 itself is imported before the first row), and the method.  With ``--prove``
every row is also built into a full ``Schedule`` and proved by ``stragglar.verify.prove``
(slow for the largest rows), and the proof time is added.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

import z3

from stragglar.synth.chunked import chunked_copy_rounds, chunked_optimum, chunked_stragglar_allreduce
from stragglar.synth.chunked_tail import walk_for
from stragglar.verify import prove

CASES = (
    [(8, 256), (3, 2), (3, 64), (2, 64)]
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
    optimum: int
    copies: int
    seconds: float
    prove_seconds: float | None
    method: str


def measure(n: int, c: int, with_proof: bool) -> Row:
    walk_for.cache_clear()
    start = time.perf_counter()
    plan = chunked_copy_rounds(n, c)
    seconds = time.perf_counter() - start
    prove_seconds = None
    if with_proof:
        start = time.perf_counter()
        proof = prove(chunked_stragglar_allreduce(n, c))
        prove_seconds = time.perf_counter() - start
        if proof.straggler_rounds != plan.num_rounds:  # pragma: no cover - a bug if it happens
            raise SystemExit(
                f"N={n} C={c}: proved {proof.straggler_rounds} rounds, planned {plan.num_rounds}"
            )
    copies = sum(map(len, plan.rounds))
    optimum = chunked_optimum(n, c)
    bound = plan.lower_bound
    return Row(
        n,
        c,
        plan.num_rounds,
        bound,
        plan.num_rounds - bound,
        optimum,
        copies,
        seconds,
        prove_seconds,
        plan.method,
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| N | C | rounds | bound | gap | optimum | copies | seconds | prove (s) | method |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        proof = "-" if r.prove_seconds is None else f"{r.prove_seconds:.2f}"
        lines.append(
            f"| {r.n} | {r.c} | {r.rounds} | {r.bound} | {r.gap} | {r.optimum} | {r.copies:,} | "
            f"{r.seconds:.3f} | {proof} | {r.method} |"
        )
    at_optimum = sum(r.rounds == r.optimum for r in rows)
    worst = max(r.gap for r in rows)
    lines.append(f"\n{at_optimum} of {len(rows)} rows at the optimum; largest gap to the bound {worst}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prove", action="store_true", help="also prove every schedule (slow for N=1024)")
    parser.add_argument("--json", type=Path, help="write the rows and the machine to this file")
    args = parser.parse_args()
    print(f"z3 {z3.get_version_string()} (imported before timing)")
    rows = [measure(n, c, args.prove) for n, c in CASES]
    print(table(rows))
    if args.json:
        meta = {
            "date": date.today().isoformat(),
            "python": platform.python_version(),
            "machine": platform.machine(),
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
