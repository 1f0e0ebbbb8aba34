"""The options several commands share: quantities with units, the chunk count, the GPUs, the
algorithm, output files, the export options, and the refusal of an option that does not apply."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from stragglar.args import MAX_TIMEOUT
from stragglar.artifacts import FORMATS, PROTOCOLS, ExportOptions
from stragglar.commands.terminal import busy
from stragglar.errors import InputError, quoted
from stragglar.model import AUTO, PAPER_NETWORK, Network, ranked_chunks, resolve_chunks
from stragglar.schedule import MAX_CHUNKS, MAX_RANKS
from stragglar.synth import ALGORITHMS
from stragglar.units import (
    exact_duration,
    format_bytes,
    format_seconds,
    parse_bandwidth,
    parse_duration,
    parse_size,
)

__all__ = [
    "ALGORITHM",
    "BANDWIDTH",
    "CHUNKS",
    "DURATION",
    "GPUS",
    "INPUT",
    "MEASURED_CHUNKS",
    "OUTPUT",
    "PLOT",
    "SIZE",
    "STRAGGLER",
    "TIMEOUT",
    "VERBOSE",
    "WHOLE",
    "WHOLE_MAX",
    "Quantity",
    "Real",
    "Whole",
    "artifact_options",
    "auto_note",
    "chosen_chunks",
    "chunks_by_price",
    "chunks_option",
    "given",
    "model_options",
    "network_words",
    "once_each",
    "refuse_chunks_for",
    "refuse_given",
    "refuse_other_formats",
]

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


class Quantity(click.ParamType):  # type: ignore[type-arg, unused-ignore]
    """An option with a unit, read by :mod:`stragglar.units`; ``many`` reads a comma-separated list."""

    def __init__(self, name: str, parse: Callable[[str], Any], many: bool = False) -> None:
        self.name = f"{name}s" if many else name
        self.item = name
        self.parse = parse
        self.many = many

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            if not self.many:
                return self.parse(value)
            items = [x.strip() for x in value.split(",")]
            if not all(items):
                raise InputError(f"expected a comma-separated list, got {quoted(value)}")
            _refuse_grouped_digits(items, self.name)
            return once_each([self.parse(x) for x in items], items, self.item)
        except InputError as e:
            self.fail(str(e), param, ctx)


def once_each(values: list[_T], items: list[str], name: str) -> list[_T]:
    """``values`` (read from the texts ``items``), each there once: a grid's setting given twice
    (``64KiB,65536``) would be measured twice and reported once.

    >>> once_each([4, 8], ["4", "8"], "rank count")
    [4, 8]
    >>> once_each([65536, 65536], ["64KiB", "65536"], "size")
    Traceback (most recent call last):
    stragglar.errors.InputError: '64KiB' and '65536' are the same size: give each once
    """
    for later, value in enumerate(values):
        first = values.index(value)
        if first < later:
            same = (
                f"{quoted(items[first])} is there twice"
                if items[first] == items[later]
                else f"{quoted(items[first])} and {quoted(items[later])} are the same {name}"
            )
            raise InputError(f"{same}: give each once")
    return values


def _refuse_grouped_digits(items: list[str], name: str) -> None:
    """A list's items come between commas, yet a single quantity may group its digits with them
    (``1,000,004 B``, as reports print it): ``4,096`` would be read as 4 and 96.  A bare number
    of one to three digits, not starting with 0 (a grouping's first digits), followed by an item
    that starts with three digits is taken for such a grouping, and refused, not read as two.

    >>> _refuse_grouped_digits(["16MiB", "64MiB", "1000"], "sizes")
    >>> _refuse_grouped_digits(["0", "100ms"], "durations")  # no grouping starts with 0
    >>> _refuse_grouped_digits(["4", "096KiB"], "sizes")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    stragglar.errors.InputError: '4,096KiB': a comma separates ... be 4 and 096KiB: write 4096KiB for one
    """
    for i, first in enumerate(items[:-1]):
        if not (_FIRST_GROUP.fullmatch(first) and _THREE_DIGITS.match(items[i + 1])):
            continue
        group, rest = [first, items[i + 1]], items[i + 2 :]
        while group[-1].isdigit() and rest and _THREE_DIGITS.match(rest[0]):  # 1,000,004: one group
            group.append(rest.pop(0))
        raise InputError(
            f"{quoted(','.join(group))}: a comma separates the {name} here, so this would be "
            f"{', '.join(group[:-1])} and {group[-1]}: write {''.join(group)} for one"
        )


_FIRST_GROUP = re.compile(r"[1-9][0-9]{0,2}")  # a grouping's first digits: 0,100ms is 0 and 100ms
_THREE_DIGITS = re.compile(r"[0-9]{3}(?![0-9.])")


def _timeout(text: str) -> float:
    """A --timeout: a duration that is more than nothing and at most a day, the API's bound on a wait
    (0s would give up before the first query or wait began)."""
    seconds = exact_duration(text)
    if not 0 < seconds <= MAX_TIMEOUT:
        raise InputError(f"a timeout must be more than 0s and at most a day (86400s), got {quoted(text)}")
    return float(seconds)


# A whole-number option past 64 bits is refused by click, naming the option: the API would name
# its parameter (``num_ranks must fit in 64 bits``), which the user never typed.
WHOLE_MAX = 2**63 - 1


class Whole(click.IntRange):
    """A whole number from ``min`` to ``max``, written in ASCII digits (``int()`` would also take
    ``1_6``, ``+4`` and ``٨``, which no other option does; a minus sign is read, for the range's
    own refusal), up to 64 bits.  Without ``max`` its help shows the lower bound only: the cap is
    a guard, not a limit anyone means, and the option's real limit (2048 GPUs) is the command's to
    say, in its help text and its error."""

    name = "integer"  # "'x' is not a valid integer", not "... integer range"

    def __init__(self, min: int | None = None, max: int | None = None) -> None:
        super().__init__(min=min, max=WHOLE_MAX if max is None else max)
        self.guard_only = max is None

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not _WHOLE_TEXT.fullmatch(value):
            self.fail(f"{quoted(value)} is not a valid integer.", param, ctx)  # click's words
        number = click.INT.convert(value, param, ctx)
        if number > WHOLE_MAX:
            self.fail(f"{number} does not fit in 64 bits", param, ctx)
        return super().convert(number, param, ctx)

    def _describe_range(self) -> str:  # the help's [x>=2], and a refusal's "not in the range x>=2"
        if not self.guard_only:
            return super()._describe_range()
        return "" if self.min is None else f"x>={self.min}"


_WHOLE_TEXT = re.compile(r"\s*-?[0-9]+\s*", re.ASCII)


class Real(click.FloatRange):
    """A real number in a range, written as decimals with an optional exponent (``0.001``,
    ``1e-3``): ``float()`` would also take ``1_0e-3`` and Arabic-Indic digits, which no other option
    does."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not _REAL_TEXT.fullmatch(value):
            self.fail(f"{quoted(value)} is not a valid float.", param, ctx)  # click's words
        return super().convert(value, param, ctx)


# nan and inf are read, for the range's own refusal ("inf is not in the range 0<x<1")
_REAL_TEXT = re.compile(r"\s*-?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|nan|inf)\s*", re.ASCII | re.I)


WHOLE = Whole()
SIZE = Quantity("size", parse_size)
DURATION = Quantity("duration", parse_duration)
TIMEOUT = Quantity("duration", _timeout)
BANDWIDTH = Quantity("bandwidth", parse_bandwidth)


class ChunkCount(click.ParamType):  # type: ignore[type-arg, unused-ignore]
    """``--chunks``: a whole number of chunks, or ``auto`` (the cost model's choice)."""

    name = "chunk count"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip().lower()
        if text == AUTO:
            return AUTO
        if not (text.isascii() and text.isdigit()):  # not '²': int() would refuse it
            self.fail(f"expected a whole number of chunks or auto, got {quoted(value)}", param, ctx)
        digits = text.lstrip("0")
        if len(digits) > 18:  # int() refuses 4301 digits, and a count this long is no count
            self.fail(
                f"a number of {len(digits)} digits is more than the {MAX_CHUNKS} chunks stragglar handles",
                param,
                ctx,
            )
        if not digits:
            self.fail(f"expected a whole number of chunks or auto, got {quoted(value)}", param, ctx)
        return int(digits)


def network_words(network: Network) -> str:
    """``alpha 3 us, 450 GiB/s``: a network as the options spell it."""
    return f"alpha {format_seconds(network.alpha)}, {format_bytes(network.bandwidth)}/s"


def chunks_option(auto: str) -> Callable[[_F], _F]:
    """``--chunks C|auto``; ``auto`` says where this command's cost model gets its setting."""
    return click.option(
        "--chunks",
        type=ChunkCount(),
        metavar="C|auto",
        help=f"StragglAR's chunk count, at least N-1 (default N-1, the paper's); auto: {auto}.",
    )


CHUNKS = chunks_option("the one the cost model prices fastest at --size, --delay, --alpha and --bandwidth")
MEASURED_CHUNKS = (
    f"the one the cost model prices fastest at the size and delay on the paper's network "
    f"({network_words(PAPER_NETWORK)}), with --link-rate R and --alpha A on links of bandwidth R "
    "and latency A; timed beside the paper's C = N-1 and the baseline, in the same iterations"
)


def auto_note(num_chunks: int, size: float, delay: float, network: Network, more: str = "") -> str:
    """What ``--chunks auto`` chose, and for which setting: a line for stderr."""
    return (
        f"--chunks auto: C = {num_chunks}, the cost model's fastest for {format_bytes(size)} with the "
        f"straggler {format_seconds(delay)} late ({network_words(network)}){more}"
    )


def model_options(when: str = "") -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``--size``, ``--delay``, ``--alpha``, ``--bandwidth``: the setting the cost model prices;
    ``when`` starts each help where they apply only then (``synth``: with ``--chunks auto``), so
    that a default shown is not read as a setting the command always uses."""
    options = (  # name, type, default, help
        ("--size", SIZE, "1GiB", "buffer size per GPU (a size)."),
        ("--delay", DURATION, "0ms", "how late the straggler is."),
        ("--alpha", DURATION, "3us", "latency of one round."),
        ("--bandwidth", BANDWIDTH, "450GiB/s", "bandwidth of a link."),
    )

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        for name, kind, default, words in reversed(options):
            text = f"{when}{words}" if when else words[0].upper() + words[1:]
            command = click.option(name, type=kind, default=default, show_default=True, help=text)(command)
        return command

    return decorate


def chosen_chunks(
    chunks: int | str | None,
    num_gpus: int,
    size: float,
    delay: float,
    network: Network,
    *,
    algorithm: str = "stragglar",
) -> int | None:
    """``--chunks`` as a count (None: the paper's N-1), read as the model reads every chunk option
    (:func:`~stragglar.model.chunks.resolve_chunks`), with a spinner while ``auto`` prices.

    A count for an algorithm without chunk choice is an error, not ignored; so is ``auto`` with
    settings it does not use (callers refuse those).
    """
    refuse_chunks_for(algorithm, chunks)
    with busy(f"choosing a chunk count for {num_gpus} GPUs"):
        return resolve_chunks(chunks, num_gpus, size, delay, network)


def refuse_chunks_for(algorithm: str, chunks: int | str | None) -> None:
    """``--chunks`` (a count or ``auto``) for an algorithm without chunk choice: an error, not ignored."""
    if chunks is not None and algorithm != "stragglar":
        raise click.UsageError(f"--chunks does not apply: it shapes StragglAR, not {algorithm}")


def chunks_by_price(num_gpus: int, size: float, delay: float, network: Network) -> list[int]:
    """The power-of-two chunk counts ``--chunks auto`` weighs for an executor's file, the cost
    model's fastest first and the fewest chunks among equals
    (:func:`~stragglar.model.chunks.ranked_chunks`), so that the first is its pick
    (``resolve_chunks(AUTO, ..., power_of_two=True)``).  The command tries them in this order
    until the format takes one, and names those it refused."""
    with busy(f"choosing a chunk count for {num_gpus} GPUs"):
        late = max(delay, 0.0)  # as resolve_chunks reads it: a rank early prices as none
        return ranked_chunks(num_gpus, size, late, network, power_of_two=True)


GPUS = click.option(
    "--gpus",
    "-n",
    "num_gpus",
    type=WHOLE,
    required=True,
    metavar="N",
    help=f"Number of GPUs, 2 to {MAX_RANKS}.",
)
STRAGGLER = click.option("--straggler", type=WHOLE, metavar="R", help="The straggler's rank (default N-1).")
ALGORITHM = click.option(
    "--algorithm", "-a", type=click.Choice(ALGORITHMS), default="stragglar", show_default=True
)
VERBOSE = click.option("-v", "--verbose", is_flag=True, help="Also print what each proof covers.")


class FileName(click.Path):
    """A file's name, where an empty one is an error: as a path it would be the current folder
    (``Path("")`` is ``.``), and an unset ``$TRACE`` in a script would read whatever is there.
    ``advice`` ends the refusal; the rest is click's ``Path``'s."""

    def __init__(self, advice: str, **kwargs: Any) -> None:
        super().__init__(path_type=Path, **kwargs)
        self.advice = advice

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "":
            self.fail(f"an empty file name: {self.advice}", param, ctx)
        return super().convert(value, param, ctx)


OUTPUT = FileName("name a file, or - for standard output", dir_okay=False, allow_dash=True)  # -: stdout
INPUT = FileName("name a file")  # a file or a folder
PLOT = click.option(
    "--plot",
    "plot_file",
    type=OUTPUT,
    help="Also draw a chart into this file (.png, .svg or .pdf; needs matplotlib).",
)


def artifact_options(command: Callable[..., None]) -> Callable[..., None]:
    """The export options of ``synth`` and ``export``: MSCCL XML (``msccl``) and MSCCL++ (``mscclpp``).

    Each is a field of :class:`~stragglar.artifacts.ExportOptions` of the same name, so that the
    command's keyword arguments are the options (``ExportOptions(**artifact)``)."""
    defaults = ExportOptions()
    options = [
        click.option(
            "--proto",
            type=click.Choice(PROTOCOLS),
            default=defaults.proto,
            show_default=True,
            help="MSCCL XML.",
        ),
        click.option(
            "--instances",
            type=Whole(1),
            default=defaults.instances,
            show_default=True,
            help="Copies per loop.",
        ),
        click.option("--min-bytes", type=SIZE, help="Smallest message the executor uses it for (a size)."),
        click.option(
            "--max-bytes",
            type=SIZE,
            help="Largest message (a size; default: MSCCL XML 1TiB, or 1GiB for a file with scratch, "
            "MSCCL++ the largest its 32-bit chunk offsets fit).",
        ),
        click.option("--name", help="The algo's or plan's name (default: from the schedule)."),
        click.option(
            "--max-threadblocks",
            type=Whole(1),
            default=defaults.max_threadblocks,
            show_default=True,
            help="MSCCL++: thread blocks one GPU runs at once (A100: 108, H100 SXM: 132).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def refuse_other_formats(fmt: str) -> None:
    """Refuse the export options that do not shape the output format ``fmt`` (a JSON schedule and
    text take none), in the order ``--help`` lists them."""
    own = FORMATS[fmt].options if fmt in FORMATS else frozenset()
    export = {option.name for option in dataclasses.fields(ExportOptions)}
    for param in click.get_current_context().command.params:
        if param.name in export and param.name not in own:
            shaped = " and ".join(f.title for f in FORMATS.values() if param.name in f.options)
            refuse_given([param.name], f"it shapes {shaped} output only")


def given(name: str) -> bool:
    """Whether the user set option ``name`` of the current command (rather than its default)."""
    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)


def refuse_given(names: Iterable[str], why: str) -> None:
    """An option that does not apply is an error, not silently ignored: name it and say why."""
    ctx = click.get_current_context()
    for name in names:
        if given(name):
            option = next(p for p in ctx.command.params if p.name == name)
            flag = max(option.opts, key=len)
            raise click.UsageError(f"{flag} does not apply: {why}")
