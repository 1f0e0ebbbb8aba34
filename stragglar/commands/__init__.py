"""The commands of ``stragglar`` (:mod:`stragglar.cli` puts them together), one module per topic:
:mod:`~stragglar.commands.schedules`, :mod:`~stragglar.commands.model`,
:mod:`~stragglar.commands.measure` and :mod:`~stragglar.commands.whatif` (its report in
:mod:`~stragglar.commands.whatif_report`).

Each command parses its options, calls the library and prints what the library renders; a
failure is a :class:`~stragglar.errors.StragglarError`, which the group turns into one
``Error:`` line with its exit code (:mod:`~stragglar.commands.error_lines`).  What several
commands share has a module per concern: the options (:mod:`~stragglar.commands.options`), the
input files (:mod:`~stragglar.commands.inputs`), the output files
(:mod:`~stragglar.commands.outputs`), proofs with a name (:mod:`~stragglar.commands.proofs`), the
terminal's text and progress lines (:mod:`~stragglar.commands.terminal`), and Ctrl-C during a z3
call (:mod:`~stragglar.commands.interrupts`).
"""
