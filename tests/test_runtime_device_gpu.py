"""On a real GPU (skipped without CuPy and a CUDA device): the device engine, one persistent
kernel per rank, bit for bit against the reference interpreter on NumPy for every dtype CuPy has,
N = 3..16 with small chunks as packets (the default) and on flags, chunked schedules with direct
and with staged transfers and as packets, call after call, buffers at
other offsets of one allocation, float32 subnormals; punctual
calls replayed from a CUDA graph; every tuning of the kernel (blocks, vectors) the same bits; the
late rank launched late; a rank whose kernel is never launched reported as a RankError naming it.
On CPU the same kernel source runs compiled for the host (test_runtime_device_kernel.py,
test_runtime_device_loopback.py); this is the check to run on a machine with a GPU
(benchmarks/gpu_check.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
try:
    DEVICES = int(cupy.cuda.runtime.getDeviceCount())
except Exception:  # no driver, no device
    DEVICES = 0
# each test skipped, not the module: a run of this file alone then exits 0 without a GPU, not
# pytest's 5 for "nothing collected" (the GPU check reads that as a failed step)
pytestmark = pytest.mark.skipif(DEVICES < 1, reason="no CUDA device")

from stragglar.runtime import RankError, allreduce_local  # noqa: E402
from stragglar.runtime.device import loopback, programs  # noqa: E402
from stragglar.runtime.device.kernel import PACKET_BYTES, VECTORS, Tuning  # noqa: E402
from stragglar.synth import synthesize  # noqa: E402
from stragglar.verify import prove  # noqa: E402

DTYPES = ["float16", "float32", "float64", "int32", "int64"]  # CuPy has no bfloat16
ROOT = Path(__file__).resolve().parents[1]


def draws(n: int, count: int, dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if dtype.startswith("int"):
        return [rng.integers(-(2**20), 2**20, count).astype(dtype) for _ in range(n)]
    return [rng.standard_normal(count).astype(dtype) for _ in range(n)]


def same_as_interpreter(
    n: int, chunks: int | None, dtype: str, count: int, delay: float = 0.0, staged: bool | None = None
) -> None:
    proof = prove(synthesize("stragglar", n, chunks=chunks))
    for call in range(2):
        host = draws(n, count, dtype, seed=call + n)
        want = [h.copy() for h in host]
        allreduce_local(want, proof)
        device = [cupy.asarray(h) for h in host]
        allreduce_local(device, proof, delay, engine="device", staged=staged)
        for rank, (w, d) in enumerate(zip(want, device, strict=True)):
            assert w.tobytes() == cupy.asnumpy(d).tobytes(), (n, chunks, dtype, call, rank, staged)


@pytest.mark.parametrize("packets", [True, False], ids=["packets", "flags"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", range(3, 17))
def test_the_device_engine_is_exact_on_the_gpu(
    dtype: str, n: int, packets: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of a few KiB on flags (the engine's own), and as packets (the engine's own tuning
    with packets up to the 64 KiB chunks the benchmarks time them at)."""
    if packets:
        monkeypatch.setattr(programs, "OWN_TUNING", Tuning(packet_bytes=PACKET_BYTES))
    same_as_interpreter(n, None, dtype, 4099)


@pytest.mark.parametrize("staged", [None, True], ids=["direct", "staged"])
@pytest.mark.parametrize(("n", "chunks"), [(8, 64), (5, 12), (16, 40)])
def test_chunked_schedules_with_a_late_rank(n: int, chunks: int, staged: bool | None) -> None:
    """Direct transfers where safe (the default) and every transfer staged, a MiB of float32."""
    same_as_interpreter(n, chunks, "float32", 1 << 20, delay=0.01, staged=staged)


def test_buffers_at_other_offsets_of_one_allocation_are_exact() -> None:
    """Every rank's buffer a view of one allocation, at r % 3 elements past a 16-byte boundary
    (as ``big.chunk(n)`` gives): a landing moves 16-byte vectors and the next push of the chunk,
    to a peer's buffer at another offset, single elements on other threads; without a barrier
    between the two rows, ranks sent sums they had not finished."""
    n, count = 8, 100_001
    proof = prove(synthesize("stragglar", n, chunks=64))
    host = draws(n, count, "float32", seed=5)
    want = [h.copy() for h in host]
    allreduce_local(want, proof)
    stride = count + 8
    whole = cupy.zeros(n * stride, dtype="float32")
    views = [whole[r * stride + r % 3 : r * stride + r % 3 + count] for r in range(n)]
    for view, values in zip(views, host, strict=True):
        view[...] = cupy.asarray(values)
    allreduce_local(views, proof, engine="device")
    for rank, (w, d) in enumerate(zip(want, views, strict=True)):
        assert w.tobytes() == cupy.asnumpy(d).tobytes(), rank


