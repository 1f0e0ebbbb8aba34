"""What bench_gpu.py and its ranks share, without torch: the parts' settings, the exact inputs
and their sum, and the slowest rank's figures (so that bench_gpu says "no GPU" on a machine
without torch, and its tables are tested there)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PERIOD = 4093  # values repeat with a prime period (the loopback's and the ranks' inputs: value)


@dataclass(frozen=True)
class P2PConfig:
    backend: str
    sizes: tuple[int, ...]  # bytes per rank
    delays: tuple[float, ...]  # seconds the last rank is late
    iters: int
    timeout: float = 120.0


@dataclass(frozen=True)
class DDPConfig:
    backend: str
    width: int
    depth: int
    bucket_mb: float
    steps: int
    warmup: int
    late_rank: int | None
    delay: float
    timeout: float = 120.0


def value(base: Any, rank: int, world: int) -> Any:
    """Rank ``rank``'s input from ``base`` (element i: ``i mod PERIOD``, a float32 array of any
    library): ``base * world + rank``, distinct per rank and, within a period, per element, so a
    lost or misplaced chunk shows; every partial sum is an integer below 2**24, exact in float32."""
    return base * world + rank


def total(base: Any, world: int) -> Any:
    """The sum of every rank's :func:`value`."""
    return base * (world * world) + world * (world - 1) // 2


class Wrong(Exception):
    """A result differed from the sum: its timing would mean nothing."""


def slowest(per_rank: Sequence[dict[str, list[float]]]) -> dict[str, float]:
    """Per variant, the median over calls of the slowest rank's time (seconds)."""
    out = {}
    for name in per_rank[0]:
        calls = [r[name] for r in per_rank if r[name]]
        out[name] = statistics.median(max(c) for c in zip(*calls, strict=True)) if calls else 0.0
    return out


def size_text(size_bytes: int) -> str:
    """A buffer's size as the tables show it: whole MiB, else whole KiB, else bytes."""
    if size_bytes >= 1 << 20:
        return f"{size_bytes >> 20} MiB"
    return f"{size_bytes >> 10} KiB" if size_bytes >= 1 << 10 else f"{size_bytes} B"
