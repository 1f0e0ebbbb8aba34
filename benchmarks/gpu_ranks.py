"""bench_gpu.py's parts with ranks in processes: StragglAR against NCCL's all_reduce, and DDP.

Both run on ``launch``'s fork-started ranks.  On NCCL (the GPU run) every rank is placed on a GPU
(``placement``; 4 ranks on one GPU talk over NCCL's socket transport, so ratios are indicative);
the same code runs on gloo and the CPU for the tests, with host waits instead of stream-ordered
rounds and no graphs.  Every timed call's result is checked on every rank, and a step's time is
the slowest rank's (the launcher takes the maximum per call).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from gpu_inputs import PERIOD, DDPConfig, P2PConfig, Wrong, total, value

from stragglar.runtime import allreduce, release_graphs
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove


def device_of(backend: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _base(count: int, device: torch.device) -> torch.Tensor:
    return torch.arange(count, device=device, dtype=torch.float32) % PERIOD


def fill(buf: torch.Tensor, rank: int, world: int) -> None:
    buf.copy_(value(_base(buf.numel(), buf.device), rank, world))


def summed(count: int, world: int, device: torch.device) -> torch.Tensor:
    return total(_base(count, device), world)  # type: ignore[no-any-return]


Variants = Callable[[torch.Tensor, float], dict[str, Callable[[], object]]]


def p2p_rank(rank: int, world: int, cfg: P2PConfig) -> dict[str, list[float]]:
    """Per variant ("size|delay|name"), this rank's time of each timed call (seconds)."""
    proofs = {"paper": prove(synthesize("stragglar", world))}
    proofs["chunked"] = prove(synthesize("stragglar", world, chunks=8 * world))
    times = _sweep(rank, world, cfg, lambda buf, delay: _variants(buf, proofs, rank, world, delay, cfg))
    times["pair"] = _pair(rank, world, min(cfg.sizes), cfg.iters, device_of(cfg.backend))
    return times


