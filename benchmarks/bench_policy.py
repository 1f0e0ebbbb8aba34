"""Time what the DDP hook's auto policy pays on the host each step: its judgement of the recent
steps, and its decision of each bucket with ``chunks="auto"``.

    python benchmarks/bench_policy.py [--gpus 8 64 1024] [--calls 200] [--json out.json]

Each step the policy judges the probe's window (:func:`~stragglar.model.policy.outlook`: which
rank to bet on, its record over the window's 24 steps), on every rank: *the step's judgement*.

Under ``policy="auto", chunks="auto"`` the hook asks :func:`~stragglar.model.policy.choose` at
every bucket of every step, and the chunk count it bets with is the one the cost model prices
fastest over the straggler's recent steps, among every count from N - 1 to 4,096.  For each N and
bucket size (25 MiB, DDP's default bucket, and 1 GiB), the median of ``--calls`` calls of:

* *ranking every count*: :func:`~stragglar.model.chunks.ranked_chunks`' first, which is how the
  fastest count was found before (every count ranked in Python);
* *the fastest count*: :func:`~stragglar.model.chunks.best_chunks`, the cheapest alone;
* *a step's first bucket*: ``choose`` with a record it has not met (a new one each call, as each
  step brings), over the window's 24 steps;
* *a step's next bucket*: ``choose`` again with the same record and size (the step's other
  buckets of that size), which its cache answers.

Targets: a step's judgement within 2 ms at any N up to 1,024, its first bucket within 1 ms, its
next ones within 20 us (a hundred buckets a step then cost the host about 2 ms more than the
first).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from options import Parser, as_command, each, json_output, whole
from results import save

from stragglar.model import Network, best_chunks, ranked_chunks
from stragglar.model.chunks import AUTO
from stragglar.model.detect import WINDOW, Rule, fresh, observe
from stragglar.model.policy import Outlook, choose, latenesses, outlook

NETWORK = Network(10e-6, 25e9)  # alpha 10 us, 25 GB/s
SIZES = (25 * 2**20, 2**30)
JUDGEMENT_TARGET_US = 2000.0
FIRST_TARGET_US = 1000.0
NEXT_TARGET_US = 20.0


@dataclass(frozen=True)
class Result:
    n: int
    size_bytes: int
    judgement_us: float  # outlook over the window's steps
    ranking_us: float  # ranked_chunks' first: the fastest count as it was found before
    fastest_us: float  # best_chunks
    first_bucket_us: float  # choose with a record it has not met
    next_bucket_us: float  # choose again with the same record and size
    chunks: int | None  # the count the first bucket's choice bets with (None: the paper's N - 1)


def median_us(call: Callable[[int], object], calls: int) -> float:
    """The median wall time of ``call(i)`` for i = 0..calls-1, in microseconds."""
    times = []
    for i in range(calls):
        start = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def record(i: int) -> tuple[float, ...]:
    """A straggler's lateness at the window's steps, distinct for each ``i``: 20 ms late at most,
    by a hair at every third step."""
    return tuple(2e-4 if (i + s) % 3 == 0 else 0.02 - 1e-6 * ((i * 7 + s) % 97) for s in range(WINDOW))


def judgement_us(n: int, calls: int) -> float:
    """The median time of the step's judgement of a window in which rank N - 1 is last at every
    step but the third ones (a millisecond of jitter), by ``record``'s lateness."""
    rule, state, window = Rule(), fresh(n), []
    for s in range(WINDOW):
        waits = [1e-3 * ((r * 7919 + s * 104729) % 1000) / 1000 for r in range(n)]
        waits[n - 1] = -record(0)[s]  # it waited least: it came last, by that much
        window.append(latenesses(waits))
        state = observe(rule, state, window[-1])
    judged = outlook(rule, state, window, None, NETWORK, NETWORK)
    assert judged is not None and judged.candidate == n - 1, judged  # the rule named it: a bet to weigh
    return median_us(lambda _: outlook(rule, state, window, None, NETWORK, NETWORK), calls)


def bench(n: int, size: int, calls: int) -> Result:
    outlooks = [Outlook(n - 1, 0.02, 1.0, record(i), NETWORK, NETWORK) for i in range(calls)]
    repeated = Outlook(n - 1, 0.02, 1.0, record(calls), NETWORK, NETWORK)
    chosen = choose("stragglar", n, size, repeated, AUTO)
    assert chosen.algorithm == "stragglar", chosen  # a bet: the count was priced
    assert ranked_chunks(n, size, 0.02, NETWORK)[0] == best_chunks(n, size, 0.02, NETWORK)
    return Result(
        n,
        size,
        judgement_us(n, calls),
        median_us(lambda _: ranked_chunks(n, size, 0.02, NETWORK)[0], calls),
        median_us(lambda _: best_chunks(n, size, 0.02, NETWORK), calls),
        median_us(lambda i: choose("stragglar", n, size, outlooks[i], AUTO), calls),
        median_us(lambda _: choose("stragglar", n, size, repeated, AUTO), calls),
        chosen.chunks,
    )


def table(results: list[Result]) -> str:
    lines = [
        "| N | bucket | the step's judgement (us) | ranking every count (us) | the fastest count (us) "
        "| a step's first bucket (us) | its next bucket (us) | chunks bet with |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.n} | {r.size_bytes / 2**20:g} MiB | {r.judgement_us:,.0f} | {r.ranking_us:,.0f} "
        f"| {r.fastest_us:,.0f} | {r.first_bucket_us:,.0f} | {r.next_bucket_us:.1f} | {r.chunks or r.n - 1} |"
        for r in results
    ]
    judging = max(r.judgement_us for r in results)
    first = max(r.first_bucket_us for r in results)
    later = max(r.next_bucket_us for r in results)
    ratio = statistics.median(r.ranking_us / r.fastest_us for r in results)
    lines += [
        "",
        f"the step's judgement, worst setting: {judging:,.0f} us (target <= {JUDGEMENT_TARGET_US:g} us: "
        f"{'met' if judging <= JUDGEMENT_TARGET_US else 'MISSED'})",
        f"a step's first bucket, worst setting: {first:,.0f} us (target <= {FIRST_TARGET_US:g} us: "
        f"{'met' if first <= FIRST_TARGET_US else 'MISSED'})",
        f"its next buckets, worst setting: {later:.1f} us (target <= {NEXT_TARGET_US:g} us: "
        f"{'met' if later <= NEXT_TARGET_US else 'MISSED'})",
        f"the fastest count alone against ranking every count: {ratio:.0f}x less time (median)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description="Time the auto policy's judgement of a step and decision of a bucket.")
    parser.add_gpus(default=[8, 64, 1024])
    parser.add_argument("--calls", type=whole(3, 10**5), default=200, help="timed calls per setting (median)")
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also save the results as JSON")
    args = parser.parse_args(argv)
    settings = [(n, size) for n in args.gpus for size in SIZES]
    results = [
        bench(n, size, args.calls)
        for n, size in each(settings, lambda s: f"N = {s[0]}, {s[1] / 2**20:g} MiB")
    ]
    print(table(results))
    if args.json:
        save(args.json, {"results": [asdict(r) for r in results]})


if __name__ == "__main__":
    as_command(main)
