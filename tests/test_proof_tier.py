"""The CI proof tier: every schedule proved, z3 and the simulator side by side (``pytest -m proofs``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stragglar.formats import schedule_json
from stragglar.proof_tier import (
    TABLE_HEADER,
    ProofRow,
    Skipped,
    format_table,
    proof_count,
    prove_all,
    prove_files,
)
from stragglar.schedule import Op, Phase, Schedule, Transfer
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import VerificationError

SHIPPED = Path(__file__).resolve().parent.parent / "schedules" / "json"


def sizes(algorithm: str, up_to: int) -> set[int]:
    return {n for n in range(2, up_to + 1) if algorithm != "rhd" or n & (n - 1) == 0}


def proved(rows: list[ProofRow | Skipped]) -> list[ProofRow]:
    """``rows``, every one of them a proof: a skipped one fails the test."""
    assert all(isinstance(row, ProofRow) for row in rows), rows
    return [row for row in rows if isinstance(row, ProofRow)]


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
        assert row.lower_bound is None or row.steps >= row.lower_bound  # the bound counts chunk-steps


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
    rows = proved(list(prove_files([good])))
    assert [(r.algorithm, r.num_ranks, r.method, r.source) for r in rows] == [
        ("ring", 5, "smt", "ring-n5.json"),
        ("ring", 5, "simulate", "ring-n5.json"),
    ]
    with pytest.raises(VerificationError, match="rank 0 chunk 0 lacks"):
        list(prove_files([good, bad]))


def test_a_file_too_big_for_z3_is_skipped_by_z3_and_proved_by_the_simulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """z3 refuses a schedule past its limit before starting (N = 520 has 269,880 ranks x chunks,
    more than 512 x 512); the file is not wrong for it, and the simulator proves any size."""
    path = tmp_path / "ring-n5.json"
    schedule_json.write(synthesize("ring", 5), path)
    monkeypatch.setattr("stragglar.verify.smt.SMT_MAX_CELLS", 24)  # ring-n5: 25
    skipped, row = prove_files([path])
    assert skipped == Skipped("ring-n5.json", "25 ranks x chunks, more than the 24 z3 takes")
    assert isinstance(row, ProofRow) and row.method == "simulate" and row.source == "ring-n5.json"
    assert format_table([skipped, row]).splitlines()[1] == f"z3 skipped {skipped.source}: {skipped.reason}"


def test_rounds_count_rounds_and_steps_count_chunk_steps() -> None:
    """rhd and direct move several chunks over one link in a round: "rounds" counted those steps."""
    rows = prove_all(max_smt=2, max_baseline_smt=2, max_simulated=5)
    figures = {(r.algorithm, r.num_ranks): (r.rounds, r.steps, r.lower_bound) for r in rows}
    assert figures[("direct", 5)] == (3, 12, None) and figures[("rhd", 4)] == (4, 6, None)
    assert figures[("ring", 5)] == (8, 8, None) and figures[("stragglar", 5)] == (6, 6, 6)


@pytest.mark.parametrize("bounds", [(2, 2, 2), (6, 4, 8), (3, 5, 2), (2, 2, 40)])
def test_the_proof_count_is_known_before_the_proofs(bounds: tuple[int, int, int]) -> None:
    """A progress bar's total: prove-all's bar counted without one."""
    assert proof_count(*bounds) == len(list(prove_all(*bounds)))


@pytest.mark.proofs
def test_every_schedule_is_proved_by_z3_and_the_simulator() -> None:
    rows = list(prove_all())
    assert_covers(rows, 32, 16, 128)
    print("\n" + format_table(rows))


@pytest.mark.proofs
def test_every_shipped_schedule_file_is_proved_by_both() -> None:
    files = sorted(SHIPPED.glob("*.json"))
    rows = proved(list(prove_files(files)))
    assert len(files) >= 8 and len(rows) == 2 * len(files)
    assert all(row.steps == row.lower_bound for row in rows)
    print("\n" + format_table(rows))
