"""The MSCCL executor's own tokenizer, reproduced: what it reads, and where it stops.

The executor (Azure/msccl-executor-nccl, RCCL) does not use an XML library: spaces and newlines
between elements only, attributes separated by single spaces on the element's line,
double-quoted values, comments skipped, unknown elements ignored, at most 16 attributes and 255
characters a name or value.  :func:`elements` follows those rules and returns the elements the
executor keeps (``algo`` > ``gpu`` > ``tb`` > ``step``); the first rule broken stops it with a
:class:`SyntaxProblem` naming the line.  Nesting is followed with an explicit stack, so no file
can exhaust Python's recursion.

Elements are counted as they are read, and the first one past a limit stops the reading with a
:class:`LimitProblem`, so that a file far past one costs no more than one just past it: the
executor's parser holds ``MAX_NODES - 1`` elements for a rank (the ``algo`` and ``gpu`` elements,
and that rank's ``tb`` and ``step`` elements), and stragglar reads at most ``MAX_IGNORED`` elements
the executor ignores (those it keeps are bounded by its own limit; ignored ones by nothing but the
file's size, each costing as much to read as a kept one).

>>> [e.name for e in elements('<algo a="1">  <!-- x --><gpu/> <foo/></algo>')[0].children]
['gpu']
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from stragglar.msccl.vocabulary import MAX_ATTRS, MAX_NODES, MAX_STR

__all__ = ["MAX_IGNORED", "Element", "LimitProblem", "SyntaxProblem", "elements", "first_name"]

# Elements the executor ignores (unknown names, or known ones out of place) that stragglar reads:
# as many as it keeps for a rank.  MSCCL writers (msccl-tools, stragglar's lowering) write none.
MAX_IGNORED = MAX_NODES - 1

_TOKEN = re.compile(r"[^ >/\n\r=]*")
_SPACE = re.compile(r"[ \n\r]*")  # what may separate elements, skipped at the regex engine's speed
_DECIMAL = re.compile(r"-?[0-9]{1,10}")
_HANDLERS = {"": ("algo",), "algo": ("gpu",), "gpu": ("tb",), "tb": ("step",)}  # parent -> children kept


class SyntaxProblem(Exception):
    """The executor's tokenizer stops here; nothing after it is read."""


class LimitProblem(SyntaxProblem):
    """A limit on the elements read (the executor's parser's, or stragglar's) is passed here;
    nothing after it is read."""


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
            space = _SPACE.match(self.text, self.pos)
            assert space is not None  # it matches the empty string
            self.pos = space.end()
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

    Raises :class:`SyntaxProblem` where the executor's tokenizer would stop, :class:`LimitProblem`
    at the first element past a limit.
    """
    scanner = _Scanner(text)
    count = _Count()
    stack: list[_Open] = [_Open(None, True)]
    while True:
        top = stack[-1]
        got = scanner.node()
        if got is None:
            if top.el is not None:
                raise scanner.fail(f"<{top.el.name}> from line {top.el.line} is never closed")
            return top.kept
        kind, el = got
        if kind == "close":
            if top.el is None or el.name != top.el.name:
                name = top.el.name if top.el else ""
                raise scanner.fail(f"closing tag </{el.name}> does not match <{name}>")
            stack.pop()
            if top.keep:
                top.el.children = top.kept
            continue
        if top.el is not None and top.el.name == "step":
            raise scanner.fail("a <step> must not contain elements (the executor's parser crashes)")
        keep = top.keep and el.name in _HANDLERS.get(top.el.name if top.el else "", ())
        count.add(el, len(stack), keep)
        if keep:
            top.kept.append(el)
        if kind == "open":
            stack.append(_Open(el, keep))


@dataclass
class _Open:
    """An element being read: whether the executor keeps it, and its kept children so far (the
    executor keeps no child of an element it ignores)."""

    el: Element | None  # None for the file itself
    keep: bool
    kept: list[Element] = field(default_factory=list)


class _Count:
    """The elements read so far, against the limits of the module docstring.

    The executor parses the file once for each rank, keeping the ``algo`` and ``gpu`` elements
    (shared by every rank) and the ``tb`` and ``step`` elements of that rank's ``gpu``; the
    largest part so far is the shared elements and the most ``tb`` and ``step`` elements one
    ``gpu`` has so far.  Both only grow, so the file passes the limit exactly when some prefix does.
    """

    def __init__(self) -> None:
        self.shared = 0  # kept <algo> and <gpu> elements
        self.own = 0  # kept <tb> and <step> elements of the <gpu> being read
        self.gpu: Element | None = None  # the <gpu> being read
        self.largest = 0  # the most kept <tb> and <step> elements of one <gpu> so far
        self.largest_gpu: Element | None = None  # that <gpu>
        self.ignored = 0

    def add(self, el: Element, depth: int, keep: bool) -> None:
        """Count ``el``, at ``depth`` (1 for a top-level element) and kept or not."""
        if not keep:
            self.ignored += 1
            if self.ignored > MAX_IGNORED:
                raise LimitProblem(
                    f"line {el.line}: {self.ignored:,} elements the executor ignores (unknown or out of "
                    f"place) by here: stragglar reads files of at most {MAX_IGNORED:,}"
                )
            return
        if depth <= 2:
            self.shared += 1
            if depth == 2:
                self.gpu, self.own = el, 0
        else:
            self.own += 1
            if self.own > self.largest:
                self.largest, self.largest_gpu = self.own, self.gpu
        if self.shared + self.largest < MAX_NODES:
            return
        holds = f"the executor's parser holds {MAX_NODES - 1}"
        gpu = self.largest_gpu
        if gpu is None:
            raise LimitProblem(
                f"line {el.line}: every rank's part of the file has {MAX_NODES} elements by here "
                f"(<algo> and <gpu> elements), {holds}"
            )
        gid = gpu.attrs.get("id", "")
        name = f"gpu {gid}" if _DECIMAL.fullmatch(gid) else "<gpu>"
        part = f"rank's part of the file has {MAX_NODES} elements by line {el.line}"
        raise LimitProblem(f"line {gpu.line}: {name}: {part}, {holds}")
