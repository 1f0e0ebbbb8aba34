"""What several commands share: options with units, input kinds, outputs, proofs with a name."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from stragglar.args import MAX_TIMEOUT
from stragglar.artifacts import FORMATS, PROTOCOLS, ArtifactFormat, ExportOptions, format_of
from stragglar.commands.terminal import busy, echo
from stragglar.errors import (
    IncorrectError,
    InputError,
    ResourceError,
    StragglarError,
    quoted,
    ran_out,
    shown,
)
from stragglar.files import check_replaceable, own_descriptor, read_text, same_file, write_bytes, write_text
from stragglar.formats import schedule_json
from stragglar.model import AUTO, PAPER_NETWORK, Network, resolve_chunks
from stragglar.schedule import MAX_CHUNKS, Schedule
from stragglar.synth import ALGORITHMS
from stragglar.units import format_bytes, format_seconds, parse_bandwidth, parse_duration, parse_size
from stragglar.verify import Proof, VerificationError, prove
from stragglar.verify.report import ArtifactProof

__all__ = [
    "ALGORITHM",
    "BANDWIDTH",
    "CHUNKS",
    "DURATION",
    "GPUS",
    "MEASURED_CHUNKS",
    "OUTPUT",
    "PLOT",
    "SIZE",
    "STRAGGLER",
    "TIMEOUT",
    "VERBOSE",
    "Quantity",
    "artifact_error",
    "artifact_options",
    "auto_note",
    "check_output",
    "check_plot",
    "chosen_chunks",
    "chunks_option",
    "export_artifact",
    "given",
    "load_schedule",
    "model_options",
    "network_words",
    "proved",
    "proved_artifact",
    "read_artifact",
    "read_input",
    "refuse_given",
    "refuse_other_formats",
    "to_stdout",
    "write",
    "write_plot",
]

_D = TypeVar("_D")
_F = TypeVar("_F", bound=Callable[..., Any])


class Quantity(click.ParamType):  # type: ignore[type-arg, unused-ignore]
    """An option with a unit, read by :mod:`stragglar.units`; ``many`` reads a comma-separated list."""

    def __init__(self, name: str, parse: Callable[[str], Any], many: bool = False) -> None:
        self.name = f"{name}s" if many else name
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
            return [self.parse(x) for x in items]
        except InputError as e:
            self.fail(str(e), param, ctx)


def _timeout(text: str) -> float:
    """A --timeout: a duration that is more than nothing and at most a day, the API's bound on a wait
    (0s would give up before the first query or wait began)."""
    seconds = parse_duration(text)
    if not 0 < seconds <= MAX_TIMEOUT:
        raise InputError(f"a timeout must be more than 0s and at most a day (86400s), got {quoted(text)}")
    return seconds


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
    f"({network_words(PAPER_NETWORK)}), with --link-rate R on links of bandwidth R; timed beside "
    "the paper's C = N-1 and the baseline, in the same iterations"
)


def auto_note(num_chunks: int, size: float, delay: float, network: Network, more: str = "") -> str:
    """What ``--chunks auto`` chose, and for which setting: a line for stderr."""
    return (
        f"--chunks auto: C = {num_chunks}, the cost model's fastest for {format_bytes(size)} with the "
        f"straggler {format_seconds(delay)} late ({network_words(network)}){more}"
    )


def model_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--size``, ``--delay``, ``--alpha``, ``--bandwidth``: the setting the cost model prices."""
    options = [
        click.option(
            "--size", type=SIZE, default="1GiB", show_default=True, help="Buffer size per GPU (a size)."
        ),
        click.option(
            "--delay", type=DURATION, default="0ms", show_default=True, help="How late the straggler is."
        ),
        click.option(
            "--alpha", type=DURATION, default="3us", show_default=True, help="Latency of one round."
        ),
        click.option(
            "--bandwidth", type=BANDWIDTH, default="450GiB/s", show_default=True, help="Bandwidth of a link."
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def chosen_chunks(
    chunks: int | str | None,
    num_gpus: int,
    size: float,
    delay: float,
    network: Network,
    *,
    algorithm: str = "stragglar",
    power_of_two: bool = False,
    max_chunks: int | None = None,
) -> int | None:
    """``--chunks`` as a count (None: the paper's N-1), read as the model reads every chunk option
    (:func:`~stragglar.model.chunks.resolve_chunks`), with a spinner while ``auto`` prices.

    A count for an algorithm without chunk choice is an error, not ignored; so is ``auto`` with
    settings it does not use (callers refuse those).
    """
    if chunks is not None and algorithm != "stragglar":
        raise click.UsageError(f"--chunks does not apply: it shapes StragglAR, not {algorithm}")
    with busy(f"choosing a chunk count for {num_gpus} GPUs"):
        return resolve_chunks(
            chunks, num_gpus, size, delay, network, power_of_two=power_of_two, max_chunks=max_chunks
        )


GPUS = click.option(
    "--gpus", "-n", "num_gpus", type=int, required=True, metavar="N", help="Number of GPUs, >= 2."
)
STRAGGLER = click.option("--straggler", type=int, metavar="R", help="The straggler's rank (default N-1).")
ALGORITHM = click.option(
    "--algorithm", "-a", type=click.Choice(ALGORITHMS), default="stragglar", show_default=True
)
VERBOSE = click.option("-v", "--verbose", is_flag=True, help="Also print what each proof covers.")


class OutputPath(click.Path):
    """An output file's name: ``-`` is standard output; an empty name is an error (as a path it
    would be the current folder)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, allow_dash=True, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "":
            self.fail("an empty file name: name a file, or - for standard output", param, ctx)
        return super().convert(value, param, ctx)


OUTPUT = OutputPath()
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
            type=click.IntRange(min=1),
            default=defaults.instances,
            show_default=True,
            help="Copies per loop.",
        ),
        click.option("--min-bytes", type=SIZE, help="Smallest message the executor uses it for (a size)."),
        click.option("--max-bytes", type=SIZE, help="Largest message (a size; MSCCL XML default 1TiB)."),
        click.option("--name", help="The algo's or plan's name (default: from the schedule)."),
        click.option(
            "--max-threadblocks",
            type=click.IntRange(min=1),
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


@dataclass(frozen=True)
class Exported:
    """An artifact's text and what its own prover proved of it."""

    text: str
    proof: ArtifactProof


def export_artifact(proof: Proof, fmt: ArtifactFormat[Any], options: ExportOptions) -> Exported:
    """Lower the proved schedule to ``fmt`` and prove the text itself."""
    with busy(f"exporting {proof.num_ranks} GPUs to {fmt.title}"):
        text = fmt.lower(proof, options)
    return Exported(text, proved_artifact(fmt, text, fmt.exported_name))


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


@dataclass(frozen=True)
class Input:
    """An input file, told apart by content, not by name: a file of an artifact ``format``
    (MSCCL XML, an MSCCL++ execution plan) or, where ``format`` is None, our JSON ``schedule``."""

    path: Path
    format: ArtifactFormat[Any] | None
    text: str
    schedule: Schedule | None  # for a schedule


def read_input(path: Path) -> Input:
    """Read and classify an input file; a malformed one is an error naming the file.

    The text is parsed as JSON at most once, when a format's recogniser asks for it or, for a
    schedule, to read it.  An empty file is called empty, whatever its name says."""
    with busy(f"reading {shown(path)}"):
        text = read_text(path)
        if not text.strip():
            raise InputError(f"{path} is empty: no schedule, MSCCL XML or MSCCL++ plan in it")
        document = functools.cache(lambda: schedule_json.parse(text))
        try:
            fmt = format_of(text, document)
            if fmt is not None:
                return Input(path, fmt, text, None)
            return Input(path, None, text, schedule_json.from_document(document()))
        except schedule_json.ScheduleFormatError as e:
            raise schedule_json.ScheduleFormatError(f"{path}: {e}") from None


def load_schedule(path: Path, command: str) -> Schedule:
    """The JSON schedule in ``path``; another kind of file is an error that says what ``command`` takes."""
    found = read_input(path)
    if found.format is not None:
        raise InputError(
            f"{path} is {found.format.title_with_article}: {command} takes a JSON schedule "
            "(see stragglar synth -o s.json)"
        )
    assert found.schedule is not None
    return found.schedule


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
        if output.is_dir():
            raise InputError(f"{shown(output)} is a directory")
        check_replaceable(output)
        folder = output.parent.resolve()
        if not folder.is_dir():
            why = f"{shown(output)}: folder {shown(output.parent)} does not exist"
        elif not os.access(folder, os.W_OK | os.X_OK) or not _takes_a_file(folder):
            why = f"{shown(output)}: cannot write in {shown(output.parent)}"
        else:
            return
    except OSError as e:  # a name too long, a folder that cannot be searched
        why = f"{shown(output)}: {e.strerror or e}"
    raise click.BadParameter(why, param_hint=f"'{option}'")


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
    echo(f"plot written to {path}")


def proved(schedule: Schedule, name: str, prover: Callable[[Schedule], Proof] = prove) -> Proof:
    """The proof of ``schedule``; if it is wrong, an error naming it (``name``) and its first violation."""
    try:
        with busy(f"proving {name}"):
            return prover(schedule)
    except VerificationError as e:
        raise IncorrectError(f"{name} is not a correct AllReduce: {e.violation.message}") from None


def proved_artifact(fmt: ArtifactFormat[_D], source: str | _D, name: str) -> ArtifactProof:
    """The proof of an artifact of ``fmt``, its text or what ``fmt.read`` made of it, or an error
    naming it (``name``) and the first problem (:func:`artifact_error`)."""
    try:
        with busy(f"proving {name}"):
            return fmt.prove(source)
    except StragglarError as e:
        raise artifact_error(fmt, name, e) from None


def read_artifact(fmt: ArtifactFormat[_D], text: str, name: str) -> _D:
    """The artifact ``text`` read by ``fmt``, for its prover, description and size rule to share,
    or the error that proving the text would give."""
    try:
        return fmt.read(text)
    except StragglarError as e:
        raise artifact_error(fmt, name, e) from None


def artifact_error(fmt: ArtifactFormat[Any], name: str, error: StragglarError) -> StragglarError:
    """The command's one-line error for what ``fmt``'s reader or prover raised about ``name``: a
    file it cannot read is bad input (exit 2), any other failure a wrong artifact (exit 1)."""
    if error.exit_code == InputError.exit_code:
        return InputError(f"{name} {fmt.unreadable}: {error}")
    return IncorrectError(f"{name} is not a correct AllReduce: {error}")


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


def _cannot_write(path: Path, option: str, error: OSError) -> Exception:
    """A failed write: a full disk (or quota) is a resource that ran out (exit 3), anything else
    a bad ``option`` (exit 2, a read-only folder, say)."""
    why = f"cannot write {shown(path)}: {error.strerror or error}"
    return ResourceError(why) if ran_out(error) else click.BadParameter(why, param_hint=f"'{option}'")


def dump_json(path: Path, document: object) -> None:
    """Write a JSON document of results to ``path`` (atomically), the file of ``--json``."""
    write(path, json.dumps(document, indent=2), "--json")
