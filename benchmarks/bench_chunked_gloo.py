"""Chunked StragglAR against the paper's C = N-1 and gloo's all_reduce on CPU, beside the fitted model.

    python benchmarks/bench_chunked_gloo.py [--gpus 4 8] [--sizes 64MiB 256MiB] [--iters 5]
        [--link-rate 200MB/s] [--json out.json]

Two runs of :func:`~stragglar.measure.run.run_benchmark` on the torch backend (gloo ranks on
127.0.0.1) per N:

1. Calibration, nobody late: per size of ``--sizes`` and ``--fit-sizes``, the paper's StragglAR
   and gloo's all_reduce alternate, ``--iters`` times.  gloo's medians at the fit sizes (1 to
   64 MiB) fit the Ring model by least squares (:func:`~stragglar.measure.sweep.fit_ring`, as
   ``stragglar bench`` does); the paper schedule's hidden phase, its ReduceScatter among the
   punctual ranks, gives the ReduceScatter time ``RS`` of each measured size.  The fit leaves
   256 MiB out: there gloo's time grows faster than the size here (8 ranks' buffers press on
   memory), and a least-squares line through it had its alpha clamped to 0 in 2 of 4 runs.  A
   fit without latency still stops the benchmark, as on it the model takes every extra chunk as
   free and would cut the buffer as finely as allowed.
2. Measurement: the straggler is ``--delay-factor`` (1.5) x ``RS`` late, so both schedules'
   ReduceScatter can hide behind it.  StragglAR in C chunks (C: the cost model's fastest on the
   fitted network, :func:`~stragglar.model.chunks.best_chunks`), the paper's C = N-1 and gloo's
   all_reduce alternate in one launch, in a rotating order, every result checked.

``--link-rate`` paces every rank's sockets to that bandwidth (:mod:`stragglar.measure.links`):
each rank gets a link of its own, the network the cost model prices, instead of the host's
loopback, where the cores copy every rank's bytes and the total bytes of a round cost, whatever
the busiest rank's.  The calibration and the measurement both run on the paced links.

The printed ratios are per iteration (the schedules ran in the same iteration): "N-1 / C" is
the paper's time over the chunked one's, from the common start (the delay included) and after
the straggler arrives (the delay taken off); beside each, the model's on the fitted network.
The target (issue 14): at the largest size the measured gain after the straggler arrives is at
least half the model's, (measured - 1) >= (model - 1) / 2.  Needs torch and about 9 GiB of
memory for 8 ranks at 256 MiB.

``--json`` saves the fits and a row per setting, the table's figures in seconds.  Where the
model chose C = N-1 the chunked schedule is the paper's: its fields (``chunked``,
``hidden_chunked``, ``gain``, ``gain_exposed``, ``model_gain``, ``model_gain_exposed``) are null,
as the table's dashes, not the paper's run against itself (a gain of 1.0).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from options import (
    Parser,
    as_command,
    byte_size,
    duration,
    each,
    json_output,
    link_rate,
    note,
    positive_number,
    whole,
)
from results import save

from stragglar.commands.terminal import busy
from stragglar.errors import InputError, ResourceError
from stragglar.measure.links import paced_to
from stragglar.measure.memory import check_host_memory
from stragglar.measure.run import BenchmarkResult, element_count, run_benchmark
from stragglar.measure.sweep import fit_line, fit_ring
from stragglar.model import Network, best_chunks, compare_generated
from stragglar.units import format_bytes


@dataclass(frozen=True)
class Row:
    n: int
    size_bytes: int
    reduce_scatter: float  # seconds: the paper schedule's hidden phase when nobody is late
    delay: float
    chunks: int
    gloo: float  # medians, seconds
    paper: float
    chunked: float
    hidden_paper: float  # when the punctual ranks finished the hidden phase in the measured run
    hidden_chunked: float
    gain: tuple[float, float, float]  # N-1 / C per iteration, delay included: median, min, max
    gain_exposed: tuple[float, float, float]  # the same after the straggler arrives
    model_gain: float
    model_gain_exposed: float

    @property
    def target_met(self) -> bool:
        return self.gain_exposed[0] - 1 >= (self.model_gain_exposed - 1) / 2


COMPARED = ("chunked", "hidden_chunked", "gain", "gain_exposed", "model_gain", "model_gain_exposed")


def as_json(r: Row) -> dict[str, object]:
    """A row for ``--json``: :data:`COMPARED` null where the model chose C = N-1 (the dashes of
    :func:`cells`); they held the paper's run against itself, ``gain: [1.0, ...]``."""
    row = asdict(r)
    if r.chunks == r.n - 1:
        row |= dict.fromkeys(COMPARED)
    return row


