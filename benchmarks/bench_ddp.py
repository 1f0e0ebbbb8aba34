"""DDP training steps on gloo: the default hook against synchronous, asynchronous and auto StragglAR.

    python benchmarks/bench_ddp.py [--gpus 4] [--late 1] [--delay 30ms] [--steps 36]
        [--link-rate 200MB/s] [--json out.json]

A deep MLP (``--depth`` layers of ``--width`` x ``--width``; a DDP bucket per layer from the
second step on, once DDP has rebuilt its buckets) trains on fork-started gloo ranks, twice: once
with no late rank and once with rank ``--late`` late by ``--delay`` of its own compute (matrix
products before its forward pass, not a sleep inside the collective).  Each run builds five DDP
copies of the model from one seed and alternates them step by step, so all four see the same
machine state (each takes each place in the order equally often): DDP's default hook (gloo's
all_reduce, from C++), torch's own all_reduce hook in Python (``default_hooks.allreduce_hook``:
what any Python hook costs here), StragglAR synchronous (the rounds inside the hook), StragglAR
asynchronous (worker threads), and ``policy="auto"``.  A barrier starts every step; a step's time is the
slowest rank's, from the barrier to the end of the optimizer step.  ``--idle`` makes the late
rank sleep instead (a rank waiting on I/O, whose core the others can use).  ``--link-rate`` paces
every rank's sockets to that bandwidth after the first step, once every group is connected
(:mod:`stragglar.measure.links`): each rank then has a link of its own, as GPUs do, instead of
sharing the loopback's copies with everyone's compute on the same cores.

Printed per run: the median step time over the steps after ``--warmup`` with its 10-90 percentile
spread, the ratio of medians to the default hook, the hook's own host time per bucket (wall and
CPU time, the step's first bucket apart: it also reads the probe), the auto policy's decisions
and the figures it decided from (each algorithm's measured time per bucket, the rank it expects
last and by how much, the critical delay of a bucket).  Every variant's per-rank losses must
agree with the default hook's step by step (same seeds, distinct data per rank).  Targets: with
a late rank auto <= 0.85x the default hook's step time; with none, auto <= 1.03x.  (No
``from __future__ import annotations``: DDP compares the hook's annotations with the classes.)
"""

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from options import Parser, as_command, duration, json_output, link_rate, whole
from results import save
from torch.distributed import GradBucket  # type: ignore[attr-defined, unused-ignore]
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from stragglar.commands.terminal import busy
from stragglar.ddp import StragglarState, stragglar_hook
from stragglar.measure.launch import launch
from stragglar.measure.links import pace_links, paced_to
from stragglar.model.policy import critical_delay_for
from stragglar.runtime import heartbeat

VARIANTS = ("default hook", "python all_reduce hook", "stragglar sync", "stragglar async", "auto")
TARGETS = {"late": 0.85, "punctual": 1.03}  # auto's step time over the default hook's
LOSS_RTOL = 1e-4


@dataclass(frozen=True)
class Config:
    width: int
    depth: int
    batch: int
    steps: int
    warmup: int
    late: int
    delay: float  # seconds of extra compute on the late rank per step (0: nobody late)
    idle: bool  # the late rank sleeps instead: it waits for something else, its core is free
    link_rate: float | None  # bytes/s each socket is paced to after the first step (None: unpaced)
    chunks: int | None  # StragglAR's chunk count (None: the paper's N-1)


class Timed:
    """A hook state that notes what each call of the hook costs on the host: (wall, CPU) seconds.

    Wall time is what backward waits for the hook; the calling thread's CPU time leaves out the
    time it spent descheduled or waiting for the GIL (4 ranks on 2 cores, and the worker thread).
    """

    def __init__(self, state: StragglarState) -> None:
        self.state = state
        self.first: list[tuple[float, float]] = []  # bucket 0: the step's first, also reads the probe
        self.rest: list[tuple[float, float]] = []
        self.buckets = 0  # the most buckets a step had


