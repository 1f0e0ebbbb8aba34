"""Every error of a command as one ``Error: ...`` line with its exit code: a usage error without
its usage text, a library error (:class:`~stragglar.errors.StragglarError`) with its own code,
running out of memory as a resource that ran out, Ctrl-C as click's "Aborted!" with the
shell's code for it, and a reader that went away (``| head``) silently with the shell's code for
it; what a line echoes of files and options is escaped and bounded.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import os
import re
import select
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

import click

from stragglar.errors import (
    SHOWN_CHARACTERS,
    ResourceError,
    StragglarError,
    printable,
    quoted,
    shown,
)

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "INTERRUPTED",
    "MAX_ERROR_LINE",
    "PIPE_CLOSED",
    "one_line_errors",
    "quiet_stdout",
    "whole_writes",
]


INTERRUPTED = 130  # the shell's code for a command ended by Ctrl-C (128 + SIGINT)
PIPE_CLOSED = 141  # the shell's code for a command whose reader went away (128 + SIGPIPE): `| head`


class _WholeWrites(io.RawIOBase):
    """A file descriptor that takes each write whole, or raises.  A pipe whose reader leaves in the
    middle of a large write takes part of it, and Python's buffered writer then returns without
    the rest and without an error: a document cut short would end with exit 0, as if the reader
    had read it all.  Writing the rest meets the closed pipe, and its BrokenPipeError ends the
    command with :data:`PIPE_CLOSED`.  The descriptor stays open: the interpreter's stream owns it."""

    def __init__(self, descriptor: int) -> None:
        super().__init__()
        self._descriptor = descriptor

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._descriptor

    def isatty(self) -> bool:
        return os.isatty(self._descriptor)

    def write(self, data: Buffer) -> int:
        view = memoryview(data).cast("B")
        written = 0
        while written < len(view):
            try:
                written += os.write(self._descriptor, view[written:])
            except BlockingIOError:  # a non-blocking descriptor whose pipe is full: wait for room
                select.select([], [self._descriptor], [])
        return written


def whole_writes(stream: TextIO) -> TextIO:
    """``stream`` (standard output) writing each piece whole or raising (:class:`_WholeWrites`),
    with its encoding and line buffering; ``stream`` itself where it has no file descriptor."""
    try:
        descriptor = stream.fileno()
    except (OSError, ValueError, AttributeError):  # not a file: nothing cuts its writes short
        return stream
    stream.flush()
    return io.TextIOWrapper(
        io.BufferedWriter(_WholeWrites(descriptor)),
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=bool(stream.line_buffering),
        write_through=bool(getattr(stream, "write_through", False)),  # python -u, PYTHONUNBUFFERED
    )


def quiet_stdout() -> None:
    """Point standard output at /dev/null, so that what is still buffered for a reader that went
    away is dropped at exit instead of raising again (Python's own advice for SIGPIPE)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


@functools.cache
def _failure(exit_code: int) -> type[click.ClickException]:
    """The click exception that shows a library error as ``Error: ...`` and exits ``exit_code``."""
    return type(f"_Exit{exit_code}", (click.ClickException,), {"exit_code": exit_code})


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Usage errors without their usage text, library errors with their exit codes, each one line
    with what it echoes of files and options escaped and bounded (:func:`~stragglar.errors.shown`).

    Errors that show something else (the help page when no command is given) are left alone.
    """
    try:
        yield
    except click.UsageError as e:
        if type(e).show is not click.UsageError.show:
            raise
        raise click.UsageError(_capped(_bounded(e.format_message()))) from None
    except StragglarError as e:
        raise _failure(e.exit_code)(_capped(printable(str(e).split("\n")[0]))) from None
    except MemoryError:
        raise _failure(ResourceError.exit_code)(
            "out of memory: this machine cannot hold the work asked for (the size limits are in the README)"
        ) from None
    except BrokenPipeError:  # `| head` stopped reading: quietly, and not 1 ("not a correct AllReduce")
        quiet_stdout()
        raise click.exceptions.Exit(PIPE_CLOSED) from None
    except KeyboardInterrupt:  # click's "Aborted!", with an exit code of its own, not 1 ("wrong")
        if _on_terminal(sys.stderr):  # a line break after the terminal's "^C"; a pipe has none
            click.echo(err=True)
        click.echo("Aborted!", err=True)
        raise click.exceptions.Exit(INTERRUPTED) from None


def _on_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and bool(stream.isatty())
    except (OSError, ValueError):  # closed
        return False


MAX_ERROR_LINE = 400  # characters: every echo inside is cut to a few words; this catches the rest


def _capped(line: str) -> str:
    """An error line at most :data:`MAX_ERROR_LINE` characters long (with its length said): what a
    message echoes unquoted (click's "unexpected extra argument", a key of a file) can be long."""
    return shown(line, MAX_ERROR_LINE)


_LITERAL = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")  # as repr writes a string


def _bounded(message: str) -> str:
    """A usage error's line with what it quotes of the command line cut to a few words: click
    quotes a value it refuses with ``repr``, however long (``--gpus`` given 100,000 characters)."""

    def cut(literal: re.Match[str]) -> str:
        text = literal[0]
        if len(text) <= SHOWN_CHARACTERS + 2:
            return text
        try:
            return quoted(ast.literal_eval(text))
        except (ValueError, SyntaxError):  # two apostrophes of the message's own words
            return quoted(text[1:-1])

    return printable(_LITERAL.sub(cut, message.split("\n")[0]))
