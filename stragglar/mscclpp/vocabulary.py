"""MSCCL++ execution plans' own vocabulary, shared by the lowering and the prover: what the executor
accepts, stated once.

These are facts about the executor (``execution_common.hpp``, ``execution_plan.cc``,
``execution_kernel.hpp`` in microsoft/mscclpp), not about our lowering: the lowering cuts its thread
blocks to these limits and the prover refuses plans that break them, so both name the same
numbers from here.

The executor's rules for the size fields are here too, for the prover, the size rule
(:mod:`stragglar.mscclpp.sizes`) and the lowering: :func:`size_fields` reads them as the executor
does (``buffer_alignment`` into a ``uint32_t``, the sizes into ``size_t``: a JSON number outside
those types would silently be another value) and refuses an alignment that is not a multiple of 16
bytes, since the kernel addresses chunks in 16-byte vectors (``offset / sizeof(int4)`` in
``execution_kernel.hpp``) and would read and write such chunks at the wrong place;
:func:`window_problem` says when the executor's ``checkMessageSize`` accepts no size at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stragglar.mscclpp.errors import PlanFormatError

__all__ = [
    "BUFFERS",
    "CHANNEL_TYPES",
    "EXECUTOR_OPS",
    "MAX_BUFFERS_PER_OPERATION",
    "MAX_CHANNEL",
    "MAX_CHANNEL_PER_OPERATION",
    "MAX_DEVICE_SEMAPHORES",
    "MAX_DEVICE_SYNCERS",
    "MAX_OPERATION",
    "UINT32_LIMIT",
    "UINT64_MAX",
    "VECTOR_BYTES",
    "SizeFields",
    "alignment_problem",
    "size_fields",
    "window_problem",
]

# execution_common.hpp
MAX_OPERATION = 64  # ops of one thread block; the executor throws beyond it
MAX_CHANNEL = 16  # memory channels, and remote memory buffers, of one thread block
MAX_CHANNEL_PER_OPERATION = 8
MAX_BUFFERS_PER_OPERATION = 2 + 8
MAX_DEVICE_SYNCERS = 16
MAX_DEVICE_SEMAPHORES = 16

EXECUTOR_OPS = frozenset(
    [
        "nop",
        "barrier",
        "put",
        "pws",
        "pwsf",
        "get",
        "copy",
        "signal",
        "wait",
        "flush",
        "re",
        "res",
        "rre",
        "rres",
        "ppkt",
        "rppkt",
        "respkt",
        "cpkt",
        "upkt",
        "repkt",
        "recpkt",
        "recspkt",
        "glres",
        "gstore",
        "gstorepkt",
        "rlxsignal",
        "rlxwait",
        "pipeline",
        "sem_acquire",
        "sem_release",
    ]
)  # every op name the executor knows ("Invalid operation type" for any other)
BUFFERS = ("i", "o", "s")
CHANNEL_TYPES = ("memory", "port", "switch", "none")

UINT32_LIMIT = (1 << 32) - 1  # the largest value of a uint32_t: buffer_alignment, chunk offsets
UINT64_MAX = (1 << 64) - 1  # the largest size_t: the executor's default max_message_size
VECTOR_BYTES = 16  # the kernel moves and reduces int4 vectors: chunks must start at multiples of this


@dataclass(frozen=True, slots=True)
class SizeFields:
    """A plan's size fields as the executor reads them (defaults 16, 0 and 2^64-1)."""

    buffer_alignment: int
    min_message_size: int
    max_message_size: int


def size_fields(root: dict[str, Any]) -> SizeFields:
    """The size fields of a plan's top level.

    Raises :class:`~stragglar.mscclpp.errors.PlanFormatError` for a value the executor would read
    as another (not an integer, negative, beyond its C++ type) and for an alignment the kernel
    cannot address (:func:`alignment_problem`).

    >>> size_fields({"buffer_alignment": 32}).max_message_size == UINT64_MAX
    True
    """
    values: list[int] = []
    for key, default in (("buffer_alignment", 16), ("min_message_size", 0), ("max_message_size", UINT64_MAX)):
        value = root.get(key, default)
        if type(value) is not int or not 0 <= value <= UINT64_MAX:
            raise PlanFormatError(
                f"plan: '{key}' must be an integer from 0 to 2^64-1 (the executor keeps it in 64 bits), "
                f"got {json.dumps(value)[:40]}"
            )
        values.append(value)
    problem = alignment_problem(values[0], "'buffer_alignment'")
    if problem is not None:
        raise PlanFormatError(f"plan: {problem}")
    return SizeFields(*values)


def alignment_problem(alignment: int, name: str = "buffer_alignment") -> str | None:
    """Why a plan with this ``buffer_alignment`` cannot run as written, or None; ``name`` is how
    the message names the field.

    >>> alignment_problem(32) is None, alignment_problem(3).endswith("got 3")
    (True, True)
    """
    if 0 < alignment <= UINT32_LIMIT and alignment % VECTOR_BYTES == 0:
        return None
    return (
        f"{name} must be a positive multiple of {VECTOR_BYTES} below 2^32 (a uint32_t; the "
        f"kernel addresses chunks in {VECTOR_BYTES}-byte vectors), got {alignment}"
    )


def window_problem(alignment: int, chunks: int, low: int, high: int) -> str | None:
    """Why the executor runs a plan of ``chunks`` input chunks on no buffer size, or None.

    ``checkMessageSize`` takes a size that is a multiple of ``alignment x chunks`` bytes within
    ``[low, high]`` (``min_message_size``, ``max_message_size``); a plan whose window holds none
    loads and is never run.

    >>> print(window_problem(16, 7, 113, 223))
    no buffer size selects the plan: no multiple of 112 bytes (16-byte alignment x 7 chunks) in [113, 223]
    """
    if low > high:
        return f"no buffer size selects the plan: min_message_size {low} > max_message_size {high}"
    step = alignment * chunks
    if -(-max(low, 1) // step) * step <= high:
        return None
    return (
        f"no buffer size selects the plan: no multiple of {step} bytes ({alignment}-byte alignment x "
        f"{chunks} chunks) in [{low}, {high}]"
    )
