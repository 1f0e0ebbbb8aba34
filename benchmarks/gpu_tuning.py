"""bench_gpu.py's ``device_tuning`` part: the device engine's kernel under other tunings (the
blocks a rank at most, the 16-byte vectors a thread keeps in flight) against the engine's own,
in the same run, at the settings of the device engine's speed targets.

The results are the same bits under every tuning (tests/test_runtime_device_kernel.py); what a
tuning changes is how much of the device's memory bandwidth and latency a round uses.  At 1 MiB a
round is a few kilobytes a block, so the flags' latency rules (fewer blocks wait on fewer flags,
and each moves more); at 64 MiB the copies do, and the blocks and the loads a thread has in
flight decide how close they come to a plain copy.

Rows, one per tuning and setting (a tuning that gives the same blocks and vectors as one already
measured in the setting is not measured again): ``n``, ``chunks``, ``size_bytes``, ``dtype``
(float32), ``max_blocks`` and ``vectors`` (the tuning), ``blocks`` (what the device gave a rank),
``round_us`` (the median call over the rounds; punctual calls, replayed from one CUDA graph after
the first), ``copy_efficiency`` (at 64 MiB: as in gpu_device.py), ``exact`` (every call checked on
the device) and ``own`` (the engine's own tuning).  Under the table, per setting, the fastest
exact tuning and its time over the engine's own; within :data:`NOISE` of it, the engine's own is
said to be as fast.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_device import copy_seconds, efficiency_of, loopback_call, timed

from stragglar.runtime.device import program_for
from stragglar.runtime.device.kernel import OWN_TUNING, VECTORS, Tuning
from stragglar.runtime.device.loopback import device_loopback
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove

MAX_BLOCKS = (1, 2, 4, 8, 16, 32, 64)  # the blocks a rank at most, swept: fewer flags, or more copies at once
SETTINGS = ((8, 64, 1 << 20), (8, None, 64 << 20))  # (n, chunks (None: the paper's), bytes a rank)
NOISE = 0.05  # a tuning less than this much faster than the engine's own is not called faster
DTYPE = "float32"


@dataclass(frozen=True)
class TuningRow:
    n: int
    chunks: int
    size_bytes: int
    dtype: str
    max_blocks: int
    vectors: int
    blocks: int
    round_us: float
    copy_efficiency: float | None
    exact: bool
    own: bool


def tunings() -> list[Tuning]:
    """The engine's own tuning first, then every other one swept."""
    own = OWN_TUNING
    swept = [Tuning(max_blocks=b, vectors=v) for b in MAX_BLOCKS for v in VECTORS]
    return [own, *(t for t in swept if t != own)]


def blocks_of(xp: Any, proof: Proof, count: int, tuning: Tuning) -> int:
    """The blocks a rank the device gives ``tuning`` (the state the calls will use, made now)."""
    program = program_for(proof, direct=True)
    device = int(xp.cuda.Device().id)
    fingerprint = proof.schedule.fingerprint
    return device_loopback(xp, count, DTYPE, device, program, fingerprint, tuning=tuning).blocks


def setting_rows(
    xp: Any, sync: Callable[[], None], proof: Proof, size_bytes: int, iters: int
) -> list[TuningRow]:
    """Every tuning's row at one setting, the engine's own first."""
    n = proof.num_ranks
    itemsize = xp.dtype(DTYPE).itemsize
    count = size_bytes // itemsize
    copy = copy_seconds(xp, sync, n * size_bytes, iters) if size_bytes >= 64 << 20 else None
    rows: list[TuningRow] = []
    seen: set[tuple[int, int]] = set()
    for tuning in tunings():
        blocks = blocks_of(xp, proof, count, tuning)
        if (blocks, tuning.vectors) in seen:
            continue
        seen.add((blocks, tuning.vectors))
        times, exact = timed(xp, sync, n, count, DTYPE, loopback_call(xp, proof, tuning=tuning), iters)
        seconds = statistics.median(times)
        efficiency = (
            None if copy is None else efficiency_of(proof, count, itemsize, seconds, copy, size_bytes)
        )
        rows.append(
            TuningRow(
                n,
                proof.num_chunks,
                size_bytes,
                DTYPE,
                tuning.max_blocks,
                tuning.vectors,
                blocks,
                seconds * 1e6 / proof.num_rounds,
                efficiency,
                exact,
                tuning == OWN_TUNING,
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
    best = min((r for r in rows if r.exact), key=lambda r: r.round_us, default=own)
    return (
        f"tuning N={own.n} C={own.chunks} {own.size_bytes >> 10} KiB: own {own.round_us:.2f} us a round, "
        f"fastest {best.round_us:.2f} (max blocks {best.max_blocks}, vectors {best.vectors})"
        + ("" if all(r.exact for r in rows) else ", some NOT exact")
    )


def tuning_table(rows: list[TuningRow]) -> str:
    lines = [
        "| N | C | size | max blocks | vectors | blocks | device/round (us) | copy efficiency | exact |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        efficiency = "-" if r.copy_efficiency is None else f"{r.copy_efficiency:.2f}"
        tuning = f"{r.max_blocks}{' (own)' if r.own else ''} | {r.vectors} | {r.blocks}"
        lines.append(
            f"| {r.n} | {r.chunks} | {r.size_bytes >> 10} KiB | {tuning} | {r.round_us:.2f} | {efficiency} "
            f"| {'yes' if r.exact else 'NO'} |"
        )
    return "\n".join([*lines, "", *fastest(rows)])


def fastest(rows: list[TuningRow]) -> list[str]:
    """Per setting, the fastest exact tuning against the engine's own; an inexact row named."""
    out = []
    for setting in dict.fromkeys((r.n, r.chunks, r.size_bytes) for r in rows):
        mine = [r for r in rows if (r.n, r.chunks, r.size_bytes) == setting]
        where = f"N={setting[0]} C={setting[1]} {setting[2] >> 10} KiB"
        wrong = [r for r in mine if not r.exact]
        if wrong:
            tried = ", ".join(f"max blocks {r.max_blocks} vectors {r.vectors}" for r in wrong)
            out.append(f"NOT exact at {where}: {tried}")
        own = next((r for r in mine if r.own), None)
        exact = [r for r in mine if r.exact]
        if own is None or not own.exact or not exact:
            out.append(f"no comparison at {where}: the engine's own tuning has no exact row")
            continue
        best = min(exact, key=lambda r: r.round_us)
        ratio = best.round_us / own.round_us
        if best is own or ratio > 1 - NOISE:
            out.append(
                f"at {where} the engine's own tuning (blocks {own.blocks}, vectors {own.vectors}) is as fast "
                f"as any: {own.round_us:.2f} us a round, the fastest {best.round_us:.2f}"
            )
        else:
            out.append(
                f"fastest at {where}: max blocks {best.max_blocks} (blocks {best.blocks}), vectors "
                f"{best.vectors}: {best.round_us:.2f} us a round, {ratio:.2f}x the engine's own "
                f"(blocks {own.blocks}, vectors {own.vectors}: {own.round_us:.2f} us)"
            )
    return out
