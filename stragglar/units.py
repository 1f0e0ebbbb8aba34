"""One place for quantities with units: sizes, durations and bandwidths, read and written.

Every option and every report goes through these functions, so ``64MiB`` or ``20ms`` means the
same thing wherever a user types it, and figures print the same way everywhere.

>>> parse_size("64MiB"), parse_duration("20ms"), parse_bandwidth("450GiB/s") == 450 * 2**30
(67108864, 0.02, True)
>>> format_bytes(2**30), format_seconds(0.002884)
('1 GiB', '2.884 ms')
"""

from __future__ import annotations

from stragglar.errors import InputError

__all__ = ["count_of", "format_bytes", "format_seconds", "parse_bandwidth", "parse_duration", "parse_size"]

SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_size(text: str) -> int:
    """``64MiB`` -> 67108864 bytes: binary (KiB, MiB, GiB) and decimal (KB, MB, GB) units."""
    number, unit = _split_unit(text)
    factor = SIZE_UNITS.get(unit.upper())
    if number is None or factor is None or number < 0:
        raise InputError(f"expected a size like 16MiB or 1GB, got {text!r}")
    return int(number * factor)


def parse_duration(text: str) -> float:
    """``20ms`` -> 0.02 seconds; a bare number is in milliseconds."""
    number, unit = _split_unit(text)
    factor = TIME_UNITS.get(unit or "ms")
    if number is None or factor is None or number < 0:
        raise InputError(f"expected a duration like 20ms or 1.5s, got {text!r}")
    return number * factor


def parse_bandwidth(text: str) -> float:
    """``450GiB/s`` -> bytes per second, with the units of :func:`parse_size`; the ``/s`` is optional."""
    body = text.strip()
    number, unit = _split_unit(body[:-2] if body.lower().endswith("/s") else body)
    factor = SIZE_UNITS.get(unit.upper())
    if number is None or factor is None or number <= 0:
        raise InputError(f"expected a bandwidth like 450GiB/s or 25GB/s, got {text!r}")
    return number * factor


def _split_unit(text: str) -> tuple[float | None, str]:
    body = text.strip()
    digits = body.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    try:
        return float(digits), body[len(digits) :].strip()
    except ValueError:
        return None, ""


def format_seconds(seconds: float) -> str:
    """A duration with a unit people read at a glance: ``0.002884`` -> ``'2.884 ms'``.

    >>> format_seconds(0.002884), format_seconds(3e-6), format_seconds(1.5)
    ('2.884 ms', '3 us', '1.5 s')
    """
    for unit, factor in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= factor:
            return f"{seconds / factor:.4g} {unit}"
    return f"{seconds / 1e-6:.4g} us"


def format_bytes(size: float) -> str:
    """A byte count in binary units: ``2**30`` -> ``'1 GiB'``.

    >>> format_bytes(2**30), format_bytes(450 * 2**30), format_bytes(1536)
    ('1 GiB', '450 GiB', '1.5 KiB')
    """
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            return f"{size / factor:.4g} {unit}"
    return f"{size:.4g} B"


def count_of(n: int, noun: str) -> str:
    """``3 rounds``, ``1 round``: a count with its noun, for messages and summaries.

    >>> count_of(1, "chunk"), count_of(7, "chunk")
    ('1 chunk', '7 chunks')
    """
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
