"""What a :class:`~stragglar.ddp.StragglarState` keeps besides its options, one class per role.

The options say what the hook does and stay as the user gave them (``straggler`` aside, which
``detect`` moves); what the hook learns as training runs (:class:`Learned`) and what it holds to
run (:class:`Resources`, with the :class:`Connection` made on the first bucket) change from step
to step.  Kept apart, each can be read, and reasoned about, on its own: the figures every rank
decides from are all in :class:`Learned`, and nothing there needs a process group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from stragglar.ddp.orders import StreamOrder, Watch
from stragglar.ddp.probe import GlooCall, LateRankProbe
from stragglar.ddp.worker import BucketWorker, Reducer
from stragglar.formats.traces import TraceWriter
from stragglar.model.detect import Detection
from stragglar.model.policy import AutoPolicy, Choice, Outlook
from stragglar.runtime.roll_call import RollCall
from stragglar.verify import Proof

__all__ = ["Connection", "Decision", "Learned", "ProofKey", "Resources"]

Decision = tuple[int, str, int | None, int | None]  # (step, algorithm, straggler, chunks)
ProofKey = tuple[int, int | None, int | None]  # (world size, straggler, chunks)


@dataclass
class Learned:
    """What a state learns as training runs; the same on every rank, since every rank decides from
    the same gathered figures.

    ``steps``: the steps begun (counted from 1).  ``switches``: each change of straggler under
    ``detect``, as (step, rank).  ``decisions``: (step, algorithm, straggler, chunks) for the first
    bucket and each bucket whose choice differs from the one before; the algorithm is the state's
    where its schedule ran, "allreduce" where the engine's own did.  ``outlook``: under "auto",
    the figures this step's choices were made from, None until a window of steps has been seen.
    ``last``: the last bucket's choice.  ``policy``: the auto policy's memory of what StragglAR's
    rounds cost against the model (:class:`~stragglar.model.policy.AutoPolicy`).  ``detection``:
    the persistent-straggler rule's state (:mod:`stragglar.model.detect`), None before the
    probe's first figures.
    """

    policy: AutoPolicy = field(repr=False)
    steps: int = 0
    switches: list[tuple[int, int]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    outlook: Outlook | None = field(default=None, repr=False)
    last: Choice | None = field(default=None, repr=False)
    detection: Detection | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Connection:
    """What a state reduces its buckets with, made on its first bucket: the reducer on the hook's
    own groups, the worker threads (None: synchronous), the engine's group on the host and a stream
    order per CUDA device.

    ``engine_group``: under ``policy="auto"`` on a group that reduces host tensors with gloo, a
    gloo group of the hook's ranks made with the state's timeout (and a grace:
    ``engine_allreduce.ENGINE_GRACE``), for the engine's own all_reduce of host buckets.  On the process
    group's (30 minutes, by default), a call that a silent peer held stayed in gloo's hands after
    the state's deadline had failed the step, so the other ranks' interpreters hung at exit until
    the peer came back, then aborted; gloo now ends it soon after the deadline.  None: not made.
    ``roll_call``: the engine group's :class:`~stragglar.runtime.roll_call.RollCall`, which names the
    ranks that had not reached a call that timed out or lost a peer (None: no engine group, or no
    store to use)."""

    reduce: Reducer
    worker: BucketWorker | None
    engine_group: Any = None
    streams: dict[torch.device, StreamOrder] = field(default_factory=dict)
    roll_call: RollCall | None = None


@dataclass
class Resources:
    """What a state holds to run: proved schedules by (world size, straggler, chunks), the probe
    of arrivals (made at the first step that needs it), the :class:`Connection`, the trace writer
    (rank 0, with ``record``), the watch of the engine's last all_reduce (the next one counts
    from its end), and the steps this process has run (a resumed state's ``steps`` counts those of
    the run before, whose buckets and settings this process has not seen).

    ``engine_calls``: this step's all_reduces of the engine on the host, as gloo calls, held so
    that their works end in a thread of Python's, and waited for at
    :meth:`~stragglar.ddp.StragglarState.close` (:func:`~stragglar.ddp.probe.let_go`).
    ``engine_buckets``: the (bucket, elements, dtype) the engine's all_reduce has met, each checked
    alike on every rank the first time (:func:`~stragglar.ddp.agreement.agree_on_bucket`).
    ``failed``: an all_reduce of the engine failed on this rank (a peer lost, or its deadline
    passed), so its peers may have given up their calls: ``close`` severs the hook's gloo groups
    at once instead of waiting for calls no peer will answer
    (:func:`~stragglar.ddp.probe.end_calls`)."""

    proofs: dict[ProofKey, Proof] = field(default_factory=dict)
    probe: LateRankProbe | None = None
    connection: Connection | None = None
    trace: TraceWriter | None = None
    engine_watch: Watch | None = None
    engine_calls: list[GlooCall] = field(default_factory=list)
    engine_buckets: set[tuple[int, int, torch.dtype]] = field(default_factory=set)
    steps_run: int = 0
    failed: bool = False
