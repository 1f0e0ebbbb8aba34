"""CUDA graph replay of a rank's rounds (:mod:`stragglar.runtime.graphs`, ``run_rank_replayed``) on
CPU: ranks in threads exchanging through queues, and a stand-in for the graph API whose "graph" is
the work it was captured from, replayed later.  What this checks: the first call of a key runs
eagerly, the second captures and replays, later ones replay; keys keep apart what a graph bakes
in; the late rank sleeps on the host before the replay; a failed capture warns once and runs
eagerly; the cache is bounded."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import warnings
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np
import pytest
from unused_comm import UnusedComm

from stragglar.runtime import plan_for, rounds_without
from stragglar.runtime.clock import Timeline
from stragglar.runtime.graphs import Replayer
from stragglar.runtime.interpreter import run_rank_replayed
from stragglar.runtime.program import BoundStep, Plan
from stragglar.synth import synthesize
from stragglar.verify import prove

_T = TypeVar("_T")


class Recorder:
    """Capture keeps the work without running it; replay runs it."""

    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail
        self.captures = 0
        self.replays = 0
        self.synchronized = 0

    def capture(self, work: Callable[[], object]) -> Any:
        if self.fail:
            raise RuntimeError(self.fail)
        self.captures += 1
        return work

    def replay(self, graph: Any) -> None:
        self.replays += 1
        graph()

    def synchronize(self) -> None:
        self.synchronized += 1


class Queues:
    """A transport between ranks in threads: a send is a copy put on the (sender, receiver)
    queue, a receive takes it (with a timeout: a test never hangs)."""

    def __init__(self, n: int) -> None:
        self.lanes = {(a, b): queue.Queue[np.ndarray]() for a in range(n) for b in range(n)}

    def transport(self, rank: int) -> Any:
        lanes = self.lanes

        class Transport:
            def exchange(self, step: BoundStep, sends: list[np.ndarray], recvs: list[np.ndarray]) -> None:
                for m, data in zip(step.sends, sends, strict=True):
                    lanes[(rank, m.peer)].put(data.copy())
                for m, into in zip(step.recvs, recvs, strict=True):
                    into[:] = lanes[(m.peer, rank)].get(timeout=10)

            def finish(self) -> None:
                pass

        return Transport()


def ranks_in_threads(n: int, work: Callable[[int], _T]) -> list[_T]:
    """``work(rank)`` for n ranks in threads, their results; any exception fails the test."""
    out: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            out[rank] = work(rank)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    return out


def test_rounds_replay_from_the_second_call_on_the_same_buffer_and_stay_exact() -> None:
    n, count, delay = 3, 50, 0.03
    proof = prove(synthesize("stragglar", n))
    plans: list[Plan] = [plan_for(proof, r, count) for r in range(n)]
    devices = [Recorder() for _ in range(n)]
    replayers = [Replayer(d) for d in devices]
    buffers = [np.zeros(count, np.float64) for _ in range(n)]
    late = proof.schedule.late_rank
    for call in range(4):
        data = [np.arange(count, dtype=np.float64) * (r + 1) + 100 * call for r in range(n)]
        for b, d in zip(buffers, data, strict=True):
            b[:] = d
        lanes = Queues(n)

        def rank_work(rank: int, lanes: Queues = lanes) -> Timeline:
            key: Hashable = ("group", rank, buffers[rank].ctypes.data, count, "float64")
            transport = lanes.transport(rank)
            return run_rank_replayed(buffers[rank], plans[rank], transport, replayers[rank], key, delay, late)

        timelines = ranks_in_threads(n, rank_work)
        total = sum(data)
        assert all(np.array_equal(b, total) for b in buffers), call
        assert timelines[late].arrived - timelines[late].start >= delay  # before the replay too
        assert all(t.phase_done[-1] is not None for t in timelines)
    assert [d.captures for d in devices] == [1] * n and [d.replays for d in devices] == [3] * n


def test_a_key_seen_once_runs_eagerly_and_keys_keep_graphs_apart() -> None:
    device = Recorder()
    replayer = Replayer(device)
    ran: list[str] = []
    for key in ["a", "b", "a", "a", "b", "c"]:
        replayer(key, lambda key=key: ran.append(key))  # type: ignore[misc]
    assert ran == ["a", "b", "a", "a", "b", "c"]  # every call ran its own work once
    assert device.captures == 2 and device.replays == 3  # a: capture+replay, replay; b: capture+replay
    assert list(replayer.captured) == ["a", "b"]


def test_graphs_off_never_captures() -> None:
    device = Recorder()
    replayer = Replayer(device, graphs=False)
    for _ in range(3):
        replayer("a", lambda: None)
    assert device.captures == 0 and device.replays == 0


def test_graphs_turned_off_run_eagerly_even_where_a_graph_was_captured() -> None:
    device = Recorder()
    replayer = Replayer(device)
    ran: list[int] = []
    for call in range(3):
        replayer("a", lambda call=call: ran.append(call))  # type: ignore[misc]
    replayer.graphs = False
    replayer("a", lambda: ran.append(3))
    # call 1's work was captured, then replayed in calls 1 and 2; call 3 ran its own
    assert ran == [0, 1, 1, 3] and device.captures == 1 and device.replays == 2
    replayer.graphs = True
    replayer("a", lambda: ran.append(4))
    assert ran == [0, 1, 1, 3, 1] and device.replays == 3  # on again: the graph kept replays


def test_a_failed_capture_warns_once_and_everything_runs_eagerly_after() -> None:
    device = Recorder(fail="capture not permitted")
    replayer = Replayer(device)
    ran: list[str] = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for key in ["a", "a", "a", "b", "b"]:
            replayer(key, lambda key=key: ran.append(key))  # type: ignore[misc]
    assert ran == ["a", "a", "a", "b", "b"]
    assert [str(w.message) for w in seen] == [
        "stragglar: could not capture the rounds in a CUDA graph (RuntimeError: capture not permitted); "
        "they run eagerly (slower, same results)"
    ]


def test_the_graph_cache_keeps_the_most_recently_used() -> None:
    device = Recorder()
    replayer = Replayer(device, limit=2)
    for key in ["a", "a", "b", "b", "a", "c", "c"]:
        replayer(key, lambda: None)
    assert list(replayer.captured) == ["a", "c"]  # b was least recently used


def test_the_late_rank_sleeps_only_in_the_call_that_holds_its_first_round() -> None:
    n, count, delay = 4, 16, 0.05
    proof = prove(synthesize("stragglar", n))
    late = proof.schedule.late_rank
    plans = [plan_for(proof, r, count) for r in range(n)]
    split = plans[late].steps[0].round  # the late rank's first round: a call ending before it
    buffers = [np.full(count, float(r + 1)) for r in range(n)]
    lanes = Queues(n)
    replayers = [Replayer(Recorder()) for _ in range(n)]

    def part(rounds: tuple[int, int | None]) -> Callable[[int], Timeline]:
        def rank_work(rank: int) -> Timeline:
            key: Hashable = (rank, rounds)
            transport = lanes.transport(rank)
            return run_rank_replayed(
                buffers[rank], plans[rank], transport, replayers[rank], key, delay, late, rounds
            )

        return rank_work

    start = time.perf_counter()
    early = ranks_in_threads(n, part((0, split)))
    assert time.perf_counter() - start < delay  # nobody waited for the late rank
    assert all(t.arrived == pytest.approx(t.start, abs=0.01) for t in early)
    rest = ranks_in_threads(n, part((split, None)))
    assert rest[late].arrived - rest[late].start >= delay
    assert all(np.array_equal(b, np.full(count, float(n * (n + 1) // 2))) for b in buffers)


class Meeting(Recorder):
    """Every capture waits until ``parties`` captures are under way at once (threads), then fails
    or records as the Recorder does."""

    def __init__(self, parties: int, fail: str | None = None) -> None:
        super().__init__(fail)
        self.barrier = threading.Barrier(parties)

    def capture(self, work: Callable[[], object]) -> Any:
        self.barrier.wait(timeout=10)
        return super().capture(work)


def test_threads_that_fail_to_capture_at_once_warn_once_and_run_their_work() -> None:
    """The DDP hook's two workers share the process's replayer: two captures failing together
    are said once, and each thread's work still runs."""
    replayer = Replayer(Meeting(2, fail="capture not permitted"))
    ran: list[str] = []

    def rank_thread(rank: int) -> None:
        key = f"stage {rank + 1}"
        for _ in range(2):  # eager, then the failed capture (both threads in it at once)
            replayer(key, lambda: ran.append(key))

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ranks_in_threads(2, rank_thread)
    assert sorted(ran) == ["stage 1"] * 2 + ["stage 2"] * 2
    assert len(seen) == 1 and "capture not permitted" in str(seen[0].message)


