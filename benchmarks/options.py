"""What the benchmarks share on their command lines: :class:`Parser`, whose refusal is one line and
exit 2, argparse types that say their reason in that line, the checks of ``--json`` before any
work, and :func:`as_command`, which ends a benchmark as ``stragglar`` ends a command: one line, an
exit code.

Progress shows on a terminal only (:func:`each`, :func:`note`).  The units are the command line's:
sizes as ``1MiB``, durations as ``20ms`` or ``1.5s`` (a bare number is refused, as ``stragglar``
refuses it: ``5`` could be seconds or milliseconds).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

import click

from stragglar.commands.error_lines import PIPE_CLOSED, quiet_stdout
from stragglar.commands.outputs import check_output, to_stdout
from stragglar.commands.terminal import busy
from stragglar.errors import InputError, StragglarError
from stragglar.measure.links import check_link_rate
from stragglar.schedule import MAX_RANKS
from stragglar.units import format_bytes, parse_bandwidth, parse_duration, parse_size

__all__ = [
    "Distinct",
    "Parser",
    "as_command",
    "byte_size",
    "duration",
    "each",
    "json_output",
    "link_rate",
    "note",
    "positive_number",
    "ranks",
    "whole",
]


_T = TypeVar("_T")


class Defaults(argparse.HelpFormatter):
    """Help that ends each option's line with its default as it would be typed (``(default: 8
    64)``, ``(default: 64MiB)``, ``(default: 600s)``): without it a user read the script to learn
    what a bare run measures.  argparse's ``ArgumentDefaultsHelpFormatter`` showed lists as
    ``[8, 64]`` and sizes in bytes, neither of which the option takes back.  A duration's default
    is given as text (``default="600s"``), which argparse converts as if it were typed."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        absent = default is None or default is False or default == argparse.SUPPRESS  # not 0: it is shown
        if absent or "default" in text or not action.option_strings:
            return text
        items = default if isinstance(default, list) else [default]
        shown = " ".join(typed(action, item) for item in items).replace("%", "%%")
        return f"{text} (default: {shown})"


def typed(action: argparse.Action, value: object) -> str:
    """``value`` as the option takes it on the command line: a byte size with its unit."""
    if action.type is byte_size and isinstance(value, int):
        return format_bytes(value).replace(" ", "")
    return str(value)


class Parser(argparse.ArgumentParser):
    """argparse's parser, refusing in one line (``bench_x.py: error: ...``, exit 2), as
    ``stragglar`` does: argparse's own printed the whole usage first, a block that pushed the
    reason off a small terminal.  ``--help`` still shows the usage, and each option's default
    (:class:`Defaults`).

    A value that starts with a minus and a digit (``--bound-timeout -1s``) is the option's value,
    refused by its type in its own words ("... got '-1s' (a number, no sign, and a unit)"):
    argparse took ``-1s`` for an unknown option and said only "expected one argument".  No
    benchmark has an option spelt that way."""

    def __init__(self, description: str) -> None:
        super().__init__(description=description, formatter_class=Defaults)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def add_gpus(
        self,
        default: list[int] | None = None,
        says: str = "rank counts",
        parse: Callable[[str], int] | None = None,
    ) -> None:
        """``--gpus N [N ...]``, the rank counts, as every benchmark takes them: distinct
        (:class:`Distinct`), ``N`` in help (``says``), ``stragglar``'s limits unless ``parse``
        narrows them."""
        self.add_argument(
            "--gpus", type=parse or ranks, action=Distinct, nargs="+", default=default, metavar="N", help=says
        )


