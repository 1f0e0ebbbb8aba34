"""``synth``, ``export``, ``verify``, ``show``: make, prove, save and look at schedules and artifacts."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from stragglar.artifacts import FORMATS, ArtifactFormat, ExportOptions
from stragglar.commands.inputs import load_schedule, read_input
from stragglar.commands.options import (
    ALGORITHM,
    CHUNKS,
    GPUS,
    INPUT,
    OUTPUT,
    PLOT,
    SIZE,
    STRAGGLER,
    TIMEOUT,
    VERBOSE,
    artifact_options,
    auto_note,
    chosen_chunks,
    chunks_by_price,
    model_options,
    refuse_chunks_for,
    refuse_given,
    refuse_other_formats,
)
from stragglar.commands.outputs import check_output, check_plot, schedule_text, to_stdout, write, write_plot
from stragglar.commands.proofs import (
    export_artifact,
    lowered_artifact,
    proved,
    proved_artifact,
    proved_export,
    read_artifact,
)
from stragglar.commands.terminal import busy, echo
from stragglar.errors import IncorrectError, InputError, StragglarError, shown
from stragglar.formats.schedule_json import Header
from stragglar.formats.text import render
from stragglar.model import AUTO, Network
from stragglar.schedule import Schedule
from stragglar.synth import METHODS, Request, check_ranks, check_request, generate
from stragglar.units import count_of, format_bytes
from stragglar.verify import Proof, prove
from stragglar.verify.orders import order_disagreement
from stragglar.verify.report import ArtifactProof
from stragglar.verify.smt import smt_prove

__all__ = ["export", "show", "synth", "verify"]

OUTPUTS = ("json", "text", *FORMATS)  # a JSON schedule, its table as text, or an artifact
SIZED = " and ".join(f.plural for f in FORMATS.values() if f.size_rule is not None)  # what show --size takes
_D = TypeVar("_D")


def _suffixes() -> dict[str, tuple[str, ...]]:
    """Suffix -> the output formats a file of that name may hold, the first its default: a JSON
    schedule's and text's, then each artifact format's."""
    table: dict[str, tuple[str, ...]] = {".json": ("json",), ".txt": ("text",)}
    for fmt in FORMATS.values():
        for suffix in fmt.suffixes:
            table[suffix] = (*table.get(suffix, ()), fmt.name)
    return table


SUFFIXES = _suffixes()


def destination(
    output: Path | None, fmt: str | None, default: str, allowed: tuple[str, ...]
) -> tuple[Path | None, str]:
    """Where the output goes (None: standard output, also for ``-o -`` and ``-o /dev/stdout``) and
    in which format (:func:`output_format`; a name of stdout without a suffix says nothing)."""
    if not to_stdout(output):
        return output, output_format(output, fmt, default, allowed)
    assert output is not None
    return None, output_format(output if output.suffix else None, fmt, default, allowed)


def output_format(output: Path | None, fmt: str | None, default: str, allowed: tuple[str, ...]) -> str:
    """The output format: ``--format`` if given, else from the file's suffix, else ``default``.

    A ``--format`` that contradicts a known suffix is an error, and so is a file whose suffix says
    nothing without ``--format``: a silent choice would write what the user did not ask for.
    """
    implied = SUFFIXES.get(output.suffix.lower(), ()) if output is not None else ()
    if fmt is not None and output is not None and implied and fmt not in implied:
        raise click.UsageError(
            f"--format {fmt} contradicts {shown(output)} (a {output.suffix} name means {implied[0]})"
        )
    chosen = fmt or (implied[0] if implied else None)
    if chosen is None and output is not None:
        known = ", ".join(f"*{s}" for s, fs in SUFFIXES.items() if set(fs) & set(allowed))
        # ".json" is a hidden file's whole name, with no suffix: "name it .json" would say it had none
        hidden = (
            " (a name that starts with a dot has a suffix after a second one)"
            if output.name[:1] == "."
            else ""
        )
        raise click.UsageError(
            f"cannot tell the format of {shown(output)}{hidden}: name it {known}, or give --format"
        )
    chosen = chosen or default
    if chosen not in allowed:
        said = f" (a {output.suffix} name means it)" if fmt is None and output is not None else ""
        raise click.UsageError(f"this command writes {', '.join(allowed)}, not {chosen}{said}")
    return chosen


