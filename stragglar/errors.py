"""The errors stragglar raises on purpose, each with the exit code the command line gives it.

Every failure a user can cause or meet is one of these, with a one-line message that says what
went wrong and, where there is one, the way out.  The command line turns them into ``Error: ...``
and their ``exit_code``; anything else that escapes is a bug and keeps its traceback.  Exit codes:

* 1: the thing is well formed but wrong: a schedule or artifact that is not a correct AllReduce,
  a run whose result differs from the reference, a rank that failed.
* 2: bad input: an option, a request or a file that cannot be used as given.
* 3: a resource ran out: memory, or the time a solver was given.

>>> InputError("need at least 2 GPUs, got 1").exit_code
2
>>> isinstance(InputError("x"), ValueError)  # callers of the library may catch ValueError
True
"""

from __future__ import annotations

__all__ = ["ArgumentError", "IncorrectError", "InputError", "ResourceError", "RunError", "StragglarError"]


class StragglarError(Exception):
    """Base of every error stragglar raises on purpose."""

    exit_code = 1


class InputError(StragglarError, ValueError):
    """A request, option or file that cannot be used as given (exit 2)."""

    exit_code = 2


class ArgumentError(InputError, TypeError):
    """A Python API argument of the wrong type (exit 2); also a :class:`TypeError`."""


class IncorrectError(StragglarError):
    """A well-formed schedule or artifact that does not compute an AllReduce, or a wrong result (exit 1)."""


class RunError(StragglarError, RuntimeError):
    """A run that could not finish: a rank failed, a peer died or never arrived (exit 1)."""


class ResourceError(StragglarError):
    """The work needed more than it was given: memory, or a solver's time limit (exit 3)."""

    exit_code = 3
