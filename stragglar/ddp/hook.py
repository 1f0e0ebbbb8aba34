"""The DDP communication hook and its state.  (No ``from __future__ import annotations`` here: DDP
compares the hook's annotations with the classes.)"""

import os
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import GradBucket  # type: ignore[attr-defined, unused-ignore]

from stragglar.args import MAX_DELAY, as_flag, as_int, as_rank, as_seconds
from stragglar.ddp.agreement import disagreement, encode
from stragglar.ddp.probe import LateRankProbe
from stragglar.ddp.worker import (
    BucketWorker,
    HostOrder,
    Job,
    Order,
    Reducer,
    StreamOrder,
    Watch,
    dedicated_group,
)
from stragglar.errors import ArgumentError, InputError, described
from stragglar.formats.traces import TraceWriter
from stragglar.model import AUTO, Network
from stragglar.model.policy import (
    ALLREDUCE,
    AUTO_WINDOW,
    POLICIES,
    PROBE_LAG,
    SHARE,
    STRAGGLAR,
    AutoPolicy,
    Choice,
    Outlook,
    choose,
    chunk_count,
    persistent_late_rank,
)
from stragglar.runtime import MismatchError
from stragglar.runtime.heartbeat import heartbeat
from stragglar.runtime.torch_dist import gather_headers
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import Proof, prove

__all__ = ["POLICIES", "StragglarState", "stragglar_hook"]

HOST = HostOrder()


@dataclass
class _Comm:
    """What a state reduces its buckets with, made on its first bucket."""

    reduce: Reducer
    worker: BucketWorker | None  # None: synchronous
    streams: dict[torch.device, StreamOrder] = field(default_factory=dict)


