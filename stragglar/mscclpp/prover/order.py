"""Happens-before analysis of a plan with vector clocks, fed by one run of the machine (prover, part 3).

What orders two ops (the kernel's memory model, as MSCCL++ uses it):

* **Inside a thread block** only ``nop`` (``__syncthreads``) and ``barrier`` order ops for all
  threads: data ops are split over the threads, and ``signal``/``wait``/semaphore ops run on one
  thread per channel.  So op X is before op Y of the same block iff a nop lies between them,
  except that single-channel sync ops (all on thread 0) are ordered among themselves.
* **Across blocks and GPUs**, a ``signal`` (release) before a ``wait`` (acquire) that is
  *guaranteed* to have seen it.  Signals count, so the k-th wait of a block on an endpoint knows
  that k signals arrived; a signal of producer block P is among any k if fewer than k signals can
  come from elsewhere: the j-th signal of P is guaranteed when ``j <= k - (signals not from P)``.
  Device semaphores (``sem_release`` -> ``sem_acquire``) work the same way (the j-th acquire of a
  semaphore with initial value v is guaranteed ``j - max(v, 0)`` releases if one block acquires,
  1 otherwise: an acquire that finds the value at or below 0 waits for one release, however far
  below).
  ``barrier`` joins all its blocks.  Relaxed ``rlxsignal``/``rlxwait`` order execution but not
  memory: they carry no clock, only the knowledge that the signalling GPU has started.

Each block keeps a vector clock (for every block, the latest op index known to be before the
current point; a data op X of block T is before Y iff ``clock_Y[T] >= next nop after X``).  The
machine's run visits ops in an order where every guaranteed signal precedes its wait, so clocks
are computed in one pass; the relation itself does not depend on that run.

Checks (first violation wins): every pair of conflicting accesses to a chunk (read/write,
write/write) must be ordered (``raw``, ``war``, ``waw``); a peer may touch GPU d's memory only after
some op of d in this execution (``early-access``: d may still be using it for the previous
execution) and must be known complete before d finishes (``late-access``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from stragglar.mscclpp.errors import PlanViolation
from stragglar.mscclpp.prover.machine import ACQUIRE, NOP, RELEASE, SIGNAL, WAIT, Layout

__all__ = ["Found", "HappensBefore"]

Clock = npt.NDArray[np.int16]


class Found(Exception):
    """Raised inside a run at the first violation, to stop it."""

    def __init__(self, violation: PlanViolation) -> None:
        super().__init__(violation.message)
        self.violation = violation


class HappensBefore:
    """The tracker the machine calls during the analysed run."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        n_tbs = len(layout.tbs)
        self.zero: Clock = np.full(n_tbs, -1, dtype=np.int16)
        self.gpu = [g for g, _ in layout.tbs]
        self.lane0 = [self.zero] * n_tbs
        self.block = [self.zero] * n_tbs
        self.pending: list[Clock | None] = [None] * n_tbs
        self.lane0_mask = [1 << g for g in self.gpu]
        self.block_mask = list(self.lane0_mask)
        self.pending_mask = [0] * n_tbs
        self.prefix: dict[tuple[int, int], list[tuple[Clock | None, int]]] = {}
        self.consumed: dict[tuple[int, int], int] = defaultdict(int)
        self.producers: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self.acquirers: dict[int, set[int]] = defaultdict(set)
        partner = layout.plan.partner
        for t, prog in enumerate(layout.programs):
            for kind, ids, _, _ in prog:
                if kind == SIGNAL:
                    for e in ids:
                        if partner[e] >= 0:
                            self.producers[partner[e]][t] += 1
                elif kind == RELEASE:
                    for c in ids:
                        self.producers[c][t] += 1
                elif kind == ACQUIRE:
                    self.acquirers[ids[0]].add(t)
        self.totals = {c: sum(per.values()) for c, per in self.producers.items()}
        self.sem_init = {
            layout.sem_base[g] + k: v
            for g, gpu in enumerate(layout.plan.gpus)
            for k, v in enumerate(gpu.semaphores)
        }
        locations = len(layout.owner)
        self.last_write: list[tuple[int, int, int] | None] = [None] * locations
        self.reads: list[list[tuple[int, int, int]]] = [[] for _ in range(locations)]
        self.remote: list[tuple[int, int, int, int, int]] = []  # (owner gpu, tb, next nop, op, location)

    # -- naming -----------------------------------------------------------------------------

    def name(self, t: int, i: int) -> str:
        g, tb = self.layout.tbs[t]
        return f"gpu {g} tb {tb} op {i} ({self.layout.plan.gpus[g].tbs[tb].ops[i].name})"

    def _found(self, kind: str, t: int, i: int, message: str) -> Found:
        g, tb = self.layout.tbs[t]
        return Found(PlanViolation(kind, g, tb, i, message))

    # -- clocks -----------------------------------------------------------------------------

    def _incoming(self, t: int, counter: int, relaxed: bool) -> tuple[Clock | None, int]:
        """What the j-th consumption of ``counter`` by block t is guaranteed to know."""
        self.consumed[(counter, t)] += 1
        j = self.consumed[(counter, t)]
        if counter in self.sem_init:
            init = self.sem_init[counter]
            # the executor's acquire that finds a value <= 0 waits for one release only, however
            # negative: a start below 0 guarantees no more than a start at 0
            k = j - max(init, 0) if len(self.acquirers[counter]) == 1 else (1 if j > init else 0)
        else:
            k = j
        clock: Clock | None = None
        mask = 0
        total = self.totals.get(counter, 0)
        for p, n_p in self.producers.get(counter, {}).items():
            upto = k - (total - n_p)
            if upto > n_p:
                upto = n_p
            if upto < 1:
                continue
            entries = self.prefix.get((counter, p), [])
            if len(entries) < upto:
                raise AssertionError(f"guaranteed signal not yet run: counter {counter}, block {p}")
            got, got_mask = entries[upto - 1]
            mask |= got_mask
            if got is not None and not relaxed:
                clock = got if clock is None else np.maximum(clock, got)
        return clock, mask

    def sync(self, t: int, i: int, kind: int, lanes: Sequence[int], relaxed: bool) -> None:
        if kind == NOP:
            self._nop(t, i)
            return
        single = len(lanes) == 1
        if kind in (SIGNAL, RELEASE):
            base = self.lane0[t] if single else self.block[t]
            mask = (self.lane0_mask[t] if single else self.block_mask[t]) | (1 << self.gpu[t])
            clock: Clock | None = None
            if not relaxed:
                clock = base.copy()
                clock[t] = i
            for c in lanes:
                if c < 0:
                    continue
                entries = self.prefix.setdefault((c, t), [])
                if entries:
                    prev, prev_mask = entries[-1]
                    joined = clock if prev is None else prev if clock is None else np.maximum(prev, clock)
                    entries.append((joined, prev_mask | mask))
                else:
                    entries.append((clock, mask))
            return
        assert kind in (WAIT, ACQUIRE)
        for c in lanes:
            got, got_mask = self._incoming(t, c, relaxed)
            if single:
                if got is not None:
                    self.lane0[t] = np.maximum(self.lane0[t], got)
                self.lane0_mask[t] |= got_mask
            else:
                if got is not None:
                    pend = self.pending[t]
                    self.pending[t] = got if pend is None else np.maximum(pend, got)
                self.pending_mask[t] |= got_mask

    def _joined(self, t: int, i: int) -> tuple[Clock, int]:
        clock = np.maximum(self.block[t], self.lane0[t])
        pend = self.pending[t]
        if pend is not None:
            clock = np.maximum(clock, pend)
        clock[t] = i
        return clock, self.block_mask[t] | self.lane0_mask[t] | self.pending_mask[t]

    def _nop(self, t: int, i: int) -> None:
        clock, mask = self._joined(t, i)
        self.block[t] = self.lane0[t] = clock
        self.pending[t] = None
        self.block_mask[t] = self.lane0_mask[t] = mask
        self.pending_mask[t] = 0

    def barrier(self, members: Sequence[tuple[int, int]]) -> None:
        joined = [self._joined(t, i) for t, i in members]
        clock = joined[0][0]
        mask = 0
        for c, m in joined:
            clock = np.maximum(clock, c)
            mask |= m
        for t, i in members:
            mine = clock.copy()
            mine[t] = i
            self.block[t] = self.lane0[t] = mine
            self.pending[t] = None
            self.block_mask[t] = self.lane0_mask[t] = mask
            self.pending_mask[t] = 0

    # -- accesses ---------------------------------------------------------------------------

    def data(self, t: int, i: int, reads: Sequence[int], writes: Sequence[int]) -> None:
        clock = self.block[t]
        mask = self.block_mask[t] | (1 << self.gpu[t])
        nn = self.layout.nextnop[t][i]
        gpu = self.gpu[t]
        owner = self.layout.owner
        for loc in dict.fromkeys(reads):
            w = self.last_write[loc]
            if w is not None and (w[0], w[2]) != (t, i) and clock[w[0]] < w[1]:
                raise self._race("raw", t, i, w, loc, "reads", "written")
            self.reads[loc].append((t, nn, i))
            self._remote(t, i, nn, loc, owner[loc], gpu, mask)
        for loc in dict.fromkeys(writes):
            w = self.last_write[loc]
            if w is not None and (w[0], w[2]) != (t, i) and clock[w[0]] < w[1]:
                raise self._race("waw", t, i, w, loc, "writes", "also written")
            for r in self.reads[loc]:
                if (r[0], r[2]) != (t, i) and clock[r[0]] < r[1]:
                    raise self._race("war", t, i, r, loc, "writes", "read")
            self.last_write[loc] = (t, nn, i)
            self.reads[loc] = []
            self._remote(t, i, nn, loc, owner[loc], gpu, mask)

    def _remote(self, t: int, i: int, nn: int, loc: int, owner: int, gpu: int, mask: int) -> None:
        if owner == gpu:
            return
        if not mask >> owner & 1:
            raise self._found(
                "early-access",
                t,
                i,
                f"{self.name(t, i)} touches {self.layout.names[loc]} before GPU {owner} is known to have "
                "started "
                f"this execution (it may still be using that memory for the previous one); wait first for a "
                f"signal GPU {owner} sends",
            )
        self.remote.append((owner, t, nn, i, loc))

    def _race(
        self, kind: str, t: int, i: int, other: tuple[int, int, int], loc: int, verb: str, past: str
    ) -> Found:
        where = self.layout.names[loc]
        across = self.gpu[t] != self.gpu[other[0]]
        how = "no signal/wait chain orders them" if across else "no nop, barrier or semaphore orders them"
        return self._found(
            kind,
            t,
            i,
            f"{kind} race: {self.name(t, i)} {verb} {where}, {past} by {self.name(other[0], other[2])}, "
            f"and {how}",
        )

    def finish(self) -> None:
        """After a complete run: every peer access to a GPU must be known done when that GPU ends."""
        n_gpus = len(self.layout.plan.gpus)
        final = [self.zero.copy() for _ in range(n_gpus)]
        for t, prog in enumerate(self.layout.programs):
            clock, _ = self._joined(t, len(prog))
            final[self.gpu[t]] = np.maximum(final[self.gpu[t]], clock)
        for owner, t, nn, i, loc in self.remote:
            if final[owner][t] < nn:
                raise self._found(
                    "late-access",
                    t,
                    i,
                    f"{self.name(t, i)} touches {self.layout.names[loc]}, but no signal tells GPU {owner} "
                    "it is "
                    f"done, so GPU {owner} may finish (and its buffers be reused) first",
                )
