"""``stragglar whatif`` on inputs it must refuse in one line (exit 2) that say what is wrong: a
false-alarm probability too rare to work a threshold out for, a trace file that is not there
whatever its name, and a chunk count one group of several cannot use."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_results import one_error, run
from click.testing import Result

from stragglar.model.detect import MIN_FALSE_ALARM


def whatif(*args: str) -> Result:
    return run("whatif", *args)


def trace(tmp_path: Path, sizes: dict[str, int]) -> Path:
    """A CSV trace with a group of each size (rank 1 late by 20 ms at each of 12 steps)."""
    lines = ["g,rank,step,time"]
    for step in range(12):
        for group, n in sizes.items():
            lines += [f"{group},{rank},{step},{step + (0.02 if rank == 1 else 0)}" for rank in range(n)]
    path = tmp_path / "grp.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("value", ["2e-308", "1e-310", "5e-324", "1e-300", "1e-13"])
def test_a_false_alarm_rarer_than_the_floor_is_refused_in_one_line(tmp_path: Path, value: str) -> None:
    """Below about 1e-308 the threshold overflowed (a traceback); at 1e-300 it took half a minute."""
    error = one_error(whatif(str(trace(tmp_path, {"a": 4})), "--false-alarm", value, "--share", "0.3"), 2)
    assert error == (
        "Error: Invalid value for '--false-alarm': must be at least 1e-12 (the threshold of a rarer "
        f"false alarm takes too long to work out), got {float(value)}"
    )


def test_a_false_alarm_at_the_floor_is_taken(tmp_path: Path) -> None:
    result = whatif(str(trace(tmp_path, {"a": 4})), "--false-alarm", str(MIN_FALSE_ALARM))
    assert result.exit_code == 0, (result.output, result.exception)
    assert "false alarms at 1e-10% of steps" in result.output


@pytest.mark.parametrize("name", ["trace.log", "trace_3", "sub/host-pid1.log"])
def test_a_missing_trace_is_not_found_whatever_its_name(tmp_path: Path, name: str) -> None:
    """NCCL Inspector's files end in .log and Flight Recorder's have no suffix: a missing one is
    not found, not a file whose format cannot be told."""
    (tmp_path / "sub").mkdir()
    missing = tmp_path / name
    assert one_error(whatif(str(missing)), 2) == f"Error: file not found: {missing}"


def test_a_chunk_count_too_few_for_one_group_names_that_group(tmp_path: Path) -> None:
    path = trace(tmp_path, {"small": 4, "big": 8})
    error = one_error(whatif(str(path), "--group-col", "g", "--chunks", "5"), 2)
    assert error == "Error: group 'big': StragglAR needs at least N - 1 = 7 chunks, got 5"


def test_a_chunk_count_too_few_for_a_trace_of_one_group_names_none(tmp_path: Path) -> None:
    error = one_error(whatif(str(trace(tmp_path, {"a": 4})), "--chunks", "2"), 2)
    assert error == "Error: StragglAR needs at least N - 1 = 3 chunks, got 2"
