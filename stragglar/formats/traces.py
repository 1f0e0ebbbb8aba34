"""Arrival traces: when each rank reached each step's gradient collective, as a long table.

One row per (group, step, rank) with the time that rank reached the collective, in CSV (a
header row, then one row per line), JSON Lines (one object per line) or Parquet (through
pyarrow, the ``traces`` extra).  Columns are named by the reader's caller (:class:`Columns`):
a training job's own trace (per-rank op timers, a profiler's export) is read as it is, its
gradient collective picked out with filters (:func:`read_trace`'s ``where``).  Groups are
independent collectives (one data-parallel group per pipeline stage, say); within a group the
ranks are renumbered ``0..N-1`` in the order of their labels (numerically where every label is a
whole number), and every step must have a time for every rank of the group, once.

Times are read exactly (a decimal string or an integer of nanoseconds since 1970 is no float),
so that the differences the policy judges are those of the trace, however large its clock.

The DDP hook writes the same table (:class:`TraceWriter`): JSON Lines with ``step``, ``rank``
and ``time`` (seconds, relative to when the step's collective completed on that rank: minus how
long the rank waited for the last one, so at most 0), one complete line per row, all rows of a
step in one write on an ``O_APPEND`` descriptor: a reader never sees a partial line, and a job
that dies leaves every step it wrote whole.

Reading streams the file, row by row (:mod:`stragglar.formats.tables`, each format's rows and
cells), and keeps only the rows that pass the filters, at most :data:`MAX_ROWS` of them and lines
of at most :data:`~stragglar.formats.trace_reading.MAX_LINE` bytes, so a huge file is refused in
bounded memory, not loaded.

The collective libraries' own records (NCCL Inspector's JSON, PyTorch Flight Recorder's dumps)
are no long table: :mod:`stragglar.formats.inspector` and :mod:`stragglar.formats.flight_recorder`
read them into the same :class:`Group`, reading files and values as this reader does
(:mod:`stragglar.formats.trace_reading`).  :func:`trace_format_of` tells the five apart by their
content, so a file need not be named for its format.
"""

from __future__ import annotations

import errno
import json
import os
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Generic, TypeVar

from stragglar.errors import InputError, ResourceError, quoted, ran_out, shown
from stragglar.files import open_appending, open_regular, refuse_standard_input
from stragglar.formats.tables import TABLE_FORMATS, cell_label, cell_seconds, cell_step, table_rows
from stragglar.formats.trace_reading import BYTE_ORDER_MARK, MAX_LINE, open_trace, rank_order, where_text
from stragglar.units import TIME_UNITS, common_ticks

__all__ = [
    "FLIGHT_RECORDER",
    "INSPECTOR",
    "MAX_FILES",
    "MAX_READ_ROWS",
    "MAX_ROWS",
    "TABLE_FORMATS",
    "TIME_UNITS",
    "TRACE_FORMATS",
    "Columns",
    "Group",
    "TraceWriter",
    "check_read",
    "names_collective",
    "read_trace",
    "trace_files",
    "trace_format_of",
    "trace_lines",
]

INSPECTOR = "nccl-inspector"
FLIGHT_RECORDER = "flight-recorder"
TRACE_FORMATS = (*TABLE_FORMATS, INSPECTOR, FLIGHT_RECORDER)
TRACE_SUFFIXES = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}
MAX_ROWS = 1_000_000  # rows kept after the filters: about 300 MB of Python objects
# Rows read, kept or not: --where reads every row, at about 200,000 a second, so a 1.5 MB Parquet
# file of 100,000,000 repeated rows kept whatif busy for 8 minutes to keep none of them.
MAX_READ_ROWS = 10 * MAX_ROWS
MAX_FILES = 65_536  # files of one trace: a rank's file each
_SNIFF = 4096  # bytes of a file's start that tell its format
_PICKLE_PROTOCOLS = (b"\x02", b"\x03", b"\x04", b"\x05")
_Read = TypeVar("_Read", str, int)


@dataclass(frozen=True)
class Columns:
    """The columns that hold each row's group (None: one group), step, rank and time."""

    rank: str = "rank"
    step: str = "step"
    time: str = "time"
    group: str | None = None

    def __post_init__(self) -> None:
        """One column, one part: a step column read as the ranks too made each rank a step's
        only row, and the error spoke of a rank there twice."""
        parts = {"rank": self.rank, "step": self.step, "time": self.time, "group": self.group}
        named = [(part, column) for part, column in parts.items() if column is not None]
        for index, (part, column) in enumerate(named):
            other = next((p for p, c in named[:index] if c == column), None)
            if other is not None:
                raise InputError(
                    f"the {other} and the {part} column are both {quoted(column)}: name one for each"
                )


