"""The DDP communication hook and its state.  (No ``from __future__ import annotations`` here: DDP
compares the hook's annotations with the classes.)"""

import os
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import GradBucket  # type: ignore[attr-defined, unused-ignore]

from stragglar.args import as_rank
from stragglar.ddp import engine_allreduce
from stragglar.ddp.agreement import agree, agree_on_bucket, settings_of
from stragglar.ddp.judgment import is_world, judge
from stragglar.ddp.options import check_bucket, check_fresh_trace, check_learned, check_options
from stragglar.ddp.orders import HostOrder, Order, StreamOrder
from stragglar.ddp.probe import LateRankProbe, end_calls, let_go
from stragglar.ddp.state_parts import Connection, Decision, Learned, ProofKey, Resources
from stragglar.ddp.worker import CLOSE_WAIT, BucketWorker, Job, Reducer, dedicated_group
from stragglar.errors import ArgumentError, InputError
from stragglar.model import Network
from stragglar.model.detect import WINDOW, RankLateness, Rule, recent_lateness
from stragglar.model.policy import (
    POLICIES,
    STRAGGLAR,
    AutoPolicy,
    Choice,
    Outlook,
    choose,
    chunk_count,
)
from stragglar.runtime import heartbeat, release_graphs
from stragglar.runtime.roll_call import RollCall
from stragglar.runtime.teardown import before_destroy
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove

__all__ = ["POLICIES", "StragglarState", "stragglar_hook"]

HOST = HostOrder()


