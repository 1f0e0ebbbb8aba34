"""The ``stragglar`` command: synthesize, prove, export, price and run AllReduce schedules.

Thin on purpose: the commands (:mod:`stragglar.commands`) parse arguments, call the library and
print what the library renders; this module puts them in one group, whose errors are one line
each (:mod:`~stragglar.commands.error_lines`), whose z3 work stops on Ctrl-C
(:mod:`~stragglar.commands.interrupts`) and which imports a command's module only when that
command runs or shows its help (:class:`_Entry`)::

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
import importlib
import os
import sys
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from gettext import gettext
from typing import TYPE_CHECKING, Any

import click

from stragglar.commands.error_lines import PIPE_CLOSED, one_line_errors, quiet_stdout, whole_writes
from stragglar.commands.interrupts import stopping_z3
from stragglar.commands.terminal import command_clock
from stragglar.errors import InputError, ResourceError, ran_out
from stragglar.files import stops_wait_for_writes
from stragglar.version import __version__

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

__all__ = ["cli", "main"]


@dataclass(frozen=True)
class _Entry:
    """Where a command lives, and what the group's listing says of it before it is imported.

    A command's module is imported when the command runs or its help is asked for, never for
    another's: ``stragglar synth`` waited on the imports of ``run``'s launcher (the runtime) and
    of ``verify``'s provers (networkx, numpy), ``stragglar --help`` on all of them, 0.7-1.0 s
    before its first line.  The listing, the suggestion for a misspelled name and the shell's
    completions need the names and the one-line helps alone: they are here, and
    ``tests/test_cli.py`` holds each ``summary`` to the command's own help.
    """

    module: str  # under stragglar.commands
    attribute: str
    summary: str  # the first sentence of the command's help, as click shortens it for the listing
    stops_z3: bool = True  # run and bench fork ranks: no thread may be alive at a fork; no z3 either

    def load(self) -> click.Command:
        command: click.Command = getattr(
            importlib.import_module(f"stragglar.commands.{self.module}"), self.attribute
        )
        return stopping_z3(command) if self.stops_z3 else command

    def stand_in(self, name: str) -> click.Command:
        """A command that is only its name and its one-line help: what the listing shows of it."""
        return click.Command(name, help=self.summary)


_COMMANDS = {
    "synth": _Entry("schedules", "synth", "Generate a schedule, prove it, print or save it."),
    "export": _Entry(
        "schedules",
        "export",
        "Prove the JSON schedule FILE and write it as MSCCL XML or an MSCCL++ plan (each proved again"
        " from its own text), or as JSON.",
    ),
    "verify": _Entry(
        "schedules",
        "verify",
        "Prove FILE correct, or name its first violation: a JSON schedule, MSCCL XML or an MSCCL++"
        " plan, told apart by content.",
    ),
    "show": _Entry(
        "schedules",
        "show",
        "Print FILE with its summary: a JSON schedule round by round, MSCCL XML GPU by GPU, an MSCCL++"
        " plan by thread blocks, ops and size rule.",
    ),
    "cost": _Entry(
        "model",
        "cost",
        "Predict each algorithm's AllReduce time with the alpha-beta model, on its generated schedule.",
    ),
    "bound": _Entry(
        "model",
        "bound",
        "Prove with z3 that no phase 2 for N GPUs and C chunks fits in C + ceil(log2 N) - 2 rounds"
        " (R*(N) - 1 for C = N-1), or in --rounds rounds.",
    ),
    "prove-all": _Entry(
        "model",
        "prove_all_command",
        "Prove every schedule we ship: StragglAR by z3 up to --max-gpus (baselines up to 16), all"
        " algorithms by the simulator up to --max-simulated; or the given FILES (JSON schedules, by"
        " both provers, MSCCL XML and MSCCL++ plans), every one of them, naming each that fails.",
    ),
    "whatif": _Entry(
        "whatif",
        "whatif",
        "Replay a recorded arrival trace (CSV, JSON Lines or Parquet: one row per group, step and rank,"
        " with the time that rank reached the gradient collective; or NCCL Inspector's verbose JSON, or"
        " PyTorch Flight Recorder's dumps: their files, or a folder of them) through the DDP hook's"
        " policy and the alpha-beta model: is there a persistent straggler, how late is it, and what"
        " would StragglAR, chunked StragglAR and the auto policy have saved over Ring at each step?",
    ),
    "run": _Entry(
        "measure",
        "run",
        "Run a schedule on real data and compare it with the engine's own AllReduce.",
        stops_z3=False,
    ),
    "bench": _Entry(
        "measure",
        "bench",
        "Measure a grid of settings against the engine's own AllReduce.",
        stops_z3=False,
    ),
}


class _Commands(MutableMapping[str, click.Command]):
    """The group's commands by name, each imported on first use (:class:`_Entry`).

    Iterating gives the names without importing anything, so click's ``list_commands`` and its
    "Did you mean" suggestions stay free; looking one up imports its module once.  A command
    added with ``add_command`` is kept as it is.
    """

    def __init__(self, entries: dict[str, _Entry]) -> None:
        self._items: dict[str, click.Command | _Entry] = dict(entries)

    def __getitem__(self, name: str) -> click.Command:
        item = self._items[name]
        if isinstance(item, _Entry):
            item = self._items[name] = item.load()
        return item

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._items[name] = command

    def __delitem__(self, name: str) -> None:
        del self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def listed(self, name: str) -> click.Command:
        """The command as the listing shows it: itself once imported, else its stand-in."""
        item = self._items[name]
        return item.stand_in(name) if isinstance(item, _Entry) else item


class _Group(click.Group):
    """A group whose parsing and command errors are one line each, and whose commands are imported
    when one runs (:class:`_Commands`): its listing and its completions show their stand-ins."""

    commands: _Commands

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, self.commands.listed(name)) for name in self.list_commands(ctx)]
        rows = [(name, command) for name, command in rows if not command.hidden]
        if rows:  # click's own layout: the one-line helps cut to what the width leaves
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section(gettext("Commands")):  # as click says it
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in rows])

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        names = (n for n in self.list_commands(ctx) if n.startswith(incomplete))
        listed = ((n, self.commands.listed(n)) for n in names)
        items = [CompletionItem(n, help=c.get_short_help_str()) for n, c in listed if not c.hidden]
        return items + click.Command.shell_complete(self, ctx, incomplete)  # the group's own options

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        with one_line_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_errors(), command_clock():  # from before the command's module is imported
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


cli.commands = _Commands(_COMMANDS)


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
            with stops_wait_for_writes():  # a write stopped half way leaves no temporary
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