def test_threads_capturing_at_once_each_keep_their_graph() -> None:
    device = Meeting(2)
    replayer = Replayer(device)
    ran: list[str] = []

    def rank_thread(rank: int) -> None:
        key = f"stage {rank + 1}"
        for _ in range(4):  # eager, capture and replay (both threads at once), replay, replay
            replayer(key, lambda: ran.append(key))

    ranks_in_threads(2, rank_thread)
    assert sorted(ran) == ["stage 1"] * 4 + ["stage 2"] * 4
    assert device.captures == 2 and device.replays == 6 and set(replayer.captured) == {"stage 1", "stage 2"}


def test_torch_captures_forbid_unsafe_calls_in_the_capturing_thread_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default ("global") mode would make the other DDP worker's own rounds fail while one
    thread captures."""
    torch = pytest.importorskip("torch")
    from stragglar.runtime.torch_dist import CudaGraphs

    modes: list[object] = []

    class Graph:
        pass

    def graph(cuda_graph: object, **options: object) -> Any:
        modes.append(options.get("capture_error_mode"))
        return contextlib.nullcontext()

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    ran: list[int] = []
    assert isinstance(CudaGraphs().capture(lambda: ran.append(1)), Graph) and ran == [1]
    assert modes == ["thread_local"]


@pytest.mark.parametrize(
    ("version", "why"),
    [
        ((2, 28, 3), None),
        ((2, 21, 5, "a0"), None),  # a suffix after the three numbers
        ((2, 9, 6), None),
        ((2, 9, 5), "NCCL 2.9.5 cannot be captured: 2.9.6 and later can"),
        ((2, 8, 4), "NCCL 2.8.4 cannot be captured: 2.9.6 and later can"),
    ],
)
def test_torch_captures_no_nccl_older_than_2_9_6(
    monkeypatch: pytest.MonkeyPatch, version: tuple[Any, ...], why: str | None
) -> None:
    """Such an NCCL's capture may seem to succeed and its replay hang."""
    torch = pytest.importorskip("torch")
    from stragglar.runtime.torch_dist import torch_uncapturable

    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: version)
    assert torch_uncapturable() == why


