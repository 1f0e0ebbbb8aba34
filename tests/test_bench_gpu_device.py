"""benchmarks/gpu_device.py and gpu_tuning.py (bench_gpu.py's ``device_executor`` and
``device_tuning`` parts) without a GPU: rows run on the device stand-in (tests/fake_device.py: the
kernel's own source compiled for the host), every call checked, each tuning's kernel and blocks
the ones launched; the schedule's bytes on a case counted by hand; the settings the issue's
targets need; and the targets' and the tunings' verdicts on rows whose truth is known."""

from __future__ import annotations

import ctypes
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_device import FakeCuda, host_or_skip, installed

from stragglar.runtime import allreduce_local
from stragglar.runtime.device.kernel import PACKET_BYTES, Tuning, kernel_name
from stragglar.synth import synthesize
from stragglar.verify import prove

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return host_or_skip(tmp_path_factory)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch, host: ctypes.CDLL) -> Iterator[FakeCuda]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield from installed(monkeypatch, host)


def test_a_row_times_the_device_engine_and_the_late_rank_and_checks_every_call(cuda: FakeCuda) -> None:
    import gpu_device

    proof = prove(synthesize("stragglar", 4))
    row = gpu_device.device_row(sys.modules["cupy"], lambda: None, proof, 4096, "float16", iters=2, late=True)
    assert (row.n, row.chunks, row.size_bytes, row.dtype, row.exact) == (4, 3, 4096, "float16", True)
    assert row.round_us > 0 and row.late_ratio is not None and row.late_ratio > 0
    assert row.copy_efficiency is None and row.graph_round_us is None  # 4 KiB; float16
    assert len(cuda.launches) == 4 * 3 * 2  # (1 untimed + 2 timed calls) x (punctual, late) x 4 ranks
    for timing in (cuda.launches[:12], cuda.launches[12:]):  # each timing's calls reuse its 4 buffers
        assert len({address for address, _ in timing}) == 4


