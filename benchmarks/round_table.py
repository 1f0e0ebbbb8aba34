"""The README's "Rounds achieved" table: StragglAR's phase-2 rounds against R*(N), generated, not typed.

Every schedule is proved before it is counted.  The reference column holds the public reference
synthesizer's rounds as measured in the project notes (docs/model.md); "-" where
they give none.

    python benchmarks/round_table.py            print the markdown table
    python benchmarks/round_table.py --write    rewrite the README section between the markers
    python benchmarks/round_table.py --check    exit 1 if the README section is out of date
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from stragglar.schedule import round_lower_bound
from stragglar.synth import synthesize
from stragglar.verify import prove

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- rounds-table:start -->", "<!-- rounds-table:end -->"
SIZES = (*range(2, 65), 96, 100, 127, 128, 192, 200, 255, 256, 300, 500, 511, 512, 1000, 1024)

# Measured figures for the reference tool (shared model notes); powers of two up to 256 reach R*(N).
REFERENCE = {4: "crashes", 6: 7, 10: 12, 12: 15, 14: 17, 18: 21, 20: 24, 24: 27, 48: 55, 96: 106, 192: 209}
REFERENCE_POW2_MAX = 256


@dataclass(frozen=True)
class Row:
    n: int
    bound: int
    rounds: int
    method: str

    @property
    def gap(self) -> int:
        return self.rounds - self.bound


def measure(n: int) -> Row:
    """Synthesize StragglAR for ``n`` GPUs, prove it, and count its rounds after the straggler arrives."""
    schedule = synthesize("stragglar", n)
    proof = prove(schedule)
    return Row(n, round_lower_bound(n), proof.exposed_rounds, str(schedule.metadata.get("method", "?")))


def reference(n: int) -> str:
    if n % 2:
        return "unsupported"
    if n in REFERENCE:
        return str(REFERENCE[n])
    if n & (n - 1) == 0 and 8 <= n <= REFERENCE_POW2_MAX:
        return str(round_lower_bound(n))
    return "-"


def table(rows: list[Row]) -> str:
    """A markdown table, one row per N, and a line counting the sizes that reach R*(N)."""
    lines = [
        "| N | R*(N) | StragglAR rounds | gap | method | reference tool |",
        "|---:|---:|---:|---:|---|---:|",
    ]
    lines += [f"| {r.n} | {r.bound} | {r.rounds} | {r.gap} | {r.method} | {reference(r.n)} |" for r in rows]
    optimal = sum(r.gap == 0 for r in rows)
    worst = max(r.gap for r in rows)
    lines += ["", f"{optimal} of {len(rows)} sizes reach R*(N); the largest gap is {worst}."]
    return "\n".join(lines)


def replace_section(text: str, body: str) -> str:
    """``text`` with everything between the markers replaced by ``body``."""
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"{README}: markers {START} ... {END} not found")
    return f"{head}{START}\n{body}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the README section")
    mode.add_argument("--check", action="store_true", help="exit 1 if the README section is out of date")
    args = parser.parse_args(argv)
    body = table([measure(n) for n in SIZES])
    if not (args.write or args.check):
        print(body)
        return 0
    current = README.read_text(encoding="utf-8")
    updated = replace_section(current, body)
    if args.write:
        README.write_text(updated, encoding="utf-8")
        print(f"wrote the rounds table into {README}")
        return 0
    if updated != current:
        print(f"{README}: the rounds table is out of date; run python benchmarks/round_table.py --write")
        return 1
    print(f"{README}: the rounds table is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
