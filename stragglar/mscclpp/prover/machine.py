"""Execute a read plan symbolically under a random interleaving of its thread blocks (prover, part 2).

The machine follows the executor's kernel (``execution_kernel.hpp`` and the device headers):

* every thread block is a sequential program; blocks of all GPUs interleave arbitrarily, one op
  at a time, chosen by a seeded random generator;
* memory-channel semaphores count: a ``signal`` on an endpoint adds one to the inbound counter of
  the connected endpoint; a ``wait`` takes a ticket (``++expected``) and blocks until the inbound
  count reaches it.  Relaxed variants count the same way;
* a device semaphore's ``sem_acquire`` decrements and, when the old value was not positive, blocks
  until the value is back to the old one; ``sem_release`` adds one;
* ``barrier`` blocks until ``num_threadblocks`` blocks of the GPU arrived at that barrier id;
* data ops read and write chunks; a ``put`` writes the peer's memory directly.

Values are symbolic: a chunk holds the set of (rank, chunk) contributions summed into it, as a
bitmask, plus a mask of contributions counted more than once, plus a *garbage* bit for data nobody
wrote (scratch, and the output of an out-of-place plan, start as garbage), plus the order of its
additions (:class:`~stragglar.verify.orders.Orders`; -1 for garbage and what adds it), which
tells a correct plan whose GPUs' floating-point results differ in the last bits.

Every run is bounded: the scheduler does at most one step per op plus one per wake-up, and a wake-up
happens only when the counter a block waits on has reached its target, so the loop ends after
at most ``2 x ops + lanes`` steps (checked).  A run that stops with blocks unfinished is a deadlock.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from stragglar.mscclpp.prover.parsed import Plan, Ref
from stragglar.verify.orders import Orders

__all__ = ["Layout", "Outcome", "Tracker", "run"]

NOP, BARRIER, SIGNAL, WAIT, RELEASE, ACQUIRE, DATA = range(7)
_KIND = {
    "nop": NOP,
    "barrier": BARRIER,
    "signal": SIGNAL,
    "rlxsignal": SIGNAL,
    "wait": WAIT,
    "rlxwait": WAIT,
    "sem_release": RELEASE,
    "sem_acquire": ACQUIRE,
}

Value = tuple[int, int, int]  # (contributions, contributions counted more than once, order)
Elements = tuple[
    tuple[tuple[int, ...], tuple[int, ...]], ...
]  # per chunk: (locations written, locations read)
Step = tuple[int, tuple[int, ...], Elements, bool]  # (kind, endpoints/semaphores/barrier, elements, relaxed)


class Tracker(Protocol):
    """What the happens-before analysis hears from a run (see :mod:`stragglar.mscclpp.prover.order`)."""

    def sync(self, tb: int, index: int, kind: int, lanes: Sequence[int], relaxed: bool) -> None: ...

    def barrier(self, members: Sequence[tuple[int, int]]) -> None: ...

    def data(self, tb: int, index: int, reads: Sequence[int], writes: Sequence[int]) -> None: ...


@dataclass(frozen=True, slots=True)
class Layout:
    """Where every chunk lives in the flat value array, and each thread block's program."""

    plan: Plan
    base: tuple[dict[str, int], ...]  # per GPU: buffer -> first location
    owner: tuple[int, ...]  # location -> GPU
    names: tuple[str, ...]  # location -> "gpu 1 s[3]"
    tbs: tuple[tuple[int, int], ...]  # global tb -> (gpu, tb id)
    programs: tuple[tuple[Step, ...], ...]
    nextnop: tuple[tuple[int, ...], ...]
    counters: int  # endpoints, then device semaphores
    sem_base: tuple[int, ...]
    sem_init: tuple[int, ...]
    lanes: int

    @staticmethod
    def build(plan: Plan) -> Layout:
        base: list[dict[str, int]] = []
        owner: list[int] = []
        names: list[str] = []
        for gpu in plan.gpus:
            sizes = {"i": gpu.input_chunks, "s": gpu.scratch_chunks}
            if not plan.inplace:
                sizes["o"] = gpu.output_chunks
            here: dict[str, int] = {}
            for buf, count in sizes.items():
                here[buf] = len(owner)
                owner.extend([gpu.id] * count)
                names.extend(f"gpu {gpu.id} {buf}[{c}]" for c in range(count))
            if plan.inplace:
                here["o"] = here["i"]
            base.append(here)
        endpoints = len(plan.partner)
        sem_base: list[int] = []
        sem_init: list[int] = []
        for gpu in plan.gpus:
            sem_base.append(endpoints + len(sem_init))
            sem_init.extend(gpu.semaphores)

        def locs(ref: Ref) -> list[int]:
            start = base[ref.gpu][ref.buffer] + ref.index
            return list(range(start, start + ref.size))

        tbs: list[tuple[int, int]] = []
        programs: list[tuple[Step, ...]] = []
        nextnop: list[tuple[int, ...]] = []
        lanes = 0
        for gpu in plan.gpus:
            for tb in gpu.tbs:
                tbs.append((gpu.id, tb.id))
                prog: list[Step] = []
                for op in tb.ops:
                    kind = _KIND.get(op.name, DATA)
                    if kind in (SIGNAL, WAIT):
                        prog.append((kind, op.endpoints, (), op.name.startswith("rlx")))
                        lanes += len(op.endpoints)
                    elif kind in (RELEASE, ACQUIRE):
                        ids = tuple(sem_base[gpu.id] + s for s in op.semaphores)
                        prog.append((kind, ids, (), False))
                        lanes += len(ids)
                    elif kind == BARRIER:
                        assert op.barrier is not None
                        prog.append((kind, op.barrier, (), False))
                    elif kind == NOP:
                        prog.append((kind, (), (), False))
                    else:
                        elements = _elements(op.name, [locs(r) for r in op.src], [locs(r) for r in op.dst])
                        prog.append((DATA, (), elements, False))
                programs.append(tuple(prog))
                nxt, following = [], len(prog)
                for i in range(len(prog) - 1, -1, -1):
                    nxt.append(following)
                    if prog[i][0] in (NOP, BARRIER):
                        following = i
                nextnop.append(tuple(reversed(nxt)))
        return Layout(
            plan=plan,
            base=tuple(base),
            owner=tuple(owner),
            names=tuple(names),
            tbs=tuple(tbs),
            programs=tuple(programs),
            nextnop=tuple(nextnop),
            counters=endpoints + len(sem_init),
            sem_base=tuple(sem_base),
            sem_init=tuple(sem_init),
            lanes=lanes,
        )

    def initial_values(self) -> list[Value]:
        """Rank r's chunk c holds bit r*C + c, in order r; scratch and out-of-place output hold garbage."""
        chunks = self.plan.chunks
        garbage = (1 << (len(self.plan.gpus) * chunks), 0, -1)
        values = [garbage] * len(self.owner)
        for gpu in self.plan.gpus:
            start = self.base[gpu.id]["i"]
            for c in range(chunks):
                values[start + c] = (1 << (gpu.id * chunks + c), 0, gpu.id)
        return values


