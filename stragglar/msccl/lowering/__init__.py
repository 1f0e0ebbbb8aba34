"""The MSCCL XML lowering: a proved schedule to one in-place AllReduce ``<algo>`` for the executor.

The stages, one module each, are listed by :mod:`~stragglar.msccl.lowering.lower`, the entry
point: :mod:`~stragglar.msccl.lowering.rounds`, :mod:`~stragglar.msccl.lowering.threadblocks`,
:mod:`~stragglar.msccl.lowering.dependencies`, :mod:`~stragglar.msccl.lowering.emit`.  What the
lowering shares with the prover is the format's vocabulary (:mod:`stragglar.msccl.vocabulary`) and
errors only; the prover never imports this folder.
"""
