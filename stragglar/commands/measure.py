"""``run`` and ``bench``: time schedules on real data against the engine's own AllReduce."""

from __future__ import annotations

from pathlib import Path

import click

from stragglar.commands.inputs import load_schedule
from stragglar.commands.options import (
    ALGORITHM,
    BANDWIDTH,
    DURATION,
    INPUT,
    MEASURED_CHUNKS,
    OUTPUT,
    SIZE,
    STRAGGLER,
    TIMEOUT,
    WHOLE,
    Quantity,
    Whole,
    auto_note,
    chosen_chunks,
    chunks_option,
    once_each,
    refuse_given,
)
from stragglar.commands.outputs import check_output, dump_json, to_stdout
from stragglar.commands.proofs import proved
from stragglar.commands.terminal import echo, progress_bar
from stragglar.errors import InputError, quoted
from stragglar.measure.links import check_link_rate
from stragglar.measure.run import (
    BACKENDS,
    GRAPH_BACKENDS,
    IN_PROCESS_BACKENDS,
    MAX_ITERS,
    BenchmarkResult,
    check_backend,
    check_dtype,
    check_run_size,
    has_straggler,
    run_benchmark,
)
from stragglar.measure.sweep import sweep
from stragglar.model import AUTO, PAPER_NETWORK, Network
from stragglar.runtime import DTYPES
from stragglar.synth import check_ranks
from stragglar.units import parse_duration, parse_size

__all__ = ["bench", "run"]

LINK_RATE = click.option(
    "--link-rate",
    type=BANDWIDTH,
    help="Pace every rank's sockets to this bandwidth (torch backend: gloo's sockets): each rank gets a "
    "link of its own, as the cost model assumes, instead of the host's shared loopback.",
)
PRICED_ALPHA = click.option(
    "--alpha",
    type=DURATION,
    help="With --chunks auto: the latency of one message on the network the run prices (default: the "
    "paper's 3us; needed with --link-rate, as gloo's is about 1ms: `stragglar bench --backend torch "
    "--link-rate R` prints the alpha it fits).",
)
BACKEND_HELP = (
    "local: NumPy, all ranks in one process; torch: gloo ranks on the CPU; nccl: torch ranks on NCCL, "
    "rank r on GPU r mod the GPU count; cupy: CuPy, all ranks in one process on one GPU; device: as nccl, "
    "each rank's AllReduce one kernel launch reaching its peers' memory through CUDA IPC."
)

NO_GRAPHS = click.option(
    "--no-graphs",
    is_flag=True,
    help="nccl and cupy backends: launch every round's kernels eagerly each iteration instead of "
    "replaying them from a CUDA graph (captured on the second call).",
)

PEER_TIMEOUT = click.option(
    "--timeout",
    type=TIMEOUT,
    default="60s",
    show_default=True,
    help="Give up on a silent peer after this long: a bound on each wait for a peer, not on the run "
    "(the z3 commands' --timeout is a budget for the whole search instead, 600s by default for "
    "synth and bound).",
)


