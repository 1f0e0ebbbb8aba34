"""``cost``, ``bound``, ``prove-all``: what the model predicts and what the solvers prove."""

from __future__ import annotations

from pathlib import Path

import click

from stragglar.commands.inputs import read_input
from stragglar.commands.options import (
    CHUNKS,
    GPUS,
    INPUT,
    PLOT,
    TIMEOUT,
    VERBOSE,
    Whole,
    chosen_chunks,
    model_options,
    refuse_given,
)
from stragglar.commands.outputs import check_plot, write_plot
from stragglar.commands.proofs import proved_artifact
from stragglar.commands.terminal import busy, echo, progress, progress_bar
from stragglar.errors import IncorrectError, InputError, ResourceError, StragglarError, shown
from stragglar.model import AUTO, Comparison, Network, compare_generated, generated_profile
from stragglar.model.chunks import MIN_CHUNK_BYTES, SAME_PRICE, chunk_candidates
from stragglar.proof_tier import (
    ALGORITHM_MAX_WIDTH,
    ALGORITHM_WIDTH,
    TABLE_HEADER,
    ProofRow,
    Skipped,
    format_row,
    proof_count,
    prove_all,
    prove_schedule_file,
    table_header,
)
from stragglar.schedule import MAX_RANKS
from stragglar.synth import ALGORITHMS
from stragglar.units import count_of, format_bytes, format_ratio
from stragglar.verify import VerificationError
from stragglar.verify.bound import BOUND_MAX_CELLS, BOUND_MAX_RANKS, prove_lower_bound
from stragglar.verify.shard_bound import COLLECTIVES, shard_bound

__all__ = ["bound", "cost", "prove_all_command"]


@click.command()
@GPUS
@model_options()
@CHUNKS
@PLOT
def cost(
    num_gpus: int,
    size: int,
    delay: float,
    alpha: float,
    bandwidth: float,
    chunks: int | str | None,
    plot_file: Path | None,
) -> None:
    """Predict each algorithm's AllReduce time with the alpha-beta model, on its generated schedule.

    A round costs alpha + (largest bytes a GPU sends or receives in it) / bandwidth; phases
    without the straggler overlap its delay.  "exposed" is the time after the straggler
    arrives, "time" counts from when the punctual GPUs start; speed-ups compare exposed times.
    With --chunks, StragglAR in C chunks is priced beside the paper's C = N-1 (and --plot adds
    the speed-up against C).
    """
    check_plot(plot_file)
    network = Network(alpha, bandwidth)
    num_chunks = chosen_chunks(chunks, num_gpus, size, delay, network)
    with busy(f"pricing the schedules for {num_gpus} GPUs"):
        comparison = compare_generated(num_gpus, size, delay, network, chunks=num_chunks)
    echo(comparison.table())
    if num_chunks is not None:
        echo(_chunk_line(comparison, num_chunks, _auto_range(num_gpus, size) if chunks == AUTO else None))
    if plot_file is not None:
        from stragglar.plot import chunk_sweep, sweep_sizes  # the plot's module (and numpy) for a plot only

        sizes = sweep_sizes(num_gpus)
        pairs = [(a, n) for n in sizes for a in ALGORITHMS if a != "rhd" or n & (n - 1) == 0]
        for algorithm, n in progress(pairs, "pricing the schedules of the plot"):
            generated_profile(algorithm, n)  # cached: the figure below reuses them
        if num_chunks is not None:
            for c in progress(chunk_sweep(num_gpus, num_chunks), "pricing the chunk counts"):
                generated_profile("stragglar", num_gpus, c)
        cmp = comparison
        write_plot(
            plot_file,
            lambda plot: plot.cost_figure(
                cmp.num_ranks, cmp.size_bytes, cmp.delay, cmp.network, sizes, num_chunks
            ),
        )


