"""The device program's prover: a table proved from its own contents before its first launch
(:func:`~stragglar.runtime.device.prover.check.check`).  It reads the table's format
(:mod:`stragglar.runtime.device.table`) and, for the order of additions, the schedule itself, and
nothing of the lowering that wrote it or the per-rank programs it starts from (an import contract
in ``pyproject.toml`` holds this folder to that), so a table is judged by what it says."""

from stragglar.runtime.device.prover.check import DeviceProgramError, check, refusal

__all__ = ["DeviceProgramError", "check", "refusal"]
