"""``cost``, ``bound``, ``prove-all``: what the model predicts and what the solvers prove."""

from __future__ import annotations

from pathlib import Path

import click

from stragglar.commands.common import GPUS, PLOT, draw, option_value
from stragglar.cost import Network
from stragglar.errors import IncorrectError
from stragglar.measure.predict import compare_generated
from stragglar.proof_tier import TABLE_HEADER, format_row, prove_all, prove_files
from stragglar.units import parse_bandwidth, parse_duration, parse_size
from stragglar.verify import VerificationError
from stragglar.verify.bound import prove_lower_bound

__all__ = ["bound", "cost", "prove_all_command"]


@click.command()
@GPUS
@click.option("--size", default="1GiB", show_default=True, help="Buffer size per GPU, e.g. 64MiB.")
@click.option("--delay", default="0ms", show_default=True, help="How late the straggler arrives, e.g. 5ms.")
@click.option("--alpha", default="3us", show_default=True, help="Latency of one round.")
@click.option("--bandwidth", default="450GiB/s", show_default=True, help="Bandwidth of one link.")
@PLOT
def cost(num_gpus: int, size: str, delay: str, alpha: str, bandwidth: str, plot_file: Path | None) -> None:
    """Predict each algorithm's AllReduce time with the alpha-beta model, on its generated schedule.

    A round costs alpha + (largest bytes a GPU sends or receives in it) / bandwidth; phases
    without the straggler overlap its delay.  "exposed" is the time after the straggler
    arrives, "time" counts from when the punctual GPUs start; speed-ups compare exposed times.
    """
    network = Network(
        option_value(parse_duration, alpha, "--alpha"),
        option_value(parse_bandwidth, bandwidth, "--bandwidth"),
    )
    size_bytes = option_value(parse_size, size, "--size")
    comparison = compare_generated(
        num_gpus, size_bytes, option_value(parse_duration, delay, "--delay"), network
    )
    click.echo(comparison.table())
    if plot_file is not None:
        c = comparison
        draw(plot_file, lambda plot: plot.cost_figure(c.num_ranks, c.size_bytes, c.delay, c.network))


@click.command()
@click.option("--gpus", "-n", "num_gpus", type=click.IntRange(min=2), required=True, metavar="N")
@click.option("--timeout", default="600s", show_default=True, help="Give up on the solver after this long.")
def bound(num_gpus: int, timeout: str) -> None:
    """Prove with z3 that no phase 2 for N GPUs fits in R*(N) - 1 rounds.

    Exit 0 when proved; 1 if the solver ran out of time or (a finding to report) fits fewer rounds.
    """
    result = prove_lower_bound(num_gpus, option_value(parse_duration, timeout, "--timeout"))
    if not result.proved:
        raise IncorrectError(result.summary)
    click.echo(result.summary)


@click.command("prove-all")
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
        raise IncorrectError(e.violation.message) from None
