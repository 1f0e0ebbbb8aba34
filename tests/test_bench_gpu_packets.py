"""benchmarks/gpu_packets.py (bench_gpu.py's ``device_packets`` part) without a GPU: its rows run
on the device stand-in (tests/fake_device.py: the kernel's own source compiled for the host), each
size both ways, every call checked; and the threshold it prints, on rows whose truth is known."""

from __future__ import annotations

import ctypes
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_device import FakeCuda, host_or_skip, installed

from stragglar.runtime.device import loopback

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return host_or_skip(tmp_path_factory)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch, host: ctypes.CDLL) -> Iterator[FakeCuda]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield from installed(monkeypatch, host)


@pytest.fixture
def packets(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_packets

    return gpu_packets


def test_each_size_is_timed_on_flags_and_as_packets_and_every_call_checked(
    cuda: FakeCuda, packets: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N = 8, C = 64 at 2 and 3 KiB a rank (chunks of 8 and 12 float32): one state on flags and
    one of packets a size, each call of both exact, a line a size as it is measured."""
    monkeypatch.setattr(packets, "SIZES", (2 << 10, 3 << 10))
    lines: list[str] = []
    rows = packets.device_packets(sys.modules["cupy"], lambda: None, 1, lines.append)
    assert [(r.n, r.chunks, r.size_bytes, r.chunk_bytes) for r in rows] == [
        (8, 64, 2048, 32),
        (8, 64, 3072, 48),
    ]
    assert all(r.flags_exact and r.packets_exact for r in rows)
    assert all(r.flags_gpu_round_us > 0 and r.packets_gpu_round_us > 0 for r in rows)
    made = list(loopback._loopbacks.values())
    states = [(state.program.packets, state.count) for state in made]  # each state made
    assert sorted(states) == [(False, 512), (False, 768), (True, 512), (True, 768)]
    assert len(cuda.launches) == 8 * 2 * 2 * 2  # 8 ranks, 2 calls (one untimed), 2 ways, 2 sizes
    assert len(lines) == 2
    line = r"packets N=8 C=64 2 KiB \(chunks of 32 B\): flags [\d.]+ us a round on the GPU \(exact\), "
    assert re.fullmatch(line + r"packets [\d.]+ \(exact\)", lines[0]), lines[0]


def row(
    packets: Any,
    chunk_kib: int,
    flags_us: float,
    packets_us: float,
    flags_exact: bool = True,
    exact: bool = True,
) -> Any:
    """N = 8, C = 64: a rank's buffer holds 64 chunks of ``chunk_kib`` KiB."""
    return packets.PacketRow(
        8, 64, chunk_kib << 16, chunk_kib << 10, flags_us, packets_us, flags_exact, exact
    )


def test_the_threshold_is_the_largest_chunk_up_to_which_packets_always_won(packets: Any) -> None:
    rows = [row(packets, 16, 4.0, 1.5), row(packets, 32, 4.2, 2.0), row(packets, 64, 5.0, 4.0)]
    rows += [row(packets, 128, 6.0, 6.1), row(packets, 256, 9.0, 8.0)]  # slower, then faster again
    assert packets.packet_threshold(rows) == 64 << 10
    assert packets.packet_threshold(rows[::-1]) == 64 << 10  # in whatever order measured
    verdict = packets.packets_verdict(rows)
    assert verdict[0].startswith(
        "packets faster than flags (by more than 5%) for chunks up to 64 KiB: packet_bytes 65536 ("
    )
    assert verdict[1] == (
        "packets faster again at chunks of 256 KiB, beyond one where they were not: not taken"
    )
    table = packets.packets_table(rows)
    assert "| 8 | 64 | 1 MiB | 16 KiB | 4.00 | 1.50 | 0.38x | yes | yes |" in table
    assert table.endswith("\n".join(verdict))


def test_packets_within_the_noise_are_not_called_faster(packets: Any) -> None:
    close = [row(packets, 16, 4.0, 3.9), row(packets, 32, 4.0, 2.0)]  # 2.5% faster at the smallest
    assert packets.packet_threshold(close) == 0
    assert packets.packets_verdict(close) == [
        "packets not faster than flags (by more than 5%) at the smallest chunk, 16 KiB: packet_bytes 0 "
        "(the engine's own packet_bytes is 0)",
        "packets faster again at chunks of 32 KiB, beyond one where they were not: not taken",
    ]


@pytest.mark.parametrize("flags_wrong", [False, True])
def test_a_wrong_sum_anywhere_leaves_no_packet_bytes_to_take(packets: Any, flags_wrong: bool) -> None:
    """Packets faster everywhere, but one size's calls of one way wrong: packets must not be
    turned on (packets wrong), and a comparison with a wrong run says nothing (flags wrong); the
    way that was wrong is named, with its chunk size."""
    wrong = row(packets, 32, 4.0, 1.0, flags_exact=not flags_wrong, exact=flags_wrong)
    rows = [row(packets, 16, 4.0, 1.0), wrong, row(packets, 64, 4.0, 1.0)]
    assert packets.packet_threshold(rows) == 0
    how = "flags" if flags_wrong else "packets"
    assert packets.packets_verdict(rows) == [
        f"NOT exact: {how} at chunks of 32 KiB: no packet_bytes to take (the engine's own packet_bytes is 0)"
    ]
    table = packets.packets_table(rows)
    assert ("| yes | NO |" in table) is not flags_wrong and ("| NO | yes |" in table) is flags_wrong


def test_no_size_measured_is_said_not_left_blank(packets: Any) -> None:
    assert packets.packet_threshold([]) == 0
    assert packets.packets_verdict([]) == [
        "packets: no chunk size measured, no packet_bytes to take (the engine's own packet_bytes is 0)"
    ]
