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

Reading streams the file and keeps only the rows that pass the filters, at most
:data:`MAX_ROWS` of them and lines of at most :data:`MAX_LINE` bytes, so a huge file is refused
in bounded memory, not loaded.

The collective libraries' own records (NCCL Inspector's JSON, PyTorch Flight Recorder's dumps)
are no long table: :mod:`stragglar.formats.inspector` and :mod:`stragglar.formats.flight_recorder`
read them into the same :class:`Group`.  :func:`trace_format_of` tells the five apart by their
content, so a file need not be named for its format.
"""

from __future__ import annotations

import csv
import errno
import gzip
import json
import math
import os
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, BinaryIO, cast

from stragglar.errors import SHOWN_CHARACTERS, InputError, ResourceError, quoted, ran_out, shown
from stragglar.files import json_complaint, open_appending, open_regular, refuse_standard_input
from stragglar.units import TIME_UNITS

__all__ = [
    "FLIGHT_RECORDER",
    "INSPECTOR",
    "MAX_FILES",
    "MAX_LINE",
    "MAX_READ_ROWS",
    "MAX_ROWS",
    "TABLE_FORMATS",
    "TIME_UNITS",
    "TRACE_FORMATS",
    "Columns",
    "Group",
    "TraceWriter",
    "exact_time",
    "json_object",
    "names_collective",
    "numbered_lines",
    "open_trace",
    "rank_order",
    "read_at_most",
    "read_trace",
    "shown_value",
    "trace_files",
    "trace_format_of",
    "trace_lines",
    "where_text",
]

TABLE_FORMATS = ("csv", "jsonl", "parquet")
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
MAX_LINE = 2**20  # bytes in one line of CSV or JSON Lines
_NUMBER = re.compile(r"[+-]?(?:\d{1,40}(?:\.\d{0,40})?|\.\d{1,40})(?:[eE][+-]?\d{1,3})?", re.ASCII)
MAX_TIME = 10**30  # a time's magnitude in its unit (ns since 1970 are 10**18): differences stay floats
_WHOLE = re.compile(r"[+-]?\d+", re.ASCII)  # ASCII digits: Python's int() takes any script's
_STEP_DIGITS = 18  # a step number's, at most: beyond, no trace counts steps
_BATCH = 65_536  # Parquet rows decoded at a time
MAX_FILES = 65_536  # files of one trace: a rank's file each
_BOM = "\ufeff"  # what some editors and spreadsheets put before a UTF-8 file's first line
_SNIFF = 4096  # bytes of a file's start that tell its format
_PICKLE_PROTOCOLS = (b"\x02", b"\x03", b"\x04", b"\x05")
_GZIP = b"\x1f\x8b"  # a gzip stream's first two bytes


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
    trace's labels of ranks ``0..N-1``; ``times[i][r]`` is when rank ``r`` reached the collective
    at step ``steps[i]``, in seconds (exact), steps in ascending order; ``sizes[i]`` the bytes of
    step ``i``'s collective where the trace records them (a collective library's records do, a
    table does not: None); ``partial`` the steps only some ranks recorded, left out (a library's
    buffer that wrapped, a dump taken while another rank was ahead, a library that samples);
    ``kind`` the collective's name where the trace gives it (``AllReduce``, ``nccl:all_reduce``)."""

    name: str | None
    ranks: tuple[str, ...]
    steps: tuple[int, ...]
    times: tuple[tuple[Fraction, ...], ...]
    sizes: tuple[int, ...] | None = None
    partial: int = 0
    kind: str | None = None

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
        if not path.is_dir():
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
            if start.removeprefix(_BOM.encode()).lstrip().startswith(b"{"):
                start += file.readline(MAX_LINE)  # the whole first line: a record's keys in any order
    except (InputError, OSError, EOFError, zlib.error):
        return None  # told by the name; reading the file says what is wrong with it
    if start.startswith(b"PAR1"):
        return "parquet"
    if start[:1] == b"\x80" and start[1:2] in _PICKLE_PROTOCOLS:
        return FLIGHT_RECORDER  # a pickle's first opcode: PROTO, then its version
    text = start.decode("utf-8", errors="replace").removeprefix(_BOM).lstrip()
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


@contextmanager
def open_trace(path: Path, limit: int | None = None) -> Iterator[BinaryIO]:
    """The regular file ``path`` open for reading (binary, at most ``limit`` bytes on disk),
    through gzip where it is compressed (``*.log.gz``: logs are often kept so): the readers
    stream it and bound what they keep, as they do an uncompressed file."""
    with open_regular(path, "traces", limit) as raw:
        magic = read_at_most(raw, 2, shown(path))
        raw.seek(0)
        if magic != _GZIP:
            yield raw
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
            yield cast(BinaryIO, unzipped)


