"""Lowering stage 2: cut the rounds into thread blocks that fit the executor, and write their ops.

Every GPU runs its rounds as one sequential program, cut into *segments* of consecutive rounds.
The cuts are the same on every GPU, so a segment of GPU ``g`` talks only to the same segment of
its peers and one memory-channel connection per (pair, segment) suffices.  A segment becomes one
thread block per GPU that has work in it (idle GPUs get none); the blocks of a GPU run one after
the other, chained by device semaphores (``sem_release`` at the end of one, ``sem_acquire`` at the
start of the next), so the whole GPU program stays sequential.  Cuts are placed greedily, as late
as the executor's per-thread-block limits allow on every GPU: 64 ops (``MAX_OPERATION``), 16 memory
channels and 16 remote buffers (``MAX_CHANNEL``), 8 channels per op
(:mod:`stragglar.mscclpp.vocabulary`).

Inside a block, ``nop`` (``__syncthreads``) is inserted where the kernel needs it, because the
executor runs data ops on all threads and signal/wait on thread 0 with nothing in between: before
a signal or release that follows data ops (the data must be complete before the peer hears of it),
after a wait or acquire before the next data op (the other threads must not start early), and
between two data ops of the block that touch overlapping local chunks, one of them writing.

Readiness.  A peer that writes into ``d``'s scratch must know that ``d`` has started this
execution: ``d`` may still be reading the same slots for the previous execution, and a straggler's
kernel starts late.  So ``d`` *signals ready* to every writer as the very first op of the block that
holds their connection (before any wait, so it cannot deadlock), and the writer *waits* for it
before its first use of that connection in the segment of its first put into ``d``.  After that
every later put of the writer is ordered behind this wait by its own program order.

The per-round order (all puts and signals of a round before any of its waits) and the unconditional
ready signals make the plan deadlock-free; :mod:`stragglar.mscclpp.prover` re-proves every plan from
its JSON text independently of this argument.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from stragglar.mscclpp.lowering.rounds import Programs, RoundWork
from stragglar.mscclpp.vocabulary import MAX_CHANNEL, MAX_CHANNEL_PER_OPERATION, MAX_OPERATION

__all__ = [
    "Block",
    "BlockOp",
    "Operand",
    "cut_segments",
    "place_blocks",
]


LOCAL = -1
Operand = tuple[int, str, int, int]  # (owner: LOCAL or the peer's rank, buffer "i"/"s", first chunk, count)


class BlockError(ValueError):
    """A round that cannot fit in one thread block."""


@dataclass(frozen=True, slots=True)
class BlockOp:
    """One op of a thread block, with peers instead of channel indices (assigned in stage 3).

    ``peers`` are the connections a ``signal``/``wait`` uses; ``link`` numbers the chain
    semaphore of a ``sem_acquire``/``sem_release``; operands of a ``put`` destination are remote.
    """

    name: str
    peers: tuple[int, ...] = ()
    src: tuple[Operand, ...] = ()
    dst: tuple[Operand, ...] = ()
    link: int = -1


@dataclass(frozen=True, slots=True)
class Block:
    """The thread block of ``gpu`` for one segment: its ops and the resources they name."""

    gpu: int
    segment: int
    ops: tuple[BlockOp, ...]
    peers: tuple[int, ...]
    put_peers: tuple[int, ...]


_Access = tuple[str, int, int, bool]  # (buffer, first, count, writes)


class _Emitter:
    """Appends ops to one thread block, inserting a ``nop`` exactly where the kernel needs one."""

    def __init__(self) -> None:
        self.ops: list[BlockOp] = []
        self._dirty: list[_Access] = []
        self._waited = False

    def nop(self) -> None:
        self.ops.append(BlockOp("nop"))
        self._dirty = []
        self._waited = False

    def data(self, op: BlockOp, accesses: list[_Access]) -> None:
        clash = any(
            buf == b and first < f + c and f < first + count and (writes or w)
            for buf, first, count, writes in accesses
            for b, f, c, w in self._dirty
        )
        if self._waited or clash:
            self.nop()
        self.ops.append(op)
        self._dirty.extend(accesses)

    def release(self, op: BlockOp) -> None:
        """A signal or sem_release: everything before it must be complete."""
        if self._dirty:
            self.nop()
        self.ops.append(op)

    def restore_state(self, other: _Emitter) -> None:
        """Continue after ``other``'s last op (same pending accesses and wait flag)."""
        self._dirty = list(other._dirty)
        self._waited = other._waited

    def acquire(self, op: BlockOp) -> None:
        """A wait or sem_acquire: data ops after it must not start before it returns."""
        self.ops.append(op)
        self._waited = True