def test_float32_subnormals_are_added_as_numpy_adds_them() -> None:
    """CuPy compiles kernels with -ftz=true: a plain float add flushed subnormal operands and
    sums to zero, where NumPy, the reference, keeps them."""
    n, count = 5, 4099
    proof = prove(synthesize("stragglar", n))
    rng = np.random.default_rng(7)
    host = [(rng.standard_normal(count) * 1e-39).astype("float32") for _ in range(n)]
    assert all((np.abs(h) < np.finfo("float32").tiny).any() for h in host)  # subnormals among them
    want = [h.copy() for h in host]
    allreduce_local(want, proof)
    device = [cupy.asarray(h) for h in host]
    allreduce_local(device, proof, engine="device")
    for rank, (w, d) in enumerate(zip(want, device, strict=True)):
        assert w.tobytes() == cupy.asnumpy(d).tobytes(), rank


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_punctual_calls_replay_from_a_graph_call_after_call(
    graphs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six punctual calls on fresh buffers (other addresses each time): the first launches each
    rank's kernel, the second captures them in a graph, the rest replay it; every call exact."""
    monkeypatch.setattr(loopback, "_loopbacks", type(loopback._loopbacks)())
    proof = prove(synthesize("stragglar", 8, chunks=64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a capture that failed would warn
        for call in range(6):
            host = draws(8, 1 << 18, "float32", seed=call)
            want = [h.copy() for h in host]
            allreduce_local(want, proof)
            device = [cupy.asarray(h) for h in host]
            allreduce_local(device, proof, engine="device", graphs=graphs)
            for rank, (w, d) in enumerate(zip(want, device, strict=True)):
                assert w.tobytes() == cupy.asnumpy(d).tobytes(), (call, rank, graphs)
    (state,) = loopback._loopbacks.values()
    assert len(state.replayer.captured) == (1 if graphs else 0)


@pytest.mark.parametrize("vectors", VECTORS)
@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_every_tuning_gives_the_same_bits(dtype: str, vectors: int) -> None:
    """The kernel of each vector count, with few blocks and with many, of each block size, spinning
    with and without a pause, on a chunked schedule whose blocks' parts are no whole number of a
    thread's groups of vectors; its transfers direct where safe, and as packets."""
    proof = prove(synthesize("stragglar", 6, chunks=10))
    count = 10 * 4099 * 3
    shapes = [(2, 512, 64), (64, 512, 0), (64, 128, 64), (16, 256, 0)]  # max blocks, threads, pause
    every = [
        (s, program)
        for s in shapes
        for program in (programs.program_for(proof, True, p) for p in (False, True))
    ]
    for call, ((max_blocks, threads, pause_ns), program) in enumerate(every):
        host = draws(6, count, dtype, seed=call + vectors)
        want = [h.copy() for h in host]
        allreduce_local(want, proof)
        device = [cupy.asarray(h) for h in host]
        loopback.run_device_loopback(
            cupy,
            [int(d.data.ptr) for d in device],
            count,
            dtype,
            int(device[0].device.id),
            program,
            proof.schedule.fingerprint,
            0.0,
            proof.schedule.late_rank,
            tuning=Tuning(max_blocks=max_blocks, vectors=vectors, threads=threads, pause_ns=pause_ns),
        )
        for rank, (w, d) in enumerate(zip(want, device, strict=True)):
            assert w.tobytes() == cupy.asnumpy(d).tobytes(), (
                dtype,
                vectors,
                max_blocks,
                threads,
                pause_ns,
                program.packets,
                rank,
            )


def test_a_rank_never_launched_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    proof = prove(synthesize("stragglar", 4))
    late = proof.schedule.late_rank
    launch = loopback.DeviceLoopback.launch

    def all_but_the_late(self: loopback.DeviceLoopback, ranks: Sequence[int], timeout_s: float) -> None:
        launch(self, [r for r in ranks if r != late], timeout_s)

    monkeypatch.setattr(loopback.DeviceLoopback, "launch", all_but_the_late)
    monkeypatch.setattr(loopback, "WAIT_TIMEOUT_S", 0.5)
    with pytest.raises(RankError) as caught:
        allreduce_local([cupy.zeros(1000, dtype=cupy.float32) for _ in range(4)], proof, engine="device")
    assert caught.value.peer == late and caught.value.reason == "timed out"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_torch_cuda_tensors_bfloat16_included(dtype: str) -> None:
    """torch CUDA tensors, bfloat16 among them (CuPy has none), against the interpreter on torch
    CPU tensors."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    proof = prove(synthesize("stragglar", 6, chunks=10))
    generator = torch.Generator().manual_seed(6)
    host = [torch.randn(3001, generator=generator).to(getattr(torch, dtype)) for _ in range(6)]
    want = [h.clone() for h in host]
    allreduce_local(want, proof)
    device = [h.cuda() for h in host]
    allreduce_local(device, proof, engine="device")
    for rank, (w, d) in enumerate(zip(want, device, strict=True)):
        assert torch.equal(
            w.view(torch.int16 if w.element_size() == 2 else torch.int32),
            d.cpu().view(torch.int16 if w.element_size() == 2 else torch.int32),
        ), rank


@pytest.mark.parametrize("world", [2, 4])
def test_processes_sharing_one_gpu_over_ipc_handles(world: int) -> None:
    """Ranks as processes on one GPU (their kernels time-slice: a correctness check, not a timing),
    on their inboxes and on registered buffers, on flags and as packets (tests/device_ranks.py),
    the packets' marks at the system's scope.  Launched from a fresh
    process: this one has made a CUDA context, which a forked rank could not use."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "device_ranks.py"), str(world)],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # NCCL prints its version on stdout where NCCL_DEBUG is set at all (a log's usual setting)
    said = [line for line in done.stdout.splitlines() if not line.startswith("NCCL version")]
    assert said == [f"{world} ranks exact"], done.stdout[-3000:]
