"""The long table's rows and cells: a trace in CSV, JSON Lines or Parquet read row by row, each
row the needed columns' values, and each cell read as a group's or a rank's label, a step or a
time in seconds.

Apart from :func:`~stragglar.formats.traces.read_trace`, which groups the rows, because each
format has its own ways to be wrong (a quote left open, a line cut short, a key given twice, a
gzip-compressed Parquet file) and each is told here, where the format's lines or rows are
numbered; the grouping sees only the rows and the place each came from.
"""

from __future__ import annotations

import csv
import gzip
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, BinaryIO

from stragglar.errors import InputError, quoted, shown
from stragglar.formats.trace_reading import (
    WHOLE_NUMBER,
    exact_time,
    json_object,
    numbered_lines,
    shown_value,
    where_text,
)
from stragglar.units import TIME_UNITS

__all__ = ["TABLE_FORMATS", "cell_label", "cell_seconds", "cell_step", "table_rows"]

TABLE_FORMATS = ("csv", "jsonl", "parquet")
_STEP_DIGITS = 18  # a step number's, at most: beyond, no trace counts steps
_BATCH = 65_536  # Parquet rows decoded at a time


def table_rows(
    file: BinaryIO, fmt: str, name: str, needed: Sequence[str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The rows of the table in ``file`` (named ``name``, of format ``fmt``, one of
    :data:`TABLE_FORMATS`), each as the place it came from (``t.csv line 7``) and the values of
    the ``needed`` columns; a column missing from the table an :class:`InputError`."""
    rows = {"csv": _csv_rows, "jsonl": _jsonl_rows, "parquet": _parquet_rows}[fmt]
    return rows(file, name, needed)


@dataclass(frozen=True)
class _Seconds:
    """A time that carries its unit (a Parquet timestamp or duration), in seconds since its epoch."""

    seconds: Fraction

    def __str__(self) -> str:
        return str(self.seconds)


def cell_seconds(value: Any, column: str, place: str, unit: Fraction | None) -> tuple[int, int]:
    """A time in seconds, exact, as ``(numerator, denominator)`` (not reduced: see
    :func:`~stragglar.formats.trace_reading.exact_time`): a number times ``unit`` (None: none
    given, seconds), or a timestamp or duration in its own unit, for which a unit given, even
    seconds, is an error."""
    if not isinstance(value, _Seconds):
        numerator, denominator = exact_time(value, column, place)
        if unit is None:
            return numerator, denominator
        return numerator * unit.numerator, denominator * unit.denominator
    if unit is not None:
        raise InputError(f"{place}: {column} is a timestamp or duration, in its own unit: drop --time-unit")
    return value.seconds.as_integer_ratio()


def cell_label(value: Any, column: str, place: str) -> str:
    """A group's or a rank's label: a string or a whole number."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    label = where_text(value)
    if isinstance(value, (bool, dict, list)) or value is None or not label:
        raise InputError(f"{place}: {column} is {shown_value(value)}: name a rank or group")
    if not label.isprintable():  # a NUL or a line break in a cell: '1\x00' would be a rank of its own
        raise InputError(f"{place}: {column} is {shown_value(value)}: a control character in a label")
    return label


def cell_step(value: Any, column: str, place: str) -> int:
    """A step: a whole number."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    whole = None
    if isinstance(value, int) and not isinstance(value, bool):
        whole = value
    elif isinstance(value, str) and WHOLE_NUMBER.fullmatch(value.strip()):
        digits = value.strip().lstrip("+-")
        whole = int(value) if len(digits) <= _STEP_DIGITS else 10**_STEP_DIGITS  # not parsed: 10**6 digits
    if whole is None:
        raise InputError(f"{place}: {column} is {shown_value(value)}, not a whole number of steps")
    if abs(whole) >= 10**_STEP_DIGITS:
        raise InputError(
            f"{place}: {column} is {shown_value(value)}: a step has at most {_STEP_DIGITS} digits"
        )
    return whole


def _csv_rows(file: BinaryIO, name: str, needed: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    lines = numbered_lines(file, name)
    unended: list[int] = []  # the line without a line end: only a file's last can be one

    def text() -> Iterator[str]:
        for number, line in lines:
            if not line.endswith(("\n", "\r")):
                unended.append(number)
            yield line

    reader = csv.reader(text())  # its line_num: the lines it has taken, a row's last among them
    try:
        header = next(reader, None)
        if header is None or not any(cell.strip() for cell in header):
            raise InputError(f"{name} is empty: no header row")
        header = [cell.strip() for cell in header]
        where = _missing(header, needed, name)
        columns, cells_of = tuple(where), operator.itemgetter(*where.values())
        last = reader.line_num
        for cells in reader:
            first, last = last + 1, reader.line_num
            if not "".join(cells).strip():  # no cell but spaces (one C call, not one a cell)
                continue  # a blank line
            place = f"{name} line {first}" if first == last else f"{name} lines {first} to {last}"
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
            yield place, dict(zip(columns, cells_of(cells), strict=True))
    except csv.Error as e:
        at = f"{name} line {max(reader.line_num, 1)}"
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
