"""The ``stragglar`` command: synthesize, prove, export, price and run AllReduce schedules.

Thin on purpose: the commands (:mod:`stragglar.commands`) parse arguments, call the library and
print what the library renders; this module puts them in one group, whose errors are one line
each (:mod:`~stragglar.commands.error_lines`) and whose z3 work stops on Ctrl-C
(:mod:`~stragglar.commands.interrupts`)::

    stragglar synth --gpus N [--straggler R] [--algorithm A] [-o FILE] [--format json|text|msccl]
    stragglar export FILE -o OUT.xml [--proto P] [--instances K] [--min-bytes B] [--max-bytes B]
    stragglar verify FILE            (a JSON schedule or an MSCCL XML file)
    stragglar show FILE [--plot OUT.png]
    stragglar cost --gpus N [--size 1GiB] [--delay 5ms] [--alpha 3us] [--bandwidth 450GiB/s] [--plot OUT.png]
    stragglar run --backend local|torch|cupy --gpus N [--size 64MiB] [--dtype D] [--delay 20ms] ...
    stragglar bench [--backend torch] [--gpus 4,8] [--sizes 16MiB,64MiB] [--delays 0,50ms] [--json OUT]
    stragglar bound --gpus N         stragglar prove-all [FILES]
    stragglar whatif TRACE... [--rank-col C] [--where COL=V] [--time-unit ms] [--bucket 25MiB] [--json OUT]

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

import collections
import contextlib
import os
import sys
from typing import Any

import click

from stragglar.commands.error_lines import PIPE_CLOSED, one_line_errors, quiet_stdout, whole_writes
from stragglar.commands.interrupts import stopping_z3
from stragglar.commands.measure import bench, run
from stragglar.commands.model import bound, cost, prove_all_command
from stragglar.commands.schedules import export, show, synth, verify
from stragglar.commands.terminal import command_clock, process_started
from stragglar.commands.whatif import whatif
from stragglar.errors import InputError, ResourceError, ran_out
from stragglar.version import __version__

__all__ = ["cli", "main"]


class _Group(click.Group):
    """A group whose parsing and command errors are one line each."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        with one_line_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_errors(), command_clock():  # main's clock, where it runs, counts from the start
            return super().invoke(ctx)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            _refuse_repeated(command, ctx, rest)
        return name, command, rest


def _refuse_repeated(command: click.Command, parent: click.Context, args: list[str]) -> None:
    """An option of one value given twice is an error: click keeps the last (``--gpus 4 --gpus
    8`` built for 8, ``--plot a.png --plot b.png`` wrote b.png alone) without a word.  Options
    that take several (``--bucket``), counts, a plain switch (``-v -v`` says one thing twice; a
    pair such as ``--x/--no-x`` may not) and ``--help`` may repeat."""
    with click.Context(command, info_name=command.name, parent=parent, resilient_parsing=True) as probe:
        try:
            _, _, order = command.make_parser(probe).parse_args(args=list(args))
        except click.UsageError:  # the command's own parsing says it, in its words
            return
    times = collections.Counter(
        p
        for p in order
        if isinstance(p, click.Option)
        and not (p.multiple or p.count or p.is_eager or (p.is_flag and not p.secondary_opts))
    )
    for option, count in times.items():
        if count > 1:
            spelled = "/".join(option.opts + option.secondary_opts)
            raise click.UsageError(f"{spelled} is given {count} times: give it once", parent)


@click.group(
    cls=_Group, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, "--version", prog_name="stragglar", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Synthesize, prove, export, price and run StragglAR AllReduce schedules.

    \b
    Units: a size takes B (or bytes), KB, MB, GB, TB, PB, EB, KiB, MiB, GiB, TiB, PiB or
    EiB (a bare number is bytes; at most 1 EiB); a duration needs ns, us (or µs), ms or s
    (20ms; a bare 0 is allowed); a bandwidth needs a unit per second (450GiB/s, 100Gbit/s,
    7.2Tbit/s); a bit-style Gb or Mib, or a rate like 10gb/s, is refused, not read as bytes;
    the whole number of a size, duration or bandwidth may group its digits in threes with
    commas (1,000,004 B), as reports print them, except in a list (bench --sizes), where a
    comma separates the items (counts, such as --chunks, take plain digits).
    Exit codes: 0 done, 1 not a correct AllReduce or a failed run, 2 bad input, 3 out of
    memory, disk space or solver time, 130 interrupted (Ctrl-C), 141 the output's reader went away,
    129 and 143 stopped by SIGHUP and SIGTERM.
    """
    if ctx.invoked_subcommand is None:  # bare `stragglar`: the help, asked for in effect
        click.echo(ctx.get_help())
        ctx.exit(0)


for _command in (synth, export, verify, show, cost, bound, prove_all_command, whatif):
    cli.add_command(stopping_z3(_command))
for _command in (run, bench):  # they fork ranks, and no thread may be alive at a fork; no z3 either
    cli.add_command(_command)


def main() -> None:
    """Entry point of the ``stragglar`` console script.

    Standard output is flushed here, not at exit, so that a full disk (``> /dev/full``: exit 3)
    or an output that cannot be written (exit 2, also a standard output closed before the start)
    is one line, not a traceback or Python's exit-time complaint.  A reader that went away
    (``| head``) ends the command silently with exit 141, as SIGPIPE would, wherever it is seen.
    """
    if sys.stdout is None:  # started with standard output closed (>&-): Python leaves None
        if sys.stderr is not None:
            sys.stderr.write("Error: cannot write the output: standard output is closed\n")
            sys.stderr.flush()
        os._exit(InputError.exit_code)
    sys.stdout = whole_writes(sys.stdout)  # a document cut short by its reader is never exit 0
    try:
        try:
            with command_clock(process_started()):  # the imports are part of the wait
                cli.main(prog_name="stragglar")
        finally:
            sys.stdout.flush()
    except BrokenPipeError:  # the reader went away as the last output was flushed (`| head`)
        quiet_stdout()
        os._exit(PIPE_CLOSED)
    except OSError as e:
        if sys.stderr is not None:
            with contextlib.suppress(OSError):  # stderr itself may be what is full (2>/dev/full)
                sys.stderr.write(f"Error: cannot write the output: {e.strerror or e}\n")
                sys.stderr.flush()
        # no exit-time flush of the output that could not be written
        os._exit(ResourceError.exit_code if ran_out(e) else InputError.exit_code)
