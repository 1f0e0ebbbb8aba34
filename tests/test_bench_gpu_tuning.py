"""benchmarks/gpu_tuning.py (bench_gpu.py's ``device_tuning`` part) without a GPU: a setting's
rows run on the device stand-in (tests/fake_device.py: the kernel's own source compiled for the
host), each tuning's kernel and blocks the ones launched and every call checked; and the verdict
under the table on rows whose truth is known."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_device import FakeCuda, host_or_skip, installed

from stragglar.runtime.device.kernel import VECTORS, kernel_name
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


def test_a_setting_times_each_tuning_once_with_its_own_kernel_and_blocks(cuda: FakeCuda) -> None:
    """N = 4, 6 chunks of 1600 elements: at most 4 blocks a rank share a chunk (512 threads a
    block), so max_blocks 8 to 64 all give 4 and only the first of them is measured, in each of the
    four vector counts; the engine's own tuning (16 blocks at most: 4 here, vectors 1) first."""
    import gpu_tuning

    proof = prove(synthesize("stragglar", 4, chunks=6))
    rows = gpu_tuning.setting_rows(sys.modules["cupy"], lambda: None, proof, 6 * 1600 * 4, iters=1)
    assert [(r.max_blocks, r.vectors, r.blocks, r.own) for r in rows] == [(16, 1, 4, True)] + [
        (8, v, 4, False) for v in VECTORS if v != 1
    ]
    assert all(r.exact and r.round_us > 0 and r.copy_efficiency is None for r in rows)
    calls = 2  # one untimed, one timed
    launched = [(kernel_name("float32", r.vectors), r.blocks) for r in rows for _ in range(calls * 4)]
    assert cuda.shapes == launched
    table = gpu_tuning.tuning_table(rows)
    assert "| 4 | 6 | 37 KiB | 16 (own) | 1 | 4 |" in table


def row(max_blocks: int, vectors: int, round_us: float, own: bool = False, exact: bool = True) -> Any:
    import gpu_tuning

    blocks = min(max_blocks, 66)
    return gpu_tuning.TuningRow(
        8, 7, 64 << 20, "float32", max_blocks, vectors, blocks, round_us, None, exact, own
    )


def test_the_verdict_names_a_faster_tuning_only_beyond_the_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_tuning

    own = row(16, 1, 10.0, own=True)
    (faster,) = gpu_tuning.fastest([own, row(64, 4, 6.0), row(32, 4, 7.0)])
    assert faster == (
        "fastest at N=8 C=7 65536 KiB: max blocks 64 (blocks 64), vectors 4: 6.00 us a round, "
        "0.60x the engine's own (blocks 16, vectors 1: 10.00 us)"
    )
    (close,) = gpu_tuning.fastest([own, row(64, 4, 9.7)])  # 3% faster: within the noise
    assert close.startswith("at N=8 C=7 65536 KiB the engine's own tuning (blocks 16, vectors 1) is as fast")
    (mine,) = gpu_tuning.fastest([own, row(64, 4, 12.0)])
    assert mine.endswith("10.00 us a round, the fastest 10.00")


def test_an_inexact_row_is_named_and_never_the_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_tuning

    own = row(16, 1, 10.0, own=True)
    wrong, verdict = gpu_tuning.fastest([own, row(64, 8, 2.0, exact=False)])
    assert wrong == "NOT exact at N=8 C=7 65536 KiB: max blocks 64 vectors 8"
    assert "engine's own tuning" in verdict and "is as fast as any" in verdict
    wrong, verdict = gpu_tuning.fastest([row(16, 1, 10.0, own=True, exact=False), row(64, 4, 6.0)])
    assert verdict == "no comparison at N=8 C=7 65536 KiB: the engine's own tuning has no exact row"


def test_the_sweep_starts_with_the_engine_s_own_tuning_and_holds_each_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_tuning

    from stragglar.runtime.device.kernel import OWN_TUNING

    tunings = gpu_tuning.tunings()
    assert tunings[0] == OWN_TUNING and len(set(tunings)) == len(tunings) == 16
    assert {(8, 64, 1 << 20), (8, None, 64 << 20)} == set(gpu_tuning.SETTINGS)
