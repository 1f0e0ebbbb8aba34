"""Lowering stage 2: thread blocks and channels for every piece; stage 4: number the thread blocks.

Every (sender, receiver) pair of an instance is one FIFO: a thread block (TB) on the sender with
its ``s`` steps and one on the receiver with its ``r`` (copy) or ``rrc`` (reduce; the local operand
in srcbuf/srcoff) steps, in (round, chunk) order on both sides, so the k-th send meets the k-th
receive.  A FIFO whose TBs would pass the step limit continues in a new TB pair on another
channel from the item the caller names in ``splits``; channels are chosen so that a rank has one
TB per (channel, peer, direction) and at most 32 sending (receiving) TBs a channel.

The output is the list of operations in issue order (a round's sends, then its receives, then
the final copies back from scratch), each with the chunk locations it reads and writes: stage 3
(:mod:`stragglar.msccl.lowering.dependencies`) orders them within each GPU.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from stragglar.msccl.errors import MscclExportError
from stragglar.msccl.lowering.rounds import Piece
from stragglar.msccl.vocabulary import (
    MAX_CHANNELS,
    MAX_COUNT,
    MAX_DEPENDENCY_TB,
    MAX_NODES,
    MAX_TBS,
    MAX_TBS_PER_CHANNEL,
    Operands,
)

__all__ = ["Assignment", "Fifo", "Loc", "Operation", "ThreadBlock", "assign", "check_growing", "number"]

Loc = tuple[int, str, int]  # (gpu, buffer, offset)
Fifo = tuple[int, int, int]  # (instance, sender, receiver)


@dataclass(eq=False)
class ThreadBlock:
    """A TB: its GPU, peers (-1 for none), channel and creation order (the tie-breaker of stage 4)."""

    gpu: int
    send: int
    recv: int
    chan: int
    order: int

    @property
    def kind(self) -> int:
        """Sending TBs first, then receiving ones, then local ones."""
        return 0 if self.send >= 0 else 1 if self.recv >= 0 else 2


@dataclass(frozen=True)
class Operation:
    """One step to place: on ``tb``, or (copies back from scratch) on a local TB of ``gpu``.

    ``item`` is the FIFO item a send or receive carries, so that the step limit can be checked
    per FIFO item after stage 3.
    """

    tb: ThreadBlock | None
    gpu: int
    operands: Operands
    reads: tuple[Loc, ...]
    writes: tuple[Loc, ...]
    item: tuple[Fifo, int] | None = None


@dataclass
class Assignment:
    """Stage 2's result: the TBs made so far, the operations in issue order, channels, scratch sizes."""

    tbs: list[ThreadBlock]
    operations: list[Operation]
    nchannels: int
    scratch: list[int]  # per GPU: scratch chunks used


@dataclass
class _FifoState:
    """A FIFO's TB pairs, one per segment (first item, send TB, recv TB), and its items so far."""

    segments: list[tuple[int, ThreadBlock, ThreadBlock]] = field(default_factory=list)
    sent: int = 0
    received: int = 0


