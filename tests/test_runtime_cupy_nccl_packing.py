"""A message of several chunks on the CuPy/NCCL path is packed by one kernel and landed by one
(:class:`~stragglar.runtime.cupy_nccl.FusedPacking`), on CPU: ranks in threads over the fake NCCL,
"CuPy" arrays and kernels of :mod:`fake_cupy` (a Python model of the kernels, or their CUDA C
compiled for the host with g++), streams that record while they capture
(:mod:`test_runtime_cupy_nccl_graphs`).  Every result is compared with the exact sum."""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_runtime_cupy_nccl_graphs import DeviceArray, ranks, stand_in

from stragglar.measure.data import expected, payload
from stragglar.runtime import NcclGroup, allreduce, cupy_nccl, graphs
from stragglar.runtime.cupy_nccl import CupyGraphs, FusedPacking, _fused_rows
from stragglar.runtime.plans import plan_for
from stragglar.runtime.program import BoundMessage
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove


def fused_messages(proof: Proof, count: int) -> int:
    """How many sends and receives of every rank's plan carry several pieces through scratch."""
    plans = [plan_for(proof, rank, count) for rank in range(proof.num_ranks)]
    return sum(
        _fused_rows(m) is not None
        for plan in plans
        for step in plan.steps
        for m in (*step.sends, *step.recvs)
    )


def run_calls(proof: Proof, count: int, dtype: str, times: int, **options: Any) -> list[bool]:
    """``times`` AllReduces of each rank's same buffer, refilled with distinct exact values before
    each: whether each call's result on each rank is the exact sum."""
    n = proof.num_ranks
    buffers = [np.zeros(count, dtype).view(DeviceArray) for _ in range(n)]
    exact: list[bool] = []
    lock = threading.Lock()

    def body(rank: int, group: NcclGroup) -> None:
        for call in range(times):
            values = payload(rank, count + call, n, dtype)[call:]
            np.ndarray.__setitem__(buffers[rank], slice(None), values)
            allreduce(buffers[rank], proof, group=group, timeout=5, **options)
            with lock:
                exact.append(bool(np.array_equal(buffers[rank], expected(count + call, n, dtype)[call:])))

    results, _ = ranks(n, body)
    assert not [r for r in results if isinstance(r, Exception)], results
    return exact


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64"])
@pytest.mark.parametrize(("n", "chunks"), [(5, 12), (4, 24)])
def test_one_kernel_packs_and_one_lands_a_message_of_several_chunks(
    monkeypatch: pytest.MonkeyPatch, dtype: str, n: int, chunks: int
) -> None:
    cupy = stand_in(monkeypatch)
    proof = prove(synthesize("stragglar", n, chunks=chunks))
    count = 4 * chunks + 3  # uneven chunks
    assert run_calls(proof, count, dtype, 2, graphs=False) == [True] * 2 * n
    fused = fused_messages(proof, count)
    assert fused > 0 and cupy.fake.launched == 2 * fused  # one kernel per message and call


@pytest.mark.parametrize("dtype", ["float16", "float32", "int64"])
def test_the_kernels_source_compiled_for_the_host_packs_and_lands_exactly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dtype: str
) -> None:
    stand_in(monkeypatch, compile_in=tmp_path)
    proof = prove(synthesize("stragglar", 5, chunks=16))
    assert run_calls(proof, 71, dtype, 3) == [True] * 15  # eager, captured, replayed


def test_a_schedule_of_one_chunk_per_message_compiles_no_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    cupy = stand_in(monkeypatch)
    proof = prove(synthesize("stragglar", 4))
    assert fused_messages(proof, 40) == 0
    assert run_calls(proof, 40, "float32", 1, graphs=False) == [True] * 4
    packings = list(cupy_nccl._packings.values())
    assert len(packings) == 4 and all(isinstance(p, FusedPacking) and not p.rows for p in packings)
    assert cupy.fake.launched == 0


def test_a_graph_keeps_the_tables_its_kernels_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packing's device tables are read when the graph runs: dropped from the cache, they
    live on with the graph, and its replays stay exact."""
    stand_in(monkeypatch)
    proof = prove(synthesize("stragglar", 4, chunks=12))
    assert run_calls(proof, 50, "float32", 2) == [True] * 8  # eager, then captured and replayed
    kept = [weakref.ref(p) for p in cupy_nccl._packings.values()]
    assert len(kept) == 4 and all(isinstance(p(), FusedPacking) for p in kept)
    cupy_nccl._packings.clear()
    gc.collect()
    assert all(p() is not None for p in kept)  # held by the graphs
    graphs._shared[CupyGraphs].captured.clear()
    gc.collect()
    assert all(p() is None for p in kept)  # and by nothing else


def message(*pieces: tuple[int, int, bool], direct: tuple[int, int] | None = None) -> BoundMessage:
    size = sum(b - a for a, b, _ in pieces)
    return BoundMessage(peer=1, tag=0, size=size, pieces=pieces, direct=direct, staging=0)


def test_which_messages_one_kernel_packs_and_lands() -> None:
    rows = _fused_rows(message((10, 14, True), (20, 20, True), (30, 33, True)))
    assert rows is not None and rows.tolist() == [[0, 10, 4, 0], [0, 30, 3, 4]]  # the empty one dropped
    assert _fused_rows(message((10, 14, False), (20, 23, False))) is not None  # copies land too
    assert _fused_rows(message((10, 14, True))) is None  # one piece: one copy or add already
    assert _fused_rows(message((10, 14, True), (20, 23, False))) is None  # both: piece by piece
    assert _fused_rows(message((10, 14, False), (14, 20, False), direct=(10, 20))) is None