@dataclass
class StragglarState:
    """What the hook needs, and what it has learned.

    ``algorithm`` and ``straggler``: the schedule (synthesized and proved on first use per world
    size and straggler); ``process_group`` (None: the world); ``timeout`` in seconds for a silent
    peer.  ``policy``: "stragglar" reduces every bucket with the schedule; "auto" reduces a bucket
    with it only when the rank expected last (``straggler`` if given) is expected later than the
    critical delay for the bucket's size, and with the engine's all_reduce (on DDP's group, as
    DDP's default hook) otherwise.  The cost model is priced on ``network`` (a
    :class:`~stragglar.model.Network`) for both; None: on the engine's all_reduce timings, with
    StragglAR's own timings, once it has run, saying how much dearer its rounds are
    (:mod:`stragglar.model.policy`).  ``detect=W``: under "stragglar", find the straggler over
    windows of W steps (rank last in ``share`` of them); under "auto", the number of steps whose
    median lateness is judged (default 4).  Both need the world group.  ``asynchronous``
    (default): the hook returns at once and two worker threads (on CUDA, two side streams) run
    StragglAR's rounds, the first those the late rank takes no part in, for every bucket as soon
    as it is ready (:mod:`stragglar.ddp.worker`); False runs them in the hook.  ``graphs`` (on
    CUDA buffers over NCCL): each bucket stage's rounds replay from a CUDA graph after their first
    step (:func:`~stragglar.runtime.allreduce`); False launches them eagerly every step.  Such a
    graph holds its NCCL group, which NCCL will then not destroy: call
    :func:`~stragglar.runtime.release_graphs` on every rank before ``destroy_process_group()``.
    ``chunks``: StragglAR's chunk count, C >= N-1 (None: the paper's N-1), or "auto": per bucket,
    the count the cost model prices fastest for its size (:func:`~stragglar.model.policy.chunk_count`),
    on the policy's networks under "auto" (with the expected lateness), on ``network`` under
    "stragglar" (with ``straggler_delay``), which then must be given.
    ``straggler_delay`` makes the straggler late on purpose inside each reduction, for experiments
    with the "stragglar" policy (with an algorithm that has no straggler, such as Ring,
    ``straggler`` is only the rank that is made late).

    Recorded: ``switches`` lists each change of straggler under ``detect`` as (step, rank);
    ``decisions`` lists (step, algorithm, straggler, chunks) for the first bucket and each bucket
    whose choice differs from the one before (algorithm "stragglar" or "allreduce", straggler and
    chunks None with the latter; chunks None also for the paper's N-1).  Steps count from 1.
    ``outlook``: under "auto", the figures this step's choices were made from
    (:class:`~stragglar.model.policy.Outlook`: the rank expected last, its expected lateness, the
    fitted networks), None until a window of steps has been seen.
    ``record=PATH`` (given on every rank, with any policy; needs the world group): rank 0 appends
    each step's arrival figures from the probe to the file PATH, the trace ``stragglar whatif``
    replays (:class:`~stragglar.formats.traces.TraceWriter`: JSON Lines of step, rank and time, the
    time minus how long the rank waited for the last one; the figures of step s are written at
    step s + 2, when the probe has them).  Every rank runs the probe, so every rank must give it.

    Arguments are checked here, in these terms: ``straggler=1.5`` or ``True`` is an
    :class:`~stragglar.runtime.ArgumentError` (a TypeError), a NumPy integer is a fine rank;
    ``timeout`` is at most a day and ``straggler_delay`` at most an hour (:mod:`stragglar.args`)."""

    algorithm: str = "stragglar"
    straggler: int | None = None
    process_group: Any = None
    timeout: float = 300.0
    straggler_delay: float = 0.0
    detect: int = 0
    share: float = SHARE
    policy: str = "stragglar"
    network: Network | None = None
    chunks: int | str | None = None
    asynchronous: bool = True
    graphs: bool = True
    record: str | os.PathLike[str] | None = None
    proofs: dict[tuple[int, int | None, int | None], Proof] = field(default_factory=dict)
    switches: list[tuple[int, int]] = field(default_factory=list)
    decisions: list[tuple[int, str, int | None, int | None]] = field(default_factory=list)
    steps: int = 0
    probe: LateRankProbe | None = field(default=None, repr=False)
    outlook: Outlook | None = field(default=None, init=False, repr=False)
    _last: Choice | None = field(default=None, init=False, repr=False)
    _comm: _Comm | None = field(default=None, init=False, repr=False)
    _engine_watch: Watch | None = field(default=None, init=False, repr=False)
    _auto: AutoPolicy = field(init=False, repr=False)
    _trace: TraceWriter | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.algorithm, str) or self.algorithm not in ALGORITHMS:
            raise InputError(
                f"StragglarState.algorithm must be one of {', '.join(ALGORITHMS)}, "
                f"got {described(self.algorithm)}"
            )
        if not isinstance(self.policy, str) or self.policy not in POLICIES:
            raise InputError(
                f"StragglarState.policy must be one of {', '.join(POLICIES)}, got {described(self.policy)}"
            )
        if self.straggler is not None:
            self.straggler = as_int(self.straggler, "StragglarState.straggler", minimum=0)
        self.timeout = as_seconds(self.timeout, "StragglarState.timeout", positive=True)
        self.straggler_delay = as_seconds(
            self.straggler_delay, "StragglarState.straggler_delay", maximum=MAX_DELAY
        )
        self.detect = as_int(self.detect, "StragglarState.detect", minimum=0)
        if isinstance(self.share, bool) or not isinstance(self.share, (int, float)):
            raise ArgumentError(f"StragglarState.share must be a number, got {described(self.share)}")
        if not 0 < self.share <= 1:
            raise InputError(f"StragglarState.share must be in (0, 1], got {described(self.share)}")
        if self.network is not None and not isinstance(self.network, Network):
            raise ArgumentError(
                f"StragglarState.network must be a stragglar.model.Network, got {described(self.network)}"
            )
        as_flag(self.asynchronous, "StragglarState.asynchronous")
        if self.process_group is not None and not isinstance(self.process_group, dist.ProcessGroup):
            raise ArgumentError(
                "StragglarState.process_group must be a torch process group or None (the world), "
                f"got {described(self.process_group)} ({type(self.process_group).__name__})"
            )
        as_flag(self.graphs, "StragglarState.graphs")
        if self.record is not None and (
            not isinstance(self.record, (str, os.PathLike)) or not os.fspath(self.record)
        ):
            raise ArgumentError(
                f"StragglarState.record must name a file (a str or path), got {described(self.record)}"
            )
        self._check_chunks()
        self._auto = AutoPolicy(self.algorithm, self.network)
        if self.policy == "auto" and self.straggler_delay:
            raise InputError(
                "StragglarState.straggler_delay is for experiments with policy='stragglar': the auto "
                "policy judges how late ranks really arrive, and a delay inside the reduction is not seen"
            )

    def _check_chunks(self) -> None:
        if self.chunks is None:
            return
        if self.algorithm != STRAGGLAR:
            raise InputError(f"StragglarState.chunks shapes StragglAR, not {self.algorithm}")
        if self.chunks != AUTO:
            if isinstance(self.chunks, str):
                raise InputError(
                    f"StragglarState.chunks must be a chunk count or 'auto', got {described(self.chunks)}"
                )
            self.chunks = as_int(self.chunks, "StragglarState.chunks", minimum=1)
        elif self.policy != "auto" and self.network is None:
            raise InputError(
                "StragglarState.chunks='auto' prices chunk counts on a network: give network= "
                "(a stragglar.model.Network) or use policy='auto', which fits one"
            )

    def late_rank(self, world_size: int) -> int | None:
        """The straggler, checked against ``world_size`` (None: the schedule's default)."""
        if self.straggler is None:
            return None
        return as_rank(self.straggler, "StragglarState.straggler", world_size)

    def proof(self, world_size: int, late_rank: int | None = None, chunks: int | None = None) -> Proof:
        """The proved schedule for ``world_size`` ranks, straggler ``late_rank`` (None: the state's
        straggler, checked against ``world_size``; None there too: the schedule's own) and
        ``chunks`` chunks (None: the algorithm's own)."""
        if late_rank is None:
            late_rank = self.late_rank(world_size)
        key = (world_size, late_rank, chunks)
        if key not in self.proofs:
            schedule = synthesize(self.algorithm, world_size, chunks=chunks)
            if late_rank is not None and schedule.straggler is not None and late_rank != schedule.straggler:
                schedule = synthesize(self.algorithm, world_size, late_rank, chunks=chunks)
            self.proofs[key] = prove(schedule)
        return self.proofs[key]

    def agree(self, world_size: int, device: torch.device) -> None:
        """Raise the same :class:`~stragglar.runtime.MismatchError` on every rank unless every rank's
        hook runs with these settings (:mod:`stragglar.ddp.agreement`); once, at the first step,
        before any group of the hook's own exists."""
        settings = {
            "policy": self.policy,
            "algorithm": self.algorithm,
            "asynchronous": self.asynchronous,
            "detect": self.detect,
            "share": self.share,
            "chunks": self.chunks,
            "network": self.network,
            "straggler": self.straggler,
            "record": self.record is not None,
        }
        rank = dist.get_rank(self.process_group)
        rows = gather_headers(encode(settings), self.process_group, device, rank, self.timeout)
        reason = disagreement(rows)
        if reason is not None:
            raise MismatchError(reason)

    def new_step(self, world_size: int) -> None:
        """Count the step, read the probe, and update the straggler (``detect``) or the outlook (auto).

        In a rank started by :func:`stragglar.measure.launch.launch` each step is also a
        heartbeat, so a long training run is not taken for a silent one."""
        self.steps += 1
        heartbeat()
        auto = self.policy == "auto"
        if (self.detect <= 0 and not auto and self.record is None) or world_size < 2:
            return
        if self.process_group is not None:
            raise InputError(
                "straggler detection, policy='auto' and record= need the default (world) process group"
            )
        if self.probe is None:
            window = self.detect or AUTO_WINDOW
            self.probe = LateRankProbe(world_size, window, self.timeout)
        arrived = self.probe.step()
        if arrived and self.record is not None and dist.get_rank() == 0:
            self._write_trace()
        if auto:
            if arrived:
                window = self.probe.late.maxlen or AUTO_WINDOW
                fixed = self.late_rank(world_size)
                self.outlook = self._auto.judge(
                    world_size, self.probe.late, window, fixed, self.probe.samples
                )
            return
        if self.detect <= 0:
            return
        late_rank = persistent_late_rank(self.probe.history, self.detect, self.share)
        if late_rank is not None and late_rank != self._expected_late_rank(world_size):
            self.straggler = late_rank
            self.switches.append((self.steps, late_rank))
            self.probe.late.clear()  # a new full window before the next change

    def _write_trace(self) -> None:
        """Append the step's arrivals, as the probe measured them, to the trace (rank 0 only)."""
        assert self.probe is not None and self.record is not None
        if self._trace is None:
            self._trace = TraceWriter(self.record)
            weakref.finalize(self, self._trace.close)
        self._trace.append(self.steps - PROBE_LAG, [-wait for wait in self.probe.waits])

    def _expected_late_rank(self, world_size: int) -> int:
        """The rank the reductions now take for the late one: the straggler, else the schedule's
        late rank (:attr:`~stragglar.schedule.Schedule.late_rank`)."""
        return self.straggler if self.straggler is not None else self.proof(world_size).schedule.late_rank

    def choose(self, world_size: int, size_bytes: int) -> Choice:
        """How to reduce a bucket of ``size_bytes`` at this step (recorded in ``decisions``)."""
        if self.policy == "auto":
            choice = choose(self.algorithm, world_size, size_bytes, self.outlook, self.chunks)
        else:
            late_rank = self.late_rank(world_size)
            chunks = chunk_count(world_size, size_bytes, self.straggler_delay, self.network, self.chunks)
            straggler = late_rank if late_rank is not None else self.proof(world_size).schedule.straggler
            choice = Choice(STRAGGLAR, straggler, chunks)
        if choice != self._last:
            self._last = choice
            self.decisions.append((self.steps, choice.algorithm, choice.straggler, choice.chunks))
        return choice

    def reduce(
        self, buffer: torch.Tensor, bucket: int, world_size: int
    ) -> torch.futures.Future[torch.Tensor]:
        """Average ``buffer`` (bucket number ``bucket``) over the ranks: a Future of the result."""
        comm = self._comm or self._connect(world_size)
        order: Order = HOST
        if buffer.is_cuda:
            order = comm.streams.get(buffer.device) or comm.streams.setdefault(
                buffer.device, StreamOrder(buffer.device)
            )
        choice = self.choose(world_size, buffer.numel() * buffer.element_size())
        if choice.algorithm != STRAGGLAR:
            return self._engine(buffer, world_size, order)
        proof = self.proof(world_size, choice.straggler, choice.chunks)
        chunks = choice.chunks or 0
        if comm.worker is None:
            job = Job(buffer, bucket, proof, choice.straggler, chunks, HOST, None, HOST.future())
            comm.reduce(job)  # on the caller's thread, its errors raised in the hook
            return job.future
        job = Job(buffer, bucket, proof, choice.straggler, chunks, order, order.ready(), order.future())
        comm.worker.submit(job.future, *comm.reduce.stages(job))
        # DDP reads a failed Future's value as its result ("Unable to cast ... to Tensor"); an error
        # raised in a callback reaches it as an error, with the message intact
        return job.future.then(_value)

    def _engine(
        self, buffer: torch.Tensor, world_size: int, order: Order
    ) -> torch.futures.Future[torch.Tensor]:
        """The engine's own all_reduce on DDP's group, as DDP's default hook runs it, timed for the
        policy: its Future completes (through the engine's stream on CUDA) with the average."""
        watch = order.clock(self._engine_watch)
        self._engine_watch = watch
        record = self.probe.record if self.probe is not None else None
        size = buffer.numel() * buffer.element_size()

        def averaged(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            watch.stop()
            if record is not None:
                record(ALLREDUCE, size, 0, watch)
            return future.value()[0].div_(world_size)

        work = dist.all_reduce(buffer, group=self.process_group, async_op=True)
        engine: torch.futures.Future[list[torch.Tensor]] = work.get_future()
        return engine.then(averaged)

    def _connect(self, world_size: int) -> _Comm:
        group = dedicated_group(self.process_group, self.timeout)
        early = dedicated_group(self.process_group, self.timeout) if self.asynchronous else group
        groups = (early, group)
        record = self.probe.record if self.probe is not None and self.policy == "auto" else None
        reduce = Reducer(groups, world_size, self.timeout, self.straggler_delay, record, self.graphs)
        worker = None
        if self.asynchronous:
            worker = BucketWorker(f"stragglar-ddp-{dist.get_rank()}")
            weakref.finalize(self, worker.close)  # the thread ends with the state
        self._comm = _Comm(reduce, worker)
        return self._comm


def _value(future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
    return future.value()


def stragglar_hook(state: StragglarState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket``'s gradients over the ranks as ``state`` says; returns at once when
    ``state.asynchronous``, with a Future that completes when the bucket is averaged."""
    buffer = bucket.buffer()
    world = dist.get_world_size(state.process_group)
    if bucket.index() == 0:
        if state.steps == 0 and world > 1:
            state.agree(world, buffer.device)
        state.new_step(world)
    if world > 1:
        return state.reduce(buffer, bucket.index(), world)
    state.late_rank(world)  # a straggler that is no rank of this group is still an error
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)  # one rank: its gradients are the average already
    return future
