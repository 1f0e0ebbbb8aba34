"""``run`` and ``bench``: time schedules on real data against the engine's own AllReduce."""

from __future__ import annotations

import json
from pathlib import Path

import click

from stragglar.commands.common import ALGORITHM, STRAGGLER, items, option_value, proved, write
from stragglar.formats import json as json_format
from stragglar.measure.run import BACKENDS, BenchmarkResult, run_benchmark
from stragglar.measure.sweep import sweep
from stragglar.runtime import DTYPES
from stragglar.units import parse_duration, parse_size

__all__ = ["bench", "run"]


@click.command()
@click.option("--backend", type=click.Choice(BACKENDS), default="local", show_default=True)
@click.option("--gpus", "-n", "num_gpus", type=int, required=True, metavar="N", help="Number of ranks.")
@click.option("--size", default="64MiB", show_default=True, help="Buffer size per rank, e.g. 16MiB.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--delay", default="0ms", show_default=True, help="How late the straggler arrives, e.g. 20ms.")
@ALGORITHM
@STRAGGLER
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
    proof = proved(json_format.read(schedule_file), str(schedule_file)) if schedule_file else None
    result = run_benchmark(
        backend,
        num_gpus,
        option_value(parse_size, size, "--size"),
        dtype,
        option_value(parse_duration, delay, "--delay"),
        algorithm=algorithm,
        proof=proof,
        straggler=straggler,
        iters=iters,
        timeout=option_value(parse_duration, timeout, "--timeout"),
    )
    click.echo(result.report())


@click.command()
@click.option("--backend", type=click.Choice(BACKENDS), default="torch", show_default=True)
@click.option("--gpus", "-n", default="4,8", show_default=True, help="Rank counts, comma-separated.")
@click.option("--sizes", default="16MiB,64MiB", show_default=True, help="Buffer sizes per rank.")
@click.option("--delays", default="0ms,50ms,200ms", show_default=True, help="Straggler delays.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@ALGORITHM
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
        click.echo(r.progress_line(), err=True)

    result = sweep(
        backend,
        _rank_counts(gpus),
        [option_value(parse_size, x, "--sizes") for x in items(sizes, "--sizes")],
        [option_value(parse_duration, x, "--delays") for x in items(delays, "--delays")],
        algorithm=algorithm,
        dtype=dtype,
        iters=iters,
        timeout=option_value(parse_duration, timeout, "--timeout"),
        progress=progress,
    )
    click.echo(result.table())
    if json_file is not None:
        write(json_file, json.dumps(result.to_json(), indent=2))
        click.echo(f"results written to {json_file}")


def _rank_counts(text: str) -> list[int]:
    try:
        return [int(x) for x in items(text, "--gpus")]
    except ValueError:
        raise click.BadParameter(
            f"expected rank counts like 4,8, got {text!r}", param_hint="--gpus"
        ) from None
