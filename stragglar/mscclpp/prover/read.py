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
* The size fields are read with the executor's types
  (:func:`~stragglar.mscclpp.vocabulary.size_fields`), and a plan whose size window holds no size
  the executor takes (:func:`~stragglar.mscclpp.vocabulary.window_problem`) is refused: it is
  never run.

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

from typing import Any

from stragglar.errors import shown
from stragglar.mscclpp.document import PlanSource, plan_document
from stragglar.mscclpp.prover.ops import OpReader
from stragglar.mscclpp.prover.parsed import Gpu, Plan, Tb, Walker
from stragglar.mscclpp.vocabulary import (
    BUFFERS,
    CHANNEL_TYPES,
    MAX_CHANNEL,
    MAX_OPERATION,
    SizeFields,
    size_fields,
    window_problem,
)
from stragglar.schedule import MAX_CELLS, MAX_CHUNKS, MAX_RANKS

__all__ = ["MAX_LOCATIONS", "MAX_PROOF_BITS", "read_plan"]

MAX_LOCATIONS = 3 * MAX_CELLS  # input, output and scratch chunks of the largest schedule's plan
# The proof keeps, for every chunk of every buffer, the set of (GPU, input chunk) cells it sums, as
# one bit each: its memory grows as chunks x cells, 22 GB for a 54 KB plan that claimed 65,536
# chunks a buffer over 8 GPUs.  A plan over this product is refused before any set is made; the
# largest plan stragglar writes (192 GPUs) comes to 5.4e9 (its sets about 0.4 GB of the 2.6 GB
# its proof peaks at).
MAX_PROOF_BITS = 2**33
BUFFER_NAMES = {"i": "input", "o": "output", "s": "scratch"}


def read_plan(source: PlanSource) -> Plan:
    """Parse (:func:`~stragglar.mscclpp.document.plan_document`) and resolve a plan; see the module
    docstring for what is checked and what is refused."""
    obj = plan_document(source).root
    rd = Walker()
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
    fields = size_fields(obj)
    threads = rd.count(obj, "num_threads_per_block", 1024, required=False)
    if not 1 <= threads <= 1024:
        raise rd.bad(
            "limit", f"num_threads_per_block is {threads}; the kernel runs 1 to 1024 threads per block"
        )
    gpus_json = rd.objects(obj, "gpus")
    if len(gpus_json) > MAX_RANKS:
        raise rd.unsupported(f"{len(gpus_json):,} GPUs: stragglar proves plans of at most {MAX_RANKS:,}")
    if not gpus_json:
        raise rd.fail("'gpus' is empty")
    return Resolver(rd, gpus_json, inplace, threads).plan(name, collective, fields)


