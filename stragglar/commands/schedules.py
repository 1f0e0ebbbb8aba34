"""``synth``, ``export``, ``verify``, ``show``: make, prove, save and look at schedules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from stragglar.commands.common import (
    ALGORITHM,
    DURATION,
    GPUS,
    MSCCL_OPTIONS,
    PLOT,
    STRAGGLER,
    VERBOSE,
    busy,
    check_output,
    check_plot,
    export_xml,
    load_schedule,
    msccl_options,
    proved,
    proved_xml,
    read_input,
    refuse_given,
    write,
    write_plot,
)
from stragglar.errors import InputError
from stragglar.formats import json as json_format
from stragglar.formats.text import render
from stragglar.msccl import describe_msccl
from stragglar.schedule import Schedule
from stragglar.synth import METHODS, synthesize
from stragglar.verify import Proof, prove
from stragglar.verify.smt import smt_prove

__all__ = ["export", "show", "synth", "verify"]

FORMATS = ("json", "text", "msccl")
SUFFIXES = {".json": "json", ".txt": "text", ".xml": "msccl"}


def output_format(output: Path | None, fmt: str | None, default: str, allowed: tuple[str, ...]) -> str:
    """The output format: ``--format`` if given, else from the file's suffix, else ``default``.

    A ``--format`` that contradicts a known suffix is an error, and so is a file whose suffix says
    nothing without ``--format``: a silent choice would write what the user did not ask for.
    """
    implied = SUFFIXES.get(output.suffix.lower()) if output is not None else None
    if fmt is not None and output is not None and implied is not None and fmt != implied:
        raise click.UsageError(
            f"--format {fmt} contradicts {output} (a {output.suffix} name means {implied})"
        )
    chosen = fmt or implied
    if chosen is None and output is not None:
        known = ", ".join(s for s, f in SUFFIXES.items() if f in allowed)
        raise click.UsageError(f"cannot tell the format of {output}: name it {known}, or give --format")
    chosen = chosen or default
    if chosen not in allowed:
        raise click.UsageError(f"this command writes {', '.join(allowed)}, not {chosen}")
    return chosen


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
    "--timeout", type=DURATION, help="With --method smt: give up on z3 after this long (a duration)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="Default: from -o's suffix (.json, .xml, .txt), else text.",
)
@msccl_options
@VERBOSE
def synth(
    num_gpus: int,
    straggler: int | None,
    algorithm: str,
    output: Path | None,
    fmt: str | None,
    method: str,
    timeout: float | None,
    verbose: bool,
    **msccl: Any,
) -> None:
    """Generate a schedule, prove it, print or save it.

    Without -o: the round-by-round table and a summary line.  With -o: the file (JSON, or MSCCL
    XML for a .xml name, itself proved from its text), and the summary on stdout.  A JSON or XML
    document without -o goes to stdout, the summary to stderr.
    """
    fmt = output_format(output, fmt, "text", FORMATS)
    if fmt != "msccl":
        refuse_given(MSCCL_OPTIONS, "it shapes MSCCL XML output only (-o x.xml or --format msccl)")
    if method != "smt":
        refuse_given(["timeout"], "it bounds --method smt only")
    with busy(f"synthesizing {algorithm} for {num_gpus} GPUs"):
        schedule = synthesize(algorithm, num_gpus, straggler, method=method, timeout_s=timeout)
    proof = proved(schedule, f"the {algorithm} schedule")
    summary = proof.headline
    details = [proof.summary]
    if fmt == "msccl":
        body, xml_proof = export_xml(proof, msccl)
        summary += f"; MSCCL XML proved: {xml_proof.brief}"
        details += [xml_proof.summary, xml_proof.details]
    else:
        body = json_format.dumps(proof.schedule) if fmt == "json" else f"{render(proof.schedule)}\n{summary}"
    to_stderr = output is None and fmt != "text"
    if output is not None:
        write(output, body)
    else:
        click.echo(body.rstrip("\n"))
    if output is not None or fmt != "text":
        click.echo(summary, err=to_stderr)
    if verbose:
        click.echo("\n".join(details), err=to_stderr)


@click.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="The file to write.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(("json", "msccl")),
    help="Default: from -o's suffix (.json, .xml), else msccl.",
)
@msccl_options
@VERBOSE
def export(file: Path, output: Path | None, fmt: str | None, verbose: bool, **msccl: Any) -> None:
    """Prove the JSON schedule FILE and write it as MSCCL XML (proved again from its text) or JSON.

    Writes OUTPUT (stdout without -o) and prints the proof summary (stderr without -o).  OUTPUT
    must not be FILE.
    """
    fmt = output_format(output, fmt, "msccl", ("json", "msccl"))
    if output is not None:
        check_output(output, file)
    if fmt != "msccl":
        refuse_given(MSCCL_OPTIONS, "it shapes MSCCL XML output only")
    proof = proved(load_schedule(file, "export"), str(file))
    if fmt == "msccl":
        text, xml_proof = export_xml(proof, msccl)
        summary, details = xml_proof.summary, f"{xml_proof.details}\n{proof.summary}"
    else:
        text, summary, details = json_format.dumps(proof.schedule), proof.headline, proof.summary
    if output is None:
        click.echo(text.rstrip("\n"))
    else:
        write(output, text.rstrip("\n"))
    click.echo(summary if output is None else f"{output}: {summary}", err=output is None)
    if verbose:
        click.echo(details, err=output is None)


@click.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--smt", is_flag=True, help="Prove a JSON schedule with z3 instead of the simulator.")
@VERBOSE
def verify(file: Path, smt: bool, verbose: bool) -> None:
    """Prove FILE (a JSON schedule or an MSCCL XML file, told apart by content) correct, or name its
    first violation.

    Exit 0 with a one-line proof summary, 1 if FILE is not a correct AllReduce, 2 if it is not a
    valid file of either kind.  An XML file is proved as the MSCCL executor runs it: thread
    blocks, FIFO connections, dependencies.
    """
    kind, text = read_input(file)
    if kind == "xml":
        refuse_given(["smt"], f"{file} is MSCCL XML; --smt proves JSON schedules")
        xml_proof = proved_xml(text, str(file))
        click.echo(f"{file}: {xml_proof.summary}")
        if verbose:
            click.echo(xml_proof.details)
        return
    proof = proved(_loaded(text, file), str(file), smt_prove if smt else prove)
    click.echo(f"{file}: {proof.summary}")
    if verbose:
        click.echo(proof.headline)


@click.command()
@click.argument("file", type=click.Path(path_type=Path))
@PLOT
@VERBOSE
def show(file: Path, plot_file: Path | None, verbose: bool) -> None:
    """Print FILE as a table with its summary: a JSON schedule round by round, an MSCCL XML file
    GPU by GPU.

    The summary says whether FILE was proved; exit 1 if it is not a correct AllReduce.  With
    --plot (JSON schedules), also draw the schedule as a rank x round chart.
    """
    kind, text = read_input(file)
    if kind == "xml":
        refuse_given(["plot_file"], f"{file} is MSCCL XML; --plot draws JSON schedules")
        xml_proof = proved_xml(text, str(file))
        click.echo(describe_msccl(text))
        click.echo(xml_proof.summary)
        if verbose:
            click.echo(xml_proof.details)
        return
    check_plot(plot_file, file)
    schedule = _loaded(text, file)
    click.echo(render(schedule))  # first: a wrong schedule's table helps to see what is wrong
    proof: Proof = proved(schedule, str(file))
    click.echo(proof.headline)
    if verbose:
        click.echo(proof.summary)
    if plot_file is not None:
        write_plot(plot_file, lambda plot: plot.schedule_figure(schedule))


def _loaded(text: str, file: Path) -> Schedule:
    try:
        return json_format.loads(text)
    except InputError as e:
        raise InputError(f"{file}: {e}") from None
