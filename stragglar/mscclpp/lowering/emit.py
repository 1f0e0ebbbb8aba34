"""Lowering stages 3 and 4: give the thread blocks their channels, buffers and semaphores; write JSON.

Resources, as the executor resolves them (``execution_plan.cc``, ``executor.cc``):

* **Channels.**  One memory channel per (peer, segment, instance) on each side.  A GPU lists its
  channel entries sorted by (segment, instance, peer); the executor pairs the k-th entry from
  ``g`` to ``h`` with the k-th from ``h`` to ``g``, and both sides list their common connections in
  the same (segment, instance) order, so the right ends meet.  A thread block lists the global
  indices of its channels; its ops use indices into that list.
* **Remote buffers.**  One per peer the GPU puts into: the peer's scratch (``"s"``).  Nothing ever
  touches a peer's input buffer, so the plan needs no symmetric buffer offsets across ranks.
* **Device semaphores.**  One per link of a GPU's chain of thread blocks, initial value 0.

Instances replicate the whole program: instance ``k`` of ``K`` handles chunks ``k*C .. k*C+C-1``
and scratch slots ``k*S .. k*S+S-1`` with its own thread blocks, channels and semaphores, so a
chunk is moved by K thread blocks in parallel.

The text has one op per line, so plans diff well; it is plain JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stragglar.mscclpp.lowering.threadblocks import LOCAL, Block, BlockOp, Operand

__all__ = ["Header", "plan_dict", "plan_text"]


@dataclass(frozen=True, slots=True)
class Header:
    """The plan's top-level fields; ``chunks`` and ``scratch`` are per instance."""

    name: str
    num_threads_per_block: int
    buffer_alignment: int
    min_message_size: int
    max_message_size: int
    chunks: int
    scratch: tuple[int, ...]
    instances: int


def _operand(op: Operand, gpu: int, instance: int, header: Header, buffer_ids: dict[int, int]) -> str:
    owner, buf, index, count = op
    chunks = header.chunks if buf == "i" else header.scratch[gpu if owner == LOCAL else owner]
    shifted = index + instance * chunks
    if owner == LOCAL:
        return f'{{"type":"{buf}","index":{shifted},"size":{count}}}'
    return f'{{"buffer_id":{buffer_ids[owner]},"index":{shifted},"size":{count}}}'


def _op(op: BlockOp, gpu: int, instance: int, header: Header, tb: _TbContext) -> str:
    """One op as JSON text (written directly: ops are most of a plan, and this is the hot loop)."""
    if op.name == "nop":
        return '{"name":"nop"}'
    if op.name in ("signal", "wait"):
        ids = ",".join(str(tb.channels[p]) for p in op.peers)
        return f'{{"name":"{op.name}","channel_ids":[{ids}],"channel_type":"memory"}}'
    if op.name in ("sem_acquire", "sem_release"):
        return f'{{"name":"{op.name}","semaphore_ids":[{tb.semaphore_base + op.link}]}}'
    src = ",".join(_operand(x, gpu, instance, header, tb.buffers) for x in op.src)
    dst = ",".join(_operand(x, gpu, instance, header, tb.buffers) for x in op.dst)
    tail = ',"channel_type":"memory"' if op.name == "put" else ',"reduce_op":"sum"' if op.name == "re" else ""
    return f'{{"name":"{op.name}","src_buff":[{src}],"dst_buff":[{dst}]{tail}}}'


@dataclass(frozen=True, slots=True)
class _TbContext:
    channels: dict[int, int]  # peer -> index in the block's channel list
    buffers: dict[int, int]  # peer -> index in the block's remote buffer list
    semaphore_base: int


def plan_dict(blocks: Sequence[Sequence[Block]], header: Header) -> dict[str, Any]:
    """The plan as the executor reads it, every reference resolved to an index; ops already as JSON text."""
    n = len(blocks)
    k_count = header.instances
    gpus: list[dict[str, Any]] = []
    for g in range(n):
        connections = sorted({(b.segment, k, p) for b in blocks[g] for k in range(k_count) for p in b.peers})
        channel_index = {c: i for i, c in enumerate(connections)}
        put_peers = sorted({p for b in blocks[g] for p in b.put_peers})
        buffer_index = {p: i for i, p in enumerate(put_peers)}
        links = max(len(blocks[g]) - 1, 0)
        tbs: list[dict[str, Any]] = []
        for k in range(k_count):
            for b in blocks[g]:
                ctx = _TbContext(
                    {p: i for i, p in enumerate(b.peers)},
                    {p: i for i, p in enumerate(b.put_peers)},
                    k * links,
                )
                tb: dict[str, Any] = {"id": len(tbs), "ops": [_op(op, g, k, header, ctx) for op in b.ops]}
                tb["channels"] = (
                    [
                        {
                            "channel_type": "memory",
                            "channel_ids": [channel_index[(b.segment, k, p)] for p in b.peers],
                        }
                    ]
                    if b.peers
                    else []
                )
                tb["remote_buffer_refs"] = (
                    [
                        {
                            "access_channel_type": "memory",
                            "remote_buffer_ids": [buffer_index[p] for p in b.put_peers],
                        }
                    ]
                    if b.put_peers
                    else []
                )
                tbs.append(tb)
        gpus.append(
            {
                "id": g,
                "input_chunks": header.chunks * k_count,
                "output_chunks": header.chunks * k_count,
                "scratch_chunks": header.scratch[g] * k_count,
                "threadblocks": tbs,
                "channels": (
                    [{"channel_type": "memory", "connected_to": [p for _, _, p in connections]}]
                    if connections
                    else []
                ),
                "remote_buffers": [
                    {"rank": p, "type": "s", "access_channel_types": ["memory"]} for p in put_peers
                ],
                "semaphores": [{"init_value": 0} for _ in range(links * k_count)],
            }
        )
    return {
        "name": header.name,
        "collective": "allreduce",
        "protocol": "Simple",
        "inplace": True,
        "reuse_resources": False,
        "gpus": gpus,
        "num_threads_per_block": header.num_threads_per_block,
        "use_double_scratch_buffer": False,
        "buffer_alignment": header.buffer_alignment,
        "min_message_size": header.min_message_size,
        "max_message_size": header.max_message_size,
    }


_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def plan_text(plan: dict[str, Any]) -> str:
    """JSON with one line per op, per thread-block header and per GPU header; ends with a newline.

    ``plan`` comes from :func:`plan_dict` (its ops are already JSON text).
    """
    lines = ["{" + ",".join(f"{_dumps(k)}:{_dumps(v)}" for k, v in plan.items() if k != "gpus") + ',"gpus":[']
    for gi, gpu in enumerate(plan["gpus"]):
        head = ",".join(f"{_dumps(k)}:{_dumps(v)}" for k, v in gpu.items() if k != "threadblocks")
        lines.append("{" + head + ',"threadblocks":[')
        for ti, tb in enumerate(gpu["threadblocks"]):
            tb_head = ",".join(f"{_dumps(k)}:{_dumps(v)}" for k, v in tb.items() if k != "ops")
            lines.append("{" + tb_head + ',"ops":[')
            ops = tb["ops"]
            lines.extend(op + ("," if i + 1 < len(ops) else "") for i, op in enumerate(ops))
            lines.append("]}" + ("," if ti + 1 < len(gpu["threadblocks"]) else ""))
        lines.append("]}" + ("," if gi + 1 < len(plan["gpus"]) else ""))
    lines.append("]}")
    return "\n".join(lines) + "\n"
