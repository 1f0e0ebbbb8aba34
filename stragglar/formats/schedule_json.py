"""The versioned JSON schedule format, version 1.

A document is one JSON object (``metadata`` may be left out: it then means ``{}``)::

    {"format": "stragglar-schedule", "version": 1, "collective": "allreduce",
     "algorithm": "stragglar", "num_ranks": N, "num_chunks": C, "straggler": <rank> | null,
     "phases": [{"name": "...", "ranks": [...], "rounds": [[transfer, ...], ...]}, ...],
     "metadata": {...}}

    transfer = {"src": int, "dst": int, "chunk": int, "op": "copy" | "reduce"}

Every key but ``metadata`` is required, no other key is allowed (unknown keys are rejected,
not ignored), and no object may repeat a key.  Reading checks the format only (keys, types,
ranges, ``src != dst``, the size limits of :mod:`stragglar.schedule`, at most
:data:`MAX_IDLE_ROUNDS` idle rounds); whether the schedule is correct is the verifier's business.
Every bad document raises :class:`ScheduleFormatError` whose one-line message names the place,
e.g. ``phases[0].rounds[2][1].chunk: ...``.
``schedule.schema.json`` next to this module is the same format as a JSON Schema.

This module holds the format's text: strict parsing (:func:`parse`, :func:`loads`), the sizes its
header declares, read without parsing the rest (:func:`header`), the compact text in pieces
(:func:`pieces`, :func:`dumps`) and files (:func:`read`, :func:`write`).  The
documents, Python values to a schedule and back with all their checks (:func:`from_document`,
:func:`to_document`, :class:`ScheduleFormatError`), are :mod:`stragglar.formats.schedule_document`'s,
re-exported here: import them from this module.

>>> from stragglar.schedule import Op, Phase, Schedule, Transfer
>>> s = Schedule("direct", 2, 1, None, (Phase("p", (0, 1), ((Transfer(0, 1, 0, Op.REDUCE),),)),))
>>> loads(dumps(s)) == s
True
"""

from __future__ import annotations

import functools
import json
import numbers
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, NoReturn

from stragglar.errors import ArgumentError, InputError, described
from stragglar.files import json_complaint, lone_surrogate, read_text, write_text
from stragglar.formats.schedule_document import (
    FORMAT,
    HEADER_KEYS,
    MAX_IDLE_ROUNDS,
    VERSION,
    IdleRounds,
    ScheduleFormatError,
    SlimTransfer,
    checked_header,
    checked_metadata,
    document_head,
    dump_rounds,
    from_document,
    phase_head,
    to_document,
)
from stragglar.schedule import MAX_CHUNKS, Schedule, gc_paused

__all__ = [
    "FORMAT",
    "MAX_CONTAINERS",
    "MAX_IDLE_ROUNDS",
    "MAX_INDENT",
    "VERSION",
    "Header",
    "ScheduleFormatError",
    "dumps",
    "from_document",
    "header",
    "loads",
    "parse",
    "parsed_as_loaded",
    "pieces",
    "read",
    "to_document",
    "write",
]

MAX_INDENT = 16  # spaces a level: the text grows by the indent on every line, so it is bounded
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def pieces(schedule: Schedule) -> Iterator[str]:
    """:func:`dumps`'s compact text in pieces, one a round (at least one; what lies between two
    rounds goes with the later, the end with the last), each checked as :func:`to_document`
    checks it.  One :func:`json.dumps` of a whole schedule is one C call that holds the GIL (1.9 s
    of N = 1024's 98 MB): no progress bar can move while it runs, and between two pieces one can."""
    encode = _COMPACT.encode
    head = document_head(schedule)
    n, c, idle = head["num_ranks"], head["num_chunks"], IdleRounds()
    text, done = [encode(head)[:-1], ',"phases":['], ""  # the text since the last round; the piece before it
    for i, phase in enumerate(schedule.phases):
        path = f"phases[{i}]"
        text += ["," * (i > 0), encode(phase_head(phase, path, n))[:-1], ',"rounds":[']
        for k, rnd in enumerate(dump_rounds(phase, path, n, c, idle)):
            if done:  # yielded once the next round shows that the end is not in it
                yield done
            done, text = "".join([*text, "," * (k > 0), encode(rnd)]), []
        text.append("]}")
    yield "".join([done, *text, '],"metadata":', encode(checked_metadata(dict(schedule.metadata))), "}"])


