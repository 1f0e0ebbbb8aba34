"""The commands of ``stragglar`` (:mod:`stragglar.cli` puts them together), one module per topic.

Each command parses its options, calls the library and prints what the library renders; a
failure is a :class:`~stragglar.errors.StragglarError`, which the group turns into one
``Error:`` line with its exit code.
"""
