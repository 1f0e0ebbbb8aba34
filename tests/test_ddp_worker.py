"""The CUDA path without a GPU: a fake ``torch.cuda`` (streams, events) and a fake NCCL.

These run on any machine (the CUDA path itself has run on an H200: benchmarks/gpu_check.sh), so
they check the protocol, not a device: on NCCL a
stream-ordered round is waited on the stream, never the host; a bucket's two stages run with their
side streams current, each after the event recorded before it; nothing synchronises the host; the
Future completes while the second side stream is current (so a real CUDA Future records its completion there);
and event timings count from the operation queued before.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stragglar.ddp.orders import HostOrder, HostWatch, StreamOrder  # noqa: E402
from stragglar.ddp.worker import BucketWorker, Job, Reducer, dedicated_group, global_ranks  # noqa: E402
from stragglar.measure.data import expected, payload  # noqa: E402
from stragglar.measure.launch import launch  # noqa: E402
from stragglar.runtime import RankError, plan_for, rounds_without  # noqa: E402
from stragglar.runtime.interpreter import run_rank  # noqa: E402
from stragglar.synth import synthesize  # noqa: E402
from stragglar.verify import Proof, prove  # noqa: E402


class FakeCuda:
    """What :class:`StreamOrder` uses of ``torch.cuda``, logging every call; any host
    synchronisation raises."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.now = 0.0  # the fake device clock, seconds
        self._local = threading.local()
        self.sides = 0
        self.compute = FakeStream(self, "compute")

    def Stream(self, device: Any = None) -> FakeStream:
        self.sides += 1
        return FakeStream(self, f"side {self.sides}")

    def Event(self, enable_timing: bool = False) -> FakeEvent:
        return FakeEvent(self)

    def current_stream(self, device: Any = None) -> FakeStream:
        current: FakeStream = getattr(self._local, "stream", self.compute)
        return current

    @contextlib.contextmanager
    def stream(self, s: FakeStream) -> Iterator[None]:
        before = self.current_stream()
        self._local.stream = s
        try:
            yield
        finally:
            self._local.stream = before

    @contextlib.contextmanager
    def device(self, d: Any) -> Iterator[None]:
        yield

    def synchronize(self) -> None:
        raise AssertionError("the host synchronised with the device")


class FakeStream:
    def __init__(self, cuda: FakeCuda, name: str) -> None:
        self.cuda, self.name = cuda, name

    def wait_event(self, event: FakeEvent) -> None:
        self.cuda.log.append(f"{self.name} waits for {event.name}")

    def synchronize(self) -> None:
        raise AssertionError(f"the host synchronised with stream {self.name}")


class FakeEvent:
    count = 0

    def __init__(self, cuda: FakeCuda) -> None:
        FakeEvent.count += 1
        self.cuda, self.name = cuda, f"event {FakeEvent.count}"
        self.at: float | None = None

    def record(self, stream: FakeStream) -> None:
        self.at = self.cuda.now
        self.cuda.log.append(f"{self.name} recorded on {stream.name}")

    def query(self) -> bool:
        return self.at is not None

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1e3

    def synchronize(self) -> None:
        raise AssertionError(f"the host synchronised with {self.name}")


class FakeStreamOrder(StreamOrder):
    """A CPU Future instead of a CUDA one: torch's device-aware Future needs a device's streams
    for its callbacks.  What it records on completion is torch's; the test checks when."""

    def future(self) -> Any:
        return torch.futures.Future()

    def keep(self, buffer: Any, side: Any) -> None:
        """Logged: a CPU tensor has no ``record_stream``."""
        self.cuda.log.append(f"bucket of {buffer.numel()} kept for {side.name}")


class FakeWork:
    def __init__(self, waits: list[tuple[Any, ...]]) -> None:
        self.waits = waits

    def wait(self, *args: Any) -> bool:
        self.waits.append(args)
        return True