class _Assigner:
    def __init__(self, num_ranks: int, num_chunks: int, splits: dict[Fifo, set[int]]) -> None:
        self.c = num_chunks
        self.splits = splits
        self.fifos: defaultdict[Fifo, _FifoState] = defaultdict(_FifoState)
        self.peers: defaultdict[tuple[int, int, str], set[int]] = defaultdict(set)  # (gpu, chan, dir)
        self.result = Assignment([], [], 1, [0] * num_ranks)

    def send(self, j: int, p: Piece) -> None:
        fifo = (j, p.src, p.dst)
        state = self.fifos[fifo]
        item = state.sent
        state.sent += 1
        if item == 0 or item in self.splits.get(fifo, ()):
            chan = self._channel(p.src, p.dst)
            state.segments.append((item, self._tb(p.src, p.dst, -1, chan), self._tb(p.dst, -1, p.src, chan)))
        off = j * self.c + p.chunk
        reads = tuple((p.src, p.srcbuf, off + k) for k in range(p.cnt))
        tb = state.segments[-1][1]
        op = Operation(tb, p.src, Operands("s", p.srcbuf, off, p.srcbuf, off, p.cnt), reads, (), (fifo, item))
        self.result.operations.append(op)

    def receive(self, j: int, p: Piece) -> None:
        fifo = (j, p.src, p.dst)
        state = self.fifos[fifo]
        item = state.received
        state.received += 1
        tb = next(recv_tb for first, _, recv_tb in reversed(state.segments) if first <= item)
        off = j * self.c + p.chunk
        writes = tuple((p.dst, p.dstbuf, off + k) for k in range(p.cnt))
        if p.reduce:
            kind, src = "rrc", p.localbuf
            reads = tuple((p.dst, p.localbuf, off + k) for k in range(p.cnt))
        else:
            kind, src, reads = "r", p.dstbuf, ()
        if p.dstbuf == "s":
            self.result.scratch[p.dst] = max(self.result.scratch[p.dst], off + p.cnt)
        operands = Operands(kind, src, off, p.dstbuf, off, p.cnt)
        self.result.operations.append(Operation(tb, p.dst, operands, reads, writes, (fifo, item)))

    def copy_back(self, back: Sequence[tuple[int, int]]) -> None:
        """Copy chunks whose final value is in scratch back to ``i``, merging consecutive offsets."""
        runs: list[tuple[int, int, int]] = []
        for g, off in back:
            if runs and runs[-1][0] == g and sum(runs[-1][1:]) == off and runs[-1][2] < MAX_COUNT - 1:
                runs[-1] = (g, runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((g, off, 1))
        for g, off, cnt in runs:
            reads = tuple((g, "s", off + k) for k in range(cnt))
            writes = tuple((g, "i", off + k) for k in range(cnt))
            operands = Operands("cpy", "s", off, "i", off, cnt)
            self.result.operations.append(Operation(None, g, operands, reads, writes))

    def _channel(self, src: int, dst: int) -> int:
        chan = 0
        while True:
            out, into = self.peers[src, chan, "send"], self.peers[dst, chan, "recv"]
            if dst not in out and src not in into and max(len(out), len(into)) < MAX_TBS_PER_CHANNEL:
                out.add(dst)
                into.add(src)
                self.result.nchannels = max(self.result.nchannels, chan + 1)
                return chan
            chan += 1

    def _tb(self, gpu: int, send: int, recv: int, chan: int) -> ThreadBlock:
        tb = ThreadBlock(gpu, send, recv, chan, len(self.result.tbs))
        self.result.tbs.append(tb)
        return tb


def assign(
    rounds: Sequence[tuple[int, Sequence[Piece]]],
    back: Sequence[tuple[int, int]],
    num_ranks: int,
    num_chunks: int,
    splits: dict[Fifo, set[int]],
) -> Assignment:
    """Place every piece of ``rounds`` (from stage 1) on a TB pair, then the copies ``back``."""
    assigner = _Assigner(num_ranks, num_chunks, splits)
    for j, pieces in rounds:
        for p in pieces:
            assigner.send(j, p)
        for p in pieces:
            assigner.receive(j, p)
    assigner.copy_back(back)
    return assigner.result


def number(
    tbs: Sequence[ThreadBlock],
    targets: set[ThreadBlock],
    steps: dict[ThreadBlock, int],
    num_ranks: int,
    nchannels: int,
) -> list[list[ThreadBlock]]:
    """Each GPU's TBs in id order (a TB's id is its index there), dependency targets first, after
    checking the remaining limits.

    ``targets`` are the TBs others wait on: their ids must fit the executor's int8 ``depid``.
    """
    if nchannels > MAX_CHANNELS:
        raise MscclExportError(_too_many_channels(str(nchannels)))
    by_gpu: list[list[ThreadBlock]] = [[] for _ in range(num_ranks)]
    for tb in tbs:
        by_gpu[tb.gpu].append(tb)
    for g, on_gpu in enumerate(by_gpu):
        mine = sorted(
            on_gpu,
            key=lambda tb: (tb not in targets, tb.chan, tb.kind, tb.send, tb.recv, tb.order),
        )
        waited_on = sum(tb in targets for tb in mine)
        if waited_on > MAX_DEPENDENCY_TB + 1:
            raise MscclExportError(
                f"gpu {g} needs {waited_on} thread blocks that others wait on, but dependency targets "
                f"must have ids <= {MAX_DEPENDENCY_TB}: use fewer instances or a smaller N"
            )
        if len(mine) > MAX_TBS:
            raise MscclExportError(_too_many_tbs(g, str(len(mine))))
        nodes = 1 + num_ranks + len(mine) + sum(steps[tb] for tb in mine)
        if nodes >= MAX_NODES:
            raise MscclExportError(_too_many_nodes(g, str(nodes)))
        by_gpu[g] = mine
    return by_gpu


def check_growing(assignment: Assignment, num_ranks: int) -> None:
    """Refuse an ``assignment`` past a limit that the rest of the lowering can only bring it nearer.

    Stage 3 sends a FIFO back here split, a TB pair more, while a TB passes the step limit, and each
    pass takes seconds at thousands of chunks (StragglAR over 4 GPUs with 4096 chunks: 100 s of passes
    before its channels were counted at the end).  These lower bounds never fall as FIFOs split, so
    one past its limit on any pass is past it in the file:

    - a GPU's TBs: a split adds TBs and removes none (stage 3's local TBs come on top);
    - its XML elements: the algo, its gpus, its TBs and at least one step per operation on the GPU
      (stage 3's nops come on top);
    - channels: a (sender, receiver) pair has one TB per channel, so as many channels as TB pairs;
      and a channel carries at most 32 of a GPU's sending (receiving) TBs.
    """
    tbs: defaultdict[int, int] = defaultdict(int)
    pairs: defaultdict[tuple[int, int], int] = defaultdict(int)
    ways: defaultdict[tuple[int, int], int] = defaultdict(int)  # (gpu, sending 0 / receiving 1): TBs
    for tb in assignment.tbs:
        tbs[tb.gpu] += 1
        if tb.send >= 0:
            pairs[tb.gpu, tb.send] += 1
        ways[tb.gpu, tb.kind] += 1
    operations: defaultdict[int, int] = defaultdict(int)
    for op in assignment.operations:
        operations[op.gpu] += 1
    for g in range(num_ranks):
        if tbs[g] > MAX_TBS:
            raise MscclExportError(_too_many_tbs(g, f"at least {tbs[g]}"))
        nodes = 1 + num_ranks + tbs[g] + operations[g]
        if nodes >= MAX_NODES:
            raise MscclExportError(_too_many_nodes(g, f"at least {nodes}"))
    per_channel = -(-max(ways.values(), default=0) // MAX_TBS_PER_CHANNEL)
    channels = max(max(pairs.values(), default=0), per_channel)
    if channels > MAX_CHANNELS:
        raise MscclExportError(_too_many_channels(f"at least {channels}"))


def _too_many_channels(count: str) -> str:
    return f"needs {count} channels, the executor allows {MAX_CHANNELS}: use fewer instances or a smaller N"


def _too_many_tbs(g: int, count: str) -> str:
    return (
        f"gpu {g} needs {count} thread blocks, the executor allows {MAX_TBS}: use fewer instances or a "
        "smaller N"
    )


def _too_many_nodes(g: int, count: str) -> str:
    return (
        f"gpu {g}'s part of the file has {count} XML elements (algo, gpus, its tbs and steps), the "
        f"executor's parser holds {MAX_NODES - 1}: use fewer instances or a smaller N"
    )
