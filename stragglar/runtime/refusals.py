"""What a call across processes refuses, and when: at once, or after its header's gather.

A call's options (``engine``, ``rounds``, ``stream_ordered``, ``graphs``, ``async_op``) are the
program's: a program that runs one call on every rank passes them alike, so a call whose options
do not fit is refused by every rank at once, before anything is gathered (:func:`check_engine`,
:func:`check_rounds`).  What a rank's own data brings may differ between the ranks: a buffer the
device engine cannot run on (:func:`device_problem`), data that is no torch tensor on a torch
process group, or a buffer :func:`~stragglar.runtime.header.inspect_call` refuses.  Such a rank
takes part in the header's gather all the same, its header naming its problem
(:class:`~stragglar.runtime.header.Problem`), and raises its own error after it.  On a call
that checks (its channel's first, or one whose setup changed:
:mod:`stragglar.runtime.channels`) its peers then raise a
:class:`~stragglar.runtime.header.MismatchError` naming it in the same call, rather than wait for
it until their timeout, and a program that catches the errors and calls again stays in step (a
rank that refused alone, before the gather, left its peers' call to pair with its next one).  On
a channel whose peers keep their setup, they do not check: this rank checks alone, and every
rank fails by its timeout, as for any setup one rank changes alone; never a sum of mixed buffers.

A rank refuses on its own, before the gather, only where it cannot take part in it: its
problem is a :class:`RankProblem` kept for after the gather, except

- where no group can carry its header: data that is no torch tensor where torch has no process
  group (none initialised, or a value that is no process group), and a device problem on an
  :class:`~stragglar.runtime.NcclGroup`, whose gather runs in memory of the buffer's kind (NumPy
  for a stand-in communicator, CuPy for NCCL's), which a buffer off the GPU cannot say;
- a call made while the caller's stream captures a CUDA graph: a gather in it would spoil the
  capture (:func:`~stragglar.runtime.device.buffers.check_not_capturing`);
- a device call on a broken state or buffer
  (:meth:`~stragglar.runtime.device.group.DeviceCall.refusal`): its last call on the channel
  ended before every rank's words were gathered, so this rank cannot know which of the channel's
  collectives its peers are in (that call's words gather, still waiting for this rank's words,
  or a later call's header gather), and a header it sent could be taken for that call's words;
  on NCCL a gather that timed out also leaves its collective queued, paired with whatever the
  peers run next.  The group is one to make anew, as the refusal says.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from stragglar.args import as_int
from stragglar.errors import ArgumentError, InputError, described
from stragglar.runtime.device.buffers import check_device_buffer, check_not_capturing, on_device
from stragglar.runtime.header import Problem
from stragglar.verify import Proof

__all__ = ["RankProblem", "check_engine", "check_rounds", "device_problem"]


class RankProblem(NamedTuple):
    """A rank's own problem with its call, raised after the header's gather: ``problem``, what its
    header says, and ``error``, what this rank raises."""

    problem: Problem
    error: Exception


def check_engine(engine: Any, stream_ordered: bool, rounds: Any, graphs: bool | None, async_op: bool) -> bool:
    """Whether the call runs on the device engine, once its options fit it (every rank refuses
    the same options at once, before anything is gathered)."""
    if not on_device(engine):
        if async_op:
            raise InputError(
                "async_op applies to engine 'device' (the rounds engine's calls return when done, "
                "or with stream_ordered once queued)"
            )
        return False
    given = [
        name
        for name, value in (
            ("stream_ordered", stream_ordered or None),
            ("rounds", rounds),
            ("graphs", graphs),
        )
        if value is not None
    ]
    if given:
        raise InputError(
            f"{given[0]} applies to the rounds engine, not to engine 'device' (one kernel launch a call)"
        )
    return True


def device_problem(data: Any) -> RankProblem | None:
    """The device engine's problem with ``data``, a buffer off the GPU (this rank's own: said after
    the header's gather), or None; a call made while a CUDA graph is captured is refused at once
    (a gather would spoil the capture)."""
    try:
        check_device_buffer(data)
    except InputError as e:
        return RankProblem(Problem.NOT_ON_DEVICE, e)
    check_not_capturing(data)
    return None


def check_rounds(rounds: Any, proof: Proof) -> tuple[int, int | None]:
    """``rounds`` as (first, stop), both within the schedule's rounds (stop None: to the end)."""
    if rounds is None:
        return 0, None
    if not isinstance(rounds, tuple) or len(rounds) != 2:
        raise ArgumentError(f"rounds must be a pair (first, stop), got {described(rounds)}")
    total = proof.num_rounds
    first = as_int(rounds[0], "rounds[0]", minimum=0)
    stop = None if rounds[1] is None else as_int(rounds[1], "rounds[1]", minimum=0)
    if first > (total if stop is None else stop) or (stop is not None and stop > total):
        raise InputError(f"rounds must satisfy 0 <= first <= stop <= {total} (the schedule's), got {rounds}")
    return first, stop