@dataclass(init=False)
class StragglarState:
    """The hook's options, what it learns and what it holds.

    Options (the constructor's keywords, checked there; attributes of the same name), by role:

    The schedule
        ``algorithm``: "stragglar" (default), "ring", "rhd" or "direct"; proved on first use.
        ``straggler``: the late rank (None: the schedule's own); ``detect`` moves it.
        ``chunks``: StragglAR's chunk count, C >= N-1 (None: the paper's N-1), or "auto".
    When StragglAR runs
        ``policy``: "stragglar" for every bucket, or "auto" for a bucket only where it pays.
        ``network``: the :class:`~stragglar.model.Network` the model prices on (None: fitted).
        ``detect``: W steps, the recent window the figures are taken over (default 24 under
        "auto"); under "stragglar", any W > 0 also moves the straggler to the rank the rule names.
        ``rule``: the persistent-straggler test's :class:`~stragglar.model.detect.Rule`
        (the most probability that a false alarm begins at a step, the share it is tuned to,
        the margin in seconds).
        ``straggler_delay``: seconds the straggler is made late on purpose, for experiments: it
        arrives at each bucket that long after the bucket was handed to the hook.
    How it runs
        ``process_group``: DDP's group (None: the world); the replicas' under FSDP.  It must be
        the group given to DDP: a hook is not told DDP's group, so a state on a smaller one sums
        over its ranks alone, with no error (as torch's own hooks' states do).
        ``timeout``: seconds before a silent peer fails the step (default 300), in StragglAR's
        rounds and in the engine's all_reduce on the host alike (on CUDA over NCCL, where no
        round is waited for on the host, NCCL's watchdog ends them: StragglAR's at this timeout,
        the hook's groups being made with it, the engine's at the process group's).
        ``asynchronous``: return at once, worker threads running the rounds (default True).
        ``graphs``: on CUDA over NCCL, the worker threads replay the rounds from CUDA graphs
        (default True; False is refused where no round would replay from a graph).
        ``engine``: "rounds" (default) drives StragglAR's rounds from the host; "device" runs a
        bucket's whole AllReduce as one kernel launch on each rank (CUDA buckets, with CuPy).
    What it records
        ``record``: a file to which rank 0 appends each step's arrivals (default None).
        ``metrics``: a file rank 0 replaces each step with its figures for Prometheus (default None).

    In full: ``policy="auto"`` reduces a bucket with the schedule only when there is a rank to bet
    on (``straggler`` if given, else the rank the rule names persistently late:
    :mod:`stragglar.model.detect`) and the saving it is expected to bring, weighed by how often
    that rank was last of late, beats a Ring by the margin (:func:`~stragglar.model.policy.choose`);
    with the engine's all_reduce (on DDP's group, as DDP's default hook) otherwise.  The model is
    priced on ``network`` under both policies; None: on the engine's all_reduce timings, with
    StragglAR's own timings, once it has run, saying how much dearer its rounds are
    (:mod:`stragglar.model.policy`).  ``chunks="auto"`` is, per bucket, the count the model prices
    fastest for its size (:func:`~stragglar.model.policy.chunk_count`), on the policy's networks
    under "auto" (summed over the straggler's lateness at its recent steps), on ``network`` under
    "stragglar" (with ``straggler_delay``), which then must be given.  With DDP, ``detect``,
    ``record`` and "auto" need the world group; under FSDP (:func:`stragglar.fsdp.use_stragglar`)
    they probe the replicate group.  With an algorithm that has no straggler, such as Ring,
    ``straggler`` is only the rank made late.  ``asynchronous``: two worker threads (on CUDA,
    two side streams) run StragglAR's rounds, the first those the late rank takes no part in, for
    every bucket as soon as it is ready (:mod:`stragglar.ddp.worker`); False runs them in the
    hook, as FSDP's hook always does (on CUDA, queued there on the same side streams, one bucket
    after another: over NCCL the host waits for no round).  ``graphs``: on the worker threads,
    each bucket stage's rounds replay from a CUDA graph after their first step
    (:func:`~stragglar.runtime.allreduce`); such a graph holds its NCCL group, which NCCL will then
    not destroy: :meth:`close` releases them, by itself before ``destroy_process_group()``.
    ``engine="device"`` (:mod:`stragglar.runtime.device`): the punctual ranks' kernels run the
    hidden phase while the late rank's is not launched yet; DDP's buckets, the same tensors from
    the second step on, are registered then (:func:`~stragglar.runtime.register_buffer`), so their
    chunks move straight between the ranks' buckets; FSDP's shards, new at each step, and a bucket
    that cannot be registered run staged, through the receivers' inboxes.  With ``asynchronous``,
    the first worker thread launches a bucket's kernel and the second waits for it, so every
    bucket's hidden phase starts as soon as its gradients are ready (:mod:`stragglar.ddp.worker`).
    ``record=PATH`` is given on every rank, with any policy (every rank runs the probe): the trace
    ``stragglar whatif`` replays
    (:class:`~stragglar.formats.traces.TraceWriter`: JSON Lines of step, rank and time, the time
    minus how long the rank waited for the last one; the figures of step s are written at step
    s + 2, when the probe has them).

    *What it measures*, wherever the probe runs: :meth:`late_ranks` and :attr:`persistent_straggler`;
    rank 0 logs each change of persistent straggler and writes ``metrics`` (:mod:`stragglar.ddp.metrics`).

    What it learns (:class:`~stragglar.ddp.state_parts.Learned`, in :attr:`learned`) reads as
    :attr:`steps`, :attr:`switches`, :attr:`decisions` and :attr:`outlook`; what it holds
    (:class:`~stragglar.ddp.state_parts.Resources`, in :attr:`resources`) as :attr:`proofs` and
    :attr:`probe`.  The constructor also takes ``proofs``, ``switches``, ``decisions``, ``steps``
    and ``probe`` to start from.

    Arguments are checked in these terms: ``straggler=1.5`` or ``True`` is an
    :class:`~stragglar.runtime.ArgumentError` (a TypeError), a NumPy integer is a fine rank;
    ``timeout`` is at most a day and ``straggler_delay`` at most an hour (:mod:`stragglar.args`)."""

    algorithm: str
    straggler: int | None
    process_group: Any
    timeout: float
    straggler_delay: float
    detect: int
    rule: Rule
    policy: str
    network: Network | None
    chunks: int | str | None
    asynchronous: bool
    graphs: bool
    engine: str
    record: str | os.PathLike[str] | None
    metrics: str | os.PathLike[str] | None
    learned: Learned
    resources: Resources = field(repr=False)

    def __init__(
        self,
        algorithm: str = "stragglar",
        straggler: int | None = None,
        process_group: Any = None,
        timeout: float = 300.0,
        straggler_delay: float = 0.0,
        detect: int = 0,
        rule: Rule = Rule(),  # noqa: B008 (frozen: one default shared is fine)
        policy: str = "stragglar",
        network: Network | None = None,
        chunks: int | str | None = None,
        asynchronous: bool = True,
        graphs: bool = True,
        engine: str = "rounds",
        record: str | os.PathLike[str] | None = None,
        metrics: str | os.PathLike[str] | None = None,
        proofs: dict[ProofKey, Proof] | None = None,
        switches: list[tuple[int, int]] | None = None,
        decisions: list[Decision] | None = None,
        steps: int = 0,
        probe: LateRankProbe | None = None,
    ) -> None:
        self.algorithm, self.straggler, self.process_group = algorithm, straggler, process_group
        self.timeout, self.straggler_delay = timeout, straggler_delay
        self.detect, self.rule, self.policy, self.network = detect, rule, policy, network
        self.chunks, self.asynchronous, self.graphs, self.record = chunks, asynchronous, graphs, record
        self.metrics, self.engine = metrics, engine
        check_options(self)
        steps = check_learned(proofs, switches, decisions, steps, probe)
        check_fresh_trace(self.record, steps)
        policy_memory = AutoPolicy(self.algorithm, self.network)
        switches, decisions = [] if switches is None else switches, [] if decisions is None else decisions
        self.learned = Learned(policy_memory, steps, switches, decisions)
        self.resources = Resources({} if proofs is None else proofs, probe)

    @property
    def steps(self) -> int:
        """The steps begun, counted from 1."""
        return self.learned.steps

    @property
    def switches(self) -> list[tuple[int, int]]:
        """Each change of straggler under ``detect``, as (step, rank)."""
        return self.learned.switches

    @property
    def decisions(self) -> list[Decision]:
        """(step, algorithm, straggler, chunks) for the first bucket and each bucket whose choice
        differs from the one before: algorithm "stragglar" or "allreduce", straggler and chunks
        None with the latter; chunks None also for the paper's N-1."""
        return self.learned.decisions

    @property
    def outlook(self) -> Outlook | None:
        """Under "auto", the figures this step's choices were made from
        (:class:`~stragglar.model.policy.Outlook`: the rank expected last, its expected lateness,
        the fitted networks); None until a window of steps has been seen."""
        return self.learned.outlook

    @property
    def proofs(self) -> dict[ProofKey, Proof]:
        """The proved schedules, by (world size, straggler, chunks)."""
        return self.resources.proofs

    @property
    def probe(self) -> LateRankProbe | None:
        """The probe of arrivals, made at the first step that needs it."""
        return self.resources.probe

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
        key, proofs = (world_size, late_rank, chunks), self.resources.proofs
        if key not in proofs:
            schedule = synthesize(self.algorithm, world_size, chunks=chunks)
            if late_rank is not None and schedule.straggler is not None and late_rank != schedule.straggler:
                schedule = synthesize(self.algorithm, world_size, late_rank, chunks=chunks)
            proofs[key] = prove(schedule)
        return proofs[key]

    def agree(
        self, world_size: int, device: torch.device, ranks: str = "DDP ranks", group: str = "DDP's group"
    ) -> None:
        """Raise the same :class:`~stragglar.runtime.MismatchError` on every rank unless every rank's
        hook runs with these settings (:mod:`stragglar.ddp.agreement`); once, at the first step,
        before any group of the hook's own exists.  ``ranks`` and ``group`` name them in the error."""
        agree(settings_of(self), self.process_group, device, self.timeout, ranks, group)

    @property
    def probes(self) -> bool:
        """Whether each step runs the probe of arrivals: for ``detect``, policy "auto", ``record``
        or ``metrics``."""
        return self.detect > 0 or self.policy == "auto" or self.record is not None or self.metrics is not None

    def new_step(self, world_size: int) -> None:
        """Count the step, read the probe, judge who is persistently late, and update the
        straggler (``detect``) or the outlook (auto); report a change, and the figures.

        The probe runs on the ranks of ``process_group``; the trace is written by the world's
        rank 0, where it is one of them.  In a rank started by
        :func:`stragglar.measure.launch.launch` each step is also a heartbeat, so a long training
        run is not taken for a silent one."""
        learned = self.learned
        learned.steps += 1
        self.resources.steps_run += 1
        self.resources.engine_calls.clear()  # the last step's: DDP has waited for them
        heartbeat()
        auto = self.policy == "auto"
        if not self.probes or world_size < 2:
            return
        probe = self.resources.probe
        if probe is None:
            if not self.rule.finds(world_size):
                raise InputError(
                    f"StragglarState.rule: a share of {self.rule.share:g} is no more than chance "
                    f"(1/{world_size}) among {world_size} ranks: the test could name nobody"
                )
            if auto:  # what the first bet on StragglAR would refuse, refused at the first step
                self.proof(world_size, None, self.chunks if isinstance(self.chunks, int) else None)
            window = self.detect or WINDOW
            group = self.process_group
            ranks = None if group is None else dist.get_process_group_ranks(group)
            probe = self.resources.probe = LateRankProbe(world_size, window, self.timeout, ranks)
            before_destroy(self, (probe.group,), StragglarState.close)
        if probe.step():  # new figures: judged in judgment.py
            judge(self, probe, world_size)

    @property
    def persistent_straggler(self) -> int | None:
        """The rank the rule names persistently late (:mod:`stragglar.model.detect`), from the
        figures the probe has; None: nobody, or no figures yet."""
        detection = self.learned.detection
        return None if detection is None else detection.named

    def late_ranks(self) -> tuple[RankLateness, ...]:
        """Each rank's :class:`~stragglar.model.detect.RankLateness` over the probe's recent
        window (``detect``, default 24 steps); empty before the first figures (those of step s
        arrive at step s + 2), or where the probe does not run."""
        probe, detection = self.resources.probe, self.learned.detection
        if probe is None or detection is None:
            return ()
        return recent_lateness(self.rule, detection, probe.late)

    def choose(self, world_size: int, size_bytes: int) -> Choice:
        """How to reduce a bucket of ``size_bytes`` at this step (recorded in ``decisions``)."""
        if self.policy == "auto":
            choice = choose(self.algorithm, world_size, size_bytes, self.outlook, self.chunks)
        else:
            late_rank = self.late_rank(world_size)
            chunks = chunk_count(world_size, size_bytes, self.straggler_delay, self.network, self.chunks)
            straggler = late_rank if late_rank is not None else self.proof(world_size).schedule.straggler
            choice = Choice(STRAGGLAR, straggler, chunks)
        learned = self.learned
        if choice != learned.last:
            learned.last = choice
            ran = self.algorithm if choice.algorithm == STRAGGLAR else choice.algorithm
            learned.decisions.append((learned.steps, ran, choice.straggler, choice.chunks))
        return choice

    def reduce(
        self,
        buffer: torch.Tensor,
        bucket: int,
        world_size: int,
        *,
        divisor: int | None = None,
        in_call: bool = False,
        kept: bool = False,
    ) -> torch.futures.Future[torch.Tensor]:
        """Average ``buffer`` (bucket number ``bucket``) over the ranks: a Future of the result.

        ``divisor``: what the sum is divided by (None: ``world_size``, to average; 1: the sum).
        ``in_call``: the state's reductions run in the call, never on worker threads, for a caller
        that needs the result when the call returns: the Future is then done, on CUDA as a CUDA
        Future whose reader's stream waits (on the device) for the rounds queued on the side
        streams, or for the engine's stream.  ``kept``: the caller hands the same tensor for this
        bucket at every later step, on every rank (DDP's buckets once DDP rebuilt them): the
        device engine registers it."""
        check_bucket(self, buffer, in_call)
        threads = self.asynchronous and not in_call
        comm = self.resources.connection or self._connect(world_size, threads)
        order: Order = HOST
        if buffer.is_cuda:
            order = comm.streams.get(buffer.device) or comm.streams.setdefault(
                buffer.device, StreamOrder(buffer.device)
            )
        choice = self.choose(world_size, buffer.numel() * buffer.element_size())
        if choice.algorithm != STRAGGLAR:
            divided = world_size if divisor is None else divisor
            met = (bucket, buffer.numel(), buffer.dtype)
            if met not in self.resources.engine_buckets:
                agree_on_bucket(bucket, buffer, self.process_group, self.timeout)
                self.resources.engine_buckets.add(met)
            group, seconds = self.process_group, self.timeout + self.straggler_delay
            return engine_allreduce.all_reduce(
                buffer, divided, order, comm.engine_group, in_call, group, seconds, self.resources
            )
        proof = self.proof(world_size, choice.straggler, choice.chunks)
        chunks = choice.chunks or 0
        job = Job(
            buffer,
            bucket,
            proof,
            choice.straggler,
            chunks,
            order,
            order.ready(),
            order.future(),
            divisor,
            kept,
            on_caller=comm.worker is None,
        )
        if comm.worker is None:
            # on the caller's thread, its errors raised in the hook; on CUDA the stages are queued
            # on the side streams (over NCCL no round waits on the host: a silent peer is NCCL's
            # watchdog's to end), and the caller's stream waits for the result when it reads the
            # Future
            comm.reduce(job)
            return job.future
        comm.worker.submit(job.future, *comm.reduce.stages(job))
        # DDP reads a failed Future's value as its result ("Unable to cast ... to Tensor"); an error
        # raised in a callback reaches it as an error, with the message intact
        return job.future.then(engine_allreduce.value)

    def _connect(self, world_size: int, threads: bool) -> Connection:
        group = dedicated_group(self.process_group, self.timeout)
        early = dedicated_group(self.process_group, self.timeout) if threads else group
        groups = (early, group)
        engine_group = None  # made alike on every rank: the policy and the group's backend are agreed
        if self.policy == "auto" and engine_allreduce.gloo_on_host(self.process_group):  # see Connection
            grace = engine_allreduce.ENGINE_GRACE
            engine_group = dedicated_group(self.process_group, self.timeout + grace, "gloo")
        probe = self.resources.probe
        record = probe.record if probe is not None and self.policy == "auto" else None
        reduce = Reducer(
            groups, world_size, self.timeout, self.straggler_delay, record, self.graphs, self.engine
        )
        worker = None
        if threads:
            worker = BucketWorker(f"stragglar-ddp-{dist.get_rank()}")
            weakref.finalize(self, worker.close)  # the thread ends with the state
        roll_call = RollCall.of(engine_group, "engine") if engine_group is not None else None
        connection = self.resources.connection = Connection(reduce, worker, engine_group, roll_call=roll_call)
        ended = (*groups, engine_group) if engine_group is not None else groups
        before_destroy(self, ended, StragglarState.close)
        return connection

    def close(self) -> None:
        """End what the hook holds on this rank, in order: its worker threads (after the buckets
        handed to them), the CUDA graphs of its rounds (NCCL will not destroy a group that a live
        graph holds), the device engine's registrations of its buckets, the probe's last gather
        (gloo aborts the process when a group goes with work in flight), the engine's last
        all_reduces on the host (until gloo's thread has let go of them:
        :func:`~stragglar.ddp.probe.let_go`) and the trace file.  A gather or an all_reduce that
        has not ended by then, or at once after a step failed on this rank (a peer lost: the
        others may have given theirs up, and these would wait for the group's timeout), is ended
        by severing its group (:func:`~stragglar.ddp.probe.end_calls`): left to end as the
        interpreter exits, in gloo's thread, it aborted the process.

        It runs by itself when ``torch.distributed.destroy_process_group()`` destroys the groups
        (:mod:`stragglar.runtime.teardown`), so a script that ends as PyTorch's documentation
        shows ends cleanly; call it to end them sooner.  Each wait is bounded
        (:data:`~stragglar.ddp.worker.CLOSE_WAIT`); a later step starts what it needs again."""
        resources = self.resources
        connection, resources.connection = resources.connection, None
        failed, resources.failed = resources.failed, False  # a later step starts afresh
        if connection is not None:
            if connection.worker is not None:
                connection.worker.close()
                failed = failed or connection.worker.error is not None
            for group in set(connection.reduce.groups):
                release_graphs(group)
            connection.reduce.close()
            if connection.roll_call is not None:
                connection.roll_call.close()
        if resources.probe is not None:
            failed = not resources.probe.close(CLOSE_WAIT, failed) or failed
        if connection is not None and connection.engine_group is not None:  # the host's gloo group
            end_calls(resources.engine_calls, connection.engine_group, CLOSE_WAIT, failed)  # kept
        else:  # on DDP's own group (a host group that is not gloo's): waited for, never severed
            let_go(resources.engine_calls, CLOSE_WAIT)
        trace, resources.trace = resources.trace, None
        if trace is not None:
            trace.close()