def per_iteration(
    slower: tuple[float, ...], faster: tuple[float, ...], less: float
) -> tuple[float, float, float]:
    ratios = [(a - less) / (b - less) for a, b in zip(slower, faster, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def calibrate(
    n: int, sizes: list[int], fit_sizes: list[int], iters: int, timeout: float, link_rate: float | None
) -> tuple[Network, dict[int, float]]:
    """The Ring network fitted to gloo's delay-0 medians at ``fit_sizes``, and the ReduceScatter
    time at each of ``sizes``."""
    runs = {
        s: run_benchmark("torch", n, s, iters=iters, timeout=timeout, link_rate=link_rate)
        for s in each(sorted({*sizes, *fit_sizes}), lambda s: f"calibrating N = {n}, {format_bytes(s)}")
    }
    for s, r in runs.items():
        note(
            f"  calibration N={n} {format_bytes(s)}: gloo {r.baseline_time * 1e3:.1f} ms, "
            f"StragglAR {r.time * 1e3:.1f} ms, its ReduceScatter {statistics.median(r.hidden) * 1e3:.1f} ms"
        )
    net = fit_ring(n, [(s, runs[s].baseline_time) for s in fit_sizes])
    if net is None or net.alpha == 0:
        why = "did not grow with the size" if net is None else "grew faster than the size (alpha 0)"
        raise SystemExit(f"N={n}: gloo's times {why}: no usable Ring fit, measure again")
    return net, {s: statistics.median(runs[s].hidden) for s in sizes}


def measure(
    n: int,
    size: int,
    rs: float,
    net: Network,
    factor: float,
    iters: int,
    timeout: float,
    link_rate: float | None,
) -> Row:
    delay = math.ceil(factor * rs * 1e3) / 1e3  # whole milliseconds
    c = best_chunks(n, size, delay, net)
    with busy(f"N = {n}, {format_bytes(size)}: C = {c} against N-1 and gloo"):
        r: BenchmarkResult = run_benchmark(
            "torch", n, size, delay=delay, chunks=c, iters=iters, timeout=timeout, link_rate=link_rate
        )
    chunked, paper = r.variants[0], r.variants[-1]
    model = compare_generated(n, size, delay, net, ("stragglar",), chunks=c)
    ours, theirs = model.get(chunked.name), model.get("stragglar")
    return Row(
        n,
        size,
        rs,
        delay,
        c,
        r.baseline_time,
        paper.time,
        chunked.time,
        statistics.median(paper.hidden),
        statistics.median(chunked.hidden),
        per_iteration(paper.times, chunked.times, 0.0),
        per_iteration(paper.times, chunked.times, delay),
        theirs.time / ours.time,
        theirs.exposed / ours.exposed,
    )


def spread(x: tuple[float, float, float]) -> str:
    return f"{x[0]:.2f}x [{x[1]:.2f}-{x[2]:.2f}]"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}"


def cells(r: Row) -> list[str]:
    """A row's cells; dashes where the model chose C = N-1 (the paper's schedule: nothing to compare)."""
    head = [str(r.n), format_bytes(r.size_bytes), ms(r.reduce_scatter), ms(r.delay)]
    if r.chunks == r.n - 1:
        return [*head, f"{r.chunks} = N-1", ms(r.gloo), ms(r.paper), "-", f"{ms(r.hidden_paper)} / -"] + [
            "-"
        ] * 4
    return [
        *head,
        str(r.chunks),
        ms(r.gloo),
        ms(r.paper),
        ms(r.chunked),
        f"{ms(r.hidden_paper)} / {ms(r.hidden_chunked)}",
        spread(r.gain),
        f"{r.model_gain:.2f}x",
        spread(r.gain_exposed),
        f"{r.model_gain_exposed:.2f}x",
    ]


def table(rows: list[Row], fits: dict[int, Network], link_rate: float | None) -> str:
    lines = [fit_line("gloo all_reduce", n, net) for n, net in fits.items()]
    if link_rate is not None:
        lines.insert(0, f"every rank's {paced_to(link_rate)}")
    lines += [
        "",
        "| N | size | RS (ms) | delay (ms) | C | gloo (ms) | C = N-1 (ms) | chunked (ms) "
        "| hidden N-1 / C (ms) | N-1 / C measured | model | N-1 / C after the straggler | model |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|",
    ]
    lines += [f"| {' | '.join(cells(r))} |" for r in rows]
    largest = max(r.size_bytes for r in rows)
    for r in rows:
        if r.size_bytes == largest:
            where = f"target at N={r.n}, {format_bytes(largest)}"
            if r.chunks == r.n - 1:
                lines.append(f"{where}: the model chose C = N-1, nothing to compare")
                continue
            verdict = "met" if r.target_met else "not met"
            lines.append(
                f"{where}: measured gain {r.gain_exposed[0] - 1:+.1%} after the straggler, "
                f"model {r.model_gain_exposed - 1:+.1%}; at least half: {verdict}"
            )
    late = [r for r in rows if max(r.hidden_paper, r.hidden_chunked) > r.delay]
    lines += [
        f"note: N={r.n} {format_bytes(r.size_bytes)}: a ReduceScatter outlasted the delay" for r in late
    ]
    return "\n".join(lines)


def check_sizes(gpus: list[int], sizes: list[int]) -> None:
    """Refuse, before the calibration, a size ``stragglar bench`` would refuse (not a whole
    number of float32 elements) or a run this host cannot hold, as ``bench`` refuses it
    (:func:`~stragglar.measure.memory.check_host_memory`): 99999GiB ran the whole calibration of
    the smaller sizes, then died in NumPy's allocation."""
    for size in sizes:
        element_count(size, "float32")
    check_host_memory(max(gpus), element_count(max(sizes), "float32"), "float32", on_host=True)


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_gpus(default=[4, 8], says="gloo ranks on this host", parse=whole(2, 64))
    parser.add_argument(
        "--sizes",
        type=byte_size,
        nargs="+",
        default=[64 * 2**20, 256 * 2**20],
        metavar="SIZE",
        help="buffer sizes",
    )
    parser.add_argument(
        "--fit-sizes",
        type=byte_size,
        nargs="+",
        default=[2**20, 4 * 2**20, 16 * 2**20, 64 * 2**20],
        metavar="SIZE",
        help="the sizes gloo's times are fitted at",
    )
    parser.add_argument(
        "--delay-factor", type=positive_number, default=1.5, help="delay / the ReduceScatter time"
    )
    parser.add_argument("--iters", type=whole(1, 10**4), default=5, help="timed pairs per setting")
    parser.add_argument(
        "--timeout",
        type=duration(positive=True),
        default="300s",
        help="a rank's wait for a silent peer",
    )
    parser.add_argument(
        "--link-rate", type=link_rate, help="pace every rank's sockets to this bandwidth (e.g. 200MB/s)"
    )
    parser.add_argument(
        "--json", type=json_output, metavar="FILE", help="write the rows and the machine to this file"
    )
    args = parser.parse_args()
    if len(set(args.fit_sizes)) < 2:
        parser.error("--fit-sizes: the Ring model's two figures need two sizes or more")
    try:
        check_sizes(args.gpus, [*args.sizes, *args.fit_sizes])
    except (InputError, ResourceError) as e:
        parser.error(str(e))
    rows: list[Row] = []
    fits: dict[int, Network] = {}
    for n in args.gpus:
        net, rs = calibrate(n, args.sizes, args.fit_sizes, args.iters, args.timeout, args.link_rate)
        if args.link_rate is not None and net.bandwidth > 1.5 * args.link_rate:
            raise SystemExit(
                f"N={n}: gloo's fitted bandwidth {format_bytes(net.bandwidth)}/s is far above the "
                f"{format_bytes(args.link_rate)}/s links: the kernel did not pace them (Linux < 4.13 "
                "paces only under the fq qdisc)"
            )
        fits[n] = net
        for size in args.sizes:
            rows.append(
                measure(n, size, rs[size], net, args.delay_factor, args.iters, args.timeout, args.link_rate)
            )
            note(f"  N={n} {format_bytes(size)}: C = {rows[-1].chunks}, N-1 / C {spread(rows[-1].gain)}")
    print(table(rows, fits, args.link_rate))
    if args.json:
        doc = {"fits": {str(n): asdict(net) for n, net in fits.items()}, "rows": [as_json(r) for r in rows]}
        save(
            args.json,
            {
                **doc,
                "iters": args.iters,
                "delay_factor": args.delay_factor,
                "fit_sizes": args.fit_sizes,
                "link_rate": args.link_rate,
            },
        )


if __name__ == "__main__":
    as_command(main)
