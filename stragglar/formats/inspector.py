"""NCCL Inspector's JSON output as arrival traces.

NCCL's Inspector profiler plugin writes, per process, a file of JSON objects, one per line: a
completed collective's record carries ``header`` (the communicator's ``id``, the process's
``rank`` in it and its ``n_ranks``), ``metadata`` and ``coll_perf`` (``coll``, the collective
type; ``coll_sn``, its sequence number; ``coll_msg_size_bytes``; and, written only in verbose
mode, ``event_trace_ts``: microsecond timestamps of the host's enqueue, ``coll_start_ts``, and of
each channel's kernel start, ``kernel_events[].kernel_start_ts``).  A point-to-point record
(``p2p_perf``) is no collective and is passed over.

A rank's arrival is its GPU's: the first of its channels' kernel starts.  The host's enqueue is
not it: CUDA queues work, so a rank whose GPU is still busy with its backward pass enqueues the
collective on time and its kernel starts late; the kernel start is where a late rank shows.
Without verbose mode a record has no time of either (only a duration and the time of the dump),
so it is refused, naming the setting that writes the times, rather than replayed on a guess.

NCCL numbers each collective type apart (an AllReduce and a Broadcast may both be number 7), so
a communicator's records must be of one type: ``--where coll=AllReduce`` picks the gradient
collective.  Ranks of a communicator are its ranks ``0..n_ranks-1``; each step is one
``coll_sn``; the timestamps are the host's wall clock (``gettimeofday``), so ranks on several
hosts compare as well as their clocks are synchronised.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from stragglar.errors import InputError, quoted, shown
from stragglar.formats.collectives import Record, collect, whole_number
from stragglar.formats.trace_reading import json_object, numbered_lines, open_trace, shown_value, where_text
from stragglar.formats.traces import MAX_ROWS, Group, check_read

__all__ = ["MAX_RANKS", "read_inspector"]

MICROSECOND = Fraction(1, 10**6)
MAX_RANKS = 2**20  # ranks of a trace's communicators, all sizes: labels are made before records are checked


def read_inspector(
    paths: Sequence[Path], where: Sequence[tuple[str, str]] = (), max_rows: int = MAX_ROWS
) -> list[Group]:
    """The communicators of the NCCL Inspector files ``paths`` (one per process), from the
    collectives whose ``where`` fields (of ``coll_perf``, else of ``header``) have those values,
    compared as text; each step's size from ``coll_msg_size_bytes``."""
    name = shown(paths[0]) if len(paths) == 1 else f"the {len(paths):,} NCCL Inspector files"
    labels = _Labels()
    records = (record for path in paths for record in _records(path, where, labels))
    return collect(records, "communicator", "coll", name, bool(where), max_rows)


def _records(path: Path, where: Sequence[tuple[str, str]], labels: _Labels) -> Iterator[Record]:
    name = shown(path)
    with open_trace(path) as file:
        for number, line in numbered_lines(file, name):
            check_read(number, name, "line")
            if not line.strip():
                continue
            place = f"{name} line {number}"
            if not line.endswith("\n") and not _whole_json(line):
                return  # the last line, cut off: a job killed while the plugin wrote it
            record = json_object(line, place)
            if "coll_perf" not in record and "p2p_perf" in record:
                continue  # a send or a receive: no collective
            header, perf = _part(record, "header", place), _part(record, "coll_perf", place)
            if all(
                where_text(_field(perf, header, column, place)) == value.strip() for column, value in where
            ):
                yield _record(header, perf, name, place, labels)


def _whole_json(line: str) -> bool:
    """Whether a file's last line, which has no line end, is whole JSON.  The plugin ends every
    record with one, so a last line cut off is the record it was writing when the process died:
    it is passed over, and the files' common steps end before it (the records before it are
    whole), where refusing it would refuse the whole trace of a job that was killed."""
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def _record(
    header: Mapping[str, Any], perf: Mapping[str, Any], name: str, place: str, labels: _Labels
) -> Record:
    ranks = _whole(header, "n_ranks", place)
    rank = _whole(header, "rank", place)
    if rank >= ranks:
        raise InputError(f"{place}: rank {rank} of a communicator of {ranks} ranks")
    kind = perf.get("coll")
    if not isinstance(kind, str) or not kind:
        raise InputError(f"{place}: coll_perf.coll is {shown_value(kind)}: name the collective")
    communicator = header.get("id")
    if not isinstance(communicator, str) or not communicator:
        raise InputError(f"{place}: header.id is {shown_value(communicator)}: name the communicator")
    return Record(
        group=communicator,
        members=labels.of(ranks, place),
        rank=str(rank),
        step=_whole(perf, "coll_sn", place),
        time=_kernel_start(perf, place) * MICROSECOND,
        size=_whole(perf, "coll_msg_size_bytes", place),
        kind=kind,
        source=name,
        place=place,
    )


class _Labels:
    """The labels of the communicators' ranks, one tuple per size for all records of that size,
    made only up to :data:`MAX_RANKS` labels in all: a record's ``n_ranks`` is made before
    anything checks it, and a few hundred records of a million ranks each would take gigabytes."""

    def __init__(self) -> None:
        self.made: dict[int, tuple[str, ...]] = {}
        self.count = 0

    def of(self, ranks: int, place: str) -> tuple[str, ...]:
        labels = self.made.get(ranks)
        if labels is None:
            if self.count + ranks > MAX_RANKS:
                before = f": with {self.count:,} ranks of other sizes," if self.made else ":"
                raise InputError(
                    f"{place}: n_ranks is {ranks:,}{before} stragglar replays up to {MAX_RANKS:,} ranks"
                )
            labels = self.made[ranks] = tuple(str(rank) for rank in range(ranks))
            self.count += ranks
        return labels


def _kernel_start(perf: Mapping[str, Any], place: str) -> int:
    """The first kernel start of the collective's channels (microseconds)."""
    trace = perf.get("event_trace_ts")
    if trace is None:
        raise InputError(
            f"{place}: no kernel start times (coll_perf.event_trace_ts): NCCL Inspector writes them "
            "with NCCL_INSPECTOR_DUMP_VERBOSE=1"
        )
    if not isinstance(trace, dict) or not isinstance(trace.get("kernel_events"), list):
        raise InputError(f"{place}: coll_perf.event_trace_ts has no list of kernel_events")
    starts = [
        _whole(event, "kernel_start_ts", f"{place}: a kernel event") for event in trace["kernel_events"]
    ]
    started = [start for start in starts if start > 0]  # a channel's 0: its start was never seen
    if not started:
        raise InputError(f"{place}: no kernel of the collective has a start time")
    return min(started)


def _part(record: Mapping[str, Any], key: str, place: str) -> Mapping[str, Any]:
    part = record.get(key)
    if not isinstance(part, dict):
        why = "no" if part is None else "a malformed"
        raise InputError(f"{place}: {why} {quoted(key)} object: not an NCCL Inspector record")
    return part


def _field(perf: Mapping[str, Any], header: Mapping[str, Any], column: str, place: str) -> Any:
    """A ``--where`` field: the collective's, else the communicator's."""
    for part in (perf, header):
        if column in part:
            return part[column]
    raise InputError(f"{place} has no {quoted(column)} in coll_perf or header")


def _whole(part: Any, key: str, place: str) -> int:
    return whole_number(part.get(key) if isinstance(part, dict) else None, key, place)