def _auto_range(num_gpus: int, size: float) -> str:
    """The counts auto chose among, in words, and why they end there where the buffer ends them:
    the model's fastest is not the fastest of every count (``--chunks 40`` can beat auto's 16 for
    64 KiB buffers, whose chunks auto keeps at 4 KiB or more)."""
    counts = chunk_candidates(num_gpus, size)
    low, high = counts[0], counts[-1]
    least = format_bytes(MIN_CHUNK_BYTES)
    if high == low:
        return f"the only count it takes: more than N-1 = {low} would cut chunks under {least}"
    why = f": no chunk under {least}" if high == int(size // MIN_CHUNK_BYTES) else ""
    return f"the model's fastest of C = {low} to {high}{why}"


def _chunk_line(comparison: Comparison, chunks: int, auto: str | None) -> str:
    """``chunks: C = 38 (auto: the model's fastest of C = 7 to 4096: ...) against the paper's C =
    N-1 = 7: 1.18x faster after the straggler arrives``; ``auto`` the range auto chose from."""
    n = comparison.num_ranks
    how = f" (auto: {auto})" if auto is not None else ""
    if chunks == n - 1:
        return f"chunks: C = {chunks}{how}, the paper's C = N-1"
    ours = comparison.get(f"stragglar C={chunks}").exposed
    paper = comparison.get("stragglar").exposed
    if abs(ours - paper) <= SAME_PRICE * min(ours, paper):  # one price, but for float64's last bits
        than = "as fast"
    else:  # the larger time over the smaller, so that "2x slower" takes twice as long
        ratio = max(paper, ours) / min(paper, ours)
        # under 1.005x "1.00x" would hide which is faster: the difference in percent says it
        how_much = f"{format_ratio(ratio)}x" if ratio >= 1.005 else f"{(ratio - 1) * 100:.2g}%"
        than = f"{how_much} {'faster' if ours < paper else 'slower'}"
    return (
        f"chunks: C = {chunks}{how} against the paper's C = N-1 = {n - 1}: {than} after the straggler arrives"
    )


@click.command()
@click.option(
    "--gpus",
    "-n",
    "num_gpus",
    type=Whole(),
    required=True,
    metavar="N",
    help=f"Number of GPUs, 2 to {BOUND_MAX_RANKS}.",
)
@click.option(
    "--collective",
    type=click.Choice(("allreduce", *COLLECTIVES)),
    default="allreduce",
    show_default=True,
    help="The collective: StragglAR's AllReduce (phase 2's rounds), or a straggler-aware "
    "ReduceScatter or AllGather (rounds and chunks through the straggler's port, beside Ring's).",
)
@click.option(
    "--chunks",
    "-c",
    type=Whole(1),
    help="Chunks C >= N-1 (default N-1, the paper's); for reduce_scatter and all_gather a multiple "
    f"of N (default N). N x C at most {BOUND_MAX_CELLS}.",
)
@click.option(
    "--rounds",
    type=Whole(0),
    help="Rounds to refute (default: one below the bound); allreduce only.",
)
@click.option(
    "--timeout",
    type=TIMEOUT,
    default="600s",
    show_default=True,
    help="Give up on z3 after this long: a budget for the whole proof, model building included "
    "(run's and bench's --timeout, 60s, bounds one wait for a peer instead).",
)
def bound(num_gpus: int, collective: str, chunks: int | None, rounds: int | None, timeout: float) -> None:
    """Prove with z3 that no phase 2 for N GPUs and C chunks fits in C + ceil(log2 N) - 2 rounds
    (R*(N) - 1 for C = N-1), or in --rounds rounds.

    With --collective reduce_scatter or all_gather: prove the fewest rounds after the straggler
    arrives and the fewest chunks through its port, show a schedule that reaches both, and
    compare them with Ring's.

    Exit 0 when proved, and when z3 fits --rounds at or above the bound (the expected answer);
    1 if z3 fits fewer rounds than the bound, or (reduce_scatter, all_gather) fewer port chunks,
    or no schedule at both figures (a finding to report); 3 if it ran out of time.
    """
    if num_gpus < 2:  # in the words of every command's GPU count
        raise InputError(f"need 2 to {BOUND_MAX_RANKS} GPUs, got {num_gpus}")
    if num_gpus > BOUND_MAX_RANKS:  # every collective's model: refused here in the same words
        raise InputError(
            f"need 2 to {BOUND_MAX_RANKS} GPUs, got {num_gpus}: the z3 model grows as N^4 "
            f"({_largest_took(collective)})"
        )
    if collective != "allreduce":
        refuse_given(["rounds"], "the ReduceScatter and AllGather bounds ask their own round counts")
        _shard_bound(collective, num_gpus, chunks, timeout)
        return
    with busy(f"asking z3 about {num_gpus} GPUs{_expected(num_gpus, chunks)}"):
        result = prove_lower_bound(num_gpus, timeout, chunks, rounds)
    if result.below_bound:
        raise IncorrectError(result.summary)
    if not result.proved and result.exchange is None:
        raise ResourceError(result.summary)
    echo(result.summary)


def _shard_bound(collective: str, num_gpus: int, chunks: int | None, timeout: float) -> None:
    """``bound --collective reduce_scatter|all_gather``: three lines when proved (the proof,
    Ring's figures, the verdict), one error line when z3 refutes the claim or runs out of time."""
    with busy(f"asking z3 about the {COLLECTIVES[collective]} of {num_gpus} GPUs"):
        result = shard_bound(collective, num_gpus, chunks, timeout)
    if result.refuted:
        raise IncorrectError(result.lines[0])
    if not result.proved:
        raise ResourceError(result.lines[0])
    for line in result.lines:
        echo(line)


# What the bound at N GPUs (the paper's chunks) took on a 2-core machine (docs/smt.md, 2026-11-26;
# N = 16 2026-11-25): the busy line says so, so that a long wait is expected, not a surprise.
BOUND_SECONDS = {13: 14, 14: 26, 15: 107, 16: 495}
_LARGEST = max(BOUND_SECONDS)
# What the ReduceScatter and AllGather bounds took at N = BOUND_MAX_RANKS, C = N (docs/smt.md,
# 2026-11-28, 2 cores shared with other work): their own figures, not the AllReduce's.
SHARD_SECONDS = {"reduce_scatter": 263, "all_gather": 151}


def _largest_took(collective: str) -> str:
    """How long the largest N measured took for ``collective``: why more GPUs than the bound
    takes are refused, in figures true of the model asked about.

    >>> _largest_took("allreduce"), _largest_took("all_gather")
    ('N = 16 took 495 s on 2 cores', 'N = 24 took 151 s on 2 cores')
    """
    if collective == "allreduce":
        return f"N = {_LARGEST} took {BOUND_SECONDS[_LARGEST]} s on 2 cores"
    return f"N = {BOUND_MAX_RANKS} took {SHARD_SECONDS[collective]} s on 2 cores"


def _expected(num_gpus: int, chunks: int | None) -> str:
    """`` (N = 16 took 495 s on 2 cores)``, where the wait is long; beyond the largest N measured,
    that z3 has not finished it.

    >>> _expected(8, None), _expected(16, None), _expected(16, 32)
    ('', ' (N = 16 took 495 s on 2 cores)', '')
    >>> _expected(17, None)
    ' (z3 has not finished N > 16: hours; N = 16 took 495 s on 2 cores)'
    """
    if chunks is not None and chunks != num_gpus - 1:
        return ""
    if num_gpus > _LARGEST:
        took = BOUND_SECONDS[_LARGEST]
        return f" (z3 has not finished N > {_LARGEST}: hours; N = {_LARGEST} took {took} s on 2 cores)"
    seconds = BOUND_SECONDS.get(num_gpus)
    return "" if seconds is None else f" (N = {num_gpus} took {seconds} s on 2 cores)"


PROVE_ALL_MAX_Z3 = 64  # z3's work grows fast with N: a bound, so a typo cannot ask for days


@click.command("prove-all")
@click.option(
    "--max-gpus",
    type=Whole(2, PROVE_ALL_MAX_Z3),
    default=32,
    show_default=True,
    help="z3 up to this N.",
)
@click.option(
    "--max-simulated",
    type=Whole(2, MAX_RANKS),
    default=128,
    show_default=True,
    help="The simulator up to this N.",
)
@click.argument("files", nargs=-1, type=INPUT)
@VERBOSE
def prove_all_command(max_gpus: int, max_simulated: int, files: tuple[Path, ...], verbose: bool) -> None:
    """Prove every schedule we ship: StragglAR by z3 up to --max-gpus (baselines up to 16), all
    algorithms by the simulator up to --max-simulated; or the given FILES (JSON schedules, by both
    provers, MSCCL XML and MSCCL++ plans), every one of them, naming each that fails.  A file too
    big for z3 is proved by the simulator alone, and the table says so.

    "rounds" counts the rounds after the straggler arrives (all of them without one), and in
    parentheses the chunk-steps where they differ (a round that moves k chunks over one link
    counts k): "bound" counts those."""
    if files:
        refuse_given(["max_gpus", "max_simulated"], "FILES are proved whatever their N")
        _prove_files(files, verbose)
        return
    echo(TABLE_HEADER)
    rows = []
    baselines = min(max_gpus, 16)
    with progress_bar(proof_count(max_gpus, baselines, max_simulated), "proving") as bar:
        try:
            for row in prove_all(max_gpus, baselines, max_simulated):
                echo(format_row(row))
                rows.append(row)
                bar.advance()
        except VerificationError as e:
            raise IncorrectError(e.violation.message) from None
    echo(_proved_all(rows))


def _proved_all(rows: list[ProofRow]) -> str:
    """prove-all's last line, counting what each prover ran: ``proved all 14 schedules by the
    simulator, 11 of them by z3 as well``, or, where z3 went further than the simulator
    (``--max-simulated`` below ``--max-gpus``), each prover's count.

    >>> row = lambda n, method: ProofRow("stragglar", n, 1, 1, None, method, 0.0, "synthesized")
    >>> _proved_all([row(2, "simulate"), row(2, "smt"), row(3, "smt")])
    'proved all 2 schedules: 1 by the simulator, 2 by z3'
    """
    simulated = {(row.algorithm, row.num_ranks) for row in rows if row.method == "simulate"}
    by_z3 = {(row.algorithm, row.num_ranks) for row in rows if row.method == "smt"}
    schedules = len(simulated | by_z3)
    if by_z3 <= simulated:
        return f"proved all {schedules} schedules by the simulator, {len(by_z3)} of them by z3 as well"
    return f"proved all {schedules} schedules: {len(simulated)} by the simulator, {len(by_z3)} by z3"


def _prove_files(files: tuple[Path, ...], verbose: bool) -> None:
    """Each file proved on its own; the table once all are (an artifact's name, its algorithm,
    may be wider than the column: the column is as wide as the widest, up to 40), with a line for
    each z3 proof skipped (a schedule too big for z3, which the simulator proves alone: not a
    failure); a summary line; exit 1 if any is wrong, 2 if any is unreadable."""
    lines: list[ProofRow | Skipped | str] = []
    failed: list[tuple[Path, StragglarError]] = []
    with progress_bar(len(files), "proving files") as bar:
        for path in files:
            try:
                lines += _file_rows(path)
            except StragglarError as e:
                failed.append((path, e))
                failure = f"FAILED {shown(path, limit=None)}"
                lines.append(f"{failure}: {str(e).splitlines()[0]}" if verbose else failure)
            bar.advance()
    widths = [len(line.algorithm) for line in lines if isinstance(line, ProofRow)]
    width = min(ALGORITHM_MAX_WIDTH, max([ALGORITHM_WIDTH, *widths]))
    echo(table_header(width))
    for line in lines:
        if isinstance(line, ProofRow):
            echo(format_row(line, width))
        else:
            echo(line.line if isinstance(line, Skipped) else line)
    if not failed:
        skipped = sum(isinstance(line, Skipped) for line in lines)
        alone = f", {skipped} by the simulator alone (too big for z3)" if skipped else ""
        echo(f"proved all {count_of(len(files), 'file')}{alone}")
        return
    names = ", ".join(shown(p) for p, _ in failed[:3]) + (
        f" and {len(failed) - 3} more" if len(failed) > 3 else ""
    )
    summary = f"{len(failed)} of {len(files)} files failed: {names}"
    if not verbose:
        summary += " (-v says why)"
    worst = max(e.exit_code for _, e in failed)
    raise (InputError if worst == InputError.exit_code else IncorrectError)(summary[:200])


def _file_rows(path: Path) -> list[ProofRow | Skipped]:
    found = read_input(path)
    if found.format is not None:
        proof = proved_artifact(found.format, found.source, shown(path))
        return [ProofRow.for_artifact(proof, found.format.name, shown(path.name, limit=None))]
    assert found.schedule is not None  # a file of no artifact format is a schedule
    return list(prove_schedule_file(found.schedule, shown(path.name, limit=None)))
