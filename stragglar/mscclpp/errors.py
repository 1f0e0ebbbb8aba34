"""What can go wrong with an MSCCL++ execution plan, as exceptions with one-line messages.

Writing one, :class:`MscclppExportError`: a schedule or option the lowering cannot turn into a plan
the executor takes.  Reading one, three families, so that a caller can tell them apart:

* :class:`PlanFormatError`: the text is not a plan the executor could load (not JSON, a missing
  key, a wrong type, an unknown op or buffer name).
* :class:`UnsupportedPlanError`: a plan the executor would load, but that uses something the
  prover does not model (another collective, packets, port or switch channels, pipelines, ...).
  The prover refuses it rather than guess.
* :class:`PlanViolationError`: a well-formed plan that is wrong (a race, a deadlock, a wrong sum,
  an index out of range, an executor limit); it carries the :class:`PlanViolation`.

All three derive from :class:`PlanError`; the first two are bad input (exit 2), the third a wrong
plan (exit 1), as everywhere in stragglar (:mod:`stragglar.errors`).  An export error is bad input
too.
"""

from __future__ import annotations

from dataclasses import dataclass

from stragglar.errors import IncorrectError, InputError, StragglarError

__all__ = [
    "MscclppExportError",
    "PlanError",
    "PlanFormatError",
    "PlanViolation",
    "PlanViolationError",
    "UnsupportedPlanError",
]

# Violation kinds, from the checks of stragglar.mscclpp.prover.read and stragglar.mscclpp.prover.prove.
KINDS = (
    "structure",  # an index out of range, a tb id out of order, operands that do not match
    "limit",  # an executor limit (ops, channels, buffers per thread block)
    "bounds",  # a chunk range outside its buffer
    "deadlock",  # some thread block waits forever
    "raw",  # a read not ordered after the write it may see
    "waw",  # two writes to one chunk not ordered
    "war",  # a write not ordered after a read of the same chunk
    "early-access",  # a peer touches a GPU's memory before that GPU is known to have started
    "late-access",  # a peer's access to a GPU's memory not known complete when that GPU finishes
    "unmatched-signal",  # a signal nobody waits for (it would release a wait of the next launch)
    "semaphore",  # a device semaphore that does not end at its initial value
    "result",  # a chunk that does not hold every GPU's contribution exactly once
)


@dataclass(frozen=True, slots=True)
class PlanViolation:
    """The first problem found: its kind, where (gpu, thread block, op index; -1 if not one place), what."""

    kind: str
    gpu: int
    tb: int
    op: int
    message: str

    def __str__(self) -> str:
        return self.message


class MscclppExportError(InputError):
    """A schedule or option the plan cannot take; the one-line message names the limit and the way out."""


class PlanError(StragglarError):
    """Anything wrong with a plan text; the message is one line."""


class PlanFormatError(PlanError, InputError):
    """The text is not a loadable MSCCL++ execution plan."""


class UnsupportedPlanError(PlanError, InputError):
    """A loadable plan that uses an op, channel type or collective the prover does not model."""


class PlanViolationError(PlanError, IncorrectError):
    """A well-formed plan that is wrong; ``violation`` says where and how."""

    def __init__(self, violation: PlanViolation) -> None:
        super().__init__(violation.message)
        self.violation = violation
