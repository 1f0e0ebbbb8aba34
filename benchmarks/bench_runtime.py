"""Time what a call of the runtime pays before any data moves: the plan lookup and the channel.

    python benchmarks/bench_runtime.py [--sizes 8 64 256] [--calls 2000] [--json out.json]

For each N: the first lookup of a rank's plan (compile the schedule, bind it to a 1M-element
buffer), then the median of ``--calls`` cached lookups of the same plan (what every later bucket
pays), beside the cost of hashing the whole schedule, which is what a cache keyed on the
``Schedule`` itself paid per hit before plans were keyed on its fingerprint; and the median cost of
a call's header and channel bookkeeping when its channel repeats its setup (no check: the common
case, :mod:`stragglar.runtime.channels`).  Targets: a cached lookup at N = 64 within 50 us, the
header and channel within 10 us.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from results import save

from stragglar.runtime import plan_for
from stragglar.runtime.channels import Channels
from stragglar.runtime.header import make_header
from stragglar.synth import synthesize
from stragglar.verify import prove

COUNT = 1 << 20  # elements of the bucket the plan is bound to
TARGET_US = 50.0  # the cached lookup at N = 64
CHANNEL_TARGET_US = 10.0  # a call's header and channel, when the channel repeats its setup


class Group:
    """A stand-in for a process group: the channels hold it weakly, by identity."""


@dataclass(frozen=True)
class Result:
    n: int
    transfers: int
    first_ms: float  # compile and bind on a miss
    cached_us: float  # median of the cached lookups
    hash_us: float  # hashing the whole schedule: the per-hit cost of a cache keyed on it
    channel_us: float  # median: a call's header and channel when the channel repeats its setup


def bench(n: int, calls: int) -> Result:
    proof = prove(synthesize("stragglar", n))
    start = time.perf_counter()
    plan_for(proof, 0, COUNT)
    first = time.perf_counter() - start
    cached = []
    for _ in range(calls):
        start = time.perf_counter()
        plan_for(proof, 0, COUNT)
        cached.append(time.perf_counter() - start)
    hashes = []
    for _ in range(max(3, calls // 100)):
        fresh = synthesize("stragglar", n)  # a new object: no hash cached anywhere
        start = time.perf_counter()
        hash(fresh)
        hashes.append(time.perf_counter() - start)
    channels, group, late = Channels(), Group(), proof.num_ranks - 1
    with channels.enter(group, 0, make_header(proof, "float32", COUNT, 0, late), lockstep=False) as call:
        call.agreed()
    entered = []
    for _ in range(calls):
        start = time.perf_counter()
        with channels.enter(group, 0, make_header(proof, "float32", COUNT, 0, late), lockstep=False) as call:
            assert not call.must_check
        entered.append(time.perf_counter() - start)
    return Result(
        n,
        proof.num_transfers,
        first * 1e3,
        statistics.median(cached) * 1e6,
        statistics.median(hashes) * 1e6,
        statistics.median(entered) * 1e6,
    )


def table(results: list[Result]) -> str:
    lines = [
        "| N | transfers | first lookup (ms) | cached lookup (us) | hashing the schedule (us) "
        "| header and channel (us) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.n} | {r.transfers:,} | {r.first_ms:.2f} | {r.cached_us:.2f} | {r.hash_us:,.0f} "
        f"| {r.channel_us:.2f} |"
        for r in results
    ]
    at64 = [r for r in results if r.n == 64]
    if at64:
        verdict = "met" if at64[0].cached_us <= TARGET_US else "MISSED"
        lines.append(
            f"\ncached lookup at N=64: {at64[0].cached_us:.2f} us (target <= {TARGET_US:g} us: {verdict})"
        )
    worst = max(r.channel_us for r in results)
    verdict = "met" if worst <= CHANNEL_TARGET_US else "MISSED"
    lines.append(
        f"header and channel, worst N: {worst:.2f} us (target <= {CHANNEL_TARGET_US:g} us: {verdict})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Time the runtime's plan lookup per N.")
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256], metavar="N")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", type=Path, metavar="FILE", help="also save the results as JSON")
    args = parser.parse_args(argv)
    results = [bench(n, args.calls) for n in args.sizes]
    print(table(results))
    if args.json:
        save(args.json, {"results": [asdict(r) for r in results]})


if __name__ == "__main__":
    main()
