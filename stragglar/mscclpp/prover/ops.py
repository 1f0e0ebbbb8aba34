"""Check and resolve one op of a plan, as the executor's ``setupOperation`` and the kernel read it.

An op's references are resolved against what the plan's reader
(:class:`~stragglar.mscclpp.prover.read.Resolver`) has resolved before it: the GPUs' buffers and
remote buffers, and the threads per block.  :class:`Resolved` names those, so that this module
needs nothing of the reader's (which imports it).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Protocol

from stragglar.mscclpp.prover.parsed import SHAPE_WORDS, SHAPES, SYNC_OPS, UNSUPPORTED_OPS, Op, Ref, Walker
from stragglar.mscclpp.vocabulary import (
    BUFFERS,
    CHANNEL_TYPES,
    EXECUTOR_OPS,
    MAX_BUFFERS_PER_OPERATION,
    MAX_CHANNEL_PER_OPERATION,
    MAX_DEVICE_SEMAPHORES,
    MAX_DEVICE_SYNCERS,
    UINT64_MAX,
)

__all__ = ["OpReader", "Resolved"]


class Resolved(Protocol):
    """What the plan's reader has resolved when it reads a block's ops."""

    rd: Walker  # names the place of a problem
    threads: int  # per block
    remote: list[list[tuple[int, str, bool]]]  # per GPU: (rank, buffer type, memory access) per remote buffer
    chunks: list[dict[str, int]]  # per GPU: chunks per buffer type


@functools.cache
def _shape_ok(pattern: str, flags: str) -> bool:
    return re.fullmatch(pattern, flags) is not None


class OpReader:
    """Checks and resolves the ops of one thread block."""

    def __init__(
        self, res: Resolved, g: int, t: int, channels: list[int], buffers: list[int], n_sems: int
    ) -> None:
        self.res, self.rd, self.g, self.t, self.i = res, res.rd, g, t, -1
        self.channels, self.buffers, self.n_sems = channels, buffers, n_sems

    def read(self, i: int, oj: dict[str, Any]) -> Op:
        self.i = i
        rd, g, t = self.rd, self.g, self.t
        rd.at(g, t, i)
        name = rd.get(oj, "name", str)
        if name not in EXECUTOR_OPS:
            raise rd.fail(f"unknown op '{name}' (the executor throws 'Invalid operation type')")
        rd.opname = name
        if name in UNSUPPORTED_OPS:
            raise rd.unsupported(
                f"unsupported op {name} ({UNSUPPORTED_OPS[name]}): not modelled by this prover"
            )
        if "tbg_info" in oj:
            raise rd.unsupported(
                "unsupported tbg_info: thread-block groups split chunks below chunk granularity"
            )
        if "reduce_op" in oj and oj["reduce_op"] != "sum":
            raise rd.unsupported(
                f"unsupported reduce_op {json.dumps(oj['reduce_op'])}: the kernel always sums"
            )
        channel_type = rd.get(oj, "channel_type", str, None, required=False)
        if channel_type is not None and channel_type not in CHANNEL_TYPES:
            raise rd.fail(f"unknown channel_type '{channel_type}'")
        if channel_type in ("port", "switch"):
            raise rd.unsupported(
                f"unsupported {channel_type}-channel op: this prover models memory channels only"
            )
        if name == "nop":
            return Op(name, i)
        if name == "barrier":
            barrier = rd.count(oj, "barrier_id")
            count = rd.count(oj, "num_threadblocks")
            if barrier >= MAX_DEVICE_SYNCERS or count == 0:
                raise rd.bad(
                    "structure", f"barrier {barrier} of {count} blocks; ids go up to {MAX_DEVICE_SYNCERS - 1}"
                )
            return Op(name, i, barrier=(barrier, count))
        if name in ("sem_acquire", "sem_release"):
            ids = rd.ints(oj, "semaphore_ids")
            if not ids or len(ids) > MAX_DEVICE_SEMAPHORES or max(ids) >= self.n_sems:
                raise rd.bad(
                    "structure",
                    f"semaphore ids {ids} must name 1 to {MAX_DEVICE_SEMAPHORES} of GPU {g}'s {self.n_sems}",
                )
            return Op(name, i, semaphores=tuple(ids))
        if name in SYNC_OPS:
            return Op(name, i, endpoints=self._lanes(oj, channel_type))
        return self._data(name, oj, channel_type)

    def _lanes(self, oj: dict[str, Any], channel_type: str | None) -> tuple[int, ...]:
        rd = self.rd
        ids = rd.ints(oj, "channel_ids")
        if channel_type != "memory":
            raise rd.bad("structure", "has no channel_type 'memory', so the kernel's handler does nothing")
        if not ids or len(ids) > MAX_CHANNEL_PER_OPERATION or len(ids) > self.res.threads:
            raise rd.bad(
                "limit",
                f"names {len(ids)} channels; one op takes 1 to {MAX_CHANNEL_PER_OPERATION}, one per thread",
            )
        for c in ids:
            if c >= len(self.channels):
                raise rd.bad(
                    "structure",
                    f"channel id {c} is not one of this block's {len(self.channels)} memory channels",
                )
        return tuple(self.channels[c] for c in ids)

    def _operands(self, oj: dict[str, Any], key: str) -> list[tuple[Ref, bool]]:
        rd, g = self.rd, self.g
        out: list[tuple[Ref, bool]] = []
        for k, bj in enumerate(rd.objects(oj, key)):
            rd.part = (key, k)
            index, size = bj.get("index"), bj.get("size")
            if not (type(index) is int and 0 <= index <= UINT64_MAX) or not (
                type(size) is int and 0 <= size <= UINT64_MAX
            ):
                index, size = rd.count(bj, "index"), rd.count(bj, "size")  # the reader's words
            if "buffer_id" in bj:
                b = bj["buffer_id"]
                if type(b) is not int or not 0 <= b <= UINT64_MAX:
                    b = rd.count(bj, "buffer_id")
                if b >= len(self.buffers):
                    raise rd.bad(
                        "structure",
                        f"buffer_id {b} is not one of this block's {len(self.buffers)} remote buffers",
                    )
                rank, kind, _ = self.res.remote[g][self.buffers[b]]
                ref, remote = Ref(rank, kind, index, size), True
            else:
                kind = rd.get(bj, "type", str)
                if kind not in BUFFERS:
                    raise rd.fail(f"unknown buffer type '{kind}'")
                ref, remote = Ref(g, kind, index, size), False
            if size == 0:
                raise rd.bad("structure", "has size 0")
            limit = self.res.chunks[ref.gpu][ref.buffer]
            if index + size > limit:
                raise rd.bad(
                    "bounds",
                    f"chunks {index}..{index + size - 1} of GPU {ref.gpu}'s '{ref.buffer}' buffer, which "
                    f"has {limit}",
                )
            rd.part = ""
            out.append((ref, remote))
        if len(out) > MAX_BUFFERS_PER_OPERATION:
            raise rd.bad(
                "limit",
                f"names {len(out)} buffers in {key}; one op takes at most {MAX_BUFFERS_PER_OPERATION}",
            )
        return out

    def _data(self, name: str, oj: dict[str, Any], channel_type: str | None) -> Op:
        rd = self.rd
        src, dst = self._operands(oj, "src_buff"), self._operands(oj, "dst_buff")
        if (any(r for _, r in src) or any(r for _, r in dst)) and channel_type != "memory":
            raise rd.bad(
                "structure", "uses a remote buffer without channel_type 'memory'; the executor throws"
            )
        for operands, key, pattern in (
            (src, "src_buff", SHAPES[name][0]),
            (dst, "dst_buff", SHAPES[name][1]),
        ):
            flags = "".join("R" if remote else "L" for _, remote in operands)
            if not _shape_ok(pattern, flags):
                got = ", ".join("remote" if f == "R" else "local" for f in flags) or "nothing"
                raise rd.bad("structure", f"{key} must be {SHAPE_WORDS[pattern]}, got {got}")
        refs_src = tuple(r for r, _ in src)
        refs_dst = tuple(r for r, _ in dst)
        if name in ("put", "get"):
            if len(refs_src) != len(refs_dst):
                raise rd.bad(
                    "structure",
                    f"has {len(refs_src)} sources and {len(refs_dst)} destinations; the kernel pairs them",
                )
            if any(s.size != d.size for s, d in zip(refs_src, refs_dst, strict=True)):
                raise rd.bad("structure", "pairs a source and a destination of different sizes")
        if name == "put" and len({r.buffer for r in refs_src}) > 1:
            raise rd.bad(
                "structure",
                "reads sources of different buffer types; the kernel reads all from src_buff[0]'s",
            )
        if name == "get" and any(s.index != d.index for s, d in zip(refs_src, refs_dst, strict=True)):
            raise rd.unsupported(
                "unsupported get with different source and destination indices: the kernel swaps the two "
                "offsets (execution_kernel.hpp handleGet)"
            )
        if name not in ("put", "get") and any(r.size != refs_src[0].size for r in refs_src + refs_dst):
            raise rd.bad("structure", "mixes operand sizes; the kernel uses src_buff[0]'s size for all")
        return Op(name, self.i, src=refs_src, dst=refs_dst)
