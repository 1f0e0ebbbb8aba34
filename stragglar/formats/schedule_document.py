"""The JSON schedule format's documents: a parsed document (plain Python values) to a
:class:`~stragglar.schedule.Schedule`, and a schedule to its document, with every check of the
format and its one-line errors (:class:`ScheduleFormatError`).

The format is described, and its API imported, in :mod:`stragglar.formats.schedule_json`, which
re-exports what a program needs of this module.  That module holds the format's text (strict
parsing, the compact text in pieces, files); this one what a document must be, which does not
depend on how its text is parsed or written.  The text builds on what is here: the checked parts
of a document (:func:`document_head`, :func:`phase_head`, :func:`dump_rounds`, counting idle
rounds in :class:`IdleRounds`, :func:`checked_metadata`), and :class:`SlimTransfer`, the compact
form in which the parser gives transfer objects.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any, NoReturn

from stragglar.errors import SHOWN_CHARACTERS, ArgumentError, InputError, described, shown
from stragglar.schedule import (
    MAX_CHUNKS,
    MAX_RANKS,
    Op,
    Phase,
    Round,
    Schedule,
    Transfer,
    check_size,
    gc_paused,
)

__all__ = [
    "FORMAT",
    "HEADER_KEYS",
    "MAX_IDLE_ROUNDS",
    "VERSION",
    "IdleRounds",
    "ScheduleFormatError",
    "SlimTransfer",
    "checked_header",
    "checked_metadata",
    "document_head",
    "dump_rounds",
    "from_document",
    "phase_head",
    "to_document",
]

FORMAT = "stragglar-schedule"
VERSION = 1
COLLECTIVE = "allreduce"

_KEYS = (
    "format",
    "version",
    "collective",
    "algorithm",
    "num_ranks",
    "num_chunks",
    "straggler",
    "phases",
)
HEADER_KEYS = frozenset(_KEYS) - {"phases"}  # plain values, before the phases as stragglar writes
_OPTIONAL_KEYS = ("metadata",)  # absent means {}
_PHASE_KEYS = ("name", "ranks", "rounds")
_TRANSFER_KEYS = ("src", "dst", "chunk", "op")
_OPS = {"copy": Op.COPY, "reduce": Op.REDUCE}
_OP_NAMES = {Op.COPY: "copy", Op.REDUCE: "reduce"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Idle rounds (``[]``: no transfer) a schedule may have, in all its phases.  A busy round takes at
# least one transfer's bytes of the file, so the work of reading, proving and pricing busy rounds
# is proportional to the file; an idle round takes three bytes and as much work as a busy one (the
# simulator, the cost model and the runtime each step through it): 2,000,000 of them in an 8 MB
# file kept ``verify`` busy for 13 seconds.  An idle round moves nothing, it only waits a round (a
# "wait" phase while the straggler is late, say), and stragglar's generators make none: they are
# legal, up to as many as the rounds of the longest phase stragglar makes (a round a chunk, at
# MAX_CHUNKS chunks).  They are counted as they are read, and the first past the limit stops it.
MAX_IDLE_ROUNDS = MAX_CHUNKS


class ScheduleFormatError(InputError):
    """A bad schedule document; the one-line message says where and what.

    >>> try:
    ...     from_document({"format": "stragglar-schedule", "version": 2})
    ... except ScheduleFormatError as e:
    ...     print(e)
    version: unsupported version 2 (this stragglar reads version 1)
    """


class SlimTransfer(tuple):  # type: ignore[type-arg]
    """An object with exactly the keys ``src, dst, chunk, op``, in that order, kept as a tuple.

    A 2048-GPU schedule has 8 million transfers; as dicts they took a gigabyte more than the
    schedule itself while it was read.  A subclass, not a plain tuple, so that a tuple a caller
    passes (in metadata, say) is never mistaken for one.  The parser
    (:func:`stragglar.formats.schedule_json.parse`) makes them; everything here that reads objects
    takes this form too (:func:`_dict` turns it back into a dict where one is needed).
    """

    __slots__ = ()


def _dict(value: object) -> object:
    """``value``, with a compact transfer object turned back into a dict."""
    return dict(zip(_TRANSFER_KEYS, value, strict=True)) if type(value) is SlimTransfer else value


# ---------------------------------------------------------------------------- helpers


def _fail(path: str, what: str) -> NoReturn:
    raise ScheduleFormatError(f"{path or 'document'}: {what}")


def _join(path: str, key: object) -> str:
    """The path of member ``key`` of the object at ``path``; a long key is cut, as messages cut
    what they echo (:func:`~stragglar.errors.shown`)."""
    if isinstance(key, str) and _IDENTIFIER.fullmatch(key) and len(key) <= SHOWN_CHARACTERS:
        return f"{path}.{key}" if path else key
    text = json.dumps(key, ensure_ascii=False) if isinstance(key, str) else repr(key)
    return f"{path}[{shown(text)}]"


def _show(value: object) -> str:
    """A short description of a bad value for an error message."""
    if isinstance(value, (dict, SlimTransfer)):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):  # at most SHOWN_CHARACTERS of it, the rest counted, as messages do
        head = json.dumps(value[:SHOWN_CHARACTERS], ensure_ascii=False)
        return head if len(value) <= SHOWN_CHARACTERS else f'{head[:-1]}..." ({len(value):,} characters)'
    if value is None or isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return shown(json.dumps(value))
    return repr(value) if isinstance(value, float) else f"a Python {type(value).__name__}"


def _int(value: object, path: str, lo: int, hi: int | None = None) -> int:
    """``value`` if it is an int (not a bool) in ``[lo, hi)``, else fail."""
    if type(value) is int and value >= lo and (hi is None or value < hi):
        return value
    bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi})"
    _fail(path, f"expected an integer {bounds}, got {_show(value)}")


def _str(value: object, path: str, *, nonempty: bool = False) -> str:
    if isinstance(value, str) and (value or not nonempty):
        return value
    _fail(path, f"expected a {'non-empty ' if nonempty else ''}string, got {_show(value)}")


def _const(value: object, path: str, expected: str) -> None:
    if not (isinstance(value, str) and value == expected):
        _fail(path, f"expected {json.dumps(expected)}, got {_show(value)}")


def _list(value: object, path: str) -> list[Any]:
    if isinstance(value, list):
        return value
    _fail(path, f"expected an array, got {_show(value)}")


def _object(
    value: object, path: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``value`` if it is an object with all of ``keys``, perhaps some of ``optional``, and no other."""
    value = _dict(value)
    if not isinstance(value, dict):
        _fail(path, f"expected an object, got {_show(value)}")
    for key in keys:
        if key not in value:
            _fail(_join(path, key), "missing required key")
    if len(value) != len(keys):
        allowed = (*keys, *optional)
        extra = next((k for k in value if k not in allowed), None)
        if extra is not None:
            _fail(_join(path, extra), f"unknown key (allowed: {', '.join(allowed)})")
    return value


