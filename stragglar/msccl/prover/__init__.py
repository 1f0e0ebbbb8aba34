"""The MSCCL XML prover: any MSCCL AllReduce file proved from its text as the executor runs it.

The stages, one module each: :mod:`~stragglar.msccl.prover.tokens` (the executor's own
tokenizer), :mod:`~stragglar.msccl.prover.read` (the executor's loading rules, text to the records
of :mod:`~stragglar.msccl.prover.parsed`, one GPU's thread blocks at a time by
:mod:`~stragglar.msccl.prover.blocks`), :mod:`~stragglar.msccl.prover.machine` (the executor's
model), :mod:`~stragglar.msccl.prover.order` (happens-before) and
:mod:`~stragglar.msccl.prover.prove` (the entry point).  Nothing here imports the lowering
(:mod:`stragglar.msccl.lowering`): the prover shares with it only the format's vocabulary
(:mod:`stragglar.msccl.vocabulary`) and errors, so a file is judged by what it says, whoever wrote
it (an import contract in ``pyproject.toml`` holds every module of this folder to that).
"""
