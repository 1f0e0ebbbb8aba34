"""bench_gpu.py's ``device_packets`` part: up to which chunk size packets beat flags, the measure
the engine's own :attr:`~stragglar.runtime.device.kernel.Tuning.packet_bytes` is to be set from.

A transfer on flags costs two trips through memory (the data, then the flag's release, which
waits for it), a transfer as packets one, for twice the bytes: so packets should win while a
round waits on latency, and lose once it waits on bandwidth.  This times the device engine's
punctual call at N = 8, C = 64 (float32, the engine's own tuning otherwise) both ways, on the
GPU's clock, in the same run, over chunks of 16 KiB to 1 MiB (buffers of 1 to 64 MiB a rank).

Rows, one per size: ``n``, ``chunks``, ``size_bytes``, ``chunk_bytes`` (the largest chunk),
``flags_gpu_round_us`` and ``packets_gpu_round_us`` (the median call over the rounds on the GPU's
clock, every transfer on flags, and every transfer as packets), ``flags_exact`` and
``packets_exact`` (every call of each checked on the device against the sum).  Under the table,
the verdict: the largest chunk up to which packets were faster at every size measured, by more
than :data:`NOISE` (what ``packet_bytes`` would be), and any larger chunk where they were faster
again (not taken: a threshold holds for every chunk below it); none at all where either way gave
a wrong sum anywhere (packets must not be turned on, and a comparison with a wrong run says
nothing).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_device import FLAGS, PACKETS, loopback_call, state_of, timed
from gpu_inputs import size_text

from stragglar.runtime.device.kernel import OWN_TUNING
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove

N, CHUNKS, DTYPE = 8, 64, "float32"
SIZES = tuple(1 << s for s in range(20, 27))  # 1 MiB to 64 MiB a rank: chunks of 16 KiB to 1 MiB
NOISE = 0.05  # packets less than this much faster than flags are not called faster


@dataclass(frozen=True)
class PacketRow:
    n: int
    chunks: int
    size_bytes: int
    chunk_bytes: int
    flags_gpu_round_us: float
    packets_gpu_round_us: float
    flags_exact: bool
    packets_exact: bool


def device_packets(
    xp: Any, sync: Callable[[], None], iters: int, progress: Callable[[str], None]
) -> list[PacketRow]:
    proof = prove(synthesize("stragglar", N, chunks=CHUNKS))
    rows = []
    for size in SIZES:
        rows.append(size_row(xp, sync, proof, size, iters))
        progress(row_line(rows[-1]))
    return rows


def size_row(xp: Any, sync: Callable[[], None], proof: Proof, size_bytes: int, iters: int) -> PacketRow:
    """One size's calls on flags, then as packets, each on the state it runs on (whose GPU time
    each call is read from)."""
    itemsize = xp.dtype(DTYPE).itemsize
    count = size_bytes // itemsize
    rounds, exact = [], []
    for tuning in (FLAGS, PACKETS):
        state = state_of(xp, proof, count, DTYPE, tuning)
        call = loopback_call(xp, proof, tuning=tuning)
        calls = timed(xp, sync, proof.num_ranks, count, DTYPE, call, iters, state)
        rounds.append(statistics.median(calls.gpu) * 1e6 / proof.num_rounds)
        exact.append(calls.exact)
    chunk = -(-count // proof.num_chunks) * itemsize
    return PacketRow(proof.num_ranks, proof.num_chunks, size_bytes, chunk, rounds[0], rounds[1], *exact)


def row_line(r: PacketRow) -> str:
    """A row in a line, printed as soon as it is measured: a run cut short by its time limit still
    shows the sizes it measured."""
    return (
        f"packets N={r.n} C={r.chunks} {size_text(r.size_bytes)} (chunks of {size_text(r.chunk_bytes)}): "
        f"flags {r.flags_gpu_round_us:.2f} us a round on the GPU ({_exact(r.flags_exact)}), "
        f"packets {r.packets_gpu_round_us:.2f} ({_exact(r.packets_exact)})"
    )


def _exact(exact: bool) -> str:
    return "exact" if exact else "NOT exact"


def faster(r: PacketRow) -> bool:
    """Whether packets beat flags in row ``r`` by more than the noise."""
    return r.packets_gpu_round_us < (1 - NOISE) * r.flags_gpu_round_us


def packet_threshold(rows: list[PacketRow]) -> int:
    """The largest chunk (bytes) up to which packets were faster at every chunk size measured,
    the smallest included; 0 where they were not faster at the smallest, and where any row of
    either way was not exact.

    >>> row = lambda kib, flags, packets: PacketRow(8, 64, kib << 16, kib << 10, flags, packets, True, True)
    >>> packet_threshold([row(16, 4.0, 2.0), row(32, 5.0, 3.0), row(64, 6.0, 6.5), row(128, 9.0, 4.0)])
    32768
    >>> packet_threshold([row(16, 4.0, 3.9)])  # within the noise
    0
    """
    if not all(r.flags_exact and r.packets_exact for r in rows):
        return 0
    threshold = 0
    for r in sorted(rows, key=lambda r: r.chunk_bytes):
        if not faster(r):
            break
        threshold = r.chunk_bytes
    return threshold


def packets_table(rows: list[PacketRow]) -> str:
    lines = [
        "| N | C | size | chunk | flags on the GPU/round (us) | packets on the GPU/round (us) "
        "| packets over flags | flags exact | packets exact |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.n} | {r.chunks} | {size_text(r.size_bytes)} | {size_text(r.chunk_bytes)} "
            f"| {r.flags_gpu_round_us:.2f} | {r.packets_gpu_round_us:.2f} "
            f"| {r.packets_gpu_round_us / r.flags_gpu_round_us:.2f}x | {'yes' if r.flags_exact else 'NO'} "
            f"| {'yes' if r.packets_exact else 'NO'} |"
        )
    return "\n".join([*lines, "", *packets_verdict(rows)])


def packets_verdict(rows: list[PacketRow]) -> list[str]:
    """What the rows say ``packet_bytes`` should be, beside the engine's own: nothing to take where
    no row was measured or any gave a wrong sum (each named, with the way that gave it)."""
    own = f"the engine's own packet_bytes is {OWN_TUNING.packet_bytes}"
    if not rows:
        return [f"packets: no chunk size measured, no packet_bytes to take ({own})"]
    wrong = [
        f"{how} at chunks of {size_text(r.chunk_bytes)}"
        for r in rows
        for how, exact in (("flags", r.flags_exact), ("packets", r.packets_exact))
        if not exact
    ]
    if wrong:
        return [f"NOT exact: {', '.join(wrong)}: no packet_bytes to take ({own})"]
    threshold = packet_threshold(rows)
    if threshold:
        out = [
            f"packets faster than flags (by more than {NOISE:.0%}) for chunks up to {size_text(threshold)}: "
            f"packet_bytes {threshold} ({own})"
        ]
    else:
        smallest = min(r.chunk_bytes for r in rows)
        out = [
            f"packets not faster than flags (by more than {NOISE:.0%}) at the smallest chunk, "
            f"{size_text(smallest)}: packet_bytes 0 ({own})"
        ]
    beyond = [size_text(r.chunk_bytes) for r in rows if faster(r) and r.chunk_bytes > threshold]
    if beyond:
        out.append(
            f"packets faster again at chunks of {', '.join(beyond)}, beyond one where they were not: "
            "not taken"
        )
    return out
