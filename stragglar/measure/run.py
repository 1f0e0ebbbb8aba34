"""``stragglar run``: time a proved schedule on real buffers against the engine's own AllReduce.

Every rank fills distinct per-rank, per-element integers and every result is checked
(:mod:`stragglar.measure.data`).  Each iteration the straggler arrives ``delay`` seconds late,
both for the schedule and for the baseline (the engine's all_reduce, or for in-process runs a
sum of the buffers), so the figures compare like with like.  This module checks the request and
reports the result; the figures come from the backend's runner: torch ranks
(:mod:`~stragglar.measure.run_torch`, the torch and nccl backends) or buffers in this process
(:mod:`~stragglar.measure.run_in_process`, the local and cupy backends).
"""

from __future__ import annotations

import importlib.util
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from stragglar.args import MAX_DELAY, as_flag, as_int, as_rank, as_seconds
from stragglar.errors import InputError, described
from stragglar.measure.data import ITEMSIZE
from stragglar.measure.gpus import check_cuda, sharing_note
from stragglar.measure.links import check_link_rate, paced_to
from stragglar.measure.memory import check_host_memory
from stragglar.measure.run_in_process import in_process_figures
from stragglar.model import schedule_name
from stragglar.runtime import DTYPES
from stragglar.schedule import MAX_RANKS
from stragglar.synth import check_request, synthesize
from stragglar.units import count_of, format_bytes, format_ratio
from stragglar.verify import Proof, prove, require_proof

__all__ = [
    "BACKENDS",
    "GRAPH_BACKENDS",
    "HOST_BACKENDS",
    "IN_ONE_PROCESS",
    "IN_PROCESS_BACKENDS",
    "MAX_ITERS",
    "MAX_RUN_CELLS",
    "BenchmarkResult",
    "Variant",
    "check_backend",
    "check_dtype",
    "check_graphs",
    "check_run_size",
    "element_count",
    "has_straggler",
    "run_benchmark",
]

BACKENDS = ("local", "torch", "nccl", "cupy", "device")
GRAPH_BACKENDS = ("nccl", "cupy")  # whose rounds replay from CUDA graphs (after their first call)
IN_PROCESS_BACKENDS = ("local", "cupy")  # all ranks in one process; the others start one per rank
IN_ONE_PROCESS = (  # what the ratios of the in-process backends mean: their baseline is no collective
    "note: in one process, against summing the buffers directly, these ratios check the schedule's "
    "own overhead and say nothing of a network; the torch and nccl backends compare collectives"
)
_ARRAYS = {"local": "NumPy", "cupy": "CuPy"}  # the in-process backends' array libraries, NumPy's dtypes
HOST_BACKENDS = ("local", "torch")  # the backends whose buffers are in the host's memory
_ENGINES = {"torch": "gloo", "nccl": "nccl", "device": "nccl"}  # the backends whose ranks are torch processes
_LIBRARIES = {"torch": ("torch",), "nccl": ("torch",), "cupy": ("cupy",), "device": ("torch", "cupy")}
MAX_ITERS = 10_000  # timed iterations per run, and warm-up ones: a bound, so a typo cannot run for ever
# (rank, chunk) cells of a schedule a run times: N = 256 with N - 1 chunks.  An iteration moves
# every transfer of the schedule as its own slice copy (in one process) or message (one process
# per rank), and a run binds a plan per rank: at N = 256 (130,000 transfers) an in-process
# iteration takes about half a second; at N = 2048 (8.4 million) a run of the default 6 iterations
# had not finished after 200 s.
MAX_RUN_CELLS = 2**16


def element_count(size_bytes: int, dtype: str) -> int:
    """The ``dtype`` elements of a buffer of ``size_bytes``: a whole number of them, at least one
    (a sweep checks each of its sizes with it before the first setting runs)."""
    count, extra = divmod(size_bytes, ITEMSIZE[dtype])
    if count < 1:
        hold = "holds" if size_bytes == 1 else "hold"
        raise InputError(
            f"need size >= one element: {count_of(size_bytes, 'byte')} {hold} no {dtype} element"
        )
    if extra:
        raise InputError(
            f"{size_bytes:,} bytes is not a whole number of {dtype} elements ({ITEMSIZE[dtype]} bytes each)"
        )
    return count