def stragglar_hook(state: StragglarState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket``'s gradients over the ranks as ``state`` says; returns at once when
    ``state.asynchronous``, with a Future that completes when the bucket is averaged."""
    if not isinstance(state, StragglarState):  # torch's own hooks take a process group there
        raise ArgumentError(
            "stragglar_hook's state must be a stragglar.ddp.StragglarState "
            f"(register_comm_hook(StragglarState(...), stragglar_hook)), got {type(state).__name__}"
        )
    if not isinstance(bucket, GradBucket):  # compiled autograd's python reducer: (grad, param)
        raise ArgumentError(
            f"stragglar_hook reduces DDP's gradient buckets, got a {type(bucket).__name__}: DDP's "
            "python reducer under compiled autograd (optimize_ddp='python_reducer') calls comm hooks "
            "per parameter; use dynamo's default DDP handling, or none"
        )
    buffer = bucket.buffer()
    world = dist.get_world_size(state.process_group)
    if bucket.index() == 0:
        if not is_world(state.process_group) and state.probes and world > 1:
            raise InputError(
                "straggler detection, policy='auto', record= and metrics= need the default (world) "
                "process group"
            )
        if state.resources.steps_run == 0 and world > 1:  # this process's first step, resumed too
            state.agree(world, buffer.device)
        state.new_step(world)
    if world > 1:  # DDP's bucket tensors stay the same once it rebuilt its buckets, before step 2
        # divided first, then summed, as DDP's default hook and its reducer do: float16 gradients of
        # 30,000 on 4 ranks summed to inf before the division
        buffer.div_(world)
        return state.reduce(buffer, bucket.index(), world, divisor=1, kept=state.resources.steps_run >= 2)
    state.late_rank(world)  # a straggler that is no rank of this group is still an error
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)  # one rank: its gradients are the average already
    return future