def test_the_headline_rows_time_the_staged_and_the_eager_device_calls_too(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N = 8 float32: besides the default call (graphs after the first), every transfer staged,
    every launch from the host (``graphs=False``), the system's scope, every transfer on flags and
    every transfer as packets, each checked; and the rounds engine (here on the stand-in's memory
    as NumPy arrays: the stand-in runs the device engine only).  The default is on flags (the
    engine's own has packets off), so the flags calls run on the default's state."""
    import gpu_device

    def rounds_on_numpy(bufs: list[Any], proof: Any, *args: Any, **options: Any) -> object:
        if options.get("engine") == "device":
            return allreduce_local(bufs, proof, *args, **options)
        return allreduce_local([np.asarray(b).view(np.ndarray) for b in bufs], proof, *args, **options)

    monkeypatch.setattr(gpu_device, "allreduce_local", rounds_on_numpy)
    proof = prove(synthesize("stragglar", 8))
    cupy = sys.modules["cupy"]
    row = gpu_device.device_row(cupy, lambda: None, proof, 4096, "float32", iters=2, late=False)
    assert (
        row.exact
        and row.staged_round_us
        and row.eager_round_us
        and row.system_round_us
        and row.system_gpu_round_us
        and row.flags_gpu_round_us
        and row.packets_gpu_round_us
    )
    assert row.graph_round_us and row.capture_failure is None
    # (1 untimed + 2 timed) x (default, staged, eager, system, flags, packets) x 8 ranks
    assert len(cuda.launches) == 8 * 3 * 6
    assert cuda.captures == 4  # the default's (the flags calls' too), the staged, the system's, packets'
    assert cuda.system == [False] * 8 * 3 * 3 + [True] * 8 * 3 + [False] * 8 * 3 * 2  # in its calls only
    assert gpu_device.program_of(proof, 1024, "float32", Tuning(packet_bytes=PACKET_BYTES)).packets
    assert not gpu_device.program_of(proof, 1024, "float32", gpu_device.FLAGS).packets
    assert gpu_device.program_of(proof, 1 << 27, "float32", gpu_device.PACKETS).packets
    assert not gpu_device.program_of(proof, 1 << 27, "float32", Tuning()).packets
    assert "| 8 | 7 | 4 KiB | float32 |" in gpu_device.device_table([row])


def test_a_capture_that_failed_is_said_in_its_row_and_under_the_table(cuda: FakeCuda) -> None:
    """The figures are then the eager launches': the row says so, and why."""
    import gpu_device

    cuda.refuse_capture = "operation not permitted when stream is capturing"
    proof = prove(synthesize("ring", 3))
    cupy = sys.modules["cupy"]
    row = gpu_device.device_row(cupy, lambda: None, proof, 256, "int32", iters=2, late=False)
    assert row.exact and row.capture_failure is not None and "operation not permitted" in row.capture_failure
    assert cuda.captures == 0
    assert gpu_device.device_targets([row])[-1].startswith(
        "graphs NOT captured in N=3 int32 0 KiB: stragglar:"
    )


def test_a_wrong_result_is_reported_not_timed_over(cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_device

    def lost_one(bufs: list[Any], proof: Any, *args: Any, **kwargs: Any) -> None:
        allreduce_local(bufs, proof, *args, **kwargs)  # the engine's call, then one element off
        bufs[2][5] += 1

    monkeypatch.setattr(gpu_device, "allreduce_local", lost_one)
    proof = prove(synthesize("ring", 3))
    row = gpu_device.device_row(sys.modules["cupy"], lambda: None, proof, 64, "int32", iters=1, late=False)
    assert row.exact is False and "exact in every row: NO: N=3 int32" in gpu_device.device_table([row])


def test_the_schedule_bytes_of_ring_on_two_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ring on 2 ranks moves each of its 2 chunks (8 bytes at 4 float32 elements) once reduced
    (read twice, written once) and once copied (read and written once): 2 x 24 + 2 x 16."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_device

    assert gpu_device.schedule_bytes(prove(synthesize("ring", 2)), 4, 4) == 80


def test_the_settings_cover_the_issue_s_targets_and_the_verdicts_are_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_device

    for quick in (False, True):  # every target is measured in a quick run too
        settings = gpu_device.settings(quick)
        assert (8, 64, 1 << 20, "float32", False) in settings
        assert (8, 64, 4 << 20, "float32", False) in settings  # chunks of PACKET_BYTES: packets' edge
        assert {(s[0], s[1], s[2], s[3]) for s in settings} >= {
            (8, None, 64 << 20, "float32"),
            (8, 64, 64 << 20, "float32"),
            (8, None, 256 << 20, "float32"),
            (8, 64, 256 << 20, "float32"),
        }
        assert [s for s in settings if s[4]] == [(8, None, 64 << 20, "float32", True)]
    full = gpu_device.settings(quick=False)
    assert {(s[0], s[3]) for s in full} >= {(n, d) for n in range(3, 17) for d in gpu_device.DTYPES}
    row = gpu_device.DeviceRow
    # judged on the GPU's times: 1.2 us a round there meets the target though a call takes 2.0
    fast = row(
        8, 64, 1 << 20, "float32", 2.0, 1.2, None, None, None, 6.8, 1.9, None, 2.5, 2.2, 1.5, 4.4, 1.2, True
    )
    slow = row(
        8, 64, 1 << 20, "float32", 2.0, 1.6, None, None, None, 6.8, 2.4, None, 3.1, 2.9, 2.0, 4.4, 1.6, True
    )
    big = row(
        8,
        7,
        64 << 20,
        "float32",
        90.0,
        85.0,
        0.65,
        0.68,
        0.5,
        300.0,
        140.0,
        0.42,
        91.0,
        95.0,
        88.0,
        85.0,
        120.0,
        True,
    )
    bigger = dataclasses.replace(big, copy_efficiency=0.6, gpu_copy_efficiency=0.75)
    assert gpu_device.device_targets([fast])[0] == (
        "per round at N=8 C=64 1 MiB: 1.20 us on the GPU, 2.00 a call (target <= 1.5 us: met)"
    )
    assert gpu_device.device_targets([slow])[0].endswith(
        "1.60 us on the GPU, 2.00 a call (target <= 1.5 us: MISSED)"
    )
    # the engine's own on flags misses it, packets would meet it: both said, each judged
    on_flags = dataclasses.replace(slow, gpu_round_us=4.4, packets_gpu_round_us=1.2)
    assert gpu_device.device_targets([on_flags])[:2] == [
        "per round at N=8 C=64 1 MiB: 4.40 us on the GPU, 2.00 a call (target <= 1.5 us: MISSED)",
        "per round at N=8 C=64 1 MiB as packets: 1.20 us on the GPU (target <= 1.5 us: met)",
    ]
    assert gpu_device.device_targets([slow])[1].endswith(
        "as packets: 1.60 us on the GPU (target <= 1.5 us: MISSED)"
    )
    efficiency, late, exact, graphs = gpu_device.device_targets([big])
    assert efficiency == (
        "copy efficiency at N=8 C=7 64 MiB: 0.68 on the GPU, 0.65 a call (target >= 0.7: MISSED)"
    )
    assert late.endswith("0.50 (target <= 0.7: met)")
    assert gpu_device.device_targets([bigger])[0].endswith(
        "0.75 on the GPU, 0.60 a call (target >= 0.7: met)"
    )
    assert (
        exact == "exact in every row: yes"
        and graphs == "graphs: every row's calls after the first replayed one"
    )
    table = gpu_device.device_table([fast, big])
    row_text = (
        "| 8 | 7 | 65536 KiB | float32 | 90.00 | 85.00 | 91.00 | 88.00 | 85.00 | 120.00 | 300.00 | 0.65 "
        "| 0.68 | 0.50 | 140.00 | 0.42 | yes |"
    )
    assert row_text in table


def test_a_setting_times_each_tuning_once_with_its_own_kernel_blocks_and_threads(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N = 4, 6 chunks of 1600 elements: at most 4 blocks of 512 threads a rank share a chunk, 13
    of 128.  On a smaller sweep (max blocks 2, 4, 16; vectors 1, 8; 128 and 512 threads; pauses 0
    and 64 ns), a tuning whose launch one measured before it gives (max blocks 16 of 512 threads
    gives 4 blocks, as 4 did) is not measured again; the engine's own tuning (set here to 16
    blocks at most of 512 threads, vectors 1, pause 64 ns) first; then, the chunks being small
    (6400 bytes), the blocks, threads and pauses as packets, with the engine's vectors; each row's
    launches are its kernel, pause, blocks and threads, its GPU time read from its state."""
    import gpu_tuning

    from stragglar.runtime.device.kernel import Tuning

    monkeypatch.setattr(gpu_tuning, "OWN_TUNING", Tuning(max_blocks=16, vectors=1, threads=512, pause_ns=64))
    monkeypatch.setattr(gpu_tuning, "MAX_BLOCKS", (2, 4, 16))
    monkeypatch.setattr(gpu_tuning, "VECTORS", (1, 8))
    monkeypatch.setattr(gpu_tuning, "THREADS", (128, 512))
    proof = prove(synthesize("stragglar", 4, chunks=6))
    rows = gpu_tuning.setting_rows(sys.modules["cupy"], lambda: None, proof, 6 * 1600 * 4, iters=1)
    swept = [(v, t, p) for v in (1, 8) for t in (128, 512) for p in (0, 64)]
    want = [
        (16, 1, 512, 64, 4, True),  # the engine's own
        *((2, v, t, p, 2, False) for v, t, p in swept),
        *((4, v, t, p, 4, False) for v, t, p in swept if (v, t, p) != (1, 512, 64)),
        *((16, v, 128, p, 13, False) for v in (1, 8) for p in (0, 64)),
    ]
    as_packets = [
        *((b, 1, t, p, b, False) for b in (2, 4) for t in (128, 512) for p in (0, 64)),
        *((16, 1, 128, p, 13, False) for p in (0, 64)),
    ]
    got = [(r.max_blocks, r.vectors, r.threads, r.pause_ns, r.blocks, r.own) for r in rows]
    assert got == want + as_packets
    assert [r.packets for r in rows] == [False] * len(want) + [True] * len(as_packets)
    packet_row = rows[len(want)]
    assert gpu_tuning.described(packet_row) == "packets, max blocks 2 (blocks 2), 128 threads, pause 0 ns"
    assert all(
        r.exact and r.round_us > 0 and r.gpu_round_us > 0 and r.gpu_copy_efficiency is None for r in rows
    )
    calls = 2  # one untimed, one timed
    launched = [
        (kernel_name("float32", r.vectors), r.pause_ns, r.blocks, r.threads)
        for r in rows
        for _ in range(calls * 4)
    ]
    assert cuda.shapes == launched
    table = gpu_tuning.tuning_table(rows)
    assert "| 4 | 6 | 37 KiB | flags | 16 (own) | 1 | 512 | 64 | 4 |" in table
    fastest = sorted(rows, key=lambda r: r.gpu_round_us)[: gpu_tuning.SHOWN]
    shown = gpu_tuning.SHOWN + (not any(r.own for r in fastest))  # the engine's own always
    assert len([line for line in table.splitlines() if "| 37 KiB |" in line]) == shown


def row(max_blocks: int, vectors: int, gpu_round_us: float, own: bool = False, exact: bool = True) -> Any:
    """A row of 512 threads and the engine's pause, timed by the host at 1.5x its GPU time."""
    import gpu_tuning

    blocks = min(max_blocks, 66)
    host_us = 1.5 * gpu_round_us
    return gpu_tuning.TuningRow(
        8,
        7,
        64 << 20,
        "float32",
        max_blocks,
        vectors,
        512,
        64,
        blocks,
        host_us,
        gpu_round_us,
        None,
        exact,
        own,
        False,
    )


def test_the_verdict_names_a_faster_tuning_only_beyond_the_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU's times (the host's are 1.5x them in these rows)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_tuning

    own = row(16, 1, 10.0, own=True)
    (faster,) = gpu_tuning.fastest([own, row(64, 4, 6.0), row(32, 4, 7.0)])
    assert faster == (
        "fastest at N=8 C=7 65536 KiB: max blocks 64 (blocks 64), vectors 4, 512 threads, pause 64 ns: "
        "6.00 us a round on the GPU, 0.60x the engine's own (max blocks 16 (blocks 16), vectors 1, 512 "
        "threads, pause 64 ns: 10.00 us)"
    )
    (close,) = gpu_tuning.fastest([own, row(64, 4, 9.7)])  # 3% faster: within the noise
    assert close.startswith(
        "at N=8 C=7 65536 KiB the engine's own tuning (max blocks 16 (blocks 16), vectors 1"
    )
    (mine,) = gpu_tuning.fastest([own, row(64, 4, 12.0)])
    assert mine.endswith("10.00 us a round on the GPU, the fastest 10.00")


def test_an_inexact_row_is_named_and_never_the_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_tuning

    own = row(16, 1, 10.0, own=True)
    wrong, verdict = gpu_tuning.fastest([own, row(64, 8, 2.0, exact=False)])
    assert wrong == (
        "NOT exact at N=8 C=7 65536 KiB: max blocks 64 (blocks 64), vectors 8, 512 threads, pause 64 ns"
    )
    assert "engine's own tuning" in verdict and "is as fast as any" in verdict
    wrong, verdict = gpu_tuning.fastest([row(16, 1, 10.0, own=True, exact=False), row(64, 4, 6.0)])
    assert verdict == "no comparison at N=8 C=7 65536 KiB: the engine's own tuning has no exact row"


def test_each_setting_and_row_is_printed_with_its_figures_as_soon_as_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """So that a run cut short by its time limit still shows what it measured."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_device
    import gpu_tuning

    rows = [row(16, 1, 10.0, own=True), row(64, 4, 6.0), row(64, 8, 2.0, exact=False)]
    assert gpu_tuning.setting_line(rows) == (
        "tuning N=8 C=7 65536 KiB: own 10.00 us a round on the GPU, fastest 6.00 (max blocks 64 "
        "(blocks 64), vectors 4, 512 threads, pause 64 ns), some NOT exact"
    )
    own_only = gpu_tuning.setting_line(rows[:1])
    assert own_only.endswith("fastest 10.00 (max blocks 16 (blocks 16), vectors 1, 512 threads, pause 64 ns)")
    big = gpu_device.DeviceRow(
        8,
        7,
        64 << 20,
        "float32",
        90.0,
        80.0,
        0.65,
        0.72,
        0.5,
        300.0,
        140.0,
        0.42,
        91.0,
        95.0,
        83.0,
        80.0,
        99.0,
        True,
    )
    assert gpu_device.row_line(big) == (
        "device N=8 C=7 65536 KiB float32: 90.00 us a round (80.00 on the GPU), copy efficiency 0.65 "
        "(0.72 on the GPU), late ratio 0.50, exact"
    )
    wrong = gpu_device.DeviceRow(
        3,
        2,
        1 << 20,
        "int32",
        1.5,
        1.2,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        False,
    )
    assert gpu_device.row_line(wrong).endswith("copy efficiency - (- on the GPU), late ratio -, NOT exact")


def test_the_sweep_starts_with_the_engine_s_own_tuning_and_holds_each_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_tuning

    from stragglar.runtime.device.kernel import OWN_TUNING

    flags = gpu_tuning.tunings(packets=False)
    assert flags[0] == OWN_TUNING and len(set(flags)) == len(flags) == 7 * 4 * 3 * 2
    assert not any(t.moves_packets(2**18, 64, "float32") for t in flags)
    both = gpu_tuning.tunings(packets=True)
    assert both[: len(flags)] == flags and len(set(both)) == len(both) == len(flags) + 7 * 3 * 2
    assert all(t.moves_packets(2**18, 64, "float32") for t in both[len(flags) :])
    assert {(8, 64, 1 << 20), (8, None, 64 << 20)} == set(gpu_tuning.SETTINGS)


def test_the_profile_part_times_a_call_and_ranks_the_functions_of_its_host_part(cuda: FakeCuda) -> None:
    """On the stand-in: the unprofiled call first (its host time, its kernels' GPU time), then the
    functions by their own time a call, the device engine's own among them, every call exact; the
    table prints every row."""
    import gpu_profile

    lines: list[str] = []
    rows = gpu_profile.device_profile(sys.modules["cupy"], lambda: None, 1, lines.append)
    whole, *functions = rows
    assert whole.function == gpu_profile.UNPROFILED and whole.own_us > 0 and whole.cumulative_us
    assert len(functions) == gpu_profile.TOP
    assert [r.own_us for r in functions] == sorted((r.own_us for r in functions), reverse=True)
    calls = gpu_profile.CALLS_PER_ITER
    assert len(cuda.launches) == 8 * (
        3 + calls
    )  # 3 unprofiled calls (the first two untimed) and the profiled
    assert len(lines) == 1 and lines[0].startswith("device profile N=8 C=64 1024 KiB: a call")
    table = gpu_profile.profile_table(rows)
    assert table.count("\n| ") == 1 + len(rows)  # the header's, then a line a row
    stats = pstats_of_one_call()
    assert (
        gpu_profile._named(("~", 0, "<built-in method time.perf_counter>"))
        == "<built-in method time.perf_counter>"
    )
    assert gpu_profile._named(stats).startswith("stragglar/runtime/local.py:")


def pstats_of_one_call() -> tuple[str, int, str]:
    """Where ``allreduce_local`` is, as cProfile names a function."""
    import inspect

    source = inspect.getsourcefile(allreduce_local)
    assert source is not None
    return source, inspect.getsourcelines(allreduce_local)[1], "allreduce_local"
