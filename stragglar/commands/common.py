"""What several commands share: options, parsing with units, proving with a name, writing files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from stragglar.errors import IncorrectError, InputError, StragglarError
from stragglar.files import write_text
from stragglar.msccl import DEFAULT_MAX_BYTES, PROTOCOLS, MscclProof, prove_msccl, to_msccl_xml
from stragglar.schedule import Schedule
from stragglar.synth import ALGORITHMS
from stragglar.verify import Proof, VerificationError, prove

__all__ = [
    "ALGORITHM",
    "GPUS",
    "PLOT",
    "STRAGGLER",
    "draw",
    "export_xml",
    "items",
    "msccl_options",
    "option_value",
    "proved",
    "proved_xml",
    "read_text",
    "write",
]

_T = TypeVar("_T")

GPUS = click.option(
    "--gpus", "-n", "num_gpus", type=int, required=True, metavar="N", help="Number of GPUs, >= 2."
)
STRAGGLER = click.option("--straggler", type=int, metavar="R", help="The straggler's rank (default N-1).")
ALGORITHM = click.option(
    "--algorithm", "-a", type=click.Choice(ALGORITHMS), default="stragglar", show_default=True
)
PLOT = click.option(
    "--plot",
    "plot_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also draw a chart into this PNG (needs matplotlib).",
)


def msccl_options(command: Callable[..., None]) -> Callable[..., None]:
    """The MSCCL XML export options, shared by ``synth`` and ``export``."""
    options = [
        click.option("--proto", type=click.Choice(PROTOCOLS), default="Simple", show_default=True),
        click.option(
            "--instances", type=click.IntRange(min=1), default=1, show_default=True, help="Copies per loop."
        ),
        click.option("--min-bytes", type=click.IntRange(min=0), default=0, show_default=True),
        click.option("--max-bytes", type=click.IntRange(min=0), default=DEFAULT_MAX_BYTES, show_default=True),
        click.option("--name", "xml_name", help="The algo's name (default: from the schedule)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def option_value(parse: Callable[[str], _T], text: str, option: str) -> _T:
    """``parse(text)``, a parse error being an error of ``option``."""
    try:
        return parse(text)
    except InputError as e:
        raise click.BadParameter(str(e), param_hint=option) from None


def items(text: str, option: str) -> list[str]:
    """The comma-separated items of ``text``; an empty one is an error of ``option``."""
    found = [x.strip() for x in text.split(",")]
    if not all(found):
        raise click.BadParameter(f"expected a comma-separated list, got {text!r}", param_hint=option)
    return found


def proved(schedule: Schedule, name: str, prover: Callable[[Schedule], Proof] = prove) -> Proof:
    """The proof of ``schedule``; if it is wrong, an error naming it (``name``) and its first violation."""
    try:
        return prover(schedule)
    except VerificationError as e:
        raise IncorrectError(f"{name} is not a correct AllReduce: {e.violation.message}") from None


def proved_xml(text: str, name: str) -> MscclProof:
    """The proof of the MSCCL XML ``text``, or an error naming it (``name``) and the first problem."""
    try:
        return prove_msccl(text)
    except StragglarError as e:
        kind = InputError if e.exit_code == InputError.exit_code else IncorrectError
        raise kind(f"{name} is not a correct AllReduce: {e}") from None


def export_xml(proof: Proof, options: dict[str, Any]) -> tuple[str, MscclProof]:
    """The MSCCL XML of the proved schedule (``options`` from :func:`msccl_options`), proved from its text."""
    text = to_msccl_xml(
        proof,
        name=options["xml_name"],
        proto=options["proto"],
        instances=options["instances"],
        min_bytes=options["min_bytes"],
        max_bytes=options["max_bytes"],
    )
    return text, proved_xml(text, "the exported XML")


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise click.UsageError(f"file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise click.UsageError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def write(path: Path, text: str) -> None:
    """Write ``text`` and a newline to ``path`` (atomically); a failure is an error of ``-o``."""
    try:
        write_text(path, text + "\n")
    except OSError as e:
        raise click.BadParameter(f"cannot write {path}: {e.strerror or e}", param_hint="'-o'") from None


def draw(path: Path, figure: Callable[[Any], Any]) -> None:
    """Draw with :mod:`stragglar.plot` (imported here: matplotlib is optional) and save to ``path``."""
    from stragglar import plot

    try:
        plot.save(figure(plot), path)
    except plot.PlotUnavailable as e:
        raise click.UsageError(str(e)) from None
    except OSError as e:
        raise click.BadParameter(f"cannot write {path}: {e.strerror or e}", param_hint="'--plot'") from None
    click.echo(f"plot written to {path}")
