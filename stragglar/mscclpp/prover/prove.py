"""Prove an MSCCL++ execution plan (any plan, ours or not) from its JSON text.

:func:`prove` reads the text with the executor's rules (:mod:`stragglar.mscclpp.prover.read`),
runs it symbolically (:mod:`stragglar.mscclpp.prover.machine`) under ``interleavings`` seeded
random schedules of its thread blocks, and analyses the first run for happens-before
(:mod:`stragglar.mscclpp.prover.order`); :func:`check` says the same as a value.  It proves, or
reports the first violation of:

* no deadlock in any of the runs (a blocked wait is explained by the cycle of blocks waiting on
  each other, found with networkx, or by the signal nobody will send);
* no race: conflicting accesses to a chunk (read-after-write across GPUs or blocks, two writes, a
  write over a chunk a peer or another block still reads) are ordered by signal/wait, semaphores,
  barriers or nops; the analysis covers every interleaving, not only the ones run;
* a peer touches a GPU's memory only after that GPU has started the execution, and is known done
  before it ends, so back-to-back executions and a late straggler are safe;
* every signal is waited for and every device semaphore ends at its initial value (both persist
  into the next execution);
* at the end, in every run, every chunk on every GPU holds each GPU's contribution to that chunk
  exactly once (AllReduce, in place or out of place).

Only AllReduce on the Simple protocol over memory channels is modelled; see the reader for what is
refused as unsupported.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from stragglar.args import as_int
from stragglar.errors import InputError, shown
from stragglar.mscclpp.document import PlanSource
from stragglar.mscclpp.errors import PlanViolation, PlanViolationError
from stragglar.mscclpp.prover.machine import ACQUIRE, BARRIER, RELEASE, SIGNAL, WAIT, Layout, Outcome, run
from stragglar.mscclpp.prover.parsed import Plan
from stragglar.mscclpp.prover.read import read_plan
from stragglar.schedule import gc_paused
from stragglar.units import count_of
from stragglar.verify.orders import disagreement
from stragglar.verify.report import ArtifactProof

__all__ = ["DEFAULT_INTERLEAVINGS", "MAX_INTERLEAVINGS", "PlanProof", "check", "prove"]

DEFAULT_INTERLEAVINGS = 4
# Each interleaving is a whole run of the plan (0.15 ms for an 8-GPU plan, seconds for 192 GPUs):
# more than this is no proof a caller can wait for (10**30 ran until it was killed).
MAX_INTERLEAVINGS = 10_000


@dataclass(frozen=True, slots=True)
class PlanProof(ArtifactProof):
    """What was proved about a plan: the shared facts of :class:`ArtifactProof` and the mode, the
    most thread blocks of one GPU, the ops, the largest scratch buffer, the interleavings run, and
    the ``warnings``: where the GPUs end with a chunk added in different orders (correct, but
    their floating-point results differ in the last bits)."""

    inplace: bool
    max_threadblocks_per_gpu: int
    ops: int
    max_scratch_chunks: int
    interleavings: int
    warnings: tuple[str, ...] = ()

    @property
    def brief(self) -> str:
        """``16 thread blocks, 766 ops``: the size of the program proved."""
        return f"{self.threadblocks:,} thread blocks, {self.ops:,} ops"

    @property
    def summary(self) -> str:
        """One line (under 200 characters): which plan, what collective, how big."""
        mode = "in-place" if self.inplace else "out-of-place"
        return (
            f"proved: {shown(self.name)}: {mode} allreduce over {count_of(self.gpus, 'GPU')}, "
            f"{count_of(self.chunks, 'chunk')}, {self.brief}, "
            f"up to {count_of(self.max_threadblocks_per_gpu, 'thread block')} per GPU"
        )

    @property
    def details(self) -> str:
        """What the proof covers, for ``-v``."""
        return (
            f"scratch up to {self.max_scratch_chunks} chunks; {self.interleavings} interleavings and "
            "happens-before: no deadlock, no race, peers touch a GPU's memory only while it runs, every "
            "signal waited for, every chunk on every GPU holds each GPU's contribution exactly once"
        )


def check(plan: PlanSource, *, interleavings: int = DEFAULT_INTERLEAVINGS) -> PlanViolation | None:
    """The first violation of a well-formed plan, or None if it is proved.

    Raises :class:`~stragglar.mscclpp.errors.PlanFormatError` or
    :class:`~stragglar.mscclpp.errors.UnsupportedPlanError` for text it cannot prove anything about.
    """
    try:
        prove(plan, interleavings=interleavings)
    except PlanViolationError as exc:
        return exc.violation
    return None


def prove(source: PlanSource, *, interleavings: int = DEFAULT_INTERLEAVINGS) -> PlanProof:
    """Prove the plan (its text or document), or raise
    :class:`~stragglar.mscclpp.errors.PlanViolationError` (first violation)."""
    interleavings = as_int(interleavings, "interleavings", minimum=1)
    if interleavings > MAX_INTERLEAVINGS:
        raise InputError(f"interleavings must be at most {MAX_INTERLEAVINGS:,}, got {interleavings:,}")
    # The read plan, its layout and the happens-before clocks are millions of small acyclic records,
    # all alive until the proof is done: the collector's passes over them were a quarter of proving
    # 192 GPUs.  They are freed when _proved returns, still paused, so nothing is left to collect.
    with gc_paused():
        return _proved(source, interleavings)


def _proved(source: PlanSource, interleavings: int) -> PlanProof:
    """:func:`prove`'s work, its arguments checked."""
    from stragglar.mscclpp.prover.order import Found, HappensBefore  # numpy: only where a plan is proved

    start = time.perf_counter()
    plan = read_plan(source)
    _check_input_untouched(plan)
    layout = Layout.build(plan)
    checker = _Checker(layout)
    orders: str | None = None
    for seed in range(interleavings):
        tracker = HappensBefore(layout) if seed == 0 else None
        try:
            outcome = run(layout, seed, tracker)
        except Found as found:
            raise PlanViolationError(found.violation) from None
        checker.deadlock(outcome, seed)
        if tracker is not None:
            try:
                tracker.finish()
            except Found as found:
                raise PlanViolationError(found.violation) from None
            checker.leftovers(outcome)
        checker.result(outcome, seed)
        if tracker is not None:  # without races every run computes the same values: one speaks for all
            orders = checker.disagreement(outcome)
    per_gpu = [len(g.tbs) for g in plan.gpus]
    return PlanProof(
        name=plan.name,
        gpus=len(plan.gpus),
        chunks=plan.chunks,
        threadblocks=sum(per_gpu),
        seconds=time.perf_counter() - start,
        inplace=plan.inplace,
        max_threadblocks_per_gpu=max(per_gpu),
        ops=sum(len(p) for p in layout.programs),
        max_scratch_chunks=max(g.scratch_chunks for g in plan.gpus),
        interleavings=interleavings,
        warnings=(orders,) if orders is not None else (),
    )


