"""A proved schedule's device program, lowered and proved once per schedule and way of moving
chunks (cached by the schedule's fingerprint), the one way every device path gets one: no table
reaches a kernel unproved."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from stragglar.runtime.device.kernel import OWN_TUNING
from stragglar.runtime.device.lowering import lower
from stragglar.runtime.device.prover import check
from stragglar.runtime.device.table import DeviceProgram
from stragglar.runtime.plans import cached
from stragglar.runtime.program import compile_schedule
from stragglar.verify import Proof, require_proof

__all__ = ["program_for", "program_for_call"]

_programs: OrderedDict[Hashable, DeviceProgram] = OrderedDict()


def program_for(proof: Proof, direct: bool, packets: bool = False) -> DeviceProgram:
    """The device program of ``proof``'s schedule, proved from its rows before it is returned;
    every transfer as packets when ``packets`` (small chunks), else with direct transfers where
    they are safe when ``direct`` (a launch that reaches every rank's buffer), else every transfer
    staged through the inboxes."""
    require_proof(proof)
    key = (proof.schedule.fingerprint, direct, packets)
    return cached(_programs, key, lambda: _proved(proof, direct, packets), 32)


def program_for_call(proof: Proof, direct: bool, count: int, dtype: str) -> DeviceProgram:
    """The program a call on ``count`` elements of ``dtype`` runs: every transfer as packets where
    its chunks are small enough (the engine's :attr:`~.kernel.Tuning.packet_bytes`: none until a
    GPU has timed them), else :func:`program_for`'s with ``direct``.  Every rank of a call
    computes the same from the same schedule, count and dtype, so they all run one program."""
    packets = OWN_TUNING.moves_packets(count, proof.schedule.num_chunks, dtype)
    return program_for(proof, direct, packets)


def _proved(proof: Proof, direct: bool, packets: bool) -> DeviceProgram:
    program = lower(compile_schedule(proof.schedule), direct, packets)
    check(program, proof.schedule)
    return program
