"""``bound`` and ``prove-all`` (:mod:`stragglar.commands.model`): z3's lower bound and its expected
answers, and a row per proof."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from cli_results import one_error, run

from stragglar.commands import terminal
from stragglar.formats import schedule_json
from stragglar.synth import synthesize
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


def test_prove_all_of_a_file_too_big_for_z3_is_proved_by_the_simulator_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A correct file past z3's limit (N = 520: 269,880 ranks x chunks) was FAILED, exit 2, with
    advice about verify's --smt; here the limit is lowered to 24 cells, below ring-n5's 25."""
    path = tmp_path / "ring-n5.json"
    schedule_json.write(synthesize("ring", 5), path)
    monkeypatch.setattr("stragglar.verify.smt.SMT_MAX_CELLS", 24)
    result = run("prove-all", "-v", str(path))
    assert result.exit_code == 0 and result.stderr == "", result.output
    _, skipped, row, summary = result.stdout.splitlines()
    assert skipped == "z3 skipped ring-n5.json: 25 ranks x chunks, more than the 24 z3 takes"
    assert row.split()[:5] == ["ring", "5", "8", "-", "simulate"]
    assert summary == "proved all 1 file, 1 by the simulator alone (too big for z3)"
    monkeypatch.setattr("stragglar.verify.smt.SMT_MAX_CELLS", 25)
    monkeypatch.setattr("stragglar.verify.smt.SMT_MAX_TRANSFERS", 10)  # ring-n5 has 40
    result = run("prove-all", str(path))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1] == "z3 skipped ring-n5.json: 40 transfers, more than the 10 z3 takes"


def test_prove_all_of_a_wrong_file_too_big_for_z3_fails_as_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A well-formed wrong schedule is exit 1 (exit 2 is bad input), too big for z3 or not: z3's
    refusal was taken for the failure, exit 2, and hid what the simulator finds wrong."""
    broken = schedule_json.to_document(synthesize("ring", 5))
    broken["phases"][0]["rounds"][0][0]["op"] = "copy"
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(broken))
    monkeypatch.setattr("stragglar.verify.smt.SMT_MAX_CELLS", 24)
    result = run("prove-all", "-v", str(path))
    assert one_error(result, 1) == f"Error: 1 of 1 files failed: {path}"
    failed = result.stdout.splitlines()[1]
    assert failed.startswith(f"FAILED {path}: final state: ") and "lacks contribution" in failed, failed


def test_prove_all_rounds_are_rounds_with_chunk_steps_where_they_differ(tmp_path: Path) -> None:
    """``synth`` says direct at N = 5 takes "3 rounds (12 chunk-steps)" after the straggler
    arrives; the rounds column said 12.  A file and the shipped table say the same."""
    path = tmp_path / "d5.json"
    schedule_json.write(synthesize("direct", 5), path)
    from_file = run("prove-all", str(path))
    assert from_file.exit_code == 0, from_file.output
    smt, simulate = (row.split()[:5] for row in from_file.stdout.splitlines()[1:3])
    assert smt == ["direct", "5", "3(12)", "-", "smt"] and simulate[2:] == ["3(12)", "-", "simulate"]
    shipped = run("prove-all", "--max-gpus", "5", "--max-simulated", "5")
    assert shipped.exit_code == 0, shipped.output
    cells = {(r.split()[0], r.split()[1]): r.split()[2] for r in shipped.stdout.splitlines()[1:-1]}
    assert cells[("direct", "5")] == "3(12)" and cells[("rhd", "4")] == "4(6)"
    assert cells[("direct", "2")] == "1" and cells[("stragglar", "5")] == "6" and cells[("ring", "5")] == "8"


def test_prove_all_bar_counts_to_its_total(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schedules to prove are known before the first proof: the bar said ``proving: 5it``;
    its total is the rows that come (all but the header and the summary)."""
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr(terminal, "SHOW_AFTER", 0.0)  # quick work: its bar from the start
    result = run("prove-all", "--max-gpus", "3", "--max-simulated", "4")
    assert result.exit_code == 0, result.output
    rows = len(result.stdout.splitlines()) - 2
    assert "proving:" in result.stderr and f"/{rows} [" in result.stderr, result.stderr


def test_prove_all_of_files_shows_no_bar_for_quick_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work under a second shows nothing on a terminal, as every other command's: the bar was
    drawn from the first instant."""
    path = tmp_path / "d5.json"
    schedule_json.write(synthesize("direct", 5), path)
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    result = run("prove-all", str(path))
    assert result.exit_code == 0 and result.stderr == "", result.output


@pytest.mark.parametrize(
    ("collective", "seconds"),
    [
        ("allreduce", "N = 16 took 495"),
        ("reduce_scatter", "N = 24 took 263"),
        ("all_gather", "N = 24 took 151"),
    ],
)
def test_bound_refuses_too_many_gpus_in_the_same_words_for_every_collective(
    collective: str, seconds: str
) -> None:
    """The ReduceScatter and AllGather bounds answered 25 GPUs with rounds nobody asked for."""
    line = one_error(run("bound", "--collective", collective, "--gpus", "25"), 2)
    assert line == f"Error: need 2 to 24 GPUs, got 25: the z3 model grows as N^4 ({seconds} s on 2 cores)"


def test_bound_of_a_collective_says_one_round_and_one_chunk() -> None:
    """At N = 2 the counts are 1: "fewer than 1 chunks", "1 rounds with 1 chunks"."""
    result = run("bound", "--gpus", "2", "--collective", "reduce_scatter")
    assert result.exit_code == 0, result.output
    proof, ring, _ = result.stdout.splitlines()
    assert "fits in 0 rounds after the straggler arrives" in proof
    assert "with fewer than 1 chunk (1/2 of the buffer) through its port" in proof
    assert "; z3 fits 1 round with 1 chunk (" in proof
    assert ring == "Ring: 1 round, 1 chunk through the straggler's port each way"
    line = one_error(run("bound", "--gpus", "4", "--collective", "all_gather", "--chunks", "1"), 2)
    assert line == "Error: need a multiple of 4 chunks (one shard per GPU), got 1 chunk"