class Distinct(argparse.Action):
    """A list option (``--gpus 8 64``) whose items must differ, refused in one line otherwise: an
    N given twice was measured twice, its second "first lookup" a cache hit (bench_runtime),
    and a fit over two equal N divided by zero (bench_tooling)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        items = list(values or [])
        repeated = list(dict.fromkeys(item for place, item in enumerate(items) if item in items[:place]))
        if repeated:
            twice = ", ".join(map(str, repeated))
            parser.error(f"argument {option_string}: {twice} given more than once: give each once")
        setattr(namespace, self.dest, items)


def each(items: Sequence[_T], label: Callable[[_T], str]) -> Iterator[_T]:
    """``items``, each with ``label(item)``, its place and the time spent on it shown on stderr
    from its first second, on a terminal only: a benchmark's settings take seconds to minutes
    each, and a pipe gets the table alone."""
    for place, item in enumerate(items, 1):
        with busy(f"{label(item)} ({place} of {len(items)})"):
            yield item


def note(text: str) -> None:
    """A line of progress (a calibration's figures) on stderr, on a terminal only."""
    if sys.stderr is not None and sys.stderr.isatty():
        print(text, file=sys.stderr, flush=True)


def link_rate(text: str) -> float:
    """``--link-rate``: a bandwidth ("200MB/s") that a paced link can have."""
    try:
        return check_link_rate(parse_bandwidth(text))
    except InputError as e:  # argparse shows an ArgumentTypeError's own words
        raise argparse.ArgumentTypeError(str(e)) from None


def whole(least: int, most: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``least`` (to ``most``).  A count of 0 calls or
    repeats failed after the table's header with Python's own error; a huge one ran for hours."""

    def convert(text: str) -> int:
        try:
            number = int(text if text.isascii() else "x", 10)  # int() takes Arabic-Indic digits too
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if number < least or (most is not None and number > most):
            span = f"from {least:,} to {most:,}" if most is not None else f"of {least:,} or more"
            raise argparse.ArgumentTypeError(f"{text!r}: need a whole number {span}")
        return number

    return convert


ranks = whole(2, MAX_RANKS)  # a world size N, as `stragglar --gpus` takes it


def duration(least: float = 0.0, *, positive: bool = False) -> Callable[[str], float]:
    """An argparse type: a duration with its unit (``30ms``), in seconds, at least ``least``
    (more than 0 with ``positive``: a timeout or a budget of 0 would skip every step)."""

    def convert(text: str) -> float:
        try:
            seconds = parse_duration(text)
        except InputError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if not math.isfinite(seconds) or seconds < least or (positive and seconds <= 0):
            bound = "more than 0" if positive and least <= 0 else f"at least {least:g} s"
            raise argparse.ArgumentTypeError(f"{text!r}: need a duration {bound}")
        return seconds

    return convert


def byte_size(text: str) -> int:
    """A buffer size with its unit (``64MiB``), in bytes, at least one."""
    try:
        count = parse_size(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: need a size of 1 byte or more")
    return count


def positive_number(text: str) -> float:
    """A finite number above 0 (a factor: ``--delay-factor 1.5``)."""
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: need a number above 0")
    return number


def json_output(text: str) -> Path:
    """``--json FILE``, checked before any work: a folder, a device or a missing folder used to
    fail after the whole run, its figures lost.  Standard output carries the table, so '-' and
    ``/dev/stdout`` are refused."""
    path = Path(text)
    if to_stdout(path):
        raise argparse.ArgumentTypeError(f"{text!r} is standard output, which carries the table: name a file")
    try:
        check_output(path, option="--json")
    except click.BadParameter as e:
        raise argparse.ArgumentTypeError(e.message) from None
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return path


def as_command(main: Callable[[], object]) -> NoReturn:
    """Run a benchmark's ``main`` as ``stragglar`` runs a command: a stragglar error (a value
    argparse could not judge alone, a failed rank, SIGTERM) ends it with ``Error: ...`` and the
    error's exit code; Ctrl-C with ``Aborted!`` and 130; a reader that went away (``| head -1``)
    silently with 141, as SIGPIPE would (it was a BrokenPipeError's traceback).  Standard output is
    flushed here, not at exit, so that a closed pipe met by the last of the table ends the same way.
    Anything else is a bug: its traceback."""
    try:
        try:
            main()
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()  # what is still buffered goes nowhere at exit, rather than raising again
        sys.exit(PIPE_CLOSED)
    except StragglarError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("Aborted!", file=sys.stderr)
        sys.exit(130)
    sys.exit(0)
