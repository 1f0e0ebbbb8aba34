"""Prove an MSCCL XML AllReduce correct as the MSCCL executor runs it, from the file alone.

:func:`prove` first reads the file with the executor's rules
(:mod:`stragglar.msccl.prover.read`; every structural violation is reported), then runs it in the
executor's model (:mod:`stragglar.msccl.prover.machine`, which says why one run decides every run):
once with happens-before inside each GPU, and again, for the GPUs where an access is not ordered
so, with clocks that follow messages through other GPUs (:mod:`stragglar.msccl.prover.order`); a
race is reported only if that run confirms it.  :func:`check` says the same as a value.

>>> v = check('<algo name="x" proto="Simple" ngpus="2" inplace="1" '
...     'outofplace="0" minBytes="0" maxBytes="0"></algo>')
>>> print(v)
line 1: <algo> lacks attributes coll, nchannels, nchunksperloop
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from stragglar.errors import shown
from stragglar.msccl.errors import MALFORMED, MscclFormatError, MscclVerificationError, MscclViolation
from stragglar.msccl.prover.machine import ITERATIONS, Machine
from stragglar.msccl.prover.order import batches
from stragglar.msccl.prover.parsed import Algo, XmlSource
from stragglar.msccl.prover.read import read
from stragglar.schedule import gc_paused
from stragglar.units import count_of
from stragglar.verify.report import ArtifactProof

__all__ = ["MscclProof", "check", "prove"]


@dataclass(frozen=True, slots=True)
class MscclProof(ArtifactProof):
    """What was proved about one MSCCL file: the shared facts of :class:`ArtifactProof` and the
    protocol, its connection ``capacity`` in chunks, the ``channels``, the ``steps`` of all thread
    blocks, the modes (in-place, out-of-place) it was proved in, and the ``warnings`` of the reader
    (what the executor runs otherwise than written, yet correctly)."""

    proto: str
    capacity: int
    channels: int
    steps: int
    modes: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    @property
    def brief(self) -> str:
        """``94 thread blocks, 196 steps``: the size of the program proved."""
        return f"{self.threadblocks:,} thread blocks, {self.steps:,} steps"

    @property
    def summary(self) -> str:
        """One line (under 200 characters): what file, what collective, how big."""
        channels = f"{self.channels} channel{'s' * (self.channels != 1)}"
        return (
            f"proved: {shown(self.name)}: {' and '.join(self.modes)} allreduce over "
            f"{count_of(self.gpus, 'GPU')}, {count_of(self.chunks, 'chunk')} per loop, {self.brief}, "
            f"{channels}, {self.proto}"
        )

    @property
    def details(self) -> str:
        """What the proof covers, for ``-v``."""
        return (
            f"{self.proto} ({self.capacity} chunks per connection), {ITERATIONS} pipeline iterations: no "
            "deadlock, no race, every send matched, every chunk on every GPU holds each GPU's "
            "contribution exactly once"
        )


def prove(source: XmlSource) -> MscclProof:
    """A :class:`MscclProof` for an MSCCL XML file, its text or document; raises
    :class:`~stragglar.msccl.errors.MscclFormatError` for a file the executor would not load,
    :class:`~stragglar.msccl.errors.MscclVerificationError` for one that is wrong."""
    # The parsed file and each run's clocks and accesses are millions of small acyclic records, all
    # alive until the proof is done: the collector's passes over them were a third of proving 128
    # GPUs.  They are freed when _proved returns, still paused, so nothing is left to collect.
    with gc_paused():
        return _proved(source)


def _proved(source: XmlSource) -> MscclProof:
    """:func:`prove`'s work."""
    start = time.perf_counter()
    document = read(source)
    algo, violations = document.algo, list(document.violations)
    if algo is None:
        malformed = [v for v in violations if v.kind in MALFORMED]
        if malformed:
            raise MscclFormatError(malformed + [v for v in violations if v.kind not in MALFORMED])
        raise MscclVerificationError(violations)
    modes = _modes(algo)
    orders: list[str] = []
    for mode in modes:
        violation, disagreement = _checked_run(algo, mode == "in-place")
        if violation is not None:
            raise MscclVerificationError([violation])
        if disagreement is not None and disagreement not in orders:
            orders.append(disagreement)
    tbs = [tb for gpu in algo.gpus for tb in gpu.tbs]
    return MscclProof(
        name=algo.name,
        gpus=algo.ngpus,
        chunks=algo.nchunks,
        threadblocks=len(tbs),
        seconds=time.perf_counter() - start,
        proto=algo.proto,
        capacity=algo.capacity,
        channels=algo.nchannels,
        steps=sum(len(tb.tx_at) for tb in tbs),
        modes=modes,
        warnings=algo.warnings + tuple(orders),
    )


def check(source: XmlSource) -> MscclViolation | None:
    """The first problem of an MSCCL XML file (its text or document), or None if it is a proved
    AllReduce."""
    try:
        prove(source)
    except MscclVerificationError as e:
        return e.violation
    return None


def _checked_run(algo: Algo, inplace: bool) -> tuple[MscclViolation | None, str | None]:
    """The first problem of one mode, and where its GPUs add a chunk in different orders: a run
    ordering accesses within each GPU, then, for the GPUs where it found accesses not ordered so,
    runs that follow messages too (a few GPUs at a time, :func:`~stragglar.msccl.prover.order.batches`).
    A race they confirm came before anything the first run found after it (that run stops at its
    first other problem), so the earliest one wins; without one, the first run's values are the
    executor's, orders included."""
    first = Machine(algo, inplace)
    outcome = first.run()
    sizes = [len(gpu.tbs) for gpu in algo.gpus]
    races: list[tuple[int, MscclViolation]] = []
    for group in batches(sorted(first.suspects), sizes, len(first.tbs)):
        again = Machine(algo, inplace, group)
        found = again.run()
        if found is not None and found.kind == "race":
            races.append((again.moves, found))
    if races:
        return min(races, key=lambda race: race[0])[1], None
    return outcome, first.disagreement() if outcome is None else None


def _modes(algo: Algo) -> tuple[str, ...]:
    return tuple(m for m, on in (("in-place", algo.inplace), ("out-of-place", algo.outofplace)) if on)
