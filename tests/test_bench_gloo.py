"""benchmarks/bench_gloo.py: an option given on its command line replaces the grid's, whatever
its spelling (bench refuses an option given twice, so the grid's and the user's both going in
made ``--iters 3`` an error), and ``--backend`` is refused in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize(
    ("argv", "replaced"),
    [
        (["--iters", "3"], "--iters"),
        (["--iters=3"], "--iters"),
        (["-n8"], "--gpus"),
        (["--no-graphs", "--timeout", "9s"], "--timeout"),
    ],
)
def test_an_option_given_replaces_the_grids(
    argv: list[str], replaced: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gloo

    line = bench_gloo.command_line(argv)
    assert line[0] == "bench" and line[-len(argv) :] == argv
    assert replaced not in line[: -len(argv)]  # the grid's is gone, the user's stays, once
    kept = {option for option in bench_gloo.GRID if option != replaced}
    assert kept <= set(line) and bench_gloo.GRID["--sizes"] in line


def test_the_cli_takes_the_line_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench's own check of repeated options passes the line (it raised before the fix)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gloo

    from stragglar.cli import _refuse_repeated, cli

    line = bench_gloo.command_line(["--iters", "3", "--gpus=4"])
    with cli.make_context("stragglar", [], resilient_parsing=True) as ctx:
        _refuse_repeated(cli.commands["bench"], ctx, line[1:])


def test_backend_is_refused_in_its_other_spelling() -> None:
    """``--backend=local`` too (``--backend local`` is tested in test_bench_options)."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_gloo.py"), "--backend=local"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "bench_gloo.py: error: --backend: this grid is gloo's; use stragglar bench\n"