def dumps(schedule: Schedule, *, indent: int | None = None) -> str:
    """The JSON text of ``schedule``: deterministic, compact unless ``indent`` (spaces a level, at
    most :data:`MAX_INDENT`) is given."""
    if indent is not None:
        if isinstance(indent, bool) or not isinstance(indent, numbers.Integral):
            # json.dumps would take True as 1 and a string as the indent's text
            raise ArgumentError(f"indent must be None or a count of spaces, got {described(indent)}")
        if not 0 <= indent <= MAX_INDENT:  # each line repeats it: 10**9 built gigabytes, 10**30 overflowed
            raise InputError(f"indent must be from 0 to {MAX_INDENT} spaces, got {described(indent)}")
        indent = int(indent)  # a NumPy integer, for json
    if indent is None:
        return "".join(pieces(schedule))
    return json.dumps(
        to_document(schedule), indent=indent, separators=(",", ": "), ensure_ascii=False, allow_nan=False
    )


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON value")


def parsed_as_loaded(text: str) -> bool:
    r"""Whether :func:`parse` gives ``text`` the value :func:`json.loads` gives it (where it parses):
    it reads an object whose keys are ``src``, ``dst``, ``chunk`` and ``op`` as a transfer, and
    no object can have the key ``src`` where the text holds neither ``"src"`` nor an escape that
    could spell it (``\u``: JSON's only escapes of letters).  A reader of other JSON may then use
    the parse made to tell the file's kind.

    >>> parsed_as_loaded('{"gpus": []}'), parsed_as_loaded('[{"src": 0}]'), parsed_as_loaded('["\\u0073"]')
    (True, False, False)
    """
    return '"src"' not in text and "\\u" not in text


@functools.cache
def _integers() -> tuple[int, ...]:
    """One int object for each integer a transfer's field may hold (2.3 MB, made at the first parse)."""
    return tuple(range(MAX_CHUNKS))


def _object_hook() -> Callable[[list[tuple[str, Any]]], Any]:
    """:func:`parse`'s maker of objects: a transfer object as a :class:`SlimTransfer` whose
    integers and op are shared, any other a dict, unless it repeats a key (JSON parsers differ on
    which value wins, so it is refused).  The JSON decoder makes a new int for every number past
    256 and a new string for every value: at N = 1024 the transfers' 4.7 million ints past 256
    took 126 MiB and their 2.1 million ops 125 MiB, more than the transfers themselves (160 MiB);
    a parse's max RSS was 144 MB less with the ints shared, a load's 131 MB less with the ops too."""
    integers, limit, ops = _integers(), MAX_CHUNKS, {"copy": "copy", "reduce": "reduce"}

    def made(pairs: list[tuple[str, Any]]) -> Any:
        if len(pairs) == 4:
            (k0, v0), (k1, v1), (k2, v2), (k3, v3) = pairs
            if k0 == "src" and k1 == "dst" and k2 == "chunk" and k3 == "op":
                if (
                    type(v0) is type(v1) is type(v2) is int
                    and type(v3) is str
                    and 0 <= v0 < limit
                    and 0 <= v1 < limit
                    and 0 <= v2 < limit
                ):
                    return SlimTransfer((integers[v0], integers[v1], integers[v2], ops.get(v3, v3)))
                return SlimTransfer((v0, v1, v2, v3))  # as read: the checks name what is wrong with it
        value = dict(pairs)
        if len(value) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise ValueError(f"key {json.dumps(key)} appears twice in one object")
                seen.add(key)
        return value

    return made


# Objects and arrays a document may hold, counted (braces and brackets, an upper bound) before it
# is parsed: each costs Python 56 bytes or more for 2 or 3 of text, so 99 MB of ``{}`` took 4.8 GB.
# The largest schedule stragglar reads, Ring over 2048 GPUs, has 8.4 million transfers; the
# largest MSCCL++ plan it writes (192 GPUs) 1.5 million objects and arrays.
MAX_CONTAINERS = 2**24


def parse(text: str | bytes) -> Any:
    """The JSON document in ``text``, strictly: no NaN or Infinity, no key twice in one object.
    Bytes are read as UTF-8, as :func:`json.loads` reads them (a file's bytes, given whole).

    >>> parse("[1,")
    Traceback (most recent call last):
    ...
    stragglar.formats.schedule_document.ScheduleFormatError: not JSON: Expecting value at line 1 column 4
    >>> parse(b"[1, 2]")
    [1, 2]
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ScheduleFormatError(f"not UTF-8 text: byte {e.start}") from None
    if not isinstance(text, str):  # a path or a dict: not the text (read() takes a path)
        raise ArgumentError(f"a schedule's JSON is its text (str or bytes), got {described(text)}")
    containers = text.count("{") + text.count("[")
    if containers > MAX_CONTAINERS:
        raise ScheduleFormatError(
            f"{containers:,} objects and arrays (or braces and brackets in its strings): stragglar reads "
            f"JSON documents of at most {MAX_CONTAINERS:,}"
        )
    try:
        with gc_paused():  # millions of compact transfers, all alive: collecting them is wasted work
            document = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_object_hook())
    except ValueError as e:
        raise ScheduleFormatError(f"not JSON: {json_complaint(e)}") from None
    except RecursionError:
        raise ScheduleFormatError("not JSON: nested too deeply") from None
    bad = lone_surrogate(text, document)
    if bad is not None:
        raise ScheduleFormatError(bad)
    return document


class Header(NamedTuple):
    """The sizes a schedule's header declares."""

    num_ranks: int
    num_chunks: int
    straggler: int | None


