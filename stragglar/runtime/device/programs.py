"""A proved schedule's device program, lowered and proved once per schedule (cached by its
fingerprint), the one way every device path gets one: no table reaches a kernel unproved."""

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


def program_for(proof: Proof) -> DeviceProgram:
    """The device program of ``proof``'s schedule, proved from its rows before it is returned."""
    require_proof(proof)
    return cached(_programs, proof.schedule.fingerprint, lambda: _proved(proof), 32)


def _proved(proof: Proof) -> DeviceProgram:
    program = lower(compile_schedule(proof.schedule))
    check(program)
    return program
