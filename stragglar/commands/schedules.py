"""``synth``, ``export``, ``verify``, ``show``: make, prove, save and look at schedules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from stragglar.commands.common import (
    ALGORITHM,
    GPUS,
    PLOT,
    STRAGGLER,
    draw,
    export_xml,
    msccl_options,
    proved,
    proved_xml,
    read_text,
    write,
)
from stragglar.formats import json as json_format
from stragglar.formats.text import render
from stragglar.synth import METHODS, synthesize
from stragglar.verify import prove
from stragglar.verify.smt import smt_prove

__all__ = ["export", "show", "synth", "verify"]

FORMATS = ("json", "text", "msccl")


@click.command()
@GPUS
@STRAGGLER
@ALGORITHM
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the schedule to FILE."
)
@click.option(
    "--method",
    type=click.Choice(METHODS),
    default="construct",
    show_default=True,
    help="smt: let z3 find a round-optimal StragglAR schedule (small N only).",
)
@click.option(
    "--format", "fmt", type=click.Choice(FORMATS), help="Default: from -o's suffix (.xml: msccl), else text."
)
@msccl_options
def synth(
    num_gpus: int,
    straggler: int | None,
    algorithm: str,
    output: Path | None,
    fmt: str | None,
    method: str,
    **msccl: Any,
) -> None:
    """Generate a schedule, prove it, print or save it.

    Without -o: the round-by-round table and a summary line.  With -o: the file (JSON, or MSCCL
    XML for a .xml name, itself proved from its text), and the summary on stdout.  A JSON or XML
    document without -o goes to stdout, the summary to stderr.
    """
    proof = proved(synthesize(algorithm, num_gpus, straggler, method=method), f"the {algorithm} schedule")
    summary = proof.headline
    fmt = fmt or _format_of(output)
    if fmt == "msccl":
        body, xml_proof = export_xml(proof, msccl)
        summary += f"; exported MSCCL XML {xml_proof.summary}"
    else:
        body = json_format.dumps(proof.schedule) if fmt == "json" else f"{render(proof.schedule)}\n{summary}"
    if output is not None:
        write(output, body)
        click.echo(summary)
    else:
        click.echo(body.rstrip("\n"))
        if fmt != "text":
            click.echo(summary, err=True)


def _format_of(output: Path | None) -> str:
    if output is None:
        return "text"
    return "msccl" if output.suffix.lower() == ".xml" else "json"


@click.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="The XML file to write."
)
@msccl_options
def export(file: Path, output: Path | None, **msccl: Any) -> None:
    """Lower the JSON schedule FILE to MSCCL XML and prove the XML itself.

    Writes OUTPUT (stdout without -o) and prints the proof summary (stderr without -o).
    """
    text, proof = export_xml(proved(json_format.read(file), str(file)), msccl)
    if output is None:
        click.echo(text.rstrip("\n"))
        click.echo(proof.summary, err=True)
    else:
        write(output, text.rstrip("\n"))
        click.echo(f"{output}: {proof.summary}")


@click.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--smt", is_flag=True, help="Prove a JSON schedule with z3 instead of the simulator.")
def verify(file: Path, smt: bool) -> None:
    """Prove FILE (a JSON schedule, or MSCCL XML if it ends in .xml) correct, or name its first violation.

    Exit 0 with a one-line proof summary, 1 if FILE is not a correct AllReduce.  An XML file is
    proved as the MSCCL executor runs it: thread blocks, FIFO connections, dependencies.
    """
    if file.suffix.lower() == ".xml":
        summary = proved_xml(read_text(file), str(file)).summary
    else:
        summary = proved(json_format.read(file), str(file), smt_prove if smt else prove).summary
    click.echo(f"{file}: {summary}")


@click.command()
@click.argument("file", type=click.Path(path_type=Path))
@PLOT
def show(file: Path, plot_file: Path | None) -> None:
    """Print FILE as a round-by-round table with its summary.

    The summary says whether FILE was proved; exit 1 if it is not a correct AllReduce.  With
    --plot, also draw the schedule as a rank x round chart (who sends which chunk to whom).
    """
    schedule = json_format.read(file)
    click.echo(render(schedule))
    click.echo(proved(schedule, str(file)).headline)
    if plot_file is not None:
        draw(plot_file, lambda plot: plot.schedule_figure(schedule))