@pytest.mark.parametrize("stream_ordered", [True, False])
def test_nccl_rounds_in_stream_order_never_wait_on_the_host(
    monkeypatch: pytest.MonkeyPatch, stream_ordered: bool
) -> None:
    import torch.distributed as dist

    from stragglar.runtime.torch_dist import TorchTransport

    waits: list[tuple[Any, ...]] = []
    batches: list[int] = []

    def batch(ops: list[Any]) -> list[FakeWork]:
        batches.append(len(ops))
        return [FakeWork(waits) for _ in ops]

    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(dist, "P2POp", lambda op, t, peer, group, tag: (op, peer, tag))
    monkeypatch.setattr(dist, "batch_isend_irecv", batch)
    plan = plan_for(prove(synthesize("stragglar", 4)), 0, 30)
    transport = TorchTransport(plan, None, 5.0, stream_ordered=stream_ordered)
    run_rank(torch.zeros(30), plan, transport)
    assert len(batches) == len(plan.steps) and len(waits) == sum(batches)  # one group per round
    if stream_ordered:
        assert waits == [()] * len(waits)  # the current stream waits; the host issues on
    else:
        assert all(len(w) == 1 and w[0].total_seconds() == 5.0 for w in waits)  # the host waits


def streams_of_rounds(cuda: FakeCuda) -> list[str]:
    """The stream current at each round this rank's process issues from now on, in order (the
    transport's exchange wrapped: in a rank's own process)."""
    from stragglar.runtime import torch_dist

    issued: list[str] = []
    exchange = torch_dist.TorchTransport.exchange

    def logged(self: Any, step: Any, sends: Any, recvs: Any) -> None:
        issued.append(cuda.current_stream().name)
        exchange(self, step, sends, recvs)

    torch_dist.TorchTransport.exchange = logged  # type: ignore[method-assign]
    return issued


def stream_rank(rank: int, n: int, proof: Proof, late: float) -> dict[str, Any]:
    cuda = FakeCuda()
    order = FakeStreamOrder(torch.device("cpu", 0), cuda=cuda)
    issued = streams_of_rounds(cuda)
    reduce = Reducer((dedicated_group(None, 20.0), dedicated_group(None, 20.0)), n, 20.0)
    worker = BucketWorker("fake-cuda")
    if rank == n - 1:
        time.sleep(late)  # this rank's gradients come late
    buffers = [torch.from_numpy(payload(rank, count, n, "float64")).double() for count in (7, 40, 3)]
    futures, done_at_submit, completed_on = [], [], []
    for bucket, buffer in enumerate(buffers):
        future = order.future()
        future.add_done_callback(lambda _: completed_on.append(cuda.current_stream().name))
        job = Job(buffer, bucket, proof, None, 0, order, order.ready(), future)
        worker.submit(future, *reduce.stages(job))
        done_at_submit.append(future.done())
        futures.append(future)
    for future, buffer in zip(futures, buffers, strict=True):
        future.wait()
        assert np.allclose(buffer.numpy() * n, expected(buffer.numel(), n, "float64"))
    worker.close()
    split = rounds_without(proof)
    in_turn = [  # each bucket's rounds, first stage then second, bucket after bucket
        "side 1" if step.round < split else "side 2"
        for buffer in buffers
        for step in plan_for(proof, rank, buffer.numel()).steps
    ]
    return {
        "log": cuda.log,
        "issued": issued,
        "in_turn": in_turn,
        "done": done_at_submit,
        "completed_on": completed_on,
    }


def test_bucket_rounds_run_on_the_side_streams_and_complete_the_future_there() -> None:
    proof = prove(synthesize("stragglar", 3))
    results = launch(stream_rank, 3, (proof, 0.3), timeout=30)
    for rank, r in enumerate(results):
        # each Future completed with the second stage's stream current
        assert r["completed_on"] == ["side 2"] * 3, r
        # every round issued on a side stream (the late rank has none in the first stage), by one
        # thread in the same order on every rank, as NCCL asks of two communicators
        assert set(r["issued"]) == ({"side 2"} if rank == 2 else {"side 1", "side 2"}), r
        assert r["issued"] == r["in_turn"], r
        log = r["log"]
        for before, after in (("compute", "side 1"), ("side 1", "side 2")):
            readies = [e.removesuffix(f" recorded on {before}") for e in log if e.endswith(f" on {before}")]
            assert len(readies) == 3, log  # one per bucket, on the stream that produced its data
            for event in readies:  # and the next stage's stream waits for it before its rounds
                assert log.index(f"{after} waits for {event}") > log.index(f"{event} recorded on {before}")
        if rank != 2:
            assert r["done"] == [False] * 3  # the peer was late: nothing was done at submission


