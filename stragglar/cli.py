"""The ``stragglar`` command: synthesize, prove, export, price and run AllReduce schedules.

Thin on purpose: the commands (:mod:`stragglar.commands`) parse arguments, call the library and
print what the library renders; this module puts them in one group and owns the errors::

    stragglar synth --gpus N [--straggler R] [--algorithm A] [-o FILE] [--format json|text|msccl]
    stragglar export FILE -o OUT.xml [--proto P] [--instances K] [--min-bytes B] [--max-bytes B]
    stragglar verify FILE            (a JSON schedule or an MSCCL XML file)
    stragglar show FILE [--plot OUT.png]
    stragglar cost --gpus N [--size 1GiB] [--delay 5ms] [--alpha 3us] [--bandwidth 450GiB/s] [--plot OUT.png]
    stragglar run --backend local|torch|cupy --gpus N [--size 64MiB] [--dtype D] [--delay 20ms] ...
    stragglar bench [--backend torch] [--gpus 4,8] [--sizes 16MiB,64MiB] [--delays 0,50ms] [--json OUT]
    stragglar bound --gpus N         stragglar prove-all [FILES]
    stragglar whatif TRACE [--rank-col C] [--where COL=V] [--time-unit ms] [--bucket 25MiB] [--json OUT]

Every schedule is proved before it is printed, written or run.  ``synth`` sends the schedule
(the text table, or the JSON document) to ``-o FILE`` if given, else (or for ``-o -``) to
stdout; its one-line summary goes to stdout, except when stdout carries the JSON document, then
to stderr, so that ``stragglar synth --gpus 8 --format json > s.json`` is clean JSON.

Exit codes: 0 success; 1 the schedule is not a correct AllReduce (or a run failed or went
wrong); 2 bad input (a bad option, an unreadable or malformed file); 3 a resource ran out
(memory, disk space, or a solver's time); 130 Ctrl-C; 129 and 143 ``run`` or ``bench`` stopped by
SIGHUP or SIGTERM.  Errors are a single ``Error: ...`` line on stderr: every
:class:`~stragglar.errors.StragglarError` becomes one with its exit code, and so does running
out of memory; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import os
import re
import select
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click

from stragglar.commands.measure import bench, run
from stragglar.commands.model import bound, cost, prove_all_command
from stragglar.commands.schedules import export, show, synth, verify
from stragglar.commands.whatif import whatif
from stragglar.errors import (
    SHOWN_CHARACTERS,
    InputError,
    ResourceError,
    StragglarError,
    printable,
    quoted,
    ran_out,
    shown,
)
from stragglar.version import __version__

__all__ = ["cli", "main"]


INTERRUPTED = 130  # the shell's code for a command ended by Ctrl-C (128 + SIGINT)


@functools.cache
def _failure(exit_code: int) -> type[click.ClickException]:
    """The click exception that shows a library error as ``Error: ...`` and exits ``exit_code``."""
    return type(f"_Exit{exit_code}", (click.ClickException,), {"exit_code": exit_code})


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
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
    except KeyboardInterrupt:  # click's "Aborted!", with an exit code of its own, not 1 ("wrong")
        click.echo(err=True)
        click.echo("Aborted!", err=True)
        raise click.exceptions.Exit(INTERRUPTED) from None


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


@contextlib.contextmanager
def _ctrl_c_stops_z3() -> Iterator[None]:
    """Ctrl-C stops a z3 call as well as Python code, and ends the command with "Aborted!" (130).

    Python runs its SIGINT handler between bytecodes, and z3's ``check()`` is one C call that can
    last minutes: the handler would wait for it.  The signal also wakes a thread through
    :func:`signal.set_wakeup_fd`; that thread asks z3 to stop (``interrupt``, z3's own way),
    ``check()`` returns, and the KeyboardInterrupt follows at once.  z3's own Ctrl-C handling is
    turned off: during ``check()`` it replaced Python's handler and let the signal go unanswered.
    A KeyboardInterrupt raised inside z3's Python glue comes out as another exception (ctypes'
    ArgumentError) or, inside a ``__del__``, not at all: after a Ctrl-C any exception is taken
    as the interrupt, and the thread signals again while the command still runs.  Main thread
    only (where signals arrive), never around a command that forks, and not where SIGINT is
    ignored (a background job).
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    import z3

    z3.set_param("ctrl_c", False)
    interrupted = threading.Event()
    done = threading.Event()

    def on_ctrl_c(_signum: int, _frame: Any) -> None:
        interrupted.set()
        sys.unraisablehook = _quiet  # objects the interrupt left half-built complain when freed
        raise KeyboardInterrupt

    def watch() -> None:
        while not done.is_set():
            ready, _, _ = select.select([reader], [], [], 0.2)
            if ready and signal.SIGINT in reader.recv(64):
                z3.main_ctx().interrupt()
            elif not ready and interrupted.is_set() and not done.is_set():
                z3.main_ctx().interrupt()  # z3 was between two check() calls, or the interrupt was lost
                os.kill(os.getpid(), signal.SIGINT)

    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous_handler = signal.signal(signal.SIGINT, on_ctrl_c)
    thread = threading.Thread(target=watch, name="ctrl-c-stops-z3", daemon=True)
    thread.start()
    try:
        yield
    except Exception:
        if interrupted.is_set():
            raise KeyboardInterrupt from None
        raise
    finally:
        done.set()
        signal.signal(signal.SIGINT, previous_handler)
        signal.set_wakeup_fd(previous_fd)
        thread.join(1.0)
        reader.close()
        writer.close()


