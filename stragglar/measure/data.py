"""Test data for measured runs: distinct per rank and element, exact in every dtype, checked in blocks.

Every rank fills distinct per-rank, per-element integers, and the result is compared with a
NumPy reference after every iteration; a mismatch raises :class:`WrongResult`: no figure is
reported for a wrong result.  The values (:func:`payload`) are chosen so that nothing can hide a
mistake and nothing can round:

* Exact: a dtype with a ``p``-bit significand holds every integer up to ``B = 2**p`` (float16
  2**11, bfloat16 2**8, float32 2**24, float64 2**53; int32 2**31 - 1; int64 2**53, as results
  are compared in float64).  No rank's value exceeds ``L = B // N`` in magnitude, so every
  partial sum, in any order, stays within ``B`` and is exact.  When ``L`` is 0 (bfloat16 from
  N = 257, float16 from 2049) the data is sparse: on each element at most ``2**p`` ranks put a
  unit (+1 or -1) and the others 0.
* Distinct: element ``i`` belongs to a window of :attr:`Encoding.window` elements; in each window
  every rank gets a pseudo-random identity (a bijection of the rank, keyed by a splitmix64 hash
  of the window, so no two ranks share one), written over the window as nonzero digits.  So no
  two ranks have equal data once ``count >= window``, no rank is all zeros once ``count >=
  groups`` (with dense data, from one element on, as every value is nonzero), and values vary
  over elements and windows like hash output, not like a formula that collapses modulo a small
  number.

>>> e = encoding(4, "bfloat16")
>>> e.limit, e.window, payload(1, 6, 4, "bfloat16").tolist()
(64, 1, [-13, -43, -51, -64, -24, -60])
>>> encoding(300, "bfloat16").groups, encoding(300, "bfloat16").window   # sparse: +-1 or 0
(2, 16)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from stragglar.errors import IncorrectError, InputError, described

__all__ = [
    "CHECK_BLOCK",
    "EXACT",
    "ITEMSIZE",
    "Encoding",
    "WrongResult",
    "check_result",
    "encoding",
    "expected",
    "payload",
    "payloads",
]

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}
# the largest magnitude every partial sum may reach and stay exact (int64 results are compared in
# float64, so 2**53 there too)
EXACT = {
    "float16": 2**11,
    "bfloat16": 2**8,
    "float32": 2**24,
    "float64": 2**53,
    "int32": 2**31 - 1,
    "int64": 2**53,
}
CHECK_BLOCK = 1 << 22  # elements compared at a time: checking a 1 GiB buffer needs no full-size copy
_BLOCK = 1 << 20  # rank x element values made at a time
_SEED = 0x5EED_DA7A_2026
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


class WrongResult(IncorrectError):
    """A run's result differs from the reference (exit 1): the figures of that run are not reported."""


