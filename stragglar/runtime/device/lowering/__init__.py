"""The device program's lowering: a schedule's rank programs to the table the kernels read
(:func:`~stragglar.runtime.device.lowering.lower.lower`).  It shares with the prover only the
table's format (:mod:`stragglar.runtime.device.table`); the prover never imports this folder."""

from stragglar.runtime.device.lowering.lower import lower

__all__ = ["lower"]
