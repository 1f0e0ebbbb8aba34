"""DDP training steps on gloo with one rank always late: which straggler the hook is told matters.

    python benchmarks/bench_ddp.py [--gpus 4] [--late 1] [--delay 50] [--mib 16] [--steps 12]

Every rank trains the same linear model (``--mib`` of float32 gradients, in DDP's default 25 MiB
buckets) on fork-started gloo ranks; rank ``--late`` sleeps ``--delay`` ms before each backward.
Four hooks are timed in one run each: gloo's own all_reduce (DDP's default), StragglAR told the
wrong straggler (rank N-1), StragglAR told the right one, and StragglAR with ``detect=4``, which
must find it.  Reported: the median time of the steps after the first few (warm-up, and for
``detect`` its window), measured on the punctual rank 0 from the start of forward to the end of
backward, and the step at which ``detect`` switched.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from stragglar.ddp import StragglarState, stragglar_hook
from stragglar.measure.launch import launch

SKIP = 6  # steps left out of the median: warm-up, and the detection window plus its 2-step lag

HOOKS = ("gloo all_reduce", "stragglar, wrong straggler", "stragglar, right straggler", "stragglar, detect=4")


def state_for(hook: str, n: int, late: int) -> StragglarState | None:
    if hook.startswith("gloo"):
        return None
    if hook.endswith("detect=4"):
        return StragglarState(detect=4)
    return StragglarState(straggler=late if "right" in hook else n - 1)


def train(rank: int, n: int, hook: str, late: int, delay: float, mib: int, steps: int) -> Any:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    width = int((mib * 2**20 / 4) ** 0.5)
    model = DDP(torch.nn.Linear(width, width, bias=False))
    state = state_for(hook, n, late)
    if state is not None:
        model.register_comm_hook(state, stragglar_hook)
    x = torch.randn(4, width)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model(x).square().mean()
        if rank == late:
            time.sleep(delay)
        loss.backward()
        times.append(time.perf_counter() - start)
    return times, state.switches if state is not None else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--late", type=int, default=1)
    parser.add_argument("--delay", type=float, default=50.0, help="ms")
    parser.add_argument("--mib", type=int, default=16, help="gradient size")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    print(f"{args.gpus} gloo ranks, {args.mib} MiB of gradients, rank {args.late} {args.delay:g} ms late")
    print("| hook | median step on rank 0 (ms) | min-max | switched |")
    print("|---|---:|---|---|")
    for hook in HOOKS:
        per_rank = launch(
            train, args.gpus, (hook, args.late, args.delay / 1e3, args.mib, args.steps), timeout=300
        )
        times, switches = per_rank[0]
        kept = times[SKIP:]
        shown = ", ".join(f"step {s}: rank {r}" for s, r in switches) or "-"
        print(
            f"| {hook} | {statistics.median(kept) * 1e3:.1f} | "
            f"{min(kept) * 1e3:.1f}-{max(kept) * 1e3:.1f} | {shown} |"
        )


if __name__ == "__main__":
    main()