@dataclass(frozen=True)
class Encoding:
    """How :func:`payload` writes ``num_ranks`` ranks' data for a dtype.

    Each rank's identity in a window has ``id_bits`` bits; an element shows one ``value_bits``-bit
    digit of it, as a nonzero value in ``[-limit, limit]``, on the ranks whose identity's top bits
    select the element's group (``groups`` is 1 for dense data: every rank on every element).
    """

    num_ranks: int
    bound: int  # every partial sum stays within +-bound
    value_bits: int
    id_bits: int
    group_bits: int  # identities per group: 2**group_bits ranks at most put a value on an element
    groups: int

    @property
    def limit(self) -> int:
        """The largest magnitude of a value."""
        return 1 << (self.value_bits - 1)

    @property
    def digits(self) -> int:
        return -(-self.group_bits // self.value_bits)

    @property
    def window(self) -> int:
        """Elements from which on no two ranks have equal data."""
        return self.groups * self.digits

    @property
    def dense(self) -> bool:
        return self.groups == 1


@lru_cache(maxsize=256)
def encoding(num_ranks: int, dtype: str) -> Encoding:
    """The :class:`Encoding` of ``num_ranks`` ranks' data in ``dtype``."""
    if dtype not in EXACT:
        raise InputError(f"unknown dtype {described(dtype)} (choose from {', '.join(EXACT)})")
    if num_ranks < 1:
        raise InputError(f"need at least one rank, got {num_ranks}")
    bound = EXACT[dtype]
    per_rank = bound // num_ranks
    rank_bits = num_ranks.bit_length()  # 2**rank_bits > num_ranks: some identity is always unused
    if per_rank >= 1:  # dense: every rank a nonzero value of at most per_rank on every element
        value_bits = per_rank.bit_length()  # 2**(value_bits-1) <= per_rank
        digits = -(-rank_bits // value_bits)
        id_bits = digits * value_bits
        return Encoding(num_ranks, bound, value_bits, id_bits, id_bits, 1)
    group_bits = bound.bit_length() - 1  # sparse: at most 2**group_bits <= bound units per element
    return Encoding(num_ranks, bound, 1, rank_bits, group_bits, 1 << (rank_bits - group_bits))


def payload(rank: int, count: int, num_ranks: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input as int64: distinct per rank and element, exact in ``dtype`` however
    it is summed (see the module docstring)."""
    enc = encoding(num_ranks, dtype)
    out = np.empty(count, np.int64)
    ranks = np.array([[rank]], np.uint64)
    for lo in range(0, count, _BLOCK):
        hi = min(count, lo + _BLOCK)
        out[lo:hi] = _values(enc, ranks, lo, hi)[0]
    return out


def payloads(count: int, num_ranks: int, dtype: str) -> np.ndarray:
    """Every rank's :func:`payload` at once, as a (ranks, elements) int64 array (small sizes)."""
    enc = encoding(num_ranks, dtype)
    return _values(enc, np.arange(num_ranks, dtype=np.uint64)[:, None], 0, count)


def expected(count: int, num_ranks: int, dtype: str) -> np.ndarray:
    """The exact AllReduce of every rank's :func:`payload`, as int64."""
    enc = encoding(num_ranks, dtype)
    total = np.zeros(count, np.int64)
    step = max(1, _BLOCK // num_ranks)
    for first in range(0, num_ranks, 4096):  # ranks in slices: a block is at most _BLOCK values
        ranks = np.arange(first, min(num_ranks, first + 4096), dtype=np.uint64)[:, None]
        for lo in range(0, count, step):
            hi = min(count, lo + step)
            total[lo:hi] += _values(enc, ranks, lo, hi).sum(axis=0)
    return total


def _values(enc: Encoding, ranks: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Values of ``ranks`` (a column of uint64) on elements ``lo`` to ``hi``: (ranks, elements)."""
    with np.errstate(over="ignore"):
        window, offset = np.divmod(np.arange(lo, hi, dtype=np.uint64), np.uint64(enc.window))
        mask, shift = np.uint64((1 << enc.id_bits) - 1), np.uint64((enc.id_bits + 1) // 2)
        ident = ranks ^ _splitmix64(window + np.uint64(_SEED))  # keyed by the window, then a
        ident &= mask  # bijection of id_bits-bit numbers: odd multiplies and xor-shifts
        ident *= _MIX1
        ident &= mask
        ident ^= ident >> shift
        ident *= _MIX2
        ident &= mask
        ident ^= ident >> shift
        active = None
        if not enc.dense:  # the element's group: the identities whose top bits name it
            active = (ident >> np.uint64(enc.group_bits)) == offset % np.uint64(enc.groups)
        if enc.digits > 1:  # the element's digit of the identity
            ident >>= offset // np.uint64(enc.groups) * np.uint64(enc.value_bits)
        ident &= np.uint64((1 << enc.value_bits) - 1)
        value = ident.astype(np.int64)
        value -= enc.limit - 1
        value -= value <= 0  # [-limit, -1] and [1, limit]: never 0
        if active is not None:
            value *= active
        result: np.ndarray = value
        return result


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's output function of ``z`` + its increment (uint64, wrapping)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    result: np.ndarray = z ^ (z >> np.uint64(31))
    return result


def check_result(
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
