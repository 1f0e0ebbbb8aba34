"""bench_gpu.py's ``device_executor`` part: the device engine (one persistent kernel per rank,
``allreduce_local(..., engine="device")``) against the graphed loopback in the same run.

Rows, one per setting: ``n``, ``chunks``, ``size_bytes``, ``dtype``, ``round_us`` (the median
call over the schedule's rounds, every call on the same buffers refilled before it, as a training
loop reuses its buckets; from the second call on, a call replays every rank's launch from one
CUDA graph), ``gpu_round_us`` (the same calls' time on the GPU, from before the first launch to
the end of the last kernel, over the rounds: the kernels' own time, without the host's checks
before and after a call, which every call pays once), ``copy_efficiency`` (the bytes the schedule
reads and writes, per second, over a plain device copy's, both timed by the host: a chunk copied
is read once and written once, a chunk reduced is read twice and written once; a transfer staged
through an inbox moves its chunk twice, and that is not counted: it is what the efficiency pays
for), ``gpu_copy_efficiency`` (the same on the GPU's times of both), ``late_ratio`` where measured (the
late rank launched 1 ms late at 64 MiB: the time from its launch to the end over the whole
AllReduce with nobody late; the hidden phase stays hidden when it is well below 1),
``graph_round_us`` (the loopback with CUDA graphs, same setting, float32 only),
``staged_round_us`` and ``staged_copy_efficiency`` (the same call with every transfer staged,
``staged=True``, in the N = 8 float32 rows: what the direct transfers gain, on flags; where the
engine's own moves a row's chunks as packets, the staged call runs the same packets),
``eager_round_us`` (the same call with ``graphs=False``, every rank's kernel launched by the host
each call, in the N = 8 float32 rows: what the one graph launch saves), ``system_round_us`` (the
same call with its flags (or packets, where the engine's own moves them) released and acquired
at the system's scope, as ranks on several GPUs need, in the N = 8 float32 rows: what that
scope costs over the GPU's; timed through the engine's
inner call, without ``allreduce_local``'s checks, so set ``system_gpu_round_us``, the same calls
on the GPU's clock, beside ``gpu_round_us``), ``flags_gpu_round_us`` and ``packets_gpu_round_us``
(the same inner calls on the GPU's clock with every transfer waiting on flags, and with every
transfer moved as packets, in the N = 8 float32 rows: the engine's own is on flags until these
say packets are faster, and up to which chunk size), ``exact`` and
``capture_failure`` (why the default calls ran without their graph, from the warning the engine
gave; None where they replayed it) (every
call's result checked on the device against the sum: values distinct per rank and element, exact
in the dtype).

Targets (issue 34), on the GPU's times: per round at N = 8, C = 64, 1 MiB <= 1.5 us; at N = 8,
64 MiB and 256 MiB (the paper's C and C = 64) a copy efficiency >= 0.7; exact for N = 3..16 and
every dtype; and, on the host's (the late rank's timeline against a punctual call's), the late
ratio at 64 MiB <= 0.7.  The round's and the efficiency's verdict lines give the host's figure
beside.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stragglar.runtime import allreduce_local
from stragglar.runtime.device import DeviceProgram, program_for
from stragglar.runtime.device.kernel import OWN_TUNING, Tuning
from stragglar.runtime.device.loopback import DeviceLoopback, device_loopback, run_device_loopback
from stragglar.runtime.plans import late_rank_for
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove

ROUND_TARGET_US = 1.5  # N = 8, C = 64, 1 MiB
EFFICIENCY_TARGET = 0.7  # N = 8, 64 and 256 MiB
LATE_TARGET = 0.7  # 64 MiB, the late rank 1 ms late
LATE_DELAY_S = 1e-3
DTYPES = ("float16", "float32", "float64", "int32", "int64")  # CuPy has no bfloat16
FLAGS = Tuning(packet_bytes=0)  # no chunk moves as packets (the engine's own so far)
PACKETS = Tuning(packet_bytes=1 << 62)  # the engine's own, but every chunk moves as packets
PERIOD = 7  # inputs repeat with this period: every partial sum is a small integer, exact in float16


@dataclass(frozen=True)
class DeviceRow:
    n: int
    chunks: int
    size_bytes: int
    dtype: str
    round_us: float
    gpu_round_us: float  # the default calls' time on the GPU, over the rounds
    copy_efficiency: float | None
    gpu_copy_efficiency: float | None  # on the GPU's times of the calls and of the copy
    late_ratio: float | None
    graph_round_us: float | None
    staged_round_us: float | None  # every transfer through the inboxes (staged=True), N = 8 float32 rows
    staged_copy_efficiency: float | None
    eager_round_us: float | None  # each rank's kernel launched by the host (graphs=False), N = 8 float32
    system_round_us: float | None  # flags at the system's scope (as across GPUs), N = 8 float32
    system_gpu_round_us: float | None  # the same calls on the GPU's clock, to set beside gpu_round_us
    flags_gpu_round_us: float | None  # every transfer waiting on flags, on the GPU's clock, N = 8 float32
    packets_gpu_round_us: float | None  # every transfer as packets, on the GPU's clock, N = 8 float32
    exact: bool
    capture_failure: str | None = None  # why the default calls ran without their graph


def schedule_bytes(proof: Proof, count: int, itemsize: int) -> int:
    """What the schedule reads and writes: per transfer, its chunk read and written, a reduced
    chunk read once more (the receiver's own value)."""
    base, extra = divmod(count, proof.num_chunks)
    total = 0
    for phase in proof.schedule.phases:
        for rnd in phase.rounds:
            for t in rnd:
                size = (base + (t.chunk < extra)) * itemsize
                total += size * (3 if t.op.value == "reduce" else 2)
    return total


def inputs(xp: Any, n: int, count: int, dtype: str) -> tuple[list[Any], Any]:
    """Each rank's input, made on the device (element i of rank r: ``(i + r) % PERIOD + r``,
    distinct per rank within a period), and their sum."""
    base = xp.arange(count, dtype=xp.int64)
    bufs = [((base + r) % PERIOD + r).astype(dtype) for r in range(n)]
    want = sum(((base + r) % PERIOD + r) for r in range(n)).astype(dtype)
    return bufs, want


@dataclass(frozen=True)
class Timed:
    """A setting's timed calls: the host's time of each (s), its time on the GPU where the engine
    kept it (s; else empty), and whether every result was exact."""

    host: list[float]
    gpu: list[float]
    exact: bool


def timed(
    xp: Any,
    sync: Callable[[], None],
    n: int,
    count: int,
    dtype: str,
    call: Callable[[list[Any]], object],
    iters: int,
    state: DeviceLoopback | None = None,
) -> Timed:
    """``iters`` timed calls after one untimed, each on fresh inputs written into the same buffers
    (as a training loop reuses its buckets, and as the loopback part's rows are timed) and
    checked; ``state``: the device engine's state the calls run on, whose GPU time each is read
    from."""
    fresh, want = inputs(xp, n, count, dtype)
    bufs = [xp.empty(count, dtype=dtype) for _ in range(n)]
    host: list[float] = []
    gpu: list[float] = []
    exact = True
    for i in range(iters + 1):
        for buf, values in zip(bufs, fresh, strict=True):
            xp.copyto(buf, values)
        sync()
        start = time.perf_counter()
        call(bufs)
        sync()
        if i:
            host.append(time.perf_counter() - start)
            if state is not None:
                gpu.append(state.elapsed_s())
        exact &= all(bool(xp.array_equal(b, want)) for b in bufs)
    return Timed(host, gpu, exact)


def copy_seconds(xp: Any, sync: Callable[[], None], nbytes: int, iters: int) -> tuple[float, float]:
    """A plain device copy of ``nbytes``: the median time (s) timed by the host, and on the GPU."""
    source, target = xp.zeros(nbytes, dtype=xp.uint8), xp.empty(nbytes, dtype=xp.uint8)
    began, ended = xp.cuda.Event(), xp.cuda.Event()
    host, gpu = [], []
    for _ in range(iters + 1):
        sync()
        start = time.perf_counter()
        began.record()
        xp.copyto(target, source)
        ended.record()
        sync()
        host.append(time.perf_counter() - start)
        gpu.append(xp.cuda.get_elapsed_time(began, ended) / 1e3)
    return statistics.median(host[1:]), statistics.median(gpu[1:])


def state_of(
    xp: Any, proof: Proof, count: int, dtype: str, tuning: Tuning = OWN_TUNING, system: bool = False
) -> DeviceLoopback:
    """The device engine's state a punctual call of ``proof`` with direct transfers (or packets,
    where ``tuning`` moves this call's chunks so) runs on (made now if it is not yet), with its
    flags at the system's scope where ``system``."""
    program = program_of(proof, count, dtype, tuning)
    device = int(xp.cuda.Device().id)
    fingerprint = proof.schedule.fingerprint
    return device_loopback(xp, count, dtype, device, program, fingerprint, system, tuning)


def device_row(
    xp: Any, sync: Callable[[], None], proof: Proof, size_bytes: int, dtype: str, iters: int, late: bool
) -> DeviceRow:
    n, c = proof.num_ranks, proof.num_chunks
    itemsize = xp.dtype(dtype).itemsize
    count = size_bytes // itemsize
    exact = True

    def measured(call: Callable[[list[Any]], object], state: DeviceLoopback | None = None) -> Timed:
        """``call``'s timed calls (with their GPU times where ``state``, the state they run on,
        is given); a wrong result makes the row inexact."""
        nonlocal exact
        calls = timed(xp, sync, n, count, dtype, call, iters, state)
        exact &= calls.exact
        return calls

    def median(call: Callable[[list[Any]], object]) -> float:
        return statistics.median(measured(call).host)

    own = state_of(xp, proof, count, dtype)  # the state allreduce_local's default calls run on
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", RuntimeWarning)
        default = measured(lambda b: allreduce_local(b, proof, engine="device"), own)
    seconds, gpu_seconds = statistics.median(default.host), statistics.median(default.gpu)
    failures = [str(w.message) for w in warned if "could not capture" in str(w.message)]
    copy = copy_seconds(xp, sync, n * size_bytes, iters) if size_bytes >= 64 << 20 else None
    efficiency = gpu_efficiency = None
    if copy is not None:
        efficiency = efficiency_of(proof, count, itemsize, seconds, copy[0], size_bytes)
        gpu_efficiency = efficiency_of(proof, count, itemsize, gpu_seconds, copy[1], size_bytes)
    staged = staged_efficiency = eager = system = system_gpu = flags_gpu = packets_gpu = None
    if n == 8 and dtype == "float32":  # the headline rows: direct against staged, graphs against none
        staged = median(lambda b: allreduce_local(b, proof, engine="device", staged=True))
        if copy is not None:
            staged_efficiency = efficiency_of(proof, count, itemsize, staged, copy[0], size_bytes)
        eager = median(lambda b: allreduce_local(b, proof, engine="device", graphs=False))
        scope = state_of(xp, proof, count, dtype, system=True)
        scoped = measured(loopback_call(xp, proof, system=True), scope)
        system, system_gpu = statistics.median(scoped.host), statistics.median(scoped.gpu)
        flags_gpu, packets_gpu = (
            statistics.median(
                measured(loopback_call(xp, proof, tuning=t), state_of(xp, proof, count, dtype, t)).gpu
            )
            for t in (FLAGS, PACKETS)
        )
    late_ratio = None
    if late:
        lates: list[float] = []

        def late_call(bufs: list[Any]) -> None:
            timelines = allreduce_local(bufs, proof, LATE_DELAY_S, engine="device")
            late_line = timelines[proof.schedule.late_rank]
            lates.append(late_line.done - late_line.arrived)

        median(late_call)
        late_ratio = statistics.median(lates[1:]) / seconds
    per_round = 1e6 / proof.num_rounds
    graph = median(lambda b: allreduce_local(b, proof)) * per_round if dtype == "float32" else None
    return DeviceRow(
        n,
        c,
        size_bytes,
        dtype,
        seconds * per_round,
        gpu_seconds * per_round,
        efficiency,
        gpu_efficiency,
        late_ratio,
        graph,
        None if staged is None else staged * per_round,
        staged_efficiency,
        None if eager is None else eager * per_round,
        None if system is None else system * per_round,
        None if system_gpu is None else system_gpu * per_round,
        None if flags_gpu is None else flags_gpu * per_round,
        None if packets_gpu is None else packets_gpu * per_round,
        exact,
        failures[0] if failures else None,
    )


def loopback_call(
    xp: Any, proof: Proof, system: bool = False, tuning: Tuning = OWN_TUNING
) -> Callable[[list[Any]], object]:
    """The device engine's call (direct transfers, or packets where ``tuning`` moves the call's
    chunks so; nobody late, graphs after the first) with its flags at the system's scope where
    ``system`` (as ranks on several GPUs need, here on one) and the kernel's ``tuning``: what
    ``allreduce_local`` does not choose."""

    def call(bufs: list[Any]) -> object:
        count, dtype = int(bufs[0].shape[0]), str(bufs[0].dtype)
        return run_device_loopback(
            xp,
            [int(b.data.ptr) for b in bufs],
            count,
            dtype,
            int(bufs[0].device.id),
            program_of(proof, count, dtype, tuning),
            proof.schedule.fingerprint,
            0.0,
            late_rank_for(proof.schedule, None),
            system=system,
            tuning=tuning,
        )

    return call


def program_of(proof: Proof, count: int, dtype: str, tuning: Tuning) -> DeviceProgram:
    """The proved program a punctual call on ``count`` elements of ``dtype`` runs under ``tuning``:
    packets where its chunks are small enough for them, else direct transfers where safe (what
    ``allreduce_local`` runs under the engine's own)."""
    return program_for(proof, True, tuning.moves_packets(count, proof.num_chunks, dtype))


def efficiency_of(
    proof: Proof, count: int, itemsize: int, seconds: float, copy: float, size_bytes: int
) -> float:
    """The schedule's bytes a second over a plain copy's of every rank's buffer (read and written)."""
    return (schedule_bytes(proof, count, itemsize) / seconds) / (2 * proof.num_ranks * size_bytes / copy)


def settings(quick: bool) -> list[tuple[int, int | None, int, str, bool]]:
    """(n, chunks (None: the paper's), size, dtype, late measured) for each row: every target's
    setting in both, and with ``quick`` the 1 MiB rows of N = 3, 8 and 16 only (the GPU tests
    check every N's sums)."""
    rows: list[tuple[int, int | None, int, str, bool]] = [(8, 64, 1 << 20, "float32", False)]
    rows += [(8, 64, 4 << 20, "float32", False)]  # chunks of PACKET_BYTES: where packets may stop paying
    for size in (64 << 20, 256 << 20):
        rows += [(8, None, size, "float32", size == 64 << 20), (8, 64, size, "float32", False)]
    for n in (3, 8, 16) if quick else range(3, 17):
        rows += [(n, None, 1 << 20, dtype, False) for dtype in DTYPES if (n, dtype) != (8, "float32")]
    return rows


def device_executor(
    xp: Any, sync: Callable[[], None], quick: bool, iters: int, progress: Callable[[str], None]
) -> list[DeviceRow]:
    rows = []
    for n, chunks, size, dtype, late in settings(quick):
        proof = prove(synthesize("stragglar", n, chunks=chunks))
        rows.append(device_row(xp, sync, proof, size, dtype, iters, late))
        progress(row_line(rows[-1]))
    return rows


def row_line(r: DeviceRow) -> str:
    """A row's main figures in a line, printed as soon as it is measured: a run cut short by its
    time limit still shows the rows it measured."""
    return (
        f"device N={r.n} C={r.chunks} {r.size_bytes >> 10} KiB {r.dtype}: {r.round_us:.2f} us a round "
        f"({r.gpu_round_us:.2f} on the GPU), copy efficiency {or_dash(r.copy_efficiency)} "
        f"({or_dash(r.gpu_copy_efficiency)} on the GPU), late ratio {or_dash(r.late_ratio)}, "
        f"{'exact' if r.exact else 'NOT exact'}"
    )


def device_table(rows: list[DeviceRow]) -> str:
    lines = [
        "| N | C | size | dtype | device/round (us) | on the GPU/round (us) | device, eager/round (us) "
        "| system scope on the GPU/round (us) | flags on the GPU/round (us) | packets on the GPU/round (us) "
        "| rounds, graphs/round (us) | copy efficiency "
        "| on the GPU | late ratio | staged/round (us) | staged copy efficiency | exact |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.n} | {r.chunks} | {r.size_bytes >> 10} KiB | {r.dtype} | {r.round_us:.2f} "
            f"| {r.gpu_round_us:.2f} | {or_dash(r.eager_round_us)} | {or_dash(r.system_gpu_round_us)} "
            f"| {or_dash(r.flags_gpu_round_us)} | {or_dash(r.packets_gpu_round_us)} "
            f"| {or_dash(r.graph_round_us)} | {or_dash(r.copy_efficiency)} "
            f"| {or_dash(r.gpu_copy_efficiency)} | {or_dash(r.late_ratio)} | {or_dash(r.staged_round_us)} "
            f"| {or_dash(r.staged_copy_efficiency)} | {'yes' if r.exact else 'NO'} |"
        )
    return "\n".join([*lines, "", *device_targets(rows)])


def device_targets(rows: list[DeviceRow]) -> list[str]:
    """The issue's targets, for the rows of their settings: judged on the GPU's times, the host's
    figure beside (the late ratio on the host's)."""
    out = []
    for r in rows:
        where = f"N={r.n} C={r.chunks} {r.size_bytes >> 20} MiB"
        if (r.n, r.chunks, r.size_bytes) == (8, 64, 1 << 20):
            met = r.gpu_round_us <= ROUND_TARGET_US
            what = f"per round at {where}: {r.gpu_round_us:.2f} us on the GPU, {r.round_us:.2f} a call"
            out.append(_line(what, met, f"<= {ROUND_TARGET_US:g} us"))
            if r.packets_gpu_round_us is not None:  # what the engine would take with packets on
                met = r.packets_gpu_round_us <= ROUND_TARGET_US
                what = f"per round at {where} as packets: {r.packets_gpu_round_us:.2f} us on the GPU"
                out.append(_line(what, met, f"<= {ROUND_TARGET_US:g} us"))
        if r.gpu_copy_efficiency is not None:
            met = r.gpu_copy_efficiency >= EFFICIENCY_TARGET
            what = (
                f"copy efficiency at {where}: {r.gpu_copy_efficiency:.2f} on the GPU, "
                f"{or_dash(r.copy_efficiency)} a call"
            )
            out.append(_line(what, met, f">= {EFFICIENCY_TARGET:g}"))
        if r.late_ratio is not None:
            met = r.late_ratio <= LATE_TARGET
            out.append(_line(f"late ratio at {where}: {r.late_ratio:.2f}", met, f"<= {LATE_TARGET:g}"))
    wrong = [f"N={r.n} {r.dtype} {r.size_bytes >> 10} KiB" for r in rows if not r.exact]
    out.append(f"exact in every row: {'yes' if not wrong else 'NO: ' + ', '.join(wrong)}")
    eager = [r for r in rows if r.capture_failure is not None]
    if eager:
        where = ", ".join(f"N={r.n} {r.dtype} {r.size_bytes >> 10} KiB" for r in eager)
        out.append(f"graphs NOT captured in {where}: {eager[0].capture_failure}")
    else:
        out.append("graphs: every row's calls after the first replayed one")
    return out


def _line(what: str, met: bool, target: str) -> str:
    return f"{what} (target {target}: {'met' if met else 'MISSED'})"


def or_dash(value: float | None) -> str:
    """A figure of a table, two decimals, or a dash where it was not measured."""
    return "-" if value is None else f"{value:.2f}"