@dataclass(frozen=True)
class Variant:
    """One schedule's per-iteration seconds in a run (slowest rank, from the common start to its
    last round); ``hidden``: when the punctual ranks had finished the phases without the
    straggler.  ``name`` is :func:`~stragglar.model.predict.schedule_name`'s."""

    name: str
    chunks: int
    times: tuple[float, ...]
    hidden: tuple[float, ...]

    @property
    def time(self) -> float:
        return statistics.median(self.times)


@dataclass(frozen=True)
class BenchmarkResult:
    """A run: each schedule's figures (:class:`Variant`, in the order given) and the baseline's,
    all from the same iterations; ``late_rank`` is the rank that arrived ``delay`` seconds late, for
    every schedule and the baseline alike; ``link_rate``, where given, the rate every rank's
    sockets were paced to (bytes per second); ``gpus``, on the nccl backend, the GPUs the ranks
    were placed on (:mod:`stragglar.measure.gpus`).  ``algorithm``, ``times``, ``hidden``, ``time`` and
    ``algbw`` are the first schedule's (the only one, unless several were run)."""

    backend: str
    num_ranks: int
    dtype: str
    count: int
    delay: float
    variants: tuple[Variant, ...]
    baseline: str
    baseline_times: tuple[float, ...]
    late_rank: int | None = None
    link_rate: float | None = None
    gpus: int | None = None

    @property
    def size_bytes(self) -> int:
        return self.count * ITEMSIZE[self.dtype]

    @property
    def algorithm(self) -> str:
        return self.variants[0].name

    @property
    def times(self) -> tuple[float, ...]:
        return self.variants[0].times

    @property
    def hidden(self) -> tuple[float, ...]:
        return self.variants[0].hidden

    @property
    def time(self) -> float:
        return self.variants[0].time

    @property
    def baseline_time(self) -> float:
        return statistics.median(self.baseline_times)

    @property
    def algbw(self) -> float:
        """Algorithm bandwidth, bytes per second: buffer size over time."""
        return self.size_bytes / self.time

    @property
    def baseline_algbw(self) -> float:
        return self.size_bytes / self.baseline_time

    def progress_line(self) -> str:
        """``  N=4 16 MiB 50 ms: 1.12x``: one finished setting of a sweep (a ratio per schedule;
        the baseline's time when it ran alone)."""
        size = format_bytes(self.size_bytes)
        ratios = ", ".join(f"{format_ratio(self.baseline_time / v.time)}x" for v in self.variants)
        figures = ratios or f"{self.baseline} {self.baseline_time * 1e3:.1f} ms"
        return f"  N={self.num_ranks} {size} {self.delay * 1e3:g} ms: {figures}"

    @property
    def _late_rank_words(self) -> str:
        return f" (rank {self.late_rank})" if self.late_rank is not None and self.delay > 0 else ""

    @property
    def _links(self) -> str:
        return "" if self.link_rate is None else f"{paced_to(self.link_rate)}, "

    @property
    def _compared(self) -> str:
        """``stragglar C=12 and stragglar (the paper's C = N-1) against gloo all_reduce``: what
        was timed, in words (a bare comma list read as if "stragglar" were the backend's)."""
        chunked = any(v.name.startswith("stragglar C=") for v in self.variants)
        names = [
            f"{v.name} (the paper's C = N-1)" if chunked and v.name == "stragglar" else v.name
            for v in self.variants
        ]
        if not names:
            return self.baseline
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        return f"{listed} against {self.baseline}"

    def report(self) -> str:
        """A few lines for the terminal."""
        rows = [(v.name, v.time) for v in self.variants] + [(self.baseline, self.baseline_time)]
        width = max(18, *(len(name) for name, _ in rows))
        lines = [
            f"{self._compared} on {self.backend}: "
            f"{self.num_ranks} ranks, {format_bytes(self.size_bytes)} {self.dtype}, "
            f"straggler delay {self.delay * 1e3:g} ms{self._late_rank_words}, {self._links}"
            f"{count_of(len(self.baseline_times), 'iteration')} (medians), results checked",
            *(
                f"  {name:<{width}} {t * 1e3:10.3f} ms/iter  {rate}"
                for (name, t), rate in zip(rows, _rates([self.size_bytes / t for _, t in rows]), strict=True)
            ),
        ]
        for v in self.variants:
            which = f" of {v.name}" if len(self.variants) > 1 else ""
            hidden = (
                f"  (hidden phase done at {statistics.median(v.hidden) * 1e3:.2f} ms)" if v.hidden else ""
            )
            speedup = format_ratio(self.baseline_time / v.time)
            lines.append(f"  speed-up{which} (ratio of the medians) {speedup}x{hidden}")
        if len(self.variants) > 1:
            first = self.variants[0]
            lines += [
                f"  {first.name} over {v.name} (ratio of the medians) {format_ratio(v.time / first.time)}x"
                for v in self.variants[1:]
            ]
        if self.backend in IN_PROCESS_BACKENDS and self.variants:
            lines.append(f"  {IN_ONE_PROCESS}")
        note = None if self.gpus is None else sharing_note(self.num_ranks, self.gpus, self.backend)
        if note is not None:
            lines.append(f"  {note}")
        return "\n".join(lines)