def in_call_rank(rank: int, n: int, proof: Proof) -> dict[str, Any]:
    """A stream-ordered bucket reduced on the caller's thread, as FSDP's hook and
    ``asynchronous=False`` run it (no worker: the reducer called directly)."""
    cuda = FakeCuda()
    order = FakeStreamOrder(torch.device("cpu", 0), cuda=cuda)
    issued = streams_of_rounds(cuda)
    group = dedicated_group(None, 20.0)
    reduce = Reducer((group, group), n, 20.0)
    buffer = torch.from_numpy(payload(rank, 40, n, "float64")).double()
    future = order.future()
    completed_on: list[str] = []
    future.add_done_callback(lambda _: completed_on.append(cuda.current_stream().name))
    reduce(Job(buffer, 0, proof, None, 0, order, order.ready(), future, on_caller=True))
    assert future.done()  # completed in the call
    assert np.allclose(buffer.numpy() * n, expected(40, n, "float64"))
    return {"log": cuda.log, "issued": issued, "completed_on": completed_on}


def test_a_bucket_reduced_in_the_call_runs_on_the_side_streams_and_keeps_its_buffer() -> None:
    """FSDP's hook reduces each shard in its call, and FSDP frees the shard at each step: the
    stages run on the side streams, each after the event before it, the buffer is kept from the
    allocator on both, and the Future completes on the second before the call returns."""
    proof = prove(synthesize("stragglar", 3))
    for rank, r in enumerate(launch(in_call_rank, 3, (proof,), timeout=30)):
        log = r["log"]
        assert r["completed_on"] == ["side 2"], r
        assert set(r["issued"]) == ({"side 2"} if rank == 2 else {"side 1", "side 2"}), r
        (ready_1,) = (e.removesuffix(" recorded on compute") for e in log if e.endswith(" on compute"))
        (ready_2,) = (e.removesuffix(" recorded on side 1") for e in log if e.endswith(" on side 1"))
        assert log.index("side 1 waits for " + ready_1) < log.index("bucket of 40 kept for side 1")
        assert log.index(ready_2 + " recorded on side 1") < log.index("side 2 waits for " + ready_2)
        assert log.index("side 2 waits for " + ready_2) < log.index("bucket of 40 kept for side 2")


@pytest.mark.parametrize(
    ("stream_ordered", "on_caller", "graphs", "passed"),
    [
        (True, False, True, None),  # a worker thread's stream-ordered rounds: from graphs
        (True, False, False, False),  # ... unless the state turns graphs off
        (True, True, True, False),  # on the hook's caller: never captured (it would stall it)
        (False, False, True, None),  # on the host: not stream-ordered, graphs do not apply
    ],
)
def test_the_rounds_replay_from_graphs_on_the_worker_threads_only(
    monkeypatch: pytest.MonkeyPatch, stream_ordered: bool, on_caller: bool, graphs: bool, passed: bool | None
) -> None:
    import torch.distributed as dist

    from stragglar.ddp import worker

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(dist, "get_backend", lambda group: "nccl")
    monkeypatch.setattr(worker, "allreduce", lambda data, proof, **options: calls.append(options))
    order = FakeStreamOrder(torch.device("cpu", 0), cuda=FakeCuda()) if stream_ordered else HostOrder()
    reduce = Reducer(("early", "late"), 3, 20.0, graphs=graphs)
    proof = prove(synthesize("stragglar", 3))
    job = Job(torch.zeros(6), 0, proof, None, 0, order, None, order.future(), on_caller=on_caller)
    reduce._rounds(job, 1, (1, None))
    (options,) = calls
    assert options["graphs"] is passed and options["stream_ordered"] is stream_ordered
    assert options["group"] == "late" and options["rounds"] == (1, None)


