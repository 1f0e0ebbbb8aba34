"""Benchmarks taking a list of rank counts refuse one given twice, in one line, before any work:
bench_runtime timed the second "first lookup" of a size as a cache hit, bench_tooling divided by
zero fitting two equal N.  And bench_tooling lists every step it skips, with its prediction in
figures that say something (``predicted 0 s > budget`` at a 10 ms budget)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_bench_options import refused_at_once

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize(
    "args",
    [
        ["bench_runtime.py", "--gpus", "8", "64", "8"],
        ["bench_tooling.py", "--gpus", "64", "64", "--budget", "5s"],
        ["bench_msccl.py", "--gpus", "8", "8"],
        ["bench_mscclpp.py", "--gpus", "8", "8"],
        ["bench_smt.py", "--gpus", "8", "8"],
        ["bench_synth.py", "--gpus", "8", "8"],
        ["bench_detect.py", "--gpus", "8", "8"],
        ["bench_chunked_gloo.py", "--gpus", "4", "4"],
    ],
)
def test_a_rank_count_given_twice_is_refused(args: list[str]) -> None:
    line = refused_at_once(args)
    assert line.endswith(f"argument {args[1]}: {args[2]} given more than once: give each once")


@pytest.mark.parametrize(
    "script",
    [
        "bench_synth.py",
        "bench_smt.py",
        "bench_msccl.py",
        "bench_mscclpp.py",
        "bench_runtime.py",
        "bench_tooling.py",
        "bench_detect.py",
    ],
)
def test_rank_counts_are_gpus_as_in_stragglar(script: str) -> None:
    """``--sizes`` is a buffer's bytes in ``stragglar bench`` and bench_chunked_gloo; these took
    it for N."""
    assert refused_at_once([script, "--sizes", "8"]).endswith("unrecognized arguments: --sizes 8")


def test_each_repeat_is_named_once() -> None:
    line = refused_at_once(["bench_runtime.py", "--gpus", "8", "64", "8", "64", "8"])
    assert line.endswith(": 8, 64 given more than once: give each once")


def test_tooling_lists_every_step_it_skips_with_its_prediction() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_tooling.py"), "--gpus", "8", "16", "--budget", "1us"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    skipped = [line for line in done.stdout.splitlines() if line.startswith("skipped: ")]
    assert skipped[0].startswith("skipped: synth at N=16: predicted ")
    assert skipped[0].endswith(" s > budget 1e-06 s") and "predicted 0 s" not in skipped[0]
    assert skipped[1:] == [
        f"skipped: {step} at N=16: needs the schedule, and synth was skipped" for step in ("prove", "smt")
    ]
