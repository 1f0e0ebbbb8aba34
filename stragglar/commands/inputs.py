"""The commands' input files, told apart by content: a JSON schedule or an artifact."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stragglar.artifacts import MSCCL, ArtifactFormat, format_of
from stragglar.commands.terminal import busy
from stragglar.errors import InputError, shown
from stragglar.files import read_text
from stragglar.formats import schedule_json
from stragglar.schedule import Schedule

__all__ = ["Input", "load_schedule", "read_input"]


@dataclass(frozen=True)
class Input:
    """An input file, told apart by content, not by name: a file of an artifact ``format``
    (MSCCL XML, an MSCCL++ execution plan) or, where ``format`` is None, our JSON ``schedule``."""

    path: Path
    format: ArtifactFormat[Any] | None
    # for an artifact, what its format's tools take: the text, or the document its recognition
    # parsed (an MSCCL++ plan's JSON is parsed once); for a schedule, None (the schedule is all)
    source: Any
    schedule: Schedule | None  # for a schedule


def read_input(path: Path, refuse: Callable[[schedule_json.Header], None] | None = None) -> Input:
    """Read and classify an input file; a malformed one is an error naming the file.  ``refuse``
    may refuse a schedule by the sizes its header declares, before the rest is parsed
    (:func:`~stragglar.formats.schedule_json.header`); a header that does not tell them leaves the
    caller to check the schedule read.

    The text is parsed as JSON at most once, when a format's recogniser asks for it (the format then
    adopts that parse as its document, unless the parse read an object of the file as a
    schedule's transfer) or, for a schedule, to read it.  An empty file is called
    empty, whatever its name says."""
    with busy(f"reading {shown(path)}"):
        try:
            fmt, source = _classified(path, refuse)
            if fmt is not None:
                return Input(path, fmt, source, None)
            return Input(path, None, None, schedule_json.from_document(source, consume=True))
        except schedule_json.ScheduleFormatError as e:
            if path.suffix.lower() in MSCCL.suffixes and str(e).startswith("not JSON"):  # x.xml, no markup
                raise InputError(
                    f"{shown(path)} {MSCCL.unreadable}: it starts with no '<' (nor is it JSON)"
                ) from None
            raise schedule_json.ScheduleFormatError(f"{shown(path)}: {e}") from None


def _classified(
    path: Path, refuse: Callable[[schedule_json.Header], None] | None
) -> tuple[ArtifactFormat[Any] | None, Any]:
    """:func:`read_input`'s reading: an artifact's format and what its tools take, or None and a
    schedule's parsed document.  Its own function so that the text is let go before the schedule
    is built beside its parse (N = 1024: 93 MB of the peak)."""
    text = read_text(path)
    if not text.strip():
        raise InputError(f"{shown(path)} is empty: no schedule, MSCCL XML or MSCCL++ plan in it")
    if refuse is not None and (sizes := schedule_json.header(text)) is not None:
        refuse(sizes)  # a schedule: its tag says so, and no artifact has one
    document = functools.cache(lambda: schedule_json.parse(text))
    fmt = format_of(text, document)
    if fmt is not None:
        if fmt.adopt is not None and schedule_json.parsed_as_loaded(text):
            return fmt, fmt.adopt(document())
        return fmt, text
    root = document()
    if isinstance(root, dict) and "format" not in root:  # some other JSON: say what it is not
        raise InputError(
            f"{shown(path)} is JSON, but not a stragglar schedule (no 'format' key) "
            "nor an MSCCL++ plan (no 'gpus' list)"
        )
    return None, root


def load_schedule(
    path: Path, command: str, refuse: Callable[[schedule_json.Header], None] | None = None
) -> Schedule:
    """The JSON schedule in ``path``; another kind of file is an error that says what ``command``
    takes.  ``refuse`` is :func:`read_input`'s."""
    found = read_input(path, refuse)
    if found.format is not None:
        raise InputError(
            f"{shown(path)} is {found.format.title_with_article}: {command} takes a JSON schedule "
            "(see stragglar synth -o s.json)"
        )
    assert found.schedule is not None
    return found.schedule