@click.command()
@GPUS
@STRAGGLER
@ALGORITHM
@click.option("-o", "--output", type=OUTPUT, help="Write the schedule to FILE (-: stdout, as without -o).")
@click.option(
    "--method",
    type=click.Choice(METHODS),
    default="construct",
    show_default=True,
    help="smt: let z3 find a round-optimal StragglAR schedule (small N only).",
)
@click.option(
    "--timeout",
    type=TIMEOUT,
    default="600s",
    show_default=True,
    help="With --method smt: give up on z3 after this long, a budget for the whole search (run's and "
    "bench's --timeout, 60s, bounds one wait for a peer instead).",
)
@CHUNKS
@model_options("With --chunks auto: ")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(OUTPUTS),
    help="json, text, msccl (MSCCL XML) or mscclpp (MSCCL++ plan); default from -o's suffix, else text.",
)
@artifact_options
@VERBOSE
def synth(
    num_gpus: int,
    straggler: int | None,
    algorithm: str,
    output: Path | None,
    fmt: str | None,
    method: str,
    timeout: float,
    chunks: int | str | None,
    size: int,
    delay: float,
    alpha: float,
    bandwidth: float,
    verbose: bool,
    **artifact: Any,
) -> None:
    """Generate a schedule, prove it, print or save it.

    Without -o: the round-by-round table and a summary line.  With -o: the file (a JSON schedule,
    MSCCL XML for a .xml name, or with --format mscclpp an MSCCL++ plan, each artifact proved from
    its own text), and the summary on stdout.  A document without -o goes to stdout, the summary to
    stderr.  --chunks auto picks the chunk count the cost model prices fastest at --size, --delay,
    --alpha and --bandwidth; for MSCCL XML and MSCCL++ plans the fastest power of two the format
    takes (executors split power-of-two buffers evenly into those), naming the faster it refuses.
    """
    output, fmt = destination(output, fmt, "text", OUTPUTS)
    if output is not None:
        check_output(output)
    refuse_other_formats(fmt)
    if method != "smt":
        refuse_given(["timeout"], "it bounds --method smt only")
    if chunks != AUTO:
        refuse_given(["size", "delay", "alpha", "bandwidth"], "it is a setting for --chunks auto")
    elif method == "smt":  # refused before a count is priced, let alone printed
        raise click.UsageError(
            "--chunks auto does not apply: method smt finds schedules with the paper's N - 1 chunks only"
        )
    network = Network(alpha, bandwidth)
    options, exporting = ExportOptions(**artifact), FORMATS.get(fmt)
    smt_timeout = timeout if method == "smt" else None
    lowered: str | None = None  # the artifact's text, where --chunks auto lowered it to choose
    if chunks == AUTO:
        refuse_chunks_for(algorithm, chunks)
        ranks = check_ranks(algorithm, num_gpus, method)
        if exporting is not None:  # what N alone refuses, before pricing chunk counts
            exporting.check_request(ranks, options)
            _check_priced_size(size, options)
        base = ranks.refined(straggler, timeout_s=smt_timeout)  # what no chunk count changes, first
        if exporting is None:
            num_chunks = chosen_chunks(chunks, num_gpus, size, delay, network, algorithm=algorithm)
            assert num_chunks is not None  # auto is a count
            echo(auto_note(num_chunks, size, delay, network), err=True)
            request = base.with_chunks(num_chunks)
            proof = _made(request)
        else:
            request, proof, lowered = _auto_for(exporting, options, base, _Setting(size, delay, network))
    else:
        num_chunks = chosen_chunks(chunks, num_gpus, size, delay, network, algorithm=algorithm)
        request = check_request(
            algorithm, num_gpus, straggler, chunks=num_chunks, method=method, timeout_s=smt_timeout
        )
        if exporting is not None:  # before the schedule is made: limits N, C and the options tell
            exporting.check_request(request, options)
        proof = _made(request)
    summary, details = proof.headline, [proof.summary, proof.covers]
    if exporting is not None:
        if lowered is None:
            lowered = _lowered(proof, exporting, options, request)
        exported = proved_export(exporting, lowered)
        body = exported.text
        summary += f"; {exporting.title} proved: {exported.proof.brief}"
        details += [exported.proof.summary, exported.proof.details]
    elif fmt == "json":
        body = schedule_text(proof.schedule)
    else:
        with busy("formatting the schedule as text"):
            body = f"{render(proof.schedule)}\n{summary}"
    to_stderr = output is None and fmt != "text"
    if output is not None:
        write(output, body.rstrip("\n"))
    else:
        (echo if fmt == "text" else click.echo)(body.rstrip("\n"))  # the table is text, the others documents
    if output is not None or fmt != "text":
        echo(summary, err=to_stderr)
    if verbose:
        echo("\n".join(details), err=to_stderr)


