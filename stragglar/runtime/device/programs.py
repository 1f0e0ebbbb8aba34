"""A proved schedule's device program, lowered and proved once per schedule and way of landing
(cached by the schedule's fingerprint), the one way every device path gets one: no table reaches
a kernel unproved."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from stragglar.runtime.device.lowering import lower
from stragglar.runtime.device.prover import check
from stragglar.runtime.device.table import DeviceProgram
from stragglar.runtime.plans import cached
from stragglar.runtime.program import compile_schedule
from stragglar.verify import Proof, require_proof

__all__ = ["program_for"]

_programs: OrderedDict[Hashable, DeviceProgram] = OrderedDict()


def program_for(proof: Proof, direct: bool) -> DeviceProgram:
    """The device program of ``proof``'s schedule, proved from its rows before it is returned;
    with direct transfers where they are safe when ``direct`` (a launch that reaches every rank's
    buffer), else every transfer staged through the inboxes."""
    require_proof(proof)
    return cached(_programs, (proof.schedule.fingerprint, direct), lambda: _proved(proof, direct), 32)


def _proved(proof: Proof, direct: bool) -> DeviceProgram:
    program = lower(compile_schedule(proof.schedule), direct)
    check(program)
    return program