def timed_hook(timed: Timed, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    wall, cpu = time.perf_counter(), time.thread_time()
    future = stragglar_hook(timed.state, bucket)
    cost = (time.perf_counter() - wall, time.thread_time() - cpu)
    (timed.first if bucket.index() == 0 else timed.rest).append(cost)
    timed.buckets = max(timed.buckets, bucket.index() + 1)
    return future


def model(config: Config) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(config.depth):
        layers += [torch.nn.Linear(config.width, config.width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(config.width, 1))


def hooked(config: Config, variant: str) -> tuple[DDP, Timed | None]:
    weight_mb = config.width**2 * 4 / 2**20
    ddp = DDP(model(config), bucket_cap_mb=weight_mb * 0.99)  # a bucket closes after each weight
    if variant == "default hook":
        return ddp, None
    if variant == "python all_reduce hook":  # torch's own, in Python: what any Python hook pays here
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        return ddp, None
    state = {
        "stragglar sync": StragglarState(asynchronous=False, timeout=60, chunks=config.chunks),
        "stragglar async": StragglarState(timeout=60, chunks=config.chunks),
        "auto": StragglarState(policy="auto", timeout=60, chunks=config.chunks),
    }[variant]
    timed = Timed(state)
    ddp.register_comm_hook(timed, timed_hook)
    return ddp, timed


def burn(seconds: float) -> None:
    """Compute (small matrix products) for ``seconds`` of wall time: a rank late by its own work."""
    a = torch.randn(96, 96)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def train(rank: int, n: int, config: Config) -> dict[str, Any]:
    torch.set_num_threads(1)
    runs = {v: hooked(config, v) for v in VARIANTS}
    optims = {v: torch.optim.SGD(ddp.parameters(), lr=1e-3) for v, (ddp, _) in runs.items()}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    losses: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for step in range(config.steps):
        gen = torch.Generator().manual_seed(1000 * step + rank)  # distinct per rank, same per variant
        x, y = (
            torch.randn(config.batch, config.width, generator=gen),
            torch.randn(config.batch, 1, generator=gen),
        )
        turn = step % len(VARIANTS)  # each variant takes each place in the order equally often
        for v in VARIANTS[turn:] + VARIANTS[:turn]:
            ddp, _ = runs[v]
            dist.barrier()
            start = time.perf_counter()
            if rank == config.late:
                (time.sleep if config.idle else burn)(config.delay)
            optims[v].zero_grad()
            loss = (ddp(x) - y).square().mean()
            loss.backward()
            optims[v].step()
            times[v].append(time.perf_counter() - start)
            losses[v].append(float(loss.detach()))
        if step == 0 and config.link_rate is not None:  # every variant's groups are connected now
            pace_links(rank, n, config.link_rate)
        heartbeat()
    hosts = {v: (timed.first, timed.rest) for v, (_, timed) in runs.items() if timed is not None}
    auto = runs["auto"][1]
    assert auto is not None
    return {"times": times, "losses": losses, "hosts": hosts, "auto": evidence(auto, config, n)}


def evidence(timed: Timed, config: Config, n: int) -> dict[str, Any]:
    """What the auto policy decided, and from what: its decisions, each algorithm's median time
    per bucket as the probe gathered it (the fastest rank's), and its last outlook: the rank it
    expects last, by how much, how many times the model's price StragglAR's buckets took, and the
    critical delay of a layer's bucket."""
    state = timed.state
    figures: dict[str, Any] = {"decisions": state.decisions, "buckets": timed.buckets}
    if state.probe is not None:
        for kind, samples in state.probe.samples.items():
            times = [seconds for _, _, seconds in samples]
            figures[f"{kind}_ms"] = statistics.median(times) * 1e3 if times else None
    view = state.outlook
    if view is not None and view.ring is not None and view.ours is not None:
        size = config.width * (config.width + 1) * 4
        critical = critical_delay_for(state.algorithm, n, size, view.ours, view.ring)
        figures |= {
            "candidate": view.candidate,
            "lateness_ms": view.lateness * 1e3,
            "stragglar_cost_ratio": view.ring.bandwidth / view.ours.bandwidth,  # measured / modelled
            "critical_ms": None if critical is None else critical * 1e3,
        }
    return figures


@dataclass(frozen=True)
class Row:
    variant: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    ratio: float  # median over the default hook's median
    host_first_us: float | None  # the hook's wall time for bucket 0 (median)
    host_first_cpu_us: float | None  # and its CPU time
    host_bucket_us: float | None  # for the other buckets: median wall time
    host_bucket_p90_us: float | None
    host_bucket_cpu_us: float | None  # median CPU time of the calling thread
    loss_deviation: float  # largest relative difference from the default hook's loss, any rank/step


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarise(per_rank: list[dict[str, Any]], config: Config) -> list[Row]:
    keep = slice(config.warmup, None)
    steps = {
        v: [max(r["times"][v][i] for r in per_rank) for i in range(config.steps)][keep] for v in VARIANTS
    }
    base = statistics.median(steps["default hook"])
    rows = []
    for v in VARIANTS:
        deviation = max(
            abs(a - b) / max(abs(b), 1e-12)
            for r in per_rank
            for a, b in zip(r["losses"][v], r["losses"]["default hook"], strict=True)
        )
        host = per_rank[0]["hosts"].get(v)
        first = host[0][config.warmup :] if host else []
        rest = host[1][len(host[1]) * config.warmup // config.steps :] if host else []
        walls, cpus = [w for w, _ in rest], [c for _, c in rest]
        rows.append(
            Row(
                v,
                statistics.median(steps[v]) * 1e3,
                percentile(steps[v], 0.1) * 1e3,
                percentile(steps[v], 0.9) * 1e3,
                statistics.median(steps[v]) / base,
                statistics.median(w for w, _ in first) * 1e6 if first else None,
                statistics.median(c for _, c in first) * 1e6 if first else None,
                statistics.median(walls) * 1e6 if rest else None,
                percentile(walls, 0.9) * 1e6 if rest else None,
                statistics.median(cpus) * 1e6 if rest else None,
                deviation,
            )
        )
    return rows


def table(rows: list[Row]) -> str:
    def us(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f}"

    lines = [
        "| variant | step median (ms) | p10-p90 (ms) | / default hook | hook wall time per bucket: "
        "median, p90 (us) | its CPU time (us) | bucket 0: wall, CPU (us) | loss vs default (max rel.) |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.variant} | {r.median_ms:.1f} | {r.p10_ms:.1f}-{r.p90_ms:.1f} | {r.ratio:.2f}x "
            f"| {us(r.host_bucket_us)}, {us(r.host_bucket_p90_us)} | {us(r.host_bucket_cpu_us)} "
            f"| {us(r.host_first_us)}, {us(r.host_first_cpu_us)} | {r.loss_deviation:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = Parser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--gpus", type=whole(2, 64), default=4, metavar="N", help="gloo ranks (processes on this host)"
    )
    parser.add_argument("--late", type=whole(0), default=1, help="the late rank in the second run")
    parser.add_argument(
        "--delay",
        type=duration(positive=True),
        default="30ms",
        help="the late rank's extra compute",
    )
    parser.add_argument("--width", type=whole(1, 2**14), default=768, help="the MLP's hidden width")
    parser.add_argument("--depth", type=whole(1, 1000), default=10, help="the MLP's hidden layers")
    parser.add_argument("--batch", type=whole(1, 2**16), default=64, help="samples per rank and step")
    parser.add_argument(
        "--steps", type=whole(2, 10**5), default=36, help="steps per variant, warm-up included"
    )
    parser.add_argument("--warmup", type=whole(0), default=6, help="first steps left out of the figures")
    parser.add_argument(
        "--idle", action="store_true", help="the late rank sleeps (waits on I/O) instead of computing"
    )
    parser.add_argument(
        "--link-rate", type=link_rate, help="pace every rank's sockets to this bandwidth (e.g. 200MB/s)"
    )
    parser.add_argument("--chunks", type=whole(1), help="StragglAR's chunk count, >= N-1 (default: N-1)")
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also save the figures here")
    args = parser.parse_args()
    # checked before the ranks start: a late rank outside the world was never late, yet judged
    if args.late >= args.gpus:
        parser.error(f"--late {args.late}: the ranks are 0 to {args.gpus - 1}")
    if args.steps - args.warmup < 2:
        parser.error(f"--steps {args.steps} leaves {args.steps - args.warmup} after --warmup: need 2 or more")
    if args.chunks is not None and args.chunks < args.gpus - 1:
        parser.error(
            f"--chunks {args.chunks}: StragglAR over {args.gpus} ranks needs at least {args.gpus - 1}"
        )
    import torch._dynamo  # noqa: F401 - DDP's first construction imports it: once, before the fork

    figures: dict[str, object] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    }
    failed = []
    for kind, delay in (("punctual", 0.0), ("late", args.delay)):
        config = Config(
            args.width,
            args.depth,
            args.batch,
            args.steps,
            args.warmup,
            args.late,
            delay,
            args.idle,
            args.link_rate,
            args.chunks,
        )
        with busy(f"{kind} run: {args.gpus} ranks train {args.steps} steps of 5 variants"):
            per_rank = launch(train, args.gpus, (config,), timeout=120)
        rows, auto = summarise(per_rank, config), per_rank[0]["auto"]
        how = "sleeping" if args.idle else "its own compute"
        who = f"rank {args.late} {args.delay * 1e3:g} ms late by {how}" if delay else "no late rank"
        gradients = args.width * (args.width + 1) * args.depth * 4 / 2**20
        links = "" if args.link_rate is None else f", {paced_to(args.link_rate)}"
        print(
            f"\n{args.gpus} gloo ranks{links}, {who}; MLP {args.depth} x {args.width}, "
            f"{gradients:.1f} MiB of gradients in {auto['buckets']} buckets; "
            f"{args.steps - args.warmup} steps per variant after {args.warmup} of warm-up"
        )
        print(table(rows))
        print(f"auto's decisions (step, algorithm, straggler): {auto['decisions']}")
        print(
            "auto's figures: "
            + ", ".join(
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in auto.items()
                if k not in ("decisions", "buckets")
            )
        )
        ratio = next(r.ratio for r in rows if r.variant == "auto")
        verdict = "met" if ratio <= TARGETS[kind] else "NOT met"
        print(f"target auto <= {TARGETS[kind]:.2f}x the default hook: {verdict} ({ratio:.2f}x)")
        agree = max(r.loss_deviation for r in rows) <= LOSS_RTOL
        print(f"losses agree with the default hook's within {LOSS_RTOL:g}: {'yes' if agree else 'NO'}")
        if not agree:
            failed.append(kind)
        figures[kind] = {"rows": [asdict(r) for r in rows], "auto": auto}
    if args.json:
        save(args.json, figures)
    if failed:
        raise SystemExit(f"losses differ from the default hook's in the {' and '.join(failed)} run")


if __name__ == "__main__":
    as_command(main)
