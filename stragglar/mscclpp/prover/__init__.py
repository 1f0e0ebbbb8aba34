"""The MSCCL++ plan prover: any execution plan proved from its JSON text as the executor runs it.

The stages, one module each: :mod:`~stragglar.mscclpp.prover.read` (the executor's loading rules,
text to the records of :mod:`~stragglar.mscclpp.prover.parsed`, an op at a time by
:mod:`~stragglar.mscclpp.prover.ops`), :mod:`~stragglar.mscclpp.prover.machine` (the executor's
model), :mod:`~stragglar.mscclpp.prover.order` (happens-before) and
:mod:`~stragglar.mscclpp.prover.prove` (the entry point).  Nothing here imports the lowering
(:mod:`stragglar.mscclpp.lowering`): the prover shares with it only the format's vocabulary
(:mod:`stragglar.mscclpp.vocabulary`), the parsed text (:mod:`stragglar.mscclpp.document`) and
errors, so a plan is judged by what it says, whoever wrote it (an import contract in
``pyproject.toml`` holds every module of this folder to that).
"""
