"""``stragglar bench``: a grid of measured runs, as ratios with their spread, beside the model.

Each setting (ranks, size, delay) is one :func:`~stragglar.measure.run.run_benchmark`: every
iteration runs the schedule, then the engine's own AllReduce, both after the straggler's delay
and both checked, so the pair alternates within one run and sees the same machine state.  The
ratio baseline / schedule is taken per iteration (the pair ran back to back) and reported as its
median with the min-max spread: on a shared machine single iterations vary a lot.

The model column: when the baseline is a ring AllReduce (gloo's, on the torch backend), a Ring
alpha-beta model ``T = 2(N-1) alpha + 2(N-1)/N * size / bandwidth`` is fitted per N by least
squares to the baseline's delay-0 medians over the sizes measured (two sizes determine it), and
the same network prices both schedules at each setting (:mod:`stragglar.measure.predict`).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from stragglar.cost import Network
from stragglar.errors import InputError
from stragglar.measure.predict import compare_generated
from stragglar.measure.run import BenchmarkResult, run_benchmark
from stragglar.units import format_bytes

__all__ = ["Setting", "SweepResult", "fit_ring", "machine", "sweep"]

RING_BASELINES = ("torch",)  # backends whose baseline AllReduce is a ring


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

    def table(self) -> str:
        """The results as a Markdown table, the fitted networks above it."""
        fits = [
            f"{self.baseline} fit, N={n}: "
            + (
                f"alpha {net.alpha * 1e6:.0f} us, bandwidth {net.bandwidth / 1e9:.2f} GB/s"
                if net is not None
                else "none (its times did not grow with the size: measure sizes further apart)"
            )
            for n, net in self.fits.items()
        ]
        ours, theirs = self.algorithm, self.baseline
        rows = [
            f"| N | size | delay (ms) | {ours} (ms) | {theirs} (ms) "
            f"| {theirs} / {ours}: ratio of the medians | per-iteration ratio: median [min-max] | model |",
            "|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        for s in self.settings:
            model = f"{s.predicted:.2f}x" if s.predicted is not None else "-"
            rows.append(
                f"| {s.num_ranks} | {format_bytes(s.size_bytes)} | {s.delay * 1e3:g} | {s.time * 1e3:.1f} "
                f"| {s.baseline_time * 1e3:.1f} | {s.baseline_time / s.time:.2f}x "
                f"| {s.ratio:.2f}x [{s.ratio_min:.2f}-{s.ratio_max:.2f}] | {model} |"
            )
        head = [*fits, ""] if fits else []
        return "\n".join(head + rows)

    def to_json(self) -> dict[str, object]:
        return {
            **{k: v for k, v in asdict(self).items() if k not in ("settings", "fits")},
            "fits": {str(n): asdict(net) if net else None for n, net in self.fits.items()},
            "settings": [asdict(s) for s in self.settings],
        }


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
    return Network(max(float(alpha), 0.0), 1.0 / float(beta)) if beta > 0 else None


def sweep(
    backend: str,
    gpus: Sequence[int],
    sizes: Sequence[int],
    delays: Sequence[float],
    *,
    algorithm: str = "stragglar",
    dtype: str = "float32",
    iters: int = 5,
    timeout: float = 120.0,
    progress: Callable[[BenchmarkResult], None] | None = None,
) -> SweepResult:
    """Measure every (ranks, size in bytes, delay in seconds) setting; see the module docstring."""
    if not gpus or not sizes or not delays:
        raise InputError("need at least one rank count, size and delay")
    results: dict[tuple[int, int, float], BenchmarkResult] = {}
    for n in gpus:
        for size in sizes:
            for delay in delays:
                r = run_benchmark(
                    backend, n, size, dtype, delay, algorithm=algorithm, iters=iters, timeout=timeout
                )
                results[n, size, delay] = r
                if progress is not None:
                    progress(r)
    fits: dict[int, Network | None] = {}
    if backend in RING_BASELINES and 0.0 in delays and len(set(sizes)) > 1:
        fits = {n: fit_ring(n, [(s, results[n, s, 0.0].baseline_time) for s in sizes]) for n in gpus}
    settings = []
    for (n, size, delay), r in results.items():
        ratios = [b / t for b, t in zip(r.baseline_times, r.times, strict=True)]
        net = fits.get(n)
        predicted = None
        if net is not None:
            c = compare_generated(n, size, delay, net, (algorithm,))
            predicted = c.get("ring").time / c.get(algorithm).time
        settings.append(
            Setting(
                n,
                size,
                delay,
                r.time,
                r.baseline_time,
                statistics.median(ratios),
                min(ratios),
                max(ratios),
                predicted,
            )
        )
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
    )


def machine() -> str:
    """``x86_64, 2 CPUs, Python 3.11.7``: enough to tell two result files' machines apart."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