def read_at_most(file: BinaryIO, size: int, name: str) -> bytes:
    """At most ``size`` bytes of ``file`` (a trace file ``name``, from :func:`open_trace`); a failed
    read, or a gzip stream cut short or corrupt, an :class:`InputError` naming the file."""
    try:
        return file.read(size)
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"cannot read {name}: {_reading_error(e)}") from None


def _reading_error(error: Exception) -> str:
    if isinstance(error, EOFError):
        return "the gzip stream ends early (a file cut short)"
    if isinstance(error, (zlib.error, gzip.BadGzipFile)):
        return f"not a whole gzip file ({error})"
    return str(getattr(error, "strerror", None) or error)


def read_trace(
    path: Path,
    fmt: str,
    columns: Columns,
    where: Sequence[tuple[str, str]] = (),
    unit: Fraction = Fraction(1),
    max_rows: int = MAX_ROWS,
) -> list[Group]:
    """The groups of the trace in ``path`` (of format ``fmt``), from its rows whose ``where``
    columns have those values (compared as text), times multiplied by ``unit`` to seconds.

    Every malformed input is an :class:`InputError` naming the file and, where there is one, the
    line: a missing column, a time that is no number, a step that is no whole number, a rank
    given twice at a step or missing from one, no rows (after the filters), more than
    ``max_rows`` of them, or more than :data:`MAX_READ_ROWS` read."""
    name = shown(path)
    needed = [columns.step, columns.rank, columns.time, *([columns.group] if columns.group else [])]
    needed += [column for column, _ in where if column not in needed]
    rows = {"csv": _csv_rows, "jsonl": _jsonl_rows, "parquet": _parquet_rows}[fmt]
    found: dict[str | None, dict[int, dict[str, Fraction]]] = {}
    kept = 0
    with open_trace(path) as file:
        for read, (place, row) in enumerate(rows(file, name, needed), 1):
            if read > MAX_READ_ROWS:
                raise InputError(
                    f"{name} has more than {MAX_READ_ROWS:,} rows: cut the trace to the steps to replay "
                    "(--where reads every row)"
                )
            if any(where_text(row[column]) != value.strip() for column, value in where):
                continue
            kept += 1
            if kept > max_rows:
                raise InputError(
                    f"{name} has more than {max_rows:,} rows to replay: "
                    "pick fewer with --where, or cut the trace"
                )
            group = None if columns.group is None else _label(row[columns.group], columns.group, place)
            step = _step(row[columns.step], columns.step, place)
            rank = _label(row[columns.rank], columns.rank, place)
            time = _seconds(row[columns.time], columns.time, place, unit)
            ranks = found.setdefault(group, {}).setdefault(step, {})
            if rank in ranks:
                where_group = "" if group is None else f" of group {quoted(group)}"
                raise InputError(f"{place}: rank {quoted(rank)} at step {step}{where_group} is there twice")
            ranks[rank] = time
    if not found:
        why = "after the --where filters" if where else "in it"
        raise InputError(f"{name} has no rows {why}")
    return [_group(name, group, steps) for group, steps in sorted(found.items(), key=lambda kv: kv[0] or "")]


def _group(name: str, group: str | None, steps: Mapping[int, Mapping[str, Fraction]]) -> Group:
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
    return Group(group, tuple(labels), tuple(sorted(steps)), tuple(times))


def rank_order(label: str) -> tuple[int, int, str]:
    """Ranks in numeric order where their labels are whole numbers, before any other label."""
    return (0, int(label), "") if _WHOLE.fullmatch(label) else (1, 0, label)


def where_text(value: Any) -> str:
    """A value as a ``--where`` compares it: a string stripped as a cell is, bytes (a Parquet
    binary column) as the UTF-8 text they hold, anything else as JSON writes it (a decimal or a
    timestamp as it prints).  A value JSON cannot write (a pickle's dictionary with tuple keys, a
    list that holds itself) is its type's name in angle brackets (``<dict>``).  Past
    :data:`MAX_LINE` characters the text stops (with an ellipsis), as no ``--where`` value is that
    long: a pickle of lists that share lists is 16 KB of file and gigabytes of text."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace").strip()
    parts: list[str] = []
    size = 0
    try:
        for part in json.JSONEncoder(default=str).iterencode(value):  # lazily: stops at the bound
            parts.append(part)
            size += len(part)
            if size > MAX_LINE:
                return "".join(parts)[:MAX_LINE] + "\u2026"
    except (TypeError, ValueError, RecursionError):
        return f"<{type(value).__name__}>"
    return "".join(parts)


@dataclass(frozen=True)
class _Seconds:
    """A time that carries its unit (a Parquet timestamp or duration), in seconds since its epoch."""

    seconds: Fraction

    def __str__(self) -> str:
        return str(self.seconds)


def _seconds(value: Any, column: str, place: str, unit: Fraction) -> Fraction:
    """A time in seconds: a number times ``unit``, or a timestamp or duration in its own unit."""
    if not isinstance(value, _Seconds):
        return exact_time(value, column, place) * unit
    if unit != 1:
        raise InputError(f"{place}: {column} is a timestamp or duration, in its own unit: drop --time-unit")
    return value.seconds


def _label(value: Any, column: str, place: str) -> str:
    """A group's or a rank's label: a string or a whole number."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    label = where_text(value)
    if isinstance(value, (bool, dict, list)) or value is None or not label:
        raise InputError(f"{place}: {column} is {shown_value(value)}: name a rank or group")
    if not label.isprintable():  # a NUL or a line break in a cell: '1\x00' would be a rank of its own
        raise InputError(f"{place}: {column} is {shown_value(value)}: a control character in a label")
    return label