def cupy_rank(rank: int, world: int, cfg: P2PConfig) -> dict[str, list[float]]:
    """As :func:`p2p_rank` through CuPy's NCCL (an ``NcclGroup`` on a communicator of its own):
    the paper's schedule and a chunked one (C = 8N, whose early messages carry several chunks
    each, packed and landed by one kernel), eager and from graphs, against that communicator's
    allReduce.  CuPy reads the rank's torch buffer in place (``cupy.asarray``), so the same
    checks apply."""
    import cupy
    from cupy.cuda import nccl

    from stragglar.runtime import NcclGroup

    device = device_of(cfg.backend)
    cupy.cuda.Device(device.index).use()
    unique = [nccl.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(unique, src=0)
    comm = nccl.NcclCommunicator(world, unique[0], rank)
    group, late = NcclGroup(comm), world - 1
    proofs = {
        "paper": prove(synthesize("stragglar", world)),
        "chunked": prove(synthesize("stragglar", world, chunks=8 * world)),
    }

    def variants(buf: torch.Tensor, delay: float) -> dict[str, Callable[[], object]]:
        view = cupy.asarray(buf)
        calls: dict[str, Callable[[], object]] = {
            f"stragglar {kind}, CuPy/NCCL {mode}": functools.partial(
                allreduce, view, proof, group, delay, timeout=cfg.timeout, late_rank=late, graphs=graphs
            )
            for kind, proof in proofs.items()
            for graphs, mode in ((False, "eager"), (True, "graph"))
        }

        def all_reduce() -> None:
            if rank == late:
                time.sleep(delay)
            ptr, stream = view.data.ptr, cupy.cuda.get_current_stream().ptr
            comm.allReduce(ptr, ptr, view.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream)

        calls["CuPy/NCCL allReduce"] = all_reduce
        return calls

    times = _sweep(rank, world, cfg, variants)
    release_graphs(group)  # before the communicator goes: NCCL destroys none a live graph holds
    comm.destroy()
    return times


def _sweep(rank: int, world: int, cfg: P2PConfig, variants: Variants) -> dict[str, list[float]]:
    """Every size and delay of ``cfg``: each of ``variants(buf, delay)`` timed and checked."""
    device = device_of(cfg.backend)
    times: dict[str, list[float]] = {}
    for size in cfg.sizes:
        buf = torch.empty(size // 4, dtype=torch.float32, device=device)
        want = summed(buf.numel(), world, device)
        for delay in cfg.delays:
            for name, call in variants(buf, delay).items():
                times[f"{size}|{delay}|{name}"] = _timed(call, buf, want, rank, world, cfg.iters, device)
    return times


def _variants(
    buf: torch.Tensor, proofs: dict[str, Proof], rank: int, world: int, delay: float, cfg: P2PConfig
) -> dict[str, Callable[[], object]]:
    """The calls to time with the last rank ``delay`` s late: StragglAR per schedule (on NCCL
    stream-ordered, eager and from graphs; on gloo with host waits) and the engine's all_reduce."""
    ordered, late = cfg.backend == "nccl", world - 1
    calls: dict[str, Callable[[], object]] = {}
    for label, proof in proofs.items():
        for graphs in (False, True) if ordered else (None,):
            mode = {None: "host waits", False: "eager", True: "graph"}[graphs]
            calls[f"stragglar {label}, {mode}"] = functools.partial(
                allreduce, buf, proof, straggler_delay=delay, timeout=cfg.timeout, late_rank=late,
                stream_ordered=ordered, graphs=graphs,
            )  # fmt: skip

    def all_reduce() -> None:
        if rank == late:
            time.sleep(delay)
        dist.all_reduce(buf)

    calls[f"{'NCCL' if ordered else 'gloo'} all_reduce"] = all_reduce
    return calls


def _timed(
    call: Callable[[], object],
    buf: torch.Tensor,
    want: torch.Tensor,
    rank: int,
    world: int,
    iters: int,
    device: torch.device,
) -> list[float]:
    """``iters`` timed calls after two untimed ones (a graph is captured on the second), each on
    fresh data, started together (a barrier) and checked."""
    out = []
    for i in range(iters + 2):
        fill(buf, rank, world)
        sync(device)
        dist.barrier()
        start = time.perf_counter()
        call()
        sync(device)
        if i >= 2:
            out.append(time.perf_counter() - start)
        if not torch.equal(buf, want):
            wrong = int((buf != want).sum())
            raise Wrong(f"rank {rank} has {wrong} wrong elements of {buf.numel()}")
    return out


def _pair(rank: int, world: int, size: int, iters: int, device: torch.device) -> list[float]:
    """A bare send/recv pair of ``size`` bytes between ranks 2k and 2k+1 (what a StragglAR round
    moves per rank), each rank checking what it received."""
    peer = rank ^ 1
    if peer >= world:
        return []
    send = torch.full((size // 4,), float(rank), device=device)
    recv = torch.empty_like(send)
    out = []
    for i in range(iters + 2):
        sync(device)
        dist.barrier()
        start = time.perf_counter()
        works: list[Any]
        if device.type == "cuda":  # one NCCL group: a send after a receive would queue behind it
            ops = [dist.P2POp(dist.irecv, recv, peer), dist.P2POp(dist.isend, send, peer)]
            works = list(dist.batch_isend_irecv(ops))
        else:  # gloo: the receive posted first, as the runtime's transport does
            works = [dist.irecv(recv, peer), dist.isend(send, peer)]
        for work in works:
            work.wait()
        sync(device)
        if i >= 2:
            out.append(time.perf_counter() - start)
        if not bool((recv == peer).all()):
            raise Wrong(f"rank {rank} received wrong values from rank {peer}")
    return out


def ddp_rank(rank: int, world: int, cfg: DDPConfig, variants: Sequence[str]) -> dict[str, Any]:
    """``steps``: per variant, per step, this rank's step time (s) and loss; ``chunks``: per
    variant, the chunk counts its StragglAR buckets were cut into (empty: it never ran StragglAR)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stragglar.ddp import StragglarState, stragglar_hook
    from stragglar.model import PAPER_NETWORK

    device = device_of(cfg.backend)
    ids = [device] if device.type == "cuda" else None
    teacher = torch.randn(cfg.width, cfg.width, generator=torch.Generator().manual_seed(1)).to(device)
    out: dict[str, list[list[float]]] = {}
    chunks: dict[str, list[int]] = {}
    for variant in variants:
        torch.manual_seed(0)  # the same weights for every variant
        model = DDP(_mlp(cfg.width, cfg.depth).to(device), device_ids=ids, bucket_cap_mb=cfg.bucket_mb)
        state: Any = {
            "default hook": None,
            "stragglar (paper)": StragglarState(policy="stragglar", timeout=cfg.timeout),
            "stragglar (chunks auto)": StragglarState(
                policy="stragglar", chunks="auto", network=PAPER_NETWORK, timeout=cfg.timeout
            ),
            "auto": StragglarState(policy="auto", chunks="auto", timeout=cfg.timeout),
        }[variant]
        if state is not None:
            model.register_comm_hook(state, stragglar_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        rows = []
        for step in range(cfg.steps):
            data = torch.Generator().manual_seed(1000 * step + rank)
            x = torch.randn(32, cfg.width, generator=data).to(device)
            y = torch.tanh(x @ teacher / cfg.width**0.5)
            sync(device)
            dist.barrier()
            start = time.perf_counter()
            if rank == cfg.late_rank:
                time.sleep(cfg.delay)
            loss = (model(x) - y).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            sync(device)
            rows.append([time.perf_counter() - start, float(loss.item())])
        out[variant] = rows[cfg.warmup :]
        decisions = state.decisions if state is not None else []
        used = {world - 1 if c is None else c for _, how, _, c in decisions if how == "stragglar"}
        chunks[variant] = sorted(used)
    return {"steps": out, "chunks": chunks}


def _mlp(width: int, depth: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, width))
