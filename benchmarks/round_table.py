"""The README's "Rounds achieved" tables: StragglAR's phase-2 rounds against R*(N), and chunked
StragglAR's against C + ceil(log2 N) - 1 for a grid of (N, C), generated, not typed.

Every schedule is proved before it is counted.  The reference column holds the public reference
synthesizer's rounds as measured in the project notes (docs/model.md); "-" where
they give none.

    python benchmarks/round_table.py            print the markdown table
    python benchmarks/round_table.py --write    rewrite the README section between the markers
    python benchmarks/round_table.py --check    exit 1 if the README section is out of date
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from options import Parser, each, note

from stragglar.files import write_text
from stragglar.schedule import round_lower_bound
from stragglar.synth import synthesize
from stragglar.verify import prove

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- rounds-table:start -->", "<!-- rounds-table:end -->"
CHUNKED_START, CHUNKED_END = "<!-- chunked-table:start -->", "<!-- chunked-table:end -->"
SIZES = (*range(2, 65), 96, 100, 127, 128, 192, 200, 255, 256, 300, 500, 511, 512, 1000, 1024)
CHUNKED_SIZES = (2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 100, 128, 256)
CHUNK_COLUMNS = ("N-1", "2(N-1)", 16, 32, 64, 128, 256, 1024)

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


def chunk_count(n: int, column: int | str) -> int:
    if isinstance(column, int):
        return column
    return {"N-1": n - 1, "2(N-1)": 2 * (n - 1)}[column]


def chunked_gap(n: int, c: int) -> int:
    """Synthesize StragglAR for ``n`` GPUs in ``c`` chunks, prove it, and return its gap to the bound."""
    proof = prove(synthesize("stragglar", n, chunks=c))
    return proof.exposed_rounds - round_lower_bound(n, c)


def chunked_table() -> str:
    """One row per N, one column per chunk count: rounds after the straggler arrives."""
    cells: dict[tuple[int, int], int] = {}
    lines = [
        "| N | " + " | ".join(f"C = {c}" for c in CHUNK_COLUMNS) + " |",
        "|---:|" + "---:|" * len(CHUNK_COLUMNS),
    ]
    note(f"chunked StragglAR: {len(CHUNKED_SIZES)} sizes of N, up to {len(CHUNK_COLUMNS)} chunk counts each")
    for n in each(CHUNKED_SIZES, lambda n: f"chunked StragglAR at N = {n}"):
        row = []
        for column in CHUNK_COLUMNS:
            c = chunk_count(n, column)
            if c < n - 1 or (isinstance(column, int) and c in (n - 1, 2 * (n - 1))):
                row.append("-")  # too few chunks, or the same as an earlier column
                continue
            cells[n, c] = gap = chunked_gap(n, c)
            rounds = round_lower_bound(n, c) + gap
            row.append(str(rounds) if gap == 0 else f"{rounds} (+{gap})")
        lines.append(f"| {n} | " + " | ".join(row) + " |")
    at_bound = sum(g == 0 for g in cells.values())
    lines += ["", f"{at_bound} of {len(cells)} (N, C) pairs reach C + ceil(log2 N) - 1."]
    return "\n".join(lines)


def replace_section(text: str, body: str, start_mark: str = START, end_mark: str = END) -> str:
    """``text`` with everything between the markers replaced by ``body``."""
    head, start, rest = text.partition(start_mark)
    _, end, tail = rest.partition(end_mark)
    if not start or not end:
        raise SystemExit(f"{README}: markers {start_mark} ... {end_mark} not found")
    return f"{head}{start_mark}\n{body}\n{end_mark}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=(__doc__ or "").split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the README section")
    mode.add_argument("--check", action="store_true", help="exit 1 if the README section is out of date")
    args = parser.parse_args(argv)
    # about half a minute in all: a line per table, and the size at work once it takes a second
    note(f"StragglAR: {len(SIZES)} sizes of N, each synthesized and proved")
    body = table([measure(n) for n in each(SIZES, lambda n: f"StragglAR at N = {n}")])
    chunked = chunked_table()
    if not (args.write or args.check):
        print(f"{body}\n\n{chunked}")
        return 0
    current = README.read_text(encoding="utf-8")
    updated = replace_section(replace_section(current, body), chunked, CHUNKED_START, CHUNKED_END)
    if args.write:
        write_text(README, updated)
        print(f"wrote the rounds tables into {README}")
        return 0
    if updated != current:
        print(f"{README}: the rounds tables are out of date; run python benchmarks/round_table.py --write")
        return 1
    print(f"{README}: the rounds tables are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
