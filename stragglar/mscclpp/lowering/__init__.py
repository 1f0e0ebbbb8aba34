"""The MSCCL++ lowering: a proved schedule to an in-place AllReduce execution plan on memory channels.

The stages, one module each, are listed by :mod:`~stragglar.mscclpp.lowering.lower`, the entry
point: :mod:`~stragglar.mscclpp.lowering.rounds`, :mod:`~stragglar.mscclpp.lowering.threadblocks`,
:mod:`~stragglar.mscclpp.lowering.emit`.  What the lowering shares with the prover is the format's
vocabulary (:mod:`stragglar.mscclpp.vocabulary`), the size rule (:mod:`stragglar.mscclpp.sizes`)
and errors only; the prover never imports this folder.
"""
