"""benchmarks/bench_chunked_gloo.py: sizes that cannot run are refused in one line before the
calibration (99999GiB calibrated the smaller sizes for minutes, then died in NumPy's
allocation), and its JSON says what its table says when the model picks C = N-1."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_bench_options import refused_at_once

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--sizes", "99999GiB"],
            "out of memory: 4 ranks of 99,999 GiB (float32) need at least 999,990 GiB of host memory",
        ),
        (["--sizes", "3B"], "need size >= one element: 3 bytes hold no float32 element"),
        (["--fit-sizes", "1MiB", "6B"], "6 bytes is not a whole number of float32 elements"),
    ],
)
def test_sizes_that_cannot_run_are_refused_before_the_calibration(args: list[str], said: str) -> None:
    assert said in refused_at_once(["bench_chunked_gloo.py", "--gpus", "4", *args])


def test_the_json_has_no_comparison_where_the_table_shows_dashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the model picks C = N-1 the run compared the paper's schedule with itself: the JSON
    stored its times and ``gain: [1.0, ...]`` where the table shows "-"."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_chunked_gloo

    spread = (1.0, 1.0, 1.0)
    paper = bench_chunked_gloo.Row(
        4, 2**20, 0.01, 0.02, 3, 0.05, 0.04, 0.04, 0.01, 0.01, spread, spread, 1.0, 1.0
    )
    row = bench_chunked_gloo.as_json(paper)
    assert all(row[field] is None for field in bench_chunked_gloo.COMPARED) and row["paper"] == 0.04
    assert "| 3 = N-1 | 50 | 40 | - | 10 / - | - | - | - | - |" in bench_chunked_gloo.table([paper], {}, None)
    chunked = bench_chunked_gloo.Row(
        4, 2**20, 0.01, 0.02, 6, 0.05, 0.04, 0.03, 0.01, 0.01, spread, spread, 1.2, 1.3
    )
    assert (
        bench_chunked_gloo.as_json(chunked)["gain"] == spread
        and bench_chunked_gloo.as_json(chunked)["chunked"] == 0.03
    )
