"""Verification: prove that a schedule is a correct AllReduce before anything runs or exports it.

Two provers that share only the IR and :mod:`stragglar.verify.report`: the symbolic simulator
(:func:`prove`, :func:`find_violation`) and the z3 checker (:mod:`stragglar.verify.smt`); lower bounds on
StragglAR's rounds are in :mod:`stragglar.verify.bound`, those of a straggler-aware ReduceScatter
and AllGather in :mod:`stragglar.verify.shard_bound`.  A :class:`Proof` carries its schedule.
"""

from stragglar.renamed import renamed
from stragglar.verify.report import Kind, Proof, VerificationError, Violation, Where, require_proof
from stragglar.verify.simulate import find_violation, prove

check = renamed("stragglar.verify.check", "stragglar.verify.find_violation", find_violation)

__all__ = [
    "Kind",
    "Proof",
    "VerificationError",
    "Violation",
    "Where",
    "check",
    "find_violation",
    "prove",
    "require_proof",
]
