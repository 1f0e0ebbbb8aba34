"""The MSCCL executor's own tokenizer, reproduced: what it reads, and where it stops.

The executor (Azure/msccl-executor-nccl, RCCL) does not use an XML library: spaces and newlines
between elements only, attributes separated by single spaces on the element's line,
double-quoted values, comments skipped, unknown elements ignored, at most 16 attributes and 255
characters a name or value.  :func:`elements` follows those rules and returns the elements the
executor keeps (``algo`` > ``gpu`` > ``tb`` > ``step``); the first rule broken stops it with a
:class:`SyntaxProblem` naming the line.  Nesting is followed with an explicit stack, so no file
can exhaust Python's recursion.

>>> [e.name for e in elements('<algo a="1">  <!-- x --><gpu/> <foo/></algo>')[0].children]
['gpu']
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from stragglar.msccl.vocabulary import MAX_ATTRS, MAX_STR

__all__ = ["Element", "SyntaxProblem", "elements", "first_name"]

_TOKEN = re.compile(r"[^ >/\n\r=]*")
_HANDLERS = {"": ("algo",), "algo": ("gpu",), "gpu": ("tb",), "tb": ("step",)}  # parent -> children kept


class SyntaxProblem(Exception):
    """The executor's tokenizer stops here; nothing after it is read."""


@dataclass
class Element:
    name: str
    line: int
    attrs: dict[str, str]
    children: list[Element] = field(default_factory=list)


class _Scanner:
    """The executor's tokenizer, one node at a time."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.counted, self.lines = 0, 1  # newlines before ``counted`` are in ``lines``

    def line(self, at: int | None = None) -> int:
        end = min(self.pos if at is None else at, len(self.text))
        if end < self.counted:
            self.counted, self.lines = 0, 1
        self.lines += self.text.count("\n", self.counted, end)
        self.counted = end
        return self.lines

    def fail(self, what: str) -> SyntaxProblem:
        return SyntaxProblem(f"line {self.line(self.pos - 1)}: {what}")  # the character just read

    def char(self) -> str:
        if self.pos >= len(self.text):
            raise self.fail("unexpected end of file")
        c = self.text[self.pos]
        self.pos += 1
        return c

    def token(self, *, value: dict[str, str] | None = None) -> tuple[str, str]:
        """Characters up to a space, '>', '/' or newline (or an attribute's '=' and value)."""
        match = _TOKEN.match(self.text, self.pos)
        assert match is not None
        name = match.group()
        if len(name) >= MAX_STR:
            raise self.fail(f"name {name[:20]!r}... longer than {MAX_STR - 1} characters")
        self.pos = match.end()
        c = self.char()
        if c != "=":
            return name, c
        if value is None:
            raise self.fail(f"unexpected '=' after {name!r}")
        return name, self.value(value, name)

    def value(self, out: dict[str, str], key: str) -> str:
        quote = self.char()
        if quote == "'":
            raise self.fail(f"attribute {key}: single quotes (the executor reads up to a double quote)")
        if quote != '"':
            raise self.fail(f"attribute {key}: expected a double quote, got {quote!r}")
        end = self.text.find('"', self.pos)
        if end < 0:
            raise self.fail(f"attribute {key}: unterminated value")
        if end - self.pos > MAX_STR:
            raise self.fail(f"attribute {key}: value longer than {MAX_STR} characters overflows the executor")
        out.setdefault(key, self.text[self.pos : end])
        self.pos = end + 1
        return self.char()

    def node(self) -> tuple[str, Element] | None:
        """The next (kind, element) with kind open, single or close; None at the end."""
        while True:  # a loop, not a recursion: any number of comments in a row
            while self.pos < len(self.text) and self.text[self.pos] in " \n\r":
                self.pos += 1
            if self.pos == len(self.text):
                return None
            line = self.line()
            c = self.char()
            if c != "<":
                raise self.fail(f"expected '<', got {c!r} (only spaces and newlines may separate elements)")
            start = self.pos
            name, c = self.token()
            if not name.startswith("!--"):
                break
            end = self.text.find("-->", start + 3)
            if end < 0:
                raise self.fail("unterminated comment")
            self.pos = end + 3
        if name.startswith("?"):
            raise self.fail(f"<{name}: the executor's parser reads no <?...?> declaration: delete that line")
        if name == "" and c == "/":
            name, c = self.token()
            if c != ">":
                raise self.fail(f"unexpected {c!r} in closing tag </{name}")
            return "close", Element(name, line, {})
        attrs: dict[str, str] = {}
        count = 0
        while c == " ":
            kept = attrs if count < MAX_ATTRS else {}
            _, c = self.token(value=kept)
            count += 1
        kind = "open"
        if c == "/":
            kind = "single"
            _, c = self.token()
        if c != ">":
            raise self.fail(f"<{name}>: expected '>', got {c!r} (attributes must share the element's line)")
        return kind, Element(name, line, attrs)


def first_name(text: str) -> str | None:
    """The name of the file's first element (the executor reads only the first ``algo``), if any."""
    got = _Scanner(text).node()
    return None if got is None else got[1].name


def elements(text: str) -> list[Element]:
    """The top-level elements the executor keeps, with their kept children; see the module docstring.

    Raises :class:`SyntaxProblem` where the executor's tokenizer would stop.
    """
    scanner = _Scanner(text)
    stack: list[tuple[Element | None, list[Element]]] = [(None, [])]
    while True:
        head, kept = stack[-1]
        got = scanner.node()
        if got is None:
            if head is not None:
                raise scanner.fail(f"<{head.name}> from line {head.line} is never closed")
            return kept
        kind, el = got
        if kind == "close":
            if head is None or el.name != head.name:
                raise scanner.fail(f"closing tag </{el.name}> does not match <{head.name if head else ''}>")
            stack.pop()
            _keep(stack[-1], head, kept)
        elif head is not None and head.name == "step":
            raise scanner.fail("a <step> must not contain elements (the executor's parser crashes)")
        elif kind == "open":
            stack.append((el, []))
        else:
            _keep(stack[-1], el, [])


def _keep(parent: tuple[Element | None, list[Element]], el: Element, children: list[Element]) -> None:
    """Add ``el`` to its parent's kept children if the executor keeps such an element there."""
    head, kept = parent
    if el.name in _HANDLERS.get(head.name if head else "", ()):
        el.children = children
        kept.append(el)
