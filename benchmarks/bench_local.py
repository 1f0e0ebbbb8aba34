"""Time the in-process AllReduce on the host: what a change to the interpreter costs the CPU paths.

    python benchmarks/bench_local.py [--calls 200] [--json out.json]

``allreduce_local`` on NumPy arrays and on torch CPU tensors (one thread), float32, for the
paper's schedule and chunked ones, small and large buffers: the median time of a call over
``--calls`` calls (fewer for the large buffers), every result checked.  The figures to compare
before and after a change to the interpreter (``runtime/interpreter.py``, ``local.py``): run it on
both trees, alternating, on the same machine.  Without torch the torch rows are left out.

The ``run_rank`` rows time one rank's interpreter (``interpreter.run_rank``, NumPy, rank 1) over a
transport that moves nothing: the host time every distributed path (gloo, NCCL, CuPy/NCCL) spends
per call around its transfers.  Nothing moves there, so there is no sum to check.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from options import Parser, as_command, each, json_output, whole
from results import save

from stragglar.runtime import allreduce_local
from stragglar.runtime.interpreter import run_rank
from stragglar.runtime.plans import plan_for
from stragglar.runtime.program import BoundStep
from stragglar.synth import synthesize
from stragglar.verify import prove

CASES = (  # (N, chunks or None: the paper's, elements per rank)
    (8, None, 1 << 10),
    (8, None, 1 << 20),
    (16, None, 1 << 10),
    (4, 32, 1 << 16),
    (8, 64, 1 << 10),
    (8, 64, 1 << 20),
)
RANK_CASES = ((8, None), (8, 64), (16, 128))  # (N, chunks) of the run_rank rows, 1 Ki elements
LARGE = 1 << 18  # elements from which a case runs a tenth of the calls


@dataclass(frozen=True)
class Row:
    library: str
    n: int
    chunks: int
    count: int
    calls: int
    median_ms: float


def bench(library: str, n: int, chunks: int | None, count: int, calls: int) -> Row:
    """The median of ``calls`` timed calls after one untimed one, every result checked."""
    proof = prove(synthesize("stragglar", n, chunks=chunks))
    make, fill, same = _library(library)
    buffers = [make(count) for _ in range(n)]

    def refill() -> None:
        for rank, buffer in enumerate(buffers):
            fill(buffer, rank + 1)

    def check() -> None:
        if not all(same(b, n * (n + 1) // 2) for b in buffers):
            raise SystemExit(f"wrong sum: {library} N={n} C={chunks} count={count}")

    median = _median_ms(lambda: allreduce_local(buffers, proof), calls, refill, check)
    return Row(library, n, proof.schedule.num_chunks, count, calls, median)


def _median_ms(
    run: Callable[[], object],
    calls: int,
    before: Callable[[], None] = lambda: None,
    after: Callable[[], None] = lambda: None,
) -> float:
    """The median time of ``run()`` in ms over ``calls`` timed calls after one untimed one, with
    ``before`` and ``after`` each call, untimed."""
    times = []
    for call in range(calls + 1):
        before()
        start = time.perf_counter()
        run()
        if call:
            times.append(time.perf_counter() - start)
        after()
    return statistics.median(times) * 1e3


class _Nowhere:
    """A transport that moves nothing: what is left is the interpreter's own time."""

    def exchange(self, step: BoundStep, sends: list[Any], recvs: list[Any]) -> None:
        pass

    def finish(self) -> None:
        pass


def bench_rank(n: int, chunks: int | None, count: int, calls: int) -> Row:
    """The median host time of rank 1's ``run_rank`` over :class:`_Nowhere`, after one untimed call."""
    proof = prove(synthesize("stragglar", n, chunks=chunks))
    plan = plan_for(proof, 1, count)
    flat = np.zeros(count, np.float32)
    with np.errstate(all="ignore"):  # the scratch's leftovers are added in: their values do not matter
        median = _median_ms(lambda: run_rank(flat, plan, _Nowhere()), calls)
    return Row("run_rank", n, proof.schedule.num_chunks, count, calls, median)


Library = tuple[Callable[[int], Any], Callable[[Any, int], None], Callable[[Any, int], bool]]


def _library(name: str) -> Library:
    """How to make, fill and check a buffer of ``name``'s arrays."""
    if name == "numpy":
        return (
            lambda count: np.empty(count, np.float32),
            lambda buffer, value: buffer.fill(value),
            lambda buffer, value: bool((buffer == value).all()),
        )
    import torch

    torch.set_num_threads(1)
    return (
        lambda count: torch.empty(count, dtype=torch.float32),
        lambda buffer, value: buffer.fill_(value),
        lambda buffer, value: bool((buffer == value).all()),
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| library | N | C | elements per rank | calls | median per call (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.library} | {r.n} | {r.chunks} | {r.count:,} | {r.calls} | {r.median_ms:.3f} |" for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description="Time allreduce_local on the host (NumPy, torch CPU).")
    parser.add_argument(
        "--calls", type=whole(1, 10**5), default=200, help="timed calls per small case (median)"
    )
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also save the results as JSON")
    args = parser.parse_args(argv)
    libraries = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])
    cases = [(library, *case) for library in libraries for case in CASES]
    rows = [
        bench(library, n, chunks, count, max(1, args.calls // 10) if count >= LARGE else args.calls)
        for library, n, chunks, count in each(cases, lambda case: f"{case[0]}, N = {case[1]}")
    ]
    rows += [
        bench_rank(n, chunks, 1 << 10, args.calls) for n, chunks in each(RANK_CASES, lambda c: "run_rank")
    ]
    print(table(rows))
    if args.json:
        save(args.json, {"rows": [asdict(r) for r in rows]})


if __name__ == "__main__":
    as_command(main)