def _check_input_untouched(plan: Plan) -> None:
    """An out-of-place AllReduce must leave the caller's input buffer as it was."""
    if plan.inplace:
        return
    for gpu in plan.gpus:
        for tb in gpu.tbs:
            for op in tb.ops:
                for ref in op.dst:
                    if ref.buffer == "i":
                        raise PlanViolationError(
                            PlanViolation(
                                "structure",
                                gpu.id,
                                tb.id,
                                op.index,
                                f"gpu {gpu.id} tb {tb.id} op {op.index} ({op.name}) writes GPU {ref.gpu}'s "
                                "input "
                                f"buffer in an out-of-place plan, whose input must stay unchanged",
                            )
                        )


class _Checker:
    """The end-of-run checks, with names for places."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.plan = layout.plan
        self.producers: dict[int, list[tuple[int, int]]] = defaultdict(list)
        partner = self.plan.partner
        for t, prog in enumerate(layout.programs):
            for i, (kind, ids, _, _) in enumerate(prog):
                if kind == SIGNAL:
                    for e in ids:
                        self.producers[partner[e]].append((t, i))
                elif kind == RELEASE:
                    for c in ids:
                        self.producers[c].append((t, i))

        n, chunks = len(self.plan.gpus), self.plan.chunks
        self.wanted = [sum(1 << (r * chunks + c) for r in range(n)) for c in range(chunks)]

    def name(self, t: int, i: int) -> str:
        g, tb = self.layout.tbs[t]
        return f"gpu {g} tb {tb} op {i} ({self.plan.gpus[g].tbs[tb].ops[i].name})"

    def fail(self, kind: str, t: int, i: int, message: str) -> PlanViolationError:
        g, tb = self.layout.tbs[t] if t >= 0 else (-1, -1)
        return PlanViolationError(PlanViolation(kind, g, tb, i, message))

    def counter(self, c: int) -> str:
        endpoints = len(self.plan.partner)
        if c < endpoints:
            g, j, peer = self.plan.endpoint_owner[c]
            return f"its memory channel {j} (to GPU {peer})"
        g = max(k for k, base in enumerate(self.layout.sem_base) if base <= c)
        return f"device semaphore {c - self.layout.sem_base[g]}"

    def deadlock(self, outcome: Outcome, seed: int) -> None:
        if not outcome.blocked:
            return
        import networkx as nx  # here, not at the top: only a stuck plan pays for its import

        pc = dict(outcome.blocked)
        graph: nx.DiGraph = nx.DiGraph()
        for (t, i), waits in zip(outcome.blocked, outcome.waiting_on, strict=True):
            kind = self.layout.programs[t][i][0]
            if kind == BARRIER:
                gpu = self.layout.tbs[t][0]
                others = [u for u in pc if self.layout.tbs[u][0] == gpu and u != t]
                graph.add_edges_from((t, u) for u in others if self.layout.programs[u][pc[u]][0] != BARRIER)
                continue
            assert kind in (WAIT, ACQUIRE)
            for c in waits:
                graph.add_edges_from((t, p) for p, j in self.producers.get(c, []) if p in pc and j >= pc[p])
        run_name = f"in interleaving {seed}"
        try:
            cycle = nx.find_cycle(graph)
        except nx.NetworkXNoCycle:
            t, i = next((t, i) for (t, i) in outcome.blocked if t not in graph or graph.out_degree(t) == 0)
            waits = dict(zip((t for t, _ in outcome.blocked), outcome.waiting_on, strict=True))[t]
            what = ", ".join(self.counter(c) for c in waits) or "the other blocks of its barrier"
            raise self.fail(
                "deadlock",
                t,
                i,
                f"deadlock {run_name}: {self.name(t, i)} waits on {what} for a signal no block will send",
            ) from None
        chain = " -> ".join(self.name(u, pc[u]) for u, _ in cycle)
        t0 = cycle[0][0]
        raise self.fail(
            "deadlock",
            t0,
            pc[t0],
            f"deadlock {run_name}: {chain} -> back to the first, each waiting for the next",
        )

    def leftovers(self, outcome: Outcome) -> None:
        for e, n in outcome.lost_signals:
            g, j, peer = self.plan.endpoint_owner[e]
            t, i = next(
                (t, i)
                for t, prog in enumerate(self.layout.programs)
                for i, s in enumerate(prog)
                if s[0] == SIGNAL and e in s[1]
            )
            raise self.fail(
                "unmatched-signal",
                t,
                i,
                f"{self.name(t, i)} signals on memory channel {j} of GPU {g}, which GPU {peer} has no "
                "channel to "
                f"pair with ({n} signal(s) lost)",
            )
        for e, n in outcome.leftover_signals:
            t, i = self.producers[e][-1]
            g, j, peer = self.plan.endpoint_owner[e]
            raise self.fail(
                "unmatched-signal",
                t,
                i,
                f"{n} signal(s) to GPU {g} on {self.counter(e)} are never waited for (the last by "
                f"{self.name(t, i)}); "
                f"they would release a wait of the next execution early",
            )
        for k, (value, init) in enumerate(zip(outcome.semaphores, self.layout.sem_init, strict=True)):
            if value != init:
                c = len(self.plan.partner) + k
                g = max(x for x, base in enumerate(self.layout.sem_base) if base <= c)
                raise PlanViolationError(
                    PlanViolation(
                        "semaphore",
                        g,
                        -1,
                        -1,
                        f"gpu {g} device semaphore {c - self.layout.sem_base[g]} ends at {value}, not its "
                        "initial "
                        f"{init}: the next execution would start from the wrong value",
                    )
                )

    def disagreement(self, outcome: Outcome) -> str | None:
        """Where two GPUs end with one chunk added in different orders (a proved run's values)."""
        buffer, chunks = "i" if self.plan.inplace else "o", self.plan.chunks
        starts = [self.layout.base[gpu.id][buffer] for gpu in self.plan.gpus]
        ends = [[outcome.values[start + c][2] for c in range(chunks)] for start in starts]
        return disagreement(outcome.orders, ends, "gpus")

    def result(self, outcome: Outcome, seed: int) -> None:
        n = len(self.plan.gpus)
        chunks = self.plan.chunks
        garbage = 1 << (n * chunks)
        buffer = "i" if self.plan.inplace else "o"
        for gpu in range(n):
            start = self.layout.base[gpu][buffer]
            for c in range(chunks):
                mask, dup, _ = outcome.values[start + c]
                want = self.wanted[c]
                if mask == want and not dup:
                    continue
                problems = []
                if mask & garbage:
                    problems.append("holds data nobody wrote (uninitialized scratch or output)")
                missing = [r for r in range(n) if not mask >> (r * chunks + c) & 1]
                if missing:
                    problems.append(f"misses the contributions of GPUs {missing}")
                twice = [(r, k) for r in range(n) for k in range(chunks) if dup >> (r * chunks + k) & 1]
                if twice:
                    problems.append(
                        "counts "
                        + ", ".join(f"GPU {r}'s chunk {k}" for r, k in twice[:4])
                        + " more than once"
                    )
                foreign = [
                    (r, k) for r in range(n) for k in range(chunks) if k != c and mask >> (r * chunks + k) & 1
                ]
                if foreign:
                    problems.append("holds " + ", ".join(f"GPU {r}'s chunk {k}" for r, k in foreign[:4]))
                raise PlanViolationError(
                    PlanViolation(
                        "result",
                        gpu,
                        -1,
                        -1,
                        f"gpu {gpu} {buffer}[{c}] is wrong in interleaving {seed}: " + "; ".join(problems),
                    )
                )
