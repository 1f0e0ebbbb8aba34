"""Read an MSCCL++ execution plan from its JSON text, with the executor's rules (prover, part 1).

This module and the rest of the prover never use the lowering's data structures: any plan, ours
or hand-written, is read from its text, as ``ExecutionPlan::Impl`` in MSCCL++'s
``src/core/executor/execution_plan.cc`` reads it, and every reference is resolved the way the
executor resolves it:

* ``gpus[r]`` is GPU ``r`` and must say ``id == r``; thread block ``k`` must say ``id == k`` (the
  executor files a block's ops by position but its channels and buffers by ``id``).
* A GPU's memory channels are its ``channels`` entries of type memory, flattened peer by peer; a
  block's ``channels`` list indices into that list, and an op's ``channel_ids`` index the block's.
  The k-th memory channel from ``g`` to ``h`` is connected to the k-th from ``h`` to ``g``.
* A block's ``remote_buffer_refs`` list indices into the GPU's ``remote_buffers``; an op's
  ``buffer_id`` indexes the block's list; the buffer belongs to the GPU named by its ``rank``.

Errors are one line and name the place (``gpu 0 tb 1 op 5 (put): ...``).  Malformed text raises
:class:`~stragglar.mscclpp.errors.PlanFormatError`, something the prover does not model raises
:class:`~stragglar.mscclpp.errors.UnsupportedPlanError`, and a well-formed plan that breaks an
executor rule or limit raises :class:`~stragglar.mscclpp.errors.PlanViolationError`.

Modelled: collective allreduce (in place or not), protocol Simple, memory channels, ops ``nop``
``barrier`` ``signal`` ``wait`` ``rlxsignal`` ``rlxwait`` ``sem_acquire`` ``sem_release`` ``put``
``get`` ``copy`` ``re`` ``res`` ``rre`` ``rres``.  Refused as unsupported: other collectives, LL
packets (``ppkt`` ``rppkt`` ``respkt`` ``cpkt`` ``upkt`` ``repkt`` ``recpkt`` ``recspkt``), port-channel
ops (``pws`` ``pwsf`` ``flush``) and port channels, NVLS switch ops (``glres`` ``gstore`` ``gstorepkt``)
and switch channels, ``pipeline``, thread-block groups (``tbg_info``), ``reuse_resources`` and
``use_double_scratch_buffer``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from stragglar.mscclpp.errors import PlanFormatError, PlanViolation, PlanViolationError, UnsupportedPlanError

__all__ = ["Gpu", "Op", "Plan", "Ref", "Tb", "read_plan"]

# execution_common.hpp
MAX_OPERATION = 64
MAX_CHANNEL = 16
MAX_CHANNEL_PER_OPERATION = 8
MAX_BUFFERS_PER_OPERATION = 2 + 8
MAX_DEVICE_SYNCERS = 16
MAX_DEVICE_SEMAPHORES = 16

EXECUTOR_OPS = frozenset(
    [
        "nop",
        "barrier",
        "put",
        "pws",
        "pwsf",
        "get",
        "copy",
        "signal",
        "wait",
        "flush",
        "re",
        "res",
        "rre",
        "rres",
        "ppkt",
        "rppkt",
        "respkt",
        "cpkt",
        "upkt",
        "repkt",
        "recpkt",
        "recspkt",
        "glres",
        "gstore",
        "gstorepkt",
        "rlxsignal",
        "rlxwait",
        "pipeline",
        "sem_acquire",
        "sem_release",
    ]
)
UNSUPPORTED_OPS = {
    **dict.fromkeys(
        ["ppkt", "rppkt", "respkt", "cpkt", "upkt", "repkt", "recpkt", "recspkt"], "LL packet op"
    ),
    **dict.fromkeys(["pws", "pwsf", "flush"], "port-channel op"),
    **dict.fromkeys(["glres", "gstore", "gstorepkt"], "NVLS switch op"),
    "pipeline": "pipelined loop",
}
# Operands each data op takes, as the kernel reads them: L a local buffer, R a remote one.
_SHAPES = {
    "put": ("L+", "R+"),
    "get": ("R+", "L+"),
    "copy": ("L", "L"),
    "re": ("L+", "L"),
    "res": ("L+", "LR*"),
    "rre": ("LR+", "L"),
    "rres": ("LR+", "LR*"),
}
_SHAPE_WORDS = {
    "L+": "local buffers",
    "R+": "remote buffers",
    "L": "one local buffer",
    "LR+": "a local buffer then remote buffers",
    "LR*": "a local buffer, then any remote buffers",
}
SYNC_OPS = frozenset({"signal", "wait", "rlxsignal", "rlxwait"})
DATA_OPS = frozenset({"put", "get", "copy", "re", "res", "rre", "rres"})


@dataclass(frozen=True, slots=True)
class Ref:
    """A chunk range an op touches: ``size`` chunks from ``index`` of buffer ``buffer`` of ``gpu``."""

    gpu: int
    buffer: str
    index: int
    size: int


@dataclass(frozen=True, slots=True)
class Op:
    """One op, references resolved.

    ``endpoints``: global memory-channel endpoint per lane (signal/wait);
    ``semaphores``: GPU-level device semaphore ids; ``barrier``: (id, number of thread blocks).
    """

    name: str
    index: int
    endpoints: tuple[int, ...] = ()
    src: tuple[Ref, ...] = ()
    dst: tuple[Ref, ...] = ()
    semaphores: tuple[int, ...] = ()
    barrier: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Tb:
    gpu: int
    id: int
    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class Gpu:
    id: int
    input_chunks: int
    output_chunks: int
    scratch_chunks: int
    semaphores: tuple[int, ...]
    tbs: tuple[Tb, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """A plan as the executor sees it.  ``partner[e]`` is the endpoint connected to endpoint ``e``
    (-1 if none); ``endpoint_owner[e]`` is (gpu, index in the GPU's memory channel list, peer)."""

    name: str
    collective: str
    inplace: bool
    buffer_alignment: int
    min_message_size: int
    max_message_size: int
    num_threads_per_block: int
    gpus: tuple[Gpu, ...]
    partner: tuple[int, ...]
    endpoint_owner: tuple[tuple[int, int, int], ...]

    @property
    def chunks(self) -> int:
        return self.gpus[0].input_chunks


def _violation(kind: str, gpu: int, tb: int, op: int, message: str) -> PlanViolationError:
    return PlanViolationError(PlanViolation(kind, gpu, tb, op, message))


class _Reader:
    """Walks the JSON object; ``where`` is the current place for messages."""

    def __init__(self) -> None:
        self.where = "plan"
        self.loc = (-1, -1, -1)

    def fail(self, message: str) -> PlanFormatError:
        return PlanFormatError(f"{self.where}: {message}")

    def bad(self, kind: str, message: str) -> PlanViolationError:
        return _violation(kind, *self.loc, f"{self.where}: {message}")

    def unsupported(self, message: str) -> UnsupportedPlanError:
        return UnsupportedPlanError(f"{self.where}: {message}")

    def get(
        self, obj: dict[str, Any], key: str, kind: type, default: Any = None, required: bool = True
    ) -> Any:
        if key not in obj:
            if required:
                raise self.fail(f"missing key '{key}'")
            return default
        value = obj[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise self.fail(f"'{key}' must be {_type_name(kind)}, got {json.dumps(value)[:40]}")
        return value

    def count(self, obj: dict[str, Any], key: str, default: int = 0, required: bool = True) -> int:
        value: int = self.get(obj, key, int, default, required)
        if value < 0:
            raise self.fail(f"'{key}' must not be negative, got {value}")
        return value

    def ints(self, obj: dict[str, Any], key: str) -> list[int]:
        values: list[Any] = self.get(obj, key, list)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise self.fail(f"'{key}' must be a list of non-negative integers")
        return values

    def objects(self, obj: dict[str, Any], key: str, required: bool = True) -> list[dict[str, Any]]:
        values: list[Any] = self.get(obj, key, list, [], required)
        if not all(isinstance(v, dict) for v in values):
            raise self.fail(f"every entry of '{key}' must be an object")
        return values


def _type_name(kind: type) -> str:
    return {int: "an integer", str: "a string", bool: "true or false", list: "a list", dict: "an object"}[
        kind
    ]


_BUFFERS = ("i", "o", "s")
_CHANNEL_TYPES = ("memory", "port", "switch", "none")


def read_plan(text: str) -> Plan:
    """Parse and resolve a plan; see the module docstring for what is checked and what is refused."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanFormatError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise PlanFormatError("not an MSCCL++ execution plan: the top level must be an object")
    rd = _Reader()
    name: str = rd.get(obj, "name", str)
    collective: str = rd.get(obj, "collective", str)
    protocol: str = rd.get(obj, "protocol", str)
    inplace: bool = rd.get(obj, "inplace", bool)
    if protocol not in ("Simple", "LL"):
        raise rd.fail(f"protocol must be 'Simple' or 'LL', got '{protocol}'")
    if collective != "allreduce":
        raise rd.unsupported(
            f"unsupported collective '{collective}': this prover checks allreduce plans only"
        )
    if protocol == "LL":
        raise rd.unsupported("unsupported protocol LL (packets): this prover models Simple plans only")
    if rd.get(obj, "reuse_resources", bool, False, required=False):
        raise rd.unsupported("unsupported reuse_resources: scratch offsets wrap modulo a predefined size")
    if rd.get(obj, "use_double_scratch_buffer", bool, False, required=False):
        raise rd.unsupported(
            "unsupported use_double_scratch_buffer: Simple puts write the peer's scratch without the "
            "alternating half offset (execution_kernel.hpp handlePut)"
        )
    alignment = rd.count(obj, "buffer_alignment", 16, required=False)
    threads = rd.count(obj, "num_threads_per_block", 1024, required=False)
    low = rd.count(obj, "min_message_size", 0, required=False)
    high = rd.count(obj, "max_message_size", (1 << 64) - 1, required=False)
    if alignment == 0:
        raise rd.fail("'buffer_alignment' must be positive")
    if not 1 <= threads <= 1024:
        raise rd.bad(
            "limit", f"num_threads_per_block is {threads}; the kernel runs 1 to 1024 threads per block"
        )
    gpus_json = rd.objects(obj, "gpus")
    if not gpus_json:
        raise rd.fail("'gpus' is empty")
    return _Resolver(rd, gpus_json, inplace, threads).plan(name, collective, alignment, low, high)


class _Resolver:
    """Second pass: GPU headers, channel pairing, then thread blocks and ops."""

    def __init__(self, rd: _Reader, gpus_json: list[dict[str, Any]], inplace: bool, threads: int) -> None:
        self.rd = rd
        self.gpus_json = gpus_json
        self.inplace = inplace
        self.threads = threads
        self.n = len(gpus_json)
        self.channels: list[list[int]] = []  # peer of each memory channel, per GPU
        self.remote: list[list[tuple[int, str, bool]]] = []  # (rank, type, memory access), per GPU
        self.chunks: list[dict[str, int]] = []

    def plan(self, name: str, collective: str, alignment: int, low: int, high: int) -> Plan:
        rd = self.rd
        for g, gj in enumerate(self.gpus_json):
            rd.where, rd.loc = f"gpu {g}", (g, -1, -1)
            if rd.get(gj, "id", int) != g:
                raise rd.bad(
                    "structure", f"has id {gj['id']}; the executor takes gpus[rank] and needs id == rank"
                )
            sizes = {
                b: rd.count(gj, key)
                for b, key in zip(_BUFFERS, ("input_chunks", "output_chunks", "scratch_chunks"), strict=False)
            }
            self.chunks.append(sizes)
            self.channels.append(self._gpu_channels(g, gj))
            self.remote.append(self._gpu_buffers(g, gj))
        first = self.chunks[0]
        for g, sizes in enumerate(self.chunks):
            rd.where, rd.loc = f"gpu {g}", (g, -1, -1)
            if sizes["i"] == 0:
                raise rd.bad("structure", "has 0 input chunks; the executor's size check divides by it")
            if sizes["i"] != first["i"]:
                raise rd.unsupported(
                    f"unsupported: {sizes['i']} input chunks where gpu 0 has {first['i']}; chunk sizes "
                    "would differ "
                    "between GPUs and remote offsets are computed with the local one"
                )
            if sizes["o"] != sizes["i"]:
                raise rd.bad(
                    "structure",
                    f"has {sizes['o']} output chunks and {sizes['i']} input chunks; an allreduce's equal "
                    "input and "
                    "output sizes then give different chunk sizes and the executor throws",
                )
        base, partner, owner = self._pair_channels()
        gpus = tuple(self._gpu(g, gj, base) for g, gj in enumerate(self.gpus_json))
        return Plan(name, collective, self.inplace, alignment, low, high, self.threads, gpus, partner, owner)

    def _gpu_channels(self, g: int, gj: dict[str, Any]) -> list[int]:
        rd = self.rd
        peers: list[int] = []
        for k, ch in enumerate(rd.objects(gj, "channels")):
            rd.where = f"gpu {g} channels[{k}]"
            kind = rd.get(ch, "channel_type", str)
            if kind not in _CHANNEL_TYPES:
                raise rd.fail(f"unknown channel_type '{kind}'")
            if kind != "memory":
                raise rd.unsupported(f"unsupported {kind} channel: this prover models memory channels only")
            for p in rd.ints(ch, "connected_to"):
                if p >= self.n or p == g:
                    raise rd.bad(
                        "structure", f"connects to rank {p}, not a peer of GPU {g} among {self.n} GPUs"
                    )
                peers.append(p)
        return peers

    def _gpu_buffers(self, g: int, gj: dict[str, Any]) -> list[tuple[int, str, bool]]:
        rd = self.rd
        out: list[tuple[int, str, bool]] = []
        for k, rb in enumerate(rd.objects(gj, "remote_buffers")):
            rd.where = f"gpu {g} remote_buffers[{k}]"
            rank = rd.count(rb, "rank")
            kind = rd.get(rb, "type", str)
            access = rd.get(rb, "access_channel_types", list)
            if kind not in _BUFFERS:
                raise rd.fail(f"unknown buffer type '{kind}'")
            if not all(isinstance(a, str) and a in _CHANNEL_TYPES for a in access):
                raise rd.fail("access_channel_types must list channel types")
            if rank >= self.n or rank == g:
                raise rd.bad("structure", f"names rank {rank}, not a peer of GPU {g} among {self.n} GPUs")
            out.append((rank, kind, "memory" in access))
        return out

    def _pair_channels(self) -> tuple[list[int], tuple[int, ...], tuple[tuple[int, int, int], ...]]:
        base: list[int] = []
        owner: list[tuple[int, int, int]] = []
        for g, peers in enumerate(self.channels):
            base.append(len(owner))
            owner.extend((g, j, p) for j, p in enumerate(peers))
        partner = [-1] * len(owner)
        for g, peers in enumerate(self.channels):
            for h in range(g + 1, self.n):
                mine = [base[g] + j for j, p in enumerate(peers) if p == h]
                theirs = [base[h] + j for j, p in enumerate(self.channels[h]) if p == g]
                for a, b in zip(mine, theirs, strict=False):
                    partner[a], partner[b] = b, a
        return base, tuple(partner), tuple(owner)

    def _gpu(self, g: int, gj: dict[str, Any], base: list[int]) -> Gpu:
        rd = self.rd
        rd.where, rd.loc = f"gpu {g}", (g, -1, -1)
        sems = []
        for k, sem in enumerate(rd.objects(gj, "semaphores", required=False)):
            rd.where = f"gpu {g} semaphores[{k}]"
            sems.append(rd.get(sem, "init_value", int))
        tbs = []
        for t, tj in enumerate(rd.objects(gj, "threadblocks")):
            rd.where, rd.loc = f"gpu {g} tb {t}", (g, t, -1)
            tbs.append(self._tb(g, t, tj, base[g], len(sems)))
        sizes = self.chunks[g]
        return Gpu(g, sizes["i"], sizes["o"], sizes["s"], tuple(sems), tuple(tbs))

    def _tb(self, g: int, t: int, tj: dict[str, Any], base: int, n_sems: int) -> Tb:
        rd = self.rd
        if rd.get(tj, "id", int) != t:
            raise rd.bad(
                "structure", f"has id {tj['id']}; the executor files ops by position and channels by id"
            )
        channels: list[int] = []
        for ch in rd.objects(tj, "channels", required=False):
            kind = rd.get(ch, "channel_type", str)
            if kind not in _CHANNEL_TYPES:
                raise rd.fail(f"unknown channel_type '{kind}'")
            if kind != "memory":
                raise rd.unsupported(f"unsupported {kind} channel: this prover models memory channels only")
            for c in rd.ints(ch, "channel_ids"):
                if c >= len(self.channels[g]):
                    raise rd.bad(
                        "structure",
                        f"channel id {c} is not one of GPU {g}'s {len(self.channels[g])} memory channels",
                    )
                channels.append(base + c)
        buffers: list[int] = []
        for ref in rd.objects(tj, "remote_buffer_refs", required=False):
            kind = rd.get(ref, "access_channel_type", str)
            if kind not in _CHANNEL_TYPES:
                raise rd.fail(f"unknown access_channel_type '{kind}'")
            if kind != "memory":
                raise rd.unsupported(
                    f"unsupported {kind}-channel remote buffers: this prover models memory channels only"
                )
            for b in rd.ints(ref, "remote_buffer_ids"):
                if b >= len(self.remote[g]):
                    raise rd.bad(
                        "structure", f"remote buffer id {b} is not one of GPU {g}'s {len(self.remote[g])}"
                    )
                if not self.remote[g][b][2]:
                    raise rd.bad("structure", f"remote buffer {b} is not accessible over memory channels")
                buffers.append(b)
        if len(channels) > MAX_CHANNEL or len(buffers) > MAX_CHANNEL:
            raise rd.bad(
                "limit",
                f"has {len(channels)} memory channels and {len(buffers)} remote buffers; the executor's "
                "per-block "
                f"arrays hold {MAX_CHANNEL} (MAX_CHANNEL)",
            )
        ops_json = rd.objects(tj, "ops")
        if len(ops_json) > MAX_OPERATION:
            raise rd.bad(
                "limit",
                f"has {len(ops_json)} ops; the executor refuses more than {MAX_OPERATION} (MAX_OPERATION)",
            )
        ops = tuple(
            _OpReader(self, g, t, i, channels, buffers, n_sems).read(oj) for i, oj in enumerate(ops_json)
        )
        return Tb(g, t, ops)


class _OpReader:
    """Checks and resolves one op."""

    def __init__(
        self, res: _Resolver, g: int, t: int, i: int, channels: list[int], buffers: list[int], n_sems: int
    ) -> None:
        self.res, self.rd, self.g, self.t, self.i = res, res.rd, g, t, i
        self.channels, self.buffers, self.n_sems = channels, buffers, n_sems

    def read(self, oj: dict[str, Any]) -> Op:
        rd, g, t, i = self.rd, self.g, self.t, self.i
        rd.where, rd.loc = f"gpu {g} tb {t} op {i}", (g, t, i)
        name = rd.get(oj, "name", str)
        if name not in EXECUTOR_OPS:
            raise rd.fail(f"unknown op '{name}' (the executor throws 'Invalid operation type')")
        rd.where = f"gpu {g} tb {t} op {i} ({name})"
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
        if channel_type is not None and channel_type not in _CHANNEL_TYPES:
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
            where = rd.where
            rd.where = f"{where} {key}[{k}]"
            index, size = rd.count(bj, "index"), rd.count(bj, "size")
            if "buffer_id" in bj:
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
                if kind not in _BUFFERS:
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
            rd.where = where
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
            (src, "src_buff", _SHAPES[name][0]),
            (dst, "dst_buff", _SHAPES[name][1]),
        ):
            flags = "".join("R" if remote else "L" for _, remote in operands)
            if not re.fullmatch(pattern, flags):
                got = ", ".join("remote" if f == "R" else "local" for f in flags) or "nothing"
                raise rd.bad("structure", f"{key} must be {_SHAPE_WORDS[pattern]}, got {got}")
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
                "offsets "
                "(execution_kernel.hpp handleGet)"
            )
        if name not in ("put", "get") and any(r.size != refs_src[0].size for r in refs_src + refs_dst):
            raise rd.bad("structure", "mixes operand sizes; the kernel uses src_buff[0]'s size for all")
        return Op(name, self.i, src=refs_src, dst=refs_dst)
