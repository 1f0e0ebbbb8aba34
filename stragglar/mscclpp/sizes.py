"""Which buffer sizes an MSCCL++ execution plan accepts, and why a size is refused.

The executor (``ExecutionPlan::Impl::checkMessageSize`` in ``src/core/executor/execution_plan.cc``)
cuts a buffer of ``size`` bytes into ``input_chunks`` equal chunks and throws unless

* ``size`` is a multiple of ``buffer_alignment`` and ``size / buffer_alignment`` is a multiple of
  the chunk count, i.e. ``size`` is a multiple of ``buffer_alignment x chunks`` bytes, and
* ``min_message_size <= size <= max_message_size``.

With C = N - 1 = 7 chunks and 16-byte alignment that excludes every power-of-two size.

One more bound the executor does not check: chunk offsets and sizes are kept in 32-bit fields, so
the end of the last chunk of every buffer an op names (input, output, and scratch, which has
``scratch_chunks`` chunks of the same size) must stay below 2^32 bytes or it silently wraps.
:func:`offset_limit` is the largest size that is safe; plans written by
:func:`stragglar.mscclpp.lower` use it as their ``max_message_size``.

The fields themselves are read as the prover reads them
(:func:`~stragglar.mscclpp.vocabulary.size_fields`: values the executor would misread, and
alignments the kernel cannot address, are refused), and a window in which the executor runs the
plan on no size at all is refused by the prover and the exporter alike
(:meth:`SizeRule.window_problem`).  :meth:`SizeRule.decide` names, for a size it refuses, the
nearest sizes it accepts.

>>> rule = SizeRule(buffer_alignment=16, chunks=7, min_message_size=112, max_message_size=1 << 30)
>>> rule.decide(1 << 20).used
False
>>> rule.decide(7 << 20).reason
'used: 7340032 bytes is a multiple of 112 (16-byte alignment x 7 chunks) within [112, 1073741824]'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stragglar.mscclpp.document import PlanSource, plan_document
from stragglar.mscclpp.errors import PlanFormatError
from stragglar.mscclpp.vocabulary import UINT32_LIMIT, UINT64_MAX, size_fields, window_problem

__all__ = ["SizeDecision", "SizeRule", "offset_limit", "size_rule", "will_use"]


@dataclass(frozen=True, slots=True)
class SizeDecision:
    """Whether a plan runs for a buffer size, with the one-line reason."""

    used: bool
    reason: str


@dataclass(frozen=True, slots=True)
class SizeRule:
    """The size fields of a plan: a size is used iff it is a multiple of ``step`` inside the window.

    ``max_scratch_chunks`` (largest ``scratch_chunks`` over the GPUs) only feeds the 32-bit
    offset bound.
    """

    buffer_alignment: int
    chunks: int
    min_message_size: int
    max_message_size: int
    max_scratch_chunks: int = 0

    @property
    def step(self) -> int:
        """Sizes must be multiples of this many bytes."""
        return self.buffer_alignment * self.chunks

    @property
    def safe(self) -> int:
        """The largest size whose chunk offsets fit 32 bits (:func:`offset_limit`)."""
        return offset_limit(self.buffer_alignment, self.chunks, self.max_scratch_chunks)

    def describe(self) -> str:
        """The rule in one line, for ``show``."""
        top = "2^64-1" if self.max_message_size == UINT64_MAX else str(self.max_message_size)
        return (
            f"multiples of {self.step} bytes ({self.buffer_alignment}-byte alignment x {self.chunks} chunks) "
            f"from {self.min_message_size} to {top} bytes"
        )

    def decide(self, nbytes: int) -> SizeDecision:
        """Would the executor run this plan on a buffer of ``nbytes`` bytes?  The first reason it
        would not, the window's top before the step (a size past it is past every usable one)."""
        step = self.step
        if nbytes <= 0:
            return SizeDecision(False, f"not used: {nbytes} bytes is not a positive size")
        # too large first: the nearest usable size is the largest, whatever the step
        if nbytes > self.max_message_size:
            return SizeDecision(
                False,
                f"not used: {nbytes} bytes is above max_message_size {self.max_message_size}"
                + self._edge(largest=True),
            )
        safe = self.safe
        if nbytes > safe:
            return SizeDecision(
                False,
                f"not used: {nbytes} bytes overflows the executor's 32-bit chunk offsets "
                f"({max(self.chunks, self.max_scratch_chunks)} chunks of {nbytes // self.chunks} bytes); "
                f"at most {safe}",
            )
        if nbytes % step:
            return SizeDecision(
                False,
                f"not used: {nbytes} bytes is not a multiple of {step} "
                f"({self.buffer_alignment}-byte alignment x {self.chunks} chunks); {self._nearest(nbytes)}",
            )
        if nbytes < self.min_message_size:
            return SizeDecision(
                False,
                f"not used: {nbytes} bytes is below min_message_size {self.min_message_size}"
                + self._edge(largest=False),
            )
        return SizeDecision(
            True,
            f"used: {nbytes} bytes is a multiple of {step} ({self.buffer_alignment}-byte alignment x "
            f"{self.chunks} chunks) within [{self.min_message_size}, {self.max_message_size}]",
        )

    def usable(self) -> tuple[int, int] | None:
        """The smallest and the largest size :meth:`decide` accepts, or None if it accepts none."""
        step = self.step
        low = -(-max(self.min_message_size, 1) // step) * step
        top = min(self.max_message_size, self.safe)
        high = top - top % step
        return (low, high) if low <= high else None

    def window_problem(self) -> str | None:
        """Why no buffer size selects the plan, or None: the executor's window holds no multiple
        of :attr:`step` (:func:`~stragglar.mscclpp.vocabulary.window_problem`), or every one it holds
        overflows the 32-bit chunk offsets.

        >>> print(SizeRule(16, 7, 300, 200).window_problem())
        no buffer size selects the plan: min_message_size 300 > max_message_size 200
        >>> SizeRule(16, 7, 1 << 33, 1 << 34).window_problem().endswith("offsets (at most 4294967264)")
        True
        """
        low, high = self.min_message_size, self.max_message_size
        problem = window_problem(self.buffer_alignment, self.chunks, low, high)
        if problem is not None or self.usable() is not None:
            return problem
        return (
            f"no buffer size selects the plan: every multiple of {self.step} bytes in [{low}, {high}] "
            f"overflows the 32-bit chunk offsets (at most {self.safe})"
        )

    def _edge(self, largest: bool) -> str:
        """``; nearest usable: 1048560``: the largest (or smallest) size :meth:`decide` accepts,
        for a size past that end of the window; nothing where it accepts none."""
        span = self.usable()
        return "" if span is None else f"; nearest usable: {span[1] if largest else span[0]}"

    def _nearest(self, nbytes: int) -> str:
        """``nearest usable: 1008 or 1056``: the usable sizes next to ``nbytes`` on either side,
        each one :meth:`decide` accepts."""
        span = self.usable()
        if span is None:
            return str(self.window_problem())
        low, high = span
        below = min(nbytes - nbytes % self.step, high)
        near = [size for size in (below, max(below + self.step, low)) if low <= size <= high]
        return f"nearest usable: {' or '.join(map(str, near))}"


def offset_limit(buffer_alignment: int, chunks: int, max_scratch_chunks: int = 0) -> int:
    """The largest multiple of ``buffer_alignment x chunks`` whose chunk ends all fit in 32 bits.

    >>> offset_limit(16, 7, 9)
    3340530032
    """
    span = max(chunks, max_scratch_chunks)
    chunk_bytes = UINT32_LIMIT // span // buffer_alignment * buffer_alignment
    return chunk_bytes * chunks


def size_rule(plan: PlanSource) -> SizeRule:
    """Read the size fields of a plan, its text or document, as the prover does
    (:func:`~stragglar.mscclpp.vocabulary.size_fields`).

    Raises :class:`stragglar.mscclpp.errors.PlanFormatError` when the text is not a plan.
    """
    obj = plan_document(plan).root
    if not isinstance(obj.get("gpus"), list) or not obj["gpus"]:
        raise PlanFormatError("not an MSCCL++ execution plan: no 'gpus' list")
    gpus = obj["gpus"]
    if not all(isinstance(g, dict) for g in gpus):
        raise PlanFormatError("every entry of 'gpus' must be an object")
    chunks = {_chunks(g, "input_chunks") for g in gpus}
    if len(chunks) != 1 or 0 in chunks:
        raise PlanFormatError(f"GPUs must agree on a positive input_chunks, got {sorted(chunks)}")
    fields = size_fields(obj)
    return SizeRule(
        buffer_alignment=fields.buffer_alignment,
        chunks=chunks.pop(),
        min_message_size=fields.min_message_size,
        max_message_size=fields.max_message_size,
        max_scratch_chunks=max(_chunks(g, "scratch_chunks") for g in gpus),
    )


def _chunks(gpu: dict[str, Any], key: str) -> int:
    value = gpu.get(key, 0)
    if type(value) is not int or value < 0:
        raise PlanFormatError(f"'{key}' must be a non-negative integer, got {json.dumps(value)[:40]}")
    return value


def will_use(plan: str | SizeRule, nbytes: int) -> SizeDecision:
    """Will MSCCL++ run this plan (JSON text or its rule) on a buffer of ``nbytes`` bytes, and why not."""
    rule = plan if isinstance(plan, SizeRule) else size_rule(plan)
    return rule.decide(nbytes)
