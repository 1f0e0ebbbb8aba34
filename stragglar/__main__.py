"""The ``stragglar`` command's entry point: its console script, and ``python -m stragglar`` where
the script is not on PATH.

Ctrl-C while the command's modules load (a tenth of a second or more on a cold start) raised
KeyboardInterrupt from the middle of an import, before the command could catch it, and printed a
traceback: it now ends the command as Ctrl-C does later (``Aborted!``, exit 130).  So this module
imports nothing of the command's until :func:`main` runs (before it, only the package's
``__init__``: the schedule IR, pure Python).
"""

import sys

INTERRUPTED = 130  # the shell's code for a command ended by Ctrl-C, as the command's own


def main() -> None:
    try:
        from stragglar.cli import main as command
    except KeyboardInterrupt:
        if sys.stderr is not None:
            sys.stderr.write("\nAborted!\n" if sys.stderr.isatty() else "Aborted!\n")
            sys.stderr.flush()
        raise SystemExit(INTERRUPTED) from None
    command()


if __name__ == "__main__":
    main()