def _round_ops(em: _Emitter, work: RoundWork, ready_pending: set[int]) -> None:
    """All sends of the round (ready wait, puts, one signal per peer), then all receives."""

    def use(peer: int) -> None:
        if peer in ready_pending:
            ready_pending.discard(peer)
            em.acquire(BlockOp("wait", peers=(peer,)))

    for peer in sorted({run.peer for run in work.sends}):
        use(peer)
        for run in (x for x in work.sends if x.peer == peer):
            put = BlockOp(
                "put", src=((LOCAL, "i", run.chunk, run.count),), dst=((peer, "s", run.slot, run.count),)
            )
            em.data(put, [("i", run.chunk, run.count, False)])
        em.release(BlockOp("signal", peers=(peer,)))
    for peer in sorted({run.peer for run in work.receives}):
        use(peer)
        em.acquire(BlockOp("wait", peers=(peer,)))
        for run in (x for x in work.receives if x.peer == peer):
            mine, slot = (LOCAL, "i", run.chunk, run.count), (LOCAL, "s", run.slot, run.count)
            accesses = [("i", run.chunk, run.count, True), ("s", run.slot, run.count, False)]
            if run.reduce:
                em.data(BlockOp("re", src=(mine, slot), dst=(mine,)), accesses)
            else:
                em.data(BlockOp("copy", src=(slot,), dst=(mine,)), accesses)


@dataclass(frozen=True, slots=True)
class _Saved:
    """A block's state before a trial round (see :meth:`_Segment.save`)."""

    last_round: int
    ready: list[int]
    ready_pending: set[int]
    peers: set[int]
    put_peers: set[int]
    waited: set[int]
    n_ops: int
    dirty: list[_Access]
    waited_since_nop: bool


