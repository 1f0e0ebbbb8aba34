"""The CI proof tier: every schedule proved, z3 and the simulator side by side (``pytest -m proofs``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stragglar.formats import schedule_json
from stragglar.proof_tier import TABLE_HEADER, ProofRow, format_table, prove_all, prove_files
from stragglar.schedule import Op, Phase, Schedule, Transfer
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import VerificationError

SHIPPED = Path(__file__).resolve().parent.parent / "schedules" / "json"


def sizes(algorithm: str, up_to: int) -> set[int]:
    return {n for n in range(2, up_to + 1) if algorithm != "rhd" or n & (n - 1) == 0}


def assert_covers(rows: list[ProofRow], max_smt: int, max_baseline_smt: int, max_simulated: int) -> None:
    """Exactly the promised proofs, and no StragglAR schedule beating its proved lower bound."""
    expected = set()
    for algorithm in ALGORITHMS:
        smt_up_to = max_smt if algorithm == "stragglar" else max_baseline_smt
        expected |= {(algorithm, n, "smt") for n in sizes(algorithm, smt_up_to)}
        expected |= {(algorithm, n, "simulate") for n in sizes(algorithm, max_simulated)}
    assert sorted((r.algorithm, r.num_ranks, r.method) for r in rows) == sorted(expected)
    for row in rows:
        assert row.seconds >= 0 and row.source == "synthesized"
        assert (row.lower_bound is None) == (row.algorithm != "stragglar")
        assert row.lower_bound is None or row.rounds >= row.lower_bound


def test_small_proof_table() -> None:
    rows = list(prove_all(max_smt=6, max_baseline_smt=4, max_simulated=8))
    assert_covers(rows, 6, 4, 8)
    table = format_table(rows).splitlines()
    assert table[0] == TABLE_HEADER and len(table) == len(rows) + 1
    assert table[1].split()[:5] == ["stragglar", "2", "1", "1", "smt"]


def test_files_are_proved_from_their_text_and_a_wrong_one_fails(tmp_path: Path) -> None:
    good, bad = tmp_path / "ring-n5.json", tmp_path / "half.json"
    schedule_json.write(synthesize("ring", 5), good)
    schedule_json.write(
        Schedule("half", 2, 1, None, (Phase("p", (0, 1), ((Transfer(0, 1, 0, Op.REDUCE),),)),)), bad
    )
    rows = list(prove_files([good]))
    assert [(r.algorithm, r.num_ranks, r.method, r.source) for r in rows] == [
        ("ring", 5, "smt", "ring-n5.json"),
        ("ring", 5, "simulate", "ring-n5.json"),
    ]
    with pytest.raises(VerificationError, match="rank 0 chunk 0 lacks"):
        list(prove_files([good, bad]))


@pytest.mark.proofs
def test_every_schedule_is_proved_by_z3_and_the_simulator() -> None:
    rows = list(prove_all())
    assert_covers(rows, 32, 16, 128)
    print("\n" + format_table(rows))


@pytest.mark.proofs
def test_every_shipped_schedule_file_is_proved_by_both() -> None:
    files = sorted(SHIPPED.glob("*.json"))
    rows = list(prove_files(files))
    assert len(files) >= 8 and len(rows) == 2 * len(files)
    assert all(row.rounds == row.lower_bound for row in rows)
    print("\n" + format_table(rows))
