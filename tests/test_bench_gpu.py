"""benchmarks/bench_gpu.py without a GPU: one line and exit 0; and its loopback part on the CuPy
stand-in (:mod:`fake_cupy`), which runs the same batched rounds and graphs, checked every call."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fake_cupy import FakeCuda, installed

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield from installed(monkeypatch)


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_gpu.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("no GPU: ") and done.stdout.count("\n") == 1, done.stdout


def test_the_loopback_part_times_eager_and_graph_calls_and_checks_each(cuda: FakeCuda) -> None:
    import bench_gpu

    rows = bench_gpu.loopback(sys.modules["cupy"], lambda: None, (4,), (4 << 10,), iters=2)
    assert [(r.n, r.chunks, r.size_bytes) for r in rows] == [(4, 3, 4096), (4, 32, 4096)]
    assert all(r.eager_ms > 0 and r.graph_ms > 0 and r.rounds > 0 for r in rows)
    # 2 ranges x 2 schedules: captured on the first graph call (the eager calls compiled the
    # kernels) and replayed in each of the 3 graph calls
    assert cuda.captures == 4 and cuda.replays == 2 * 2 * 3
    table = bench_gpu.loopback_table(rows)
    assert "| 4 | 32 | 4 KiB |" in table and table.count("\n") == 3


def test_a_wrong_result_stops_the_benchmark(cuda: FakeCuda) -> None:
    import bench_gpu

    bufs = [np.zeros(10, np.float32) for _ in range(3)]
    bench_gpu.fill(np, bufs)
    bufs[1][7] += 1  # as if a round had lost or misplaced a piece
    with pytest.raises(bench_gpu.Wrong, match="rank 0 has 10 wrong elements of 10"):
        bench_gpu.verify(np, bufs, "N=3")