def run_benchmark(
    backend: str = "torch",
    num_ranks: int = 4,
    size_bytes: int = 16 * 2**20,
    dtype: str = "float32",
    delay: float = 0.0,
    *,
    algorithm: str = "stragglar",
    proof: Proof | Sequence[Proof] | None = None,
    chunks: int | None = None,
    straggler: int | None = None,
    iters: int = 5,
    warmup: int = 1,
    timeout: float = 60.0,
    link_rate: float | None = None,
    tick: Callable[[], None] | None = None,
    graphs: bool | None = None,
) -> BenchmarkResult:
    """Run the proved schedule (default: ``algorithm`` synthesized for ``num_ranks`` and proved)
    ``warmup + iters`` times on ``backend`` and the engine's all_reduce as often, checking every
    result.

    ``chunks`` (StragglAR only) adds StragglAR in that many chunks, first, beside the paper's
    C = N-1, to see what the chunk count buys on the same iterations (with ``chunks`` = N-1 the
    two are one schedule, run once).

    ``proof`` may also be several proofs: each iteration then runs every one of them and the
    baseline, in an order that rotates (:func:`~stragglar.measure.timing.turn`), all in one
    launch of the ranks, so that every schedule sees the same machine state; none (an empty
    sequence) times the baseline alone.  ``delay`` is in seconds (at most an hour): how late the
    late rank arrives, for every schedule and the baseline alike.  The late rank is ``straggler``
    if given (for a straggler-aware algorithm also the schedule's straggler), else the first schedule's
    (:attr:`~stragglar.schedule.Schedule.late_rank`: its straggler, else the last rank): a
    schedule without a straggler (Ring, RHD) waits for it exactly as the baseline does.
    ``timeout`` (at most a day) bounds each wait for a silent peer (plus ``delay`` where the wait
    includes the late rank's delay), not the run.  ``backend="nccl"``: torch ranks on NCCL, rank r
    on GPU r mod the GPU count (:mod:`stragglar.measure.gpus`), refused at once without CUDA GPUs.
    ``link_rate`` (torch backend only, bytes per second) paces
    every rank's sockets to it: each rank gets a link of its own, as the cost model assumes,
    instead of the host's shared loopback (:mod:`stragglar.measure.links`).  ``tick``, if
    given, is called between iterations, from this process (for a progress line; the torch
    backend forks its ranks, and no thread may run beside a fork).  Raises
    :class:`~stragglar.errors.InputError` for a bad request,
    :class:`~stragglar.errors.ResourceError` for a run this host cannot hold
    (:mod:`stragglar.measure.memory`), :class:`~stragglar.measure.data.WrongResult` for a wrong
    result, and :class:`~stragglar.measure.launch.LaunchError` when a rank fails.
    """
    check_graphs(backend, graphs)
    gpus = check_backend(backend)
    check_dtype(backend, dtype)
    num_ranks = as_int(num_ranks, "num_ranks")
    if not 2 <= num_ranks <= MAX_RANKS:
        raise InputError(f"need 2 to {MAX_RANKS} GPUs, got {num_ranks}")
    size_bytes = as_int(size_bytes, "size_bytes", minimum=0)
    delay = as_seconds(delay, "delay", maximum=MAX_DELAY)
    timeout = as_seconds(timeout, "timeout", positive=True)
    iters = as_int(iters, "iters", minimum=1)
    warmup = as_int(warmup, "warmup", minimum=0)
    if iters > MAX_ITERS or warmup > MAX_ITERS:  # each apart: the CLI's --iters 1..MAX_ITERS adds a warm-up
        raise InputError(
            f"at most {MAX_ITERS:,} timed and {MAX_ITERS:,} warm-up iterations, got {iters} and {warmup}"
        )
    late_rank = None if straggler is None else as_rank(straggler, "straggler", num_ranks)
    if link_rate is not None:
        if backend != "torch":
            raise InputError(f"link_rate paces gloo's sockets: the torch backend only, not {backend}")
        link_rate = check_link_rate(link_rate)
    if proof is None:
        aware = late_rank is not None and has_straggler(algorithm)
        c = None if chunks is None else as_int(chunks, "chunks")
        counts = (c,) if c in (None, num_ranks - 1) else (c, None)
        for k in counts:
            check_run_size(num_ranks, check_request(algorithm, num_ranks, chunks=k).num_chunks)
        proofs: tuple[Proof, ...] = tuple(
            prove(synthesize(algorithm, num_ranks, late_rank if aware else None, chunks=k)) for k in counts
        )
    else:
        if chunks is not None:
            raise InputError("chunks shapes a synthesized schedule: a given proof has its own")
        proofs = tuple(proof) if isinstance(proof, Sequence) else (proof,)
    for p in proofs:
        if require_proof(p).num_ranks != num_ranks:
            raise InputError(f"schedule is for {p.num_ranks} ranks, not {num_ranks}")
        check_run_size(p.num_ranks, p.num_chunks)
    if late_rank is None:  # the first schedule's; the baseline alone waits for the last rank, as Ring's would
        late_rank = proofs[0].schedule.late_rank if proofs else num_ranks - 1
    count = element_count(size_bytes, dtype)
    check_host_memory(num_ranks, count, dtype, on_host=backend in HOST_BACKENDS)
    if backend in _ENGINES:
        from stragglar.measure.run_torch import torch_figures

        figures = torch_figures(
            proofs,
            num_ranks,
            count,
            dtype,
            delay,
            iters,
            warmup,
            timeout,
            late_rank,
            link_rate=link_rate,
            tick=tick,
            engine=_ENGINES[backend],
            gpus=gpus or 0,
            graphs=graphs,
            on_device=backend == "device",
        )
    else:
        figures = in_process_figures(
            backend, proofs, num_ranks, count, dtype, delay, iters, warmup, late_rank, tick, graphs
        )
    variants = tuple(
        Variant(schedule_name(p.schedule), p.schedule.num_chunks, series.times, series.hidden)
        for p, series in zip(proofs, figures.schedules, strict=True)
    )
    return BenchmarkResult(
        backend,
        num_ranks,
        dtype,
        count,
        delay,
        variants,
        figures.baseline,
        figures.baseline_times,
        late_rank,
        link_rate,
        gpus,
    )


