"""bench_gpu.py's ``device_tuning`` part: the device engine's kernel under other tunings (the
blocks a rank at most, the 16-byte vectors a thread keeps in flight, a block's threads, the sleep
between two looks at a flag) against the engine's own, in the same run, at the settings of the
device engine's speed targets.

The results are the same bits under every tuning (tests/test_runtime_device_kernel.py); what a
tuning changes is how much of the device's memory bandwidth and latency a round uses.  At 1 MiB a
round is a few kilobytes a block, so the flags' latency rules (fewer blocks wait on fewer flags,
and each moves more); at 64 MiB the copies do, and the blocks and the loads a thread has in
flight decide how close they come to a plain copy.  Where a setting's chunks are small enough for
packets (at most :data:`~stragglar.runtime.device.kernel.PACKET_BYTES`: the 1 MiB setting), its
blocks, threads and pauses are swept with every transfer as packets too, whose best tuning need
not be the flags'.

Rows, one per tuning and setting (a tuning that gives the same launch as one already measured in
the setting is not measured again): ``n``, ``chunks``, ``size_bytes``, ``dtype`` (float32),
``max_blocks``, ``vectors``, ``threads`` and ``pause_ns`` (the tuning), ``blocks`` (what the
device gave a rank), ``round_us`` (the median call over the rounds, timed by the host; punctual
calls, replayed from one CUDA graph after the first), ``gpu_round_us`` (the same calls on the
GPU's clock: what the tunings are compared by, the host's part being the same for all),
``gpu_copy_efficiency`` (at 64 MiB: as in gpu_device.py, on the GPU's times), ``exact`` (every call
checked on the device), ``own`` (the engine's own tuning) and ``packets`` (every transfer moved
as packets, else on flags).  The table holds the engine's own
and the :data:`SHOWN` fastest of each setting (the JSON every row).  Under the table, per
setting, the fastest exact tuning and its time over the engine's own; within :data:`NOISE` of it,
the engine's own is said to be as fast.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_device import FLAGS, PACKETS, copy_seconds, efficiency_of, loopback_call, or_dash, state_of, timed

from stragglar.runtime.device.kernel import OWN_TUNING, PACKET_BYTES, PAUSES_NS, THREADS, VECTORS, Tuning
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove

MAX_BLOCKS = (1, 2, 4, 8, 16, 32, 64)  # the blocks a rank at most, swept: fewer flags, or more copies at once
SETTINGS = ((8, 64, 1 << 20), (8, None, 64 << 20))  # (n, chunks (None: the paper's), bytes a rank)
NOISE = 0.05  # a tuning less than this much faster than the engine's own is not called faster
SHOWN = 12  # the fastest tunings of a setting the printed table holds (beside the engine's own)
DTYPE = "float32"


@dataclass(frozen=True)
class TuningRow:
    n: int
    chunks: int
    size_bytes: int
    dtype: str
    max_blocks: int
    vectors: int
    threads: int
    pause_ns: int
    blocks: int
    round_us: float
    gpu_round_us: float
    gpu_copy_efficiency: float | None
    exact: bool
    own: bool
    packets: bool  # every transfer moved as packets (else on flags)


def tunings(packets: bool) -> list[Tuning]:
    """The engine's own tuning first, then every other one swept on flags, and with ``packets``
    (a setting of small chunks) as packets too: their blocks, threads and pauses (a packet row
    moves no 16-byte vectors, so the vectors stay the engine's own)."""
    own = OWN_TUNING
    swept = [
        Tuning(max_blocks=b, vectors=v, threads=t, pause_ns=p, packet_bytes=FLAGS.packet_bytes)
        for b in MAX_BLOCKS
        for v in VECTORS
        for t in THREADS
        for p in PAUSES_NS
    ]
    if packets:
        swept += [
            Tuning(
                max_blocks=b, vectors=own.vectors, threads=t, pause_ns=p, packet_bytes=PACKETS.packet_bytes
            )
            for b in MAX_BLOCKS
            for t in THREADS
            for p in PAUSES_NS
        ]
    return [own, *(t for t in swept if t != own)]


def setting_rows(
    xp: Any, sync: Callable[[], None], proof: Proof, size_bytes: int, iters: int
) -> list[TuningRow]:
    """Every tuning's row at one setting, the engine's own first."""
    n = proof.num_ranks
    itemsize = xp.dtype(DTYPE).itemsize
    count = size_bytes // itemsize
    copy = copy_seconds(xp, sync, n * size_bytes, iters)[1] if size_bytes >= 64 << 20 else None
    rows: list[TuningRow] = []
    seen: set[tuple[bool, int, int, int, int]] = set()
    small = Tuning(packet_bytes=PACKET_BYTES).moves_packets(count, proof.num_chunks, DTYPE)
    for tuning in tunings(packets=small):
        state = state_of(xp, proof, count, DTYPE, tuning)  # made now: it says the blocks it got
        packets = state.program.packets
        launch = (packets, state.blocks, 0 if packets else tuning.vectors, tuning.threads, tuning.pause_ns)
        if launch in seen:
            continue
        seen.add(launch)
        calls = timed(xp, sync, n, count, DTYPE, loopback_call(xp, proof, tuning=tuning), iters, state)
        gpu_seconds = statistics.median(calls.gpu)
        efficiency = (
            None if copy is None else efficiency_of(proof, count, itemsize, gpu_seconds, copy, size_bytes)
        )
        rows.append(
            TuningRow(
                n,
                proof.num_chunks,
                size_bytes,
                DTYPE,
                tuning.max_blocks,
                tuning.vectors,
                tuning.threads,
                tuning.pause_ns,
                state.blocks,
                statistics.median(calls.host) * 1e6 / proof.num_rounds,
                gpu_seconds * 1e6 / proof.num_rounds,
                efficiency,
                calls.exact,
                tuning == OWN_TUNING,
                packets,
            )
        )
    return rows


def device_tuning(
    xp: Any, sync: Callable[[], None], iters: int, progress: Callable[[str], None]
) -> list[TuningRow]:
    rows: list[TuningRow] = []
    for n, chunks, size in SETTINGS:
        proof = prove(synthesize("stragglar", n, chunks=chunks))
        measured = setting_rows(xp, sync, proof, size, iters)
        rows += measured
        progress(setting_line(measured))
    return rows


def setting_line(rows: list[TuningRow]) -> str:
    """One setting's rows in a line, printed as soon as they are measured: a run cut short by its
    time limit still shows the settings it measured."""
    own = next(r for r in rows if r.own)
    best = min((r for r in rows if r.exact), key=lambda r: r.gpu_round_us, default=own)
    return (
        f"tuning N={own.n} C={own.chunks} {own.size_bytes >> 10} KiB: own {own.gpu_round_us:.2f} us a round "
        f"on the GPU, fastest {best.gpu_round_us:.2f} ({described(best)})"
        + ("" if all(r.exact for r in rows) else ", some NOT exact")
    )


def described(r: TuningRow) -> str:
    """A row's tuning and the blocks it got, in words (a packet row moves no vectors)."""
    vectors = "" if r.packets else f", vectors {r.vectors}"
    return (
        f"{'packets, ' if r.packets else ''}max blocks {r.max_blocks} (blocks {r.blocks}){vectors}, "
        f"{r.threads} threads, pause {r.pause_ns} ns"
    )


def tuning_table(rows: list[TuningRow]) -> str:
    """Per setting, the engine's own tuning and the :data:`SHOWN` fastest exact ones (an inexact
    row always), then the verdicts."""
    lines = [
        "| N | C | size | moves | max blocks | vectors | threads | pause (ns) | blocks | device/round (us) "
        "| on the GPU/round (us) | copy efficiency on the GPU | exact |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for setting in _settings(rows):
        ranked = sorted((r for r in setting if r.exact), key=lambda r: r.gpu_round_us)
        shown = {id(r) for r in ranked[:SHOWN]} | {id(r) for r in setting if r.own or not r.exact}
        for r in setting:
            if id(r) not in shown:
                continue
            moves = "packets" if r.packets else "flags"
            own = " (own)" if r.own else ""
            vectors = "-" if r.packets else r.vectors
            tuning = f"{moves} | {r.max_blocks}{own} | {vectors} | {r.threads} | {r.pause_ns}"
            lines.append(
                f"| {r.n} | {r.chunks} | {r.size_bytes >> 10} KiB | {tuning} | {r.blocks} | {r.round_us:.2f} "
                f"| {r.gpu_round_us:.2f} | {or_dash(r.gpu_copy_efficiency)} | {'yes' if r.exact else 'NO'} |"
            )
    return "\n".join([*lines, "", *fastest(rows)])


def _settings(rows: list[TuningRow]) -> list[list[TuningRow]]:
    """The rows of each setting, in the order measured."""
    keys = dict.fromkeys((r.n, r.chunks, r.size_bytes) for r in rows)
    return [[r for r in rows if (r.n, r.chunks, r.size_bytes) == key] for key in keys]


def fastest(rows: list[TuningRow]) -> list[str]:
    """Per setting, the fastest exact tuning on the GPU against the engine's own; an inexact row
    named."""
    out = []
    for mine in _settings(rows):
        where = f"N={mine[0].n} C={mine[0].chunks} {mine[0].size_bytes >> 10} KiB"
        wrong = [r for r in mine if not r.exact]
        if wrong:
            out.append(f"NOT exact at {where}: " + "; ".join(described(r) for r in wrong))
        own = next((r for r in mine if r.own), None)
        exact = [r for r in mine if r.exact]
        if own is None or not own.exact or not exact:
            out.append(f"no comparison at {where}: the engine's own tuning has no exact row")
            continue
        best = min(exact, key=lambda r: r.gpu_round_us)
        ratio = best.gpu_round_us / own.gpu_round_us
        if best is own or ratio > 1 - NOISE:
            out.append(
                f"at {where} the engine's own tuning ({described(own)}) is as fast as any: "
                f"{own.gpu_round_us:.2f} us a round on the GPU, the fastest {best.gpu_round_us:.2f}"
            )
        else:
            out.append(
                f"fastest at {where}: {described(best)}: {best.gpu_round_us:.2f} us a round on the GPU, "
                f"{ratio:.2f}x the engine's own ({described(own)}: {own.gpu_round_us:.2f} us)"
            )
    return out
