"""The errors stragglar raises on purpose, each with the exit code the command line gives it.

Every failure a user can cause or meet is one of these, with a one-line message that says what
went wrong and, where there is one, the way out.  The command line turns them into ``Error: ...``
and their ``exit_code``; anything else that escapes is a bug and keeps its traceback.  Exit codes:

* 1: the thing is well formed but wrong: a schedule or artifact that is not a correct AllReduce,
  a run whose result differs from the reference, a rank that failed.
* 2: bad input: an option, a request or a file that cannot be used as given.
* 3: a resource ran out: memory, disk space, or the time a solver was given.

>>> InputError("need at least 2 GPUs, got 1").exit_code
2
>>> isinstance(InputError("x"), ValueError)  # callers of the library may catch ValueError
True

What a message echoes of a file or an option goes through :func:`shown` (or :func:`quoted`): a
name with an escape sequence must not drive the terminal, nor a 100,000-character one fill it.
:func:`printable` does the same for whole blocks of output, line breaks kept.
"""

from __future__ import annotations

import errno

__all__ = [
    "SHOWN_CHARACTERS",
    "ArgumentError",
    "IncorrectError",
    "InputError",
    "ResourceError",
    "RunError",
    "StragglarError",
    "described",
    "printable",
    "quoted",
    "ran_out",
    "shown",
]

SHOWN_CHARACTERS = 80  # of a file's or an option's text, in a message
_EXHAUSTED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.ENOMEM})


def printable(text: str) -> str:
    r"""``text`` with every character that a terminal would not print as itself (a control
    character, an escape, a bidirectional override) escaped as ``repr`` escapes it; line breaks kept.

    >>> printable("a\x1b[2Jb\n\x00c")
    'a\\x1b[2Jb\n\\x00c'
    """
    if text.replace("\n", "").isprintable():  # one pass in C: a large table costs little
        return text
    return "\n".join(_escaped(line) for line in text.split("\n"))


def shown(text: object, limit: int | None = SHOWN_CHARACTERS) -> str:
    r"""``text`` (a file's name, an option's value, a string from a file) as one line of a message
    may echo it: escaped as by :func:`printable`, line breaks too, and at most ``limit`` characters
    of it, the rest counted (None: all of it, for a name a line of output gives in full).

    >>> shown("late\n\x07"), shown("x" * 100_000, limit=3), shown("a\nb", limit=None)
    ('late\\n\\x07', 'xxx... (100,000 characters)', 'a\\nb')
    """
    whole = str(text)
    return _escaped(whole) if limit is None else _cut(whole, limit, len(whole))


def _cut(whole: str, limit: int, length: int) -> str:
    """``whole`` escaped and cut at ``limit`` characters, the value's ``length`` counted after it."""
    head = _escaped(whole[:limit])
    return head if len(whole) <= limit else f"{head}... ({length:,} characters)"


def quoted(text: object, limit: int = SHOWN_CHARACTERS) -> str:
    """:func:`shown` in quotes, where a message sets a value apart: ``'64XB'``."""
    return f"'{shown(text, limit)}'"


def described(value: object, limit: int = SHOWN_CHARACTERS) -> str:
    """``value`` as a message of the Python API names what it was given: its ``repr``, cut as
    :func:`shown` cuts, and an integer too long to print (Python refuses more than 4,300 digits)
    by its size.

    A string's count is of its own characters, not of its ``repr``'s quotes.

    >>> described("ab"), described(10**5000), described("x" * 100, limit=3)
    ("'ab'", 'an integer of 16,610 bits', "'xx... (100 characters)")
    """
    try:
        text = repr(value)
    except ValueError:  # an int past Python's limit on digits
        return f"an integer of {int(value).bit_length():,} bits"  # type: ignore[call-overload]
    return _cut(text, limit, len(value) if isinstance(value, str) else len(text))


def _escaped(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


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


def ran_out(error: OSError) -> bool:
    """Whether a failed read or write ran out of a resource (a full disk, a quota, a file-size
    limit, memory: exit 3), rather than being given something it cannot use (a name too long, a
    folder without permission: exit 2)."""
    return error.errno in _EXHAUSTED
