"""``bound`` and ``prove-all`` (:mod:`stragglar.commands.model`): z3's lower bound and its expected
answers, and a row per proof."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from cli_results import one_error, run

from stragglar.verify.bound import prove_lower_bound


def test_bound_proves_the_lower_bound() -> None:
    result = run("bound", "--gpus", "5")
    assert result.exit_code == 0, result.output
    assert "no phase 2 for 5 GPUs fits in 5 rounds, so R*(5) = 6 is optimal" in result.output


def test_bound_fitting_at_or_above_the_bound_is_the_expected_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    for rounds, where in (("4", "at"), ("5", "above")):
        result = run("bound", "--gpus", "4", "--rounds", rounds)
        assert result.exit_code == 0 and result.stderr == "", result.output
        expected = f"as expected, z3 fits phase 2 for 4 GPUs in {rounds} rounds, {where} the lower bound"
        assert result.stdout.startswith(expected), result.stdout
    fitted = prove_lower_bound(4, rounds=4)
    below = dataclasses.replace(fitted, rounds=3)  # what z3 would say if the bound were wrong
    monkeypatch.setattr("stragglar.commands.model.prove_lower_bound", lambda *args: below)
    line = one_error(run("bound", "--gpus", "4"), 1)
    assert line == "Error: z3 found a phase 2 for 4 GPUs in 3 rounds, below R*(4) = 4"


def test_prove_all_prints_a_row_per_proof(tmp_path: Path) -> None:
    result = run("prove-all", "--max-gpus", "3", "--max-simulated", "3")
    assert result.exit_code == 0, result.output
    rows = result.output.splitlines()[1:]
    assert any(r.split()[:5] == ["stragglar", "3", "3", "3", "smt"] for r in rows)
    assert len(rows) >= 10
