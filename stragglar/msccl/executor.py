"""Prove an MSCCL XML AllReduce correct as the MSCCL executor runs it, from the file alone.

:func:`check_msccl` first reads the file with the executor's rules
(:mod:`stragglar.msccl.read`; every structural violation is reported), then runs it in the
executor's model (:mod:`stragglar.msccl.machine`, which says why one run decides every run): once
with happens-before inside each GPU, and again, for the GPUs where an access is not ordered so,
with clocks that follow messages through other GPUs (:mod:`stragglar.msccl.order`); a race is
reported only if that run confirms it.

>>> v = check_msccl('<algo name="x" proto="Simple"></algo>')
>>> print(v)
line 1: <algo> lacks attribute coll
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from stragglar.errors import IncorrectError, InputError
from stragglar.msccl.machine import ITERATIONS, Machine
from stragglar.msccl.order import batches
from stragglar.msccl.read import Algo, MscclViolation, read_msccl
from stragglar.verify.report import ArtifactProof

__all__ = [
    "MscclFormatError",
    "MscclProof",
    "MscclVerificationError",
    "MscclViolation",
    "check_msccl",
    "prove_msccl",
]


class MscclVerificationError(IncorrectError):
    """Raised by :func:`prove_msccl` for a file that loads but is not a correct AllReduce (exit 1):
    ``.violation`` is the first problem, ``.violations`` all found."""

    def __init__(self, violations: list[MscclViolation]) -> None:
        super().__init__(violations[0].message)
        self.violation = violations[0]
        self.violations = tuple(violations)


class MscclFormatError(MscclVerificationError, InputError):
    """A file the executor would not load at all (bad XML, a missing attribute, a limit): exit 2."""

    exit_code = InputError.exit_code


MALFORMED = ("syntax", "format")  # violation kinds of a file the executor would not load


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
        return f"{self.threadblocks} thread blocks, {self.steps} steps"

    @property
    def summary(self) -> str:
        """One line (under 200 characters): what file, what collective, how big."""
        channels = f"{self.channels} channel{'s' * (self.channels != 1)}"
        return (
            f"proved: {self.name}: {' and '.join(self.modes)} allreduce over {self.gpus} GPUs, "
            f"{self.chunks} chunks per loop, {self.brief}, {channels}, {self.proto}"
        )

    @property
    def details(self) -> str:
        """What the proof covers, for ``-v``."""
        return (
            f"{self.proto} ({self.capacity} chunks per connection), {ITERATIONS} pipeline iterations: no "
            "deadlock, no race, every send matched, every chunk on every GPU holds each GPU's "
            "contribution exactly once"
        )


def prove_msccl(text: str) -> MscclProof:
    """A :class:`MscclProof` for the MSCCL XML ``text``; raises :class:`MscclFormatError` for a
    file the executor would not load, :class:`MscclVerificationError` for one that is wrong."""
    start = time.perf_counter()
    algo, violations = read_msccl(text)
    if algo is None:
        malformed = [v for v in violations if v.kind in MALFORMED]
        if malformed:
            raise MscclFormatError(malformed + [v for v in violations if v.kind not in MALFORMED])
        raise MscclVerificationError(violations)
    modes = _modes(algo)
    for mode in modes:
        violation = _checked_run(algo, mode == "in-place")
        if violation is not None:
            raise MscclVerificationError([violation])
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
        warnings=algo.warnings,
    )


def check_msccl(text: str) -> MscclViolation | None:
    """The first problem of the MSCCL XML ``text``, or None if it is a proved AllReduce."""
    try:
        prove_msccl(text)
    except MscclVerificationError as e:
        return e.violation
    return None


def _checked_run(algo: Algo, inplace: bool) -> MscclViolation | None:
    """The first problem of one mode: a run ordering accesses within each GPU, then, for the GPUs
    where it found accesses not ordered so, runs that follow messages too (a few GPUs at a time,
    :func:`~stragglar.msccl.order.batches`).  A race they confirm came before anything the first
    run found after it (that run stops at its first other problem), so the earliest one wins."""
    first = Machine(algo, inplace)
    outcome = first.run()
    if not first.suspects:
        return outcome
    sizes = [len(gpu.tbs) for gpu in algo.gpus]
    races: list[tuple[int, MscclViolation]] = []
    for group in batches(sorted(first.suspects), sizes, len(first.tbs)):
        again = Machine(algo, inplace, group)
        found = again.run()
        if found is not None and found.kind == "race":
            races.append((again.moves, found))
    return min(races, key=lambda race: race[0])[1] if races else outcome


def _modes(algo: Algo) -> tuple[str, ...]:
    return tuple(m for m, on in (("in-place", algo.inplace), ("out-of-place", algo.outofplace)) if on)