@pytest.mark.parametrize("engine", ["rounds", "device"])
def test_a_late_rank_arrives_at_each_bucket_the_delay_after_it_was_handed_over(
    monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """Buckets are reduced one after the other: a whole delay in each call made bucket k late by
    k delays.  Each call now sleeps what is left of the delay since its bucket was handed over."""
    import time

    stand_in = DeviceStandIn(monkeypatch)
    reduce = Reducer(("early", "late"), 3, 20.0, 100.0, engine=engine)
    proof = prove(synthesize("stragglar", 3))
    now = time.perf_counter()
    for handed, least, most in ((now - 40.0, 59.0, 60.0), (now - 200.0, 0.0, 0.0), (now, 99.0, 100.0)):
        stand_in.calls.clear()
        host = HostOrder()
        job = Job(torch.arange(4.0), 0, proof, 2, 0, host, None, host.future(), handed=handed)
        reduce(job)
        delays = [call["straggler_delay"] for call in stand_in.calls]
        assert delays and all(least <= delay <= most for delay in delays), (handed - now, delays)
    reduce = Reducer(("early", "late"), 3, 20.0, engine=engine)  # none asked: none slept
    stand_in.calls.clear()
    host = HostOrder()
    reduce(Job(torch.arange(4.0), 0, proof, 2, 0, host, None, host.future(), handed=now - 40.0))
    assert [call["straggler_delay"] for call in stand_in.calls] == [0.0] * len(stand_in.calls)


def test_event_timings_leave_out_the_queue() -> None:
    cuda = FakeCuda()
    order = StreamOrder(torch.device("cpu", 0), cuda=cuda)
    first = order.clock()  # issued at t = 0
    second = order.clock(after=first)  # issued at t = 0 too, queued behind it
    cuda.now = 0.050
    first.stop()
    cuda.now = 0.070
    second.stop()
    unknown = order.clock()  # never stopped: not known yet, left out
    assert first.seconds() == pytest.approx(0.050)
    assert second.seconds() == pytest.approx(0.020)
    assert unknown.seconds() is None


def test_a_watch_counts_from_the_end_of_the_operation_before_it() -> None:
    first = HostWatch()
    second = HostWatch(after=first)  # queued behind the first
    time.sleep(0.05)
    first.stop()
    time.sleep(0.02)
    second.stop()
    took = second.seconds()
    assert took is not None and 0.015 < took < 0.045, took


def test_the_worker_runs_each_stage_in_order_and_fails_every_later_task_at_once() -> None:
    import torch

    worker = BucketWorker("test-worker")
    ran: list[tuple[int, int]] = []
    futures = [torch.futures.Future[Any]() for _ in range(4)]
    second_may_start = threading.Event()

    def first(i: int, handed: Any) -> int:
        assert handed is None
        ran.append((0, i))
        return 10 * i  # handed to the second stage

    def second(i: int, handed: int) -> None:
        second_may_start.wait(5)
        if i == 1:
            raise RuntimeError("round 3 lost the connection")
        ran.append((1, i))
        futures[i].set_result(handed)

    for i, future in enumerate(futures):
        worker.submit(future, functools.partial(first, i), functools.partial(second, i))
    deadline = time.monotonic() + 5
    while len(ran) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == [(0, 0), (0, 1), (0, 2), (0, 3)]  # every first stage ran while the second waited
    second_may_start.set()
    assert futures[0].wait() == 0
    for future in futures[1:]:
        with pytest.raises(RuntimeError, match="round 3 lost the connection"):
            future.wait()
    assert ran[4:] == [(1, 0)] and isinstance(worker.error, RuntimeError)
    with pytest.raises(ValueError, match="runs 2 stages per task, got 1"):
        worker.submit(futures[0], functools.partial(first, 0))
    worker.close()
    for thread in worker.threads:
        thread.join(5)
        assert not thread.is_alive()


def test_close_waits_for_the_threads_to_finish_what_they_were_given() -> None:
    """A thread still inside a stage (a Future's set_result) when the interpreter shut down was
    stopped inside torch's C++, and the rank aborted at exit; close() runs at exit and waits."""
    import torch

    worker = BucketWorker("test-close")
    finished = threading.Event()

    def slow(handed: Any) -> None:
        time.sleep(0.3)
        finished.set()

    worker.submit(torch.futures.Future[Any](), lambda _: None, slow)
    worker.close()
    assert finished.is_set() and not any(thread.is_alive() for thread in worker.threads)


def test_close_gives_up_on_a_thread_stuck_past_its_wait() -> None:
    import torch

    worker = BucketWorker("test-stuck")
    release = threading.Event()
    worker.submit(torch.futures.Future[Any](), lambda _: release.wait(10), lambda _: None)
    start = time.monotonic()
    worker.close(wait=0.2)
    assert time.monotonic() - start < 2 and worker.threads[0].is_alive()  # bounded, as every wait
    release.set()
    for thread in worker.threads:
        thread.join(5)


class Held:
    """A stand-in registration: open until closed, holding the tensor it was given."""

    made = 0

    def __init__(self, buffer: Any) -> None:
        self.buffer, self.closed = buffer, False
        Held.made += 1
        self.number = Held.made  # as a group's registrations are numbered

    def holds(self, data: Any) -> bool:
        same = data.data_ptr() == self.buffer.data_ptr() and data.numel() == self.buffer.numel()
        return not self.closed and same

    def close(self) -> None:
        self.closed = True


class DeviceStandIn:
    """The runtime's ``allreduce`` and ``register_buffer`` as the device path calls them: each
    call noted, a call's sum that of three ranks holding the same values, a registration a
    :class:`Held` (or refused, with ``refusal``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, refusal: str | None = None) -> None:
        from stragglar.ddp import worker

        self.calls: list[dict[str, Any]] = []
        self.waits: list[tuple[int, Any]] = []  # (the call's index, the group waited on)
        self.registered: list[tuple[Any, Held]] = []
        self.refusal = refusal
        monkeypatch.setattr(worker, "allreduce", self.allreduce)
        monkeypatch.setattr(worker, "register_buffer", self.register_buffer)
        monkeypatch.setattr("torch.distributed.get_rank", lambda *_: 0)

    def allreduce(self, data: Any, proof: Proof, **kwargs: Any) -> StandInWork | None:
        self.calls.append(kwargs)
        data.mul_(3)
        return StandInWork(self.waits, len(self.calls) - 1) if kwargs.get("async_op") else None

    def register_buffer(self, data: Any, group: Any, *, timeout: float) -> Held:
        from stragglar.errors import InputError

        if self.refusal is not None:
            raise InputError(self.refusal)
        held = Held(data)
        self.registered.append((group, held))
        return held


class StandInWork:
    """What an ``async_op`` call returns: its wait noted."""

    def __init__(self, waits: list[tuple[int, Any]], call: int) -> None:
        self.waits, self.call = waits, call

    def wait(self, group: Any = None) -> None:
        self.waits.append((self.call, group))


def device_job(proof: Proof, buffer: Any, kept: bool, bucket: int = 0) -> Job:
    host = HostOrder()
    return Job(buffer, bucket, proof, 2, 0, host, None, host.future(), None, kept)


def test_the_device_engine_reduces_a_bucket_in_one_call_on_the_first_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stand_in = DeviceStandIn(monkeypatch)
    recorded: list[tuple[Any, ...]] = []
    reducer = Reducer(("early", "late"), 3, 20.0, 0.01, lambda *a: recorded.append(a[:3]), engine="device")
    job = device_job(prove(synthesize("stragglar", 3)), torch.arange(4.0), kept=False)
    first, second = reducer.stages(job)
    second(first(None))  # staged: the whole call on the first thread, nothing for the second
    assert job.future.value().tolist() == [0.0, 1.0, 2.0, 3.0]  # three ranks' sum, averaged
    assert 0 <= stand_in.calls[0].pop("straggler_delay") <= 0.01  # what is left since handed over
    assert stand_in.calls == [
        {
            "group": "early",
            "timeout": 20.0,
            "tag": 0,
            "late_rank": 2,
            "lockstep": True,
            "engine": "device",
        }
    ]
    assert stand_in.waits == [] and reducer.in_flight.count == 0
    assert stand_in.registered == [] and reducer.registrations == {}  # not kept: staged
    assert recorded == [("stragglar", 16, 0)]


def test_a_kept_bucket_is_registered_once_and_let_go_when_it_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in = DeviceStandIn(monkeypatch)
    reducer = Reducer(("early", "late"), 3, 20.0, engine="device")
    proof = prove(synthesize("stragglar", 3))
    bucket, other, moved = torch.arange(4.0), torch.arange(6.0), torch.arange(4.0)
    for buffer, number in ((bucket, 0), (bucket, 0), (other, 1), (bucket, 0)):
        reducer(device_job(proof, buffer, kept=True, bucket=number))
    assert [(group, held.buffer) for group, held in stand_in.registered] == [
        ("early", bucket),
        ("early", other),
    ]
    held = reducer.registrations[0]
    assert isinstance(held, Held) and held.holds(bucket)
    reducer(device_job(proof, moved, kept=True))  # bucket 0's tensor is another now
    assert held.closed and reducer.registrations[0] is None
    reducer(device_job(proof, moved, kept=True))
    assert len(stand_in.registered) == 2 and reducer.registrations[0] is None  # staged from now on
    assert len(stand_in.calls) == 6
    reducer.close()
    assert stand_in.registered[1][1].closed and reducer.registrations == {}


def test_a_bucket_that_cannot_be_registered_runs_staged_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    refusal = "cannot register the buffers: rank 1 could not (the error there says why)"
    stand_in = DeviceStandIn(monkeypatch, refusal)
    reducer = Reducer(("early", "late"), 3, 20.0, engine="device")
    proof = prove(synthesize("stragglar", 3))
    bucket = torch.arange(4.0)
    with caplog.at_level("WARNING", logger="stragglar"):
        for _ in range(3):
            job = device_job(proof, bucket, kept=True)
            reducer(job)
            assert job.future.value() is bucket
    assert reducer.registrations == {0: None} and len(stand_in.calls) == 3
    assert [r.getMessage() for r in caplog.records] == [
        f"device engine: bucket 0 runs staged (through the inboxes): {refusal}"
    ]


def test_a_settled_bucket_is_launched_on_the_first_thread_and_waited_for_on_the_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kept bucket's first call runs whole on the first thread (it registers and checks its
    setup over the first group); from its second, the first thread launches and the second waits
    (over the second group).  A call that may gather over the first group waits first until the
    second thread has waited for every work before it, so that every rank issues its collectives
    on the two groups in one order."""
    stand_in = DeviceStandIn(monkeypatch)
    reducer = Reducer(("early", "late"), 3, 20.0, engine="device")
    proof = prove(synthesize("stragglar", 3))
    bucket = torch.arange(4.0)

    def stages(buffer: Any, kept: bool, number: int = 0) -> tuple[Job, Any, Any]:
        job = device_job(proof, buffer, kept, number)
        return (job, *reducer.stages(job))

    job, first, second = stages(bucket, kept=True)
    handed = first(None)
    assert handed is None and job.future.done()  # the first call: registered, whole
    assert [c.get("async_op", False) for c in stand_in.calls] == [False] and len(stand_in.registered) == 1
    job, first, second = stages(bucket, kept=True)
    handed = first(None)
    assert handed is not None and not job.future.done() and reducer.in_flight.count == 1
    second(handed)
    assert job.future.value().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert stand_in.waits == [(1, "late")] and reducer.in_flight.count == 0
    # launched and not waited for, then a bucket never seen: its call waits for that wait
    job, first, second = stages(bucket, kept=True)
    handed = first(None)
    other, other_first, other_second = stages(torch.arange(6.0), kept=True, number=1)
    thread = threading.Thread(target=lambda: other_second(other_first(None)))
    thread.start()
    time.sleep(0.2)
    assert len(stand_in.calls) == 3 and thread.is_alive()  # waiting for the second thread
    second(handed)
    thread.join(5)
    assert not thread.is_alive() and other.future.done() and len(stand_in.calls) == 4
    assert [c.get("async_op", False) for c in stand_in.calls] == [False, True, True, False]
    assert stand_in.waits == [(1, "late"), (2, "late")]


def test_a_drain_that_never_ends_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    DeviceStandIn(monkeypatch)
    reducer = Reducer(("early", "late"), 3, 0.2, engine="device")
    reducer.in_flight.add()  # a work the second thread never waits for
    job = device_job(prove(synthesize("stragglar", 3)), torch.arange(4.0), kept=False)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"the device calls in flight did not end within 0\.2 s$"):
        reducer.stages(job)[0](None)
    assert time.monotonic() - start < 2


@pytest.mark.parametrize(
    ("members", "suffix"),
    [
        ([1, 3], " (ranks of the hook's group: rank 1 is global rank 3, rank 0 is global rank 1)"),
        ([0, 1], ""),  # the world's ranks, or the first of them: nothing to say
    ],
)
def test_a_group_s_failure_names_its_ranks_by_their_global_ranks_too(
    monkeypatch: pytest.MonkeyPatch, members: list[int], suffix: str
) -> None:
    """The runtime numbers a group's ranks from 0; under HSDP a user read "rank 1" where global
    rank 3 was meant.  The fields stay the group's, for the launcher's summary."""
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_process_group_ranks", lambda group: members)
    said = "allreduce failed: rank 1 lost the connection in round 1 (phase 'x') with rank 0: closed"
    with pytest.raises(RankError) as info, global_ranks(object()):
        raise RankError(said, rank=1, reason="lost the connection", round=1, phase="x", peer=0)
    assert str(info.value) == said + suffix
    assert info.value.fields() == {
        "rank": 1,
        "reason": "lost the connection",
        "round": 1,
        "phase": "x",
        "peer": 0,
        "waiting": "waiting for",
        "during": None,
    }
