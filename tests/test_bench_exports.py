"""benchmarks/bench_msccl.py and bench_mscclpp.py: the export's time is the lowering's alone (the
schedule proved once, before the timing: bench_mscclpp proved it inside each timed run), and a
size or an --instances they refuse is refused before the header, before any size is measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stragglar.schedule import Schedule
from stragglar.verify import Proof, prove

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("name", ["bench_msccl", "bench_mscclpp"])
def test_the_schedule_is_proved_once_outside_the_timed_export(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench = __import__(name)
    proved: list[int] = []

    def counted(schedule: Schedule) -> Proof:
        proved.append(schedule.num_ranks)
        return prove(schedule)

    monkeypatch.setattr(bench, "prove", counted)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--gpus", "4", "6", "--repeats", "3"])
    bench.main()
    assert proved == [4, 6]  # once per size, not once per timed repeat
    assert len(capsys.readouterr().out.splitlines()) == 4  # the two header lines, a row per size


@pytest.mark.parametrize("name", ["bench_msccl.py", "bench_mscclpp.py"])
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--gpus", "8", "3", "--algorithm", "rhd"],
            "Error: rhd needs a power-of-two number of GPUs, got 3",
        ),
        (["--gpus", "8", "--instances", "100000"], "Error: "),
    ],
)
def test_a_refused_input_stops_before_the_header(name: str, args: list[str], said: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args, "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == "", done.stdout  # no header, no row for N = 8
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(said), done.stderr
