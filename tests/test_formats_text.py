"""The readable table: it must say exactly what the schedule does, line up, and stay fast."""

from __future__ import annotations

import itertools
import re
import time
from collections import Counter

import pytest

from stragglar.formats.text import render
from stragglar.schedule import Op, Phase, Schedule, Transfer
from stragglar.synth import synthesize

C, R = Op.COPY, Op.REDUCE
ITEM = re.compile(r"(\d+)(->|<>)(\d+) c([\d,-]+)(\+?)")
ROW = re.compile(r"  round +(\d+) \| (.*)")


def chunks(text: str) -> list[int]:
    """Expand ``0-3,6`` to ``[0, 1, 2, 3, 6]``."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def parse(table: str) -> list[list[Counter[Transfer]]]:
    """Read a rendered table back into per-phase, per-round multisets of transfers."""
    phases: list[list[Counter[Transfer]]] = []
    for line in table.splitlines():
        row = ROW.fullmatch(line)
        if row is None:
            assert line.startswith("phase "), line
            phases.append([])
            continue
        assert int(row[1]) == len(phases[-1])
        transfers: Counter[Transfer] = Counter()
        for src, arrow, dst, cs, plus in ITEM.findall(row[2] if row[2] != "-" else ""):
            op = R if plus else C
            for c in chunks(cs):
                transfers[Transfer(int(src), int(dst), c, op)] += 1
                if arrow == "<>":
                    assert plus, "an exchange always reduces"
                    transfers[Transfer(int(dst), int(src), c, op)] += 1
        phases[-1].append(transfers)
    return phases


def as_counters(schedule: Schedule) -> list[list[Counter[Transfer]]]:
    return [[Counter(rnd) for rnd in phase.rounds] for phase in schedule.phases]


@pytest.mark.parametrize("n", range(2, 21))
def test_stragglar_table_reads_back_to_the_schedule(n: int) -> None:
    for straggler in sorted({0, n // 2, n - 1}):
        schedule = synthesize("stragglar", n, straggler)
        assert parse(render(schedule)) == as_counters(schedule)


@pytest.mark.parametrize(("algorithm", "n"), [("ring", 5), ("rhd", 16), ("direct", 9), ("direct", 2)])
def test_baseline_tables_read_back_to_the_schedule(algorithm: str, n: int) -> None:
    schedule = synthesize(algorithm, n)
    assert parse(render(schedule)) == as_counters(schedule)


def test_every_exchange_with_the_straggler_is_one_item() -> None:
    table = render(synthesize("stragglar", 10, straggler=4))
    exposed = table.split("phase 1 ")[1].splitlines()[1:]
    for t in range(9):
        peer = t if t < 4 else t + 1
        a, b = sorted((peer, 4))
        assert re.search(rf"\| {a}<>{b} +c{t} *\+", exposed[t]), exposed[t]
    assert "<>" not in "\n".join(exposed[9:])


def test_header_names_phase_ranks_and_rounds() -> None:
    lines = render(synthesize("stragglar", 12, straggler=3)).splitlines()
    headers = [line for line in lines if line.startswith("phase ")]
    assert headers == [
        "phase 0 'reduce-scatter', ranks 0-2,4-11: 10 rounds",
        "phase 1 'exchange', ranks 0-11: 14 rounds",
    ]


def test_items_line_up_within_a_phase() -> None:
    table = render(synthesize("stragglar", 16))
    for block in table.split("phase ")[1:]:
        starts: set[int] = set()
        widths: set[int] = set()
        for line in block.splitlines()[1:]:
            matches = list(ITEM.finditer(line))
            starts.update(m.start() for m in matches)
            widths.update(b.start() - a.start() for a, b in itertools.pairwise(matches))
        assert len(widths) == 1, widths
        step = widths.pop()
        first = min(starts)
        assert all((s - first) % step == 0 for s in starts)


def test_only_matching_reduces_both_ways_make_an_exchange() -> None:
    rounds = (
        (Transfer(0, 1, 0, C), Transfer(1, 0, 0, C)),
        (Transfer(0, 1, 0, R), Transfer(1, 0, 1, R)),
        (Transfer(0, 1, 0, R), Transfer(1, 0, 0, C)),
        (),
        (Transfer(1, 0, 0, R), Transfer(1, 0, 1, R), Transfer(0, 1, 1, R), Transfer(0, 1, 0, R)),
    )
    table = render(Schedule("demo", 2, 2, None, (Phase("p", (0, 1), rounds),)))
    assert table.splitlines() == [
        "phase 0 'p', ranks 0-1: 5 rounds",
        "  round 0 | 0->1 c0     1->0 c0",
        "  round 1 | 0->1 c0+    1->0 c1+",
        "  round 2 | 0->1 c0+    1->0 c0",
        "  round 3 | -",
        "  round 4 | 0<>1 c0-1+",
    ]


def test_a_repeated_transfer_stays_visible() -> None:
    rnd = (Transfer(0, 1, 0, C), Transfer(0, 1, 0, C))
    schedule = Schedule("demo", 2, 1, None, (Phase("p", (0, 1), (rnd,)),))
    assert render(schedule).splitlines()[1] == "  round 0 | 0->1 c0,0"
    assert parse(render(schedule)) == as_counters(schedule)


def test_multi_chunk_links_are_grouped() -> None:
    table = render(synthesize("rhd", 8))
    assert "  round 0 | 0->4 c4-7+  1->5 c4-7+" in table
    assert "  round 2 | 0->4 c0-3  1->5 c0-3" in table


def test_items_are_padded_to_the_widest_of_the_phase() -> None:
    row = render(synthesize("stragglar", 12)).splitlines()[1]
    assert row.startswith("  round 0 | 0->1 c10+   1->2 c0+    2->3 c1+ ")
    assert row.endswith("   10->0 c9+")


@pytest.mark.slow
def test_1024_ranks_render_in_seconds() -> None:
    schedule = synthesize("stragglar", 1024)
    start = time.perf_counter()
    table = render(schedule)
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"render took {elapsed:.1f} s"
    assert table.count("\n") + 1 == 2 + schedule.num_rounds
    assert table.count("<>") == 1023