def _elements(name: str, src: list[list[int]], dst: list[list[int]]) -> Elements:
    """Per chunk of the op: (locations written, locations read), as the kernel computes them.

    put/get: dst[i] = src[i]; copy: dst[0] = src[0]; re/rre: dst[0] = sum(src);
    res/rres: dst[0] = sum(src), and the same value to every remote dst.
    """
    if name in ("put", "get"):
        pairs = (zip(s_list, d_list, strict=True) for s_list, d_list in zip(src, dst, strict=True))
        return tuple(((d,), (s,)) for pair in pairs for s, d in pair)
    size = len(src[0])
    return tuple((tuple(d[j] for d in dst), tuple(s[j] for s in src)) for j in range(size))


@dataclass(frozen=True, slots=True)
class Outcome:
    """The end of one run: final values (their orders numbered in ``orders``), or the blocked
    (tb, op) pairs of a deadlock."""

    values: tuple[Value, ...]
    orders: Orders
    blocked: tuple[tuple[int, int], ...]
    leftover_signals: tuple[tuple[int, int], ...]  # (endpoint, signals nobody waited for)
    lost_signals: tuple[tuple[int, int], ...]  # (endpoint without partner, signals sent on it)
    semaphores: tuple[int, ...]  # final device-semaphore values
    waiting_on: tuple[tuple[int, ...], ...]  # per blocked tb, the counters it waits on


