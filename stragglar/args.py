"""Checks of the Python API's arguments, in the API's own terms (never the command line's options).

Integers may be any integral type (``3``, ``np.int64(3)``); ``True`` and ``1.5`` are refused, as
a rank or a count that is a bool or a float is a mistake, not a value.  Times are real numbers of
seconds, at most a day (:data:`MAX_TIMEOUT`; a wait longer than that is a hang, and ``1e308`` would
overflow the timeouts of the engines), and a straggler's delay made on purpose at most an hour
(:data:`MAX_DELAY`).  A wrong type raises :class:`ArgumentError`, which is both an
:class:`~stragglar.errors.InputError` (exit 2) and a :class:`TypeError`; a value out of range
raises :class:`~stragglar.errors.InputError`.

>>> import numpy as np
>>> as_int(np.int64(3), "straggler")
3
>>> as_int(True, "straggler")
Traceback (most recent call last):
...
stragglar.errors.ArgumentError: straggler must be an integer, got True (bool)
>>> as_rank(1.5, "straggler", 4)
Traceback (most recent call last):
...
stragglar.errors.ArgumentError: straggler must be an integer, got 1.5 (float)
>>> as_rank(4, "straggler", 4)
Traceback (most recent call last):
...
stragglar.errors.InputError: straggler must be a rank in 0..3, got 4
>>> as_seconds(1e12, "timeout", positive=True)
Traceback (most recent call last):
...
stragglar.errors.InputError: timeout must be at most 86,400 s (a day), got 1000000000000.0 s
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any

from stragglar.errors import ArgumentError, InputError, described

__all__ = [
    "MAX_DELAY",
    "MAX_INT_BITS",
    "MAX_TIMEOUT",
    "as_flag",
    "as_int",
    "as_rank",
    "as_real",
    "as_seconds",
]

MAX_TIMEOUT = 24 * 3600.0  # seconds: the longest wait the API takes, a day
MAX_INT_BITS = 64
MAX_DELAY = 3600.0  # seconds: the longest straggler delay the API makes on purpose, an hour
_WORDS = {MAX_TIMEOUT: "a day", MAX_DELAY: "an hour"}


def as_int(value: Any, name: str, minimum: int | None = None) -> int:
    """``value`` as a plain ``int``: any integral type but bool, at least ``minimum`` if given, and
    within 64 bits, so that every message can print it and no bound check meets a number it cannot
    compare cheaply."""
    if type(value) is int:  # the common case, without the ABC check's microsecond (not a bool)
        result = value
    elif isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentError(f"{name} must be an integer, got {described(value)} ({type(value).__name__})")
    else:
        result = operator.index(value)
    if result.bit_length() > MAX_INT_BITS:  # no count, rank or size of ours is near; Python cannot print it
        raise InputError(f"{name} must fit in {MAX_INT_BITS} bits, got {described(result)}")
    if minimum is not None and result < minimum:
        raise InputError(f"{name} must be at least {minimum}, got {result}")
    return result


def as_flag(value: Any, name: str) -> bool:
    """``value`` if it is True or False: a switch of the API takes no 1, "yes" or None in their
    place (each would read as true or false without a word)."""
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be True or False, got {described(value)}")
    return value


def as_rank(value: Any, name: str, num_ranks: int) -> int:
    """``value`` as a rank of a ``num_ranks``-rank group."""
    rank = as_int(value, name)
    if not 0 <= rank < num_ranks:
        raise InputError(f"{name} must be a rank in 0..{num_ranks - 1}, got {rank}")
    return rank


def as_real(value: Any, name: str, unit: str) -> float:
    """``value`` as a float, if it is a real number (not a bool) of ``unit``; an integer past a
    float's range is infinite, as it would be anywhere it is used."""
    if type(value) is float:  # the common case, without the ABC check: a replay asks 10**5 times
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentError(
            f"{name} must be a number of {unit}, got {described(value)} ({type(value).__name__})"
        )
    try:
        return float(value)
    except OverflowError:
        return math.inf


def as_seconds(value: Any, name: str, *, positive: bool = False, maximum: float = MAX_TIMEOUT) -> float:
    """``value`` as a finite number of seconds, ``>= 0`` (``> 0`` when ``positive``) and at most
    ``maximum`` (a day unless the caller says less: :data:`MAX_DELAY` for a delay)."""
    seconds = as_real(value, name, "seconds")
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        bound = "> 0" if positive else ">= 0"
        raise InputError(f"{name} must be a finite number of seconds {bound}, got {described(value)}")
    if seconds > maximum:
        words = f" ({_WORDS[maximum]})" if maximum in _WORDS else ""
        raise InputError(f"{name} must be at most {maximum:,.0f} s{words}, got {described(value)} s")
    return seconds
