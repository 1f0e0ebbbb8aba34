"""Describe an MSCCL XML file for ``stragglar show``: GPUs, thread blocks, steps, peers.

The description is of the program as the executor loads it (:func:`~stragglar.msccl.prover.read.read`),
so a file it would not load is described by its first problem.

>>> print(describe('<algo name="x" proto="Simple" ngpus="2" inplace="1" '
...     'outofplace="0" minBytes="0" maxBytes="0"></algo>'))
not readable: line 1: <algo> lacks attributes coll, nchannels, nchunksperloop
"""

from __future__ import annotations

from stragglar.errors import shown
from stragglar.msccl.prover.parsed import XmlSource
from stragglar.msccl.prover.read import read
from stragglar.units import count_of

__all__ = ["describe"]


def describe(source: XmlSource) -> str:
    """The program of a readable MSCCL file (its text or document) GPU by GPU: its thread blocks,
    steps and buffers."""
    document = read(source)
    algo = document.algo
    if algo is None:
        return f"not readable: {document.violations[0].message}"
    lines = [
        f"{shown(algo.name)}: {count_of(algo.ngpus, 'GPU')}, {count_of(algo.nchunks, 'chunk')} per loop, "
        f"{count_of(algo.nchannels, 'channel')}, {algo.proto}"
    ]
    for gpu in algo.gpus:
        steps = sum(len(tb.tx_at) for tb in gpu.tbs)
        peers = sorted({p for tb in gpu.tbs for p in (tb.send, tb.recv) if p >= 0})
        lines.append(
            f"  gpu {gpu.id}: {len(gpu.tbs)} thread blocks, {steps} steps, {gpu.chunks['s']} scratch chunks, "
            f"peers {_ranges(peers)}"
        )
    return "\n".join(lines)


def _ranges(numbers: list[int]) -> str:
    """``0-3,6``: sorted numbers with consecutive runs joined."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) or "none"
