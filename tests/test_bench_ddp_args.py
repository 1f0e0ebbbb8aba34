"""benchmarks/bench_ddp.py refuses, before its ranks start, a run it would judge wrongly: a late
rank outside the world was never late, yet its run was held to the late target; too few steps
after the warm-up failed with a traceback after both trainings."""

from __future__ import annotations

import pytest
from test_bench_options import refused_at_once

pytest.importorskip("torch")  # bench_ddp.py imports it first


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--late", "4"], "--late 4: the ranks are 0 to 3"),
        (["--gpus", "2", "--late", "-1"], "argument --late: '-1': need a whole number of 0 or more"),
        (["--steps", "4", "--warmup", "4"], "--steps 4 leaves 0 after --warmup: need 2 or more"),
        (["--chunks", "2"], "--chunks 2: StragglAR over 4 ranks needs at least 3"),
        (["--delay", "30"], "argument --delay: '30' needs a unit: write 30ms or 30s (or us)"),
    ],
)
def test_a_run_it_would_judge_wrongly_is_refused_before_the_ranks_start(args: list[str], said: str) -> None:
    assert refused_at_once(["bench_ddp.py", *args]) == f"bench_ddp.py: error: {said}"
