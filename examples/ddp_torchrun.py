"""Train a small MLP with DDP and the StragglAR communication hook, beside DDP's default hook.

    torchrun --nproc-per-node=4 examples/ddp_torchrun.py
    torchrun --nproc-per-node=4 examples/ddp_torchrun.py --late-rank 3 --delay 50ms

On NCCL where torch sees CUDA GPUs (rank r on GPU r mod their count), on gloo otherwise; ``--backend``
chooses.  Every step trains two copies of one model on the same data: one with DDP's default hook,
one with ``StragglarState(policy="auto")``, which reduces a bucket with StragglAR only when some
rank is late enough for it to pay and with the engine's all_reduce otherwise (below 4 ranks it
has little to hide, and on these 1 MB buckets over gloo the model has not preferred it there;
``--policy stragglar`` uses it for every bucket).  ``--late-rank``
sleeps ``--delay`` before each forward pass, as a straggler would; ``auto`` is not told which rank
that is and finds it from the arrivals, as it would in a real job (``--policy stragglar`` names it
the straggler).  At the end rank 0 prints the
policy's decisions (the first bucket's choice and each change), per step both copies' times and
losses (equal but for rounding: the same sums, added in another order), and a verdict:

    policy auto: StragglAR at K of 24 steps (bucket reductions: S of B)

the steps at which StragglAR reduced every gradient bucket (a step where it reduced only some is
counted apart, "N more in part"), and the bucket reductions it did of all the hook made.  Each
bucket's algorithm is the state's latest decision once the hook has chosen it.  A rank whose two
copies' parameters differ by more than rounding exits with status 1.  ``--engine device`` reduces
StragglAR's buckets with the device engine (one kernel launch a bucket and rank; CUDA and CuPy).
"""

# no ``from __future__ import annotations``: DDP compares a hook's annotations with the classes
import argparse
import os
import statistics
import sys
import time
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed import GradBucket  # type: ignore[attr-defined, unused-ignore]
from torch.nn.parallel import DistributedDataParallel as DDP

from stragglar.args import as_rank
from stragglar.ddp import StragglarState, stragglar_hook
from stragglar.errors import InputError
from stragglar.measure.gpus import placement
from stragglar.runtime import ENGINES
from stragglar.units import parse_duration

TOLERANCE = (
    1e-6  # the copies' parameters differ by float32 rounding only (about 1e-9 here): sums in another order
)