def _check_priced_size(size: int, options: ExportOptions) -> None:
    """--chunks auto prices a buffer of --size, which must be one the file is for: a count priced
    for 1 GiB in a plan the executor runs on 1 MiB at most was accepted without a word."""
    low, high = options.min_bytes, options.max_bytes
    if (low is not None and size < low) or (high is not None and size > high):
        window = " and ".join(
            f"{name} {format_bytes(value)}"
            for name, value in (("--min-bytes", low), ("--max-bytes", high))
            if value is not None
        )
        raise click.UsageError(
            f"--size {format_bytes(size)} (what --chunks auto prices) is not a size the file is for "
            f"({window}): give a --size the executor will run it on"
        )


@dataclass(frozen=True)
class _Setting:
    """What ``--chunks auto`` prices chunk counts for: ``--size``, ``--delay`` and the network."""

    size: int
    delay: float
    network: Network


def _made(request: Request) -> Proof:
    """The schedule ``request`` asks for, generated and proved."""
    with busy(f"synthesizing {request.algorithm} for {request.num_ranks} GPUs"):
        schedule = generate(request)
    return proved(schedule, f"the {request.algorithm} schedule")


def _auto_for(
    fmt: ArtifactFormat[Any], options: ExportOptions, base: Request, setting: _Setting
) -> tuple[Request, Proof, str]:
    """``--chunks auto`` for a file of ``fmt``: the power-of-two count the cost model prices fastest
    among those ``fmt`` takes, its request, proved schedule and lowered text; the decision is printed.

    Every power of two auto may choose is priced (:func:`chunks_by_price`) and tried fastest first;
    a count ``fmt`` refuses (more than its cells per file, told before the schedule is made; ops or
    channels of a thread block, steps, the size window, which only its lowering counts) is passed
    over for the next, and named: so "the fastest" is never said of a count while a faster one
    went unsaid.
    """
    n = base.num_ranks
    cells = fmt.max_chunks(n, options)  # the format was asked about N before pricing: its cells here
    refused: dict[int, str] = {}
    for count in chunks_by_price(n, setting.size, setting.delay, setting.network):
        if count > cells:  # before the schedule is made
            refused[count] = (
                f"{n} GPUs x {count} chunks x {count_of(options.instances, 'instance')}: stragglar writes "
                f"{fmt.plural} of at most {fmt.max_cells:,} (GPU, chunk) cells"
            )
            continue
        request = base.with_chunks(count)
        try:
            proof = _made(request)
            text = lowered_artifact(proof, fmt, options)
        except InputError as e:  # over a limit of fmt's for this many chunks: the next count
            refused[count] = str(e)
            continue
        more = ", a power of two for executors"
        faster = sorted(refused)
        if faster:  # the fastest is not the cost model's alone: say which it passed over
            more = f" among the powers of two {fmt.title_with_article} takes (it refuses {_listed(faster)})"
        echo(auto_note(count, setting.size, setting.delay, setting.network, more), err=True)
        return request, proof, text
    if len(refused) > 1 and len(set(refused.values())) == 1:  # not the count: the options (a name)
        raise InputError(next(iter(refused.values())))
    fewest = min(refused)
    raise InputError(
        f"--chunks auto: {fmt.title_with_article} takes no power-of-two chunk count from {fewest} to "
        f"{max(refused)} for {n} GPUs; with {fewest}: {refused[fewest]}"
    )


