"""Replay a bound plan's rounds from CUDA graphs: launching ~4 kernels a round from Python costs
100-200 us of host time per round, a graph replay a few microseconds for all of them.

A :class:`Replayer` runs one plan's round ranges (the rounds before the late rank joins, and the
rest: its sleep stays on the host, between two graphs) through a backend that can capture.  The
first call of a range runs eagerly (it compiles and loads the kernels, which a capture may not
do); the second captures the range into a graph and replays it; later calls replay.  A graph
reads the buffers through the backend's binding (device pointers written before each call), so
one graph serves every call of the same plan, element count and dtype.  If a capture fails, the
range runs eagerly from then on and the replayer says why once, as a warning: slower, never
wrong.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Protocol

from stragglar.runtime.batched import BatchedPlan

__all__ = ["Capturing", "Replayer"]


class Capturing(Protocol):
    """A backend whose launches a graph can capture: ``capture(work)`` records what ``work``
    launches (without running it) and returns the graph; ``replay`` launches a graph."""

    def run(self, plan: BatchedPlan, first: int, stop: int) -> None: ...

    def capture(self, work: Callable[[], None]) -> Any: ...

    def replay(self, graph: Any) -> None: ...


class Replayer:
    """Runs ``plan``'s round ranges on ``backend``: eagerly the first time, from a graph after
    (``graphs=False``: always eagerly)."""

    def __init__(self, backend: Capturing, graphs: bool = True) -> None:
        self.backend = backend
        self.graphs = graphs
        self.seen: set[tuple[int, int]] = set()
        self.captured: dict[tuple[int, int], Any] = {}
        self.failure: str | None = None

    def __call__(self, plan: BatchedPlan, first: int, stop: int) -> None:
        key = (first, stop)
        graph = self.captured.get(key)
        if graph is not None:
            self.backend.replay(graph)
            return
        if not self.graphs or self.failure is not None or key not in self.seen or first == stop:
            self.seen.add(key)
            self.backend.run(plan, first, stop)
            return
        try:
            graph = self.backend.capture(lambda: self.backend.run(plan, first, stop))
        except Exception as e:  # any capture failure: the rounds still run, eagerly
            self.failure = f"{type(e).__name__}: {e}".splitlines()[0]
            warnings.warn(
                f"stragglar: could not capture the rounds in a CUDA graph ({self.failure}); "
                "they run eagerly (slower, same results)",
                RuntimeWarning,
                stacklevel=2,
            )
            self.backend.run(plan, first, stop)
            return
        self.captured[key] = graph
        self.backend.replay(graph)