@dataclass
class _Segment:
    """One GPU's block under construction (rounds ``first_round`` to ``last_round`` - 1 so far)."""

    gpu: int
    first_round: int
    last_round: int
    has_prev: bool
    ready: list[int]
    ready_pending: set[int]
    body: _Emitter
    peers: set[int]
    put_peers: set[int]
    waited: set[int] = field(default_factory=set)

    def save(self) -> _Saved:
        """Everything a trial round may change, to take the round back."""
        em = self.body
        return _Saved(
            self.last_round,
            list(self.ready),
            set(self.ready_pending),
            set(self.peers),
            set(self.put_peers),
            set(self.waited),
            len(em.ops),
            list(em._dirty),
            em._waited,
        )

    def restore(self, saved: _Saved) -> None:
        self.last_round = saved.last_round
        self.ready = saved.ready
        self.ready_pending = saved.ready_pending
        self.peers = saved.peers
        self.put_peers = saved.put_peers
        self.waited = saved.waited
        del self.body.ops[saved.n_ops :]
        self.body._dirty = saved.dirty
        self.body._waited = saved.waited_since_nop

    def ops_needed(self, has_next: bool) -> int:
        ready_ops = -(-len(self.ready) // MAX_CHANNEL_PER_OPERATION)
        return ready_ops + int(self.has_prev) + len(self.body.ops) + (2 if has_next else 0)

    def fits(self) -> bool:
        return (
            self.ops_needed(has_next=True) <= MAX_OPERATION
            and len(self.peers) <= MAX_CHANNEL
            and len(self.put_peers) <= MAX_CHANNEL
        )


class _Layout:
    """Facts about the programs that every segment needs, computed once."""

    def __init__(self, programs: Programs) -> None:
        self.programs = programs
        self.first_active = [
            next((r for r, w in enumerate(p.rounds) if w is not None), programs.num_rounds)
            for p in programs.gpus
        ]
        self.first_writes: list[list[tuple[int, int]]] = [[] for _ in range(programs.num_rounds)]
        for (s, d), r in sorted(programs.first_write.items()):
            self.first_writes[r].append((s, d))

    def build(self, gpu: int, first: int, last: int) -> _Segment:
        """The block of ``gpu`` for rounds ``first`` to ``last`` - 1, built from scratch."""
        writes = [sd for r in range(first, last) for sd in self.first_writes[r]]
        ready = sorted(s for s, d in writes if d == gpu)
        pending = {d for s, d in writes if s == gpu}
        seg = _Segment(
            gpu, first, first, self.first_active[gpu] < first, ready, pending, _Emitter(), set(ready), set()
        )
        if seg.has_prev:
            seg.body.acquire(BlockOp("sem_acquire", link=0))
        for r in range(first, last):
            self._append(seg, r)
        return seg

    def extend(self, seg: _Segment, r: int) -> _Segment:
        """Add the next round ``r``; rebuild when it holds a first put on a connection already waited on.

        The ready wait must be the block's first wait on that connection, so it cannot be
        appended after an earlier wait: that rare case is rebuilt knowing the new segment end.
        """
        if r < seg.last_round or any(self.programs.gpus[seg.gpu].rounds[x] for x in range(seg.last_round, r)):
            raise AssertionError("rounds must be added in order")
        writes = self.first_writes[r]
        targets = {d for s, d in writes if s == seg.gpu}
        if targets & seg.waited:
            return self.build(seg.gpu, seg.first_round, r + 1)
        for s, d in writes:
            if d == seg.gpu and s not in seg.ready:
                bisect.insort(seg.ready, s)
                seg.peers.add(s)
        seg.ready_pending |= targets
        self._append(seg, r)
        return seg

    def _append(self, seg: _Segment, r: int) -> None:
        work = self.programs.gpus[seg.gpu].rounds[r]
        seg.last_round = r + 1
        if work is not None:
            _round_ops(seg.body, work, seg.ready_pending)
            seg.peers.update(run.peer for run in work.sends + work.receives)
            seg.put_peers.update(run.peer for run in work.sends)
            seg.waited.update(run.peer for run in work.receives)


@dataclass(frozen=True)
class Segmentation:
    """The global cuts (``rounds[k]`` is segment k) and, per segment, the blocks built for it."""

    rounds: tuple[range, ...]
    built: tuple[dict[int, _Segment], ...]


def cut_segments(programs: Programs) -> Segmentation:
    """Greedy global cuts: each segment takes rounds while every GPU's block still fits the limits.

    A round is tried on every active GPU's block; if one no longer fits, the round is taken back
    everywhere and starts the next segment.  Raises :class:`BlockError` when a single round of
    one GPU does not fit in a thread block.
    """
    layout = _Layout(programs)
    cuts: list[range] = []
    built: list[dict[int, _Segment]] = []
    start = 0
    segs: dict[int, _Segment] = {}
    for r in range(programs.num_rounds):
        active = [g for g in range(programs.num_gpus) if programs.gpus[g].rounds[r] is not None]
        saved = {g: segs[g].save() for g in active if g in segs}
        trial = {g: layout.extend(segs[g], r) if g in segs else layout.build(g, start, r + 1) for g in active}
        if all(seg.fits() for seg in trial.values()):
            segs.update(trial)
            continue
        for g, state in saved.items():
            segs[g].restore(state)
        if start < r:
            cuts.append(range(start, r))
            built.append(segs)
        start = r
        segs = {g: layout.build(g, r, r + 1) for g in active}
        bad = [g for g, seg in segs.items() if not seg.fits()]
        if bad:
            raise BlockError(
                f"round {r} of GPU {bad[0]} needs more than {MAX_OPERATION} ops, "
                f"{MAX_CHANNEL} channels or {MAX_CHANNEL} remote buffers in one thread "
                "block; send fewer, longer runs of consecutive chunks per round"
            )
    if start < programs.num_rounds:
        cuts.append(range(start, programs.num_rounds))
        built.append(segs)
    return Segmentation(tuple(cuts), tuple(built))


def place_blocks(segmentation: Segmentation, num_gpus: int) -> tuple[tuple[Block, ...], ...]:
    """Every GPU's thread blocks, in execution order, with ready signals, nops and chain semaphores.

    ``link`` of a chain semaphore is the index of the releasing block among the GPU's blocks.
    """
    result: list[tuple[Block, ...]] = []
    for g in range(num_gpus):
        segments = [k for k, segs in enumerate(segmentation.built) if g in segs]
        blocks: list[Block] = []
        for pos, k in enumerate(segments):
            seg = segmentation.built[k][g]
            head = [
                BlockOp("signal", peers=tuple(seg.ready[i : i + MAX_CHANNEL_PER_OPERATION]))
                for i in range(0, len(seg.ready), MAX_CHANNEL_PER_OPERATION)
            ]
            body = _Emitter()
            body.ops = [
                BlockOp(op.name, link=pos - 1) if op.name == "sem_acquire" else op for op in seg.body.ops
            ]
            body.restore_state(seg.body)
            if pos + 1 < len(segments):
                body.release(BlockOp("sem_release", link=pos))
            blocks.append(
                Block(g, k, tuple(head + body.ops), tuple(sorted(seg.peers)), tuple(sorted(seg.put_peers)))
            )
        result.append(tuple(blocks))
    return tuple(result)
