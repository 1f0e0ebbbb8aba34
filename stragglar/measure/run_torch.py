"""The torch and nccl backends of ``stragglar run``: fork-started torch ranks on 127.0.0.1, on
gloo (CPU tensors) or on NCCL (each rank's buffers on its GPU, :mod:`stragglar.measure.gpus`).

One launch of the ranks runs every schedule asked for and the engine's all_reduce in every
iteration, in a rotating order.  Each iteration the late rank sleeps ``delay`` before every
schedule and before the all_reduce alike.  Every wait for a peer is bounded by ``timeout`` plus
that delay (a deliberately late peer is not a silent one); the run as a whole is not, as long as
every rank keeps reporting progress (:func:`~stragglar.runtime.liveness.heartbeat` after every
step).

On NCCL the rounds run stream-ordered, as a GPU program runs them (the DDP hook does too): the host
queues every round on the current CUDA stream without waiting for any, and the rank's time ends
when that stream has finished, the all_reduce's the same way.  The host then polls the stream
(bounded by the timeout, so a silent peer is an error naming the rank, not a hang) instead of
waiting per round, which would add a host round trip to every round that NCCL's all_reduce does
not pay.  Nothing tells the host when a phase finishes on the GPU, so NCCL runs report no hidden
phase time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from stragglar.measure import launch as launcher
from stragglar.measure.data import check_result, expected, payload
from stragglar.measure.launch import launch
from stragglar.measure.links import pace_links
from stragglar.measure.timing import Figures, Series, iteration_figures, turn
from stragglar.model import schedule_name
from stragglar.runtime import (
    RankError,
    Timeline,
    allreduce,
    classify,
    first_line,
    heartbeat,
    poll,
    register_buffer,
)
from stragglar.verify import Proof

__all__ = ["torch_figures"]

_SPIN = 1e-3  # seconds a rank polls its CUDA stream without sleeping


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
    engine: str = "gloo",
    gpus: int = 0,
    graphs: bool | None = None,
    on_device: bool = False,
) -> Figures:
    """Run the ranks once; per iteration, the slowest rank's time for each schedule and for
    all_reduce, in the rotating order of :func:`~stragglar.measure.timing.turn`.

    ``slack`` (default :data:`stragglar.measure.launch.SLACK`): how long beyond the timeout a rank
    may go without reporting progress.  ``link_rate`` (bytes per second, gloo only): every rank's
    sockets paced to it (:mod:`stragglar.measure.links`), links of their own as the cost model
    assumes.  ``tick``: called from the launcher's loop while the ranks run (:func:`.launch.launch`).
    ``engine``: ``"gloo"`` or ``"nccl"`` (ranks placed on ``gpus`` GPUs; ``graphs=False``: their
    stream-ordered rounds launched eagerly every call, not replayed from CUDA graphs).
    ``on_device`` (nccl): each rank's AllReduce one kernel launch (``engine="device"`` of
    :func:`~stragglar.runtime.allreduce`) on a buffer registered once
    (:func:`~stragglar.runtime.register_buffer`: direct transfers), NCCL carrying only the
    headers and IPC handles."""
    want = expected(count, num_ranks, dtype)  # once, before the fork: the ranks share its pages
    args = (
        proofs,
        count,
        dtype,
        want,
        delay,
        iters + warmup,
        timeout,
        late_rank,
        link_rate,
        graphs,
        on_device,
    )
    per_rank = launch(
        _rank,
        num_ranks,
        args,
        timeout=timeout + delay,
        backend=engine,
        slack=launcher.SLACK if slack is None else slack,
        tick=tick,
        gpus=gpus,
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
    return Figures(tuple(series), f"{engine} all_reduce", tuple(base))


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
    graphs: bool | None,
    on_device: bool,
) -> tuple[list[list[Timeline]], list[float]]:
    torch.set_num_threads(1)  # n ranks share the host's cores
    if link_rate is not None:
        pace_links(rank, n, link_rate)
    engine = str(dist.get_backend())
    on_gpu = engine == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    source = torch.from_numpy(payload(rank, count, n, dtype)).to(getattr(torch, dtype)).to(device)
    buf = source.clone()
    names = [schedule_name(p.schedule) for p in proofs]
    timelines: list[list[Timeline]] = [[] for _ in proofs]
    engine_options: dict[str, Any] = (  # the device engine: one kernel launch, waited for before it returns
        {"engine": "device"}
        if on_device
        else {"stream_ordered": on_gpu, "graphs": graphs if on_gpu else None}
    )
    baseline: list[float] = []
    # the device engine's buffer registered once: its calls then reach the peers' buffers directly
    with register_buffer(buf, timeout=timeout) if on_device else contextlib.nullcontext():
        for it in range(runs):
            for entry in turn(it, len(proofs) + 1):
                buf.copy_(source)
                if entry < len(proofs):
                    what = names[entry]
                    with _engine(rank, f"in the barrier before {what} in iteration {it}"):
                        dist.barrier()
                    line = allreduce(
                        buf,
                        proofs[entry],
                        straggler_delay=delay,
                        timeout=timeout,
                        late_rank=late_rank,
                        **engine_options,
                    )
                    if on_gpu and not on_device:  # rounds queued: the rank is done when its stream is
                        done = _stream_done(rank, timeout + delay, f"running {what} in iteration {it}")
                        line = Timeline(
                            line.rank, line.start, line.arrived, (None,) * len(line.phase_done), done
                        )
                    timelines[entry].append(line)
                else:
                    what = f"{engine}'s all_reduce"
                    with _engine(rank, f"in the barrier before {what} of iteration {it}"):
                        dist.barrier()
                    during = f"{what} of iteration {it}"
                    baseline.append(_all_reduce(rank, buf, delay, late_rank, during, timeout))
                heartbeat()
                check_result(buf, want, rank, what, _host)
    return timelines, baseline


def _all_reduce(
    rank: int, buf: torch.Tensor, delay: float, late_rank: int, what: str, timeout: float
) -> float:
    """The baseline: the engine's all_reduce after the late rank's delay; this rank's seconds (on
    a GPU, until its stream has finished it)."""
    start = time.perf_counter()
    if rank == late_rank:
        time.sleep(delay)
    with _engine(rank, f"in {what}"):
        dist.all_reduce(buf)
    if buf.is_cuda:
        return _stream_done(rank, timeout + delay, f"running {what}") - start
    return time.perf_counter() - start


def _stream_done(rank: int, timeout: float, during: str) -> float:
    """When the current CUDA stream finished what was queued on it (``time.perf_counter``): polled,
    so that a peer that never answers is a RankError after ``timeout`` seconds, not a hang.  The
    first millisecond is polled without sleeping: the moment is the figure being measured."""
    cuda: Any = torch.cuda  # untyped in torch's stubs
    done = cuda.Event()
    done.record()
    if not poll(done.query, timeout, spin=_SPIN):
        raise RankError(
            f"rank {rank} timed out {during}: the GPU had not finished after {timeout:g} s",
            rank=rank,
            reason="timed out",
            during=during,
        )
    return time.perf_counter()


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
    return block.double().cpu().numpy()  # NumPy has no bfloat16
