"""The two benchmarks of fixed size run fewer cases on request, so that a change can be checked
in seconds: bench_chunked's ``--gpus`` keeps the cases of those N (all 66 took a minute), and
bench_detect's ``--trials`` shrinks every scenario in proportion (a full run takes three)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_bench_options import refused_at_once

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def benchmarks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield


def test_chunked_runs_only_the_cases_of_the_n_given(
    benchmarks: None, capsys: pytest.CaptureFixture[str]
) -> None:
    import bench_chunked

    bench_chunked.main(["--gpus", "5", "4"])
    rows = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line
    ]
    assert [row.split(" | ")[:2] for row in rows[1:]] == [
        ["| 4", "3"],
        ["| 4", "128"],
        ["| 4", "256"],
        ["| 5", "4"],
        ["| 5", "128"],
        ["| 5", "256"],
    ]  # in the cases' order, the header's row left out
    assert len(bench_chunked.cases_of(None)) == len(bench_chunked.CASES)  # without it: every case


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--gpus", "3", "4"], "--gpus: no case has N = 3 (the cases' N: 2, 4, 5, "),
        (["--every", "2", "3", "--gpus", "4"], "--gpus applies to the table of cases, not to --every"),
    ],
)
def test_chunked_refuses_an_n_without_cases_and_gpus_with_every(args: list[str], said: str) -> None:
    assert said in refused_at_once(["bench_chunked.py", *args])


def test_detect_with_fewer_trials_runs_each_scenario_shorter(
    benchmarks: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import bench_detect

    traced: list[int] = []  # the steps of each simulated trace

    def counting(trace: Callable[[Any, list[int | None]], list[list[float]]]) -> Callable[..., Any]:
        def counted(self: Any, truth: list[int | None]) -> list[list[float]]:
            traced.append(len(truth))
            return trace(self, truth)

        return counted

    monkeypatch.setattr(bench_detect.Arrivals, "trace", counting(bench_detect.Arrivals.trace))
    out = tmp_path / "detect.json"
    bench_detect.main(["--gpus", "4", "--trials", "4", "--json", str(out)])
    counts = json.loads(out.read_text())["counts"]
    assert counts == {
        "random_steps": 100,
        "traces": 10,
        "priced_trials": 2,
        "naming_trials": 4,
        "chance_steps": 2000,
    }
    # per rule: one random stretch, 10 random traces, 4 + 2 persistent, 4 moving, 2 + 1 coming and going
    assert sorted(traced) == sorted(2 * [100, *[100] * 10, *[320] * 6, *[140] * 4, *[220] * 3])
    assert bench_detect.Counts.scaled(400) == bench_detect.Counts()  # without it: the full run
