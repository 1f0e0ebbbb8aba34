"""CuPy/NCCL rounds replayed from CUDA graphs, on CPU: ranks in threads over the fake NCCL of
:mod:`test_runtime_cupy_nccl`, "CuPy" arrays (:mod:`fake_cupy`) whose writes and NCCL groups are
recorded, not run, while their stream captures, and a graph that replays what was recorded.  So a
host-side step taken during capture, or a host wait on a capturing stream, shows as a wrong sum or
a failed assertion, as it would on a GPU."""

from __future__ import annotations

import contextlib
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_cupy import FakeArray, installed
from test_runtime_cupy_nccl import FakeNccl, run_ranks
from unused_comm import UnusedComm

from stragglar.errors import InputError
from stragglar.measure.data import expected, payload
from stragglar.runtime import NcclGroup, RankError, allreduce, cupy_nccl, graphs
from stragglar.runtime.cupy_nccl import CupyGraphs, uncapturable
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove

_current = threading.local()  # each rank's thread: the stream its work is queued on


def capturing() -> GraphStream | None:
    stream: GraphStream | None = getattr(_current, "stream", None)
    return stream if stream is not None and stream.recording is not None else None


class GraphStream:
    """A rank's stream: while it captures, work queued on it is recorded; a graph replays it."""

    ptr = 7  # not CUDA's legacy stream (0), which cannot be captured

    def __init__(self, refuse: str | None = None) -> None:
        self.stuck = False
        self.refuse = refuse
        self.recording: list[Callable[[], object]] | None = None
        self.captures = 0
        self.replays = 0

    @property
    def done(self) -> bool:
        assert self.recording is None, "a host wait on a stream being captured"
        return not self.stuck

    def __enter__(self) -> GraphStream:
        _current.stream = self
        return self

    def __exit__(self, *exc: object) -> None:
        _current.stream = None

    def begin_capture(self) -> None:
        if self.refuse:
            raise RuntimeError(self.refuse)
        self.recording = []

    def end_capture(self) -> Any:
        recorded, self.recording = self.recording or [], None
        self.captures += 1
        return types.SimpleNamespace(launch=lambda stream: self._replay(stream, recorded))

    def _replay(self, stream: object, recorded: list[Callable[[], object]]) -> None:
        assert stream is self, "a graph replays on the stream of its rounds"
        self.replays += 1
        for work in recorded:
            work()


class DeviceArray(FakeArray):
    """Writes are queued work: recorded while the stream captures."""

    def __setitem__(self, key: Any, value: Any) -> None:
        stream = capturing()
        if stream is None:
            super().__setitem__(key, value)
        else:
            stream.recording.append(lambda: np.ndarray.__setitem__(self, key, value))  # type: ignore[union-attr]

    def __iadd__(self, other: Any) -> Any:  # type: ignore[misc]
        stream = capturing()
        if stream is None:
            return super().__iadd__(other)
        stream.recording.append(lambda: np.ndarray.__iadd__(self, other))  # type: ignore[union-attr]
        return self


class GraphNccl(FakeNccl):
    """A group of sends and receives is queued work too."""

    def groupEnd(self) -> None:
        ops = self.state.ops
        stream = ops[0][1].stream if ops else None
        if stream is None or stream.recording is None:
            super().groupEnd()
            return
        self.state.ops = None

        def run() -> None:
            self.state.ops = ops
            FakeNccl.groupEnd(self)

        stream.recording.append(run)


