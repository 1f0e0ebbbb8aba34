"""Export a schedule as MSCCL XML: one in-place AllReduce ``<algo>`` for NCCL's MSCCL executor.

The same file loads on the Azure executor, the older microsoft/msccl runtime and RCCL: every
attribute is written (``name``, ``outofplace``, ``minBytes``, an explicit large ``maxBytes``), in
the text shape their tokenizer needs (no declaration, no tabs, double quotes, one line per element).

Lowering.  Instance ``j`` of ``instances`` runs the whole schedule on chunks ``j*C .. j*C+C-1``.
Every (sender, receiver) pair of an instance is one FIFO: a thread block (TB) on the sender with
its ``s`` steps and one on the receiver with its ``r`` (copy) or ``rrc`` (reduce; the local operand
in srcbuf/srcoff) steps, in (round, chunk) order on both sides, so the k-th send meets the k-th
receive.  Transfers of consecutive chunks in one round become one step (``cnt`` > 1).  A FIFO whose
TBs would pass 64 steps continues in a new TB pair on another channel; channels are chosen so that
a rank has one TB per (channel, peer, direction) and at most 32 sending (receiving) TBs a channel.

Synchronous rounds read the state at the start of the round.  Every chunk access is tracked, and a
step that touches a chunk written or read by another TB of its rank waits for it: a dependency
(``depid``/``deps``, ``nop`` steps for several, ``hasdep`` on the target), skipped when already
implied through other dependencies.  A rank that sends chunk c and receives chunk c in one round
(the straggler exchange) thus does ``s`` and then, in another TB, ``rrc`` in place once the send
has read the chunk.  If either transfer is part of a multi-chunk step, the receive goes to the
scratch copy of the chunk instead (``s`` buffer, same offset) and later steps use that copy; a
local TB copies such chunks back to ``i`` at the end.

No deadlock, for any FIFO capacity >= 1.  Give each send its (instance, round, chunk, 0) and each
receive its (instance, round, chunk, 1).  Every wait goes to a smaller key: a receive waits for its
send; a send waits for room, freed by the receive of an earlier item of its FIFO; dependencies
point to earlier rounds, or, in-round, from a one-chunk receive of chunk c to the one-chunk send of
chunk c; the final copies wait for everything and nothing waits for them.  TB programs are sorted
by key, so in any stuck state the TB blocked at the smallest key would wait for a smaller one.
``stragglar.verify.msccl`` re-proves the written file, independently of this argument.

>>> from stragglar.synth import synthesize
>>> xml = to_msccl_xml(synthesize("stragglar", 4))
>>> xml.splitlines()[0][:72]
'<algo name="stragglar-n4-s3-simple" proto="Simple" nchannels="1" nchunks'
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stragglar.schedule import Op, Schedule, Transfer
from stragglar.verify.simulate import check

__all__ = [
    "DEFAULT_MAX_BYTES",
    "PROTOCOLS",
    "MscclExportError",
    "default_name",
    "to_msccl_xml",
    "write_msccl",
]

PROTOCOLS = ("Simple", "LL", "LL128")
DEFAULT_MAX_BYTES = 1 << 40
MAX_STEPS = 64  # MSCCL_MAX_NUM_STEPS of a default build: steps per TB, nops included
MAX_COUNT = 72  # MSCCL_MAX_COUNT: cnt must stay below it
MAX_DEPENDENCY_TB = 127  # dependentBid is an int8
MAX_CHANNELS = 32  # MAXCHANNELS
MAX_TBS_PER_CHANNEL = 32  # sending (receiving) TBs per channel and rank
MAX_TBS = 1024  # MSCCL_MAX_NUM_THREAD_BLOCKS
MAX_NODES = 4096  # XML elements the parser keeps for one rank: algo, gpus, its tbs and steps
MAX_OFFSET = 32767  # offsets are int16
_NAME = re.compile(r"[A-Za-z0-9_.:+-]{1,128}")

Loc = tuple[int, str, int]  # (gpu, buffer, offset)
Fifo = tuple[int, int, int]  # (instance, sender, receiver)


class MscclExportError(ValueError):
    """A schedule or option the executor cannot take; the one-line message names the limit and the fix."""


@dataclass
class _Step:
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    dep: tuple[_TB, int] | None = None
    hasdep: bool = False


@dataclass(eq=False)
class _TB:
    """A thread block under construction; ``known`` is what happens before its next step."""

    gpu: int
    send: int
    recv: int
    chan: int
    order: int
    steps: list[_Step] = field(default_factory=list)
    known: dict[_TB, int] = field(default_factory=dict)
    known_at: dict[int, dict[_TB, int]] = field(default_factory=dict)
    items: list[tuple[int, Fifo, int]] = field(default_factory=list)  # (position, fifo, item)
    id: int = -1


@dataclass
class _FifoState:
    """A FIFO's TB pairs, one per segment (first item, send TB, recv TB), and its items so far."""

    segments: list[tuple[int, _TB, _TB]] = field(default_factory=list)
    sent: int = 0
    received: int = 0


