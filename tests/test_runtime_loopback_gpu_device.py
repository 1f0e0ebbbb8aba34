"""On a real GPU (skipped without CuPy and a CUDA device): the loopback's batched kernels and their
CUDA graphs, bit for bit against the reference interpreter on NumPy, for every dtype CuPy has,
eagerly, captured and replayed on new buffers; and the CuPy/NCCL transport's packing of messages
of several chunks by the same kernels, bit for bit against the interpreter's slices.  On CPU the
same code runs on the CuPy stand-in (test_runtime_loopback_gpu.py,
test_runtime_cupy_nccl_packing.py); this is the check to run on a machine with a GPU
(benchmarks/gpu_check.sh)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
try:
    DEVICES = int(cupy.cuda.runtime.getDeviceCount())
except Exception:  # no driver, no device
    DEVICES = 0
if DEVICES < 1:
    pytest.skip("no CUDA device", allow_module_level=True)

from stragglar.runtime import allreduce_local  # noqa: E402
from stragglar.runtime.cupy_nccl import FusedPacking  # noqa: E402
from stragglar.runtime.interpreter import apply, send_view  # noqa: E402
from stragglar.runtime.local import run_local  # noqa: E402
from stragglar.runtime.plans import plan_for  # noqa: E402
from stragglar.synth import synthesize  # noqa: E402
from stragglar.verify import prove  # noqa: E402

DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64"]


def supported(dtype: str) -> bool:
    """NumPy and CuPy know bfloat16 only through ml_dtypes, where it is installed."""
    try:
        cupy.zeros(1, dtype=np.dtype(dtype))
    except Exception:  # TypeError from NumPy, or CuPy's refusal
        return False
    return True


def draws(n: int, count: int, dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if dtype.startswith("int"):
        return [rng.integers(-(2**20), 2**20, count).astype(dtype) for _ in range(n)]
    return [rng.standard_normal(count).astype(np.dtype(dtype)) for _ in range(n)]


def reference(arrays: list[np.ndarray], proof: Any) -> list[np.ndarray]:
    out = [a.copy() for a in arrays]
    run_local(out, [plan_for(proof, r, out[0].shape[0]) for r in range(proof.num_ranks)])
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "chunks"), [(3, None), (8, None), (8, 64), (16, None), (5, 12)])
@pytest.mark.parametrize("graphs", [True, False])
def test_the_loopback_is_exact_on_the_gpu(dtype: str, n: int, chunks: int | None, graphs: bool) -> None:
    if not supported(dtype):
        pytest.skip(f"no {dtype} arrays in this NumPy and CuPy")
    proof = prove(synthesize("stragglar", n, chunks=chunks))
    for call in range(4):  # eager, captured and replayed, replayed twice: new buffers every call
        data = draws(n, 4099, dtype, seed=call)
        buffers = [cupy.asarray(a) for a in data]
        allreduce_local(buffers, proof, graphs=graphs)
        got = [b.get() for b in buffers]
        want = reference(data, proof)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(want, got, strict=True)), call


def test_float32_subnormals_are_added_as_numpy_adds_them() -> None:
    """CuPy compiles kernels with -ftz=true: a plain float add flushed subnormal operands and
    sums to zero, where NumPy, the reference, keeps them."""
    proof = prove(synthesize("stragglar", 5))
    rng = np.random.default_rng(7)
    data = [(rng.standard_normal(4099) * 1e-39).astype("float32") for _ in range(5)]
    assert all((np.abs(a) < np.finfo("float32").tiny).any() for a in data)  # subnormals among them
    buffers = [cupy.asarray(a) for a in data]
    allreduce_local(buffers, proof)
    want = reference(data, proof)
    assert all(a.tobytes() == b.get().tobytes() for a, b in zip(want, buffers, strict=True))


def test_a_late_rank_and_a_large_buffer_are_exact_on_the_gpu() -> None:
    proof = prove(synthesize("stragglar", 8, chunks=64))
    for call in range(3):
        data = draws(8, (16 << 20) // 4 + 3, "float32", seed=10 + call)
        buffers = [cupy.asarray(a) for a in data]
        timelines = allreduce_local(buffers, proof, 0.01)
        assert max(t.arrived - t.start for t in timelines) >= 0.01
        got = [b.get() for b in buffers]
        assert all(a.tobytes() == b.tobytes() for a, b in zip(reference(data, proof), got, strict=True))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_cupy_nccl_packing_kernels_equal_the_interpreters_slices(dtype: str) -> None:
    """Every message of several chunks of every rank of a chunked plan: packed by the gather
    kernel as the interpreter's slices pack it, and landed (added) by the landing kernel as its
    slices' ``+=`` land it, bit for bit."""
    if not supported(dtype):
        pytest.skip(f"no {dtype} arrays in this NumPy and CuPy")
    proof = prove(synthesize("stragglar", 8, chunks=64))
    count, fused = 4099, 0
    for rank in range(8):
        plan = plan_for(proof, rank, count)
        host, scratch = draws(2, max(count, plan.work_size), dtype, seed=rank)
        host = host[:count]
        flat, work = cupy.asarray(host), cupy.asarray(scratch)
        packing = FusedPacking(cupy, plan, flat)
        for step in plan.steps:
            for m in step.sends:
                if m.pieces in packing.rows and m.direct is None:
                    fused += 1
                    want = send_view(host, scratch, m)
                    assert packing.pack(flat, work, m).get().tobytes() == want.tobytes()
            for m in step.recvs:
                if m.pieces in packing.rows and m.direct is None:
                    fused += 1
                    apply(host, scratch, m)
                    packing.land(flat, work, m)
                    assert flat.get().tobytes() == host.tobytes()
    assert fused > 0