@pytest.fixture
def cupy(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    return stand_in(monkeypatch)


def stand_in(monkeypatch: pytest.MonkeyPatch, compile_in: Path | None = None) -> types.ModuleType:
    """The CuPy stand-in (its kernels compiled with g++ in ``compile_in``, if given), with the
    per-thread current stream above (kernels launched on it are recorded while it captures, as
    the arrays' writes are), fresh caches and a fresh replayer."""
    fake = next(installed(monkeypatch, compile_in))
    import sys

    module = sys.modules["cupy"]
    module.fake = fake  # type: ignore[attr-defined]  # what ran: the eager launches

    def recording() -> list[Callable[[], object]] | None:
        stream = capturing()
        return stream.recording if stream is not None else None

    monkeypatch.setattr(fake, "recording", recording)
    allocator = threading.local()
    monkeypatch.setattr(
        module,
        "cuda",
        types.SimpleNamespace(
            get_current_stream=lambda: _current.stream,
            get_allocator=lambda: getattr(allocator, "use", None) or (lambda size: ("block", size)),
            using_allocator=lambda use: _using(allocator, use),
        ),
        raising=False,
    )
    monkeypatch.setattr(graphs, "_shared", {})
    monkeypatch.setattr(cupy_nccl, "_packings", type(cupy_nccl._packings)())
    return module


@contextlib.contextmanager
def _using(state: threading.local, use: Callable[[int], Any]) -> Iterator[None]:
    outer = getattr(state, "use", None)
    state.use = use
    try:
        yield
    finally:
        state.use = outer


def ranks(
    n: int,
    body: Callable[[int, NcclGroup], Any],
    refuse: str | None = None,
    nccl: type[GraphNccl] = GraphNccl,
) -> tuple[list[Any], list[GraphStream]]:
    """``body(rank, group)`` in n threads, each rank's group (of ``nccl``) on its own capturing
    stream: the results (or exceptions) and the streams."""
    *out, _, groups = run_ranks(n, body, nccl, lambda: GraphStream(refuse))
    return out, [g.stream for g in groups]


def device_payload(rank: int, count: int, n: int, call: int) -> DeviceArray:
    """Distinct exact values per rank, element and call (each call the values of the elements
    ``call`` places on)."""
    values = payload(rank, count + call, n, "float32")[call:].astype(np.float32)
    array: DeviceArray = values.view(DeviceArray)
    return array


def calls(
    proof: Proof, n: int, count: int, times: int, nccl: type[GraphNccl] = GraphNccl, **options: Any
) -> tuple[list[list[DeviceArray]], list[GraphStream]]:
    """``times`` AllReduces on each rank's same buffer (over ``nccl``), refilled with new values
    before each: every call's results, and the ranks' streams."""
    buffers = [np.zeros(count, np.float32).view(DeviceArray) for _ in range(n)]
    seen: list[list[DeviceArray]] = []

    def body(rank: int, group: NcclGroup) -> None:
        for call in range(times):
            np.ndarray.__setitem__(buffers[rank], slice(None), device_payload(rank, count, n, call))
            barrier.wait(timeout=10)
            allreduce(buffers[rank], proof, group=group, timeout=5, **options)
            barrier.wait(timeout=10)
            if rank == 0:
                seen.append([b.copy() for b in buffers])
            barrier.wait(timeout=10)  # nobody refills before the copy

    barrier = threading.Barrier(n)
    results, streams = ranks(n, body, nccl=nccl)
    assert not [r for r in results if isinstance(r, Exception)], results
    return seen, streams


def want(count: int, n: int, call: int) -> np.ndarray:
    total: np.ndarray = expected(count + call, n, "float32")[call:]
    return total


@pytest.mark.parametrize(("n", "chunks"), [(4, None), (5, 12), (3, None)])
def test_rounds_replay_from_the_second_call_and_stay_exact(
    cupy: types.ModuleType, n: int, chunks: int | None
) -> None:
    proof = prove(synthesize("stragglar", n, chunks=chunks))
    results, streams = calls(proof, n, 101, 4)
    for call, buffers in enumerate(results):
        assert all(np.array_equal(b, want(101, n, call)) for b in buffers), call
    assert [s.captures for s in streams] == [1] * n and [s.replays for s in streams] == [3] * n


def test_graphs_false_never_captures(cupy: types.ModuleType) -> None:
    proof = prove(synthesize("stragglar", 4))
    results, streams = calls(proof, 4, 33, 3, graphs=False)
    for call, buffers in enumerate(results):
        assert all(np.array_equal(b, want(33, 4, call)) for b in buffers)
    assert all(s.captures == 0 and s.replays == 0 for s in streams)


def test_a_new_buffer_gets_its_own_graph(cupy: types.ModuleType) -> None:
    """A graph writes the buffer it was captured on: another buffer of the same size is another key."""
    n, count = 3, 20
    proof = prove(synthesize("stragglar", n))

    def body(rank: int, group: NcclGroup) -> list[bool]:
        exact = []
        for call in range(3):
            for _ in range(2):  # a fresh buffer each time: never replayed on the wrong one
                buffer = device_payload(rank, count, n, call)
                allreduce(buffer, proof, group=group, timeout=5)
                exact.append(bool(np.array_equal(buffer, want(count, n, call))))
        return exact

    results, _ = ranks(n, body)  # how many graphs: as many as addresses (a freed one comes back)
    assert all(r == [True] * 6 for r in results), results


def test_a_failed_capture_warns_once_and_the_rounds_run_eagerly(cupy: types.ModuleType) -> None:
    n, count = 4, 40
    proof = prove(synthesize("stragglar", n))
    buffers = [np.zeros(count, np.float32).view(DeviceArray) for _ in range(n)]

    def body(rank: int, group: NcclGroup) -> list[bool]:
        exact = []
        for call in range(3):
            np.ndarray.__setitem__(buffers[rank], slice(None), device_payload(rank, count, n, call))
            allreduce(buffers[rank], proof, group=group, timeout=5)
            exact.append(bool(np.array_equal(buffers[rank], want(count, n, call))))
        return exact

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        results, streams = ranks(n, body, refuse="operation not permitted on the legacy stream")
    assert all(r == [True] * 3 for r in results), results
    assert all(s.replays == 0 for s in streams)
    assert [str(w.message) for w in seen] == [
        "stragglar: could not capture the rounds in a CUDA graph (RuntimeError: operation not "
        "permitted on the legacy stream); they run eagerly (slower, same results)"
    ]


class OldNccl(GraphNccl):
    version = 2803  # NCCL 2.8.3, in the encoding before 2.9


def test_an_nccl_older_than_2_9_6_is_never_captured(cupy: types.ModuleType) -> None:
    """Its capture may seem to succeed and its replay hang: the rounds run eagerly, said once (on
    the second call of a buffer, when a capture would be due)."""
    n, count = 3, 30
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        results, streams = calls(prove(synthesize("stragglar", n)), n, count, 3, nccl=OldNccl)
    for call, buffers in enumerate(results):
        assert all(np.array_equal(b, want(count, n, call)) for b in buffers), call
    assert all(s.captures == 0 and s.replays == 0 for s in streams)
    assert [str(w.message) for w in seen] == [
        "stragglar: could not capture the rounds in a CUDA graph (NCCL 2.8.3 cannot be captured: "
        "2.9.6 and later can); they run eagerly (slower, same results)"
    ]


@pytest.mark.parametrize(
    ("code", "why"),
    [
        (20906, None),
        (22803, None),
        (20905, "NCCL 2.9.5 cannot be captured: 2.9.6 and later can"),
        (2708, "NCCL 2.7.8 cannot be captured: 2.9.6 and later can"),
    ],
)
def test_which_nccl_versions_can_be_captured(code: int, why: str | None) -> None:
    nccl = types.SimpleNamespace(get_version=lambda: code)
    assert uncapturable(NcclGroup(comm=UnusedComm(), nccl=nccl, stream=object())) == why


def test_a_rank_gone_during_a_replay_times_the_others_out_on_the_host(cupy: types.ModuleType) -> None:
    """The final wait is outside the graph, so a replayed call still ends at its deadline."""
    n, count = 4, 24
    proof = prove(synthesize("stragglar", n))
    buffers = [np.zeros(count, np.float32).view(DeviceArray) for _ in range(n)]

    def body(rank: int, group: NcclGroup) -> Any:
        for call in range(2):  # eager, then captured and replayed: the headers agree and are kept
            np.ndarray.__setitem__(buffers[rank], slice(None), device_payload(rank, count, n, call))
            allreduce(buffers[rank], proof, group=group, timeout=1.0)
        if rank == 3:
            return None  # leaves before the third call's rounds
        return allreduce(buffers[rank], proof, group=group, timeout=1.0)

    results, streams = ranks(n, body)
    for rank in range(3):
        error = results[rank]
        assert isinstance(error, RankError) and error.reason == "timed out", error
        assert streams[rank].replays == 2  # the second call and the one that timed out


def test_graphs_applies_to_cupy_arrays_on_an_ncclgroup() -> None:
    proof = prove(synthesize("ring", 2))
    group = NcclGroup(comm=UnusedComm(), nccl=object(), stream=object())
    with pytest.raises(InputError, match="graphs applies to CuPy arrays on an NcclGroup"):
        allreduce(np.zeros(4, np.float32), proof, group=group, graphs=True)


def test_a_capture_keeps_the_memory_it_allocated_until_the_graph_goes(cupy: types.ModuleType) -> None:
    """CuPy's pool would hand scratch freed after a capture to other arrays, which every replay
    would then overwrite: the graph holds what was allocated while capturing."""
    stream = GraphStream()
    allocated: list[Any] = []

    def work() -> None:  # allocates as CuPy's empty() would: through the current allocator
        allocated.append(cupy.cuda.get_allocator()(4096))

    with stream:
        captured = CupyGraphs().capture(work)
    assert captured.memory == (("block", 4096),) and allocated == [("block", 4096)]
    assert cupy.cuda.get_allocator()(8) == ("block", 8)  # the allocator is restored

    def failing() -> None:
        raise RuntimeError("capture invalidated")

    with stream, pytest.raises(RuntimeError, match="capture invalidated"):
        CupyGraphs().capture(failing)
    assert stream.recording is None and stream.captures == 2  # the capture was ended anyway


def test_a_group_without_a_stream_runs_on_its_own_after_the_callers_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUDA's legacy stream cannot be captured: a group given none gets this thread's own stream
    on the current device, which first waits for the caller's current stream."""
    made: list[Any] = []
    waited: list[object] = []

    class Stream:
        def __init__(self, non_blocking: bool = False) -> None:
            assert non_blocking
            made.append(self)

        def wait_event(self, event: object) -> None:
            waited.append(event)

    caller = types.SimpleNamespace(record=lambda: "the caller's work")
    cuda = types.SimpleNamespace(
        Stream=Stream,
        Device=lambda: types.SimpleNamespace(id=0),
        get_current_stream=lambda: caller,
        nccl=types.SimpleNamespace(),
    )
    fake = types.ModuleType("cupy")
    fake.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)
    monkeypatch.setitem(__import__("sys").modules, "cupy.cuda", cuda)
    comm = UnusedComm()
    first = NcclGroup(comm).resolved()
    again = NcclGroup(comm).resolved()
    other: list[Any] = []
    thread = threading.Thread(target=lambda: other.append(NcclGroup(comm).resolved()))
    thread.start()
    thread.join(10)
    assert first.stream is again.stream is made[0] and other[0].stream is made[1]
    assert waited == ["the caller's work"] * 3
