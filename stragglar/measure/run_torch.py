"""The torch backend of ``stragglar run``: fork-started gloo ranks on 127.0.0.1.

Each iteration the late rank sleeps ``delay`` before the schedule and before gloo's all_reduce
alike.  Every wait for a peer is bounded by ``timeout`` plus that delay (a deliberately late peer
is not a silent one); the run as a whole is not, as long as every rank keeps reporting progress
(:func:`~stragglar.measure.launch.heartbeat` after every step).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist

from stragglar.measure import launch as launcher
from stragglar.measure.data import check, expected, payload
from stragglar.measure.launch import heartbeat, launch
from stragglar.measure.timing import Figures, iteration_figures
from stragglar.runtime import RankError, allreduce
from stragglar.runtime.engine import Timeline, classify, first_line
from stragglar.verify import Proof

__all__ = ["torch_figures"]


def torch_figures(
    proof: Proof,
    count: int,
    dtype: str,
    delay: float,
    iters: int,
    warmup: int,
    timeout: float,
    late: int,
    slack: float | None = None,
) -> Figures:
    """Run the ranks; per iteration, the slowest rank's time for the schedule and for all_reduce.

    ``slack`` (default :data:`stragglar.measure.launch.SLACK`): how long beyond the timeout a rank
    may go without reporting progress."""
    schedule = proof.schedule
    n = schedule.num_ranks
    want = expected(count, n, dtype)  # once, before the fork: the ranks share its pages
    args = (proof, count, dtype, want, delay, iters + warmup, timeout, late)
    per_rank = launch(
        _rank, n, args, timeout=timeout + delay, slack=launcher.SLACK if slack is None else slack
    )
    times, hidden, base = [], [], []
    for it in range(warmup, warmup + iters):
        total, done = iteration_figures(schedule, [timelines[it] for timelines, _ in per_rank])
        times.append(total)
        hidden.extend([done] if done is not None else [])
        base.append(max(baseline[it] for _, baseline in per_rank))
    return tuple(times), tuple(hidden), f"{dist.Backend.GLOO} all_reduce", tuple(base)


def _rank(
    rank: int,
    n: int,
    proof: Proof,
    count: int,
    dtype: str,
    want: np.ndarray,
    delay: float,
    runs: int,
    timeout: float,
    late: int,
) -> tuple[list[Timeline], list[float]]:
    schedule = proof.schedule
    torch.set_num_threads(1)  # n ranks share the host's cores
    source = torch.from_numpy(payload(rank, count, n, dtype)).to(getattr(torch, dtype))
    buf = source.clone()
    timelines: list[Timeline] = []
    baseline: list[float] = []
    for it in range(runs):
        buf.copy_(source)
        with _engine(rank, f"in the barrier before iteration {it}"):
            dist.barrier()
        timelines.append(allreduce(buf, proof, straggler_delay=delay, timeout=timeout, late_rank=late))
        heartbeat()
        check(buf, want, rank, schedule.algorithm, _host)
        buf.copy_(source)
        with _engine(rank, f"in the barrier before gloo's all_reduce of iteration {it}"):
            dist.barrier()
        start = time.perf_counter()
        if rank == late:
            time.sleep(delay)
        with _engine(rank, f"in gloo's all_reduce of iteration {it}"):
            dist.all_reduce(buf)
        baseline.append(time.perf_counter() - start)
        heartbeat()
        check(buf, want, rank, "all_reduce", _host)
    return timelines, baseline


@contextlib.contextmanager
def _engine(rank: int, during: str) -> Iterator[None]:
    """An engine failure outside the schedule's rounds, as a RankError saying where."""
    try:
        yield
    except Exception as e:
        reason = classify(e)
        raise RankError(
            f"rank {rank} {reason} {during}: {first_line(e)}", rank=rank, reason=reason, during=during
        ) from e


def _host(block: torch.Tensor) -> np.ndarray:
    return block.double().numpy()  # NumPy has no bfloat16