def _listed(counts: list[int]) -> str:
    """``128``, ``128 and 256``, ``64, 128 and 256``."""
    words = [str(c) for c in counts]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _lowered(proof: Proof, fmt: ArtifactFormat[Any], options: ExportOptions, request: Request) -> str:
    """``proof`` lowered to ``fmt``; where ``fmt`` refuses a count of chunks the user chose
    (``--chunks C`` above N - 1) and takes the paper's N - 1, the error says so: the advice of
    the lowering (fewer runs per round, fewer instances) is the library's, fewer chunks the
    command line's."""
    try:
        return lowered_artifact(proof, fmt, options)
    except InputError as e:
        n, chosen = request.num_ranks, request.chunks
        if request.algorithm != "stragglar" or chosen is None or chosen <= n - 1:
            raise
        try:
            lowered_artifact(_made(request.with_chunks(None)), fmt, options)
        except InputError:  # not the count alone: the error as it is
            raise e from None
        raise InputError(
            f"{e}; fewer than {chosen} chunks fit (N - 1 = {n - 1} does): give a smaller --chunks, "
            f"or --chunks auto for the fastest count {fmt.title_with_article} takes"
        ) from None


@click.command()
@click.argument("file", type=INPUT)
@click.option("-o", "--output", type=OUTPUT, help="The file to write (-: stdout, as without -o).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(("json", *FORMATS)),
    help="msccl (MSCCL XML), mscclpp (MSCCL++ plan) or json; default from -o's suffix, else msccl.",
)
@artifact_options
@click.option("--chunks", hidden=True, help="Refused: FILE fixes the chunk count (see below).")
@VERBOSE
def export(
    file: Path, output: Path | None, fmt: str | None, chunks: str | None, verbose: bool, **artifact: Any
) -> None:
    """Prove the JSON schedule FILE and write it as MSCCL XML or an MSCCL++ plan (each proved again
    from its own text), or as JSON.

    Writes OUTPUT (stdout without -o) and prints the proof summary (stderr without -o).  OUTPUT
    must not be FILE.  FILE fixes the chunk count: for a chunked artifact use
    `stragglar synth --gpus N --chunks C|auto --format msccl|mscclpp`.
    """
    refuse_given(
        ["chunks"],
        "a schedule file fixes its chunk count; use stragglar synth --gpus N --chunks C|auto --format FMT",
    )
    output, fmt = destination(output, fmt, "msccl", ("json", *FORMATS))
    check_output(Path("-") if output is None else output, file)  # stdout too: `1<>FILE`, `>>FILE`
    refuse_other_formats(fmt)
    options = ExportOptions(**artifact)

    def refuse(sizes: Header) -> None:
        """What N and C alone refuse (a file's schedule: no algorithm's own rules)."""
        if fmt in FORMATS:
            request = Request("", sizes.num_ranks, sizes.straggler, sizes.num_chunks, "construct")
            FORMATS[fmt].check_request(request, options)

    schedule = load_schedule(file, "export", refuse)  # refused by its header where that tells the sizes
    refuse(Header(schedule.num_ranks, schedule.num_chunks, schedule.straggler))  # else before the proof
    proof = proved(schedule, shown(file))
    if fmt in FORMATS:
        exported = export_artifact(proof, FORMATS[fmt], options)
        text, summary = exported.text, exported.proof.summary
        details = f"{exported.proof.details}\n{proof.summary}\n{proof.covers}"
    else:
        text = schedule_text(proof.schedule)
        summary, details = proof.headline, f"{proof.summary}\n{proof.covers}"
    if output is None:
        click.echo(text.rstrip("\n"))  # a document, as it is
    else:
        write(output, text.rstrip("\n"))
    echo(summary if output is None else f"{shown(output, limit=None)}: {summary}", err=output is None)
    if verbose:
        echo(details, err=output is None)


@click.command()
@click.argument("file", type=INPUT)
@click.option("--smt", is_flag=True, help="Prove a JSON schedule with z3 instead of the simulator.")
@click.option(
    "--timeout",
    type=TIMEOUT,
    help="With --smt: give up on z3 after this long (exit 3), the whole proof's budget [default: none].",
)
@VERBOSE
def verify(file: Path, smt: bool, timeout: float | None, verbose: bool) -> None:
    """Prove FILE correct, or name its first violation: a JSON schedule, MSCCL XML or an MSCCL++ plan,
    told apart by content.

    Exit 0 with a one-line proof summary, 1 if FILE is not a correct AllReduce, 2 if it is not a
    valid file of any of these kinds.  An artifact is proved as its executor runs it.
    """
    check_output(Path("-"), file)  # `verify in.json >> in.json` would append to its own input
    if not smt:
        refuse_given(
            ["timeout"], "it bounds z3's proof (--smt); the simulator's is bounded by the file's size"
        )
    found = read_input(file)
    if found.format is not None:
        refuse_given(
            ["smt"], f"{shown(file)} is {found.format.title_with_article}; --smt proves JSON schedules"
        )
        artifact = proved_artifact(found.format, found.source, shown(file))
        summary, details = artifact.summary, artifact.details
        _warn(file, artifact)
    else:
        assert found.schedule is not None  # a file of no artifact format is a schedule
        proof = proved(
            found.schedule, shown(file), functools.partial(smt_prove, timeout_s=timeout) if smt else prove
        )
        summary, details = proof.summary, f"{proof.headline}\n{proof.covers}"
        _warn_orders(file, found.schedule)
    echo(f"{shown(file, limit=None)}: {summary}")
    if verbose:
        echo(details)


