"""A benchmark whose reader goes away (``| head -1``) ends as ``stragglar`` does: silently, exit
141 (128 + SIGPIPE); it ended with a BrokenPipeError's traceback and exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stragglar.commands.error_lines import PIPE_CLOSED

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize(
    "args",
    [
        ["bench_msccl.py", "--gpus", "8", "16", "32", "--repeats", "1"],
        ["bench_runtime.py", "--gpus", "8", "16", "--calls", "5"],
    ],
)
def test_a_reader_that_closes_after_one_line_ends_the_benchmark_quietly(args: list[str]) -> None:
    """Unbuffered, each line is written as printed: the rows after the first meet the closed pipe."""
    process = subprocess.Popen(
        [sys.executable, str(BENCHMARKS / args[0]), *args[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline()
    process.stdout.close()
    error = process.stderr.read().decode()
    assert process.wait(timeout=120) == PIPE_CLOSED and error == ""


def test_a_broken_pipe_in_main_is_exit_141(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import options

    def main() -> None:
        raise BrokenPipeError

    with pytest.raises(SystemExit) as info:
        options.as_command(main)
    assert info.value.code == PIPE_CLOSED
