"""What one measured iteration took, from the ranks' timelines, and in which order a run's entries go.

Shared by the in-process and the torch backends of :mod:`stragglar.measure.run`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stragglar.runtime import Timeline
from stragglar.schedule import Schedule

__all__ = ["Figures", "Series", "iteration_figures", "turn"]


@dataclass(frozen=True)
class Series:
    """One schedule's figures over a run's measured iterations: the slowest rank's seconds from
    the common start to its end, and when the punctual ranks had finished the hidden phases."""

    times: tuple[float, ...]
    hidden: tuple[float, ...]


@dataclass(frozen=True)
class Figures:
    """A run's figures: one :class:`Series` per schedule, in the order given, and the baseline's."""

    schedules: tuple[Series, ...]
    baseline: str
    baseline_times: tuple[float, ...]


def turn(iteration: int, entries: int) -> list[int]:
    """The order in which a run's ``entries`` go in ``iteration``: each schedule's index, and
    ``entries - 1`` for the baseline.  The order rotates by one each iteration, so every entry
    takes every place equally often over ``entries`` iterations and none always runs right after
    the same one (whatever a predecessor leaves behind, cold caches or a busy core, is shared out).

    >>> [turn(i, 3) for i in range(4)]
    [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    """
    return [(iteration + k) % entries for k in range(entries)]


def iteration_figures(schedule: Schedule, timelines: Sequence[Timeline]) -> tuple[float, float | None]:
    """(slowest rank's time from its start to its end, when the hidden phases were done)."""
    straggler = schedule.straggler
    hidden = range(schedule.hidden_phases)
    ends = [
        done - t.start
        for t in timelines
        if t.rank != straggler
        for done in (t.phase_done[i] for i in hidden)
        if done is not None
    ]
    return max(t.done - t.start for t in timelines), (max(ends) if ends else None)
