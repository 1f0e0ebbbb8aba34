"""Test data for measured runs: distinct per rank and element, exact in every dtype, checked in blocks.

Every rank fills distinct per-rank, per-element integers (exact in every dtype, so any misplaced
or doubled chunk shows), and the result is compared with a NumPy reference after every
iteration; a mismatch raises :class:`WrongResult`: no figure is reported for a wrong result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from stragglar.errors import IncorrectError

__all__ = ["CHECK_BLOCK", "ITEMSIZE", "WrongResult", "check", "expected", "payload"]

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}
_EXACT = {"float16": 2**11, "bfloat16": 2**8}  # largest integers every partial sum stays exact at
CHECK_BLOCK = 1 << 22  # elements compared at a time: checking a 1 GiB buffer needs no full-size copy


class WrongResult(IncorrectError):
    """A run's result differs from the reference (exit 1): the figures of that run are not reported."""


def payload(rank: int, count: int, num_ranks: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input as int64: differs per rank and per element, and sums exactly in ``dtype``."""
    limit = _EXACT.get(dtype, 2**24) // num_ranks
    return (np.arange(count, dtype=np.int64) * 1_000_003 + rank * 7_919 + 1) % limit


def expected(count: int, num_ranks: int, dtype: str) -> np.ndarray:
    """The exact AllReduce of every rank's :func:`payload`, as int64."""
    total = np.zeros(count, np.int64)
    for r in range(num_ranks):
        total += payload(r, count, num_ranks, dtype)
    return total


def check(
    result: Any, want: np.ndarray, rank: int, what: str, host: Callable[[Any], Any] = np.asarray
) -> None:
    """Raise unless ``result`` equals the reference exactly.

    ``result`` is any sliceable 1-D array (NumPy, CuPy, torch); ``host`` brings one block of it to
    NumPy.  Blocks keep the extra memory small, so 8 ranks can check 256 MiB buffers side by side.
    """
    wrong, first = 0, None
    for lo in range(0, want.size, CHECK_BLOCK):
        got = np.asarray(host(result[lo : lo + CHECK_BLOCK]), dtype=np.float64)
        bad = np.flatnonzero(got != want[lo : lo + CHECK_BLOCK])
        if bad.size and first is None:
            first = (lo + int(bad[0]), got[bad[0]])
        wrong += bad.size
    if first is not None:
        i, value = first
        raise WrongResult(
            f"wrong result: {what}: rank {rank} has wrong values at {wrong} of {want.size} elements "
            f"(first: element {i} is {value}, expected {want[i]})"
        )
