"""Proofs with a name: a schedule's or an artifact's proof, or the command's one-line error that
names the file and its first problem; an export proved again from its own text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from stragglar.artifacts import ArtifactFormat, ExportOptions
from stragglar.commands.terminal import busy
from stragglar.errors import IncorrectError, InputError, StragglarError
from stragglar.schedule import Schedule
from stragglar.verify import Proof, VerificationError, prove
from stragglar.verify.report import ArtifactProof

__all__ = [
    "Exported",
    "artifact_error",
    "export_artifact",
    "lowered_artifact",
    "proved",
    "proved_artifact",
    "proved_export",
    "read_artifact",
]

_D = TypeVar("_D")


@dataclass(frozen=True)
class Exported:
    """An artifact's text and what its own prover proved of it."""

    text: str
    proof: ArtifactProof


def export_artifact(proof: Proof, fmt: ArtifactFormat[Any], options: ExportOptions) -> Exported:
    """Lower the proved schedule to ``fmt`` and prove the text itself."""
    return proved_export(fmt, lowered_artifact(proof, fmt, options))


def lowered_artifact(proof: Proof, fmt: ArtifactFormat[Any], options: ExportOptions) -> str:
    """The proved schedule lowered to ``fmt``'s text, not yet proved itself (:func:`proved_export`):
    a caller choosing among chunk counts lowers several and proves the one it keeps."""
    with busy(f"exporting {proof.num_ranks} GPUs in {proof.num_chunks} chunks to {fmt.title}"):
        return fmt.lower(proof, options)


def proved_export(fmt: ArtifactFormat[Any], text: str) -> Exported:
    """``text``, lowered to ``fmt``, with the proof of the text itself."""
    return Exported(text, proved_artifact(fmt, text, fmt.exported_name))


def proved(schedule: Schedule, name: str, prover: Callable[[Schedule], Proof] = prove) -> Proof:
    """The proof of ``schedule``; if it is wrong, an error naming it (``name``) and its first violation."""
    try:
        with busy(f"proving {name}"):
            return prover(schedule)
    except VerificationError as e:
        raise IncorrectError(f"{name} is not a correct AllReduce: {e.violation.message}") from None


def proved_artifact(fmt: ArtifactFormat[_D], source: str | _D, name: str) -> ArtifactProof:
    """The proof of an artifact of ``fmt``, its text or what ``fmt.read`` made of it, or an error
    naming it (``name``) and the first problem (:func:`artifact_error`)."""
    try:
        with busy(f"proving {name}"):
            return fmt.prove(source)
    except StragglarError as e:
        raise artifact_error(fmt, name, e) from None


def read_artifact(fmt: ArtifactFormat[_D], source: str | _D, name: str) -> _D:
    """The artifact's text read by ``fmt`` (a document made of it already is returned as it is),
    for its prover, description and size rule to share, or the error that proving the text would
    give.  Under a line of its own: ``show`` of the plan of 192 GPUs parsed it for 2.5 s between
    the reading's line and the proof's, showing nothing."""
    try:
        with busy(f"parsing {name}"):
            return fmt.read(source)
    except StragglarError as e:
        raise artifact_error(fmt, name, e) from None


def artifact_error(fmt: ArtifactFormat[Any], name: str, error: StragglarError) -> StragglarError:
    """The command's one-line error for what ``fmt``'s reader or prover raised about ``name``: a
    file it cannot read is bad input (exit 2), any other failure a wrong artifact (exit 1)."""
    if error.exit_code == InputError.exit_code:
        return InputError(f"{name} {fmt.unreadable}: {error}")
    return IncorrectError(f"{name} is not a correct AllReduce: {error}")