def test_a_refusal_is_asked_only_when_a_capture_is_due_and_then_everything_runs_eagerly() -> None:
    recorder = Recorder()
    replayer = Replayer(recorder)
    asked: list[str] = []

    def allowed() -> None:
        asked.append("key")

    ran: list[int] = []
    for _ in range(3):
        replayer("key", lambda: ran.append(1), refusal=allowed)
    # eager (not asked), then asked before the capture, then replayed (not asked)
    assert asked == ["key"] and recorder.captures == 1 and recorder.replays == 2 and ran == [1, 1, 1]

    def refused() -> str:
        asked.append("other")
        return "NCCL 2.8.4 cannot be captured: 2.9.6 and later can"

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            replayer("other", lambda: ran.append(2), refusal=refused)
    assert recorder.captures == 1 and ran == [1, 1, 1, 2, 2, 2]  # "other" never captured
    assert asked == ["key", "other"]  # asked once: refused, nothing is captured any more
    assert [str(w.message) for w in seen] == [
        "stragglar: could not capture the rounds in a CUDA graph (NCCL 2.8.4 cannot be captured: "
        "2.9.6 and later can); they run eagerly (slower, same results)"
    ]


def test_release_drops_the_graphs_on_one_owner_after_the_device_ran_them() -> None:
    """A graph holds its NCCL communicator, which NCCL then will not destroy: release drops the
    graphs whose key starts with the owner, once the device is done, and forgets their keys."""
    device = Recorder()
    replayer = Replayer(device)
    ran: list[Hashable] = []
    keys: list[Hashable] = [("group a", 1), ("group b", 1), ("group a", 2), "loopback"]
    for _ in range(2):  # eager, then captured
        for key in keys:
            replayer(key, lambda key=key: ran.append(key))  # type: ignore[misc]
    assert len(replayer.captured) == 4 and device.synchronized == 0
    assert replayer.release("group a") == 2 and device.synchronized == 1
    assert list(replayer.captured) == [("group b", 1), "loopback"]
    assert ("group a", 1) not in replayer.seen and ("group b", 1) in replayer.seen
    assert replayer.release("group a") == 0 and device.synchronized == 1  # nothing left: no wait
    ran.clear()
    for _ in range(2):  # a released key runs eagerly once, then is captured again
        replayer(("group a", 1), lambda: ran.append("again"))
    assert ran == ["again", "again"] and device.captures == 5
    assert replayer.release() == 3 and not replayer.captured and not replayer.seen


def test_release_graphs_finds_an_ncclgroups_communicator_in_the_shared_replayers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stragglar.runtime import NcclGroup, release_graphs
    from stragglar.runtime import graphs as graphs_module

    device = Recorder()
    replayer = Replayer(device)
    monkeypatch.setattr(graphs_module, "_shared", {Recorder: replayer})
    comm, other = UnusedComm(), UnusedComm()
    for _ in range(2):
        replayer((comm, "rounds"), lambda: None)
        replayer((other, "rounds"), lambda: None)
    assert release_graphs(NcclGroup(comm)) == 1 and list(replayer.captured) == [(other, "rounds")]
    assert release_graphs() == 1 and not replayer.captured


def test_a_range_without_this_ranks_rounds_is_never_captured() -> None:
    """The late rank has no part in the first rounds: its call over them replays nothing, and
    makes no (empty) graph, however often it comes."""
    n, count = 4, 12
    proof = prove(synthesize("stragglar", n))
    late = proof.schedule.late_rank
    split = rounds_without(proof, late)
    assert split > 0
    plan = plan_for(proof, late, count)
    device = Recorder()
    replayer = Replayer(device)
    calls: list[Hashable] = []

    def replay(key: Hashable, work: Callable[[], object]) -> None:
        calls.append(key)
        replayer(key, work)

    buffer = np.zeros(count)
    for _ in range(3):
        timeline = run_rank_replayed(
            buffer, plan, Queues(n).transport(late), replay, "early", 0.0, late, (0, split)
        )
        assert timeline.done >= timeline.start
    assert calls == [] and device.captures == 0
