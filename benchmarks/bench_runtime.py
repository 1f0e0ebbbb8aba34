"""Time what a call of the runtime pays beside moving data: the plan lookup, the channel, and a
device call's bookkeeping.

    python benchmarks/bench_runtime.py [--gpus 8 64 256] [--calls 2000] [--json out.json]

For each N: the first lookup of a rank's plan (compile the schedule, bind it to a 1M-element
buffer), then the median of ``--calls`` cached lookups of the same plan (what every later bucket
pays), beside the cost of hashing the whole schedule, which is what a cache keyed on the
``Schedule`` itself paid per hit before plans were keyed on its fingerprint; and the median cost of
a call's header and channel bookkeeping when its channel repeats its setup (no check: the common
case, :mod:`stragglar.runtime.channels`).  Targets: a cached lookup at N = 64 within 50 us, the
header and channel within 10 us.

And the device engine's (``engine="device"``) host bookkeeping of a call in one process, at N = 8
with C = 64 and at N = 16 with the paper's chunks: every rank's timeline (the phases it has rows
in) and the check of every rank's words for a failure, beside the same with each rank's phases
found by scanning its rows, as every call did before they were worked out once per program.
Target: within 10.8 us at N = 8, C = 64, a tenth of the 108 us that a call of its 72 rounds has
at the device engine's 1.5 us a round.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from options import Parser, as_command, each, json_output, whole
from results import save

from stragglar.runtime import plan_for
from stragglar.runtime.channels import Channels
from stragglar.runtime.clock import Timeline
from stragglar.runtime.device import program_for
from stragglar.runtime.device.kernel import RANK_WORDS
from stragglar.runtime.device.loopback import call_failure
from stragglar.runtime.device.table import DeviceProgram
from stragglar.runtime.header import make_header
from stragglar.synth import synthesize
from stragglar.verify import prove

COUNT = 1 << 20  # elements of the bucket the plan is bound to
TARGET_US = 50.0  # the cached lookup at N = 64
CHANNEL_TARGET_US = 10.0  # a call's header and channel, when the channel repeats its setup
DEVICE_SETTINGS = ((8, 64), (16, None))  # (N, chunks: None for the paper's)
DEVICE_TARGET_US = 10.8  # N = 8, C = 64: a tenth of 72 rounds at 1.5 us


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


@dataclass(frozen=True)
class DeviceResult:
    n: int
    chunks: int
    bookkeeping_us: float  # median: every rank's timeline and the failure check of a call
    scanning_us: float  # the same, each rank's phases found by scanning its rows


def scanned_phase_ends(program: DeviceProgram, rank: int, done: float) -> tuple[float | None, ...]:
    """A rank's phase ends as every call worked them out before: its rows' rounds, each mapped to
    its phase among the phase starts (the comparison the device rows are timed against)."""
    rounds = {int(r) for r in program.rows[rank][:, 1]}
    ends = {max(i for i, start in enumerate(program.phase_starts) if start <= r) for r in rounds}
    return tuple(done if phase in ends else None for phase in range(len(program.phases)))


def device_bench(n: int, chunks: int | None, calls: int) -> DeviceResult:
    """A device call's host bookkeeping, the way it is done and with the rows scanned."""
    proof = prove(synthesize("stragglar", n, chunks=chunks))
    program = program_for(proof, direct=True)
    words = np.zeros((n, RANK_WORDS), dtype=np.uint64)
    words[:, 0] = 1  # every rank's kernel ended call 1, none failed

    def bookkeeping(phase_ends: Callable[[DeviceProgram, int, float], tuple[float | None, ...]]) -> float:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            lines = [Timeline(r, start, start, phase_ends(program, r, start), start) for r in range(n)]
            failure = call_failure(program, words, 1)
            times.append(time.perf_counter() - start)
            assert failure is None and len(lines) == n
        return statistics.median(times) * 1e6

    for r in range(n):  # both ways give every rank the same phases
        assert program.phase_ends(r, 1.0) == scanned_phase_ends(program, r, 1.0)
    return DeviceResult(
        n, proof.num_chunks, bookkeeping(DeviceProgram.phase_ends), bookkeeping(scanned_phase_ends)
    )


def device_table(results: list[DeviceResult]) -> str:
    lines = [
        "| N | C | device call's bookkeeping (us) | with the rows scanned (us) |",
        "|---:|---:|---:|---:|",
        *(f"| {r.n} | {r.chunks} | {r.bookkeeping_us:.2f} | {r.scanning_us:.2f} |" for r in results),
    ]
    headline = [r for r in results if (r.n, r.chunks) == (8, 64)]
    if headline:
        us = headline[0].bookkeeping_us
        verdict = "met" if us <= DEVICE_TARGET_US else "MISSED"
        lines.append(
            f"\ndevice call's bookkeeping at N=8 C=64: {us:.2f} us (target <= {DEVICE_TARGET_US:g} us: "
            f"{verdict}), {headline[0].scanning_us / us:.0f}x less than with the rows scanned"
        )
    return "\n".join(lines)


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
    parser = Parser(description="Time the runtime's plan lookup per N.")
    parser.add_gpus(default=[8, 64, 256])
    parser.add_argument("--calls", type=whole(1, 10**6), default=2000, help="timed calls per N (median)")
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also save the results as JSON")
    args = parser.parse_args(argv)
    results = [bench(n, args.calls) for n in each(args.gpus, lambda n: f"N = {n}")]
    print(table(results))
    device = [
        device_bench(n, c, args.calls) for n, c in each(DEVICE_SETTINGS, lambda s: f"device, N = {s[0]}")
    ]
    print()
    print(device_table(device))
    if args.json:
        save(args.json, {"results": [asdict(r) for r in results], "device": [asdict(r) for r in device]})


if __name__ == "__main__":
    as_command(main)