def check_graphs(backend: str, graphs: bool | None) -> None:
    """``graphs`` (None: the default, on where it applies) is for the backends whose rounds a CUDA
    graph can replay: the nccl ranks' stream-ordered rounds and the cupy loopback."""
    if graphs is None:
        return
    as_flag(graphs, "graphs")
    if backend not in GRAPH_BACKENDS:
        raise InputError(f"graphs applies to the {' and '.join(GRAPH_BACKENDS)} backends, not {backend}")


def check_backend(backend: str) -> int | None:
    """Refuse, before any work, a backend that cannot run here: an unknown one, one whose library
    is missing (with how to install it), or ``nccl`` or ``device`` without CUDA GPUs.  Returns
    the GPU count for those two (None for the others)."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {described(backend)} (choose from {', '.join(BACKENDS)})")
    _require(backend)
    return check_cuda(backend) if _ENGINES.get(backend) == "nccl" else None


def check_run_size(num_ranks: int, num_chunks: int) -> None:
    """Refuse, before any schedule is made or plan bound, a schedule larger than a run times.

    >>> check_run_size(2048, 2047)
    Traceback (most recent call last):
    ...
    stragglar.errors.InputError: 2048 ranks x 2047 chunks: a run times schedules of at most 65,536 \
(rank, chunk) cells (N = 256 with N - 1 chunks)
    """
    if num_ranks * num_chunks > MAX_RUN_CELLS:
        raise InputError(
            f"{num_ranks} ranks x {num_chunks} chunks: a run times schedules of at most {MAX_RUN_CELLS:,} "
            "(rank, chunk) cells (N = 256 with N - 1 chunks)"
        )


@cache
def has_straggler(algorithm: str) -> bool:
    """Whether ``algorithm``'s schedules have a straggler (its smallest schedule tells)."""
    return synthesize(algorithm, 2).straggler is not None


