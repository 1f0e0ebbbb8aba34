"""The prover's records of an MSCCL XML file: the program as the executor stores it.

:func:`~stragglar.msccl.prover.read.read` fills these from the text alone (nops folded into
dependencies, consecutive ``re`` steps fused), so that the executor's model
(:mod:`~stragglar.msccl.prover.machine`) runs what the executor would run; nothing here comes from
the lowering.  An :class:`XmlDocument` is a file read once, for the prover and the description to
share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from stragglar.msccl.errors import MscclViolation
from stragglar.msccl.vocabulary import CAPACITY

__all__ = ["Algo", "Gpu", "ThreadBlock", "Tx", "XmlDocument", "XmlSource"]


@dataclass(frozen=True)
class Tx:
    """One transmission as the executor stores it; ``pos`` is its (last) step's position."""

    type: str
    pos: int
    deps: tuple[tuple[int, int], ...]  # (tb id, step position), waited for before the transmission
    srcbuf: str
    srcoffs: tuple[int, ...]  # several for fused ``re`` steps
    dstbuf: str
    dstoff: int
    cnt: int
    hasdep: bool


@dataclass(frozen=True)
class ThreadBlock:
    id: int
    send: int
    recv: int
    chan: int
    txs: tuple[Tx, ...]
    tx_at: tuple[int, ...]  # step position -> index in txs (-1 for a nop)


@dataclass(frozen=True)
class Gpu:
    id: int
    chunks: dict[str, int]  # buffer -> declared chunks
    tbs: tuple[ThreadBlock, ...]


@dataclass(frozen=True)
class Algo:
    name: str
    proto: str
    nchannels: int
    nchunks: int
    ngpus: int
    inplace: bool
    outofplace: bool
    gpus: tuple[Gpu, ...]
    warnings: tuple[str, ...] = ()  # what the executor runs otherwise than written, yet correctly

    @property
    def capacity(self) -> int:
        return CAPACITY[self.proto]


@dataclass(frozen=True)
class XmlDocument:
    """An MSCCL XML file read with the executor's rules: the program, or None and every violation
    found."""

    algo: Algo | None
    violations: tuple[MscclViolation, ...]


XmlSource: TypeAlias = str | XmlDocument  # an MSCCL XML file's text, or the document already read from it