def run(layout: Layout, seed: int, tracker: Tracker | None = None) -> Outcome:
    """One run to completion or deadlock, scheduling blocks with ``random.Random(seed)``."""
    pick = random.Random(seed).random
    plan = layout.plan
    programs = layout.programs
    endpoints = len(plan.partner)
    partner = plan.partner
    values = layout.initial_values()
    orders = Orders(len(plan.gpus))
    count = [0] * layout.counters  # inbound signals per endpoint; value per device semaphore
    for k, init in enumerate(layout.sem_init):
        count[endpoints + k] = init
    expected = [0] * endpoints
    lost = [0] * endpoints
    pc = [0] * len(programs)
    tickets: list[list[int] | None] = [None] * len(programs)
    waiters: list[list[int]] = [[] for _ in range(layout.counters)]
    arrivals: dict[tuple[int, int], list[tuple[int, int]]] = {}
    runnable = [t for t in range(len(programs)) if programs[t]]
    in_barrier = [False] * len(programs)
    limit = 2 * sum(len(p) for p in programs) + layout.lanes + 1
    steps = 0

    def ready(t: int) -> int:
        """-1 if the lanes of tb t's current op are satisfied, else the first counter it waits on."""
        ids = programs[t][pc[t]][1]
        mine = tickets[t]
        assert mine is not None
        for lane, c in enumerate(ids):
            if count[c] < mine[lane]:
                return c
        return -1

    def wake(c: int) -> None:
        still = []
        for t in waiters[c]:
            mine = tickets[t]
            assert mine is not None
            lane_targets = [m for (cc, m) in zip(programs[t][pc[t]][1], mine, strict=True) if cc == c]
            if all(count[c] >= m for m in lane_targets):
                runnable.append(t)
            else:
                still.append(t)
        waiters[c] = still

    while runnable:
        steps += 1
        if steps > limit:
            raise AssertionError("scheduler exceeded its step bound")
        pos = int(pick() * len(runnable))
        t = runnable[pos]
        prog = programs[t]
        i = pc[t]
        kind, ids, elements, relaxed = prog[i]
        if kind in (WAIT, ACQUIRE):
            if tickets[t] is None:
                if kind == WAIT:
                    mine = []
                    for e in ids:
                        expected[e] += 1
                        mine.append(expected[e])
                else:
                    mine = []
                    for c in ids:
                        old = count[c]
                        count[c] = old - 1
                        mine.append(old if old <= 0 else -(1 << 62))
                tickets[t] = mine
            blocker = ready(t)
            if blocker >= 0:
                runnable[pos] = runnable[-1]
                runnable.pop()
                waiters[blocker].append(t)
                continue
            tickets[t] = None
            if tracker is not None:
                tracker.sync(t, i, kind, ids, relaxed)
        elif kind == SIGNAL:
            for e in ids:
                p = partner[e]
                if p < 0:
                    lost[e] += 1
                    continue
                count[p] += 1
                if waiters[p]:
                    wake(p)
            if tracker is not None:
                tracker.sync(t, i, kind, [partner[e] for e in ids], relaxed)
        elif kind == RELEASE:
            for c in ids:
                count[c] += 1
                if waiters[c]:
                    wake(c)
            if tracker is not None:
                tracker.sync(t, i, kind, ids, False)
        elif kind == DATA:
            if tracker is not None:
                reads = [x for _, ins in elements for x in ins]
                writes = [x for outs, _ in elements for x in outs]
                tracker.data(t, i, reads, writes)
            for outs, ins in elements:
                mask, dup, order = values[ins[0]]
                for x in ins[1:]:
                    m2, d2, o2 = values[x]
                    dup |= d2 | (mask & m2)
                    mask |= m2
                    order = orders.add(order, o2) if order >= 0 and o2 >= 0 else -1
                for x in outs:
                    values[x] = (mask, dup, order)
        elif kind == NOP:
            if tracker is not None:
                tracker.sync(t, i, kind, (), False)
        else:  # BARRIER
            if not in_barrier[t]:
                key = (layout.tbs[t][0], ids[0])
                group = arrivals.setdefault(key, [])
                group.append((t, i))
                in_barrier[t] = True
                runnable[pos] = runnable[-1]
                runnable.pop()
                if len(group) == ids[1]:
                    del arrivals[key]
                    if tracker is not None:
                        tracker.barrier(group)
                    for member, _ in group:
                        in_barrier[member] = False
                        pc[member] += 1
                        if pc[member] < len(programs[member]):
                            runnable.append(member)
                continue
        pc[t] = i + 1
        if pc[t] == len(prog):
            runnable[pos] = runnable[-1]
            runnable.pop()
    blocked = tuple((t, pc[t]) for t in range(len(programs)) if pc[t] < len(programs[t]))
    waiting = tuple(
        tuple(c for c in programs[t][i][1]) if programs[t][i][0] != BARRIER else () for t, i in blocked
    )
    leftover = tuple((e, count[e] - expected[e]) for e in range(endpoints) if count[e] > expected[e])
    return Outcome(
        values=tuple(values),
        orders=orders,
        blocked=blocked,
        leftover_signals=leftover,
        lost_signals=tuple((e, n) for e, n in enumerate(lost) if n),
        semaphores=tuple(count[endpoints:]),
        waiting_on=waiting,
    )