class Resolver:
    """Second pass: GPU headers, channel pairing, then thread blocks and ops."""

    def __init__(self, rd: Walker, gpus_json: list[dict[str, Any]], inplace: bool, threads: int) -> None:
        self.rd = rd
        self.gpus_json = gpus_json
        self.inplace = inplace
        self.threads = threads
        self.n = len(gpus_json)
        self.channels: list[list[int]] = []  # peer of each memory channel, per GPU
        self.remote: list[list[tuple[int, str, bool]]] = []  # (rank, type, memory access), per GPU
        self.chunks: list[dict[str, int]] = []
        self.locations = 0  # chunks in the buffers of the GPUs read so far

    def plan(self, name: str, collective: str, fields: SizeFields) -> Plan:
        rd = self.rd
        for g, gj in enumerate(self.gpus_json):
            rd.at(g)
            if rd.get(gj, "id", int) != g:
                raise rd.bad(
                    "structure", f"has id {gj['id']}; the executor takes gpus[rank] and needs id == rank"
                )
            sizes = {
                b: rd.count(gj, key)
                for b, key in zip(BUFFERS, ("input_chunks", "output_chunks", "scratch_chunks"), strict=False)
            }
            self._check_chunks(sizes)
            self.chunks.append(sizes)
            self.channels.append(self._gpu_channels(g, gj))
            self.remote.append(self._gpu_buffers(g, gj))
        cells = self.n * max(sizes["i"] for sizes in self.chunks)
        if self.locations * cells > MAX_PROOF_BITS:
            rd.at()
            raise rd.unsupported(
                f"{self.locations:,} chunks in the GPUs' buffers, each tracked over {cells:,} (GPU, input "
                f"chunk) cells: stragglar proves plans where the two multiply to at most {MAX_PROOF_BITS:,}"
            )
        first = self.chunks[0]
        for g, sizes in enumerate(self.chunks):
            rd.at(g)
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
        rd.at()
        alignment, low, high = fields.buffer_alignment, fields.min_message_size, fields.max_message_size
        window = window_problem(alignment, first["i"], low, high)
        if window is not None:
            raise rd.bad("structure", window)
        base, partner, owner = self._pair_channels()
        gpus = tuple(self._gpu(g, gj, base) for g, gj in enumerate(self.gpus_json))
        return Plan(name, collective, self.inplace, alignment, low, high, self.threads, gpus, partner, owner)

    def _check_chunks(self, sizes: dict[str, int]) -> None:
        """Bound the chunk counts before the prover makes a location of every chunk: a plan that
        claims 2**40 scratch chunks is refused here, not after it has filled the memory."""
        for buffer, count in sizes.items():
            if count > MAX_CHUNKS:
                raise self.rd.unsupported(
                    f"{count:,} {BUFFER_NAMES[buffer]} chunks: stragglar proves plans of at most "
                    f"{MAX_CHUNKS:,} per buffer"
                )
        self.locations += sum(sizes.values())
        if self.locations > MAX_LOCATIONS:
            raise self.rd.unsupported(
                f"{self.locations:,} chunks in the GPUs' buffers so far: stragglar proves plans of at most "
                f"{MAX_LOCATIONS:,} in all"
            )

    def _gpu_channels(self, g: int, gj: dict[str, Any]) -> list[int]:
        rd = self.rd
        peers: list[int] = []
        for k, ch in enumerate(rd.objects(gj, "channels")):
            rd.at(g, part=f"channels[{k}]")
            self._memory_channel(ch)
            for p in rd.ints(ch, "connected_to"):
                if p >= self.n or p == g:
                    raise rd.bad(
                        "structure", f"connects to rank {p}, not a peer of GPU {g} among {self.n} GPUs"
                    )
                peers.append(p)
        return peers

    def _memory_channel(self, ch: dict[str, Any]) -> None:
        """Refuse a channel of a type the executor has not, or of one this prover does not model."""
        kind = self.rd.get(ch, "channel_type", str)
        if kind not in CHANNEL_TYPES:
            raise self.rd.fail(f"unknown channel_type '{kind}'")
        if kind != "memory":
            raise self.rd.unsupported(f"unsupported {kind} channel: this prover models memory channels only")

    def _gpu_buffers(self, g: int, gj: dict[str, Any]) -> list[tuple[int, str, bool]]:
        rd = self.rd
        out: list[tuple[int, str, bool]] = []
        for k, rb in enumerate(rd.objects(gj, "remote_buffers")):
            rd.at(g, part=f"remote_buffers[{k}]")
            rank = rd.count(rb, "rank")
            kind = rd.get(rb, "type", str)
            access = rd.get(rb, "access_channel_types", list)
            if kind not in BUFFERS:
                raise rd.fail(f"unknown buffer type '{kind}'")
            if not all(isinstance(a, str) and a in CHANNEL_TYPES for a in access):
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
        rd.at(g)
        sems = []
        for k, sem in enumerate(rd.objects(gj, "semaphores", required=False)):
            rd.at(g, part=f"semaphores[{k}]")
            init: int = rd.get(sem, "init_value", int)
            if not -(1 << 31) <= init < 1 << 31:  # the executor's SemaphoreInfo::initValue is an int
                raise rd.fail(f"'init_value' must fit a 32-bit int, got {shown(init, 40)}")
            sems.append(init)
        tbs = []
        for t, tj in enumerate(rd.objects(gj, "threadblocks")):
            rd.at(g, t)
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
        for ch in rd.objects(tj, "channels"):
            self._memory_channel(ch)
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
            if kind not in CHANNEL_TYPES:
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
        reader = OpReader(self, g, t, channels, buffers, n_sems)
        ops = tuple(reader.read(i, oj) for i, oj in enumerate(ops_json))
        return Tb(g, t, ops)
