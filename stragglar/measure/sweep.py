"""``stragglar bench``: a grid of measured runs, as ratios with their spread, beside the model.

Each setting (ranks, size, delay) is one :func:`~stragglar.measure.run.run_benchmark`: every
iteration runs the schedule and the engine's own AllReduce (in an order that rotates), both
after the straggler's delay and both checked, so the pair alternates within one run and sees the
same machine state.  The ratio baseline / schedule is taken per iteration (the pair ran back to
back) and reported as its
median with the min-max spread: on a shared machine single iterations vary a lot.

With a chunk count per setting (``chunks``), StragglAR in that many chunks runs in the same
iterations as the paper's C = N-1 schedule and the baseline (one launch, a rotating order), and
its columns come beside theirs: its ratio to the baseline and the paper's schedule over it, per
iteration.

The model column: when the baseline is a ring AllReduce (gloo's, on the torch backend), a Ring
alpha-beta model ``T = 2(N-1) alpha + 2(N-1)/N * size / bandwidth`` is fitted per N by least
squares to the baseline's delay-0 medians over the sizes measured (two sizes determine it), and
the same network prices both schedules at each setting (:mod:`stragglar.model.predict`).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from stragglar.args import MAX_DELAY, as_seconds
from stragglar.errors import InputError
from stragglar.measure.gpus import sharing_note
from stragglar.measure.links import paced_to
from stragglar.measure.memory import check_host_memory
from stragglar.measure.run import (
    HOST_BACKENDS,
    IN_ONE_PROCESS,
    IN_PROCESS_BACKENDS,
    BenchmarkResult,
    check_backend,
    check_graphs,
    check_run_size,
    element_count,
    run_benchmark,
)
from stragglar.model import Network, compare_generated, generated_profile
from stragglar.model.cost import fitted_network
from stragglar.synth import check_request
from stragglar.units import format_bytes, format_ratio

__all__ = ["ChunkPolicy", "Chunked", "Setting", "SweepResult", "fit_line", "fit_ring", "machine", "sweep"]

RING_BASELINES = ("torch",)  # backends whose baseline AllReduce is a ring (NCCL picks ring, tree or others)


@dataclass(frozen=True)
class Setting:
    """One measured point: medians in seconds, the per-iteration ratio's median and spread."""

    num_ranks: int
    size_bytes: int
    delay: float
    time: float
    baseline_time: float
    ratio: float  # baseline / schedule: > 1 means the schedule was faster
    ratio_min: float
    ratio_max: float
    predicted: float | None  # the model's Ring / schedule completion-time ratio
    chunked: Chunked | None = None  # with a chunk count: StragglAR in C chunks, same iterations


@dataclass(frozen=True)
class Chunked:
    """StragglAR in ``chunks`` chunks at a setting: its median seconds, the per-iteration ratio
    baseline / chunked (median, min, max), the paper's schedule over it per iteration (> 1: the
    chunks helped), and the model's paper / chunked completion-time ratio.  With ``chunks`` = N-1
    it is the paper's schedule itself, measured once: these are its figures, the gain exactly 1."""

    chunks: int
    time: float
    ratio: float
    ratio_min: float
    ratio_max: float
    gain: float
    gain_min: float
    gain_max: float
    predicted_gain: float | None