@click.command()
@click.argument("file", type=INPUT)
@PLOT
@click.option("--size", type=SIZE, help=f"{SIZED}: would the executor use the plan for a buffer this big?")
@VERBOSE
def show(file: Path, plot_file: Path | None, size: int | None, verbose: bool) -> None:
    """Print FILE with its summary: a JSON schedule round by round, MSCCL XML GPU by GPU, an MSCCL++
    plan by thread blocks, ops and size rule.

    The summary says whether FILE was proved; exit 1 if it is not a correct AllReduce.  With
    --plot (JSON schedules), also draw the schedule as a rank x round chart.
    """
    check_output(Path("-"), file)  # `show in.json >> in.json` would append to its own input
    found = read_input(file)
    if found.format is not None:
        _show_artifact(found.format, found.source, file, size, verbose)
        return
    schedule = found.schedule
    assert schedule is not None  # a file of no artifact format is a schedule
    refuse_given(["size"], f"{shown(file)} is a JSON schedule; --size applies to {SIZED}")
    check_plot(plot_file, file)
    with busy("formatting the schedule as text"):  # N = 1024: 2 s, which showed nothing
        table = render(schedule)
    echo(table)  # first: a wrong schedule's table helps to see what is wrong
    proof: Proof = proved(schedule, shown(file))
    _warn_orders(file, schedule)
    echo(proof.headline)
    if verbose:
        echo(f"{proof.summary}\n{proof.covers}")
    if plot_file is not None:
        write_plot(plot_file, lambda plot: plot.schedule_figure(schedule))


def _warn_orders(file: Path, schedule: Schedule) -> None:
    """A proved schedule whose ranks add a chunk in different orders: correct, but the replicas'
    floating-point results differ (:mod:`stragglar.verify.orders`); one line on stderr."""
    with busy("checking that every rank adds each chunk in one order"):  # N = 1024: seconds
        disagreement = order_disagreement(schedule)
    if disagreement is not None:
        echo(f"warning: {shown(file, limit=None)}: {disagreement}", err=True)


def _warn(file: Path, proof: ArtifactProof) -> None:
    """What the executor runs otherwise than ``file`` says, yet correctly: one line each on stderr,
    so that stdout keeps the proof and the exit code stays 0."""
    for warning in proof.warnings:
        echo(f"warning: {shown(file, limit=None)}: {warning}", err=True)


def _show_artifact(
    fmt: ArtifactFormat[_D], source: str | _D, file: Path, size: int | None, verbose: bool
) -> None:
    """``show`` of an artifact: its description, its proof's summary and, for a format the executor
    picks by size, whether it would run on ``size`` bytes.  The file is read once for all three."""
    refuse_given(["plot_file"], f"{shown(file)} is {fmt.title_with_article}; --plot draws JSON schedules")
    if fmt.size_rule is None:
        refuse_given(["size"], f"{shown(file)} is {fmt.title_with_article}; --size applies to {SIZED}")
    if size is not None and size <= 0:
        raise click.BadParameter(f"{size} bytes: a buffer has at least one byte", param_hint="'--size'")
    document = read_artifact(fmt, source, shown(file))
    try:  # proved first: a file that cannot be read is one error line, nothing printed before it
        proof = proved_artifact(fmt, document, shown(file))
    except IncorrectError:
        with contextlib.suppress(StragglarError):  # where it cannot be described, the error says why
            echo(fmt.describe(document))  # what is wrong is easier seen in it
        raise
    echo(fmt.describe(document))
    echo(proof.summary)
    _warn(file, proof)
    if size is not None and fmt.size_rule is not None:
        echo(f"{format_bytes(size)}: {fmt.size_rule(document).decide(size).reason}")  # as people read sizes
    if verbose:
        echo(proof.details)
