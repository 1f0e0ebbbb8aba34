"""The torch backend of ``stragglar run``: fork-started gloo ranks on 127.0.0.1.

One launch of the ranks runs every schedule asked for and gloo's all_reduce in every iteration,
in a rotating order.  Each iteration the late rank sleeps ``delay`` before every schedule and
before gloo's all_reduce alike.  Every wait for a peer is bounded by ``timeout`` plus that delay
(a deliberately late peer is not a silent one); the run as a whole is not, as long as every rank
keeps reporting progress (:func:`~stragglar.runtime.heartbeat.heartbeat` after every step).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist

from stragglar.measure import launch as launcher
from stragglar.measure.data import check, expected, payload
from stragglar.measure.launch import launch
from stragglar.measure.links import pace_links
from stragglar.measure.timing import Figures, Series, iteration_figures, turn
from stragglar.model import schedule_name
from stragglar.runtime import RankError, allreduce
from stragglar.runtime.engine import Timeline, classify, first_line
from stragglar.runtime.heartbeat import heartbeat
from stragglar.verify import Proof

__all__ = ["torch_figures"]


def torch_figures(
    proofs: Sequence[Proof],
    num_ranks: int,
    count: int,
    dtype: str,
    delay: float,
    iters: int,
    warmup: int,
    timeout: float,
    late_rank: int,
    slack: float | None = None,
    link_rate: float | None = None,
    tick: Callable[[], None] | None = None,
) -> Figures:
    """Run the ranks once; per iteration, the slowest rank's time for each schedule and for
    all_reduce, in the rotating order of :func:`~stragglar.measure.timing.turn`.

    ``slack`` (default :data:`stragglar.measure.launch.SLACK`): how long beyond the timeout a rank
    may go without reporting progress.  ``link_rate`` (bytes per second): every rank's sockets
    paced to it (:mod:`stragglar.measure.links`), links of their own as the cost model assumes.
    ``tick``: called from the launcher's loop while the ranks run (:func:`.launch.launch`)."""
    want = expected(count, num_ranks, dtype)  # once, before the fork: the ranks share its pages
    args = (proofs, count, dtype, want, delay, iters + warmup, timeout, late_rank, link_rate)
    per_rank = launch(
        _rank,
        num_ranks,
        args,
        timeout=timeout + delay,
        slack=launcher.SLACK if slack is None else slack,
        tick=tick,
    )
    series = []
    for k, proof in enumerate(proofs):
        times, hidden = [], []
        for it in range(warmup, warmup + iters):
            total, done = iteration_figures(proof.schedule, [timelines[k][it] for timelines, _ in per_rank])
            times.append(total)
            hidden.extend([done] if done is not None else [])
        series.append(Series(tuple(times), tuple(hidden)))
    base = [max(baseline[it] for _, baseline in per_rank) for it in range(warmup, warmup + iters)]
    return Figures(tuple(series), f"{dist.Backend.GLOO} all_reduce", tuple(base))


def _rank(
    rank: int,
    n: int,
    proofs: Sequence[Proof],
    count: int,
    dtype: str,
    want: np.ndarray,
    delay: float,
    runs: int,
    timeout: float,
    late_rank: int,
    link_rate: float | None,
) -> tuple[list[list[Timeline]], list[float]]:
    torch.set_num_threads(1)  # n ranks share the host's cores
    if link_rate is not None:
        pace_links(rank, n, link_rate)
    source = torch.from_numpy(payload(rank, count, n, dtype)).to(getattr(torch, dtype))
    buf = source.clone()
    names = [schedule_name(p.schedule) for p in proofs]
    timelines: list[list[Timeline]] = [[] for _ in proofs]
    baseline: list[float] = []
    for it in range(runs):
        for entry in turn(it, len(proofs) + 1):
            buf.copy_(source)
            if entry < len(proofs):
                what = names[entry]
                with _engine(rank, f"in the barrier before {what} in iteration {it}"):
                    dist.barrier()
                timelines[entry].append(
                    allreduce(buf, proofs[entry], straggler_delay=delay, timeout=timeout, late_rank=late_rank)
                )
            else:
                with _engine(rank, f"in the barrier before gloo's all_reduce of iteration {it}"):
                    dist.barrier()
                baseline.append(_all_reduce(rank, buf, delay, late_rank, it))
                what = "all_reduce"
            heartbeat()
            check(buf, want, rank, what, _host)
    return timelines, baseline


def _all_reduce(rank: int, buf: torch.Tensor, delay: float, late_rank: int, it: int) -> float:
    """The baseline: gloo's all_reduce after the late rank's delay; this rank's seconds."""
    start = time.perf_counter()
    if rank == late_rank:
        time.sleep(delay)
    with _engine(rank, f"in gloo's all_reduce of iteration {it}"):
        dist.all_reduce(buf)
    return time.perf_counter() - start


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