def _json_value(value: object, path: str) -> Any:
    """A copy of a JSON-compatible value with object keys sorted; fail on anything else."""
    value = _dict(value)
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                _fail(_join(path, key), "object keys must be strings")
        return {key: _json_value(value[key], _join(path, key)) for key in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_json_value(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        _fail(path, f"expected a finite number, got {described(value)}")
    if value is None or isinstance(value, (str, int, float)):
        return value
    _fail(path, f"expected a JSON value, got {_show(value)}")


def checked_metadata(value: object) -> dict[str, Any]:
    """A copy of the metadata object ``value``, its keys sorted; fail if it is not JSON."""
    if not isinstance(value, dict):
        _fail("metadata", f"expected an object, got {_show(value)}")
    try:
        result: dict[str, Any] = _json_value(value, "metadata")
    except RecursionError:
        _fail("metadata", "nested too deeply")
    return result


# ---------------------------------------------------------------------------- transfers


def _fast_fields(rnd: list[Any], n: int, c: int) -> list[tuple[int, int, int, str]] | None:
    """Each transfer object's (src, dst, chunk, op) when every one is well formed, else None:
    the fast path shared by reading and writing; :func:`_transfer` says what is wrong."""
    ops = _OPS
    fields: list[tuple[int, int, int, str]] = []
    append = fields.append
    for t in rnd:
        if type(t) is SlimTransfer:
            src, dst, chunk, op = t
        elif type(t) is dict and len(t) == 4:
            src, dst, chunk, op = t.get("src"), t.get("dst"), t.get("chunk"), t.get("op")
        else:
            return None
        if not (
            type(src) is int
            and type(dst) is int
            and type(chunk) is int
            and 0 <= src < n
            and 0 <= dst < n
            and src != dst
            and 0 <= chunk < c
            and type(op) is str
            and op in ops
        ):
            return None
        append((src, dst, chunk, op))
    return fields


def _transfer(value: object, path: str, n: int, c: int) -> Transfer:
    """One transfer object, checked field by field with a precise error."""
    t = _object(value, path, _TRANSFER_KEYS)
    src = _int(t["src"], f"{path}.src", 0, n)
    dst = _int(t["dst"], f"{path}.dst", 0, n)
    if dst == src:
        _fail(f"{path}.dst", f"expected a rank other than src, got {dst}")
    chunk = _int(t["chunk"], f"{path}.chunk", 0, c)
    op = t["op"]
    if not (isinstance(op, str) and op in _OPS):
        _fail(f"{path}.op", f'expected "copy" or "reduce", got {_show(op)}')
    return Transfer(src, dst, chunk, _OPS[op])


def _load_round(value: object, path: str, n: int, c: int) -> Round:
    """A round's transfers, checked and built; the slow path names what is wrong."""
    rnd = _list(value, path)
    fields = _fast_fields(rnd, n, c)
    if fields is None:
        return tuple(_transfer(t, f"{path}[{j}]", n, c) for j, t in enumerate(rnd))
    ops = _OPS
    return tuple([Transfer(src, dst, chunk, ops[op]) for src, dst, chunk, op in fields])


def _dump_round(rnd: Round, path: str, n: int, c: int) -> list[dict[str, Any]]:
    names = _OP_NAMES
    out = [{"src": t.src, "dst": t.dst, "chunk": t.chunk, "op": names.get(t.op, t.op)} for t in rnd]
    if _fast_fields(out, n, c) is None:
        for j, t in enumerate(out):
            _transfer(t, f"{path}[{j}]", n, c)
    return out


# ---------------------------------------------------------------------------- phases


def _ranks(value: object, path: str, n: int) -> tuple[int, ...]:
    ranks = _list(value, path)
    seen: set[int] = set()
    for j, r in enumerate(ranks):
        if _int(r, f"{path}[{j}]", 0, n) in seen:
            _fail(f"{path}[{j}]", f"duplicate rank {r}")
        seen.add(r)
    return tuple(ranks)


class IdleRounds:
    """The idle rounds read (or written) so far, against :data:`MAX_IDLE_ROUNDS`."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, path: str) -> None:
        """Count the idle round at ``path``, which fails if it is one too many."""
        self.count += 1
        if self.count > MAX_IDLE_ROUNDS:
            _fail(
                path,
                f"idle round {self.count:,} (no transfer): stragglar reads schedules of at most "
                f"{MAX_IDLE_ROUNDS:,} idle rounds",
            )


def _load_phase(value: object, path: str, n: int, c: int, idle: IdleRounds, consume: bool) -> Phase:
    p = _object(value, path, _PHASE_KEYS)
    name = _str(p["name"], f"{path}.name")
    ranks = _ranks(p["ranks"], f"{path}.ranks", n)
    rounds: list[Round] = []
    document_rounds = _list(p["rounds"], f"{path}.rounds")
    for k, r in enumerate(document_rounds):
        rounds.append(_load_round(r, f"{path}.rounds[{k}]", n, c))
        if consume:
            document_rounds[k] = None
        if not rounds[-1]:
            idle.add(f"{path}.rounds[{k}]")
    return Phase(name, ranks, tuple(rounds))


def phase_head(phase: Phase, path: str, n: int) -> dict[str, Any]:
    """A phase's keys before its rounds, checked."""
    ranks = list(phase.ranks)
    _ranks(ranks, f"{path}.ranks", n)
    return {"name": _str(phase.name, f"{path}.name"), "ranks": ranks}


def dump_rounds(phase: Phase, path: str, n: int, c: int, idle: IdleRounds) -> Iterator[list[dict[str, Any]]]:
    """Each round of ``phase`` as the document has it, checked, its idle rounds counted."""
    for k, r in enumerate(phase.rounds):
        rnd = _dump_round(r, f"{path}.rounds[{k}]", n, c)
        if not rnd:
            idle.add(f"{path}.rounds[{k}]")
        yield rnd


# ---------------------------------------------------------------------------- documents


def _check_header(doc: object) -> dict[str, Any]:
    """Check the format tag and version before anything else, then the top-level keys."""
    if not isinstance(doc, dict):
        _fail("", f"expected an object, got {_show(doc)}")
    _check_tag(doc)
    return _object(doc, "", _KEYS, _OPTIONAL_KEYS)


def _check_tag(doc: dict[str, Any]) -> None:
    """The format tag, then the version."""
    if "format" not in doc:
        _fail("format", "missing required key")
    _const(doc["format"], "format", FORMAT)  # first: another program's JSON is told by its tag alone
    if "version" not in doc:
        _fail("version", "missing required key")
    version = doc["version"]
    if type(version) is not int:
        _fail("version", f"expected an integer, got {_show(version)}")
    if version != VERSION:
        _fail("version", f"unsupported version {version} (this stragglar reads version {VERSION})")


def _head(d: dict[str, Any]) -> tuple[str, int, int, int | None]:
    """The collective, the algorithm and the sizes of a document's keys, checked: its algorithm,
    ranks, chunks and straggler."""
    _const(d["collective"], "collective", COLLECTIVE)
    algorithm = _str(d["algorithm"], "algorithm", nonempty=True)
    return (algorithm, *_sizes(d["num_ranks"], d["num_chunks"], d["straggler"]))


def _sizes(num_ranks: object, num_chunks: object, straggler: object) -> tuple[int, int, int | None]:
    """The sizes, checked against stragglar's limits before anything is built from them."""
    n = _int(
        num_ranks, "num_ranks", 2
    )  # one rank has nothing to reduce: no command makes it, no executor runs it
    c = _int(num_chunks, "num_chunks", 1)
    try:
        check_size(n, c)
    except InputError as e:
        _fail("num_ranks" if n > MAX_RANKS else "num_chunks", str(e))
    return n, c, None if straggler is None else _int(straggler, "straggler", 0, n)


def checked_header(fields: dict[str, Any]) -> tuple[int, int, int | None]:
    """The sizes in ``fields``, a document's header keys (:data:`HEADER_KEYS`, every one of them),
    checked by :func:`from_document`'s own checks."""
    for key in sorted(HEADER_KEYS):
        if key not in fields:
            _fail(key, "missing required key")
    _check_tag(fields)
    _, n, c, straggler = _head(fields)
    return n, c, straggler


def from_document(doc: object, *, consume: bool = False) -> Schedule:
    """The :class:`Schedule` of a parsed version-1 document; :class:`ScheduleFormatError` if it is bad.

    ``consume`` lets each round of the document go once it is built (``None`` in its place), for a
    document parsed for this call alone: the parse and the schedule are then not held whole at
    once, which at N = 1024 took 85 MB more (a load's max RSS).

    >>> from_document({"format": "stragglar-schedule", "version": 1})
    Traceback (most recent call last):
    ...
    stragglar.formats.schedule_document.ScheduleFormatError: collective: missing required key
    """
    d = _check_header(doc)
    algorithm, n, c, straggler = _head(d)
    idle = IdleRounds()
    with gc_paused():
        phases = tuple(
            _load_phase(p, f"phases[{i}]", n, c, idle, consume)
            for i, p in enumerate(_list(d["phases"], "phases"))
        )
    return Schedule(
        algorithm=algorithm,
        num_ranks=n,
        num_chunks=c,
        straggler=straggler,
        phases=phases,
        collective=COLLECTIVE,
        metadata=checked_metadata(d.get("metadata", {})),
    )


def to_document(schedule: Schedule) -> dict[str, Any]:
    """The version-1 document of ``schedule``: plain JSON values, metadata keys sorted.

    Raises :class:`ScheduleFormatError` if the schedule cannot make a valid document
    (say a chunk out of range, or metadata that is not JSON).

    >>> from stragglar.schedule import Phase, Schedule, Transfer
    >>> doc = to_document(Schedule("ring", 2, 1, None, (Phase("p", (0, 1), ((Transfer(0, 1, 0),),)),)))
    >>> doc["phases"][0]["rounds"]
    [[{'src': 0, 'dst': 1, 'chunk': 0, 'op': 'copy'}]]
    """
    head = document_head(schedule)
    n, c, idle = head["num_ranks"], head["num_chunks"], IdleRounds()
    phases = []
    for i, p in enumerate(schedule.phases):
        path = f"phases[{i}]"
        phases.append({**phase_head(p, path, n), "rounds": list(dump_rounds(p, path, n, c, idle))})
    return {**head, "phases": phases, "metadata": checked_metadata(dict(schedule.metadata))}


def document_head(schedule: Schedule) -> dict[str, Any]:
    """The document's keys before its phases, checked."""
    if not isinstance(schedule, Schedule):  # a Proof, say: its fields were read as a schedule's
        hint = ": pass its .schedule" if isinstance(getattr(schedule, "schedule", None), Schedule) else ""
        raise ArgumentError(f"expected a Schedule, got {type(schedule).__name__}{hint}")
    _const(schedule.collective, "collective", COLLECTIVE)
    n, c, straggler = _sizes(schedule.num_ranks, schedule.num_chunks, schedule.straggler)
    return {
        "format": FORMAT,
        "version": VERSION,
        "collective": COLLECTIVE,
        "algorithm": _str(schedule.algorithm, "algorithm", nonempty=True),
        "num_ranks": n,
        "num_chunks": c,
        "straggler": straggler,
    }
