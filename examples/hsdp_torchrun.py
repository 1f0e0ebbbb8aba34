"""Train a small transformer with FSDP2's HSDP twice: its own all-reduce across replicas, and StragglAR's.

    torchrun --nproc-per-node=4 examples/hsdp_torchrun.py
    torchrun --nproc-per-node=4 examples/hsdp_torchrun.py --late-rank 3 --delay 50ms

The ranks form a mesh of 2 replicas (``--replicas``) of world / 2 shards each: rank r holds shard
r mod shards of replica r // shards.  On NCCL where torch sees CUDA GPUs, on gloo otherwise;
``--backend`` chooses.  Every step trains two copies of one model on the same data: one sharded
with ``fully_shard`` on the 2-D mesh (native HSDP), one sharded over the shard dimension with
``stragglar.fsdp.use_stragglar`` reducing each shard across the replicas with
``StragglarState(policy="auto")``: StragglAR with the late replica as straggler where the cost model
says it pays, the engine's all_reduce otherwise (``--policy stragglar``: StragglAR always).
``--late-rank`` sleeps ``--delay`` before each forward pass, as a straggler would; its replica is
then the late one.  At the end rank 0 prints the policy's decisions, per step both copies' times
and losses, and whether the losses match (the same sums, added in another order: equal but for
rounding); a rank whose losses differ exits with status 1.  ``--engine device`` reduces the
shards StragglAR gets with the device engine (one kernel launch a shard and replica, staged through
the inboxes; CUDA and CuPy).
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_torchrun import (  # the sibling example: its options, and joining torchrun's job on its GPU
    Parser,
    checked,
    engine_option,
    lateness_options,
    positive,
    refuse,
    start,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from stragglar.args import as_rank
from stragglar.ddp import StragglarState
from stragglar.errors import InputError
from stragglar.fsdp import use_stragglar

TOLERANCE = 1e-5  # relative: float32 sums of the same gradients in another order
HEADS = 4  # attention heads a block


def options() -> argparse.Namespace:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), help="default: nccl where CUDA is, else gloo")
    parser.add_argument("--policy", choices=("auto", "stragglar"), default="auto")
    parser.add_argument("--replicas", type=positive, default=2, help="the mesh's replicas (default 2)")
    parser.add_argument("--steps", type=positive, default=12)
    parser.add_argument("--width", type=positive, default=128, help="the model's width")
    parser.add_argument("--depth", type=positive, default=4, help="the model's blocks")
    lateness_options(parser)
    engine_option(parser)
    args = checked(parser)
    if args.width % HEADS:
        parser.error(f"--width must be a multiple of the {HEADS} attention heads, got {args.width}")
    return args


class Block(torch.nn.Module):
    """A pre-norm transformer block: :data:`HEADS` heads of self-attention, then a 4x MLP."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.heads = HEADS
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, -1).transpose(1, 3).unbind(2)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, tokens, width))
        mixed: torch.Tensor = self.down(F.gelu(self.up(self.norm2(x))))
        return x + mixed


def transformer(width: int, depth: int, device: torch.device) -> torch.nn.Sequential:
    torch.manual_seed(0)  # the same initial weights on every rank, and in both copies
    blocks = [Block(width) for _ in range(depth)]
    head = [torch.nn.LayerNorm(width), torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*blocks, *head).to(device)


def sharded(model: torch.nn.Sequential, mesh: DeviceMesh) -> torch.nn.Sequential:
    """Each block a parameter group of its own, the rest the root's."""
    for block in model:
        if isinstance(block, Block):
            fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main() -> None:
    args = options()
    device = start(args.backend or ("nccl" if torch.cuda.is_available() else "gloo"), args.engine)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.replicas < 1 or world % args.replicas:
        refuse(f"--replicas must divide the {world} ranks, got {args.replicas}")
    shards = world // args.replicas
    late_replica = None
    if args.late_rank is not None:
        try:
            late_replica = as_rank(args.late_rank, "--late-rank", world) // shards
        except InputError as e:
            refuse(str(e))
    mesh = init_device_mesh(device.type, (args.replicas, shards), mesh_dim_names=("replicate", "shard"))
    native = sharded(transformer(args.width, args.depth, device), mesh)
    ours = sharded(transformer(args.width, args.depth, device), mesh["shard"])
    state = StragglarState(policy=args.policy, straggler=late_replica, engine=args.engine)
    use_stragglar(ours, state, replicate_group=mesh["replicate"].get_group())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (native, ours)]

    rows = []
    for step in range(1, args.steps + 1):
        data = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own batch
        x = torch.randn(8, 16, args.width, generator=data).to(device)
        y = torch.tanh(torch.roll(x, 1, dims=1))  # of the token before: the attention must look back
        row: list[float] = []
        for model, optimizer in zip((native, ours), optimizers, strict=True):
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
    worst = max(abs(ours_loss - loss) / abs(loss) for _, loss, _, ours_loss in rows)
    if rank == 0:
        report(args, state, rows, shards)
    matched = worst <= TOLERANCE  # False for NaN too
    if rank == 0 or not matched:
        verdict = "match" if matched else "DIFFER"
        print(
            f"rank {rank}: the losses {verdict}: "
            f"largest relative difference {worst:.1e} (at most {TOLERANCE:g})"
        )
    dist.destroy_process_group()  # the hook's work on its groups (CUDA graphs, probe) ends first
    if not matched:
        raise SystemExit(1)


def report(args: argparse.Namespace, state: StragglarState, rows: list[list[float]], shards: int) -> None:
    """The policy's decisions, then per step both copies' times and losses."""
    late = ""
    if args.late_rank is not None:
        late = f", rank {args.late_rank} (replica {args.late_rank // shards}) late by {args.delay * 1e3:g} ms"
    print(
        f"{dist.get_world_size()} ranks on {dist.get_backend()}: {args.replicas} replicas x {shards} shards, "
        f"transformer {args.depth} x {args.width}{late}"
    )
    print(f'decisions of policy="{args.policy}" (step, algorithm, straggler replica, chunks):')
    for decision in state.decisions:
        print(f"  {decision}")
    print("step  native HSDP (ms)  stragglar hook (ms)  loss (native)  loss (stragglar)")
    for step, (t0, loss0, t1, loss1) in enumerate(rows, 1):
        print(f"{step:4d}  {t0 * 1e3:16.1f}  {t1 * 1e3:19.1f}  {loss0:13.6f}  {loss1:16.6f}")
    before, after = (statistics.median(row[k] for row in rows) * 1e3 for k in (0, 2))
    print(f"median step: native HSDP {before:.1f} ms, stragglar hook {after:.1f} ms")


if __name__ == "__main__":
    main()
