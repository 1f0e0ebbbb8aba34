"""The GPU loopback's batched rounds and CUDA graphs, on a stand-in for CuPy (:mod:`fake_cupy`)
that records launches on a capturing stream and reads buffers through raw pointers; the copy
kernels are a Python model of their contract, or their own CUDA C compiled for the host."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_cupy import FakeArray, FakeCuda, installed

from stragglar.errors import InputError
from stragglar.runtime import allreduce_local
from stragglar.runtime.batched import BatchedPlan, HostBackend, batched_plan
from stragglar.runtime.graphs import Replayer
from stragglar.runtime.local import run_local
from stragglar.runtime.plans import plan_for
from stragglar.synth import synthesize
from stragglar.verify import prove


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    yield from installed(monkeypatch)


def device(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [a.copy().view(FakeArray) for a in arrays]


def draws(n: int, count: int, dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if dtype.startswith("int"):
        return [rng.integers(-(2**20), 2**20, count).astype(dtype) for _ in range(n)]
    return [rng.standard_normal(count).astype(dtype) for _ in range(n)]


def reference(arrays: list[np.ndarray], schedule: Any, late_rank: int | None = None) -> list[np.ndarray]:
    out = [a.copy() for a in arrays]
    proof = prove(schedule)
    run_local(
        out, [plan_for(proof, r, out[0].shape[0]) for r in range(schedule.num_ranks)], late_rank=late_rank
    )
    return out


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64"])
@pytest.mark.parametrize(("n", "chunks"), [(3, None), (8, None), (8, 64), (5, 12)])
def test_calls_after_the_first_replay_one_graph_per_range_and_stay_exact(
    cuda: FakeCuda, dtype: str, n: int, chunks: int | None
) -> None:
    schedule = synthesize("stragglar", n, chunks=chunks)
    proof = prove(schedule)
    for call in range(4):  # eager, capture + replay, replay, replay: new data and buffers each time
        data = draws(n, 301, dtype, seed=call)
        bufs = device(data)
        allreduce_local(bufs, proof)
        want = reference(data, schedule)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(want, bufs, strict=True)), call
    assert cuda.captures == 2  # the rounds before the late rank joins, and the rest
    assert cuda.replays == 2 * 3


def test_graphs_false_launches_every_call_and_never_captures(cuda: FakeCuda) -> None:
    schedule = synthesize("stragglar", 6)
    proof = prove(schedule)
    for call in range(3):
        data = draws(6, 64, "float32", call)
        bufs = device(data)
        allreduce_local(bufs, proof, graphs=False)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(reference(data, schedule), bufs, strict=True))
    assert cuda.captures == 0 and cuda.replays == 0
    plan = batched_plan([plan_for(proof, r, 64) for r in range(6)], schedule.late_rank)
    assert cuda.launched == 3 * plan.launches  # a handful per round, not ~3N


def test_a_failed_capture_warns_once_and_the_rounds_run_eagerly(cuda: FakeCuda) -> None:
    cuda.refuse_capture = "operation not permitted when stream is capturing"
    schedule = synthesize("stragglar", 4)
    proof = prove(schedule)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for call in range(4):
            data = draws(4, 50, "float64", call)
            bufs = device(data)
            allreduce_local(bufs, proof)
            assert all(
                a.tobytes() == b.tobytes() for a, b in zip(reference(data, schedule), bufs, strict=True)
            )
    messages = [str(w.message) for w in seen]
    assert messages == [
        "stragglar: could not capture the rounds in a CUDA graph (RuntimeError: operation not permitted "
        "when stream is capturing); they run eagerly (slower, same results)"
    ]
    assert cuda.replays == 0


def test_the_late_rank_sleeps_between_the_two_graphs(cuda: FakeCuda) -> None:
    schedule = synthesize("stragglar", 5, straggler=1)
    proof = prove(schedule)
    for _ in range(3):
        data = draws(5, 40, "float32", 7)
        bufs = device(data)
        timelines = allreduce_local(bufs, proof, 0.02)
        late = timelines[1]
        assert late.arrived - late.start >= 0.02
        assert all(a.tobytes() == b.tobytes() for a, b in zip(reference(data, schedule), bufs, strict=True))


def test_a_graph_is_kept_per_plan_count_and_dtype(cuda: FakeCuda) -> None:
    proof = prove(synthesize("stragglar", 4))
    for count, dtype in [(10, "float32"), (11, "float32"), (10, "float64"), (10, "float32"), (10, "float32")]:
        allreduce_local(device(draws(4, count, dtype, 0)), proof)
    # (10, float32) ran three times: eager, then captured and replayed, then replayed
    assert cuda.captures == 2 and cuda.replays == 4


def test_graphs_applies_to_cupy_arrays_only() -> None:
    proof = prove(synthesize("stragglar", 3))
    with pytest.raises(InputError, match="graphs applies to CuPy arrays"):
        allreduce_local([np.zeros(4) for _ in range(3)], proof, graphs=False)
    with pytest.raises(InputError, match="graphs must be True or False, got 'no'"):
        allreduce_local([np.zeros(4) for _ in range(3)], proof, graphs="no")  # type: ignore[arg-type]


class Recording(HostBackend):
    """The host backend with a "graph" that records the stages launched while capturing."""

    def __init__(self) -> None:
        super().__init__()
        self.recording: list[Callable[[], None]] | None = None
        self.eager = 0

    def _stage(self, name: str, index: int) -> None:
        work = getattr(HostBackend, name)
        if self.recording is not None:
            self.recording.append(lambda: work(self, index))
        else:
            self.eager += 1
            work(self, index)

    def gather(self, index: int) -> None:
        self._stage("gather", index)

    def land(self, index: int) -> None:
        self._stage("land", index)

    def capture(self, work: Callable[[], object]) -> Any:
        self.recording = []
        try:
            work()
        finally:
            recorded, self.recording = self.recording, None
        return recorded

    def replay(self, graph: Any) -> None:
        for work in graph:
            work()


def test_the_replayer_runs_eagerly_first_then_from_its_graph() -> None:
    schedule = synthesize("ring", 5)
    proof = prove(schedule)
    plan: BatchedPlan = batched_plan([plan_for(proof, r, 33) for r in range(5)], schedule.late_rank)
    backend = Recording()
    replayer = Replayer(backend)
    for call in range(3):
        data = draws(5, 33, "float32", call)
        bufs = [a.copy() for a in data]
        backend.bind(bufs, plan)
        replayer((0, len(plan.rounds)), lambda: backend.run(plan, 0, len(plan.rounds)))
        assert all(a.tobytes() == b.tobytes() for a, b in zip(reference(data, schedule), bufs, strict=True))
        assert backend.eager == plan.launches  # only the first call ran eagerly
    assert list(replayer.captured) == [(0, len(plan.rounds))]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the CUDA source for the host")
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64"])
@pytest.mark.parametrize(("n", "chunks"), [(3, None), (8, 64), (5, 12)])
def test_the_cuda_source_of_the_copy_kernels_compiled_for_the_host_is_exact(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dtype: str, n: int, chunks: int | None
) -> None:
    """The kernels' own C (binary search for a thread's row, offsets, one kernel per width), every
    thread of the grid run in turn on the host, through the loopback, eagerly and from graphs."""
    cuda = next(installed(monkeypatch, compile_in=tmp_path))
    schedule = synthesize("stragglar", n, chunks=chunks)
    proof = prove(schedule)
    for call in range(3):
        data = draws(n, 1001, dtype, seed=call)
        bufs = device(data)
        allreduce_local(bufs, proof)
        want = reference(data, schedule)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(want, bufs, strict=True)), call
    assert cuda.replays == 2 * 2
