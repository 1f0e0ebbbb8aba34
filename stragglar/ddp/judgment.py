"""What a step's figures lead to, once the probe of arrivals has gathered them.

A :class:`~stragglar.ddp.StragglarState` begins each step by counting it and running the probe
(:meth:`~stragglar.ddp.StragglarState.new_step`); the figures the probe then has (those of step
s, at step s + 2) are judged here.  The persistent-straggler rule is told who was last
(:mod:`stragglar.model.detect`); rank 0 reports the verdict (:mod:`stragglar.ddp.metrics`) and
appends the arrivals to the trace; and the state follows the verdict, moving its straggler under
``detect`` or taking the auto policy's outlook.  Kept apart from the state's reductions, which
read nothing of this but the straggler and the outlook it leaves: each can be read on its own.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from stragglar.ddp.metrics import report
from stragglar.ddp.probe import LateRankProbe
from stragglar.formats.traces import TraceWriter
from stragglar.model.detect import WINDOW, fresh, observe
from stragglar.model.policy import PROBE_LAG

if TYPE_CHECKING:
    from stragglar.ddp.hook import StragglarState

__all__ = ["is_world", "judge"]


def judge(state: StragglarState, probe: LateRankProbe, world_size: int) -> None:
    """Judge the figures ``probe`` has just gathered: tell the rule who was last, report a change
    of persistent straggler and the figures (rank 0, with the trace), and update ``state``'s
    straggler (``detect``) or its outlook (auto)."""
    learned = state.learned
    before = learned.detection or fresh(world_size)
    learned.detection = observe(state.rule, before, probe.late[-1])
    if dist.get_rank() == 0:
        _report(state, before.named)
        if state.record is not None:
            _write_trace(state, probe, state.record)
    if state.policy == "auto":
        fixed = state.late_rank(world_size)
        learned.outlook = learned.policy.judge(
            world_size, probe.late, state.rule, learned.detection, fixed, probe.samples
        )
        return
    named = learned.detection.named
    if state.detect > 0 and named is not None and named != _expected_late_rank(state, world_size):
        state.straggler = named
        learned.switches.append((learned.steps, named))


def is_world(group: Any) -> bool:
    """Whether ``group`` is the world: None, or ``dist.group.WORLD`` given by name."""
    return group is None or group is dist.group.WORLD


def _figures_step(state: StragglarState) -> int:
    """The step the probe's latest figures are from."""
    return state.learned.steps - PROBE_LAG


def _report(state: StragglarState, before: int | None) -> None:
    """Rank 0: log a change of persistent straggler, and replace the metrics file."""
    probe, detection = state.resources.probe, state.learned.detection
    if probe is not None and detection is not None:
        window = probe.late.maxlen or WINDOW
        group = state.process_group  # HSDP's replicate group: its ranks named by their global ones
        members = None if is_world(group) else dist.get_process_group_ranks(group)
        report(before, detection, state.late_ranks, _figures_step(state), window, state.metrics, members)


def _write_trace(state: StragglarState, probe: LateRankProbe, record: str | os.PathLike[str]) -> None:
    """Append the step's arrivals, as the probe measured them, to the trace (rank 0 only)."""
    trace = state.resources.trace
    if trace is None:
        trace = state.resources.trace = TraceWriter(record)
        weakref.finalize(state, trace.close)
    trace.append(_figures_step(state), [-wait for wait in probe.waits])


def _expected_late_rank(state: StragglarState, world_size: int) -> int:
    """The rank the reductions now take for the late one: the straggler, else the schedule's
    late rank (:attr:`~stragglar.schedule.Schedule.late_rank`)."""
    return state.straggler if state.straggler is not None else state.proof(world_size).schedule.late_rank
