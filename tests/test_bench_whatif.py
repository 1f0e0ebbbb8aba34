"""benchmarks/bench_whatif.py: a trace it writes is read and replayed to its late rank, and the
verdict under the table is the largest N's, against the target in rows a second."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_a_small_trace_is_timed_and_its_late_rank_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_whatif

    result = bench_whatif.bench(tmp_path, 8, 60, runs=1)
    assert (result.n, result.steps, result.rows) == (8, 60, 480) and result.read_s > 0 and result.replay_s > 0
    lines = (tmp_path / "trace_8.csv").read_text().splitlines()
    assert lines[0] == "step,rank,time" and len(lines) == 481 and lines[1].startswith("0,0,0.000")


def test_the_verdict_is_the_largest_ns_against_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_whatif

    slow_small = bench_whatif.Result(8, 1000, 8000, 0.05, 0.15)  # 40,000 rows a second: not judged
    fast = bench_whatif.Result(256, 2000, 512_000, 2.0, 1.2)  # 160,000 rows a second
    slow = bench_whatif.Result(256, 2000, 512_000, 6.0, 6.8)  # 40,000
    assert bench_whatif.table([slow_small, fast]).endswith(
        "read and replayed at N=256: 160,000 rows a second (target >= 100,000: met)"
    )
    assert bench_whatif.table([slow, slow_small]).endswith(
        "N=256: 40,000 rows a second (target >= 100,000: MISSED)"
    )
    assert "| 256 | 2,000 | 512,000 | 2.00 | 1.20 | 160,000 |" in bench_whatif.table([fast])
