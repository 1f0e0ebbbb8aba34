"""The ``stragglar`` command: synthesize, prove and look at AllReduce schedules.

Thin on purpose: it parses arguments, calls the library and prints::

    stragglar synth --gpus N [--straggler R] [--algorithm A] [-o FILE] [--format json|text|msccl]
    stragglar export FILE -o OUT.xml [--proto P] [--instances K] [--min-bytes B] [--max-bytes B]
    stragglar verify FILE            (a JSON schedule or an MSCCL XML file)
    stragglar show FILE [--plot OUT.png]
    stragglar cost --gpus N [--size 1GiB] [--delay 5ms] [--alpha 3us] [--bandwidth 450GiB/s] [--plot OUT.png]
    stragglar run --backend local|torch|cupy --gpus N [--size 64MiB] [--dtype D] [--delay 20ms] ...
    stragglar bench [--backend torch] [--gpus 4,8] [--sizes 16MiB,64MiB] [--delays 0,50ms] [--json OUT]

Every schedule is proved before it is printed or written.  ``synth`` sends the schedule
(the text table, or the JSON document) to ``-o FILE`` if given, else to stdout; its
one-line summary goes to stdout, except when stdout carries the JSON document, then to
stderr, so that ``stragglar synth --gpus 8 --format json > s.json`` is clean JSON.

Exit codes: 0 success; 1 the schedule is not a correct AllReduce; 2 bad input (a bad
option, an unreadable or malformed file).  Errors are a single ``Error: ...`` line on
stderr.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from stragglar import __version__
from stragglar.cost import Comparison, Network, compare, format_bytes, format_seconds
from stragglar.formats import json as json_format
from stragglar.formats.msccl import DEFAULT_MAX_BYTES, PROTOCOLS, MscclExportError, to_msccl_xml
from stragglar.formats.text import render
from stragglar.runtime import DTYPES
from stragglar.runtime.bench import BACKENDS, BenchmarkResult, run_benchmark
from stragglar.runtime.launch import LaunchError
from stragglar.runtime.sweep import sweep
from stragglar.schedule import Schedule, move_straggler
from stragglar.synth import ALGORITHMS, round_lower_bound, synthesize
from stragglar.verify import Proof, VerificationError, prove
from stragglar.verify.bound import prove_lower_bound, smt_synthesize
from stragglar.verify.msccl import MscclProof, MscclVerificationError, prove_msccl
from stragglar.verify.prove_all import TABLE_HEADER, format_row, prove_all, prove_files
from stragglar.verify.smt import smt_prove

__all__ = ["cli", "main"]

FORMATS = ("json", "text", "msccl")


class NotProved(click.ClickException):
    """A schedule that is not a correct AllReduce: exit 1, so scripts can tell it from bad input (2)."""

    exit_code = 1


@contextlib.contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    """Detach usage errors from their context: click then prints only ``Error: ...``, no usage text.

    Errors that show something else (the help page when no command is given) are left alone.
    """
    try:
        yield
    except click.UsageError as e:
        if type(e).show is click.UsageError.show:
            e.ctx = None
        raise


class _Group(click.Group):
    """A group whose parsing and command errors are one line each."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        with _one_line_usage_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line_usage_errors():
            return super().invoke(ctx)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="stragglar", message="%(prog)s %(version)s")
def cli() -> None:
    """Synthesize, prove and show StragglAR AllReduce schedules."""


def _msccl_options(command: Callable[..., None]) -> Callable[..., None]:
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


@cli.command()
@click.option("--gpus", "-n", "num_gpus", type=int, required=True, metavar="N", help="Number of GPUs, >= 2.")
@click.option("--straggler", type=int, metavar="R", help="The straggler's rank (default N-1).")
@click.option("--algorithm", "-a", type=click.Choice(ALGORITHMS), default="stragglar", show_default=True)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the schedule to FILE."
)
@click.option(
    "--method",
    type=click.Choice(("construct", "smt")),
    default="construct",
    show_default=True,
    help="smt: let z3 find a round-optimal StragglAR schedule (small N only).",
)
@click.option(
    "--format", "fmt", type=click.Choice(FORMATS), help="Default: from -o's suffix (.xml: msccl), else text."
)
@_msccl_options
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
    schedule = _synthesize(algorithm, num_gpus, straggler, method)
    summary = _summary(schedule, _prove(schedule, f"the {algorithm} schedule"))
    fmt = fmt or _format_of(output)
    if fmt == "msccl":
        body, xml_proof = _export(schedule, msccl)
        summary += f"; exported MSCCL XML {xml_proof.summary}"
    else:
        body = json_format.dumps(schedule) if fmt == "json" else f"{render(schedule)}\n{summary}"
    if output is not None:
        _write(output, body)
        click.echo(summary)
    else:
        click.echo(body.rstrip("\n"))
        if fmt != "text":
            click.echo(summary, err=True)