@dataclass(frozen=True)
class Group:
    """One group's steps (``name`` None: the trace has no group column): ``ranks`` are the
    trace's labels of ranks ``0..N-1``; ``ticks[i][r]`` is when rank ``r`` reached the collective
    at step ``steps[i]``, in whole ticks of ``1 / per_second`` seconds (exact: the least common
    multiple of the times' denominators, :func:`~stragglar.units.common_ticks`, so that the
    replay compares and subtracts integers), steps in ascending order; ``sizes[i]`` the bytes of
    step ``i``'s collective where the trace records them (a collective library's records do, a
    table does not: None); ``partial`` the steps only some ranks recorded, left out (a library's
    buffer that wrapped, a dump taken while another rank was ahead, a library that samples);
    ``kind`` the collective's name where the trace gives it (``AllReduce``, ``nccl:all_reduce``)."""

    name: str | None
    ranks: tuple[str, ...]
    steps: tuple[int, ...]
    ticks: tuple[tuple[int, ...], ...]
    per_second: int
    sizes: tuple[int, ...] | None = None
    partial: int = 0
    kind: str | None = None

    @property
    def times(self) -> tuple[tuple[Fraction, ...], ...]:
        """``times[i][r]``: the ticks in seconds, each exactly, for a reader that wants seconds."""
        return tuple(tuple(Fraction(tick, self.per_second) for tick in row) for row in self.ticks)

    @property
    def allreduce(self) -> bool:
        """Whether the group's collective is an AllReduce (or not named): what whatif prices."""
        return self.kind is None or names_collective(self.kind, "allreduce")


def names_collective(kind: str, *collectives: str) -> bool:
    """Whether ``kind``, as a library names a collective (``nccl:all_reduce``, ``AllReduce``,
    ``allreduce_coalesced``), is one of ``collectives`` (lower-case letters alone: ``allreduce``)."""
    letters = "".join(c for c in kind.lower() if c.isalpha())
    return any(name in letters for name in collectives)


def trace_files(paths: Sequence[Path], max_files: int = MAX_FILES) -> list[Path]:
    """The files ``paths`` name: a folder stands for the files in it, in name order (not its
    folders, nor its hidden files), as a collective library writes one file per process into
    one folder.  A folder with no file is an error; so are more than ``max_files`` files."""
    files: list[Path] = []
    for path in paths:
        refuse_standard_input(path, "traces")
        try:
            folder = path.is_dir()
        except OSError as e:  # a name too long: is_dir lets that through
            raise InputError(f"cannot read {shown(path)}: {e.strerror or e}") from None
        if not folder:
            files.append(path)
            continue
        try:
            found = sorted(p for p in path.iterdir() if not p.name.startswith(".") and not p.is_dir())
        except OSError as e:
            raise InputError(f"cannot list {shown(path)}: {e.strerror or e}") from None
        if not found:
            raise InputError(f"{shown(path)} is a folder with no file in it")
        files += found
        if len(files) > max_files:
            break
    if len(files) > max_files:
        raise InputError(f"more than {max_files:,} trace files: give fewer")
    return files


def trace_format_of(paths: Sequence[Path], given: str | None) -> str:
    """The format of the trace in ``paths``: ``given``, else what every file's content tells (a
    Parquet file's magic, a pickle's protocol, an NCCL Inspector record's ``header`` and
    ``coll_perf``, any other JSON object: JSON Lines; through gzip), else its suffix
    (``.csv``, ``.csv.gz``).  An empty file tells nothing and is passed over (a process that
    recorded nothing); files of two formats are refused, as one format is read from them all."""
    if given is not None:
        return given
    found: dict[str, Path] = {}
    for path in paths:
        told = _format_of_content(path) or TRACE_SUFFIXES.get(_suffix(path))
        if told is None:
            if _is_empty(path):
                continue
            with open_regular(path, "traces"):  # one it cannot read says so, not that it tells nothing
                pass
            raise InputError(
                f"cannot tell the format of {shown(path)} from its content or its name: name it .csv, "
                ".jsonl or .parquet, or give --format"
            )
        first = found.setdefault(told, path)
        if len(found) > 1:
            other = next(fmt for fmt in found if fmt != told)
            raise InputError(
                f"{shown(found[other])} is {_FORMAT_WORDS[other]} and {shown(first)} {_FORMAT_WORDS[told]}: "
                "give one trace's files"
            )
    if not found:
        raise InputError(
            f"{shown(paths[0])} is empty{'' if len(paths) == 1 else ', and so is every file given'}"
        )
    return next(iter(found))


_FORMAT_WORDS = {
    "csv": "CSV",
    "jsonl": "JSON Lines",
    "parquet": "Parquet",
    INSPECTOR: "NCCL Inspector's JSON",
    FLIGHT_RECORDER: "a Flight Recorder dump",
}