@click.command()
@click.option("--backend", type=click.Choice(BACKENDS), default="local", show_default=True, help=BACKEND_HELP)
@click.option(
    "--gpus",
    "-n",
    "num_gpus",
    type=WHOLE,
    metavar="N",
    help="Number of ranks (with --schedule: from the file).",
)
@click.option("--size", type=SIZE, default="64MiB", show_default=True, help="Buffer size per rank (a size).")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option(
    "--delay", type=DURATION, default="0ms", show_default=True, help="How late the straggler arrives."
)
@ALGORITHM
@STRAGGLER
@chunks_option(MEASURED_CHUNKS)
@click.option("--schedule", "schedule_file", type=INPUT, help="Run this JSON schedule file.")
@click.option("--iters", type=Whole(1, MAX_ITERS), default=5, show_default=True)
@PEER_TIMEOUT
@LINK_RATE
@PRICED_ALPHA
@NO_GRAPHS
def run(
    backend: str,
    num_gpus: int | None,
    size: int,
    dtype: str,
    delay: float,
    algorithm: str,
    straggler: int | None,
    chunks: int | str | None,
    schedule_file: Path | None,
    iters: int,
    timeout: float,
    link_rate: float | None,
    alpha: float | None,
    no_graphs: bool,
) -> None:
    """Run a schedule on real data and compare it with the engine's own AllReduce.

    Every rank gets distinct values per element; every result is checked against a NumPy
    reference.  Prints the median time per iteration and the algorithm bandwidth of each.  With
    --chunks, StragglAR in C chunks, the paper's StragglAR (C = N-1) and the baseline alternate
    in one launch of the ranks, and the chunked one's speed-up over the paper's is printed too.
    """
    _refuse_inapplicable(backend)
    check_dtype(backend, dtype)  # before any work: NumPy has no bfloat16
    if link_rate is not None:
        check_link_rate(link_rate)
    if schedule_file is not None:
        refuse_given(["algorithm", "straggler", "chunks"], f"the schedule comes from {schedule_file}")
        check_output(Path("-"), schedule_file)  # `run --schedule s.json >> s.json` would append to it
    elif num_gpus is None:
        raise click.UsageError("--gpus is required (or give a --schedule file)")
    network, where = _priced_network(chunks, link_rate, alpha)
    check_backend(backend)  # every option checked, no work done yet: a missing library, no GPU for nccl
    proof = None
    if schedule_file is not None:
        schedule = load_schedule(schedule_file, "run")
        check_run_size(schedule.num_ranks, schedule.num_chunks)  # before it is proved
        proof = proved(schedule, str(schedule_file))
        if num_gpus is not None and num_gpus != proof.num_ranks:
            raise InputError(f"--gpus {num_gpus} but {schedule_file} is for {proof.num_ranks} ranks")
        num_gpus = proof.num_ranks
    else:  # before a chunk count is priced (the run checks the count it gets)
        assert num_gpus is not None  # refused above otherwise
        check_run_size(num_gpus, check_ranks(algorithm, num_gpus).num_chunks)
        if delay == 0 and not has_straggler(algorithm):  # --straggler names the late rank: there is none
            refuse_given(["straggler"], f"{algorithm} has no straggler and with --delay 0 no rank is late")
    num_chunks = chosen_chunks(chunks, num_gpus, size, delay, network, algorithm=algorithm)
    if num_chunks is not None and chunks == AUTO:
        echo(auto_note(num_chunks, size, delay, network, where), err=True)
    # a bar moved by the run's own loop, no thread: the torch backend forks its ranks
    with progress_bar(None, f"running {num_gpus} ranks on {backend}") as bar:
        result = run_benchmark(
            backend,
            num_gpus,
            size,
            dtype,
            delay,
            algorithm=algorithm,
            proof=proof,
            chunks=num_chunks,
            straggler=straggler,
            iters=iters,
            timeout=timeout,
            link_rate=link_rate,
            tick=bar.tick,
            graphs=False if no_graphs else None,
        )
    echo(result.report())


@click.command()
@click.option("--backend", type=click.Choice(BACKENDS), default="torch", show_default=True, help=BACKEND_HELP)
@click.option(
    "--gpus", "-n", default="4,8", show_default=True, metavar="N[,N...]", help="Rank counts, comma-separated."
)
@click.option(
    "--sizes",
    type=Quantity("size", parse_size, many=True),
    default="16MiB,64MiB",
    show_default=True,
    help="Buffer sizes per rank, comma-separated.",
)
@click.option(
    "--delays",
    type=Quantity("duration", parse_duration, many=True),
    default="0ms,50ms,200ms",
    show_default=True,
    help="Straggler delays, comma-separated.",
)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@ALGORITHM
@chunks_option(f"per setting, {MEASURED_CHUNKS}")
@click.option("--iters", type=Whole(1, MAX_ITERS), default=5, show_default=True)
@PEER_TIMEOUT
@LINK_RATE
@PRICED_ALPHA
@NO_GRAPHS
@click.option(
    "--json",
    "json_file",
    type=OUTPUT,
    help="Also save the results (-: the JSON on stdout, the table on stderr).",
)
def bench(
    backend: str,
    gpus: str,
    sizes: list[int],
    delays: list[float],
    dtype: str,
    algorithm: str,
    chunks: int | str | None,
    iters: int,
    timeout: float,
    link_rate: float | None,
    alpha: float | None,
    no_graphs: bool,
    json_file: Path | None,
) -> None:
    """Measure a grid of settings against the engine's own AllReduce.

    Prints, per setting, both median times and the per-iteration ratio (median, min-max); with
    the torch backend and a 0 ms delay among two or more sizes, also what the alpha-beta model
    predicts with the network fitted to gloo's own times.  With --chunks, StragglAR in C chunks
    runs in the same iterations, with columns of its own: its C, time, ratio to the baseline and
    the paper's StragglAR (C = N-1) over it.
    """
    _refuse_inapplicable(backend)
    check_dtype(backend, dtype)  # before any work: NumPy has no bfloat16
    if link_rate is not None:
        check_link_rate(link_rate)
    if json_file is not None:
        check_output(json_file, option="--json")

    network, _ = _priced_network(chunks, link_rate, alpha)

    def count_for(num_gpus: int, size: int, delay: float) -> int | None:
        return chosen_chunks(chunks, num_gpus, size, delay, network, algorithm=algorithm)

    counts = _rank_counts(gpus)
    check_backend(backend)  # every option checked first: a missing library, no GPU for nccl
    with progress_bar(len(counts) * len(sizes) * len(delays), "measuring", after=0, slow=True) as bar:

        def finished(r: BenchmarkResult) -> None:
            bar.say(r.progress_line())  # each row as it is measured; the table comes at the end
            bar.advance()

        result = sweep(
            backend,
            counts,
            sizes,
            delays,
            algorithm=algorithm,
            chunks=None if chunks is None else count_for,
            dtype=dtype,
            iters=iters,
            timeout=timeout,
            progress=finished,
            link_rate=link_rate,
            tick=bar.tick,
            graphs=False if no_graphs else None,
        )
    json_on_stdout = to_stdout(json_file)
    echo(result.table(), err=json_on_stdout)
    if json_file is not None:
        dump_json(json_file, result.to_json())
        if not json_on_stdout:
            echo(f"results written to {json_file}")