def _step(value: Any, column: str, place: str) -> int:
    """A step: a whole number."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    whole = None
    if isinstance(value, int) and not isinstance(value, bool):
        whole = value
    elif isinstance(value, str) and _WHOLE.fullmatch(value.strip()):
        digits = value.strip().lstrip("+-")
        whole = int(value) if len(digits) <= _STEP_DIGITS else 10**_STEP_DIGITS  # not parsed: 10**6 digits
    if whole is None:
        raise InputError(f"{place}: {column} is {shown_value(value)}, not a whole number of steps")
    if abs(whole) >= 10**_STEP_DIGITS:
        raise InputError(
            f"{place}: {column} is {shown_value(value)}: a step has at most {_STEP_DIGITS} digits"
        )
    return whole


def exact_time(value: Any, column: str, place: str) -> Fraction:
    """A time as an exact fraction of its unit: a finite number (a Parquet decimal too), or a
    decimal string, of magnitude below :data:`MAX_TIME`."""
    time = None
    if isinstance(value, bool):
        pass
    elif (
        isinstance(value, int)
        or (isinstance(value, float) and math.isfinite(value))
        or (isinstance(value, Decimal) and value.is_finite())
    ):
        time = Fraction(value)
    elif isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        time = Fraction(value.strip())
    if time is None:
        raise InputError(f"{place}: {column} is {shown_value(value)}, not a number")
    if abs(time) >= MAX_TIME:
        raise InputError(f"{place}: {column} is {shown_value(value)}: at most {MAX_TIME:.0e} of its unit")
    return time


def shown_value(value: Any) -> str:
    """A value of a trace as a message shows it: a string quoted, anything else as JSON writes it."""
    if isinstance(value, str):
        return quoted(value)
    text = where_text(value) if value is not None else "empty"
    if len(text) > MAX_LINE:  # where_text stopped: its length is not the value's
        return f"{shown(text[:SHOWN_CHARACTERS])}... (more than {MAX_LINE:,} characters)"
    return shown(text)


def numbered_lines(file: BinaryIO, name: str) -> Iterator[tuple[int, str]]:
    """The file's lines, numbered from 1, each at most :data:`MAX_LINE` bytes of UTF-8; a byte
    order mark before the first is no part of it (a spreadsheet's CSV export starts with one)."""
    number = 0
    while True:
        try:
            line = file.readline(MAX_LINE + 1)
        except (OSError, EOFError, zlib.error) as e:
            raise InputError(f"cannot read {name}: {_reading_error(e)}") from None
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            raise InputError(f"{name} line {number} is longer than {MAX_LINE:,} bytes")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{name} line {number}: not UTF-8 text: byte {e.start}") from None
        yield number, text.removeprefix(_BOM) if number == 1 else text


def _csv_rows(file: BinaryIO, name: str, needed: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    lines = numbered_lines(file, name)
    numbers: list[int] = []
    unended: list[int] = []  # the line without a line end: only a file's last can be one

    def text() -> Iterator[str]:
        for number, line in lines:
            numbers.append(number)
            if not line.endswith(("\n", "\r")):
                unended.append(number)
            yield line

    reader = csv.reader(text())
    try:
        header = next(reader, None)
        if header is None or not any(cell.strip() for cell in header):
            raise InputError(f"{name} is empty: no header row")
        header = [cell.strip() for cell in header]
        where = _missing(header, needed, name)
        numbers.clear()
        for cells in reader:
            first, last = numbers[0], numbers[-1]
            numbers.clear()
            place = f"{name} line {first}" if first == last else f"{name} lines {first} to {last}"
            if not any(cell.strip() for cell in cells):
                continue  # a blank line
            if len(cells) != len(header):
                # a quote never closed takes every line after it into one field
                opened = (
                    f" (a quoted field runs from line {first}: a quote left open?)" if first != last else ""
                )
                raise InputError(f"{place}: {len(cells)} fields, the header has {len(header)}{opened}")
            if unended:  # a number cut short is still a number: 1750000003900 for 1750000003900020
                raise InputError(
                    f"{place} has no line end: was the file cut while it was written? (end the line to "
                    "replay it as it is)"
                )
            yield place, {column: cells[index] for column, index in where.items()}
    except csv.Error as e:
        at = f"{name} line {numbers[-1] if numbers else 1}"
        if "new-line character seen in unquoted field" in str(e):  # Python's advice is to the programmer
            raise InputError(f"{at}: a carriage return alone ends lines: make them line feeds") from None
        raise InputError(f"{at}: not CSV: {e}") from None


def _missing(header: Sequence[str], needed: Sequence[str], name: str) -> dict[str, int]:
    """Where each needed column is in ``header``; a missing one is an error naming those there."""
    for column in needed:
        if column not in header:
            there = ", ".join(quoted(c, 30) for c in header[:8]) + (", ..." if len(header) > 8 else "")
            raise InputError(f"{name} has no column {quoted(column)} (its columns: {there})")
    if len(set(header)) != len(header):
        twice = next(c for c in header if header.count(c) > 1)
        raise InputError(f"{name} has two columns named {quoted(twice)}")
    return {column: header.index(column) for column in needed}


def _jsonl_rows(file: BinaryIO, name: str, needed: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    for number, line in numbered_lines(file, name):
        if not line.strip():
            continue
        place = f"{name} line {number}"
        row = json_object(line, place)
        for column in needed:
            if column not in row:
                raise InputError(f"{place} has no {quoted(column)}")
        yield place, row


def json_object(line: str, place: str) -> dict[str, Any]:
    """The JSON object on one line; anything else an :class:`InputError` naming ``place``: not
    JSON, NaN or an infinity (no number), a key given twice (which value is meant is the writer's
    secret; ``json`` would silently keep the last), or no object."""
    try:
        row = json.loads(line, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except ValueError as e:
        complaint = json_complaint(e).replace(" at line 1 column ", " at column ")  # its one line is place's
        raise InputError(f"{place}: not JSON: {shown(complaint, 120)}") from None
    except RecursionError:
        raise InputError(f"{place}: not JSON: nested too deeply") from None
    if not isinstance(row, dict):
        raise InputError(f"{place}: not a JSON object")
    return row


def _no_constant(word: str) -> Any:
    raise ValueError(f"{word} is no number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members, refused where a key is there twice."""
    row = dict(pairs)
    if len(row) != len(pairs):
        twice = next(key for i, (key, _) in enumerate(pairs) if any(k == key for k, _ in pairs[:i]))
        raise ValueError(f"the key {quoted(twice)} is there twice")
    return row


def _parquet_rows(file: BinaryIO, name: str, needed: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(
            "reading Parquet needs pyarrow: pip install pyarrow (or give the trace as CSV or JSON Lines)"
        ) from None
    import pyarrow

    if isinstance(
        file, gzip.GzipFile
    ):  # pyarrow seeks: through gzip, a decompression from the start each time
        raise InputError(
            f"{name}: a gzip-compressed Parquet file: gunzip it (Parquet compresses its columns)"
        )
    try:
        table = pq.ParquetFile(file)
        header = list(table.schema_arrow.names)
        _missing(header, needed, name)
        number = 0
        for batch in table.iter_batches(batch_size=_BATCH, columns=list(needed)):
            values = {
                column: _parquet_values(array)
                for column, array in zip(batch.schema.names, batch.columns, strict=True)
            }
            for index in range(batch.num_rows):
                number += 1
                yield f"{name} row {number}", {column: values[column][index] for column in values}
    except (pyarrow.ArrowException, OSError) as e:
        raise InputError(f"{name}: not a Parquet file pyarrow can read: {shown(e, 120)}") from None


def _parquet_values(array: Any) -> list[Any]:
    """A Parquet column's values as Python's: a timestamp or a duration exact, in seconds
    (profilers write timestamps: their integer in the column's unit, not a ``datetime`` cut to
    microseconds), anything else as pyarrow gives it (a decimal as a ``Decimal``)."""
    import pyarrow

    kind = array.type
    if not (pyarrow.types.is_timestamp(kind) or pyarrow.types.is_duration(kind)):
        return list(array.to_pylist())
    per_second = 1 / TIME_UNITS[kind.unit]
    counts = array.cast(pyarrow.int64()).to_pylist()
    return [None if count is None else _Seconds(Fraction(count) / per_second) for count in counts]


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
