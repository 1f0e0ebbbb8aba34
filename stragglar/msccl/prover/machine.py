"""The MSCCL executor's model: every thread block of every GPU run under a deterministic scheduler.

Each thread block (TB) is a sequential program; sends and receives meet in FIFO order per
(channel, sender, receiver) on a connection holding ``capacity`` chunk transfers (2 on Simple, 8
on LL/LL128), a ``cnt``-chunk step moving one chunk at a time, as the executor does for large
buffers; a dependency on (tb, step) waits until that TB has signalled, with a ``hasdep`` step, a
step at or after it (the kernel's ``flag >= goal``: a wait on a step without ``hasdep`` ends at the
next step that has it, a warning of the reader); the program runs twice back to back (the
kernel's pipeline: a TB may run ahead into the next iteration, on another slice of every buffer).

Values are symbolic, so the result holds for every input: a chunk holds the set of (rank, input
chunk) contributions it sums, as a bitmask, and the order of its additions
(:class:`~stragglar.verify.orders.Orders`), both behind one number (:attr:`Machine.sums`).  A sum
whose operands share a contribution, or mix two input chunks, is marked with the place it arose;
sums only grow, so a marked value stays wrong until a copy overwrites it, and only a mark that
survives is reported.  A proved file whose GPUs end with a chunk added in different orders is
correct, but its replicas differ in the last bits: :meth:`Machine.disagreement` says where.

Why one run decides every run.  Whether a TB's next move is enabled depends on its dependencies'
signals (which only grow), on its input connection being non-empty (only this TB takes from it: the
reader allows one TB per connection end) and on its output connection having room (only this TB adds
to it).  So an enabled move stays enabled until its TB makes it, and moves of different TBs commute:
the system is persistent, and every maximal run makes the same moves (Keller).  The deterministic
scheduler below therefore finishes iff every schedule does, and otherwise stops where every schedule
gets stuck.  Data: two accesses of one chunk by different TBs of a rank, one a write, must be
ordered by happens-before: program order, dependency signals, and messages, so that an order through
other GPUs counts (:mod:`stragglar.msccl.prover.order`).  That relation does not depend on the schedule
(the k-th send of a connection meets its k-th receive, a wait is released by the same step in every
run), so one run finds every race, and without races every read sees the same write in every run:
the values computed here are the executor's.  A :class:`Machine` follows that order inside each GPU
only (an access not ordered so makes its GPU a suspect), or, given GPUs to track, through messages
too (an access of theirs not ordered is a race): :mod:`stragglar.msccl.prover.prove` runs the first,
then the second for the suspects.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from stragglar.msccl.errors import MscclViolation
from stragglar.msccl.prover.order import Access, Accesses, Clocks, Conflict, Key, Snapshot, releases
from stragglar.msccl.prover.parsed import Algo, Tx
from stragglar.msccl.vocabulary import READS_SRC, RECV_TYPES, SEND_TYPES, WRITES_DST
from stragglar.verify.orders import Orders, disagreement
from stragglar.verify.report import bit_list

__all__ = ["ITERATIONS", "Machine"]

ITERATIONS = 2
_UNINITIALIZED = -1
_SHOWN = 8


@dataclass
class _Item:
    """One chunk in flight: its value, the send it belongs to, its place in that send, and what its
    sender knew (when messages carry clocks)."""

    value: int
    tb: int
    tx: int
    unit: int
    chunk: int
    clock: Snapshot | None


class _Problem(Exception):
    def __init__(self, violation: MscclViolation) -> None:
        self.violation = violation


class Machine:
    """One execution of every TB of every GPU, ``ITERATIONS`` times, under the deterministic scheduler
    (:meth:`run`: the first problem, or None).

    With ``tracked`` None, happens-before is followed inside each GPU and an unordered access is a
    suspect (its GPU goes to ``suspects``); with a set of GPUs, it follows messages too and an
    unordered access on one of those GPUs is a race."""

    def __init__(self, algo: Algo, inplace: bool, tracked: set[int] | None = None) -> None:
        self.algo, self.inplace, self.n = algo, inplace, algo.ngpus
        self.full = (1 << self.n) - 1
        self.where: list[tuple[int, int]] = []  # global TB -> (gpu, tb id)
        self.local: list[int] = []  # global TB -> its index among its GPU's TBs
        self.base: list[int] = []  # gpu -> global index of its tb 0
        for gpu in algo.gpus:
            self.base.append(len(self.where))
            for tb in gpu.tbs:
                self.local.append(len(self.where) - self.base[-1])
                self.where.append((gpu.id, tb.id))
        self.tbs = [algo.gpus[g].tbs[t] for g, t in self.where]
        self.release = [releases([tx.hasdep for tx in tb.txs]) for tb in self.tbs]
        count = len(self.tbs)
        self.pc, self.unit, self.iteration = [0] * count, [0] * count, [0] * count
        self.ready = [False] * count  # dependencies of the current transmission satisfied
        self.signal = [-1] * count  # iteration * 65536 + position of the last hasdep step
        gpu_of = [g for g, _ in self.where]
        self.clocks = (
            Clocks.within_gpus(gpu_of, self.local)
            if tracked is None
            else Clocks.through_gpus(gpu_of, tracked)
        )
        self.tick = [0] * count  # chunks moved by each TB so far: its progress, as the clocks count it
        self.moves = 0  # chunks moved by all TBs: where in the run a problem was found
        self.suspects: set[int] = set()  # GPUs with an access not ordered within the GPU
        self.joins = self._joins()
        self.snapshots: dict[tuple[int, int], tuple[Snapshot, list[int]]] = {}  # -> (known, joins left)
        self.waiters: list[list[int]] = [[] for _ in range(count)]  # TBs waiting for a TB's signal
        self.fifo: dict[tuple[int, int, int], deque[_Item]] = {}
        self.ends: dict[tuple[int, int, int], list[int | None]] = {}  # connection -> [sender, receiver]
        for i, (g, _) in enumerate(self.where):
            tb = self.tbs[i]
            if tb.send >= 0:
                self.ends.setdefault((tb.chan, g, tb.send), [None, None])[0] = i
            if tb.recv >= 0:
                self.ends.setdefault((tb.chan, tb.recv, g), [None, None])[1] = i
        self.orders = Orders(self.n)
        self.sums: list[tuple[int, int]] = []  # value -> (contributions: chunk << n | ranks, order)
        self.memory = [self._memory() for _ in range(ITERATIONS)]
        self.marks: list[MscclViolation] = []
        self.accesses = Accesses(self.clocks)

    def _joins(self) -> list[list[int]]:
        """For each TB and transmission, the waits its signal releases per iteration: a releasing
        step's snapshot is kept until they have all joined it."""
        joins = [[0] * len(tb.txs) for tb in self.tbs]
        for t, tb in enumerate(self.tbs):
            base = self.base[self.where[t][0]]
            for tx in tb.txs:
                for dep, pos in tx.deps:
                    u = base + dep
                    k = self.release[u][self.tbs[u].tx_at[pos]]
                    if k < len(self.tbs[u].txs):
                        joins[u][k] += 1
        return joins

    def _memory(self) -> list[dict[str, list[int]]]:
        """Rank g starts with its own contribution to every chunk of ``i``; the rest is garbage."""
        n, out = self.n, []
        for gpu in self.algo.gpus:
            bufs = {"i": [self._value((c << n) | (1 << gpu.id), gpu.id) for c in range(self.algo.nchunks)]}
            bufs["o"] = bufs["i"] if self.inplace else [_UNINITIALIZED] * self.algo.nchunks
            bufs["s"] = [_UNINITIALIZED] * gpu.chunks["s"]
            out.append(bufs)
        return out

    # ------------------------------------------------------------------ scheduler

    def run(self) -> MscclViolation | None:
        queue = deque(range(len(self.tbs)))
        queued = [True] * len(self.tbs)
        try:
            while queue:
                t = queue.popleft()
                queued[t] = False
                for woken in self._advance(t):
                    if not queued[woken]:
                        queued[woken] = True
                        queue.append(woken)
            return self._stuck() or self._leftover() or self._final()
        except _Problem as p:
            return p.violation

    def _done(self, t: int) -> bool:
        return self.iteration[t] == ITERATIONS or not self.tbs[t].txs

    def _advance(self, t: int) -> list[int]:
        """Run TB ``t`` until it blocks or ends; the TBs its moves may have unblocked."""
        woken: list[int] = []
        txs = self.tbs[t].txs
        while not self._done(t):
            tx = txs[self.pc[t]]
            if not self.ready[t]:
                dep = self._waiting_dependency(t, tx)
                if dep is not None:
                    self.waiters[dep[0]].append(t)
                    return woken
                self._join(t, tx)
                self.ready[t] = True
            inbound = self._connection(t, "recv") if tx.type in RECV_TYPES else None
            outbound = self._connection(t, "send") if tx.type in SEND_TYPES else None
            if inbound is not None and not self.fifo.get(inbound):
                return woken
            if outbound is not None and len(self.fifo.get(outbound, ())) >= self.algo.capacity:
                return woken
            self._move(t, tx, inbound, outbound, woken)
        return woken

    def _connection(self, t: int, direction: str) -> tuple[int, int, int]:
        g, tb = self.where[t][0], self.tbs[t]
        return (tb.chan, g, tb.send) if direction == "send" else (tb.chan, tb.recv, g)

    def _waiting_dependency(self, t: int, tx: Tx) -> tuple[int, int] | None:
        """The first dependency (global TB, position) of ``tx`` not yet signalled, if any."""
        base = self.base[self.where[t][0]]
        goal = self.iteration[t] * 65536
        for tb, pos in tx.deps:
            if self.signal[base + tb] < goal + pos:
                return base + tb, pos
        return None

    def _join(self, t: int, tx: Tx) -> None:
        """Happens-before: what each releasing step knew is now known to ``t``.

        A wait on a step ends when its thread block signals that step or a later one; the first
        ``hasdep`` step at or after it is the earliest that can, so only what it knew is known
        (the reader guarantees there is one)."""
        base = self.base[self.where[t][0]]
        for tb, pos in tx.deps:
            u = base + tb
            producer = self.tbs[u]
            e = self.iteration[t] * len(producer.txs) + self.release[u][producer.tx_at[pos]]
            known, left = self.snapshots[u, e]
            self.clocks.join(t, known)
            left[0] -= 1
            if not left[0]:
                del self.snapshots[u, e]

    def _move(
        self,
        t: int,
        tx: Tx,
        inbound: tuple[int, int, int] | None,
        outbound: tuple[int, int, int] | None,
        woken: list[int],
    ) -> None:
        """One chunk of ``tx``: receive, compute, write, send; then finish ``tx`` after its last chunk."""
        j, it = self.unit[t], self.iteration[t]
        value = None
        if inbound is not None:
            item = self.fifo[inbound].popleft()
            self._match(t, tx, item, inbound)
            if item.clock is not None:
                self.clocks.join(t, item.clock)
            sender = self.ends[inbound][0]
            assert sender is not None
            woken.append(sender)
            value = item.value
        if tx.type == "re":  # the kernel adds fused re steps' sources to dst in turn: (dst + s0) + s1
            value = self._read(t, tx, tx.dstbuf, tx.dstoff + j)
        if tx.type in READS_SRC:
            for off in tx.srcoffs:
                local = self._read(t, tx, tx.srcbuf, off + j)
                value = local if value is None else self._add(t, tx, value, local)
        assert value is not None
        if tx.type in WRITES_DST:
            self._write(t, tx, tx.dstbuf, tx.dstoff + j, value)
        if outbound is not None:
            chunk = tx.srcoffs[0] + j if tx.type in READS_SRC else tx.dstoff + j
            known = self.clocks.snapshot(t, self.tick[t] + 1) if self.clocks.messages else None
            self.fifo.setdefault(outbound, deque()).append(_Item(value, t, self.pc[t], j, chunk, known))
            receiver = self.ends[outbound][1]
            if receiver is not None:
                woken.append(receiver)
        self.tick[t] += 1
        self.moves += 1
        self.unit[t] = j + 1
        if j + 1 == tx.cnt:
            self._finish(t, tx, it, woken)

    def _finish(self, t: int, tx: Tx, it: int, woken: list[int]) -> None:
        if tx.hasdep:
            joins = self.joins[t][self.pc[t]]
            if joins:
                e = it * len(self.tbs[t].txs) + self.pc[t]
                self.snapshots[t, e] = (self.clocks.snapshot(t, self.tick[t]), [joins])
            self.signal[t] = it * 65536 + tx.pos
            woken.extend(self.waiters[t])
            self.waiters[t] = []
        self.unit[t], self.ready[t] = 0, False
        self.pc[t] += 1
        if self.pc[t] == len(self.tbs[t].txs):
            self.pc[t] = 0
            self.iteration[t] += 1

    # ------------------------------------------------------------------ data and races

    def _value(self, contributions: int, order: int) -> int:
        """A new symbolic value: its number in :attr:`sums`."""
        self.sums.append((contributions, order))
        return len(self.sums) - 1

    def _add(self, t: int, tx: Tx, a: int, b: int) -> int:
        """The sum of two symbolic values, marked if it counts a contribution twice or mixes chunks."""
        if a < 0 or b < 0:
            return max(a, b) if a < 0 and b < 0 else min(a, b)
        (x, x_order), (y, y_order) = self.sums[a], self.sums[b]
        if x >> self.n != y >> self.n:
            return self._mark(t, tx, "mixed", f"adds chunk {y >> self.n} data to chunk {x >> self.n} data")
        twice = x & y & self.full
        if twice:
            return self._mark(t, tx, "duplicate", f"counts {_gpus(twice)} twice in chunk {x >> self.n} data")
        return self._value(x | y, self.orders.add(x_order, y_order))

    def _mark(self, t: int, tx: Tx, kind: str, what: str) -> int:
        g, tb = self.where[t]
        chunk = _chunk(tx, self.unit[t])
        where = f"gpu {g} tb {tb} step {tx.pos} ({tx.type} chunk {chunk})"
        self.marks.append(MscclViolation(kind, g, tb, tx.pos, chunk, f"{where} {what}"))
        return -1 - len(self.marks)

    def _key(self, t: int, buf: str, off: int) -> Key:
        return (self.iteration[t], self.where[t][0], "i" if buf == "o" and self.inplace else buf, off)

    def _read(self, t: int, tx: Tx, buf: str, off: int) -> int:
        key = self._key(t, buf, off)
        self._ordered(t, tx, key, "reads", self.accesses.read(key, Access(t, self.tick[t], tx.pos)))
        return self.memory[key[0]][key[1]][buf][off]

    def _write(self, t: int, tx: Tx, buf: str, off: int, value: int) -> None:
        key = self._key(t, buf, off)
        self._ordered(t, tx, key, "writes", self.accesses.write(key, Access(t, self.tick[t], tx.pos)))
        self.memory[key[0]][key[1]][buf][off] = value

    def _ordered(self, t: int, tx: Tx, key: Key, verb: str, conflict: Conflict | None) -> None:
        """An access of ``t`` not known to follow an earlier one: a race if the clocks follow
        messages, else a suspect for the run that does."""
        if conflict is None:
            return
        it, g, buf, off = key
        if not self.clocks.exact:
            self.suspects.add(g)
            return
        earlier = conflict.earlier
        what = (
            f"gpu {g} tb {self.where[t][1]} step {tx.pos} ({tx.type} chunk {off}) {verb} {buf}[{off}] "
            f"(iteration {it}) with no dependency path from tb {self.where[earlier.tb][1]} step "
            f"{earlier.step}, which {conflict.verb} it: a race"
        )
        raise _Problem(MscclViolation("race", g, self.where[t][1], tx.pos, off, what))

    def _match(self, t: int, tx: Tx, item: _Item, connection: tuple[int, int, int]) -> None:
        if self.unit[t] == 0 and (item.unit != 0 or self.tbs[item.tb].txs[item.tx].cnt != tx.cnt):
            sender = self.tbs[item.tb].txs[item.tx]
            g, tb = self.where[t]
            what = (
                f"gpu {g} tb {tb} step {tx.pos} ({tx.type} chunk {_chunk(tx, 0)}, cnt {tx.cnt}) meets the "
                f"send of gpu {self.where[item.tb][0]} tb {self.where[item.tb][1]} step {sender.pos} (chunk "
                f"{item.chunk}, cnt {sender.cnt}) on channel {connection[0]}: counts differ"
            )
            raise _Problem(MscclViolation("mismatch", g, tb, tx.pos, _chunk(tx, 0), what))

    # ------------------------------------------------------------------ end states

    def _stuck(self) -> MscclViolation | None:
        """Explain a state where some TB cannot move: a cycle of waits, or a wait nothing will end.

        Each blocked TB waits for exactly one other (the wait-for graph has out-degree one): from
        the first blocked TB, the waits either close a cycle (a deadlock) or end at a TB that has
        finished or does not exist (a wait nothing will end).
        """
        blocked = [t for t in range(len(self.tbs)) if not self._done(t)]
        if not blocked:
            return None
        import networkx as nx  # here, not at the top: only a stuck file pays for its import

        waits = nx.DiGraph()
        waits.add_nodes_from(blocked)
        waits.add_edges_from((t, u) for t in blocked if (u := self._waits_for(t)[0]) is not None)
        try:
            cycle = [u for u, _ in nx.find_cycle(waits, source=blocked[0])]
        except nx.NetworkXNoCycle:
            chain = [t for t in nx.dfs_preorder_nodes(waits, blocked[0]) if not self._done(t)]
            return self._never(chain[-1])
        first = self._describe(cycle[0])
        parts = [self._describe(u)[1] for u in cycle]
        if len(parts) > _SHOWN:
            parts = [*parts[:_SHOWN], f"... ({len(parts)} thread blocks)"]
        what = f"deadlock ({self.algo.proto}, {self.algo.capacity} chunks per connection): " + " -> ".join(
            parts
        )
        return MscclViolation("deadlock", *first[0], what + " -> back to the first")

    def _waits_for(self, t: int) -> tuple[int | None, str]:
        """The TB that ``t`` waits for (None if there is none) and why."""
        tx = self.tbs[t].txs[self.pc[t]]
        if not self.ready[t]:
            dep = self._waiting_dependency(t, tx)
            assert dep is not None
            return dep[0], f"waits for tb {self.where[dep[0]][1]} step {dep[1]} to signal"
        if tx.type in RECV_TYPES and not self.fifo.get(self._connection(t, "recv")):
            chan, src, _ = self._connection(t, "recv")
            return self.ends[chan, src, self.where[t][0]][
                0
            ], f"waits for data from gpu {src} on channel {chan}"
        chan, _, dst = self._connection(t, "send")
        return self.ends[chan, self.where[t][0], dst][
            1
        ], f"waits for room to send to gpu {dst} on channel {chan}"

    def _describe(self, t: int) -> tuple[tuple[int, int, int, int], str]:
        g, tb = self.where[t]
        tx = self.tbs[t].txs[self.pc[t]]
        chunk = _chunk(tx, self.unit[t])
        it = f", iteration {self.iteration[t]}" if self.iteration[t] else ""
        head = f"gpu {g} tb {tb} step {tx.pos} ({tx.type} chunk {chunk}{it})"
        return (g, tb, tx.pos, chunk), f"{head} {self._waits_for(t)[1]}"

    def _never(self, t: int) -> MscclViolation:
        place, text = self._describe(t)
        other = self._waits_for(t)[0]
        why = "which has no such thread block" if other is None else "which has finished"
        return MscclViolation("unmatched", *place, f"{text}, {why}: it never comes")

    def _leftover(self) -> MscclViolation | None:
        for (chan, _, dst), items in sorted(self.fifo.items()):
            if items:
                item = items[0]
                g, tb = self.where[item.tb]
                pos = self.tbs[item.tb].txs[item.tx].pos
                what = f"gpu {g} tb {tb} step {pos} sends chunk {item.chunk} to gpu {dst} on channel {chan}"
                what += ", but it is never received"
                return MscclViolation("unmatched", g, tb, pos, item.chunk, what)
        return None

    def _final(self) -> MscclViolation | None:
        """Every output chunk must hold its own chunk's contributions from every GPU, each once.

        The first wrong chunk of the best rank (:meth:`_rank`) is reported, and only it is described:
        a description names GPUs from an N-bit mask, which at N = 1024 costs a millisecond, and a file
        whose every chunk is wrong has millions of them."""
        n, out = self.n, "i" if self.inplace else "o"
        best: tuple[int, int, int, int, int] | None = None  # (rank, iteration, gpu, chunk, value)
        for it in range(ITERATIONS):
            for g in range(n):
                for c, value in enumerate(self.memory[it][g][out]):
                    if value < 0 or self.sums[value][0] != (c << n) | self.full:
                        rank = self._rank(it, g, out, c, value)
                        if rank == 0:  # none ranks before it
                            return self._wrong(it, g, out, c, value)
                        if best is None or rank < best[0]:
                            best = (rank, it, g, c, value)
        if best is None:
            return None
        _, it, g, c, value = best
        return self._wrong(it, g, out, c, value)

    def disagreement(self) -> str | None:
        """Where two GPUs end with one chunk added in different orders, in words (None where every
        GPU adds every chunk alike); meaningful after a run that found no problem.  The first
        iteration speaks for both: without races every read sees the same write in each."""
        out = "i" if self.inplace else "o"
        return disagreement(
            self.orders, [[self.sums[v][1] for v in memory[out]] for memory in self.memory[0]], "gpus"
        )

    def _rank(self, it: int, g: int, buf: str, c: int, value: int) -> int:
        """How a wrong final value ranks: marks first, then values with a writer, then the rest."""
        if value < _UNINITIALIZED:
            return 0
        return 1 + (self.accesses.writer((it, g, "i" if self.inplace else buf, c)) is None)

    def _wrong(self, it: int, g: int, buf: str, c: int, value: int) -> MscclViolation:
        """The final-state problem of a wrong value."""
        last = self.accesses.writer((it, g, "i" if self.inplace else buf, c))
        tb = step = None
        writer = "never written"
        if last is not None:
            tb, step = self.where[last.tb][1], last.step
            writer = f"last written by tb {tb} step {step}"
        if value < _UNINITIALIZED:
            mark = self.marks[-2 - value]
            return MscclViolation(
                mark.kind,
                mark.gpu,
                mark.tb,
                mark.step,
                mark.chunk,
                f"{mark.message}; the wrong value survives in gpu {g} chunk {c}",
            )
        contributions = self.sums[value][0] if value >= 0 else 0
        if value == _UNINITIALIZED:
            what = "holds uninitialized memory"
        elif contributions >> self.n != c:
            what = f"holds chunk {contributions >> self.n} data"
        else:
            what = f"lacks {_gpus(self.full & ~contributions)}"
        message = f"final state: gpu {g} chunk {c} {what} ({writer})"
        return MscclViolation("missing", g, tb, step, c, message)


def _chunk(tx: Tx, unit: int) -> int:
    return (tx.dstoff if tx.type in WRITES_DST else tx.srcoffs[0]) + unit


def _gpus(mask: int) -> str:
    """Name the GPUs in ``mask``, shortened when there are many."""
    return f"the contributions of gpus {bit_list(mask, _SHOWN)}"