def _priced_network(
    chunks: int | str | None, link_rate: float | None, alpha: float | None
) -> tuple[Network, str]:
    """The network ``--chunks auto`` prices for a measured run, and how its note says so: the
    paper's, or with ``--link-rate`` the links the ranks were paced to, each with ``--alpha`` where
    given.  Paced links need an alpha of their own: priced with the paper's 3 us (about 300x below
    gloo's) every extra chunk looked free, and auto chose the slowest count it could."""
    if chunks != AUTO:
        refuse_given(["alpha"], "it is a setting of the network --chunks auto prices")
    if link_rate is None:
        if alpha is None:
            return PAPER_NETWORK, " on the paper's network"
        return Network(alpha, PAPER_NETWORK.bandwidth), " on the paper's bandwidth with --alpha"
    if alpha is None and chunks == AUTO:
        raise click.UsageError(
            "--chunks auto with --link-rate needs --alpha, the paced links' latency per message: gloo's "
            "is about 1ms (`stragglar bench --backend torch --link-rate R` prints the alpha it fits), "
            "not the paper's 3us"
        )
    return Network(
        PAPER_NETWORK.alpha if alpha is None else alpha, link_rate
    ), " on the paced links (--link-rate, --alpha)"


def _refuse_inapplicable(backend: str) -> None:
    """--timeout bounds the waits of ranks that are processes (torch, nccl); --no-graphs applies where
    CUDA graphs replay rounds (nccl, cupy); --link-rate paces gloo's sockets (torch), which NCCL's
    ranks do not use (their data moves over NVLink or PCIe,
    or NCCL's own sockets where ranks share a GPU, which it cannot pace)."""
    if backend in IN_PROCESS_BACKENDS:
        why = f"it bounds the waits of ranks in processes of their own (torch, nccl), not --backend {backend}"
        refuse_given(["timeout"], why)
    if backend != "torch":
        refuse_given(["link_rate"], f"it paces the torch backend's gloo sockets, not --backend {backend}")
    if backend not in GRAPH_BACKENDS:
        refuse_given(["no_graphs"], f"CUDA graphs replay the nccl and cupy backends' rounds, not {backend}'s")


def _rank_counts(text: str) -> list[int]:
    """``--gpus 4,8``: whole numbers in ASCII digits (``int()`` also takes ``4_0`` and ``٨``), each
    once."""
    items = [x.strip() for x in text.split(",")]
    if not all(x.isascii() and x.isdigit() for x in items):
        raise click.BadParameter(f"expected rank counts like 4,8, got {quoted(text)}", param_hint="'--gpus'")
    try:
        return once_each([int(x) for x in items], items, "rank count")
    except InputError as e:
        raise click.BadParameter(str(e), param_hint="'--gpus'") from None
