"""The torch backend of ``stragglar run``: fork-started gloo ranks on 127.0.0.1."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from stragglar.measure.data import check, expected, payload
from stragglar.measure.launch import launch
from stragglar.measure.timing import Figures, iteration_figures
from stragglar.runtime import allreduce
from stragglar.runtime.engine import Timeline
from stragglar.verify import Proof

__all__ = ["torch_figures"]


def torch_figures(
    proof: Proof, count: int, dtype: str, delay: float, iters: int, warmup: int, timeout: float
) -> Figures:
    """Run the ranks; per iteration, the slowest rank's time for the schedule and for all_reduce."""
    schedule = proof.schedule
    n = schedule.num_ranks
    want = expected(count, n, dtype)  # once, before the fork: the ranks share its pages
    args = (proof, count, dtype, want, delay, iters + warmup, timeout)
    per_rank = launch(_rank, n, args, timeout=timeout)
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
) -> tuple[list[Timeline], list[float]]:
    schedule = proof.schedule
    torch.set_num_threads(1)  # n ranks share the host's cores
    source = torch.from_numpy(payload(rank, count, n, dtype)).to(getattr(torch, dtype))
    buf = source.clone()
    timelines: list[Timeline] = []
    baseline: list[float] = []
    for _ in range(runs):
        buf.copy_(source)
        dist.barrier()
        timelines.append(allreduce(buf, proof, straggler_delay=delay, timeout=timeout))
        check(buf, want, rank, schedule.algorithm, _host)
        buf.copy_(source)
        dist.barrier()
        start = time.perf_counter()
        if rank == schedule.straggler:
            time.sleep(delay)
        dist.all_reduce(buf)
        baseline.append(time.perf_counter() - start)
        check(buf, want, rank, "all_reduce", _host)
    return timelines, baseline


def _host(block: torch.Tensor) -> np.ndarray:
    return block.double().numpy()  # NumPy has no bfloat16