def first_rank() -> bool:
    """Whether this process is rank 0 of torchrun's job, or was started alone (no RANK)."""
    return os.environ.get("RANK", "0") == "0"


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors and help rank 0 alone prints: torchrun's ranks all read
    the same options, and each said the same thing (every rank still exits as argparse does)."""

    def error(self, message: str) -> NoReturn:
        if first_rank():
            super().error(message)
        raise SystemExit(2)

    def print_help(self, file: Any = None) -> None:  # argparse takes anything with a write
        if first_rank():
            super().print_help(file)


def options() -> argparse.Namespace:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), help="default: nccl where CUDA is, else gloo")
    parser.add_argument("--policy", choices=("auto", "stragglar"), default="auto")
    parser.add_argument("--steps", type=positive, default=24)
    parser.add_argument("--width", type=positive, default=512, help="the MLP's hidden width")
    parser.add_argument("--depth", type=positive, default=6, help="the MLP's linear layers")
    lateness_options(parser)
    engine_option(parser)
    return checked(parser)


def positive(text: str) -> int:
    """An option's whole number, at least 1 (a run of 0 steps has no step to time)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def duration(text: str) -> float:
    """A duration with its unit (``50ms``), in seconds: the words of the ``stragglar`` command."""
    try:
        return parse_duration(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def lateness_options(parser: argparse.ArgumentParser) -> None:
    """``--late-rank`` and ``--delay``: which rank sleeps how long before each step."""
    parser.add_argument("--late-rank", type=int, help="the rank that arrives late to every step")
    parser.add_argument("--delay", type=duration, default=0.0, help="how late, e.g. 50ms (with --late-rank)")


def checked(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The options, where ``--late-rank`` and ``--delay`` come together: one alone would make
    nobody late."""
    args = parser.parse_args()
    if (args.late_rank is None) != (args.delay == 0):
        parser.error("--late-rank and --delay go together: the rank named sleeps that long before each step")
    return args


def engine_option(parser: argparse.ArgumentParser) -> None:
    """``--engine``: StragglAR's rounds driven from the host, or each reduction in one kernel
    launch a rank (the device engine: NCCL ranks on CUDA GPUs, with CuPy; :func:`start` checks)."""
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="rounds",
        help="StragglAR's rounds driven from the host, or each reduction in one kernel launch a rank "
        "(device: CUDA GPUs and CuPy)",
    )


def refuse(line: str, every_rank: bool = False) -> NoReturn:
    """End with ``line`` on stderr (rank 0's only, as :class:`Parser`'s, unless ``every_rank``:
    a problem of this rank's node, which rank 0's may not have) and exit 2: bad input, as an
    option's error ends argparse, in its words."""
    if every_rank or first_rank():
        print(f"{os.path.basename(sys.argv[0])}: error: {line}", file=sys.stderr)
    raise SystemExit(2)


def start(backend: str, engine: str = "rounds") -> torch.device:
    """Join the job torchrun started; on NCCL, bind this rank to its GPU on its node.  The device
    engine (``engine``) is refused before, off NCCL: gloo's tensors are on the CPU."""
    if engine == "device" and backend != "nccl":
        refuse("--engine device reduces CUDA tensors: it runs on NCCL, with CUDA GPUs")
    if not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"} <= set(os.environ):
        refuse("start it with torchrun, which starts its ranks: torchrun --nproc-per-node=N <script>")
    if backend == "gloo":
        dist.init_process_group("gloo")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        refuse("--backend nccl needs CUDA GPUs: torch sees none on this node", every_rank=True)
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    place = placement(local_rank, local_world, torch.cuda.device_count())
    os.environ.update(place.env)  # more ranks than GPUs (one node): an NCCL host each, see the README
    device = torch.device("cuda", place.device)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return device


def mlp(width: int, depth: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, width))


def main() -> None:
    args = options()
    device = start(args.backend or ("nccl" if torch.cuda.is_available() else "gloo"), args.engine)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.late_rank is not None:
        try:
            as_rank(args.late_rank, "--late-rank", world)
        except InputError as e:
            refuse(str(e))
    torch.manual_seed(0)  # the same initial weights on every rank, and in both copies
    plain = mlp(args.width, args.depth).to(device)
    twin = mlp(args.width, args.depth).to(device)
    twin.load_state_dict(plain.state_dict())
    ids = [device] if device.type == "cuda" else None
    default = DDP(plain, device_ids=ids, bucket_cap_mb=1)
    ours = DDP(twin, device_ids=ids, bucket_cap_mb=1)
    # auto finds the late rank itself (what the verdict shows); StragglAR for every bucket needs it named
    named = args.late_rank if args.policy == "stragglar" else None
    state = StragglarState(policy=args.policy, straggler=named, engine=args.engine)
    used: dict[int, list[str]] = {}  # per step, the algorithm that reduced each bucket, in order

    def hook(state: StragglarState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """stragglar_hook, noting the bucket's algorithm: the decision in force once it has chosen."""
        future = stragglar_hook(state, bucket)
        if state.decisions:  # none with one rank: nothing to reduce
            used.setdefault(state.steps, []).append(state.decisions[-1][1])
        return future

    ours.register_comm_hook(state, hook)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (default, ours)]
    teacher = torch.randn(args.width, args.width, generator=torch.Generator().manual_seed(1)).to(device)

    rows = []
    for step in range(1, args.steps + 1):
        data = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own batch
        x = torch.randn(64, args.width, generator=data).to(device)
        y = torch.tanh(x @ teacher / args.width**0.5)
        row: list[float] = []
        for model, optimizer in zip((default, ours), optimizers, strict=True):
            began = time.perf_counter()
            if rank == args.late_rank:
                time.sleep(args.delay)
            loss = (model(x) - y).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            row += [time.perf_counter() - began, loss.item()]
        rows.append(row)
    pairs = zip(plain.parameters(), twin.parameters(), strict=True)
    with torch.no_grad():
        worst = max(float((a - b).abs().max()) for a, b in pairs)
    if rank == 0:
        report(args, state, rows, worst)
        print(verdict(args.policy, used, args.steps))
    matched = worst <= TOLERANCE  # False for NaN too
    if not matched:
        print(f"rank {rank}: the copies' parameters DIFFER by {worst:.1e} (at most {TOLERANCE:g})")
    dist.destroy_process_group()  # the hook's work on its groups (CUDA graphs, probe) ends first
    if not matched:
        raise SystemExit(1)


def report(args: argparse.Namespace, state: StragglarState, rows: list[list[float]], worst: float) -> None:
    """The policy's decisions, then per step both copies' times and losses."""
    late = f", rank {args.late_rank} late by {args.delay * 1e3:g} ms" if args.late_rank is not None else ""
    print(f"{dist.get_world_size()} ranks on {dist.get_backend()}, MLP {args.depth} x {args.width}{late}")
    print(f'decisions of policy="{args.policy}" (step, algorithm, straggler, chunks):')
    for decision in state.decisions:
        print(f"  {decision}")
    print("step  default hook (ms)  stragglar hook (ms)  loss (default)  loss (stragglar)")
    for step, (t0, loss0, t1, loss1) in enumerate(rows, 1):
        print(f"{step:4d}  {t0 * 1e3:17.1f}  {t1 * 1e3:19.1f}  {loss0:14.6f}  {loss1:16.6f}")
    before, after = (statistics.median(row[k] for row in rows) * 1e3 for k in (0, 2))
    print(f"median step: default hook {before:.1f} ms, stragglar hook {after:.1f} ms")
    print(f"largest difference between the two copies' parameters: {worst:.1e} (at most {TOLERANCE:g})")


def verdict(policy: str, used: dict[int, list[str]], steps: int) -> str:
    """At how many steps StragglAR reduced every bucket (and some, if any), and how many of all the
    bucket reductions it did."""
    every = sum(1 for step in used.values() if all(a == "stragglar" for a in step))
    some = sum(1 for step in used.values() if "stragglar" in step) - every
    done = sum(step.count("stragglar") for step in used.values())
    total = sum(len(step) for step in used.values())
    part = f", {some} more in part" if some else ""
    reductions = f"bucket reductions: {done} of {total}"
    return f"policy {policy}: StragglAR at {every} of {steps} steps{part} ({reductions})"


if __name__ == "__main__":
    main()
