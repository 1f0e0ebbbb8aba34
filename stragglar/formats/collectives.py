"""Arrivals from a collective library's own records: one record per collective, per rank, per file.

NCCL Inspector (:mod:`stragglar.formats.inspector`) and PyTorch Flight Recorder
(:mod:`stragglar.formats.flight_recorder`) each write one file per process, each record naming
its group (a communicator, a process group), the group's ranks, the record's rank in it, the
collective's sequence number in the group and when the rank reached it.  Their readers turn each
record into a :class:`Record`; :func:`collect` turns the records of every file into the
:class:`~stragglar.formats.traces.Group` a table gives, checked the same way and more, since
here the files must agree with each other: a group's ranks are what every record of it says
(two records that disagree are refused), each rank's records come from one file (a rank in two
files is a copy too many), and every rank of the group is there.

A file holds the collectives of its process's recent past (a ring buffer that wraps, a job that
ended while one rank had written more than another), or a sample of them (NCCL's Inspector
before 2.30): the steps kept are those every rank recorded, and the others are counted
(``Group.partial``).  What ties the files to one job is their groups' ranks and sizes, checked
record by record, and a step that every rank recorded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from stragglar.errors import InputError, quoted
from stragglar.formats.trace_reading import rank_order, shown_value
from stragglar.formats.traces import MAX_ROWS, Group
from stragglar.units import common_ticks

__all__ = ["MAX_WHOLE", "Record", "collect", "whole_number"]

MAX_WHOLE = 2**64  # NCCL writes its counters and timestamps as unsigned 64-bit integers


@dataclass(frozen=True)
class Record:
    """One rank's record of one collective: its ``group`` with the labels of the group's ranks
    (``members``), the record's ``rank`` among them, its ``step`` (the group's sequence number),
    when the rank reached it (``time``, seconds, exact, on a clock that the group's ranks share
    at each step at least), its ``size`` in bytes (None: not recorded), its ``kind`` (a group
    holds one: an AllReduce and a Broadcast are two collectives, and NCCL numbers each type on
    its own, so they may even share a number), the file it came from (``source``) and the place
    to name in a message."""

    group: str
    members: tuple[str, ...]
    rank: str
    step: int
    time: Fraction
    size: int | None
    kind: str | None
    source: str
    place: str


@dataclass
class _Found:
    """What the records of one group said so far."""

    first: Record
    sources: dict[str, str] = field(default_factory=dict)  # rank -> the file its records are in
    steps: dict[str, dict[int, Record]] = field(default_factory=dict)  # rank -> step -> record


def whole_number(value: Any, key: str, place: str) -> int:
    """A record's count or timestamp: a whole number from 0 to below :data:`MAX_WHOLE`."""
    if type(value) is int and 0 <= value < MAX_WHOLE:
        return value
    if type(value) is int:  # whole, but out of the range: say which way
        why = (
            "negative, which no count or time here can be"
            if value < 0
            else "more than the 64 bits it is written in"
        )
        raise InputError(f"{place}: {key} is {shown_value(value)}: {why}")
    raise InputError(f"{place}: {key} is {shown_value(value)}, not a whole number")


def collect(
    records: Iterable[Record],
    word: str,
    kind_key: str,
    name: str,
    filtered: bool,
    max_rows: int = MAX_ROWS,
) -> list[Group]:
    """The groups of ``records`` (``word`` names a group: ``communicator``; ``kind_key`` the field
    that names a record's kind, for ``--where``; ``name`` what was read, for a message;
    ``filtered``: the records passed ``--where`` filters), at most ``max_rows`` records kept.
    Every inconsistency is an :class:`InputError` of one line."""
    found: dict[str, _Found] = {}
    for kept, record in enumerate(records, 1):
        if kept > max_rows:
            raise InputError(
                f"more than {max_rows:,} collectives to replay in {name}: pick fewer with --where"
            )
        _add(found.setdefault(record.group, _Found(record)), record, word, kind_key)
    if not found:
        why = " after the --where filters" if filtered else ""
        raise InputError(f"no collective in {name}{why}")
    return [_group(found[group], word) for group in sorted(found)]


def _add(found: _Found, record: Record, word: str, kind_key: str) -> None:
    first, what = found.first, f"{word} {quoted(record.group)}"
    if record.members != first.members:
        raise InputError(
            f"{record.place}: {what} has {len(record.members)} ranks here and {len(first.members)} "
            f"in {first.place}: the files are of different jobs"
        )
    if record.rank not in record.members:
        raise InputError(f"{record.place}: rank {quoted(record.rank)} is no rank of {what}")
    if record.kind != first.kind:
        raise InputError(
            f"{record.place}: {what} holds {record.kind} and {first.kind} collectives: keep one kind "
            f"with --where ({kind_key}={first.kind}, say)"
        )
    source = found.sources.setdefault(record.rank, record.source)
    if source != record.source:
        raise InputError(
            f"rank {quoted(record.rank)} of {what} is in two files, {source} and {record.source}: "
            "give each rank's file once"
        )
    steps = found.steps.setdefault(record.rank, {})
    if record.step in steps:
        raise InputError(
            f"{record.place}: rank {quoted(record.rank)} at step {record.step} of {what} is there twice "
            "(two collectives of one number: keep the gradient collective's with --where)"
        )
    steps[record.step] = record


def _group(found: _Found, word: str) -> Group:
    """A group's table over the steps every rank recorded, checked consistent.  A step some rank
    did not record is left out and counted (``partial``): at the ends, a ring buffer that
    wrapped or a dump taken while another rank was ahead; between, a library that writes a
    sample (NCCL's Inspector before 2.30 keeps one finished collective per communicator for its
    dump thread to write, and 2.30's ring drops the oldest when full)."""
    first = found.first
    what = f"{word} {quoted(first.group)}"
    ranks = sorted(first.members, key=rank_order)
    if len(ranks) < 2:
        raise InputError(f"{what} has one rank: a collective needs two at least")
    missing = [rank for rank in ranks if rank not in found.steps]
    if missing:
        raise InputError(
            f"{what} has {len(ranks)} ranks and no file holds rank {quoted(missing[0])}"
            + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
            + ": give every rank's file"
        )
    steps = sorted(set.intersection(*(set(found.steps[rank]) for rank in ranks)))
    if not steps:
        raise InputError(f"{what}: no step is recorded by every rank (the files are of different times)")
    times = []
    sizes: list[int | None] = []
    for step in steps:
        row = [found.steps[rank][step] for rank in ranks]
        times.append(tuple(record.time.as_integer_ratio() for record in row))
        sizes.append(_size(row, what, step))
    known = tuple(size for size in sizes if size is not None)
    partial = len({step for rank in ranks for step in found.steps[rank]}) - len(steps)
    ticks, per_second = common_ticks(times)
    return Group(
        first.group,
        tuple(ranks),
        tuple(steps),
        ticks,
        per_second,
        known if len(known) == len(sizes) else None,
        partial,
        first.kind,
    )


def _size(row: list[Record], what: str, step: int) -> int | None:
    """A step's bytes, which every rank must agree on: a rank reducing another size is another job."""
    one = row[0]
    for other in row:
        if other.size != one.size:
            raise InputError(
                f"{what}: at step {step} rank {quoted(one.rank)} reduces {one.size} bytes and rank "
                f"{quoted(other.rank)} {other.size}: mismatched ranks"
            )
    return one.size