@cli.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="The XML file to write."
)
@_msccl_options
def export(file: Path, output: Path | None, **msccl: Any) -> None:
    """Lower the JSON schedule FILE to MSCCL XML and prove the XML itself.

    Writes OUTPUT (stdout without -o) and prints the proof summary (stderr without -o).
    """
    schedule = _load(file)
    _prove(schedule, str(file))
    text, proof = _export(schedule, msccl)
    if output is None:
        click.echo(text.rstrip("\n"))
        click.echo(proof.summary, err=True)
    else:
        _write(output, text.rstrip("\n"))
        click.echo(f"{output}: {proof.summary}")


@cli.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--smt", is_flag=True, help="Prove a JSON schedule with z3 instead of the simulator.")
def verify(file: Path, smt: bool) -> None:
    """Prove FILE (a JSON schedule, or MSCCL XML if it ends in .xml) correct, or name its first violation.

    Exit 0 with a one-line proof summary, 1 if FILE is not a correct AllReduce.  An XML file is
    proved as the MSCCL executor runs it: thread blocks, FIFO connections, dependencies.
    """
    if file.suffix.lower() == ".xml":
        summary = _prove_xml(_read_text(file), str(file)).summary
    else:
        summary = _prove(_load(file), str(file), smt_prove if smt else prove).summary
    click.echo(f"{file}: {summary}")


_PLOT_OPTION = click.option(
    "--plot",
    "plot_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also draw a chart into this PNG (needs matplotlib).",
)


@cli.command()
@click.argument("file", type=click.Path(path_type=Path))
@_PLOT_OPTION
def show(file: Path, plot_file: Path | None) -> None:
    """Print FILE as a round-by-round table with its summary.

    The summary says whether FILE was proved; exit 1 if it is not a correct AllReduce.  With
    --plot, also draw the schedule as a rank x round chart (who sends which chunk to whom).
    """
    schedule = _load(file)
    click.echo(render(schedule))
    click.echo(_summary(schedule, _prove(schedule, str(file))))
    if plot_file is not None:
        _plot(plot_file, lambda plot: plot.schedule_figure(schedule))


@cli.command()
@click.option("--gpus", "-n", "num_gpus", type=int, required=True, metavar="N", help="Number of GPUs, >= 2.")
@click.option("--size", default="1GiB", show_default=True, help="Buffer size per GPU, e.g. 64MiB.")
@click.option("--delay", default="0ms", show_default=True, help="How late the straggler arrives, e.g. 5ms.")
@click.option("--alpha", default="3us", show_default=True, help="Latency of one round.")
@click.option("--bandwidth", default="450GiB/s", show_default=True, help="Bandwidth of one link.")
@_PLOT_OPTION
def cost(num_gpus: int, size: str, delay: str, alpha: str, bandwidth: str, plot_file: Path | None) -> None:
    """Predict each algorithm's AllReduce time with the alpha-beta model, on its generated schedule.

    A round costs alpha + (largest bytes a GPU sends or receives in it) / bandwidth; phases
    without the straggler overlap its delay.  "exposed" is the time after the straggler
    arrives, "time" counts from when the punctual GPUs start; speed-ups compare exposed times.
    """
    try:
        network = Network(_seconds(alpha, "--alpha"), _rate(bandwidth, "--bandwidth"))
        comparison = compare(num_gpus, _bytes(size, "--size"), _seconds(delay, "--delay"), network)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    click.echo(_cost_table(comparison))
    if plot_file is not None:
        c = comparison
        _plot(plot_file, lambda plot: plot.cost_figure(c.num_ranks, c.size_bytes, c.delay, c.network))


