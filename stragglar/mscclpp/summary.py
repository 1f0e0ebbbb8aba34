"""Describe an MSCCL++ execution plan for ``stragglar show``: GPUs, thread blocks, ops, chunks, sizes.

A pure function of the text (or its parsed document) that works on any plan the executor could load,
also ones the prover refuses (packets, NVLS): it only counts, it does not resolve references or
prove anything.

>>> from stragglar.synth import synthesize
>>> from stragglar.mscclpp import lower
>>> from stragglar.verify import prove
>>> print(summarize(lower(prove(synthesize("stragglar", 4))).text))
stragglar-n4-s3: allreduce, Simple, in-place, 4 GPUs
thread blocks: 4 (1 per GPU)
ops: 140 (signal 22, wait 30, nop 52, put 18, re 12, copy 6)
chunks: 3 input, 3 output, scratch 3-5 per GPU
sizes: multiples of 48 bytes (16-byte alignment x 3 chunks) from 48 to 2576980368 bytes
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from stragglar.errors import shown
from stragglar.mscclpp.document import PlanSource, plan_document
from stragglar.mscclpp.errors import PlanFormatError
from stragglar.mscclpp.sizes import SizeRule, size_rule

__all__ = ["PlanSummary", "describe", "summarize"]


@dataclass(frozen=True, slots=True)
class PlanSummary:
    """The counts ``show`` prints; ``ops`` lists (op name, count) by first appearance."""

    name: str
    collective: str
    protocol: str
    inplace: bool
    gpus: int
    threadblocks: tuple[int, ...]
    ops: tuple[tuple[str, int], ...]
    input_chunks: int
    output_chunks: int
    scratch_chunks: tuple[int, ...]
    rule: SizeRule

    def lines(self) -> list[str]:
        mode = "in-place" if self.inplace else "out-of-place"
        low, high = min(self.threadblocks), max(self.threadblocks)
        per_gpu = f"{low} per GPU" if low == high else f"{low}-{high} per GPU"
        total_ops = sum(n for _, n in self.ops)
        by_type = ", ".join(f"{name} {n:,}" for name, n in self.ops)
        s_low, s_high = min(self.scratch_chunks), max(self.scratch_chunks)
        scratch = f"{s_low}" if s_low == s_high else f"{s_low}-{s_high}"
        return [
            f"{shown(self.name)}: {self.collective}, {self.protocol}, {mode}, {self.gpus} GPUs",
            f"thread blocks: {sum(self.threadblocks):,} ({per_gpu})",
            f"ops: {total_ops:,} ({by_type})",
            f"chunks: {self.input_chunks} input, {self.output_chunks} output, scratch {scratch} per GPU",
            f"sizes: {self.rule.describe()}",
        ]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key, [])
    if not isinstance(value, list):
        raise PlanFormatError(f"{where}: '{key}' must be a list")
    return value


def summarize(plan: PlanSource) -> PlanSummary:
    """Count what a plan (its text or document) contains.  Raises
    :class:`~stragglar.mscclpp.errors.PlanFormatError` on text that is not a plan."""
    document = plan_document(plan)
    rule = size_rule(document)
    obj = document.root
    for key, kind in (("name", str), ("collective", str), ("protocol", str), ("inplace", bool)):
        if not isinstance(obj.get(key), kind):
            raise PlanFormatError(f"plan: '{key}' is missing or of the wrong type")
    counts: Counter[str] = Counter()
    per_gpu: list[int] = []
    scratch: list[int] = []
    for g, gpu in enumerate(obj["gpus"]):
        blocks = _list(gpu, "threadblocks", f"gpu {g}")
        per_gpu.append(len(blocks))
        scratch.append(gpu.get("scratch_chunks", 0))
        for t, tb in enumerate(blocks):
            if not isinstance(tb, dict):
                raise PlanFormatError(f"gpu {g} tb {t}: must be an object")
            for i, op in enumerate(_list(tb, "ops", f"gpu {g} tb {t}")):
                if not isinstance(op, dict) or not isinstance(op.get("name"), str):
                    raise PlanFormatError(f"gpu {g} tb {t} op {i}: must be an object with a 'name'")
                counts[op["name"]] += 1
                for inner in op.get("ops", []) if op["name"] == "pipeline" else []:
                    if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                        counts[inner["name"]] += 1
    first = obj["gpus"][0]
    return PlanSummary(
        name=obj["name"],
        collective=obj["collective"],
        protocol=obj["protocol"],
        inplace=obj["inplace"],
        gpus=len(obj["gpus"]),
        threadblocks=tuple(per_gpu),
        ops=tuple(counts.items()),
        input_chunks=rule.chunks,
        output_chunks=first.get("output_chunks", 0),
        scratch_chunks=tuple(scratch),
        rule=rule,
    )


def describe(source: PlanSource) -> str:
    """:func:`summarize`'s lines, as ``show`` prints them."""
    return str(summarize(source))
