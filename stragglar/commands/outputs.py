"""The commands' output files: checked before any work, written atomically (standard output as it
is), and charts drawn into them."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from stragglar.commands.terminal import busy, echo, progress_bar
from stragglar.errors import InputError, ResourceError, ran_out, shown
from stragglar.files import (
    check_replaceable,
    is_link_loop,
    own_descriptor,
    same_file,
    write_bytes,
    write_text,
)
from stragglar.formats import schedule_json
from stragglar.schedule import Schedule

__all__ = ["check_output", "check_plot", "dump_json", "schedule_text", "to_stdout", "write", "write_plot"]


def to_stdout(output: Path | None) -> bool:
    """Whether the output ``output`` is standard output: ``-``, or a name of descriptor 1 such as
    ``/dev/stdout`` (:func:`~stragglar.files.own_descriptor`).  A command then prints the output
    there, as it does without the option, and the lines it would print beside it go to stderr."""
    return output is not None and (str(output) == "-" or own_descriptor(output) == 1)


def _descriptor_is(descriptor: int, path: Path) -> bool:
    """Whether the open ``descriptor`` is the file ``path`` (a missing file never is)."""
    try:
        mine, theirs = os.fstat(descriptor), os.stat(path)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def _takes_a_file(folder: Path) -> bool:
    """Whether a new file can be made in ``folder``: made and removed at once, as the atomic write
    will make its temporary file there."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".stragglar-", suffix=".tmp")
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def check_output(output: Path, *inputs: Path, option: str = "-o") -> None:
    """Refuse, before any work, an output that would overwrite an input (by name, or a descriptor
    of this process open on it: ``-o /dev/stdout 1<>in.json``), that cannot be a file (a folder,
    or a device, a fifo or a socket, which the atomic rename would replace with a plain file:
    ``--json /dev/null`` must not delete the device), or whose folder is missing or cannot take a
    new file (tried: a read-only mount or ``/proc`` passes a permission check as root);
    ``option`` names it in the error.  This process's descriptors are written as they are."""
    descriptor = 1 if str(output) == "-" else own_descriptor(output)
    if descriptor is not None:
        for source in inputs:
            if _descriptor_is(descriptor, source):
                name = "standard output" if descriptor == 1 else shown(output)
                raise InputError(f"{name} is the input file {shown(source)}: write the output somewhere else")
        return
    try:
        for source in inputs:
            if same_file(source, output):
                raise InputError(f"{shown(output)} is the input file: write the output somewhere else")
        try:
            check_replaceable(output)  # a folder, a device, a fifo, a socket, a link to nothing
        except InputError as e:  # said of the option, as the other refusals here are
            raise click.BadParameter(str(e), param_hint=_hint(option)) from None
        if is_link_loop(output.parent):  # resolve() would raise (Python < 3.13) or return it as it is
            raise click.BadParameter(
                f"{shown(output)}: its folder is a loop of symbolic links", param_hint=_hint(option)
            )
        folder = output.parent.resolve()
        if not folder.is_dir():
            missing = "is not a folder" if folder.exists() else "does not exist"
            why = f"{shown(output)}: folder {shown(output.parent)} {missing}"
        elif not os.access(folder, os.W_OK | os.X_OK) or not _takes_a_file(folder):
            why = f"{shown(output)}: cannot write in {shown(output.parent)}"
        else:
            return
    except OSError as e:  # a name too long, a folder that cannot be searched
        why = f"{shown(output)}: {e.strerror or e}"
    raise click.BadParameter(why, param_hint=_hint(option))


def _hint(option: str) -> str:
    """How an error names ``option``, as click names it: ``-o`` by both its names."""
    return "'-o' / '--output'" if option == "-o" else f"'{option}'"


def check_plot(path: Path | None, *inputs: Path) -> None:
    """Check a plot's file and matplotlib before the work, so a typo does not cost a whole run."""
    if path is None:
        return
    if to_stdout(path):
        raise click.BadParameter(
            f"{shown(path)} is standard output, which carries the command's text: "
            "name a .png, .svg or .pdf file",
            param_hint="'--plot'",
        )
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise click.BadParameter(f"{shown(path)}: name a .png, .svg or .pdf file", param_hint="'--plot'")
    check_output(path, *inputs, option="--plot")
    from stragglar import plot

    try:
        plot.require_matplotlib()
    except plot.PlotUnavailable as e:
        raise click.UsageError(str(e)) from None


def write_plot(path: Path, figure: Callable[[Any], Any]) -> None:
    """Draw with :mod:`stragglar.plot` and save to ``path`` (checked by :func:`check_plot`), atomically."""
    from stragglar import plot

    try:
        write_bytes(path, plot.render(figure(plot), path.suffix.lower()[1:]))
    except OSError as e:
        raise _cannot_write(path, "--plot", e) from None
    echo(f"plot written to {shown(path, limit=None)}")


def write(path: Path, text: str, option: str = "-o") -> None:
    """Write ``text`` and a newline to ``path`` (atomically; standard output as it is, see
    :func:`to_stdout`); a failure is an error of ``option``."""
    if to_stdout(path):
        click.echo(text)
        return
    try:
        with busy(f"writing {shown(path)}"):
            write_text(path, text + "\n")
    except OSError as e:
        raise _cannot_write(path, option, e) from None


def schedule_text(schedule: Schedule) -> str:
    """``schedule``'s JSON text, made a round at a time under a bar that counts the rounds: made
    whole, by one :func:`json.dumps` (a C call that holds the GIL), N = 1024's 98 MB kept the bar
    still for 1.9 s, and N = 2048's for 7 s."""
    text = []
    with progress_bar(max(1, schedule.num_rounds), "formatting the schedule as json") as bar:
        for piece in schedule_json.pieces(schedule):  # one a round
            text.append(piece)
            bar.advance()
    return "".join(text)


def _cannot_write(path: Path, option: str, error: OSError) -> Exception:
    """A failed write: a full disk (or quota) is a resource that ran out (exit 3), anything else
    a bad ``option`` (exit 2, a read-only folder, say)."""
    why = f"cannot write {shown(path)}: {error.strerror or error}"
    return ResourceError(why) if ran_out(error) else click.BadParameter(why, param_hint=_hint(option))


def dump_json(path: Path, document: object) -> None:
    """Write a JSON document of results to ``path`` (atomically), the file of ``--json``."""
    write(path, json.dumps(document, indent=2), "--json")