def _suffix(path: Path) -> str:
    """The suffix that names the format: ``.csv`` for ``a.csv`` and ``a.csv.gz``."""
    return (path.with_suffix("") if path.suffix.lower() == ".gz" else path).suffix.lower()


def _is_empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False  # reading it says what is wrong


def _format_of_content(path: Path) -> str | None:
    """The format the start of the file shows, or None: not a file, or nothing it tells."""
    try:
        with open_trace(path) as file:
            start = file.read(_SNIFF)
            if start.removeprefix(BYTE_ORDER_MARK.encode()).lstrip().startswith(b"{"):
                start += file.readline(MAX_LINE)  # the whole first line: a record's keys in any order
    except (InputError, OSError, EOFError, zlib.error):
        return None  # told by the name; reading the file says what is wrong with it
    if start.startswith(b"PAR1"):
        return "parquet"
    if start[:1] == b"\x80" and start[1:2] in _PICKLE_PROTOCOLS:
        return FLIGHT_RECORDER  # a pickle's first opcode: PROTO, then its version
    text = start.decode("utf-8", errors="replace").removeprefix(BYTE_ORDER_MARK).lstrip()
    if not text.startswith("{"):
        return None
    line = text.split("\n", 1)[0]
    try:
        first = json.loads(line)
    except (ValueError, RecursionError):
        if line.rstrip().endswith(("{", "[", ",")) and "\n" in text:  # an object spread over lines
            raise InputError(_not_json_lines(path, text)) from None
        if '"header"' in line and ('"coll_perf"' in line or '"p2p_perf"' in line):
            return INSPECTOR  # a record cut at MAX_LINE read: the reader says the line is too long
        return "jsonl"  # reading it says what is wrong with its first line
    if isinstance(first, dict) and "header" in first and ("coll_perf" in first or "p2p_perf" in first):
        return INSPECTOR
    if isinstance(first, dict) and "entries" in first and "pg_config" in first:
        raise InputError(_flight_recorder_json(path))
    return "jsonl"


def _not_json_lines(path: Path, text: str) -> str:
    """Why a file whose first line is no whole JSON object is refused: what it looks like."""
    if '"pg_config"' in text or '"entries"' in text:
        return _flight_recorder_json(path)
    what = "NCCL Inspector's records" if '"coll_perf"' in text or '"p2p_perf"' in text else "JSON"
    return (
        f"{shown(path)} holds {what} over several lines (pretty-printed?): stragglar reads JSON Lines, "
        "an object a line, as NCCL Inspector writes them (jq -c rewrites a file so)"
    )


def _flight_recorder_json(path: Path) -> str:
    return (
        f"{shown(path)} holds Flight Recorder's records as JSON: stragglar reads the pickles it writes "
        "to files (TORCH_NCCL_DEBUG_INFO_TEMP_FILE), one per rank"
    )


def read_trace(
    path: Path,
    fmt: str,
    columns: Columns,
    where: Sequence[tuple[str, str]] = (),
    unit: Fraction | None = None,
    max_rows: int = MAX_ROWS,
) -> list[Group]:
    """The groups of the trace in ``path`` (of format ``fmt``), from its rows whose ``where``
    columns have those values (compared as text), times multiplied by ``unit`` to seconds (None:
    no unit was given, a number is seconds; a timestamp or duration carries its own unit, and one
    given for it is an error).

    Every malformed input is an :class:`InputError` naming the file and, where there is one, the
    line: a missing column, a time that is no number, a step that is no whole number, a rank
    given twice at a step or missing from one, no rows (after the filters), more than
    ``max_rows`` of them, or more than :data:`MAX_READ_ROWS` read."""
    name = shown(path)
    needed = [columns.step, columns.rank, columns.time, *([] if columns.group is None else [columns.group])]
    needed += [column for column, _ in where if column not in needed]
    wanted = [(column, value.strip()) for column, value in where]
    groups, steps, ranks = (
        _Cells(cell_label, columns.group or ""),
        _Cells(cell_step, columns.step),
        _Cells(cell_label, columns.rank),
    )
    found: dict[str | None, dict[int, dict[str, tuple[int, int]]]] = {}
    kept = 0
    with open_trace(path) as file:
        for read, (place, row) in enumerate(table_rows(file, fmt, name, needed), 1):
            check_read(read, name, "row")
            if wanted and any(where_text(row[column]) != value for column, value in wanted):
                continue
            kept += 1
            if kept > max_rows:
                raise InputError(
                    f"{name} has more than {max_rows:,} rows to replay: "
                    "pick fewer with --where, or cut the trace"
                )
            group = None if columns.group is None else groups(row[columns.group], place)
            step = steps(row[columns.step], place)
            rank = ranks(row[columns.rank], place)
            time = cell_seconds(row[columns.time], columns.time, place, unit)
            at_step = found.setdefault(group, {}).setdefault(step, {})
            if rank in at_step:
                where_group = "" if group is None else f" of group {quoted(group)}"
                # a row per operation (a forward's, an all_reduce's): the one to replay is picked
                hint = "" if where else ": a row per operation? keep one with --where COLUMN=VALUE"
                raise InputError(
                    f"{place}: rank {quoted(rank)} at step {step}{where_group} is there twice{hint}"
                )
            at_step[rank] = time
    if not found:
        why = "after the --where filters" if where else "in it"
        raise InputError(f"{name} has no rows {why}")
    return [_group(name, group, steps) for group, steps in sorted(found.items(), key=lambda kv: kv[0] or "")]