def _cost_table(c: Comparison) -> str:
    """The setting, one row per algorithm, then when each straggler-aware one beats Ring."""
    lines = [
        f"alpha-beta model: {c.num_ranks} GPUs, {format_bytes(c.size_bytes)} buffer, straggler "
        f"{format_seconds(c.delay)} late, alpha {format_seconds(c.network.alpha)}, "
        f"{format_bytes(c.network.bandwidth)}/s",
        f"{'algorithm':<10} {'rounds exposed':>14} {'time':>11} {'exposed time':>13} "
        f"{'speed-up over ring':>19}",
    ]
    for e in c.estimates:
        rounds = f"{e.exposed_rounds} of {e.rounds}"
        lines.append(
            f"{e.algorithm:<10} {rounds:>14} {format_seconds(e.time):>11} {format_seconds(e.exposed):>13} "
            f"{c.speedup(e.algorithm):>18.2f}x"
        )
    for e in c.estimates:
        if e.hidden == 0:
            continue
        critical = c.critical_delay(e.algorithm)
        if critical is None:
            verdict = "never beats ring at this size, whatever the delay"
        elif critical == 0:
            verdict = "beats ring at every delay"
        else:
            verdict = f"beats ring when the straggler is more than {format_seconds(critical)} late"
        lines.append(f"critical delay: {e.algorithm} {verdict}")
    return "\n".join(lines)


def _plot(path: Path, draw: Callable[[Any], Any]) -> None:
    """Draw with :mod:`stragglar.plot` (imported here: matplotlib is optional) and save to ``path``."""
    from stragglar import plot

    try:
        plot.save(draw(plot), path)
    except plot.PlotUnavailable as e:
        raise click.UsageError(str(e)) from None
    except OSError as e:
        raise click.BadParameter(f"cannot write {path}: {e.strerror or e}", param_hint="'--plot'") from None
    click.echo(f"plot written to {path}")


@cli.command()
@click.option("--backend", type=click.Choice(BACKENDS), default="local", show_default=True)
@click.option("--gpus", "-n", "num_gpus", type=int, required=True, metavar="N", help="Number of ranks.")
@click.option("--size", default="64MiB", show_default=True, help="Buffer size per rank, e.g. 16MiB.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--delay", default="0ms", show_default=True, help="How late the straggler arrives, e.g. 20ms.")
@click.option("--algorithm", "-a", type=click.Choice(ALGORITHMS), default="stragglar", show_default=True)
@click.option("--straggler", type=int, metavar="R", help="The straggler's rank (default N-1).")
@click.option(
    "--schedule",
    "schedule_file",
    type=click.Path(path_type=Path),
    help="Run this schedule file instead of synthesizing one.",
)
@click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--timeout", default="60s", show_default=True, help="Give up on a silent peer after this long.")
def run(
    backend: str,
    num_gpus: int,
    size: str,
    dtype: str,
    delay: str,
    algorithm: str,
    straggler: int | None,
    schedule_file: Path | None,
    iters: int,
    timeout: str,
) -> None:
    """Run a schedule on real data and compare it with the engine's own AllReduce.

    Every rank gets distinct values per element; both results are checked against a NumPy
    reference.  Prints the median time per iteration and the algorithm bandwidth of each.
    """
    schedule = _load(schedule_file) if schedule_file else None
    if schedule is not None:
        _prove(schedule, str(schedule_file))
    with _measurement_errors():
        result = run_benchmark(
            backend,
            num_gpus,
            _bytes(size, "--size"),
            dtype,
            _seconds(delay, "--delay"),
            algorithm=algorithm,
            schedule=schedule,
            straggler=straggler,
            iters=iters,
            timeout=_seconds(timeout, "--timeout"),
        )
    click.echo(result.report())


@cli.command()
@click.option("--backend", type=click.Choice(BACKENDS), default="torch", show_default=True)
@click.option("--gpus", "-n", default="4,8", show_default=True, help="Rank counts, comma-separated.")
@click.option("--sizes", default="16MiB,64MiB", show_default=True, help="Buffer sizes per rank.")
@click.option("--delays", default="0ms,50ms,200ms", show_default=True, help="Straggler delays.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--algorithm", "-a", type=click.Choice(ALGORITHMS), default="stragglar", show_default=True)
@click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True)
@click.option(
    "--timeout", default="120s", show_default=True, help="Give up on a silent peer after this long."
)
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Also save the results as JSON.")
def bench(
    backend: str,
    gpus: str,
    sizes: str,
    delays: str,
    dtype: str,
    algorithm: str,
    iters: int,
    timeout: str,
    json_file: Path | None,
) -> None:
    """Measure a grid of settings against the engine's own AllReduce.

    Prints, per setting, both median times and the per-iteration ratio (median, min-max); with
    the torch backend and a 0 ms delay among two or more sizes, also what the alpha-beta model
    predicts with the network fitted to gloo's own times.
    """

    def progress(r: BenchmarkResult) -> None:
        click.echo(
            f"  N={r.num_ranks} {format_bytes(r.size_bytes)} {r.delay * 1e3:g} ms: "
            f"{r.baseline_time / r.time:.2f}x",
            err=True,
        )

    with _measurement_errors():
        result = sweep(
            backend,
            _count_list(gpus),
            [_bytes(x, "--sizes") for x in _items(sizes, "--sizes")],
            [_seconds(x, "--delays") for x in _items(delays, "--delays")],
            algorithm=algorithm,
            dtype=dtype,
            iters=iters,
            timeout=_seconds(timeout, "--timeout"),
            progress=progress,
        )
    click.echo(result.table())
    if json_file is not None:
        _write(json_file, json.dumps(result.to_json(), indent=2) + "\n")
        click.echo(f"results written to {json_file}")


