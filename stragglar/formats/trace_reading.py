"""How every trace reader reads a file and a value, whatever the trace's format: the long table's
(:mod:`stragglar.formats.traces`), NCCL Inspector's (:mod:`stragglar.formats.inspector`) and
Flight Recorder's (:mod:`stragglar.formats.flight_recorder`).

One module, so that the three readers bound and refuse alike: a file is opened the one way
(regular files only, through gzip where compressed), a line is at most :data:`MAX_LINE` bytes of
UTF-8, a JSON line is one object with no key twice, a value is compared with ``--where`` and
shown in a message the one way, and a time is read exactly (a decimal string or an integer of
nanoseconds since 1970 is no float), so that the differences the policy judges are those of the
trace, however large its clock.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO, cast

from stragglar.errors import SHOWN_CHARACTERS, InputError, quoted, shown
from stragglar.files import json_complaint, open_regular

__all__ = [
    "BYTE_ORDER_MARK",
    "MAX_LINE",
    "MAX_TIME",
    "WHOLE_NUMBER",
    "exact_time",
    "json_object",
    "numbered_lines",
    "open_trace",
    "rank_order",
    "read_at_most",
    "shown_value",
    "where_text",
]

MAX_LINE = 2**20  # bytes in one line of CSV or JSON Lines
MAX_TIME = 10**30  # a time's magnitude in its unit (ns since 1970 are 10**18): differences stay floats
WHOLE_NUMBER = re.compile(r"[+-]?\d+", re.ASCII)  # ASCII digits: Python's int() takes any script's
BYTE_ORDER_MARK = "\ufeff"  # what some editors and spreadsheets put before a UTF-8 file's first line
# sign, whole digits, digits after a point, digits after a point alone (.5), exponent
_NUMBER = re.compile(r"([+-]?)(?:(\d{1,40})(?:\.(\d{0,40}))?|\.(\d{1,40}))(?:[eE]([+-]?\d{1,3}))?", re.ASCII)
_GZIP = b"\x1f\x8b"  # a gzip stream's first two bytes


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
        yield number, text.removeprefix(BYTE_ORDER_MARK) if number == 1 else text


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


def shown_value(value: Any) -> str:
    """A value of a trace as a message shows it: a string quoted, anything else as JSON writes it."""
    if isinstance(value, str):
        return quoted(value)
    text = where_text(value) if value is not None else "empty"
    if len(text) > MAX_LINE:  # where_text stopped: its length is not the value's
        return f"{shown(text[:SHOWN_CHARACTERS])}... (more than {MAX_LINE:,} characters)"
    return shown(text)


def exact_time(value: Any, column: str, place: str) -> tuple[int, int]:
    """A time as an exact fraction of its unit, ``(numerator, denominator)`` with the denominator
    above 0 and not reduced: a finite number (a Parquet decimal too), or a decimal string, of
    magnitude below :data:`MAX_TIME`.  A decimal string's denominator is 10 to the power of its
    digits after the point, so a column written with one precision shares one denominator and
    its times compare as the integers they are (:func:`~stragglar.units.common_ticks`), with no
    greatest common divisor taken per cell as a ``Fraction`` takes one.

    >>> exact_time(" 1.250 ", "t", "here"), exact_time("-.5e2", "t", "here"), exact_time(0.5, "t", "here")
    ((1250, 1000), (-50, 1), (1, 2))
    """
    ratio = None
    if isinstance(value, str):
        ratio = _decimal_ratio(value.strip())
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        ratio = (value, 1)
    elif (isinstance(value, float) and math.isfinite(value)) or (
        isinstance(value, Decimal) and value.is_finite()
    ):
        ratio = value.as_integer_ratio()
    if ratio is None:
        raise InputError(f"{place}: {column} is {shown_value(value)}, not a number")
    if abs(ratio[0]) >= MAX_TIME * ratio[1]:
        raise InputError(f"{place}: {column} is {shown_value(value)}: at most {MAX_TIME:.0e} of its unit")
    return ratio


def _decimal_ratio(text: str) -> tuple[int, int] | None:
    """A decimal text's exact value as (digits, 10 ** places), or None where it is no number."""
    number = _NUMBER.fullmatch(text)
    if number is None:
        return None
    sign, whole, point, alone, exponent = number.groups()
    places = point or alone or ""
    shift = (int(exponent) if exponent else 0) - len(places)
    digits = int(sign + (whole or "") + places)
    return (digits * 10**shift, 1) if shift >= 0 else (digits, 10**-shift)


def rank_order(label: str) -> tuple[int, int, str]:
    """Ranks in numeric order where their labels are whole numbers, before any other label."""
    return (0, int(label), "") if WHOLE_NUMBER.fullmatch(label) else (1, 0, label)