@dataclass(frozen=True)
class SweepResult:
    backend: str
    algorithm: str
    baseline: str
    dtype: str
    iters: int
    settings: tuple[Setting, ...]
    fits: dict[int, Network | None]  # per N when a Ring fit was tried; None: it failed
    date: str  # when and where it was measured, kept with the figures
    machine: str
    link_rate: float | None = None  # bytes/s every rank's sockets were paced to, if they were
    gpus: int | None = None  # the GPUs the nccl backend's ranks were placed on

    def table(self) -> str:
        """The results as a Markdown table, the fitted networks (and paced links) above it."""
        fits = [fit_line(self.baseline, n, net) for n, net in self.fits.items()]
        if self.link_rate is not None:
            fits.insert(0, f"every rank's {paced_to(self.link_rate)}")
        ours, theirs = self.algorithm, self.baseline
        rows = [
            f"| N | size | delay (ms) | {ours} (ms) | {theirs} (ms) "
            f"| {theirs} / {ours}: ratio of the medians | per-iteration ratio: median [min-max] | model |",
            "|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        chunked = any(s.chunked is not None for s in self.settings)
        if chunked:
            rows[0] += (
                f" C | {ours} C (ms) | {theirs} / {ours} C: per-iteration [min-max] "
                f"| {ours} / {ours} C: per-iteration [min-max] | model: {ours} / {ours} C |"
            )
            rows[1] += "---:|---:|---|---|---:|"
        for s in self.settings:
            rows.append(
                f"| {s.num_ranks} | {format_bytes(s.size_bytes)} | {s.delay * 1e3:g} | {s.time * 1e3:.1f} "
                f"| {s.baseline_time * 1e3:.1f} | {format_ratio(s.baseline_time / s.time)}x "
                f"| {_spread(s.ratio, s.ratio_min, s.ratio_max)} | {_times(s.predicted)} |"
                + (_chunked_cells(s.chunked) if chunked else "")
            )
        head = [*fits, ""] if fits else []
        tail = ["", IN_ONE_PROCESS] if self.backend in IN_PROCESS_BACKENDS else []
        most = max(s.num_ranks for s in self.settings)
        note = None if self.gpus is None else sharing_note(most, self.gpus, self.backend)
        tail += ["", note] if note is not None else []
        return "\n".join(head + rows + tail)

    def to_json(self) -> dict[str, object]:
        return {
            **{k: v for k, v in asdict(self).items() if k not in ("settings", "fits")},
            "fits": {str(n): asdict(net) if net else None for n, net in self.fits.items()},
            "settings": [asdict(s) for s in self.settings],
        }


def _spread(median: float, low: float, high: float) -> str:
    return f"{format_ratio(median)}x [{format_ratio(low)}-{format_ratio(high)}]"


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{format_ratio(ratio)}x"


def _chunked_cells(c: Chunked | None) -> str:
    """The chunked schedule's cells of a row (dashes where the setting ran without it)."""
    if c is None:
        return " - | - | - | - | - |"
    return (
        f" {c.chunks} | {c.time * 1e3:.1f} | {_spread(c.ratio, c.ratio_min, c.ratio_max)} "
        f"| {_spread(c.gain, c.gain_min, c.gain_max)} | {_times(c.predicted_gain)} |"
    )


def fit_line(baseline: str, num_ranks: int, net: Network | None) -> str:
    """``gloo all_reduce fit, N=4: alpha 2400 us, bandwidth 1.03 GB/s``, or why there is none."""
    figures = (
        f"alpha {net.alpha * 1e6:.0f} us, bandwidth {net.bandwidth / 1e9:.2f} GB/s"
        if net is not None
        else "none (its times did not grow with the size: measure sizes further apart)"
    )
    return f"{baseline} fit, N={num_ranks}: {figures}"


def fit_ring(num_ranks: int, points: Sequence[tuple[int, float]]) -> Network | None:
    """Least-squares alpha and bandwidth of a Ring AllReduce from (bytes, seconds) pairs.

    >>> net = fit_ring(4, [(2**20, 6e-3 + 1.5 * 2**20 / 1e9), (2**24, 6e-3 + 1.5 * 2**24 / 1e9)])
    >>> round(net.alpha * 1e3, 6), round(net.bandwidth / 1e9, 6)
    (1.0, 1.0)
    """
    if len({size for size, _ in points}) < 2:
        return None
    n = num_ranks
    a = np.array([[2 * (n - 1), 2 * (n - 1) / n * size] for size, _ in points])
    (alpha, beta), *_ = np.linalg.lstsq(a, np.array([t for _, t in points]), rcond=None)
    return fitted_network(max(float(alpha), 0.0), 1.0 / float(beta)) if beta > 0 else None


ChunkPolicy = Callable[[int, int, float], int | None]
"""StragglAR's chunk count for a setting: (ranks, bytes, delay in seconds) -> C (None: none)."""


def sweep(
    backend: str,
    gpus: Sequence[int],
    sizes: Sequence[int],
    delays: Sequence[float],
    *,
    algorithm: str = "stragglar",
    chunks: ChunkPolicy | None = None,
    dtype: str = "float32",
    iters: int = 5,
    timeout: float = 60.0,
    progress: Callable[[BenchmarkResult], None] | None = None,
    link_rate: float | None = None,
    tick: Callable[[], None] | None = None,
    graphs: bool | None = None,
) -> SweepResult:
    """Measure every (ranks, size in bytes, delay in seconds) setting; see the module docstring.

    Every chunk count is chosen, and its schedule synthesized, before the first measurement, so
    that a count the schedules cannot have fails at once, not after part of the grid has run.
    ``link_rate``: every rank's sockets paced to it, and ``tick``: called while a setting runs,
    and ``graphs``, as in :func:`~stragglar.measure.run.run_benchmark`; ``progress``: called after
    each setting.
    """
    check_graphs(backend, graphs)
    check_backend(backend)  # a backend that cannot run here, before any schedule is made
    if not gpus or not sizes or not delays:
        raise InputError("need at least one rank count, size and delay")
    grid = [(n, size, delay) for n in gpus for size in sizes for delay in delays]
    counts: dict[tuple[int, int, float], int | None] = {key: None for key in grid}
    for n in dict.fromkeys(gpus):  # each rank count and delay a run would refuse, before the first runs
        check_run_size(n, check_request(algorithm, n).num_chunks)
    for delay in delays:
        as_seconds(delay, "delay", maximum=MAX_DELAY)
    for size in sizes:
        element_count(size, dtype)
    largest = element_count(max(sizes), dtype)
    check_host_memory(max(gpus), largest, dtype, on_host=backend in HOST_BACKENDS)  # before any run
    if chunks is not None:
        counts = {key: chunks(*key) for key in grid}
        for (n, _, _), c in counts.items():
            check_run_size(n, n - 1 if c is None else c)
        for (n, _, _), c in counts.items():
            generated_profile(algorithm, n, c)  # synthesized now (or refused); cached for the model
    results: dict[tuple[int, int, float], BenchmarkResult] = {}
    for key in grid:
        n, size, delay = key
        r = run_benchmark(
            backend,
            n,
            size,
            dtype,
            delay,
            algorithm=algorithm,
            chunks=counts[key],
            iters=iters,
            timeout=timeout,
            link_rate=link_rate,
            tick=tick,
            graphs=graphs,
        )
        results[key] = r
        if progress is not None:
            progress(r)
    fits: dict[int, Network | None] = {}
    if backend in RING_BASELINES and 0.0 in delays and len(set(sizes)) > 1:
        fits = {n: fit_ring(n, [(s, results[n, s, 0.0].baseline_time) for s in sizes]) for n in gpus}
    settings = [_setting(key, r, algorithm, fits.get(key[0]), counts[key]) for key, r in results.items()]
    first = next(iter(results.values()))
    return SweepResult(
        backend,
        algorithm,
        first.baseline,
        dtype,
        iters,
        tuple(settings),
        fits,
        dt.date.today().isoformat(),
        machine(),
        link_rate,
        first.gpus,
    )


def _setting(
    key: tuple[int, int, float], r: BenchmarkResult, algorithm: str, net: Network | None, chunks: int | None
) -> Setting:
    """A measured setting's figures; the paper's schedule runs last when a chunked one ran first."""
    n, size, delay = key
    paper = r.variants[-1]
    model = None if net is None else compare_generated(n, size, delay, net, (algorithm,), chunks=chunks)
    chunked = None
    if chunks is not None:
        ours = r.variants[0]
        chunked = Chunked(
            chunks,
            ours.time,
            *_per_iteration(r.baseline_times, ours.times),
            *_per_iteration(paper.times, ours.times),
            None if model is None else model.get(algorithm).time / model.get(ours.name).time,
        )
    return Setting(
        n,
        size,
        delay,
        paper.time,
        r.baseline_time,
        *_per_iteration(r.baseline_times, paper.times),
        None if model is None else model.get("ring").time / model.get(algorithm).time,
        chunked,
    )


def _per_iteration(slower: Sequence[float], faster: Sequence[float]) -> tuple[float, float, float]:
    """Median, min and max of the per-iteration ratio ``slower / faster`` (the pair ran in the
    same iteration, so their ratio is steadier than the ratio of two medians)."""
    ratios = [a / b for a, b in zip(slower, faster, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def machine() -> str:
    """``x86_64, 2 CPUs, Python 3.11.7``: enough to tell two result files' machines apart."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
