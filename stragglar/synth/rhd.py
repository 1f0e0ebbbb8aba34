"""Recursive halving (ReduceScatter) then recursive doubling (AllGather), for powers of two."""

from __future__ import annotations

from stragglar.errors import InputError
from stragglar.schedule import Op, Phase, Round, Schedule, Transfer, check_num_ranks

__all__ = ["rhd_allreduce"]


def _block(rank: int, size: int) -> range:
    """The ``size``-chunk block that contains chunk ``rank``: what ``rank`` owns at that level."""
    start = rank // size * size
    return range(start, start + size)


def _halving(num_ranks: int, distance: int) -> Round:
    """Every rank adds its data for the block its partner (rank XOR distance) keeps into the partner."""
    return tuple(
        Transfer(r, r ^ distance, c, Op.REDUCE)
        for r in range(num_ranks)
        for c in _block(r ^ distance, distance)
    )


def _doubling(num_ranks: int, distance: int) -> Round:
    """Every rank copies its complete block to its partner, doubling what both hold."""
    return tuple(Transfer(r, r ^ distance, c, Op.COPY) for r in range(num_ranks) for c in _block(r, distance))


def rhd_allreduce(num_ranks: int) -> Schedule:
    """Recursive halving/doubling AllReduce: 2 log2(n) rounds of shrinking then growing blocks.

    Raises InputError unless ``num_ranks`` is a power of two (the halving needs equal halves).

    >>> rhd_allreduce(8).num_rounds
    6
    """
    n = check_num_ranks(num_ranks)
    if n & (n - 1):
        raise InputError(f"rhd needs a power-of-two number of GPUs, got {n}")
    distances = [n >> (k + 1) for k in range(n.bit_length() - 1)]
    halving = tuple(_halving(n, d) for d in distances)
    doubling = tuple(_doubling(n, d) for d in reversed(distances))
    ranks = tuple(range(n))
    phases = (Phase("reduce-scatter", ranks, halving), Phase("allgather", ranks, doubling))
    return Schedule("rhd", n, n, None, phases)
