"""What can go wrong with MSCCL XML, as exceptions with one-line messages.

Three families, so that a caller can tell them apart:

* :class:`MscclExportError`: a schedule or option the lowering cannot turn into a file the
  executor takes (too many GPUs, a bad name, a limit of the executor).
* :class:`MscclFormatError`: a file the executor would not load at all (bad XML, a missing
  attribute, a limit).
* :class:`MscclVerificationError`: a file that loads but is not a correct AllReduce; it carries
  every :class:`MscclViolation` found (a format error does too).

The first two are bad input (exit 2), the third a wrong file (exit 1), as everywhere in stragglar
(:mod:`stragglar.errors`).
"""

from __future__ import annotations

from dataclasses import dataclass

from stragglar.errors import IncorrectError, InputError

__all__ = [
    "MALFORMED",
    "MscclExportError",
    "MscclFormatError",
    "MscclVerificationError",
    "MscclViolation",
]

MALFORMED = ("syntax", "format")  # violation kinds of a file the executor would not load


class MscclExportError(InputError):
    """A schedule or option the executor cannot take; the one-line message names the limit and the fix."""


@dataclass(frozen=True)
class MscclViolation:
    """Why an MSCCL file is rejected, with the GPU, thread block, step and chunk where known."""

    kind: str
    gpu: int | None
    tb: int | None
    step: int | None
    chunk: int | None
    message: str

    def __str__(self) -> str:
        return self.message


class MscclVerificationError(IncorrectError):
    """Raised by :func:`~stragglar.msccl.prove` for a file that loads but is not a correct AllReduce
    (exit 1): ``.violation`` is the first problem, ``.violations`` all found."""

    def __init__(self, violations: list[MscclViolation]) -> None:
        super().__init__(violations[0].message)
        self.violation = violations[0]
        self.violations = tuple(violations)


class MscclFormatError(MscclVerificationError, InputError):
    """A file the executor would not load at all (bad XML, a missing attribute, a limit): exit 2."""

    exit_code = InputError.exit_code
