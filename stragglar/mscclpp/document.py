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
import re
from dataclasses import dataclass
from typing import Any, TypeAlias

from stragglar.errors import ArgumentError, described
from stragglar.files import json_complaint, lone_surrogate
from stragglar.mscclpp.errors import PlanFormatError
from stragglar.schedule import gc_paused

__all__ = ["PlanDocument", "PlanSource", "adopt", "plan_document"]


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
        with gc_paused():  # a plan of 192 GPUs is millions of dicts and lists, all kept: collecting is wasted
            root = _in_pieces(source)
    except (ValueError, RecursionError) as exc:
        raise PlanFormatError(
            f"not JSON: {json_complaint(exc) if isinstance(exc, ValueError) else 'nested too deeply'}"
        ) from None
    bad = lone_surrogate(source, root)
    if bad is not None:
        raise PlanFormatError(bad)
    return adopt(root)


def adopt(root: object) -> PlanDocument:
    """The document of a plan whose text its caller parsed already, for a reason of its own (to
    tell a file's format), so that the proof does not parse it again.  The caller's parser must
    be one :func:`plan_document` would agree with: the value ``json.loads`` gives, and strings
    checked for lone surrogates (:func:`stragglar.formats.schedule_json.parse` is one where
    :func:`~stragglar.formats.schedule_json.parsed_as_loaded` says so of the text).

    >>> adopt({"gpus": []}).root
    {'gpus': []}
    >>> adopt([1])
    Traceback (most recent call last):
    ...
    stragglar.mscclpp.errors.PlanFormatError: not an MSCCL++ execution plan: the top level must be an object
    """
    if not isinstance(root, dict):
        raise PlanFormatError("not an MSCCL++ execution plan: the top level must be an object")
    return PlanDocument(root)


# json.loads's own scanner (C): one value from an index on; typeshed leaves the attribute out
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace, as json skips it


def _in_pieces(text: str) -> Any:
    """``json.loads(text)``, the same value, parsed a piece at a time where the text is an object:
    each member, and each item of a member that is a list (a GPU of ``gpus``), by json's own C
    scanner.

    One ``json.loads`` of a plan is one C call, and it holds the GIL: the 37 MB plan of 192 GPUs
    spent 2.5 s in it, and the thread of the "proving" line could not redraw.  Between pieces
    that thread runs.  Text that is not an object of that shape, or not JSON at all, is left to
    ``json.loads``, so that the value, and the error of text that is not JSON, are its own."""
    try:
        return _object(text)
    except (ValueError, RecursionError, StopIteration):  # StopIteration: the scanner found no value
        return json.loads(text)


def _object(text: str) -> dict[str, Any]:
    """The object that is the whole of ``text``, built as json builds one (a key given twice keeps
    its first place and its last value); ValueError or StopIteration where the text is not one."""
    root: dict[str, Any] = {}
    at = _skip(text, 0)
    if text[at : at + 1] != "{":
        raise ValueError("not an object")
    at = _skip(text, at + 1)
    if text[at : at + 1] != "}":
        while True:
            key, at = _scan(text, at)
            at = _skip(text, at)
            if not isinstance(key, str) or text[at : at + 1] != ":":
                raise ValueError("not a member")
            at = _skip(text, at + 1)
            root[key], at = _list(text, at) if text[at : at + 1] == "[" else _scan(text, at)
            at = _skip(text, at)
            if text[at : at + 1] == "}":
                break
            if text[at : at + 1] != ",":
                raise ValueError("no comma")
            at = _skip(text, at + 1)
    if _skip(text, at + 1) != len(text):
        raise ValueError("extra data")
    return root


def _list(text: str, at: int) -> tuple[list[Any], int]:
    """The list whose ``[`` is at ``at``, an item at a time, and the index after its ``]``."""
    items: list[Any] = []
    at = _skip(text, at + 1)
    if text[at : at + 1] == "]":
        return items, at + 1
    while True:
        item, at = _scan(text, at)
        items.append(item)
        at = _skip(text, at)
        if text[at : at + 1] == "]":
            return items, at + 1
        if text[at : at + 1] != ",":
            raise ValueError("no comma")
        at = _skip(text, at + 1)


def _skip(text: str, at: int) -> int:
    """The index of the first character at or after ``at`` that is not JSON's whitespace."""
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]  # "*": it matches everywhere