def check_read(count: int, name: str, unit: str) -> None:
    """Refuse the trace file ``name`` at its ``count``-th ``unit`` read (a row, a line) past
    :data:`MAX_READ_ROWS`, kept or not: ``--where`` reads every one, and a few MB of gzip unpack
    to billions of them."""
    if count > MAX_READ_ROWS:
        raise InputError(
            f"{name} has more than {MAX_READ_ROWS:,} {unit}s: cut the trace to the steps to replay "
            f"(--where reads every {unit})"
        )


class _Cells(Generic[_Read]):
    """One column's cells, each distinct string or integer read once: a trace repeats a rank's
    label at every step and a step's number at every rank, and reading one (a strip, a regular
    expression, a check of its characters) costs several times the lookup.  Another value (a
    float, a bool, a list) is read each time; a cell that is refused is never kept."""

    def __init__(self, read: Callable[[Any, str, str], _Read], column: str) -> None:
        self._read: Callable[[Any, str, str], _Read] = read
        self._column = column
        self._seen: dict[str | int, _Read] = {}

    def __call__(self, value: Any, place: str) -> _Read:
        if type(value) is not str and type(value) is not int:  # True == 1, 1.0 == 1: not the same cell
            return self._read(value, self._column, place)
        known = self._seen.get(value)
        if known is None:
            known = self._seen[value] = self._read(value, self._column, place)
        return known


def _group(name: str, group: str | None, steps: Mapping[int, Mapping[str, tuple[int, int]]]) -> Group:
    """A group's table, checked complete: every step has every rank of the group."""
    labels = sorted({rank for ranks in steps.values() for rank in ranks}, key=rank_order)
    where = "" if group is None else f" in group {quoted(group)}"
    if len(labels) < 2:
        raise InputError(f"{name}: only one rank{where}: a collective needs two at least")
    times = []
    for step in sorted(steps):
        ranks = steps[step]
        if len(ranks) != len(labels):
            missing = next(rank for rank in labels if rank not in ranks)
            raise InputError(f"{name}: step {step}{where} has no row for rank {quoted(missing)}")
        times.append(tuple(ranks[rank] for rank in labels))
    ticks, per_second = common_ticks(times)
    return Group(group, tuple(labels), tuple(sorted(steps)), ticks, per_second)


def trace_lines(step: int, times: Sequence[float]) -> bytes:
    """One step's rows, one JSON line per rank, as :class:`TraceWriter` writes them.

    >>> trace_lines(3, [-0.25, 0.0])
    b'{"step": 3, "rank": 0, "time": -0.25}\\n{"step": 3, "rank": 1, "time": 0.0}\\n'
    """
    return "".join(
        json.dumps({"step": step, "rank": rank, "time": time}) + "\n" for rank, time in enumerate(times)
    ).encode("utf-8")


class TraceWriter:
    """Appends steps to a trace file, each step's lines whole in one write (``O_APPEND``): a
    reader, or a job that dies, never leaves half a line.  Rows are added after any already
    there (a resumed run's); a second run from step 1 would repeat their steps, which a reader
    refuses, and the DDP hook refuses such a file as its state is built."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._fd = open_appending(self.path, "traces")

    def append(self, step: int, times: Sequence[float]) -> None:
        """Add ``step``'s times (seconds, one per rank)."""
        data = trace_lines(step, times)
        try:
            before = os.fstat(self._fd).st_size
            written = os.write(self._fd, data)
            if written != len(data):  # a full disk part-way: the lines are cut off again
                os.ftruncate(self._fd, before)
                raise OSError(errno.ENOSPC, f"wrote {written} of {len(data)} bytes")
        except OSError as e:
            error = ResourceError if ran_out(e) else InputError
            raise error(f"cannot write the trace {shown(self.path)}: {e.strerror or e}") from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