_WHITESPACE = re.compile(r"[ \t\n\r]*")  # JSON's, and no other
_HEADER_ENDS = ("phases", "metadata")  # the keys that end a header, as stragglar writes documents
_SCALARS = json.JSONDecoder(parse_constant=_reject_constant)  # a header's keys and values: no array or object


def _skip(text: str, i: int) -> int:
    """The index of the first character from ``i`` on that is not JSON whitespace."""
    match = _WHITESPACE.match(text, i)
    return i if match is None else match.end()  # never None: the pattern matches nothing too


def header(text: str) -> Header | None:
    """The sizes the keys at the start of the document ``text`` declare, read without parsing the
    rest, or None where they cannot be told so.  A command that refuses a schedule by its sizes
    alone (``export`` to a format that holds fewer GPUs) refuses it then before the phases are
    parsed and built: 4.6 s and 773 MB for a 1024-GPU file, all to say no.

    The keys are read up to ``phases`` (or ``metadata``), as stragglar writes them.  Sizes are
    given only where the keys before it are the header's every key (:data:`HEADER_KEYS`), none
    twice, none else, no escape in their text, and :func:`from_document` would accept each: a
    header it would refuse is left for the whole document's reading to name.  What follows is not
    read, so a file whose rest is bad (its phases, a key after them, data after the document) is
    refused by its sizes as if it were good: nothing there could make those sizes fit.

    >>> header('{"format": "stragglar-schedule", "version": 1, "collective": "allreduce", '
    ...        '"algorithm": "x", "num_ranks": 256, "num_chunks": 255, "straggler": null, "phases": [oops')
    Header(num_ranks=256, num_chunks=255, straggler=None)
    >>> header('{"format": "stragglar-schedule", "version": 1, "phases": [], "num_ranks": 256}') is None
    True
    """
    fields: dict[str, Any] = {}
    i = _skip(text, 0)
    if text[i : i + 1] != "{":
        return None
    i = _skip(text, i + 1)
    try:
        while text[i : i + 1] == '"':
            key, i = _SCALARS.raw_decode(text, i)
            i = _skip(text, i)
            if text[i : i + 1] != ":":
                return None
            i = _skip(text, i + 1)
            if key in _HEADER_ENDS:
                break
            if key not in HEADER_KEYS or key in fields or text[i : i + 1] in ("[", "{"):
                return None  # a key unknown or twice, a size that is no scalar: for the whole reading
            fields[key], i = _SCALARS.raw_decode(text, i)
            i = _skip(text, i)
            if text[i : i + 1] != ",":
                break
            i = _skip(text, i + 1)
    except ValueError:  # bad JSON (a number past Python's digits too), for the whole reading to name
        return None
    if "\\" in text[:i]:  # an escape (half a surrogate pair, say): parse() has its own checks for them
        return None
    try:
        return Header(*checked_header(fields))
    except ScheduleFormatError:
        return None


def loads(text: str | bytes) -> Schedule:
    """The :class:`Schedule` in JSON ``text``; :class:`ScheduleFormatError` if it is bad."""
    return from_document(parse(text), consume=True)


def write(schedule: Schedule, path: str | os.PathLike[str]) -> None:
    """Write ``schedule`` to the file ``path`` as compact UTF-8 JSON with a final newline (atomically)."""
    write_text(path, dumps(schedule) + "\n")


def read(path: str | os.PathLike[str]) -> Schedule:
    """The schedule in the regular file ``path``; errors about its content start with the file name."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"read needs a file's path, got {type(path).__name__}")
    name = os.fspath(path)
    try:
        text = read_text(path)
    except InputError as e:
        raise ScheduleFormatError(str(e)) from None
    try:
        document = parse(text)
        del text  # before the schedule is built beside its parse: N = 1024's is 93 MB
        return from_document(document, consume=True)
    except ScheduleFormatError as e:
        raise ScheduleFormatError(f"{name}: {e}") from None
