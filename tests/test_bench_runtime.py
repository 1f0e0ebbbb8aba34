"""benchmarks/bench_runtime.py's device rows: a device call's host bookkeeping timed both ways
(the phases a rank has rows in worked out once, and scanned from its rows as calls did before),
which must agree for every rank; and the verdict under the table on rows whose truth is known."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_device_rows_time_both_ways_and_name_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_runtime

    result = bench_runtime.device_bench(5, 12, calls=20)
    assert (result.n, result.chunks) == (5, 12) and result.bookkeeping_us > 0 and result.scanning_us > 0
    met = bench_runtime.DeviceResult(8, 64, 4.0, 120.0)
    missed = bench_runtime.DeviceResult(8, 64, 12.0, 120.0)
    assert bench_runtime.device_table([met]).endswith(
        "at N=8 C=64: 4.00 us (target <= 10.8 us: met), 30x less than with the rows scanned"
    )
    assert "12.00 us (target <= 10.8 us: MISSED), 10x less" in bench_runtime.device_table([missed, result])


def test_scanning_the_rows_finds_the_phases_a_program_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_runtime

    from stragglar.runtime.device import program_for
    from stragglar.synth import synthesize
    from stragglar.verify import prove

    program = program_for(prove(synthesize("stragglar", 6)), direct=False)
    for rank in range(6):
        assert bench_runtime.scanned_phase_ends(program, rank, 3.0) == program.phase_ends(rank, 3.0)
    assert bench_runtime.scanned_phase_ends(program, 5, 3.0)[0] is None  # the late rank: not in phase 0
