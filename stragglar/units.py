"""One place for quantities with units: sizes, durations and bandwidths, read and written.

Every option and every report goes through these functions, so ``64MiB`` or ``20ms`` means the
same thing wherever a user types it, and figures print the same way everywhere.  The policy:

* a **size** takes a unit (``B``, ``KB``/``MB``/``GB``/``TB`` decimal, ``KiB``/``MiB``/``GiB``/``TiB``
  binary) or none, which means bytes; it must come to a whole number of bytes;
* a **duration** needs a unit (``ns``, ``us`` or ``µs``, ``ms``, ``s``; ``0`` alone is allowed): a
  bare ``20`` could be milliseconds or seconds, so it is refused with the fix;
* a **bandwidth** needs a unit per second (``450GiB/s``, ``25GB/s``, ``100Gbit/s``, ``7.2Tbit/s``);
* units are read regardless of case, except a bit-style spelling (``Gb``, ``Mib``), and a rate
  whose ``b`` is lower case (``10gb/s``, ``8b/s``: network speeds are written so in bits), which
  are refused: read as bytes they would be 8 times what their writer meant (a size in lower
  case, ``64gb``, is bytes, as most tools read it);
* every number is finite and not negative, and within a sane maximum (no ``1e400``, ``inf``,
  ``nan``); the error names the fix;
* a **ratio** of times (a speed-up) prints two decimals from 1 up and three significant digits
  below (:func:`format_ratio`), so that a small one still says how small;
* a text of more than :data:`MAX_QUANTITY_CHARS` characters is refused before it is read, and an
  exponent is read as at most :data:`MAX_EXPONENT` either way, so no text costs more than
  microseconds: ``1e40000000`` is refused as more than the maximum at once, where exact arithmetic
  would first build a number of forty million digits.

>>> parse_size("64MiB"), parse_duration("20ms"), parse_bandwidth("450GiB/s") == 450 * 2**30
(67108864, 0.02, True)
>>> format_bytes(2**30), format_seconds(0.002884), format_ratio(0.01234)
('1 GiB', '2.884 ms', '0.0123')
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction

from stragglar.errors import InputError, quoted, shown

__all__ = [
    "MAX_BYTES",
    "MAX_EXPONENT",
    "MAX_QUANTITY_CHARS",
    "MAX_SECONDS",
    "MIN_BANDWIDTH",
    "TIME_UNITS",
    "common_ticks",
    "count_of",
    "exact_duration",
    "format_bytes",
    "format_ratio",
    "format_seconds",
    "parse_bandwidth",
    "parse_duration",
    "parse_size",
]

SIZE_UNITS = {
    "": 1,
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "eb": 10**18,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
    "eib": 2**60,  # every unit format_bytes prints is one a user may type back
}
BIT_UNITS = {
    "bit": Fraction(1, 8),
    "kbit": Fraction(10**3, 8),
    "mbit": Fraction(10**6, 8),
    "gbit": Fraction(10**9, 8),
    "tbit": Fraction(10**12, 8),
    "pbit": Fraction(10**15, 8),
    "ebit": Fraction(10**18, 8),
    "kibit": Fraction(2**10, 8),
    "mibit": Fraction(2**20, 8),
    "gibit": Fraction(2**30, 8),
    "tibit": Fraction(2**40, 8),
    "pibit": Fraction(2**50, 8),
    "eibit": Fraction(2**60, 8),  # the prefixes of the byte units, as NVLink-class rates are in Tbit/s
}
# every unit format_seconds prints is one a user may type back; the traces' time columns take them too
TIME_UNITS = {"s": Fraction(1), "ms": Fraction(1, 10**3), "us": Fraction(1, 10**6), "ns": Fraction(1, 10**9)}
_MICRO = ("\u00b5s", "\u03bcs")  # us written with the micro sign or the Greek mu, as both are typed
MAX_BYTES = 2**60  # an exbibyte: far beyond any buffer, and still exact in a float
MAX_SECONDS = 7 * 24 * 3600  # a week
MIN_BANDWIDTH = 1.0  # bytes/s: slower, an exbibyte's time overflows, and alpha x bandwidth underflows
# Bounds on the text, checked before any conversion.  A number of at most 64 characters that is
# not zero lies between 1e-63 and 1e64 before its exponent, so with an exponent over
# MAX_EXPONENT it is over 1e337, above every maximum here, and with one under -MAX_EXPONENT it is
# under 1e-337: not a whole byte, under 1 B/s, and 0.0 as a float of seconds (the least is 5e-324).
# Reading such an exponent as MAX_EXPONENT + 1 (or its negative) gives the same answer at once.
MAX_QUANTITY_CHARS = 64
MAX_EXPONENT = 400
_QUANTITY = re.compile(
    r"\s*([1-9][0-9]{0,2}(?:,[0-9]{3})+|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+\.)\s*([A-Za-z\u00b5\u03bc/]*)\s*"
)  # a whole number may group its digits in threes with commas, as reports print ``1,000,004 B``
# (its first group never starts with 0: ``0,001GiB`` is a decimal comma, refused, not 1 GiB)


_BITS_SPELLING = re.compile(r"[KMGTPE]i?b")  # Gb, Mib: bits by the usual convention, not bytes
_LOWER_RATE = re.compile(r"[kmgtpe]?i?b")  # gb (per second), b: as network speeds are written, in bits


def _split(text: str, kind: str, example: str) -> tuple[Fraction, str]:
    """The exact number and the unit (lower case) of ``text``, or an error showing ``example``.

    Units are read without regard to case, except a bit-style spelling (``Gb``, ``Mib``), and a
    rate in lower case (``10gb/s``): read as bytes either would be 8 times what its writer meant,
    so it is refused with both spellings.
    """
    if isinstance(text, str) and len(text) > MAX_QUANTITY_CHARS:  # the pattern is slow on long texts
        raise InputError(
            f"expected {kind} like {example}, got {quoted(text)}: at most {MAX_QUANTITY_CHARS} characters"
        )
    match = _QUANTITY.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        how = (
            "commas only group a whole number's digits in threes, 1,000,004; a fraction takes a point"
            if isinstance(text, str) and "," in text
            else "a number, no sign, and a unit"
        )
        raise InputError(f"expected {kind} like {example}, got {quoted(text)} ({how})")
    number, unit = match.group(1).replace(",", ""), match.group(2)
    prefix = unit.split("/")[0]
    rest = unit[len(prefix) :]
    if _BITS_SPELLING.fullmatch(prefix) or (rest and _LOWER_RATE.fullmatch(prefix)):
        scale = prefix[:-1].capitalize()  # Gi, G or none: the byte unit's own spelling
        as_bytes = f"{shown(number)}{scale}B{rest}"
        if rest and "i" not in prefix:  # a bandwidth, which may be in bits
            as_bits = f"{shown(number)}{scale}bit{rest}"
            raise InputError(
                f"{quoted(text.strip())}: is {prefix} bits or bytes? write {as_bits} or {as_bytes}"
            )
        raise InputError(f"{quoted(text.strip())}: {prefix} reads as bits; write {as_bytes} for bytes")
    return _exact(number), unit.lower()


def _exact(number: str) -> Fraction:
    """The value of a matched number, its exponent read as at most :data:`MAX_EXPONENT` + 1 either
    way (see there: the answer is the same, and ``Fraction("1e40000000")`` takes minutes).

    >>> _exact("1.5e3"), _exact("2e-1"), _exact("1e40000000") == 10 ** (MAX_EXPONENT + 1)
    (Fraction(1500, 1), Fraction(1, 5), True)
    """
    mantissa, _, exponent = number.lower().partition("e")
    if not exponent:
        return Fraction(mantissa)
    power = max(-MAX_EXPONENT - 1, min(int(exponent), MAX_EXPONENT + 1))
    return Fraction(mantissa) * Fraction(10) ** power


def parse_size(text: str) -> int:
    """``64MiB`` -> 67108864 bytes; a bare number is bytes.

    >>> parse_size("1.5KiB"), parse_size("16")
    (1536, 16)
    """
    number, unit = _split(text, "a size", "16MiB or 1GB")
    if unit not in SIZE_UNITS:
        raise InputError(
            f"unknown size unit {quoted(unit)} in {quoted(text)}: "
            "use B, KB, MB, GB, TB, PB, EB, KiB, MiB, GiB, TiB, PiB or EiB"
        )
    size = number * SIZE_UNITS[unit]
    if size.denominator != 1:
        raise InputError(f"{quoted(text)} is not a whole number of bytes")
    if size > MAX_BYTES:
        raise InputError(f"{quoted(text)} is more than {format_bytes(MAX_BYTES)}")
    return int(size)


def parse_duration(text: str) -> float:
    """``20ms`` -> 0.02 seconds; a duration needs a unit (``ns``, ``us``, ``ms``, ``s``), except ``0``.

    >>> parse_duration("1.5s"), parse_duration("0")
    (1.5, 0.0)
    """
    seconds = exact_duration(text)
    if seconds > MAX_SECONDS:
        raise InputError(f"{quoted(text)} is longer than a week")
    return float(seconds)


def exact_duration(text: str) -> Fraction:
    """:func:`parse_duration`'s seconds, exact and of any length: for a caller with a bound of its
    own to name (a timeout's day), which the week's would otherwise speak over."""
    number, unit = _split(text, "a duration", "20ms or 1.5s")
    if unit == "" and number != 0:
        raise InputError(
            f"{quoted(text)} needs a unit: write {shown(text.strip())}ms or {shown(text.strip())}s (or us)"
        )
    unit = "us" if unit in _MICRO else unit
    if unit not in TIME_UNITS and unit != "":
        raise InputError(f"unknown time unit {quoted(unit)} in {quoted(text)}: use ns, us, ms or s")
    return number * TIME_UNITS.get(unit, Fraction(1))


def common_ticks(rows: Sequence[Sequence[tuple[int, int]]]) -> tuple[tuple[tuple[int, ...], ...], int]:
    """Exact times ``(numerator, denominator)`` (rows of them) as whole numbers of one tick, ``1 /
    D`` with ``D`` the least common multiple of their denominators, and ``D``.

    Comparing and subtracting integers costs a fraction of what ``Fraction`` arithmetic does (each
    of its results is reduced by a greatest common divisor), and loses nothing: a time is its
    ticks times ``1 / D`` exactly.  A trace's column is mostly of one denominator (a decimal
    text's ``10 ** places``, a unit's), which is then the tick, and its numerators are used as
    they are.

    >>> common_ticks([[(1250, 1000), (3, 2)], [(7, 1), (-1, 100)]])
    (((1250, 1500), (7000, -10)), 1000)
    """
    denominators = {denominator for row in rows for _, denominator in row}
    common = math.lcm(*denominators)
    if len(denominators) == 1:
        return tuple(tuple(numerator for numerator, _ in row) for row in rows), common
    return tuple(tuple(n * (common // d) for n, d in row) for row in rows), common


def parse_bandwidth(text: str) -> float:
    """``450GiB/s`` -> bytes per second: a size unit or a bit unit (``bit``, ``kbit`` .. ``Ebit``,
    ``Kibit`` .. ``Eibit``), then ``/s``.

    >>> parse_bandwidth("25GB/s"), parse_bandwidth("100Gbit/s")
    (25000000000.0, 12500000000.0)
    """
    number, unit = _split(text, "a bandwidth", "450GiB/s or 100Gbit/s")
    if not unit.endswith("/s"):
        digits = text.strip()[: len(text.strip()) - len(unit)].strip()
        per = text.strip()[len(digits) :].split("/")[0].strip()
        digits = shown(digits)
        fix = f"{digits}{per}/s" if per.lower() in SIZE_UNITS and per else f"{digits}GB/s or {digits}Gbit/s"
        raise InputError(f"{quoted(text)} needs a unit per second, e.g. {fix}")
    per = unit[:-2]
    factor = SIZE_UNITS.get(per) if per in SIZE_UNITS else BIT_UNITS.get(per)
    if factor is None or per == "":
        raise InputError(
            f"unknown bandwidth unit {quoted(unit)} in {quoted(text)}: use e.g. GB/s, GiB/s, Gbit/s or Tbit/s"
        )
    rate = number * factor
    if not MIN_BANDWIDTH <= rate <= MAX_BYTES:
        raise InputError(
            f"{quoted(text)}: a bandwidth must be at least {MIN_BANDWIDTH:g} B/s "
            f"and at most {format_bytes(MAX_BYTES)}/s"
        )
    return float(rate)


def format_seconds(seconds: float) -> str:
    """A duration with a unit people read at a glance: ``0.002884`` -> ``'2.884 ms'``; whole
    seconds grouped in threes past 9,999 s, where four digits would need an exponent, and
    nanoseconds below a microsecond.

    >>> format_seconds(0.002884), format_seconds(3e-6), format_seconds(1.5)
    ('2.884 ms', '3 us', '1.5 s')
    >>> format_seconds(604800.0), format_seconds(1e-13), format_seconds(0.0), format_seconds(-0.002)
    ('604,800 s', '0.0001 ns', '0 s', '-2 ms')
    """
    if seconds < 0:
        return f"-{format_seconds(-seconds)}"
    if seconds >= 1e4:
        return f"{seconds:,.0f} s"
    if seconds == 0:
        return "0 s"
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= factor:
            return f"{seconds / factor:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def format_ratio(ratio: float) -> str:
    """A ratio of times, a speed-up above all, without its ``x`` (a range writes it once: ``1.02x
    [0.830-1.08]``): two decimals from 1 up, three significant digits below, where two decimals
    read a small speed-up as ``0.01`` (``stragglar run`` at N = 256 on 64 KiB) and one under
    0.005 as ``0.00``.

    >>> format_ratio(1.3629), format_ratio(12.0), format_ratio(0.5888), format_ratio(0.012345)
    ('1.36', '12.00', '0.589', '0.0123')
    >>> format_ratio(0.99996), format_ratio(0.00001234)  # rounded to 1 as two decimals would be
    ('1.00', '1.23e-05')
    """
    return f"{ratio:.2f}" if ratio >= 1 else f"{ratio:#.3g}"


_BINARY = (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
_DECIMAL = (("EB", 10**18), ("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))


def format_bytes(size: float) -> str:
    """A byte count as people read it, exactly where it is a whole number: in binary units where
    four digits hold it, else in decimal ones (``64MB`` is echoed as ``64 MB``, not ``61.04
    MiB``), else in bytes; a fraction (a rate) in binary units, to four digits.

    >>> format_bytes(2**30), format_bytes(450 * 2**30), format_bytes(1536), format_bytes(64 * 10**6)
    ('1 GiB', '450 GiB', '1.5 KiB', '64 MB')
    >>> format_bytes(12.5e9), format_bytes(64 * 10**6 + 1), format_bytes(1000), format_bytes(2.5e9 / 3)
    ('12.5 GB', '64,000,001 B', '1000 B', '794.7 MiB')
    """
    binary, exact = _in_units(size, _BINARY)
    if exact or not float(size).is_integer():  # a fraction, or nan in a message about it
        return binary
    decimal, exact = _in_units(size, _DECIMAL)
    return decimal if exact else f"{int(size):,} B"


def _in_units(size: float, units: tuple[tuple[str, int], ...]) -> tuple[str, bool]:
    """``size`` in the largest of ``units`` that it reaches (else in bytes), to four digits, and
    whether that is exact."""
    unit, factor = next(((u, f) for u, f in units if size >= f), ("B", 1))
    digits = f"{size / factor:.4g}"
    return f"{digits} {unit}", float(digits) * factor == size


def count_of(n: int, noun: str) -> str:
    """``3 rounds``, ``1 round``: a count with its noun, for messages and summaries.

    >>> count_of(1, "chunk"), count_of(7, "chunk")
    ('1 chunk', '7 chunks')
    """
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