def _quiet(_: Any) -> None:
    """An unraisable-exception hook that says nothing (the command is ending on a Ctrl-C)."""


class _Group(click.Group):
    """A group whose parsing and command errors are one line each."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        with _one_line_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line_errors():
            return super().invoke(ctx)


@click.group(
    cls=_Group, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, "--version", prog_name="stragglar", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Synthesize, prove, export, price and run StragglAR AllReduce schedules.

    \b
    Units: a size takes B, KB, MB, GB, TB, KiB, MiB, GiB or TiB (a bare number is bytes);
    a duration needs us, ms or s (20ms; a bare 0 is allowed); a bandwidth needs a unit per
    second (450GiB/s, 100Gbit/s); a bit-style Gb or Mib is refused, not read as bytes.
    Exit codes: 0 done, 1 not a correct AllReduce or a failed run, 2 bad input, 3 out of
    memory, disk space or solver time, 130 interrupted (Ctrl-C).
    """
    if ctx.invoked_subcommand is None:  # bare `stragglar`: the help, asked for in effect
        click.echo(ctx.get_help())
        ctx.exit(0)


def _stopping_z3(command: click.Command) -> click.Command:
    """``command`` with :func:`_ctrl_c_stops_z3` around its work."""
    work = command.callback
    assert work is not None

    @functools.wraps(work)
    def stopping(*args: Any, **kwargs: Any) -> Any:
        with _ctrl_c_stops_z3():
            return work(*args, **kwargs)

    command.callback = stopping
    return command


for _command in (synth, export, verify, show, cost, bound, prove_all_command, whatif):
    cli.add_command(_stopping_z3(_command))
for _command in (run, bench):  # they fork ranks, and no thread may be alive at a fork; no z3 either
    cli.add_command(_command)


def main() -> None:
    """Entry point of the ``stragglar`` console script.

    Standard output is flushed here, not at exit, so that a full disk (``> /dev/full``: exit 3)
    or an output that cannot be written (exit 2, also a standard output closed before the start)
    is one line, not a traceback or Python's exit-time complaint.  A closed pipe (``| head``) click
    already handles.
    """
    if sys.stdout is None:  # started with standard output closed (>&-): Python leaves None
        if sys.stderr is not None:
            sys.stderr.write("Error: cannot write the output: standard output is closed\n")
            sys.stderr.flush()
        os._exit(InputError.exit_code)
    try:
        try:
            cli.main(prog_name="stragglar")
        finally:
            sys.stdout.flush()
    except OSError as e:
        if sys.stderr is not None:
            with contextlib.suppress(OSError):  # stderr itself may be what is full (2>/dev/full)
                sys.stderr.write(f"Error: cannot write the output: {e.strerror or e}\n")
                sys.stderr.flush()
        # no exit-time flush of the output that could not be written
        os._exit(ResourceError.exit_code if ran_out(e) else InputError.exit_code)