def check_dtype(backend: str, dtype: str) -> None:
    """Refuse, before any work, a dtype that ``backend`` cannot hold: the in-process backends'
    arrays (NumPy's, CuPy's) have no bfloat16; the torch backend has every dtype of
    :data:`~stragglar.runtime.DTYPES`."""
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {described(dtype)} (choose from {', '.join(DTYPES)})")
    if backend in _ARRAYS:
        try:
            np.dtype(dtype)
        except TypeError:
            raise InputError(
                f"the {backend} backend cannot hold {dtype}: {_ARRAYS[backend]} has no such type; "
                "the torch backend has it (--backend torch)"
            ) from None


# The packages are named, not stragglar's extras: 'stragglar[torch]' means something only to an
# index that has stragglar, and an install from source spells it '.[torch]'.
HINTS = {
    "torch": (
        "the torch backend needs torch: install PyTorch, either its CPU-only build or a CUDA build that "
        "matches your driver, with the pip command that the install selector in PyTorch's documentation "
        "gives for your system"
    ),
    "nccl": (
        "the nccl backend needs torch: install a CUDA build of PyTorch that matches your driver, with the "
        "pip command that the install selector in PyTorch's documentation gives for your system"
    ),
    "cupy": (
        "the cupy backend needs cupy: pip install cupy-cuda12x or cupy-cuda13x, the one matching the "
        "CUDA version that nvidia-smi prints"
    ),
    "device": (
        "the device backend needs torch and cupy: a CUDA build of PyTorch that matches your driver, then "
        "pip install cupy-cuda12x (or cupy-cuda13x, the CUDA version that nvidia-smi prints)"
    ),
}


def _require(backend: str) -> None:
    """An InputError saying how to install the backend's library when it is missing."""
    if any(importlib.util.find_spec(library) is None for library in _LIBRARIES.get(backend, ())):
        raise InputError(HINTS[backend])


def _rates(bytes_per_second: Sequence[float]) -> list[str]:
    """A run's algorithm bandwidths, all in one unit so that the rows compare at a glance (a row in
    MB/s beside one in GB/s read as if it were the faster): GB/s, or MB/s where the slowest is
    below a tenth of one (small buffers among many ranks, where three decimals of GB/s read 0.000).

    >>> _rates([2.5e9, 0.5e9])
    ['   2.500 GB/s', '   0.500 GB/s']
    >>> _rates([2.5e9, 6.6e5])
    ['2500.000 MB/s', '   0.660 MB/s']
    """
    scale, unit = (1e9, "GB/s") if min(bytes_per_second) >= 1e8 else (1e6, "MB/s")
    return [f"{rate / scale:8.3f} {unit}" for rate in bytes_per_second]