@dataclass(frozen=True)
class _Piece:
    """One step's worth of a round: ``cnt`` consecutive chunks on one FIFO, with their buffers."""

    src: int
    dst: int
    chunk: int
    cnt: int
    reduce: bool
    srcbuf: str
    localbuf: str
    dstbuf: str


def default_name(schedule: Schedule, proto: str = "Simple", instances: int = 1) -> str:
    """``stragglar-n8-s7-simple`` style: algorithm, GPUs, straggler, protocol, instances if > 1."""
    straggler = "" if schedule.straggler is None else f"-s{schedule.straggler}"
    more = f"-x{instances}" if instances > 1 else ""
    return f"{schedule.algorithm}-n{schedule.num_ranks}{straggler}-{proto.lower()}{more}"


def to_msccl_xml(
    schedule: Schedule,
    *,
    name: str | None = None,
    proto: str = "Simple",
    instances: int = 1,
    min_bytes: int = 0,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> str:
    """The MSCCL XML text of ``schedule``: deterministic, ends with a newline.

    Raises :class:`MscclExportError` for a bad option, a schedule that is not a correct
    AllReduce, or one that does not fit the executor's limits.
    """
    name = default_name(schedule, proto, instances) if name is None else name
    _check_options(name, proto, instances, min_bytes, max_bytes)
    violation = check(schedule)
    if violation is not None:
        raise MscclExportError(f"not a correct allreduce, nothing exported: {violation.message}")
    if schedule.num_chunks * instances > MAX_OFFSET:
        raise MscclExportError(
            f"{schedule.num_chunks * instances} chunks per loop exceed the executor's int16 offsets "
            f"({MAX_OFFSET}): use fewer instances"
        )
    builder = _lower(schedule, instances)
    header = (
        f'<algo name="{name}" proto="{proto}" nchannels="{builder.nchannels}" '
        f'nchunksperloop="{schedule.num_chunks * instances}" ngpus="{schedule.num_ranks}" '
        f'coll="allreduce" inplace="1" outofplace="0" minBytes="{min_bytes}" maxBytes="{max_bytes}">'
    )
    return "\n".join([header, *builder.render(schedule.num_chunks * instances), "</algo>"]) + "\n"


def write_msccl(
    schedule: Schedule,
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    proto: str = "Simple",
    instances: int = 1,
    min_bytes: int = 0,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> None:
    """Write :func:`to_msccl_xml` of ``schedule`` (same options) to the file ``path``."""
    text = to_msccl_xml(
        schedule, name=name, proto=proto, instances=instances, min_bytes=min_bytes, max_bytes=max_bytes
    )
    Path(path).write_text(text, encoding="utf-8")


def _check_options(name: str, proto: str, instances: int, min_bytes: int, max_bytes: int) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise MscclExportError(f"name {name!r}: use 1-128 characters from A-Z a-z 0-9 _ . : + -")
    if proto not in PROTOCOLS:
        raise MscclExportError(f"proto {proto!r}: choose from {', '.join(PROTOCOLS)}")
    if type(instances) is not int or instances < 1:
        raise MscclExportError(f"instances must be an integer >= 1, got {instances!r}")
    for label, value in (("min_bytes", min_bytes), ("max_bytes", max_bytes)):
        if type(value) is not int or not 0 <= value < 1 << 63:
            raise MscclExportError(f"{label} must be an integer in [0, 2**63), got {value!r}")
    if max_bytes and max_bytes < min_bytes:
        raise MscclExportError(f"max_bytes {max_bytes} < min_bytes {min_bytes}: never selected")


def _lower(schedule: Schedule, instances: int) -> _Builder:
    """Build until no TB passes the step limit, splitting the FIFOs of the TBs that did."""
    splits: defaultdict[Fifo, set[int]] = defaultdict(set)
    while True:
        builder = _Builder(schedule.num_ranks, splits)
        builder.run(schedule, instances)
        over = builder.overflows()
        if not over:
            builder.finish()
            return builder
        for fifo, item in over:
            if item == 0 or item in splits[fifo]:
                raise MscclExportError(
                    f"one step needs more than {MAX_STEPS} step slots (nops for its dependencies): "
                    "the schedule is too dense for the executor"
                )
            splits[fifo].add(item)


def _rounds(schedule: Schedule) -> Iterator[tuple[Transfer, ...]]:
    for phase in schedule.phases:
        yield from phase.rounds


def _runs(rnd: tuple[Transfer, ...]) -> list[list[Transfer]]:
    """The round's transfers per FIFO in chunk order, cut into runs of consecutive chunks and one op."""
    runs: list[list[Transfer]] = []
    for t in sorted(rnd, key=lambda t: (t.src, t.dst, t.chunk)):
        last = runs[-1][-1] if runs else None
        if last is not None and (last.src, last.dst, last.chunk + 1, last.op) == (
            t.src,
            t.dst,
            t.chunk,
            t.op,
        ):
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs


def _pieces(rnd: tuple[Transfer, ...], loc: dict[tuple[int, int], str]) -> list[_Piece]:
    """Split a round into steps: runs of consecutive chunks per FIFO, with uniform buffers.

    A rank receiving a chunk it also sends this round writes the chunk's other copy (``s`` for
    ``i`` and back) when either transfer is in a multi-chunk run; otherwise the in-place receive
    waits for the send through a dependency.
    """
    runs = _runs(rnd)
    sent: defaultdict[int, set[int]] = defaultdict(set)
    for t in rnd:
        sent[t.src].add(t.chunk)
    hazard = {(t.dst, t.chunk) for t in rnd if t.chunk in sent[t.dst]}
    multi = {r for run in runs if len(run) > 1 for t in run for r in (t.src, t.dst) if (r, t.chunk) in hazard}
    pieces: list[_Piece] = []
    for run in runs:
        for t in run:
            local = loc.get((t.dst, t.chunk), "i")
            dst = ("s" if local == "i" else "i") if t.dst in multi and (t.dst, t.chunk) in hazard else local
            src = loc.get((t.src, t.chunk), "i")
            piece = _Piece(t.src, t.dst, t.chunk, 1, t.op is Op.REDUCE, src, local, dst)
            last = pieces[-1] if pieces else None
            if last is not None and last.cnt < MAX_COUNT - 1 and piece == _next(last):
                pieces[-1] = dataclasses.replace(last, cnt=last.cnt + 1)
            else:
                pieces.append(piece)
    return pieces


def _next(piece: _Piece) -> _Piece:
    """The one-chunk piece that would continue ``piece`` in the same step."""
    return dataclasses.replace(piece, chunk=piece.chunk + piece.cnt, cnt=1)


class _Builder:
    """Lowers rounds to TBs and steps, tracking every chunk access to place dependencies."""

    def __init__(self, num_ranks: int, splits: defaultdict[Fifo, set[int]]) -> None:
        self.n = num_ranks
        self.splits = splits
        self.tbs: list[_TB] = []
        self.fifos: defaultdict[Fifo, _FifoState] = defaultdict(_FifoState)
        self.peers: defaultdict[tuple[int, int, str], set[int]] = defaultdict(set)  # (gpu, chan, dir)
        self.last_write: dict[Loc, tuple[_TB, int]] = {}
        self.readers: defaultdict[Loc, dict[_TB, int]] = defaultdict(dict)
        self.local: dict[int, _TB] = {}
        self.scratch = [0] * num_ranks
        self.nchannels = 1

    # ------------------------------------------------------------------ lowering

    def run(self, schedule: Schedule, instances: int) -> None:
        c = schedule.num_chunks
        back: list[tuple[int, int]] = []  # (gpu, offset) whose value ends in scratch
        for j in range(instances):
            loc: dict[tuple[int, int], str] = {}
            for rnd in _rounds(schedule):
                pieces = _pieces(rnd, loc)
                for p in pieces:
                    self._send(j, c, p)
                for p in pieces:
                    self._receive(j, c, p)
                for p in pieces:
                    for chunk in range(p.chunk, p.chunk + p.cnt):
                        loc[p.dst, chunk] = p.dstbuf
            back += sorted((g, j * c + chunk) for (g, chunk), buf in loc.items() if buf == "s")
        self._copy_back(sorted(back))

    def _send(self, j: int, c: int, p: _Piece) -> None:
        fifo = (j, p.src, p.dst)
        state = self.fifos[fifo]
        item = state.sent
        state.sent += 1
        if item == 0 or item in self.splits[fifo]:
            chan = self._channel(p.src, p.dst)
            state.segments.append((item, self._tb(p.src, p.dst, -1, chan), self._tb(p.dst, -1, p.src, chan)))
        tb = state.segments[-1][1]
        off = j * c + p.chunk
        reads = [(p.src, p.srcbuf, off + k) for k in range(p.cnt)]
        pos = self._add(tb, _Step("s", p.srcbuf, off, p.srcbuf, off, p.cnt), reads, [])
        tb.items.append((pos, fifo, item))

    def _receive(self, j: int, c: int, p: _Piece) -> None:
        fifo = (j, p.src, p.dst)
        state = self.fifos[fifo]
        item = state.received
        state.received += 1
        tb = next(recv_tb for first, _, recv_tb in reversed(state.segments) if first <= item)
        off = j * c + p.chunk
        writes = [(p.dst, p.dstbuf, off + k) for k in range(p.cnt)]
        if p.reduce:
            step = _Step("rrc", p.localbuf, off, p.dstbuf, off, p.cnt)
            reads = [(p.dst, p.localbuf, off + k) for k in range(p.cnt)]
        else:
            step, reads = _Step("r", p.dstbuf, off, p.dstbuf, off, p.cnt), []
        if p.dstbuf == "s":
            self.scratch[p.dst] = max(self.scratch[p.dst], off + p.cnt)
        tb.items.append((self._add(tb, step, reads, writes), fifo, item))

    def _channel(self, src: int, dst: int) -> int:
        chan = 0
        while True:
            out, into = self.peers[src, chan, "send"], self.peers[dst, chan, "recv"]
            if dst not in out and src not in into and max(len(out), len(into)) < MAX_TBS_PER_CHANNEL:
                out.add(dst)
                into.add(src)
                self.nchannels = max(self.nchannels, chan + 1)
                return chan
            chan += 1

    def _tb(self, gpu: int, send: int, recv: int, chan: int) -> _TB:
        tb = _TB(gpu, send, recv, chan, len(self.tbs))
        self.tbs.append(tb)
        return tb

    def _copy_back(self, back: list[tuple[int, int]]) -> None:
        """Copy chunks whose final value is in scratch back to ``i``, merging consecutive offsets."""
        runs: list[tuple[int, int, int]] = []
        for g, off in back:
            if runs and runs[-1][0] == g and sum(runs[-1][1:]) == off and runs[-1][2] < MAX_COUNT - 1:
                runs[-1] = (g, runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((g, off, 1))
        for g, off, cnt in runs:
            step = _Step("cpy", "s", off, "i", off, cnt)
            reads, writes = [(g, "s", off + k) for k in range(cnt)], [(g, "i", off + k) for k in range(cnt)]
            tb = self.local.get(g)
            if tb is None or len(tb.steps) + max(1, len(self._deps(tb, reads, writes))) > MAX_STEPS:
                tb = self.local[g] = self._tb(g, -1, -1, 0)
            self._add(tb, step, reads, writes)

    # ------------------------------------------------------------------ dependencies

    def _deps(self, tb: _TB, reads: list[Loc], writes: list[Loc]) -> list[tuple[_TB, int]]:
        """The fewest dependencies that order this step after every conflicting access by another TB."""
        wanted: dict[_TB, int] = {}
        for loc in reads + writes:
            last = self.last_write.get(loc)
            if last is not None and last[0] is not tb:
                wanted[last[0]] = max(wanted.get(last[0], -1), last[1])
        for loc in writes:
            for other, pos in self.readers[loc].items():
                if other is not tb:
                    wanted[other] = max(wanted.get(other, -1), pos)
        needed = [(u, p) for u, p in wanted.items() if tb.known.get(u, -1) < p]
        return sorted(
            (
                (u, p)
                for u, p in needed
                if not any(v.known_at[q].get(u, -1) >= p for v, q in needed if v is not u)
            ),
            key=lambda d: (d[0].order, d[1]),
        )

    def _add(self, tb: _TB, step: _Step, reads: list[Loc], writes: list[Loc]) -> int:
        """Append ``step`` (after one nop per extra dependency) and record its accesses; its position."""
        deps = self._deps(tb, reads, writes)
        for dep in deps[:-1]:
            tb.steps.append(_Step("nop", "i", -1, "i", -1, 0, dep))
        step.dep = deps[-1] if deps else None
        tb.steps.append(step)
        pos = len(tb.steps) - 1
        if deps:
            known = dict(tb.known)
            for u, p in deps:
                u.steps[p].hasdep = True
                for v, q in [*u.known_at[p].items(), (u, p)]:
                    if known.get(v, -1) < q:
                        known[v] = q
            tb.known = known
        tb.known_at[pos] = tb.known
        for loc in reads:
            self.readers[loc][tb] = pos
        for loc in writes:
            self.last_write[loc] = (tb, pos)
            self.readers[loc] = {}
        return pos

    # ------------------------------------------------------------------ limits and text

    def overflows(self) -> list[tuple[Fifo, int]]:
        """For each TB past the step limit, the FIFO item that must start a new TB pair."""
        over: dict[Fifo, int] = {}
        for tb in self.tbs:
            first = next(((fifo, item) for pos, fifo, item in tb.items if pos >= MAX_STEPS), None)
            if first is not None:
                over[first[0]] = min(over.get(first[0], first[1]), first[1])
        return sorted(over.items())

    def finish(self) -> None:
        """Number each rank's TBs, dependency targets first, and check the remaining limits."""
        if self.nchannels > MAX_CHANNELS:
            raise MscclExportError(
                f"needs {self.nchannels} channels, the executor allows {MAX_CHANNELS}: "
                "use fewer instances or a smaller N"
            )
        for g in range(self.n):
            tbs = sorted(
                (tb for tb in self.tbs if tb.gpu == g),
                key=lambda tb: (
                    not any(s.hasdep for s in tb.steps),
                    tb.chan,
                    _kind(tb),
                    tb.send,
                    tb.recv,
                    tb.order,
                ),
            )
            targets = sum(any(s.hasdep for s in tb.steps) for tb in tbs)
            if targets > MAX_DEPENDENCY_TB + 1:
                raise MscclExportError(
                    f"gpu {g} needs {targets} thread blocks that others wait on, but dependency targets "
                    f"must have ids <= {MAX_DEPENDENCY_TB}: use fewer instances or a smaller N"
                )
            if len(tbs) > MAX_TBS:
                raise MscclExportError(
                    f"gpu {g} needs {len(tbs)} thread blocks, the executor allows {MAX_TBS}: "
                    "use fewer instances or a smaller N"
                )
            nodes = 1 + self.n + len(tbs) + sum(len(tb.steps) for tb in tbs)
            if nodes >= MAX_NODES:
                raise MscclExportError(
                    f"gpu {g}'s part of the file has {nodes} XML elements (algo, gpus, its tbs and steps), "
                    f"the executor's parser holds {MAX_NODES - 1}: use fewer instances or a smaller N"
                )
            for i, tb in enumerate(tbs):
                tb.id = i

    def render(self, chunks: int) -> list[str]:
        lines: list[str] = []
        for g in range(self.n):
            tbs = sorted((tb for tb in self.tbs if tb.gpu == g), key=lambda tb: tb.id)
            lines.append(f'  <gpu id="{g}" i_chunks="{chunks}" o_chunks="0" s_chunks="{self.scratch[g]}">')
            for tb in tbs:
                lines.append(f'    <tb id="{tb.id}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}">')
                lines += [_step_line(i, s) for i, s in enumerate(tb.steps)]
                lines.append("    </tb>")
            lines.append("  </gpu>")
        return lines


def _kind(tb: _TB) -> int:
    """Sending TBs first, then receiving ones, then local ones."""
    return 0 if tb.send >= 0 else 1 if tb.recv >= 0 else 2


def _step_line(i: int, s: _Step) -> str:
    depid, deps = (s.dep[0].id, s.dep[1]) if s.dep else (-1, -1)
    return (
        f'      <step s="{i}" type="{s.type}" srcbuf="{s.srcbuf}" srcoff="{s.srcoff}" dstbuf="{s.dstbuf}" '
        f'dstoff="{s.dstoff}" cnt="{s.cnt}" depid="{depid}" deps="{deps}" hasdep="{int(s.hasdep)}"/>'
    )
