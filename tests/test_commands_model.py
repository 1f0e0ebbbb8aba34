"""``bound`` and ``prove-all`` (:mod:`stragglar.commands.model`): z3's lower bound and its expected
answers, and a row per proof."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from cli_results import one_error, run

from stragglar.verify.bound import prove_lower_bound
from stragglar.verify.shard_bound import shard_bound, shard_feasible


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


@pytest.mark.parametrize(
    ("collective", "title"), [("reduce_scatter", "ReduceScatter"), ("all_gather", "AllGather")]
)
def test_bound_of_a_reduce_scatter_or_all_gather_stands_beside_rings(collective: str, title: str) -> None:
    """The proof, Ring's figures and the verdict: for 4 GPUs, (N-1)/N of 4 chunks, 3, both ways."""
    result = run("bound", "--gpus", "4", "--collective", collective)
    assert result.exit_code == 0 and result.stderr == "", result.output
    proof, ring, verdict = result.stdout.splitlines()
    assert proof.startswith(
        f"proved: no {title} for 4 GPUs and 4 chunks fits in 2 rounds after the straggler arrives, nor in "
        "any number of rounds with fewer than 3 chunks (3/4 of the buffer) through its port"
    )
    assert proof.endswith("z3 fits 3 rounds with 3 chunks (" + proof.rsplit("(", 1)[1])
    assert ring == "Ring: 3 rounds, 3 chunks through the straggler's port each way"
    assert verdict == (
        f"no gain: a straggler-aware {title} needs as many rounds and bytes after the straggler arrives "
        "as Ring"
    )


def test_bound_of_the_allreduce_is_the_default() -> None:
    def without_seconds(text: str) -> str:
        return re.sub(r"[0-9.]+ s\)", "s)", text)

    default, named = run("bound", "--gpus", "4"), run("bound", "--gpus", "4", "--collective", "allreduce")
    assert default.exit_code == named.exit_code == 0
    assert without_seconds(default.stdout) == without_seconds(named.stdout)
    assert default.stdout.startswith(
        "proved: no phase 2 for 4 GPUs fits in 3 rounds, so R*(4) = 4 is optimal"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--collective", "all_gather", "--rounds", "2"],
            "Error: --rounds does not apply: the ReduceScatter and AllGather bounds ask their own round "
            "counts",
        ),
        (
            ["--collective", "reduce_scatter", "--chunks", "6"],
            "Error: need a multiple of 4 chunks (one shard per GPU), got 6 chunks",
        ),
        (["--collective", "scatter"], "Error: Invalid value for '--collective': 'scatter' is not one of"),
    ],
)
def test_bound_refuses_what_does_not_apply_to_a_collective(args: list[str], message: str) -> None:
    assert one_error(run("bound", "--gpus", "4", *args), 2).startswith(message)


def test_bound_of_a_collective_refuted_or_out_of_time_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    line = one_error(run("bound", "--gpus", "8", "--collective", "reduce_scatter", "--timeout", "1ms"), 3)
    assert line.startswith("Error: z3 gave no answer for the ReduceScatter for 8 GPUs and 8 chunks in ")
    proved = shard_bound("all_gather", 3)
    fits = shard_feasible("all_gather", 3, 2)  # what z3 would say if the bound were one too high
    monkeypatch.setattr(
        "stragglar.commands.model.shard_bound",
        lambda *args: dataclasses.replace(proved, rounds=3, fewer_rounds=fits),
    )
    line = one_error(run("bound", "--gpus", "3", "--collective", "all_gather"), 1)
    assert line == (
        "Error: z3 fits the AllGather for 3 GPUs and 3 chunks in 2 rounds after the straggler arrives, "
        "fewer than claimed"
    )
