"""The GPU loopback's batched rounds and CUDA graphs, on a stand-in for CuPy that keeps arrays in
host memory and follows CUDA's rules where they matter: kernels read buffers through the device
pointers they are given, a launch on a capturing stream is recorded, not run, and a graph replays
exactly what was recorded.  So a host-side shortcut taken during capture, a pointer table not
refreshed between calls, or a stage out of order gives wrong sums here, as it would on a GPU.
The CUDA C of the copy kernels itself runs only on a GPU (benchmarks/bench_gpu.py checks it)."""

from __future__ import annotations

import ctypes
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from stragglar.errors import InputError
from stragglar.runtime import allreduce_local
from stragglar.runtime.batched import BatchedPlan, HostBackend, batched_plan
from stragglar.runtime.graphs import Replayer
from stragglar.runtime.local import run_local
from stragglar.runtime.plans import plan_for
from stragglar.synth import synthesize
from stragglar.verify import prove


class FakeArray(np.ndarray):
    """A "device" array: host memory with CuPy's ``data.ptr``, ``device`` and ``set``."""

    @property
    def data(self) -> Any:
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    @property
    def device(self) -> Any:
        return types.SimpleNamespace(id=0)

    def set(self, host: np.ndarray, stream: Any = None) -> None:
        self[...] = host


class FakeCuda:
    """Streams that record launches while capturing; counts what ran and how."""

    def __init__(self) -> None:
        self.current: FakeStream | None = None
        self.launched = 0  # kernels and adds run eagerly
        self.replays = 0
        self.captures = 0
        self.refuse_capture: str | None = None

    def Stream(self, non_blocking: bool = False) -> FakeStream:
        return FakeStream(self)

    def get_current_stream(self) -> Any:
        return types.SimpleNamespace(record=lambda: "event")

    def launch(self, work: Callable[[], None]) -> None:
        stream = self.current
        if stream is not None and stream.recording is not None:
            stream.recording.append(work)
        else:
            self.launched += 1
            work()


class FakeStream:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.recording: list[Callable[[], None]] | None = None
        self.outer: FakeStream | None = None

    def __enter__(self) -> FakeStream:
        self.outer, self.cuda.current = self.cuda.current, self
        return self

    def __exit__(self, *exc: object) -> None:
        self.cuda.current = self.outer

    def wait_event(self, event: object) -> None:
        pass

    def begin_capture(self) -> None:
        if self.cuda.refuse_capture:
            raise RuntimeError(self.cuda.refuse_capture)
        self.recording = []

    def end_capture(self) -> Any:
        recorded, self.recording = self.recording or [], None
        self.cuda.captures += 1
        return types.SimpleNamespace(launch=lambda stream: self._replay(recorded))

    def _replay(self, recorded: list[Callable[[], None]]) -> None:
        self.cuda.replays += 1
        for work in recorded:
            work()

    def synchronize(self) -> None:
        pass


def _memory(pointer: int, dtype: np.dtype[Any], count: int) -> np.ndarray:
    """``count`` elements at a raw address, as a kernel would see them."""
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(pointer)
    return np.frombuffer(memoryview(raw), dtype=dtype)


def _kernel(cuda: FakeCuda, into_buffers: bool) -> Callable[..., None]:
    """The copy kernels' contract: row (rank, start, length, slot) moves ``length`` elements
    between ``buffers[rank] + start`` and ``round + slot``."""

    def kernel(grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
        pointers, rows, count, size, words = args
        assert int(count) == len(rows) and int(size) == int(rows[-1, 2] + rows[-1, 3])

        def work() -> None:
            for rank, start, length, slot in rows.tolist():
                memory = _memory(int(pointers[rank]), words.dtype, start + length)
                if into_buffers:
                    memory[start : start + length] = words[slot : slot + length]
                else:
                    words[slot : slot + length] = memory[start : start + length]

        cuda.launch(work)

    return kernel


def fake_cupy(cuda: FakeCuda) -> types.ModuleType:
    module = types.ModuleType("cupy")
    module.ndarray = FakeArray  # type: ignore[attr-defined]
    module.cuda = cuda  # type: ignore[attr-defined]
    module.uint64 = np.uint64  # type: ignore[attr-defined]

    def raw_module(code: str, options: tuple[str, ...], name_expressions: list[str]) -> Any:
        assert "from_buffers" in code and all("<unsigned" in name for name in name_expressions)
        kernels = {name.split("<")[0]: _kernel(cuda, name.startswith("into")) for name in name_expressions}
        return types.SimpleNamespace(get_function=lambda name: kernels[name.split("<")[0]])

    def add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        cuda.launch(lambda: np.add(a, b, out=out))

    module.RawModule = raw_module  # type: ignore[attr-defined]
    module.add = add  # type: ignore[attr-defined]
    module.asarray = lambda a: np.asarray(a).view(FakeArray)  # type: ignore[attr-defined]
    module.empty = lambda n, dtype: np.empty(n, dtype).view(FakeArray)  # type: ignore[attr-defined]
    module.zeros = lambda n, dtype: np.zeros(n, dtype).view(FakeArray)  # type: ignore[attr-defined]
    return module


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    from stragglar.runtime import loopback_gpu

    fake = FakeCuda()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(fake))
    monkeypatch.setattr(loopback_gpu, "_modules", {})
    monkeypatch.setattr(loopback_gpu, "_loopbacks", type(loopback_gpu._loopbacks)())
    yield fake


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

    def fetch(self, index: int) -> None:
        self._stage("fetch", index)

    def add(self, index: int) -> None:
        self._stage("add", index)

    def land(self, index: int) -> None:
        self._stage("land", index)

    def capture(self, work: Callable[[], None]) -> Any:
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
        replayer(plan, 0, len(plan.rounds))
        assert all(a.tobytes() == b.tobytes() for a, b in zip(reference(data, schedule), bufs, strict=True))
        assert backend.eager == plan.launches  # only the first call ran eagerly
    assert list(replayer.captured) == [(0, len(plan.rounds))]
