"""Verification: prove that a schedule is a correct AllReduce before anything runs it."""

from stragglar.verify.simulate import Proof, VerificationError, Violation, check, prove

__all__ = ["Proof", "VerificationError", "Violation", "check", "prove"]
