"""What one measured iteration took, from the ranks' timelines.

Shared by the in-process and the torch backends of :mod:`stragglar.measure.run`.
"""

from __future__ import annotations

from collections.abc import Sequence

from stragglar.runtime.engine import Timeline
from stragglar.schedule import Schedule

__all__ = ["Figures", "iteration_figures"]

Figures = tuple[tuple[float, ...], tuple[float, ...], str, tuple[float, ...]]


def iteration_figures(schedule: Schedule, timelines: Sequence[Timeline]) -> tuple[float, float | None]:
    """(slowest rank's time from its start to its end, when the hidden phases were done)."""
    late = schedule.straggler
    hidden = range(schedule.hidden_phases)
    ends = [
        done - t.start
        for t in timelines
        if t.rank != late
        for done in (t.phase_done[i] for i in hidden)
        if done is not None
    ]
    return max(t.done - t.start for t in timelines), (max(ends) if ends else None)
