"""An MSCCL++ execution plan's JSON text, parsed once for every reader of plans.

The prover (:mod:`stragglar.mscclpp.prover.read`), the size rule (:mod:`stragglar.mscclpp.sizes`) and
the description (:mod:`stragglar.mscclpp.summary`) each read the plan differently, but they start
alike: the text must be JSON, every string in it valid Unicode, the top level an object.  That
start is :func:`plan_document`, so that the three refuse bad text with the same words, and a
caller that needs several of them (``stragglar show`` proves, describes and sizes one file) parses
the text once and hands each the :class:`PlanDocument`.  Each reader takes the text or the
document (:data:`PlanSource`).  The executor's rules for the fields are in
:mod:`stragglar.mscclpp.vocabulary`.

This is the plan as the executor reads it, not the lowering's structures: the prover may use it.

>>> plan_document('{"gpus": []}').root
{'gpus': []}
>>> plan_document("[1]")
Traceback (most recent call last):
...
stragglar.mscclpp.errors.PlanFormatError: not an MSCCL++ execution plan: the top level must be an object
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeAlias

from stragglar.errors import ArgumentError, described
from stragglar.files import json_complaint, lone_surrogate
from stragglar.mscclpp.errors import PlanFormatError

__all__ = ["PlanDocument", "PlanSource", "plan_document"]


@dataclass(frozen=True, slots=True)
class PlanDocument:
    """The top-level object of a plan's JSON text, checked as :func:`plan_document` says; the
    readers only look at ``root``, never change it."""

    root: dict[str, Any]


PlanSource: TypeAlias = str | PlanDocument  # a plan's JSON text, or the document already parsed from it


def plan_document(source: PlanSource) -> PlanDocument:
    """The document of a plan's text (a document is returned as it is).

    Raises :class:`~stragglar.mscclpp.errors.PlanFormatError` for text that is not JSON, holds half
    of a surrogate pair in a string, or whose top level is not an object.
    """
    if isinstance(source, PlanDocument):
        return source
    if not isinstance(source, str):  # a lowered plan, bytes, a path: json's own TypeError otherwise
        kind = type(source).__name__
        if isinstance(getattr(source, "text", None), str):  # lower()'s plan: its text is the plan
            raise ArgumentError(f"a plan source is the plan's JSON text: pass the {kind}'s .text")
        raise ArgumentError(
            f"a plan source is the plan's JSON text (a str) or its document, got {described(source)}"
        )
    try:
        root = json.loads(source)
    except (ValueError, RecursionError) as exc:
        raise PlanFormatError(
            f"not JSON: {json_complaint(exc) if isinstance(exc, ValueError) else 'nested too deeply'}"
        ) from None
    bad = lone_surrogate(source, root)
    if bad is not None:
        raise PlanFormatError(bad)
    if not isinstance(root, dict):
        raise PlanFormatError("not an MSCCL++ execution plan: the top level must be an object")
    return PlanDocument(root)
