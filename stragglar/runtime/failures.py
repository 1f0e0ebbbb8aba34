"""The runtime's failure words: what a rank that could not finish its part says, and why.

A launcher summarises many ranks' failures in one line, so a failure is not only a message but
fields (:class:`RankError`): the reason (:func:`classify` reads it off an engine's exception:
``timed out``, ``lost the connection`` or ``failed``), the round and phase, the peer to blame.
Every transport and the header check build their errors here, in the same words.
"""

from __future__ import annotations

from typing import Any

from stragglar.errors import InputError, RunError
from stragglar.runtime.program import BoundStep, Plan

__all__ = [
    "CHECKING",
    "RankError",
    "checking_error",
    "classify",
    "error_line",
    "failure_phrase",
    "first_line",
    "step_error",
]

CHECKING = "checking that every rank runs the same allreduce"  # what a rank does in the header check


class RankError(RunError):
    """A rank could not finish its part: a peer died, never arrived, or timed out.

    Besides the message, the fields say what happened where, so a launcher can summarise many
    ranks' failures in one line: ``reason`` (``"timed out"``, ``"lost the connection"``,
    ``"failed"``), the ``round`` (numbered within its phase, as in the verifier's messages) and
    ``phase`` it happened in (None outside the rounds, then
    ``during`` says what the rank was doing), and the ``peer`` it was ``waiting`` for
    (``"waiting for"`` a receive, ``"sending to"`` a send) when one peer is to blame.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        reason: str = "failed",
        round: int | None = None,
        phase: str | None = None,
        peer: int | None = None,
        waiting: str = "waiting for",
        during: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.reason = reason
        self.round = round
        self.phase = phase
        self.peer = peer
        self.waiting = waiting
        self.during = during

    def __reduce__(self) -> tuple[Any, ...]:  # keyword fields survive pickling (process pools)
        return (_rank_error, (str(self), self.fields()))

    def fields(self) -> dict[str, Any]:
        """The structured fields, as plain data (what a rank process sends its launcher)."""
        keys = ("rank", "reason", "round", "phase", "peer", "waiting", "during")
        return {k: getattr(self, k) for k in keys}

    @property
    def what(self) -> str:
        """``timed out in round 5 (phase 'exchange') waiting for rank 2``: the fields in words."""
        return failure_phrase(self.reason, self.round, self.phase, self.peer, self.waiting, self.during)


def _rank_error(message: str, fields: dict[str, Any]) -> RankError:
    return RankError(message, **fields)


def failure_phrase(
    reason: str,
    round: int | None = None,
    phase: str | None = None,
    peer: int | None = None,
    waiting: str = "waiting for",
    during: str | None = None,
) -> str:
    """A failure in words, without the rank: see :attr:`RankError.what`."""
    text = reason
    if round is not None:
        text += f" in round {round}" + (f" (phase {phase!r})" if phase is not None else "")
    elif during:
        text += f" {during}"
    if peer is not None:
        text += f" {waiting} rank {peer}"
    return text


def classify(error: BaseException) -> str:
    """``timed out``, ``lost the connection`` or ``failed``: what an engine's exception means.
    stragglar's own refusals (an :class:`InputError`) are failures whatever they say: ``timeout
    must be ... > 0`` is a cause, not a rank that timed out."""
    if isinstance(error, InputError):
        return "failed"
    text = str(error).lower()
    if isinstance(error, TimeoutError) or "timed out" in text or "timeout" in text:
        return "timed out"
    lost = ("closed by peer", "connection reset", "connection closed", "broken pipe", "connection refused")
    if any(word in text for word in lost):
        return "lost the connection"
    return "failed"


def first_line(text: object, limit: int = 200) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    line = next((x.strip() for x in str(text).splitlines() if x.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def error_line(error: BaseException) -> str:
    """``error`` in one line: its message's first line, or its type's name where it says nothing
    (a KeyboardInterrupt, a bare RuntimeError)."""
    return first_line(error) or type(error).__name__


def checking_error(
    rank: int, reason: str, detail: str, peer: int | None = None, during: str = CHECKING
) -> RankError:
    """A :class:`RankError` for a header check that did not complete on ``rank``: ``reason`` as
    :func:`classify` says it, ``detail`` the engine's first line, ``peer`` the (first) rank that
    never answered, where the engine can tell (a collective cannot: it completes or not);
    ``during``: what the check was checking (a call's setup, or a hook's settings)."""
    what = failure_phrase(reason, peer=peer, during=during)
    return RankError(
        f"allreduce failed: rank {rank} {what}: {detail}",
        rank=rank,
        reason=reason,
        peer=peer,
        during=during,
    )


def step_error(
    plan: Plan, step: BoundStep, error: BaseException, peer: int | None = None, waiting: str = "waiting for"
) -> RankError:
    """A :class:`RankError` for ``error`` met in ``step``, naming the peer when one is to blame
    (else the step's only peer, if it has one)."""
    peers = sorted({m.peer for m in step.sends + step.recvs})
    if peer is None and len(peers) == 1:
        peer, waiting = peers[0], "with"
    phase = plan.program.phases[step.phase]
    rnd = plan.program.phase_round(step.round, step.phase)
    reason = classify(error)
    what = failure_phrase(reason, rnd, phase, peer, waiting)
    return RankError(
        f"allreduce failed: rank {plan.rank} {what}: {first_line(error)}",
        rank=plan.rank,
        reason=reason,
        round=rnd,
        phase=phase,
        peer=peer,
        waiting=waiting,
    )