@contextlib.contextmanager
def _measurement_errors() -> Iterator[None]:
    """Bad requests exit 2; a wrong result or a failed rank exits 1, each as one line."""
    try:
        yield
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except AssertionError as e:
        raise NotProved(f"wrong result: {e}") from None
    except LaunchError as e:
        raise NotProved(str(e).splitlines()[0]) from None


def _items(text: str, option: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise click.BadParameter(f"expected a comma-separated list, got {text!r}", param_hint=option)
    return items


def _count_list(text: str) -> list[int]:
    try:
        return [int(x) for x in _items(text, "--gpus")]
    except ValueError:
        raise click.BadParameter(
            f"expected rank counts like 4,8, got {text!r}", param_hint="--gpus"
        ) from None


_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _bytes(text: str, option: str) -> int:
    """``64MiB`` -> 67108864: binary (KiB, MiB, GiB) and decimal (KB, MB, GB) units."""
    number, unit = _split_unit(text)
    factor = _SIZE_UNITS.get(unit.upper())
    if number is None or factor is None or number < 0:
        raise click.BadParameter(f"expected a size like 16MiB or 1GB, got {text!r}", param_hint=option)
    return int(number * factor)


def _seconds(text: str, option: str) -> float:
    """``20ms`` -> 0.02; a bare number is in milliseconds."""
    number, unit = _split_unit(text)
    factor = _TIME_UNITS.get(unit or "ms")
    if number is None or factor is None or number < 0:
        raise click.BadParameter(f"expected a duration like 20ms or 1.5s, got {text!r}", param_hint=option)
    return number * factor


def _rate(text: str, option: str) -> float:
    """``450GiB/s`` -> bytes per second, with the units of :func:`_bytes`; the ``/s`` is optional."""
    body = text.strip()
    number, unit = _split_unit(body[:-2] if body.lower().endswith("/s") else body)
    factor = _SIZE_UNITS.get(unit.upper())
    if number is None or factor is None or number <= 0:
        raise click.BadParameter(
            f"expected a bandwidth like 450GiB/s or 25GB/s, got {text!r}", param_hint=option
        )
    return number * factor


def _split_unit(text: str) -> tuple[float | None, str]:
    body = text.strip()
    digits = body.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    try:
        return float(digits), body[len(digits) :].strip()
    except ValueError:
        return None, ""


def _synthesize(algorithm: str, num_gpus: int, straggler: int | None, method: str = "construct") -> Schedule:
    try:
        schedule = synthesize(algorithm, num_gpus, straggler)  # checks the request in every case
        if method == "smt":
            if algorithm != "stragglar":
                raise ValueError("--method smt synthesizes StragglAR schedules only")
            found = smt_synthesize(num_gpus)
            schedule = found if straggler is None else move_straggler(found, straggler)
        return schedule
    except ValueError as e:
        raise click.UsageError(str(e)) from None


@cli.command()
@click.option("--gpus", "-n", "num_gpus", type=click.IntRange(min=2), required=True, metavar="N")
@click.option("--timeout", default="600s", show_default=True, help="Give up on the solver after this long.")
def bound(num_gpus: int, timeout: str) -> None:
    """Prove with z3 that no phase 2 for N GPUs fits in R*(N) - 1 rounds.

    Exit 0 when proved; 1 if the solver ran out of time or (a finding to report) fits fewer rounds.
    """
    result = prove_lower_bound(num_gpus, _seconds(timeout, "--timeout"))
    fewer = f"{result.bound - 1} rounds"
    if result.proved:
        click.echo(
            f"proved: no phase 2 for {num_gpus} GPUs fits in {fewer}, so R*({num_gpus}) = {result.bound} "
            f"is optimal (z3: unsat in {result.seconds:.2f} s)"
        )
    elif result.schedule is not None:
        raise NotProved(f"z3 found a phase 2 for {num_gpus} GPUs in {fewer}, below R*({num_gpus})")
    else:
        raise NotProved(
            f"z3 gave no answer for {num_gpus} GPUs in {result.seconds:.1f} s (status {result.status})"
        )


@cli.command("prove-all")
@click.option(
    "--max-gpus", type=click.IntRange(min=2), default=32, show_default=True, help="z3 up to this N."
)
@click.option("--max-simulated", type=click.IntRange(min=2), default=128, show_default=True)
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
def prove_all_command(max_gpus: int, max_simulated: int, files: tuple[Path, ...]) -> None:
    """Prove every schedule we ship: StragglAR by z3 up to --max-gpus (baselines up to 16), all
    algorithms by the simulator up to --max-simulated; or the given JSON FILES themselves."""
    rows = prove_files(files) if files else prove_all(max_gpus, min(max_gpus, 16), max_simulated)
    click.echo(TABLE_HEADER)
    try:
        for row in rows:
            click.echo(format_row(row))
    except VerificationError as e:
        raise NotProved(e.violation.message) from None
    except json_format.ScheduleFormatError as e:
        raise click.UsageError(str(e)) from None


def _load(path: Path) -> Schedule:
    """Read a schedule file; a file that cannot be read is bad input, not a wrong schedule."""
    try:
        return json_format.read(path)
    except json_format.ScheduleFormatError as e:
        raise click.UsageError(str(e)) from None


def _format_of(output: Path | None) -> str:
    if output is None:
        return "text"
    return "msccl" if output.suffix.lower() == ".xml" else "json"


def _export(schedule: Schedule, options: dict[str, Any]) -> tuple[str, MscclProof]:
    """The MSCCL XML of ``schedule`` and the proof of that text; a limit it breaks is bad input."""
    try:
        text = to_msccl_xml(
            schedule,
            name=options["xml_name"],
            proto=options["proto"],
            instances=options["instances"],
            min_bytes=options["min_bytes"],
            max_bytes=options["max_bytes"],
        )
    except MscclExportError as e:
        raise click.UsageError(str(e)) from None
    return text, _prove_xml(text, "the exported XML")


def _prove_xml(text: str, name: str) -> MscclProof:
    try:
        return prove_msccl(text)
    except MscclVerificationError as e:
        raise NotProved(f"{name} is not a correct AllReduce: {e.violation.message}") from None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise click.UsageError(f"file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise click.UsageError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text + "\n", encoding="utf-8")
    except OSError as e:
        raise click.BadParameter(f"cannot write {path}: {e.strerror or e}", param_hint="'-o'") from None


def _prove(schedule: Schedule, name: str, prover: Callable[[Schedule], Proof] = prove) -> Proof:
    try:
        return prover(schedule)
    except VerificationError as e:
        raise NotProved(f"{name} is not a correct AllReduce: {e.violation.message}") from None


def _summary(schedule: Schedule, proof: Proof) -> str:
    """One line: who takes part, the rounds (against R*(N) for StragglAR) and what was proved."""
    who = _count(schedule.num_ranks, "GPU")
    if schedule.straggler is not None:
        who += f" (straggler {schedule.straggler})"
    chunks = _count(schedule.num_chunks, "chunk")
    return f"{schedule.algorithm}: {who}, {chunks}, {_rounds(schedule)}; {proof.summary}"


def _rounds(schedule: Schedule) -> str:
    if schedule.straggler is None:
        return _count(schedule.num_rounds, "round")
    exposed = _count(schedule.straggler_rounds, "round")
    return f"{exposed} after the straggler arrives{_versus_bound(schedule)}, {schedule.num_rounds} in all"


def _versus_bound(schedule: Schedule) -> str:
    """How far StragglAR's exposed rounds are from R*(N); other algorithms are not in that model."""
    n = schedule.num_ranks
    if schedule.algorithm != "stragglar" or n < 2:
        return ""
    bound = round_lower_bound(n)
    gap = schedule.straggler_rounds - bound
    verdict = "optimal" if gap == 0 else f"{gap:+d}"
    return f" (lower bound R*({n}) = {bound}: {verdict})"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def main() -> None:
    """Entry point of the ``stragglar`` console script."""
    cli.main(prog_name="stragglar")
